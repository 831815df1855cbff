"""Dirty-rate measurement and the standalone dirty limit, end to end.

Tests: calc-dirty-rate / query-dirty-rate in each mode (dirty-ring on a
--dirty-ring VM with 2 vCPUs, dirty-bitmap on a bitmap VM, page-sampling on
both) on a stress guest and on an idle guest; bad arguments; and
set-vcpu-dirty-limit / query-vcpu-dirty-limit / cancel-vcpu-dirty-limit on
a stress guest (the quota is honoured loosely and slows the guest well
below its pace under tracking with no limit, counted as its page writes
per second of host time; the cancel switches dirty logging off and lets
it write far faster again, natively at near its untracked pace), plus
their errors.

Rates are MB/s with MB = 2^20 (docs/policies.md).  Only loose relations are
asserted (two noisy host cores): a stress guest dirties hundreds of MB/s, an
idle one next to nothing.  Under emulation (scripts/kvm-vm) a tracked
stress guest still dirties some 15-50 MB/s per vCPU (a fault per page per
harvest; the idle one 0), so the dirty limit's quota there is 2 MB/s
(natively 20) and the same relations hold; only the waits for the pace to
settle are longer (settle()).
"""
import os
import re
import time

import pytest

import kmigtest as kt

pytestmark = pytest.mark.kvm

RING = ["--dirty-ring", "4096"]
BITMAP = ["--dirty-ring", "0"]
STRESS = "workload=stress mb=%d cpus=%d report_ms=250"
IDLE = "workload=idle report_ms=500"


@pytest.fixture(autouse=True)
def _vm_tails(request, d, vms):
    """On an exception in the test, each VM's console and output tail (what
    the old harness's run_case printed), while the VMs still run and before
    d is removed.  Failed checks carry their own diagnostics."""
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed and "check(s) failed" not in str(rep.longrepr):
        for vm in vms:
            try:
                print("# %s (exit %r): %s" % (os.path.basename(vm.console.path),
                                              vm.proc.poll(), kt.dump(vm)))
            except OSError as e:
                print("# %s: %s" % (vm.console.path, e))


def dump(vm, n=10):
    return kt.dump(vm, n)


def calc(q, calc_time=1, mode=None, timeout=None):
    """Starts calc-dirty-rate and waits for `measured`.  Returns (the first
    query-dirty-rate reply right after the start, the final reply)."""
    args = {"calc-time": calc_time}
    if mode:
        args["mode"] = mode
    q.cmd("calc-dirty-rate", **args)
    first = q.cmd("query-dirty-rate")
    deadline = time.time() + (timeout or calc_time + kt.slow(10))
    r = first
    while r.get("status") != "measured" and time.time() < deadline:
        time.sleep(0.1)
        r = q.cmd("query-dirty-rate")
    return first, r


def error_of(q, name, **args):
    """The error description of a command that must fail, or None if it
    succeeded."""
    reply = q.cmd_full(name, **args)
    if "error" not in reply:
        return None
    return reply["error"].get("desc", repr(reply["error"]))


def wait_measured(q, timeout=15):
    deadline = time.time() + kt.slow(timeout)
    while time.time() < deadline:
        if q.cmd("query-dirty-rate").get("status") != "measuring":
            return True
        time.sleep(0.1)
    return False


# ------------------------------------------------------------------ calc-dirty-rate

