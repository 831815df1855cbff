"""Boots the test guest in kmig with one vCPU, once per workload, and checks
the console lines each workload prints (see guest/main.c, guest/work.c,
guest/verify.c), guest power-off, and the dirty-ring backend."""
import os
import re
import time

import pytest

import kmigtest as kt

pytestmark = pytest.mark.kvm

READY = r"kmig-guest ready cpus=(\d+) mem_mb=(\d+)"
STRESS = r"^stress cpu=(\d+) t_ms=(\d+) ms_per_gib=(\d+\.\d\d) max_ms_per_gib=(\d+\.\d\d) pages=(\d+)$"
HEARTBEAT = r"^heartbeat t_ms=(\d+) gap_ms=(\d+)$"
FILL_DONE = r"^fill-free done mb=(\d+) free_pages=(\d+) extents=(\d+)$"
VERIFY_OK = r"^verify ok round=(\d+) cpu=(\d+) pages=(\d+) max_gap_ms=\d+ tsc_back_us=\d+$"


def matches(vm, pattern):
    vm.console.poll()
    rx = re.compile(pattern)
    return [m for m in (rx.search(l) for l in vm.console.lines) if m]


def wait_count(vm, pattern, n, timeout=20.0):
    """Waits until n console lines match pattern (or timeout, or kmig exits);
    returns all matches so far."""
    deadline = time.time() + timeout
    while True:
        ms = matches(vm, pattern)
        if len(ms) >= n or time.time() > deadline or vm.proc.poll() is not None:
            return matches(vm, pattern)
        time.sleep(0.05)


def why(vm):
    return "console:\n%s\nkmig output:\n%s" % (vm.console.text()[-1500:], vm.output()[-1500:])


def check_ready(check, name, vm, mem_mb_max, mem_mb_min):
    m = vm.console.wait(READY, timeout=kt.slow(20), proc=vm.proc)
    if not check(name + "_ready", m is not None, "no ready line; " + why(vm)):
        return False
    cpus, mem = int(m.group(1)), int(m.group(2))
    check(name + "_ready_cpus1", cpus == 1, "cpus=%d" % cpus)
    check(name + "_ready_mem_mb", mem_mb_min <= mem <= mem_mb_max,
          "mem_mb=%d not in [%d, %d]" % (mem, mem_mb_min, mem_mb_max))
    return True


@pytest.mark.parametrize("name, extra", [
    ("stress", ("--dirty-ring", "0")),
    ("dirty_ring_stress", ("--dirty-ring", "4096")),
], ids=["bitmap", "dirty_ring"])
def test_stress(d, vms, check, name, extra):
    vm = kt.kmig_vm(d, name, "workload=stress mb=64 report_ms=200", memory="1G", extra=extra)
    vms.append(vm)
    if not check_ready(check, name, vm, 1024, 900):
        return
    ms = wait_count(vm, STRESS, 5, timeout=kt.slow(20))
    if not check(name + "_lines", len(ms) >= 5, "%d stress lines; %s" % (len(ms), why(vm))):
        return
    check(name + "_cpu0", all(m.group(1) == "0" for m in ms),
          "cpus seen: %s" % sorted(set(m.group(1) for m in ms)))
    t = [int(m.group(2)) for m in ms]
    check(name + "_t_ms_increasing", all(a < b for a, b in zip(t, t[1:])), "t_ms=%s" % t)
    avg = [float(m.group(3)) for m in ms]
    mx = [float(m.group(4)) for m in ms]
    check(name + "_rates_positive", all(a > 0 for a in avg), "ms_per_gib=%s" % avg)
    check(name + "_max_ge_avg", all(b >= a for a, b in zip(avg, mx)),
          "ms_per_gib=%s max=%s" % (avg, mx))
    pages = [int(m.group(5)) for m in ms]
    check(name + "_pages_grow", all(a < b for a, b in zip(pages, pages[1:])), "pages=%s" % pages)
    check(name + "_still_running", vm.proc.poll() is None,
          "kmig exited with %s; %s" % (vm.proc.poll(), why(vm)))
    check(name + "_no_guest_errors",
          not matches(vm, r"kmig-guest (error|warning|fault)"), why(vm))


