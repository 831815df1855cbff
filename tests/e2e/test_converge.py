"""Convergence of a migration whose guest dirties memory faster than the
stream can send it, end to end between two kmig processes.

The guest is `stress` over most of its RAM (mb=384 on 512 MiB): it rewrites
every page of its share again and again, hundreds of MB/s, while the stream
is limited to max-bandwidth = 125 MB/s.  Tests:

  no_policy     no policy (dirty ring): the migration does not converge;
                after a bounded time it is cancelled, and the source runs on
                with dirty tracking off (x-query-dirty-tracking; natively
                also its stress pace comes back) and no throttle;
  auto_converge x-cpu-throttle-policy step (1 vCPU) and computed (2 vCPUs);
  dirty_limit   the dirty-limit capability (dirty ring on both sides);
  verify        a verify guest under the computed throttle with x-verify:
                no page lost;
  dirty_limit_refused  the dirty-limit capability's refusals (with
                auto-converge; on the bitmap backend);
  seed000_off   seed 000's five ideas all off (x-sync-per-slot,
                x-kick-throttled, x-sync-dirty-rate, --reaper fixed, step:
                what bench/seed000 compares against) with x-verify: the
                switches read back, the migration converges under step and
                no page is lost;
  cli_default   `kmig migrate` with no convergence option on the stress
                guest (dirty ring): it chooses dirty-limit (a sixth of
                --bandwidth per vCPU, at most 20 MB/s), says so, and the
                migration completes; on the bitmap (an idle guest: the
                choice is what is checked) it chooses the computed throttle
                and its summary names it.

The converging ones must complete with the downtime roughly honoured:
downtime-limit is 300 ms and the reported downtime must be at most
DOWNTIME_SLACK_MS more.  The slack is generous on purpose: the switchover
predicts the stop-and-copy from the bandwidth measured over the last round,
and the downtime also covers the device state, the destination's
confirmation and the scheduling noise of two shared host cores; what is
checked is that the limit is not ignored (a switchover with the whole
384 MiB working set left would take about 3 s at this bandwidth).

Under emulation (scripts/kvm-vm) the premise does not hold with these
numbers: a tracked guest dirties only ~20-45 MB/s there (each first write
of a page per round is an emulated fault, and the guest shares two
emulated CPUs with the migration threads), below the ~55 MB/s the loopback
stream reaches, so without a policy the migration converged on its own.
There the stream is limited to BANDWIDTH = 8 MB/s instead, so the
guest again dirties several times faster than the link; the working set
shrinks to 32 MiB of 128 MiB (at that bandwidth each dirty round of the
whole set takes W / 8 MB/s, and step needs six of them), which is still
4 s of transfer, so a switchover that ignored the downtime limit would
still break the same bound; and the
dirty-limit quota becomes VCPU_DIRTY_LIMIT = 2 MB/s, to stay well below
the link (a quarter of it; natively 20 MB/s, a sixth).  no_policy halves
the link again there (NO_POLICY_BANDWIDTH = 4 MB/s): the emulated guest
is sometimes starved of its CPU for seconds, and a round in which it
dirties less than the downtime limit's worth (300 ms of the link) lets
the migration converge on its own; at 4 MB/s every dirty round lasts
about 8 s, longer than any such stall seen.  The downtime limit, its
slack and every check are the same.
"""
import json
import os
import re
import subprocess
import time

import pytest

import kmigtest as kt

pytestmark = pytest.mark.kvm

RING = ["--dirty-ring", "4096"]
BITMAP = ["--dirty-ring", "0"]
DOWNTIME_LIMIT_MS = 300
DOWNTIME_SLACK_MS = 700        # see the module docstring
CONVERGE_TIMEOUT = 45          # s; each converging case takes ~10-30 s natively
if not kt.emulated():
    MEM = "512M"
    STRESS = "workload=stress mb=384 cpus=%d report_ms=250"
    BANDWIDTH = 125000000      # bytes/s, well below the stress guest's dirty rate
    VCPU_DIRTY_LIMIT = 20      # MB/s, well below BANDWIDTH
    NO_POLICY_BANDWIDTH = BANDWIDTH
    VERIFY = "workload=verify mb=256 report_ms=300"
    VERIFY_BANDWIDTH = 80000000