def test_calc_ring(d, vms, check):
    """dirty-ring mode (per-vCPU rates) and page-sampling on a 2-vCPU ring VM."""
    name = "dirtyrate_ring"
    vm = kt.kmig_vm(d, "stress", STRESS % (128, 2), memory="256M", cpus=2, extra=RING)
    vms.append(vm)
    if not check("boot", vm.console.wait(r"^stress cpu=1", kt.slow(30), proc=vm.proc)
                 is not None, dump(vm)):
        return
    q = vm.qmp()
    check("unstarted", q.cmd("query-dirty-rate").get("status") == "unstarted",
          repr(q.cmd("query-dirty-rate")))
    first, r = calc(q, 2, "dirty-ring")
    print("# %s: %r" % (name, r))
    check("measuring", first.get("status") == "measuring"
          and first.get("mode") == "dirty-ring" and first.get("calc-time") == 2
          and "dirty-rate" not in first, repr(first))
    if not check("measured", r.get("status") == "measured", repr(r)):
        return
    check("rate", r.get("dirty-rate", 0) > 0 and r.get("mode") == "dirty-ring", repr(r))
    vr = r.get("vcpu-dirty-rate")
    check("vcpu_rates", isinstance(vr, list) and len(vr) == 2
          and sorted(v.get("id") for v in vr) == [0, 1]
          and all(v.get("dirty-rate", 0) > 0 for v in vr), repr(vr))
    # the total is the sum of the vCPUs' rates (each rounded down)
    if isinstance(vr, list) and vr:
        tot = sum(v.get("dirty-rate", 0) for v in vr)
        check("vcpu_sum", abs(r.get("dirty-rate", 0) - tot) <= len(vr), "%d vs %r" % (tot, r))
    # a second request while one is running is refused; the running one goes on
    q.cmd("calc-dirty-rate", **{"calc-time": 1, "mode": "dirty-ring"})
    busy = error_of(q, "calc-dirty-rate", **{"calc-time": 1, "mode": "dirty-ring"})
    check("busy_refused", busy is not None, "a second calc-dirty-rate was accepted")
    _, r2 = calc(q, 1, "page-sampling", timeout=kt.slow(15)) if wait_measured(q) else (None, {})
    print("# %s page-sampling: %r" % (name, r2))
    check("page_sampling", r2.get("status") == "measured"
          and r2.get("mode") == "page-sampling" and r2.get("dirty-rate", 0) > 0
          and "vcpu-dirty-rate" not in r2, repr(r2))
    # the guest still runs after the measurements (tracking was stopped again)
    n = vm.console.count(r"^stress cpu=1")
    check("guest_runs", vm.console.wait(r"^stress cpu=1", kt.slow(5), start=len(vm.console.lines))
          is not None and vm.console.count(r"^stress cpu=1") > n, dump(vm))
    # errors on this VM
    for label, args in (("calc_time_0", {"calc-time": 0}),
                        ("calc_time_61", {"calc-time": 61}),
                        ("unknown_mode", {"calc-time": 1, "mode": "bogus"}),
                        ("sample_pages_0", {"calc-time": 1, "sample-pages": 0}),
                        ("unknown_arg", {"calc-time": 1, "bogus": 1})):
        e = error_of(q, "calc-dirty-rate", **args)
        check("error_" + label, e is not None, "accepted %r" % args)
        if e is None:
            wait_measured(q)
    e = error_of(q, "calc-dirty-rate")
    check("error_no_calc_time", e is not None, "accepted no calc-time")


def test_calc_bitmap(d, vms, check):
    """dirty-bitmap and page-sampling on a bitmap stress VM, the same on an
    idle VM; dirty-ring mode is refused on the bitmap VM."""
    name = "dirtyrate_bitmap"
    vm = kt.kmig_vm(d, "stress", STRESS % (128, 1), memory="256M", extra=BITMAP)
    vms.append(vm)
    idle = kt.kmig_vm(d, "idle", IDLE, memory="256M", extra=BITMAP)
    vms.append(idle)
    if not check("boot", vm.console.wait(r"^stress cpu=0", kt.slow(30), proc=vm.proc) is not None
                 and idle.console.wait(r"^heartbeat", kt.slow(30), proc=idle.proc) is not None,
                 dump(vm) + " || " + dump(idle)):
        return
    q, qi = vm.qmp(), idle.qmp()
    e = error_of(q, "calc-dirty-rate", **{"calc-time": 1, "mode": "dirty-ring"})
    check("ring_mode_refused", e is not None, "dirty-ring mode accepted on a bitmap VM")
    if e is None:
        wait_measured(q)
    for mode in ("dirty-bitmap", "page-sampling"):
        first, r = calc(q, 1, mode)
        first_i, ri = calc(qi, 1, mode)
        print("# %s %s: stress %r, idle %r" % (name, mode, r.get("dirty-rate"),
                                               ri.get("dirty-rate")))
        check("%s_measuring" % mode, first.get("status") == "measuring"
              and first_i.get("status") == "measuring", "%r %r" % (first, first_i))
        if not check("%s_measured" % mode, r.get("status") == "measured"
                     and ri.get("status") == "measured" and r.get("mode") == mode
                     and ri.get("mode") == mode, "%r %r" % (r, ri)):
            continue
        s, i = r.get("dirty-rate", -1), ri.get("dirty-rate", -1)
        check("%s_stress_dirty" % mode, s > 0, repr(r))
        # idle << stress: the idle guest writes a few stack pages at most
        check("%s_idle_small" % mode, 0 <= i and i * 10 <= s and i <= 8,
              "idle %d MB/s vs stress %d MB/s" % (i, s))
        check("%s_no_vcpu_rates" % mode, "vcpu-dirty-rate" not in r, repr(r))
    # the guests still run after the measurements
    n = vm.console.count(r"^stress cpu=0")
    check("guest_runs", vm.console.wait(r"^stress cpu=0", kt.slow(5), start=len(vm.console.lines))
          is not None and vm.console.count(r"^stress cpu=0") > n, dump(vm))


