"""The test guest's virtio-balloon driver (balloon=1) against QEMU 7.2's
virtio-balloon-pci (modern only, free page hinting and reporting): binding
with the BAR assigned by the driver (qboot) or by the firmware (SeaBIOS),
inflate and deflate driven by QMP `balloon`, free page hints during a
migration to a second QEMU (bytes sent with and without the device), free
page reporting (reported memory reads back as zero), a device that never
answers, and balloon=1 without a device."""
import os
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kmigtest as kt  # noqa: E402

R = kt.Report()
D = kt.tmpdir()
MIB = 1 << 20
BOUND = r"balloon bound dev=00:([0-9a-f]{2})\.0 features=0x([0-9a-f]+)"
BAR = r"balloon bar=(\d) addr=0x([0-9a-f]+) size=0x([0-9a-f]+) assigned_by=(\w+)"


def boot(name, cmdline, device=True, memory="1G", extra=(), **kw):
    args = (kt.qemu_balloon_args() if device else []) + list(extra)
    return kt.qemu_vm(D, name, cmdline, memory=memory, extra=args, **kw)


def tail(vm, n=600):
    return vm.console.text()[-n:] + " | " + vm.output()[-300:]


def check_bound(name, vm, assigned_by=None):
    m = vm.console.wait(BOUND, timeout=20, proc=vm.proc)
    if not R.ok(name + "-bound", m is not None, tail(vm)):
        return False
    f = int(m.group(2), 16)
    R.ok(name + "-features", f & (1 << 32) and f & (1 << 3) and f & (1 << 5) and f & (1 << 1)
         and not f & (1 << 4), "features=%#x: want VERSION_1, STATS_VQ, FREE_PAGE_HINT, "
         "PAGE_REPORTING and not PAGE_POISON" % f)
    b = re.search(BAR, vm.console.text())
    ok = b is not None and 0xE0000000 <= int(b.group(2), 16) < 0xFEC00000 and int(b.group(3), 16) >= 0x4000
    if assigned_by:
        ok = ok and b.group(4) == assigned_by
    R.ok(name + "-bar", ok, b.group(0) if b else tail(vm))
    return True


def wait_actual(q, want, timeout=15.0):
    """Polls query-balloon until actual == want; returns the values seen."""
    seen = []
    deadline = time.time() + timeout
    while time.time() < deadline:
        a = q.cmd("query-balloon")["actual"]
        if not seen or seen[-1] != a:
            seen.append(a)
        if a == want:
            break
        time.sleep(0.05)
    return seen


def test_inflate_deflate():
    name = "inflate"
    vm = boot(name, "workload=idle balloon=1 report_ms=200")
    try:
        if not check_bound(name, vm, assigned_by="driver"):  # qboot leaves BARs unassigned
            return
        vm.console.wait(r"heartbeat", timeout=10, proc=vm.proc)
        q = vm.qmp()
        R.ok(name + "-initial", q.cmd("query-balloon")["actual"] == 1 << 30, "%s" % q.cmd("query-balloon"))
        t0 = time.time()
        q.cmd("balloon", value=512 * MIB)
        seen = wait_actual(q, 512 * MIB)
        t_in = time.time() - t0
        R.ok(name + "-inflated", seen[-1] == 512 * MIB and all(a > b for a, b in zip(seen, seen[1:])),
             "query-balloon actual went %s" % seen)
        m = vm.console.wait(r"balloon actual=131072 target=131072", timeout=5, proc=vm.proc)
        R.ok(name + "-console", m is not None, tail(vm))
        t0 = time.time()
        q.cmd("balloon", value=1 << 30)
        seen = wait_actual(q, 1 << 30)
        t_de = time.time() - t0
        R.ok(name + "-deflated", seen[-1] == 1 << 30, "query-balloon actual went %s" % seen)
        m = vm.console.wait(r"balloon actual=0 target=0", timeout=5, proc=vm.proc)
        R.ok(name + "-console-deflated", m is not None, tail(vm))
        print("# inflate 512 MiB: %.2f s, deflate: %.2f s (QMP polling)" % (t_in, t_de))
        # the driver loop must not stall the heartbeats for long
        time.sleep(0.5)
        gaps = [int(g) for g in re.findall(r"heartbeat t_ms=\d+ gap_ms=(\d+)", vm.console.text())]
        R.ok(name + "-heartbeats", gaps and max(gaps) < 400 and "balloon error" not in vm.console.text(),
             "gaps %s %s" % (gaps, tail(vm)))
    finally:
        vm.kill()