else:                          # see the module docstring
    MEM = "128M"
    STRESS = "workload=stress mb=32 cpus=%d report_ms=250"
    BANDWIDTH = 8000000
    VCPU_DIRTY_LIMIT = 2
    NO_POLICY_BANDWIDTH = 4000000
    VERIFY = "workload=verify mb=32 report_ms=300"
    VERIFY_BANDWIDTH = 8000000


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


def tcp_uri():
    return "tcp:127.0.0.1:%d" % kt.free_port()


def dump(vm, n=10):
    return kt.dump(vm, n)


def pair(d, vms, sub, cmdline, uri, cpus=1, extra=()):
    p = os.path.join(d, sub)
    os.mkdir(p)
    src = kt.kmig_vm(p, "src", cmdline, memory=MEM, cpus=cpus, extra=list(extra))
    vms.append(src)
    dst = kt.kmig_vm(p, "dst", cmdline, memory=MEM, cpus=cpus,
                     extra=list(extra) + ["--incoming", uri])
    vms.append(dst)
    return src, dst


def last_t_ms(console, pattern=r"^stress cpu=0 t_ms=(\d+)"):
    console.poll()
    for line in reversed(console.lines):
        m = re.search(pattern, line)
        if m:
            return int(m.group(1))
    return None


PACE_RX = r"^stress cpu=%s t_ms=\d+ ms_per_gib=([\d.]+)"


def stress_paces(console, start):
    """ms_per_gib of every stress line in console.lines[start:]."""
    console.poll()
    rx = re.compile(PACE_RX % r"\d+")
    return [float(m.group(1)) for m in (rx.search(l) for l in console.lines[start:]) if m]


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def pace_over(console, secs):
    console.poll()
    start = len(console.lines)
    time.sleep(secs)
    vals = stress_paces(console, start)
    return median(vals), vals


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
        console.poll()
        done = 0
        for c in range(cpus):
            rx = re.compile(PACE_RX % c)
            vals = [float(m.group(1)) for m in (rx.search(l) for l in console.lines[start:]) if m]
            down = next((i for i in range(1, len(vals)) if vals[i] < vals[i - 1]), None)
            if down is not None and down + 1 < len(vals):
                done += 1
        if done == cpus:
            return
        time.sleep(0.1)


def start_migration(src, dst, uri, caps, params):
    """Sets every convergence capability explicitly (caps override), the
    bandwidth and downtime limit (params add to them), and starts."""
    q = src.qmp()
    allcaps = {"auto-converge": False, "dirty-limit": False, "x-verify": False}
    allcaps.update(caps)
    # dirty-limit and auto-converge conflict: switch off before switching on
    kt.set_caps(q, **{k: False for k in allcaps})
    kt.set_caps(q, **{k: v for k, v in allcaps.items() if v})
    p = {"max-bandwidth": BANDWIDTH, "downtime-limit": DOWNTIME_LIMIT_MS}
    p.update(params)
    q.cmd("migrate-set-parameters", **p)
    kt.wait_incoming(dst, kt.slow(30))
    q.cmd("migrate", uri=uri)
    return q


def follow(q, timeout, interval=0.2, also=None):
    """Polls query-migrate until a final status; returns (last reply, every
    reply seen, each with "t" = seconds since the call added and, with also
    (a function), "also" = what it returned right after that reply)."""
    seen = []
    t0 = time.time()
    deadline = t0 + timeout
    while True:
        r = q.cmd("query-migrate")
        r["t"] = time.time() - t0
        if also is not None:
            r["also"] = also()
        seen.append(r)
        if r.get("status") in kt.MIG_FINAL or time.time() > deadline:
            return r, seen
        time.sleep(interval)


def summary(name, r, seen):
    thr = [s.get("cpu-throttle-percentage", 0) for s in seen]
    steps, last = [], None
    for s in seen:
        key = (s.get("status"), s.get("cpu-throttle-percentage", 0),
               s.get("ram", {}).get("dirty-sync-count"))
        if key != last:
            steps.append("%.1fs:%s/%s%%/sync%s" % ((s["t"],) + key))
            last = key
    print("# %s: %s" % (name, " ".join(steps)))
    print("# %s: %s in %s ms, downtime %s ms, dirty-sync-count %s, throttle max %s%%, "
          "dirty-rate-peak %s pages/s"
          % (name, r.get("status"), r.get("total-time"), r.get("downtime"),
             r.get("ram", {}).get("dirty-sync-count"), max(thr or [0]),
             r.get("x-dirty-rate-peak")))