# ------------------------------------------------------------------ dirty limit

def paces(console, cpu, start):
    """ms_per_gib values of cpu's stress lines from console.lines[start:]."""
    console.poll()
    rx = re.compile(r"^stress cpu=%d t_ms=\d+ ms_per_gib=([\d.]+)" % cpu)
    return [float(m.group(1)) for m in (rx.search(l) for l in console.lines[start:]) if m]


def settle(console, secs, cpus=1):
    """Waits secs for the stress pace to settle (past the first touch of
    every page, or the GiB still in progress at a change of tracking).

    Under emulation a GiB of page writes takes ~60 ms once settled, but the
    first touch of the working set (or its first pass after dirty tracking
    was switched off: a fault per page) takes seconds, and until the GiB in
    progress completes each line is only the time it has taken so far.  So
    there, after secs, this also waits (at most kt.slow(secs) in all) until
    every cpu has printed a line after one whose value went down: a GiB
    begun after the change completed."""
    t0 = time.time()
    console.poll()
    start = len(console.lines)
    time.sleep(secs)
    if not kt.emulated():
        return
    while time.time() - t0 < kt.slow(secs):
        done = 0
        for c in range(cpus):
            vals = paces(console, c, start)
            down = next((i for i in range(1, len(vals)) if vals[i] < vals[i - 1]), None)
            if down is not None and down + 1 < len(vals):
                done += 1
        if done == cpus:
            return
        time.sleep(0.1)


