"""The test guest (build/guest/kmig-guest.elf) under QEMU: every workload
with 1 and 2 vCPUs, the fault and error lines, power-off, and the verify
page format checked from outside through a QMP memory dump."""
import os
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kmigtest as kt  # noqa: E402
import verify_page  # noqa: E402

R = kt.Report()
D = kt.tmpdir()
READY = r"kmig-guest ready cpus=(\d+) mem_mb=(\d+)"


def boot(name, cmdline, cpus=1, memory="1G", **kw):
    return kt.qemu_vm(D, name, cmdline, memory=memory, cpus=cpus, **kw)


def collect(vm, seconds):
    """Lets the guest run `seconds` after the ready line (or until it exits)."""
    deadline = time.time() + seconds
    while time.time() < deadline and vm.proc.poll() is None:
        time.sleep(0.1)
    return vm.console.text()


def ready(name, vm, cpus, timeout=20):
    m = vm.console.wait(READY, timeout=timeout, proc=vm.proc)
    if not R.ok(name + "-ready", m is not None and int(m.group(1)) == cpus,
                "no ready line with cpus=%d: %r %s" % (cpus, vm.console.text()[-400:], vm.output()[-300:])):
        return False
    return True


def test_stress(cpus):
    name = "stress-%dcpu" % cpus
    vm = boot(name, "workload=stress mb=64 cpus=%d report_ms=300 bogus=1" % cpus, cpus=cpus)
    try:
        if not ready(name, vm, cpus):
            return
        text = collect(vm, 2.0)
        R.ok(name + "-unknown-key-warning", 'unknown option "bogus"' in text, text[:300])
        R.ok(name + "-tsc-line", re.search(r"kmig-guest tsc_khz=\d+ source=\w+", text), text[:300])
        lines = re.findall(r"stress cpu=(\d+) t_ms=(\d+) ms_per_gib=([\d.]+) max_ms_per_gib=([\d.]+)", text)
        seen = {int(c) for c, _, _, _ in lines}
        R.ok(name + "-every-cpu", seen == set(range(cpus)), "cpus seen %s in %r" % (seen, text[-500:]))
        # the first period includes the first touch of every page; after it
        # each GiB of page writes takes a few ms natively
        sane = [(float(a), float(m)) for c, t, a, m in lines]
        R.ok(name + "-numbers", sane and all(0 < a <= m < 5000 for a, m in sane)
             and min(a for a, _ in sane) < 100, "%s" % sane)
        ts = [int(t) for c, t, _, _ in lines if c == "0"]
        R.ok(name + "-t_ms-increasing", len(ts) >= 3 and ts == sorted(ts), "%s" % ts)
    finally:
        vm.kill()


def test_idle(cpus):
    name = "idle-%dcpu" % cpus
    vm = boot(name, "workload=idle cpus=%d report_ms=200" % cpus, cpus=cpus)
    try:
        if not ready(name, vm, cpus):
            return
        text = collect(vm, 1.3)
        beats = [(int(t), int(g)) for t, g in re.findall(r"heartbeat t_ms=(\d+) gap_ms=(\d+)", text)]
        R.ok(name + "-heartbeats", len(beats) >= 4 and all(150 <= g <= 400 for _, g in beats[1:]),
             "%s" % beats)
    finally:
        vm.kill()


def test_fill_free(cpus):
    name = "fill-free-%dcpu" % cpus
    vm = boot(name, "workload=fill-free mb=128 cpus=%d report_ms=200" % cpus, cpus=cpus)
    try:
        if not ready(name, vm, cpus):
            return
        m = vm.console.wait(r"fill-free done mb=(\d+) free_pages=(\d+) extents=(\d+)", timeout=20, proc=vm.proc)
        R.ok(name + "-done", m is not None and m.group(1) == "128", vm.console.text()[-300:])
        if m:
            R.ok(name + "-freed-in-one-block", m.group(3) == "1", m.group(0))
        R.ok(name + "-heartbeat", vm.console.wait(r"heartbeat t_ms=", timeout=5, proc=vm.proc) is not None,
             vm.console.text()[-300:])
    finally:
        vm.kill()


