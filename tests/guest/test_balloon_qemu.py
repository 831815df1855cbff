"""The test guest's virtio-balloon driver (balloon=1) against QEMU 7.2's
virtio-balloon-pci (modern only, free page hinting and reporting): binding
with the BAR assigned by the driver (qboot) or by the firmware (SeaBIOS),
inflate and deflate driven by QMP `balloon`, free page hints during a
migration to a second QEMU (bytes sent with and without the device), free
page reporting (reported memory reads back as zero), a device that never
answers, and balloon=1 without a device."""
import os
import re
import time

import pytest

import kmigtest as kt

pytestmark = pytest.mark.qemu

MIB = 1 << 20
BOUND = r"balloon bound dev=00:([0-9a-f]{2})\.0 features=0x([0-9a-f]+)"
BAR = r"balloon bar=(\d) addr=0x([0-9a-f]+) size=0x([0-9a-f]+) assigned_by=(\w+)"


@pytest.fixture(autouse=True)
def _guest_built():
    assert os.path.exists(kt.GUEST), "%s missing (make guest)" % kt.GUEST


def boot(d, vms, name, cmdline, device=True, memory="1G", extra=(), **kw):
    args = (kt.qemu_balloon_args() if device else []) + list(extra)
    vm = kt.qemu_vm(d, name, cmdline, memory=memory, extra=args, **kw)
    vms.append(vm)
    return vm


def tail(vm, n=600):
    return vm.console.text()[-n:] + " | " + vm.output()[-300:]


def check_bound(check, vm, assigned_by=None, prefix=""):
    m = vm.console.wait(BOUND, timeout=kt.slow(20), proc=vm.proc)
    if not check(prefix + "bound", m is not None, tail(vm)):
        return False
    f = int(m.group(2), 16)
    check(prefix + "features", f & (1 << 32) and f & (1 << 3) and f & (1 << 5) and f & (1 << 1)
          and not f & (1 << 4), "features=%#x: want VERSION_1, STATS_VQ, FREE_PAGE_HINT, "
          "PAGE_REPORTING and not PAGE_POISON" % f)
    b = re.search(BAR, vm.console.text())
    ok = b is not None and 0xE0000000 <= int(b.group(2), 16) < 0xFEC00000 \
        and int(b.group(3), 16) >= 0x4000
    if assigned_by:
        ok = ok and b.group(4) == assigned_by
    check(prefix + "bar", ok, b.group(0) if b else tail(vm))
    return True


def wait_actual(q, want, timeout=15.0):
    """Polls query-balloon until actual == want; returns the values seen."""
    seen = []
    deadline = time.time() + kt.slow(timeout)
    while time.time() < deadline:
        a = q.cmd("query-balloon")["actual"]
        if not seen or seen[-1] != a:
            seen.append(a)
        if a == want:
            break
        time.sleep(0.05)
    return seen


def test_inflate_deflate(d, vms, check):
    vm = boot(d, vms, "inflate", "workload=idle balloon=1 report_ms=200")
    if not check_bound(check, vm, assigned_by="driver"):  # qboot leaves BARs unassigned
        return
    vm.console.wait(r"heartbeat", timeout=kt.slow(10), proc=vm.proc)
    q = vm.qmp()
    check("initial", q.cmd("query-balloon")["actual"] == 1 << 30, "%s" % q.cmd("query-balloon"))
    t0 = time.time()
    q.cmd("balloon", value=512 * MIB)
    seen = wait_actual(q, 512 * MIB)
    t_in = time.time() - t0
    check("inflated", seen[-1] == 512 * MIB and all(a > b for a, b in zip(seen, seen[1:])),
          "query-balloon actual went %s" % seen)
    m = vm.console.wait(r"balloon actual=131072 target=131072", timeout=kt.slow(5), proc=vm.proc)
    check("console", m is not None, tail(vm))
    t0 = time.time()
    q.cmd("balloon", value=1 << 30)
    seen = wait_actual(q, 1 << 30)
    t_de = time.time() - t0
    check("deflated", seen[-1] == 1 << 30, "query-balloon actual went %s" % seen)
    m = vm.console.wait(r"balloon actual=0 target=0", timeout=kt.slow(5), proc=vm.proc)
    check("console_deflated", m is not None, tail(vm))
    print("# inflate 512 MiB: %.2f s, deflate: %.2f s (QMP polling)" % (t_in, t_de))
    # the driver loop must not stall the heartbeats for long
    time.sleep(0.5)
    gaps = [int(g) for g in re.findall(r"heartbeat t_ms=\d+ gap_ms=(\d+)", vm.console.text())]
    check("heartbeats", gaps and max(gaps) < 400 and "balloon error" not in vm.console.text(),
          "gaps %s %s" % (gaps, tail(vm)))


