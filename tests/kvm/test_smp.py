#!/usr/bin/python3
"""The test guest with several vCPUs in kmig: the BSP starts the APs with
INIT/SIPI, every CPU runs its share of the workload (guest/main.c), and a
CPU that halts does not stop the others.  3 vCPUs run on 2 host cores."""
import os
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from kmigtest import Report, have_kvm, kmig_vm, tmpdir  # noqa: E402

R = Report()

READY = r"kmig-guest ready cpus=(\d+) mem_mb=(\d+)"
STRESS = r"^stress cpu=(\d+) t_ms=(\d+) ms_per_gib=(\d+\.\d\d) max_ms_per_gib=(\d+\.\d\d)$"
HEARTBEAT = r"^heartbeat t_ms=(\d+) gap_ms=(\d+)$"
FILL_DONE = r"^fill-free done mb=(\d+) free_pages=(\d+) extents=(\d+)$"
VERIFY_OK = r"^verify ok round=(\d+) cpu=(\d+) pages=(\d+)$"


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


def boot(d, name, workload, ncpu, mb=None, report_ms=200):
    cmd = "workload=%s cpus=%d report_ms=%d" % (workload, ncpu, report_ms)
    if mb:
        cmd += " mb=%d" % mb
    vm = kmig_vm(d, name, cmd, memory="512M", cpus=ncpu)
    m = vm.console.wait(READY, timeout=30, proc=vm.proc)
    got = int(m.group(1)) if m else None
    ok = R.ok(name + "_ready_cpus%d" % ncpu, got == ncpu,
              "ready cpus=%s; %s" % (got, why(vm)))
    for i in range(1, ncpu):
        R.ok("%s_cpu%d_up" % (name, i), matches(vm, r"^kmig-guest cpu %d up " % i) != [],
             why(vm))
    R.ok(name + "_no_ap_warning", not matches(vm, r"did not start"), why(vm))
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


def test_stress(d, name, ncpu):
    vm, ok = boot(d, name, "stress", ncpu, mb=64)
    try:
        if not ok:
            return
        t = per_cpu(vm, STRESS, 1, ncpu, 3, 20)
        for c in range(ncpu):
            R.ok("%s_stress_lines_cpu%d" % (name, c), len(t.get(c, [])) >= 3,
                 "%d lines from cpu=%d; %s" % (len(t.get(c, [])), c, why(vm)))
        R.ok(name + "_no_unknown_cpu", set(t) == set(range(ncpu)), "cpus %s" % sorted(t))
        rates = [float(m.group(3)) for v in t.values() for m in v]
        R.ok(name + "_rates_positive", rates and all(r > 0 for r in rates), "%s" % rates)
        R.ok(name + "_still_running", vm.proc.poll() is None, why(vm))
    finally:
        vm.kill()


def test_verify(d, ncpu=2):
    name = "verify%d" % ncpu
    vm, ok = boot(d, name, "verify", ncpu, mb=32)
    try:
        if not ok:
            return
        t = per_cpu(vm, VERIFY_OK, 2, ncpu, 3, 30)
        for c in range(ncpu):
            rounds = [int(m.group(1)) for m in t.get(c, [])]
            R.ok("%s_ok_cpu%d" % (name, c), len(rounds) >= 3, "rounds %s; %s" % (rounds, why(vm)))
            R.ok("%s_rounds_increasing_cpu%d" % (name, c),
                 all(a < b for a, b in zip(rounds, rounds[1:])), "rounds %s" % rounds)
        R.ok(name + "_no_bad", not matches(vm, r"verify (BAD|bad_pages)"), why(vm))
    finally:
        vm.kill()


def test_idle(d, ncpu=2):
    """cpu 1 halts at once in the idle workload; cpu 0 must keep beating."""
    name = "idle%d" % ncpu
    vm, ok = boot(d, name, "idle", ncpu)
    try:
        if not ok:
            return
        wait_until(vm, lambda: len(matches(vm, HEARTBEAT)) >= 6, 15)
        n = len(matches(vm, HEARTBEAT))
        R.ok(name + "_heartbeats", n >= 6, "%d heartbeats; %s" % (n, why(vm)))
        R.ok(name + "_still_running", vm.proc.poll() is None,
             "kmig exited with %s; %s" % (vm.proc.poll(), why(vm)))
        s = vm.qmp().cmd("query-status") if vm.proc.poll() is None else {}
        R.ok(name + "_status_running", s.get("status") == "running", "query-status %s" % s)
    finally:
        vm.kill()


def test_fill_free(d, ncpu=2):
    name = "fill%d" % ncpu
    vm, ok = boot(d, name, "fill-free", ncpu, mb=64)
    try:
        if not ok:
            return
        m = vm.console.wait(FILL_DONE, timeout=20, proc=vm.proc)
        R.ok(name + "_done", m is not None and int(m.group(1)) == 64, why(vm))
        R.ok(name + "_then_heartbeat",
             vm.console.wait(HEARTBEAT, timeout=10, proc=vm.proc) is not None, why(vm))
    finally:
        vm.kill()


def test_stop_cont(d, ncpu=2):
    """Pausing stops every vCPU: no CPU prints while paused."""
    name = "stopcont%d" % ncpu
    vm, ok = boot(d, name, "stress", ncpu, mb=16)
    try:
        if not ok:
            return
        per_cpu(vm, STRESS, 1, ncpu, 1, 15)
        q = vm.qmp()
        q.cmd("stop")
        time.sleep(0.3)
        n0 = len(matches(vm, STRESS))
        time.sleep(1.5)
        n1 = len(matches(vm, STRESS))
        R.ok(name + "_silent_while_paused", n1 == n0, "%d new lines while paused" % (n1 - n0))
        q.cmd("cont")
        t0 = {c: len(v) for c, v in per_cpu(vm, STRESS, 1, ncpu, 0, 0).items()}
        t = per_cpu(vm, STRESS, 1, ncpu, max(t0.values()) + 2, 15)
        R.ok(name + "_all_cpus_resume",
             all(len(t.get(c, [])) >= t0.get(c, 0) + 2 for c in range(ncpu)),
             "lines per cpu before %s after %s" % (t0, {c: len(v) for c, v in t.items()}))
    finally:
        vm.kill()


def main():
    if not os.path.exists("/dev/kvm"):
        R.skip("smp", "/dev/kvm is absent")
        R.done()
    if not have_kvm():
        R.ok("smp_kvm_access", False, "/dev/kvm exists but is not accessible")
        R.done()
    d = tmpdir()
    try:
        test_stress(d, "stress2", 2)
        test_verify(d, 2)
        test_idle(d, 2)
        test_fill_free(d, 2)
        test_stop_cont(d, 2)
        test_stress(d, "stress3", 3)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    R.done()


if __name__ == "__main__":
    main()
