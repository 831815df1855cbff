"""The test guest (build/guest/kmig-guest.elf) under QEMU: every workload
with 1 and 2 vCPUs, the fault and error lines, power-off, and the verify
page format checked from outside through a QMP memory dump.

Under emulation (scripts/kvm-vm) the first touch of a workload's memory
takes seconds (an emulated fault per 4 KiB page), so where a test watches
the guest for a fixed time there, it watches longer, until what it checks
has had the time to show (collect's `until`); the checks are the same.
"""
import os
import re
import time

import pytest

import kmigtest as kt
import verify_page

pytestmark = pytest.mark.qemu

READY = r"kmig-guest ready cpus=(\d+) mem_mb=(\d+)"


@pytest.fixture(autouse=True)
def _guest_built():
    assert os.path.exists(kt.GUEST), "%s missing (make guest)" % kt.GUEST


def boot(d, vms, name, cmdline, cpus=1, memory="1G", **kw):
    vm = kt.qemu_vm(d, name, cmdline, memory=memory, cpus=cpus, **kw)
    vms.append(vm)
    return vm


# under emulation a vCPU thread of the emulated host is at times left
# without a CPU for several seconds: collect() waits up to this long for
# until() to hold (it ends as soon as it does)
EMULATED_CAP_S = 40


def collect(vm, seconds, until=None):
    """Lets the guest run `seconds` after the ready line (or until it
    exits).  Under emulation: up to max(kt.slow(seconds), EMULATED_CAP_S)
    when until is given, ending after `seconds` as soon as until(console
    text) holds."""
    t0 = time.time()
    cap = kt.slow(seconds)
    if kt.emulated() and until is not None:
        cap = max(cap, EMULATED_CAP_S)
    while vm.proc.poll() is None:
        el = time.time() - t0
        if el >= cap:
            break
        if el >= seconds and (not kt.emulated() or until is None or until(vm.console.text())):
            break
        time.sleep(0.1)
    return vm.console.text()


def ready(check, vm, cpus, timeout=20):
    m = vm.console.wait(READY, timeout=kt.slow(timeout), proc=vm.proc)
    return check("ready", m is not None and int(m.group(1)) == cpus,
                 "no ready line with cpus=%d: %r %s" % (cpus, vm.console.text()[-400:],
                                                        vm.output()[-300:]))


STRESS_LINE = r"stress cpu=(\d+) t_ms=(\d+) ms_per_gib=([\d.]+) max_ms_per_gib=([\d.]+)"


def _stress_settled(cpus):
    """until() for collect: every cpu has printed, cpu 0 at least 3 times,
    and some GiB was done at the steady pace (past the first touch)."""
    def until(text):
        lines = re.findall(STRESS_LINE, text)
        return ({int(c) for c, _, _, _ in lines} == set(range(cpus))
                and sum(1 for c, _, _, _ in lines if c == "0") >= 3
                and min(float(a) for _, _, a, _ in lines) < 100)
    return until


@pytest.mark.parametrize("cpus", [1, 2])
def test_stress(d, vms, check, cpus):
    vm = boot(d, vms, "stress-%dcpu" % cpus,
              "workload=stress mb=64 cpus=%d report_ms=300 bogus=1" % cpus, cpus=cpus)
    if not ready(check, vm, cpus):
        return
    text = collect(vm, 2.0, until=_stress_settled(cpus))
    check("unknown_key_warning", 'unknown option "bogus"' in text, text[:300])
    check("tsc_line", re.search(r"kmig-guest tsc_khz=\d+ source=\w+", text), text[:300])
    lines = re.findall(STRESS_LINE, text)
    seen = {int(c) for c, _, _, _ in lines}
    check("every_cpu", seen == set(range(cpus)), "cpus seen %s in %r" % (seen, text[-500:]))
    # the first period includes the first touch of every page; after it
    # each GiB of page writes takes a few ms natively
    sane = [(float(a), float(m)) for c, t, a, m in lines]
    check("numbers", sane and all(0 < a <= m < 5000 for a, m in sane)
          and min(a for a, _ in sane) < 100, "%s" % sane)
    ts = [int(t) for c, t, _, _ in lines if c == "0"]
    check("t_ms_increasing", len(ts) >= 3 and ts == sorted(ts), "%s" % ts)