def check_completed(check, src, dst, r, downtime=True, throttled=False):
    """Completed, downtime honoured; a throttled guest stopped as its vCPUs
    began a throttle sleep (x-switchover-throttle-wait did not time out)."""
    if not check("completed", r.get("status") == "completed",
                 "query-migrate %r; src %s; dst %s" % (r, dump(src), dump(dst))):
        return False
    w = r.get("x-switchover-throttle-wait") or {}
    print("# switchover throttle wait: %r" % w)
    if throttled:
        check("stopped_at_sleep", w.get("timed-out") is False and 0 < w.get("us", 0) < 500000,
              "x-switchover-throttle-wait %r" % w)
    if downtime:
        dt = r.get("downtime")
        check("downtime", isinstance(dt, int)
              and 0 <= dt <= DOWNTIME_LIMIT_MS + DOWNTIME_SLACK_MS,
              "downtime %r ms, limit %d ms + %d ms slack: %r"
              % (dt, DOWNTIME_LIMIT_MS, DOWNTIME_SLACK_MS, r))
    return True


def dst_runs_stress(check, src, dst, cpus=1):
    """The destination runs the guest on (every vCPU prints past the
    source's last line); source postmigrate, destination running."""
    src_t = last_t_ms(src.console) or 0
    ok = {}
    deadline = time.time() + kt.slow(15)
    while time.time() < deadline and len(ok) < cpus:
        for c in range(cpus):
            t = last_t_ms(dst.console, r"^stress cpu=%d t_ms=(\d+)" % c)
            if t is not None and t > src_t:
                ok[c] = t
        time.sleep(0.1)
    check("dst_runs_guest", len(ok) == cpus,
          "src last t_ms=%d, new dst lines for cpus %r; %s; src %s"
          % (src_t, sorted(ok), dump(dst), dump(src)))
    check("states", src.qmp().cmd("query-status").get("status") == "postmigrate"
          and dst.qmp().cmd("query-status").get("status") == "running",
          "%r %r" % (src.qmp().cmd("query-status"), dst.qmp().cmd("query-status")))


# ------------------------------------------------------------------ refusals

def test_dirty_limit_refused(d, vms, check):
    ring = kt.kmig_vm(d, "ring", "workload=idle", memory="128M", extra=RING)
    vms.append(ring)
    bm = kt.kmig_vm(d, "bitmap", "workload=idle", memory="128M", extra=BITMAP)
    vms.append(bm)
    qr, qb = ring.qmp(), bm.qmp()

    def caps(q):
        return {c["capability"]: c["state"] for c in q.cmd("query-migrate-capabilities")}

    def set_err(q, **c):
        reply = q.cmd_full("migrate-set-capabilities",
                           capabilities=[{"capability": k.replace("_", "-"), "state": v}
                                         for k, v in c.items()])
        return reply.get("error")

    check("cap_listed", "dirty-limit" in caps(qr) and not caps(qr)["dirty-limit"],
          repr(caps(qr)))
    # both in one command
    e = set_err(qr, auto_converge=True, dirty_limit=True)
    check("both_at_once", e is not None and not caps(qr)["auto-converge"]
          and not caps(qr)["dirty-limit"], "error %r, capabilities %r" % (e, caps(qr)))
    # auto-converge first, then dirty-limit
    kt.set_caps(qr, auto_converge=True)
    e = set_err(qr, dirty_limit=True)
    check("after_auto_converge", e is not None and caps(qr)["auto-converge"]
          and not caps(qr)["dirty-limit"], "error %r, capabilities %r" % (e, caps(qr)))
    # dirty-limit first, then auto-converge
    kt.set_caps(qr, auto_converge=False)
    kt.set_caps(qr, dirty_limit=True)
    e = set_err(qr, auto_converge=True)
    check("then_auto_converge", e is not None and caps(qr)["dirty-limit"]
          and not caps(qr)["auto-converge"], "error %r, capabilities %r" % (e, caps(qr)))
    # the bitmap backend
    e = set_err(qb, dirty_limit=True)
    check("bitmap", e is not None and not caps(qb)["dirty-limit"],
          "error %r, capabilities %r" % (e, caps(qb)))
    # parameters out of range
    for label, prm in (("period_0", {"x-vcpu-dirty-limit-period": 0}),
                       ("period_1001", {"x-vcpu-dirty-limit-period": 1001}),
                       ("limit_0", {"vcpu-dirty-limit": 0})):
        reply = qr.cmd_full("migrate-set-parameters", **prm)
        check("param_" + label, "error" in reply, "accepted %r" % prm)