def test_verify(cpus, corrupt=False):
    name = "verify-%dcpu%s" % (cpus, "-corrupt" if corrupt else "")
    cmd = "workload=verify mb=32 cpus=%d report_ms=300" % cpus
    if corrupt:
        cmd += " corrupt_round=5"
    vm = boot(name, cmd, cpus=cpus)
    try:
        if not ready(name, vm, cpus):
            return
        if corrupt:
            m = vm.console.wait(r"verify BAD page=0x([0-9a-f]+) cpu=0 round=5 word=7 got=0x[0-9a-f]+ want=0x[0-9a-f]+",
                                timeout=10, proc=vm.proc)
            R.ok(name + "-bad-line", m is not None, vm.console.text()[-400:])
            return
        shares = [(int(c), int(b, 16), int(n)) for c, b, n in
                  re.findall(r"kmig-guest share cpu=(\d+) base=0x([0-9a-f]+) pages=(\d+)", vm.console.text())]
        # the page format, checked from outside while the guest rewrites pages
        if shares:
            _, base, npages = shares[0]
            n = min(npages, 256)
            dump = os.path.join(D, name + ".mem")
            try:
                vm.qmp().cmd("pmemsave", val=base, size=n * 4096, filename=dump)
                with open(dump, "rb") as f:
                    data = f.read()
                bad = [why for i in range(n)
                       for ok, why in [verify_page.check_page(base + i * 4096, data[i * 4096:(i + 1) * 4096])]
                       if not ok]
                R.ok(name + "-dump-checks", len(data) == n * 4096 and not bad, "%s" % bad[:3])
            except Exception as e:  # noqa: BLE001
                R.ok(name + "-dump-checks", False, "QMP pmemsave: %s" % e)
        else:
            R.ok(name + "-share-lines", False, vm.console.text()[-400:])
        text = collect(vm, 1.6)
        oks = re.findall(r"verify ok round=(\d+) cpu=(\d+) pages=(\d+)", text)
        per = {}
        for r, c, _ in oks:
            per.setdefault(int(c), []).append(int(r))
        R.ok(name + "-rounds", set(per) == set(range(cpus)) and all(
            len(v) >= 2 and all(a < b for a, b in zip(v, v[1:])) for v in per.values()), "%s" % per)
        R.ok(name + "-no-bad", "verify BAD" not in text, text[-400:])
    finally:
        vm.kill()


def test_crash_ud():
    vm = boot("crash-ud", "crash=ud")
    try:
        m = vm.console.wait(r"kmig-guest fault vec=6 rip=0x[0-9a-f]+ err=0x0 cr2=0x[0-9a-f]+ cpu=0",
                            timeout=20, proc=vm.proc)
        R.ok("crash-ud-fault-line", m is not None, vm.console.text()[-300:])
    finally:
        vm.kill()


def test_crash_triple():
    vm = boot("crash-triple", "crash=triple", extra=["-no-reboot"])
    try:
        rc = vm.wait_exit(20)
        R.ok("crash-triple-shutdown", rc is not None and "crash=triple" in vm.console.text(),
             "rc=%s %s" % (rc, vm.console.text()[-200:]))
    finally:
        vm.kill()


def test_crash_emul():
    vm = boot("crash-emul", "crash=emul")
    try:
        vm.console.wait(r"kmig-guest crash=emul", timeout=20, proc=vm.proc)
        deadline = time.time() + 10
        while time.time() < deadline:
            out, text = vm.output(), vm.console.text()
            # kvm_pvm: emulation failure at the popcnt; real KVM: #BP at the int3
            if "internal error" in out or "fault vec=3 " in text:
                break
            time.sleep(0.1)
        R.ok("crash-emul", "internal error" in out or "fault vec=3 " in text, out[-300:] + text[-200:])
    finally:
        vm.kill()


def test_bad_mb():
    vm = boot("bad-mb", "workload=stress mb=4096", memory="512M")
    try:
        m = vm.console.wait(r"kmig-guest error: mb=4096 does not fit \(usable (\d+) MiB\)", timeout=20, proc=vm.proc)
        R.ok("bad-mb-error-line", m is not None and 400 < int(m.group(1)) < 512, vm.console.text()[-300:])
        R.ok("bad-mb-no-ready", "kmig-guest ready" not in vm.console.text(), vm.console.text()[-300:])
    finally:
        vm.kill()


def test_exit(cpus, firmware="qboot"):
    name = "exit-%dcpu-%s" % (cpus, firmware)
    vm = boot(name, "workload=stress mb=16 cpus=%d exit_ms=1500" % cpus, cpus=cpus, firmware=firmware)
    try:
        rc = vm.wait_exit(30)
        text = vm.console.text()
        R.ok(name + "-poweroff", rc == 1 and re.search(r"kmig-guest exit t_ms=1[5-9]\d\d", text)
             and ("cpus=%d" % cpus) in text, "rc=%s %s" % (rc, text[-300:]))
    finally:
        vm.kill()


def main():
    if not shutil.which("qemu-system-x86_64"):
        R.skip("guest-qemu", "qemu-system-x86_64 not installed")
        R.done()
    if not kt.have_kvm():
        R.skip("guest-qemu", "/dev/kvm not accessible")
        R.done()
    if not os.path.exists(kt.GUEST):
        R.ok("guest-built", False, "%s missing (make guest)" % kt.GUEST)
        R.done()
    for cpus in (1, 2):
        test_stress(cpus)
        test_idle(cpus)
        test_fill_free(cpus)
        test_verify(cpus)
    test_verify(1, corrupt=True)
    test_crash_ud()
    test_crash_triple()
    test_crash_emul()
    test_bad_mb()
    test_exit(2)
    test_exit(1, firmware="seabios")
    shutil.rmtree(D, ignore_errors=True)
    R.done()


if __name__ == "__main__":
    main()