def test_firmware_bar():
    name = "seabios"
    vm = boot(name, "workload=idle balloon=1 report_ms=200", firmware="seabios")
    try:
        if not check_bound(name, vm, assigned_by="firmware"):
            return
        q = vm.qmp()
        q.cmd("balloon", value=768 * MIB)
        seen = wait_actual(q, 768 * MIB)
        R.ok(name + "-inflated", seen[-1] == 768 * MIB, "%s" % seen)
    finally:
        vm.kill()


def migrate_fill_free(name, device):
    """fill-free mb=768 on 1 GiB, migrated to a second QEMU at 256 MiB/s;
    returns (query-migrate reply, source VM console, destination console)."""
    cmd = "workload=fill-free mb=768 report_ms=200" + (" balloon=1" if device else "")
    port = kt.free_port()
    src = boot(name + "-src", cmd, device=device)
    dst = boot(name + "-dst", cmd, device=device, extra=["-incoming", "tcp:127.0.0.1:%d" % port])
    try:
        if not R.ok(name + "-filled", src.console.wait(r"fill-free done mb=768", timeout=30, proc=src.proc)
                    is not None and src.console.wait(r"heartbeat", timeout=10, proc=src.proc) is not None,
                    tail(src)):
            return None, "", ""
        r = kt.migrate(src, None, "tcp:127.0.0.1:%d" % port,
                       params={"max-bandwidth": 256 * MIB, "downtime-limit": 300}, timeout=60)
        R.ok(name + "-completed", r.get("status") == "completed", "%s" % r)
        # the destination runs on: heartbeats (and, with hints, the blocks come back)
        R.ok(name + "-dst-runs", dst.console.wait(r"heartbeat", timeout=10, proc=dst.proc) is not None,
             tail(dst))
        if device:
            dst.console.wait(r"balloon hint returned", timeout=5, proc=dst.proc)
        return r, src.console.text(), dst.console.text()
    finally:
        src.kill()
        dst.kill()


def test_hint_migration():
    name = "hint"
    r0, _, _ = migrate_fill_free(name + "-nodev", device=False)
    r1, src, dst = migrate_fill_free(name + "-dev", device=True)
    if not r0 or not r1:
        return
    b0, b1 = r0["ram"]["transferred"], r1["ram"]["transferred"]
    print("# fill-free mb=768, 1 GiB, 256 MiB/s: transferred %d bytes (%.0f MiB, %d ms) without the "
          "device, %d bytes (%.0f MiB, %d ms) with free page hints"
          % (b0, b0 / MIB, r0.get("total-time", 0), b1, b1 / MIB, r1.get("total-time", 0)))
    start = re.search(r"balloon hint start id=(\d+)", src)
    R.ok(name + "-start", start is not None and int(start.group(1)) >= 2, src[-600:])
    done = re.search(r"balloon hint done id=(\d+) blocks=(\d+) mb=(\d+)", src)
    R.ok(name + "-done", done is not None and start is not None and done.group(1) == start.group(1)
         and int(done.group(3)) >= 768 and int(done.group(2)) >= int(done.group(3)) // 4,
         done.group(0) if done else src[-600:])
    ret = re.search(r"balloon hint returned blocks=(\d+) mb=(\d+)", dst)
    R.ok(name + "-returned-on-dst", ret is not None and done is not None and ret.group(1) == done.group(2),
         dst[-600:])
    R.ok(name + "-nodev-sends-the-garbage", b0 > 700 * MIB, "%d" % b0)
    R.ok(name + "-fewer-bytes", b1 * 4 < b0, "with hints %d, without %d" % (b1, b0))