# ------------------------------------------------------------------ no policy

def test_no_policy(d, vms, check):
    name = "converge_none"
    uri = tcp_uri()
    # the dirty ring: tracking costs the guest a fault per page per harvest,
    # so whether it is off again shows in the guest's pace
    src, dst = pair(d, vms, "none", STRESS % 1, uri, extra=RING)
    if not check("boot", src.console.wait(r"^stress cpu=0", kt.slow(30), proc=src.proc)
                 is not None, dump(src)):
        return
    settle(src.console, 1.0)              # past the first touch of every page
    base, base_vals = pace_over(src.console, 1.5)
    q = start_migration(src, dst, uri, {}, {"max-bandwidth": NO_POLICY_BANDWIDTH})
    # bounded: at least 8 s and 3 dirty syncs, at most 20 s (natively)
    t0 = time.time()
    r = q.cmd("query-migrate")
    while time.time() - t0 < kt.slow(20) and r.get("status") not in kt.MIG_FINAL and not (
            time.time() - t0 >= 8 and r.get("ram", {}).get("dirty-sync-count", 0) >= 3):
        time.sleep(0.2)
        r = q.cmd("query-migrate")
    print("# %s: after %.1f s: %s, dirty-sync-count %s, remaining %s MiB, throttle %s%%"
          % (name, time.time() - t0, r.get("status"), r.get("ram", {}).get("dirty-sync-count"),
             r.get("ram", {}).get("remaining", 0) >> 20, r.get("cpu-throttle-percentage")))
    check("not_converged", r.get("status") == "active"
          and r.get("ram", {}).get("dirty-sync-count", 0) >= 3
          and r.get("cpu-throttle-percentage") == 0, repr(r))
    during, during_vals = pace_over(src.console, 1.0)
    q.cmd("migrate_cancel")
    r = kt.wait_migration(q, kt.slow(15))
    if not check("cancelled", r.get("status") == "cancelled", repr(r)):
        return
    check("throttle_0", r.get("cpu-throttle-percentage") == 0, repr(r))
    check("src_running", q.cmd("query-status").get("status") == "running",
          repr(q.cmd("query-status")))
    n = src.console.count(r"^stress cpu=0")
    check("src_prints", src.console.wait(r"^stress cpu=0", kt.slow(5),
                                         start=len(src.console.lines)) is not None
          and src.console.count(r"^stress cpu=0") > n, dump(src))
    # dirty logging is off again, as KVM and kmig say it
    ok, detail = kt.recovered(q)
    check("tracking_off", ok, detail)
    # and the guest's pace comes back to near the one before the migration
    # (huge pages may take a while to come back, so loosely: within 10x,
    # where tracking costs ~100x here).  Natively only: under emulation the
    # pace after a cancel depends on the emulated machine's load (a CI run
    # on a busy host read 165-210 ms/GiB against 6-19 before, with KVM's
    # logging off), so there it is printed, not asserted.
    settle(src.console, 1.5)
    after, after_vals = pace_over(src.console, 2.0)
    print("# %s: ms_per_gib median before %s, during %s, after cancel %s"
          % (name, base, during, after))
    if not kt.emulated():
        check("pace_back", base is not None and after is not None and after < 10 * base,
              "ms_per_gib before %r, during %r, after %r" % (base_vals, during_vals, after_vals))
    # the cancelled migration's status stays until the next migrate
    check("status_kept", q.cmd("query-migrate").get("status") == "cancelled",
          repr(q.cmd("query-migrate")))