def test_idle(d, vms, check):
    vm = kt.kmig_vm(d, "idle", "workload=idle report_ms=200", memory="256M")
    vms.append(vm)
    if not check_ready(check, "idle", vm, 256, 200):
        return
    ms = wait_count(vm, HEARTBEAT, 6, timeout=kt.slow(20))
    if not check("idle_heartbeats", len(ms) >= 6, "%d heartbeats; %s" % (len(ms), why(vm))):
        return
    gaps = [int(m.group(2)) for m in ms]
    t = [int(m.group(1)) for m in ms]
    check("idle_gap_near_report_ms", all(100 <= g <= 600 for g in gaps),
          "gap_ms=%s (report_ms=200)" % gaps)
    check("idle_t_ms_increasing", all(a < b for a, b in zip(t, t[1:])), "t_ms=%s" % t)
    diffs = [b - a for a, b in zip(t, t[1:])]
    check("idle_t_ms_steps_match_gaps",
          all(abs(df - g) <= 2 for df, g in zip(diffs, gaps[1:])),
          "t_ms steps %s vs gap_ms %s" % (diffs, gaps[1:]))


def test_fill_free(d, vms, check):
    vm = kt.kmig_vm(d, "fill", "workload=fill-free mb=64 report_ms=200", memory="256M")
    vms.append(vm)
    if not check_ready(check, "fill_free", vm, 256, 200):
        return
    m = vm.console.wait(FILL_DONE, timeout=kt.slow(20), proc=vm.proc)
    if not check("fill_free_done", m is not None, why(vm)):
        return
    mb, free_pages, extents = (int(x) for x in m.groups())
    check("fill_free_mb", mb == 64, "mb=%d" % mb)
    check("fill_free_pages_back", free_pages * 4096 >= 64 << 20,
          "free_pages=%d < 64 MiB" % free_pages)
    check("fill_free_extents", extents >= 1, "extents=%d" % extents)
    hb = vm.console.wait(HEARTBEAT, timeout=kt.slow(10), proc=vm.proc)
    check("fill_free_then_heartbeat", hb is not None, why(vm))


def test_verify(d, vms, check):
    vm = kt.kmig_vm(d, "verify", "workload=verify mb=32 report_ms=200", memory="256M")
    vms.append(vm)
    if not check_ready(check, "verify", vm, 256, 200):
        return
    ms = wait_count(vm, VERIFY_OK, 4, timeout=kt.slow(30))
    if not check("verify_ok_lines", len(ms) >= 4, "%d lines; %s" % (len(ms), why(vm))):
        return
    rounds = [int(m.group(1)) for m in ms]
    check("verify_rounds_increasing", all(a < b for a, b in zip(rounds, rounds[1:])),
          "rounds=%s" % rounds)
    check("verify_cpu0", all(m.group(2) == "0" for m in ms), "")
    check("verify_pages", all(int(m.group(3)) >= 32 * 256 for m in ms),
          "pages=%s (want >= %d per report)" % ([m.group(3) for m in ms], 32 * 256))
    check("verify_no_bad", not matches(vm, r"verify (BAD|bad_pages)"), why(vm))


def test_verify_detects_corruption(d, vms, check):
    """The verify check itself can fail: the guest corrupts a page in round 2."""
    vm = kt.kmig_vm(d, "corrupt", "workload=verify mb=16 report_ms=100 corrupt_round=2",
                    memory="256M")
    vms.append(vm)
    m = vm.console.wait(r"^verify BAD page=0x[0-9a-f]+ cpu=0 round=2 ", timeout=kt.slow(30),
                        proc=vm.proc)
    check("verify_detects_corruption", m is not None, why(vm))


def test_exit_ms(d, vms, check):
    vm = kt.kmig_vm(d, "exit", "workload=stress mb=16 report_ms=200 exit_ms=1500",
                    memory="256M")
    vms.append(vm)
    q = vm.qmp()
    ev = q.wait_event("SHUTDOWN", timeout=kt.slow(30))
    check("exit_ms_shutdown_event", ev is not None, why(vm))
    if ev is not None:
        data = ev.get("data", {})
        check("exit_ms_shutdown_by_guest", data.get("guest") is True, "event %s" % ev)
    rc = vm.wait_exit(kt.slow(15))
    check("exit_ms_exit_code_0", rc == 0, "exit status %s; %s" % (rc, why(vm)))
    check("exit_ms_guest_exit_line", vm.console.wait(r"^kmig-guest exit t_ms=(\d+)",
                                                     timeout=1) is not None, why(vm))
    check("exit_ms_qmp_socket_removed", not os.path.exists(vm.qmp_path),
          "%s still exists" % vm.qmp_path)