def test_firmware_bar(d, vms, check):
    vm = boot(d, vms, "seabios", "workload=idle balloon=1 report_ms=200", firmware="seabios")
    if not check_bound(check, vm, assigned_by="firmware"):
        return
    q = vm.qmp()
    q.cmd("balloon", value=768 * MIB)
    seen = wait_actual(q, 768 * MIB)
    check("inflated", seen[-1] == 768 * MIB, "%s" % seen)


def migrate_fill_free(check, d, vms, name, device):
    """fill-free mb=768 on 1 GiB, migrated to a second QEMU at 256 MiB/s;
    returns (query-migrate reply, source VM console, destination console)."""
    cmd = "workload=fill-free mb=768 report_ms=200" + (" balloon=1" if device else "")
    port = kt.free_port()
    src = boot(d, vms, name + "-src", cmd, device=device)
    dst = boot(d, vms, name + "-dst", cmd, device=device,
               extra=["-incoming", "tcp:127.0.0.1:%d" % port])
    try:
        if not check(name + "_filled", src.console.wait(r"fill-free done mb=768",
                                                        timeout=kt.slow(30), proc=src.proc)
                     is not None and src.console.wait(r"heartbeat", timeout=kt.slow(10),
                                                      proc=src.proc) is not None, tail(src)):
            return None, "", ""
        r = kt.migrate(src, None, "tcp:127.0.0.1:%d" % port,
                       params={"max-bandwidth": 256 * MIB, "downtime-limit": 300},
                       timeout=kt.slow(60))
        check(name + "_completed", r.get("status") == "completed", "%s" % r)
        # the destination runs on: heartbeats (and, with hints, the blocks come back)
        check(name + "_dst_runs", dst.console.wait(r"heartbeat", timeout=kt.slow(10),
                                                   proc=dst.proc) is not None, tail(dst))
        if device:
            dst.console.wait(r"balloon hint returned", timeout=kt.slow(5), proc=dst.proc)
        return r, src.console.text(), dst.console.text()
    finally:
        # two 1 GiB QEMUs at a time at most
        src.kill()
        dst.kill()


def test_hint_migration(d, vms, check):
    r0, _, _ = migrate_fill_free(check, d, vms, "nodev", device=False)
    r1, src, dst = migrate_fill_free(check, d, vms, "dev", device=True)
    if not r0 or not r1:
        return
    b0, b1 = r0["ram"]["transferred"], r1["ram"]["transferred"]
    print("# fill-free mb=768, 1 GiB, 256 MiB/s: transferred %d bytes (%.0f MiB, %d ms) "
          "without the device, %d bytes (%.0f MiB, %d ms) with free page hints"
          % (b0, b0 / MIB, r0.get("total-time", 0), b1, b1 / MIB, r1.get("total-time", 0)))
    start = re.search(r"balloon hint start id=(\d+)", src)
    check("start", start is not None and int(start.group(1)) >= 2, src[-600:])
    done = re.search(r"balloon hint done id=(\d+) blocks=(\d+) mb=(\d+)", src)
    check("done", done is not None and start is not None and done.group(1) == start.group(1)
          and int(done.group(3)) >= 768 and int(done.group(2)) >= int(done.group(3)) // 4,
          done.group(0) if done else src[-600:])
    ret = re.search(r"balloon hint returned blocks=(\d+) mb=(\d+)", dst)
    check("returned_on_dst", ret is not None and done is not None
          and ret.group(1) == done.group(2), dst[-600:])
    check("nodev_sends_the_garbage", b0 > 700 * MIB, "%d" % b0)
    check("fewer_bytes", b1 * 4 < b0, "with hints %d, without %d" % (b1, b0))