def test_bandwidth_in_page_bytes(d, vms, check):
    """With compression the policy weighs the page bytes a round moved, not
    the fewer bytes the link carried (docs/policies.md, Inputs): the stress
    guest's pages (one byte written in each) shrink a hundredfold, so at a
    cap of 1 MB/s on the link a round moves many MB/s of pages.  Measured
    in link bytes the bandwidth could never exceed the cap."""
    uri = tcp_uri()
    src, dst = pair(d, vms, "pagebytes", STRESS % 1, uri)
    if not check("boot", src.console.wait(r"^stress cpu=0", kt.slow(30), proc=src.proc)
                 is not None, dump(src)):
        return
    cap = 1000000
    q = start_migration(src, dst, uri, {}, {"max-bandwidth": cap, "x-compression": "zstd"})
    deadline = time.time() + kt.slow(30)
    r = q.cmd("query-migrate")
    while r.get("status") not in kt.MIG_FINAL and r.get("x-policy-bandwidth", 0) == 0 \
            and time.time() < deadline:
        time.sleep(0.2)
        r = q.cmd("query-migrate")
    bw = r.get("x-policy-bandwidth", 0)
    print("# page bytes: %s after %s dirty syncs, policy bandwidth %.1f MB/s at a %.1f MB/s cap"
          % (r.get("status"), r.get("ram", {}).get("dirty-sync-count"), bw / 1e6, cap / 1e6))
    check("bandwidth_in_page_bytes", bw > 3 * cap, repr(r))
    if r.get("status") not in kt.MIG_FINAL:
        q.cmd("migrate_cancel")
    r = kt.wait_migration(q, kt.slow(30))
    check("ended", r.get("status") in ("completed", "cancelled"), repr(r))


# ------------------------------------------------------------------ auto-converge

# step: QEMU's law, with larger steps than the defaults (20 + 10 per two
# high rounds takes ~40 s at this bandwidth; 60 + 20 ~22 s)
@pytest.mark.parametrize("policy,cpus,params", [
    ("step", 1, {"cpu-throttle-initial": 60, "cpu-throttle-increment": 20}),
    ("computed", 2, {}),
], ids=["step", "computed"])
def test_auto_converge(d, vms, check, policy, cpus, params):
    name = "converge_" + policy
    uri = tcp_uri()
    src, dst = pair(d, vms, policy, STRESS % cpus, uri, cpus=cpus)
    if not check("boot", src.console.wait(r"^stress cpu=%d" % (cpus - 1), kt.slow(30),
                                          proc=src.proc) is not None, dump(src)):
        return
    time.sleep(0.5)
    p = {"x-cpu-throttle-policy": policy}
    p.update(params)
    q = start_migration(src, dst, uri, {"auto-converge": True}, p)
    r, seen = follow(q, kt.slow(CONVERGE_TIMEOUT))
    summary(name, r, seen)
    if r.get("status") not in kt.MIG_FINAL:
        q.cmd("migrate_cancel")
    thr = [s.get("cpu-throttle-percentage", 0) for s in seen if s.get("status") == "active"]
    check("throttled", max(thr or [0]) > 0, "throttle seen while active: %r" % thr)
    if not check_completed(check, src, dst, r, throttled=True):
        return
    dst_runs_stress(check, src, dst, cpus)


def test_seed000_off(d, vms, check):
    uri = tcp_uri()
    src, dst = pair(d, vms, "s000", STRESS % 1, uri, extra=RING + ["--reaper", "fixed"])
    if not check("boot", src.console.wait(r"^stress cpu=0", kt.slow(30), proc=src.proc)
                 is not None, dump(src)):
        return
    time.sleep(0.5)
    off = {"x-sync-per-slot": True, "x-kick-throttled": True, "x-sync-dirty-rate": True}
    q = start_migration(src, dst, uri, {"auto-converge": True, "x-verify": True},
                        dict(off, **{"x-cpu-throttle-policy": "step", "cpu-throttle-initial": 60,
                                     "cpu-throttle-increment": 20}))
    p = q.cmd("query-migrate-parameters")
    check("switches", all(p.get(k) is True for k in off), repr(p))
    r, seen = follow(q, kt.slow(CONVERGE_TIMEOUT))
    summary("converge_seed000_off", r, seen)
    if r.get("status") not in kt.MIG_FINAL:
        q.cmd("migrate_cancel")
    if check_completed(check, src, dst, r, throttled=True):
        dst_runs_stress(check, src, dst)