def test_limit(d, vms, check):
    name = "dirtylimit"
    vm = kt.kmig_vm(d, "stress", STRESS % (128, 2), memory="256M", cpus=2, extra=RING)
    vms.append(vm)
    bm = kt.kmig_vm(d, "bitmap", IDLE, memory="128M", extra=BITMAP)
    vms.append(bm)
    if not check("boot", vm.console.wait(r"^stress cpu=1", kt.slow(30), proc=vm.proc)
                 is not None, dump(vm)):
        return
    q = vm.qmp()
    check("query_empty", q.cmd("query-vcpu-dirty-limit") == [],
          repr(q.cmd("query-vcpu-dirty-limit")))
    settle(vm.console, 1.0, cpus=2)            # past the first touch of every page
    base, base_vals = kt.stress_page_rate(vm.console, 2.0)
    # the pace with dirty tracking on and no real limit (a quota no vCPU
    # reaches): what the limit must slow down, as tracking alone costs the
    # guest a fault per page per harvest.  Under emulation a tracked vCPU
    # dirties only ~15-50 MB/s (16 in three runs at 7936294, which a quota
    # of 6 held to 5.6), so the quota there is well below that.
    huge = 1 << 20
    quota = 2 if kt.emulated() else 20
    q.cmd("set-vcpu-dirty-limit", **{"dirty-rate": huge})
    settle(vm.console, 1.5, cpus=2)            # the first pass under tracking faults
    tracked, tracked_vals = kt.stress_page_rate(vm.console, 2.0)
    q.cmd("set-vcpu-dirty-limit", **{"dirty-rate": quota})
    lim = q.cmd("query-vcpu-dirty-limit")
    check("query_set", isinstance(lim, list)
          and sorted(x.get("cpu-index") for x in lim) == [0, 1]
          and all(x.get("limit-rate") == quota and "current-rate" in x for x in lim), repr(lim))
    # the controller measures over 1 s periods (the default) and needs a
    # few of them: bounded wait until two samples in a row are within 2x
    # the quota on every vCPU.  Tracking has been on since the first quota,
    # so the first samples are the tracked rate, not the 0 every vCPU reads
    # until tracking's first period closes (this check once passed on those
    # alone); a 0 now is a rate under 1 MB/s, within the quota
    t0 = time.time()
    samples, good = [], 0
    while time.time() - t0 < kt.slow(12) and good < 2:
        time.sleep(0.5)
        lim = q.cmd("query-vcpu-dirty-limit")
        samples.append(lim)
        within = len(lim) == 2 and all(x.get("current-rate", 1 << 30) <= 2 * quota
                                       for x in lim)
        good = good + 1 if within else 0
    print("# %s: quota %d MB/s, current-rate within 2x after %.1f s; samples %r"
          % (name, quota, time.time() - t0, [[x.get("current-rate") for x in s]
                                             for s in samples]))
    check("current_near_quota", good >= 2,
          "current-rate not within 2x of %d MB/s after %d s: %r" % (quota, kt.slow(12), samples))
    # the guest's own count of its page writes, per second of host time:
    # limited, it goes on writing (the limit slows, never stops it) and
    # writes far fewer than tracked without a limit
    slow, slow_vals = kt.stress_page_rate(vm.console, 2.0)
    print("# %s: page writes/s untracked %.0f, tracked %.0f, limited %.0f"
          % (name, base, tracked, slow))
    check("guest_slowed", slow > 0 and tracked > 2 * slow,
          "page writes/s untracked %.0f %r, tracked %.0f %r, limited %.0f %r"
          % (base, base_vals, tracked, tracked_vals, slow, slow_vals))
    # per-vCPU cancel first: the other vCPU keeps its quota
    q.cmd("cancel-vcpu-dirty-limit", **{"cpu-index": 1})
    lim = q.cmd("query-vcpu-dirty-limit")
    check("cancel_one", [x.get("cpu-index") for x in lim] == [0]
          and lim[0].get("limit-rate") == quota, repr(lim))
    q.cmd("cancel-vcpu-dirty-limit")
    check("cancel_all", q.cmd("query-vcpu-dirty-limit") == [],
          repr(q.cmd("query-vcpu-dirty-limit")))
    ok, detail = kt.recovered(q)
    check("tracking_off", ok, detail)
    settle(vm.console, 1.5, cpus=2)   # the first pass after the cancel faults its pages back
    after, after_vals = kt.stress_page_rate(vm.console, 2.0)
    print("# %s: page writes/s after cancel %.0f" % (name, after))
    # the limit is gone: far faster than limited; natively also back to
    # near the unlimited pace (loosely, as huge pages may not be rebuilt at
    # once).  Under emulation the pace after dirty logging depends on the
    # emulated machine's load, so there only the first holds.
    check("pace_recovers", after > 5 * slow and (kt.emulated() or after > base / 10),
          "page writes/s before %.0f, limited %.0f, after %.0f %r"
          % (base, slow, after, after_vals))
    # errors
    for label, args in (("cpu_index_2", {"cpu-index": 2, "dirty-rate": quota}),
                        ("cpu_index_negative", {"cpu-index": -5, "dirty-rate": quota}),
                        ("rate_0", {"dirty-rate": 0}),
                        ("no_rate", {})):
        e = error_of(q, "set-vcpu-dirty-limit", **args)
        check("error_" + label, e is not None, "accepted %r" % args)
    e = error_of(q, "cancel-vcpu-dirty-limit", **{"cpu-index": 2})
    check("error_cancel_cpu_index", e is not None, "cancel accepted cpu-index 2")
    check("errors_changed_nothing", q.cmd("query-vcpu-dirty-limit") == [],
          repr(q.cmd("query-vcpu-dirty-limit")))
    qb = bm.qmp()
    e = error_of(qb, "set-vcpu-dirty-limit", **{"dirty-rate": quota})
    check("error_bitmap", e is not None, "set-vcpu-dirty-limit accepted on a bitmap VM")
    check("bitmap_query_empty", qb.cmd("query-vcpu-dirty-limit") == [],
          repr(qb.cmd("query-vcpu-dirty-limit")))
    check("still_running", q.cmd("query-status").get("status") == "running"
          and qb.cmd("query-status").get("status") == "running", dump(vm))