def test_reporting(d, vms, check):
    vm = boot(d, vms, "report",
              "workload=fill-free mb=768 balloon=1 balloon_report=1 report_ms=200")
    if not check_bound(check, vm):
        return
    m = vm.console.wait(r"balloon reported mb=(\d+) total_mb=(\d+)", timeout=kt.slow(30),
                        proc=vm.proc)
    check("reported", m is not None and int(m.group(1)) >= 768 and m.group(1) == m.group(2),
          tail(vm))
    # fill-free wrote non-zero data to its 768 MiB (from ~2 MiB up); QEMU
    # discarded the reported memory, so it reads zero now
    path = os.path.join(d, "report.mem")
    vm.qmp().cmd("pmemsave", val=256 * MIB, size=64 * MIB, filename=path)
    with open(path, "rb") as f:
        data = f.read()
    check("discarded", len(data) == 64 * MIB and data.count(0) == len(data),
          "%d non-zero bytes" % (len(data) - data.count(0)))
    # a second pass has nothing new to report
    time.sleep(2.5)
    check("once", vm.console.count(r"balloon reported") == 1
          and "balloon error" not in vm.console.text(), tail(vm))
    # the reported memory is the guest's again: inflate into it
    q = vm.qmp()
    q.cmd("balloon", value=512 * MIB)
    check("inflate_after", wait_actual(q, 512 * MIB)[-1] == 512 * MIB, tail(vm))


@pytest.mark.slow   # the same driver property (the balloon takes only allocator
#                     memory) under kmig: tests/e2e/test_balloon.py test_verify_churn
def test_verify_inflate(d, vms, check):
    """verify keeps its pages: the balloon only takes memory from the page
    allocator, which holds what the workload did not take."""
    vm = boot(d, vms, "verify", "workload=verify mb=64 balloon=1 report_ms=200")
    if not check_bound(check, vm):
        return
    vm.console.wait(r"verify ok", timeout=kt.slow(10), proc=vm.proc)
    q = vm.qmp()
    q.cmd("balloon", value=256 * MIB)   # inflate 768 MiB of the ~950 MiB left
    seen = wait_actual(q, 256 * MIB)
    check("inflated", seen[-1] == 256 * MIB, "%s" % seen)
    n = vm.console.count(r"verify ok round=\d+ cpu=0")
    time.sleep(1.0)
    text = vm.console.text()
    check("still_ok", vm.console.count(r"verify ok round=\d+ cpu=0") >= n + 2
          and "verify BAD" not in text and "balloon error" not in text, text[-600:])


def test_no_answer(d, vms, check):
    # balloon_test=nokick: the driver never notifies, so to the driver the
    # device never answers
    vm = boot(d, vms, "no-answer", "workload=idle balloon=1 balloon_test=nokick report_ms=200")
    if not check_bound(check, vm):
        return
    vm.qmp().cmd("balloon", value=512 * MIB)
    m = vm.console.wait(r"balloon error inflate queue: device did not answer; driver disabled",
                        timeout=kt.slow(10), proc=vm.proc)
    check("error", m is not None, tail(vm))
    n = vm.console.count(r"heartbeat")
    time.sleep(1.0)
    check("guest_runs", vm.console.count(r"heartbeat") >= n + 3, tail(vm))
    check("actual_unchanged", vm.qmp().cmd("query-balloon")["actual"] == 1 << 30,
          "%s" % vm.qmp().cmd("query-balloon"))


def test_no_device(d, vms, check):
    vm = boot(d, vms, "no-device", "workload=idle balloon=1 report_ms=200", device=False)
    m = vm.console.wait(r"balloon error no virtio-balloon device", timeout=kt.slow(20),
                        proc=vm.proc)
    check("error", m is not None, tail(vm))
    check("runs", vm.console.wait(r"heartbeat", timeout=kt.slow(5), proc=vm.proc) is not None,
          tail(vm))