# ------------------------------------------------------------------ dirty-limit

def test_dirty_limit(d, vms, check):
    name = "converge_dirty_limit"
    uri = tcp_uri()
    src, dst = pair(d, vms, "dlimit", STRESS % 1, uri, extra=RING)
    if not check("boot", src.console.wait(r"^stress cpu=0", kt.slow(30), proc=src.proc)
                 is not None, dump(src)):
        return
    time.sleep(0.5)
    q = start_migration(src, dst, uri, {"dirty-limit": True},
                        {"vcpu-dirty-limit": VCPU_DIRTY_LIMIT,
                         "x-vcpu-dirty-limit-period": 1000})
    r, seen = follow(q, kt.slow(CONVERGE_TIMEOUT), also=lambda: q.cmd("query-vcpu-dirty-limit"))
    summary(name, r, seen)
    if r.get("status") not in kt.MIG_FINAL:
        q.cmd("migrate_cancel")
    active = [s for s in seen if s.get("status") == "active"]
    fields = ("dirty-limit-throttle-time-per-round", "dirty-limit-ring-full-time")
    check("fields", active and all(f in s for s in active + [r] for f in fields),
          "replies without %r: %r" % (fields, [s for s in active + [r]
                                              if not all(f in s for f in fields)][:3]))
    # the statistics are taken at each round's decision; the last one may
    # come with the switchover, so the final reply counts too
    sleeps = [s.get(fields[0], 0) for s in active + [r]]
    print("# %s: throttle time per round seen %r, vcpu limits seen %r"
          % (name, sorted(set(sleeps)), [s["also"] for s in active if s["also"]][-3:]))
    check("limited", max(sleeps or [0]) > 0, "dirty-limit-throttle-time-per-round "
          "never > 0: %r" % sleeps)
    # the capability sets the quota on every vCPU while it acts, and the
    # migration's end removes it
    check("quota_seen", any(s["also"] and all(x.get("limit-rate") == VCPU_DIRTY_LIMIT
                                              for x in s["also"]) for s in active),
          "query-vcpu-dirty-limit while active: %r" % [s["also"] for s in active])
    # the limit's first step acts on the rate each vCPU dirtied before it
    # (a stress guest's, never 0); a rate forgotten at its start reads 0
    # until a period closes and leaves the vCPUs unlimited meanwhile
    first = next((s["also"] for s in active if s["also"]), None)
    check("limit_starts_from_rate", first is not None
          and all((x.get("current-rate") or 0) > 0 for x in first),
          "first query-vcpu-dirty-limit under the limit: %r" % (first,))
    check("quota_removed", r.get("status") != "completed"
          or q.cmd("query-vcpu-dirty-limit") == [], repr(q.cmd("query-vcpu-dirty-limit")))
    check("no_cpu_throttle", all(s.get("cpu-throttle-percentage", 0) == 0 for s in seen),
          "cpu-throttle-percentage set under dirty-limit: %r"
          % [s.get("cpu-throttle-percentage") for s in seen])
    if not check_completed(check, src, dst, r, throttled=True):
        return
    dst_runs_stress(check, src, dst)
    # the destination's guest is not limited
    check("dst_unlimited", dst.qmp().cmd("query-vcpu-dirty-limit") == [],
          repr(dst.qmp().cmd("query-vcpu-dirty-limit")))


# ------------------------------------------------------------------ kmig migrate's default