def test_reporting():
    name = "report"
    vm = boot(name, "workload=fill-free mb=768 balloon=1 balloon_report=1 report_ms=200")
    try:
        if not check_bound(name, vm):
            return
        m = vm.console.wait(r"balloon reported mb=(\d+) total_mb=(\d+)", timeout=30, proc=vm.proc)
        R.ok(name + "-reported", m is not None and int(m.group(1)) >= 768 and m.group(1) == m.group(2),
             tail(vm))
        # fill-free wrote non-zero data to its 768 MiB (from ~2 MiB up); QEMU
        # discarded the reported memory, so it reads zero now
        dump = os.path.join(D, "report.mem")
        vm.qmp().cmd("pmemsave", val=256 * MIB, size=64 * MIB, filename=dump)
        with open(dump, "rb") as f:
            data = f.read()
        R.ok(name + "-discarded", len(data) == 64 * MIB and data.count(0) == len(data),
             "%d non-zero bytes" % (len(data) - data.count(0)))
        # a second pass has nothing new to report
        time.sleep(2.5)
        R.ok(name + "-once", vm.console.count(r"balloon reported") == 1
             and "balloon error" not in vm.console.text(), tail(vm))
        # the reported memory is the guest's again: inflate into it
        q = vm.qmp()
        q.cmd("balloon", value=512 * MIB)
        R.ok(name + "-inflate-after", wait_actual(q, 512 * MIB)[-1] == 512 * MIB, tail(vm))
    finally:
        vm.kill()


def test_verify_inflate():
    """verify keeps its pages: the balloon only takes memory from the page
    allocator, which holds what the workload did not take."""
    name = "verify"
    vm = boot(name, "workload=verify mb=64 balloon=1 report_ms=200")
    try:
        if not check_bound(name, vm):
            return
        vm.console.wait(r"verify ok", timeout=10, proc=vm.proc)
        q = vm.qmp()
        q.cmd("balloon", value=256 * MIB)   # inflate 768 MiB of the ~950 MiB left
        seen = wait_actual(q, 256 * MIB)
        R.ok(name + "-inflated", seen[-1] == 256 * MIB, "%s" % seen)
        n = vm.console.count(r"verify ok round=\d+ cpu=0")
        time.sleep(1.0)
        text = vm.console.text()
        R.ok(name + "-still-ok", vm.console.count(r"verify ok round=\d+ cpu=0") >= n + 2
             and "verify BAD" not in text and "balloon error" not in text, text[-600:])
    finally:
        vm.kill()


def test_no_answer():
    name = "no-answer"
    # balloon_test=nokick: the driver never notifies, so to the driver the
    # device never answers
    vm = boot(name, "workload=idle balloon=1 balloon_test=nokick report_ms=200")
    try:
        if not check_bound(name, vm):
            return
        vm.qmp().cmd("balloon", value=512 * MIB)
        m = vm.console.wait(r"balloon error inflate queue: device did not answer; driver disabled",
                            timeout=10, proc=vm.proc)
        R.ok(name + "-error", m is not None, tail(vm))
        n = vm.console.count(r"heartbeat")
        time.sleep(1.0)
        R.ok(name + "-guest-runs", vm.console.count(r"heartbeat") >= n + 3, tail(vm))
        R.ok(name + "-actual-unchanged", vm.qmp().cmd("query-balloon")["actual"] == 1 << 30,
             "%s" % vm.qmp().cmd("query-balloon"))
    finally:
        vm.kill()


def test_no_device():
    name = "no-device"
    vm = boot(name, "workload=idle balloon=1 report_ms=200", device=False)
    try:
        m = vm.console.wait(r"balloon error no virtio-balloon device", timeout=20, proc=vm.proc)
        R.ok(name + "-error", m is not None, tail(vm))
        R.ok(name + "-runs", vm.console.wait(r"heartbeat", timeout=5, proc=vm.proc) is not None, tail(vm))
    finally:
        vm.kill()


def main():
    if not shutil.which("qemu-system-x86_64"):
        R.skip("balloon-qemu", "qemu-system-x86_64 not installed")
        R.done()
    if not kt.have_kvm():
        R.skip("balloon-qemu", "/dev/kvm not accessible")
        R.done()
    if not os.path.exists(kt.GUEST):
        R.ok("guest-built", False, "%s missing (make guest)" % kt.GUEST)
        R.done()
    t0 = time.time()
    test_inflate_deflate()
    test_firmware_bar()
    test_hint_migration()
    test_reporting()
    test_verify_inflate()
    test_no_answer()
    test_no_device()
    print("# balloon tests took %.1f s" % (time.time() - t0))
    shutil.rmtree(D, ignore_errors=True)
    R.done()


if __name__ == "__main__":
    main()