# 1 vCPU: slow, test_idle[2] runs the same loop on cpu 0 (the other halts)
@pytest.mark.parametrize("cpus", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_idle(d, vms, check, cpus):
    vm = boot(d, vms, "idle-%dcpu" % cpus, "workload=idle cpus=%d report_ms=200" % cpus, cpus=cpus)
    if not ready(check, vm, cpus):
        return
    text = collect(vm, 1.3,
                   until=lambda t: len(re.findall(r"heartbeat t_ms=\d+ gap_ms=\d+", t)) >= 4)
    beats = [(int(t), int(g)) for t, g in re.findall(r"heartbeat t_ms=(\d+) gap_ms=(\d+)", text)]
    check("heartbeats", len(beats) >= 4 and all(150 <= g <= 400 for _, g in beats[1:]),
          "%s" % beats)


@pytest.mark.slow   # fill-free under QEMU: covered by test_balloon_qemu (fill-free
#                     with the driver: hints, reporting) and tests/kvm/test_boot.py
@pytest.mark.parametrize("cpus", [1, 2])
def test_fill_free(d, vms, check, cpus):
    vm = boot(d, vms, "fill-free-%dcpu" % cpus,
              "workload=fill-free mb=128 cpus=%d report_ms=200" % cpus, cpus=cpus)
    if not ready(check, vm, cpus):
        return
    m = vm.console.wait(r"fill-free done mb=(\d+) free_pages=(\d+) extents=(\d+)",
                        timeout=kt.slow(20), proc=vm.proc)
    check("done", m is not None and m.group(1) == "128", vm.console.text()[-300:])
    if m:
        check("freed_in_one_block", m.group(3) == "1", m.group(0))
    check("heartbeat", vm.console.wait(r"heartbeat t_ms=", timeout=kt.slow(5), proc=vm.proc)
          is not None, vm.console.text()[-300:])


def test_touch_and_random_fill(d, vms, check):
    """touch=1 writes every free page before the workload (so the host maps
    them all), then fill-free with fill_random=1 fills and keeps its pages
    and the heartbeats follow."""
    vm = boot(d, vms, "touch", "workload=fill-free mb=32 touch=1 fill_random=1 report_ms=200",
              memory="256M")
    if not ready(check, vm, 1):
        return
    m = vm.console.wait(r"touch done pages=(\d+) extents=(\d+) ms=(\d+)", timeout=kt.slow(20),
                        proc=vm.proc)
    # 256 MiB less the guest's image and tables: most of it is free
    check("touched", m is not None and 32768 < int(m.group(1)) < 65536,
          vm.console.text()[-300:])
    f = vm.console.wait(r"fill-free done mb=(\d+)", timeout=kt.slow(20), proc=vm.proc)
    check("filled", f is not None and f.group(1) == "32", vm.console.text()[-300:])
    check("heartbeat", vm.console.wait(r"heartbeat t_ms=", timeout=kt.slow(5), proc=vm.proc)
          is not None, vm.console.text()[-300:])


def _verify_rounds(cpus):
    """until() for collect: every cpu has two verify ok rounds."""
    def until(text):
        per = {}
        for r, c, _ in re.findall(r"verify ok round=(\d+) cpu=(\d+) pages=(\d+)", text):
            per.setdefault(int(c), []).append(int(r))
        return set(per) == set(range(cpus)) and all(len(v) >= 2 for v in per.values())
    return until


@pytest.mark.parametrize("cpus", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_verify(d, vms, check, cpus):
    # 1 vCPU: slow, test_verify[2] makes the same checks on each of 2 vCPUs
    name = "verify-%dcpu" % cpus
    vm = boot(d, vms, name, "workload=verify mb=32 cpus=%d report_ms=300" % cpus, cpus=cpus)
    if not ready(check, vm, cpus):
        return
    shares = [(int(c), int(b, 16), int(n)) for c, b, n in
              re.findall(r"kmig-guest share cpu=(\d+) base=0x([0-9a-f]+) pages=(\d+)",
                         vm.console.text())]
    # the page format, checked from outside while the guest rewrites pages
    if shares:
        _, base, npages = shares[0]
        n = min(npages, 256)
        path = os.path.join(d, name + ".mem")
        try:
            vm.qmp().cmd("pmemsave", val=base, size=n * 4096, filename=path)
            with open(path, "rb") as f:
                data = f.read()
            bad = [why for i in range(n)
                   for ok, why in [verify_page.check_page(base + i * 4096,
                                                          data[i * 4096:(i + 1) * 4096])]
                   if not ok]
            check("dump_checks", len(data) == n * 4096 and not bad, "%s" % bad[:3])
        except Exception as e:  # noqa: BLE001
            check("dump_checks", False, "QMP pmemsave: %s" % e)
    else:
        check("share_lines", False, vm.console.text()[-400:])
    text = collect(vm, 1.6, until=_verify_rounds(cpus))
    oks = re.findall(r"verify ok round=(\d+) cpu=(\d+) pages=(\d+)", text)
    per = {}
    for r, c, _ in oks:
        per.setdefault(int(c), []).append(int(r))
    check("rounds", set(per) == set(range(cpus)) and all(
        len(v) >= 2 and all(a < b for a, b in zip(v, v[1:])) for v in per.values()), "%s" % per)
    check("no_bad", "verify BAD" not in text, text[-400:])


def test_verify_corrupt(d, vms, check):
    vm = boot(d, vms, "verify-1cpu-corrupt", "workload=verify mb=32 cpus=1 report_ms=300"
              " corrupt_round=5")
    if not ready(check, vm, 1):
        return
    m = vm.console.wait(r"verify BAD page=0x([0-9a-f]+) cpu=0 round=5 word=7 "
                        r"got=0x[0-9a-f]+ want=0x[0-9a-f]+", timeout=kt.slow(10), proc=vm.proc)
    check("bad_line", m is not None, vm.console.text()[-400:])


def test_crash_ud(d, vms, check):
    vm = boot(d, vms, "crash-ud", "crash=ud")
    m = vm.console.wait(r"kmig-guest fault vec=6 rip=0x[0-9a-f]+ err=0x0 cr2=0x[0-9a-f]+ cpu=0",
                        timeout=kt.slow(20), proc=vm.proc)
    check("fault_line", m is not None, vm.console.text()[-300:])


@pytest.mark.slow   # the same crash under kmig: tests/kvm/test_failures.py
def test_crash_triple(d, vms, check):
    vm = boot(d, vms, "crash-triple", "crash=triple", extra=["-no-reboot"])
    rc = vm.wait_exit(kt.slow(20))
    check("shutdown", rc is not None and "crash=triple" in vm.console.text(),
          "rc=%s %s" % (rc, vm.console.text()[-200:]))


@pytest.mark.slow   # the same request under kmig: tests/kvm/test_halt.py
def test_crash_reset(d, vms, check):
    """QEMU with -no-reboot exits on the guest's keyboard-controller reset,
    as kmig ends the VM on it."""
    vm = boot(d, vms, "crash-reset", "crash=reset", extra=["-no-reboot"])
    rc = vm.wait_exit(kt.slow(20))
    text = vm.console.text()
    check("exits", rc is not None and "crash=reset: 0xfe" in text, "rc=%s %s" % (rc, text[-300:]))
    check("not_after", "still running after" not in text, text[-300:])


@pytest.mark.slow   # the same crash under kmig: tests/kvm/test_failures.py
def test_crash_emul(d, vms, check):
    vm = boot(d, vms, "crash-emul", "crash=emul")
    vm.console.wait(r"kmig-guest crash=emul", timeout=kt.slow(20), proc=vm.proc)
    deadline = time.time() + kt.slow(10)
    while time.time() < deadline:
        out, text = vm.output(), vm.console.text()
        # kvm_pvm: emulation failure at the popcnt; real KVM: #BP at the int3
        if "internal error" in out or "fault vec=3 " in text:
            break
        time.sleep(0.1)
    check("crash_emul", "internal error" in out or "fault vec=3 " in text,
          out[-300:] + text[-200:])


def test_bad_mb(d, vms, check):
    vm = boot(d, vms, "bad-mb", "workload=stress mb=4096", memory="512M")
    m = vm.console.wait(r"kmig-guest error: mb=4096 does not fit \(usable (\d+) MiB\)",
                        timeout=kt.slow(20), proc=vm.proc)
    check("error_line", m is not None and 400 < int(m.group(1)) < 512, vm.console.text()[-300:])
    check("no_ready", "kmig-guest ready" not in vm.console.text(), vm.console.text()[-300:])


@pytest.mark.parametrize("cpus,firmware", [(2, "qboot"), (1, "seabios")],
                         ids=["2cpu-qboot", "1cpu-seabios"])
def test_exit(d, vms, check, cpus, firmware):
    vm = boot(d, vms, "exit-%dcpu-%s" % (cpus, firmware),
              "workload=stress mb=16 cpus=%d exit_ms=1500" % cpus, cpus=cpus, firmware=firmware)
    rc = vm.wait_exit(kt.slow(30))
    text = vm.console.text()
    check("poweroff", rc == 1 and re.search(r"kmig-guest exit t_ms=1[5-9]\d\d", text)
          and ("cpus=%d" % cpus) in text, "rc=%s %s" % (rc, text[-300:]))