def kmig_migrate(vm, uri, *args):
    """kmig migrate on vm, no convergence option: (exit status, stdout);
    a migration still running when it times out is cancelled."""
    cmd = [kt.KMIG, "migrate", "--qmp", "unix:" + vm.qmp_path, "--bandwidth",
           str(BANDWIDTH // 1000000), "--downtime", str(DOWNTIME_LIMIT_MS)] + list(args) + [uri]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=kt.slow(CONVERGE_TIMEOUT) + 30)
        return p.returncode, p.stdout
    except subprocess.TimeoutExpired as e:
        vm.qmp().cmd("migrate_cancel")
        return None, e.stdout or ""


def test_cli_default(d, vms, check):
    uri = tcp_uri()
    src, dst = pair(d, vms, "cli", STRESS % 1, uri, extra=RING)
    if not check("boot", src.console.wait(r"^stress cpu=0", kt.slow(30), proc=src.proc)
                 is not None, dump(src)):
        return
    kt.wait_incoming(dst, kt.slow(30))
    rc, out = kmig_migrate(src, uri, "--json")
    r = json.loads(out) if rc is not None and out.strip().startswith("{") else {}
    want = max(1, min(20, BANDWIDTH // 1000000 // 6))
    check("chose_dirty_limit", r.get("x-kmig-migrate") == {
        "policy": "dirty-limit", "vcpu-dirty-limit": want, "by-default": True},
        "rc %r: %r" % (rc, r.get("x-kmig-migrate", out[-300:])))
    caps = {c["capability"]: c["state"] for c in src.qmp().cmd("query-migrate-capabilities")}
    check("caps", caps.get("dirty-limit") is True and caps.get("auto-converge") is False,
          repr(caps))
    if check_completed(check, src, dst, r, throttled=True):
        dst_runs_stress(check, src, dst)
    # the bitmap: the computed throttle, named in the summary
    uri = tcp_uri()
    src, dst = pair(d, vms, "clibm", "workload=idle report_ms=300", uri, extra=BITMAP)
    kt.wait_incoming(dst, kt.slow(30))
    rc, out = kmig_migrate(src, uri)
    check("bitmap_computed", rc == 0 and "policy: auto-converge computed (kmig migrate's "
          "default without the dirty ring" in out, "rc %r: %r" % (rc, out[-400:]))
    p = src.qmp().cmd("query-migrate-parameters")
    check("bitmap_params", p.get("x-cpu-throttle-policy") == "computed", repr(p))


# ------------------------------------------------------------------ verify

@pytest.mark.slow   # no page lost under the computed throttle: the computed policy
#                     completing is test_auto_converge[computed], a verify guest
#                     migrated with auto-converge and x-verify is test_migrate.py's
def test_verify(d, vms, check):
    name = "converge_verify"
    uri = tcp_uri()
    src, dst = pair(d, vms, "verify", VERIFY, uri)
    if not check("boot", src.console.wait(r"^verify ok round=", kt.slow(40), proc=src.proc)
                 is not None, dump(src)):
        return
    # 80 MB/s is below what the verify guest rewrites per second (2/3 of
    # its 256 MiB per round), so the throttle must engage before it ends
    # (under emulation: 8 MB/s and 32 MiB, see the module docstring)
    q = start_migration(src, dst, uri, {"auto-converge": True, "x-verify": True},
                        {"x-cpu-throttle-policy": "computed",
                         "max-bandwidth": VERIFY_BANDWIDTH})
    r, seen = follow(q, kt.slow(CONVERGE_TIMEOUT))
    summary(name, r, seen)
    if r.get("status") not in kt.MIG_FINAL:
        q.cmd("migrate_cancel")
    thr = [s.get("cpu-throttle-percentage", 0) for s in seen if s.get("status") == "active"]
    check("throttled", max(thr or [0]) > 0, "throttle seen while active: %r" % thr)
    # x-verify hashes all RAM on both sides while the guest is stopped: no
    # downtime bound here
    if not check_completed(check, src, dst, r, downtime=False):
        return
    src_round = max([int(x) for x in re.findall(r"verify ok round=(\d+)", src.console.text())]
                    or [0])
    deadline = time.time() + kt.slow(20)
    rounds = []
    while time.time() < deadline:
        rounds = [int(x) for x in re.findall(r"^verify ok round=(\d+)", dst.console.text(), re.M)]
        if len(rounds) >= 3 or "verify BAD" in dst.console.text() or dst.proc.poll() is not None:
            break
        time.sleep(0.2)
    check("dst_verify_ok", len(rounds) >= 3 and rounds == sorted(rounds)
          and rounds[0] >= src_round,
          "src last round %d, dst rounds %r; %s" % (src_round, rounds, dump(dst)))
    bad = [l for l in (src.console.text() + "\n" + dst.console.text()).splitlines()
           if "verify BAD" in l or "bad_pages" in l]
    check("no_bad", not bad, " / ".join(bad[:5]))
