"""The test guest with several vCPUs in kmig: the BSP starts the APs with
INIT/SIPI, every CPU runs its share of the workload (guest/main.c), and a
CPU that halts does not stop the others.  3 vCPUs run on 2 host cores."""
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


def wait_until(vm, cond, timeout):
    deadline = time.time() + timeout
    while True:
        if cond():
            return True
        if time.time() > deadline or vm.proc.poll() is not None:
            return cond()
        time.sleep(0.05)


def why(vm):
    return "console:\n%s\nkmig output:\n%s" % (vm.console.text()[-1500:], vm.output()[-1500:])


def boot(d, vms, check, name, workload, ncpu, mb=None, report_ms=200):
    cmd = "workload=%s cpus=%d report_ms=%d" % (workload, ncpu, report_ms)
    if mb:
        cmd += " mb=%d" % mb
    vm = kt.kmig_vm(d, name, cmd, memory="512M", cpus=ncpu)
    vms.append(vm)
    m = vm.console.wait(READY, timeout=kt.slow(30), proc=vm.proc)
    got = int(m.group(1)) if m else None
    ok = check(name + "_ready_cpus%d" % ncpu, got == ncpu,
               "ready cpus=%s; %s" % (got, why(vm)))
    for i in range(1, ncpu):
        check("%s_cpu%d_up" % (name, i), matches(vm, r"^kmig-guest cpu %d up " % i) != [],
              why(vm))
    check(name + "_no_ap_warning", not matches(vm, r"did not start"), why(vm))
    return vm, ok and m is not None


def per_cpu(vm, pattern, cpu_group, ncpu, n, timeout):
    """Waits until every cpu printed n lines of pattern; returns {cpu: [match]}."""
    def table():
        t = {c: [] for c in range(ncpu)}
        for m in matches(vm, pattern):
            c = int(m.group(cpu_group))
            t.setdefault(c, []).append(m)
        return t
    wait_until(vm, lambda: all(len(v) >= n for v in table().values()), timeout)
    return table()


@pytest.mark.parametrize("ncpu", [2, 3])
def test_stress(d, vms, check, ncpu):
    name = "stress%d" % ncpu
    vm, ok = boot(d, vms, check, name, "stress", ncpu, mb=64)
    if not ok:
        return
    t = per_cpu(vm, STRESS, 1, ncpu, 3, kt.slow(20))
    for c in range(ncpu):
        check("%s_stress_lines_cpu%d" % (name, c), len(t.get(c, [])) >= 3,
              "%d lines from cpu=%d; %s" % (len(t.get(c, [])), c, why(vm)))
    check(name + "_no_unknown_cpu", set(t) == set(range(ncpu)), "cpus %s" % sorted(t))
    rates = [float(m.group(3)) for v in t.values() for m in v]
    check(name + "_rates_positive", rates and all(r > 0 for r in rates), "%s" % rates)
    check(name + "_still_running", vm.proc.poll() is None, why(vm))


def test_verify(d, vms, check, ncpu=2):
    name = "verify%d" % ncpu
    vm, ok = boot(d, vms, check, name, "verify", ncpu, mb=32)
    if not ok:
        return
    t = per_cpu(vm, VERIFY_OK, 2, ncpu, 3, kt.slow(30))
    for c in range(ncpu):
        rounds = [int(m.group(1)) for m in t.get(c, [])]
        check("%s_ok_cpu%d" % (name, c), len(rounds) >= 3, "rounds %s; %s" % (rounds, why(vm)))
        check("%s_rounds_increasing_cpu%d" % (name, c),
              all(a < b for a, b in zip(rounds, rounds[1:])), "rounds %s" % rounds)
    check(name + "_no_bad", not matches(vm, r"verify (BAD|bad_pages)"), why(vm))


def test_idle_one_cpu_halted(d, vms, check, ncpu=2):
    """cpu 1 halts at once in the idle workload; cpu 0 must keep beating."""
    name = "idle%d" % ncpu
    vm, ok = boot(d, vms, check, name, "idle", ncpu)
    if not ok:
        return
    wait_until(vm, lambda: len(matches(vm, HEARTBEAT)) >= 6, kt.slow(15))
    n = len(matches(vm, HEARTBEAT))
    check(name + "_heartbeats", n >= 6, "%d heartbeats; %s" % (n, why(vm)))
    check(name + "_still_running", vm.proc.poll() is None,
          "kmig exited with %s; %s" % (vm.proc.poll(), why(vm)))
    s = vm.qmp().cmd("query-status") if vm.proc.poll() is None else {}
    check(name + "_status_running", s.get("status") == "running", "query-status %s" % s)


def test_fill_free(d, vms, check, ncpu=2):
    name = "fill%d" % ncpu
    vm, ok = boot(d, vms, check, name, "fill-free", ncpu, mb=64)
    if not ok:
        return
    m = vm.console.wait(FILL_DONE, timeout=kt.slow(20), proc=vm.proc)
    check(name + "_done", m is not None and int(m.group(1)) == 64, why(vm))
    check(name + "_then_heartbeat",
          vm.console.wait(HEARTBEAT, timeout=kt.slow(10), proc=vm.proc) is not None, why(vm))


def test_stop_cont(d, vms, check, ncpu=2):
    """Pausing stops every vCPU: no CPU prints while paused."""
    name = "stopcont%d" % ncpu
    vm, ok = boot(d, vms, check, name, "stress", ncpu, mb=16)
    if not ok:
        return
    per_cpu(vm, STRESS, 1, ncpu, 1, kt.slow(15))
    q = vm.qmp()
    q.cmd("stop")
    time.sleep(0.3)
    n0 = len(matches(vm, STRESS))
    time.sleep(1.5)
    n1 = len(matches(vm, STRESS))
    check(name + "_silent_while_paused", n1 == n0, "%d new lines while paused" % (n1 - n0))
    q.cmd("cont")
    t0 = {c: len(v) for c, v in per_cpu(vm, STRESS, 1, ncpu, 0, 0).items()}
    t = per_cpu(vm, STRESS, 1, ncpu, max(t0.values()) + 2, kt.slow(15))
    check(name + "_all_cpus_resume",
          all(len(t.get(c, [])) >= t0.get(c, 0) + 2 for c in range(ncpu)),
          "lines per cpu before %s after %s" % (t0, {c: len(v) for c, v in t.items()}))
