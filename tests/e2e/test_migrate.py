#!/usr/bin/env python3
"""End-to-end live migration between two kmig processes on this host.

Cases: a stress guest over TCP (statistics and run states), a verify guest
with x-verify on both dirty-tracking backends (and ring to bitmap), an idle guest over a unix
socket and through --incoming defer, MIGRATION/MIGRATION_PASS events, and
max-bandwidth as an upper bound on the stream's rate.
"""
import os
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kmigtest as kt  # noqa: E402

R = kt.Report()
MIB = 1 << 20


def tcp_uri():
    return "tcp:127.0.0.1:%d" % kt.free_port()


def pair(d, cmdline, memory, uri, extra=(), incoming=None):
    """Starts a source and a destination (listening on uri, or `defer`)."""
    src = kt.kmig_vm(d, "src", cmdline, memory=memory, extra=list(extra))
    dst = kt.kmig_vm(d, "dst", cmdline, memory=memory,
                     extra=list(extra) + ["--incoming", incoming or uri])
    return src, dst


def last_t_ms(console, pattern=r"t_ms=(\d+)"):
    console.poll()
    for line in reversed(console.lines):
        m = re.search(pattern, line)
        if m:
            return int(m.group(1))
    return None


def run_case(name, fn, d):
    kt.run_case(R, name, lambda vms: fn(d, vms))


def dump(vm, n=15):
    return kt.dump(vm, n)


# ------------------------------------------------------------------ (1)

def case_stress_tcp(d, vms):
    name = "migrate_stress_tcp"
    uri = tcp_uri()
    src, dst = pair(d, "workload=stress mb=64 report_ms=500", "256M", uri)
    vms += [src, dst]
    if not R.ok(name + "_boot", src.console.wait(r"^stress cpu=0", 30, proc=src.proc) is not None,
                dump(src)):
        return
    r = kt.migrate(src, dst, uri, caps={"auto-converge": True},
                   params={"max-bandwidth": 0, "downtime-limit": 1000}, timeout=60)
    if not R.ok(name + "_completed", r.get("status") == "completed", "query-migrate: %r; %s"
                % (r, dump(src))):
        return
    src_t = last_t_ms(src.console) or 0
    m = dst.console.wait(r"^stress cpu=0 t_ms=(\d+)", 20, proc=dst.proc)
    got = None
    deadline = time.time() + 20
    while time.time() < deadline:   # a stress line stamped after the source's last one
        t = last_t_ms(dst.console, r"^stress cpu=0 t_ms=(\d+)")
        if t is not None and t > src_t:
            got = t
            break
        time.sleep(0.1)
    R.ok(name + "_dst_runs_guest", m is not None and got is not None,
         "src last t_ms=%d; dst %s" % (src_t, dump(dst)))
    R.ok(name + "_src_postmigrate", src.qmp().cmd("query-status").get("status") == "postmigrate",
         repr(src.qmp().cmd("query-status")))
    R.ok(name + "_dst_running", dst.qmp().cmd("query-status").get("status") == "running",
         repr(dst.qmp().cmd("query-status")))
    ram = r.get("ram", {})
    missing = [k for k in ("transferred", "remaining", "total", "duplicate", "normal",
                           "normal-bytes", "dirty-pages-rate", "mbps", "dirty-sync-count",
                           "page-size", "pages-per-second", "precopy-bytes", "downtime-bytes")
               if k not in ram]
    missing += [k for k in ("total-time", "downtime", "cpu-throttle-percentage") if k not in r]
    R.ok(name + "_fields", not missing, "missing %r in %r" % (missing, r))
    why = []
    if not ram.get("transferred", 0) > 0:
        why.append("transferred not > 0")
    if not r.get("downtime", -1) >= 0:
        why.append("downtime not >= 0")
    if not r.get("total-time", -1) >= r.get("downtime", 0):
        why.append("total-time < downtime")
    if not ram.get("dirty-sync-count", 0) >= 1:
        why.append("dirty-sync-count < 1")
    if not ram.get("duplicate", 0) > 0:
        why.append("duplicate not > 0 for a mostly zero guest")
    if ram.get("total") != 256 * MIB:
        why.append("total != 256 MiB")
    if ram.get("page-size") != 4096:
        why.append("page-size != 4096")
    if ram.get("remaining") != 0:
        why.append("remaining != 0 after completion")
    # 64 MiB of written pages must have gone over the wire at least once
    if not ram.get("normal", 0) * 4096 >= 64 * MIB:
        why.append("normal pages < 64 MiB")
    if not ram.get("transferred", 0) >= ram.get("normal-bytes", 0):
        why.append("transferred < normal-bytes")
    if ram.get("normal-bytes") != ram.get("normal", 0) * 4096:
        why.append("normal-bytes != normal * 4096")
    if ram.get("precopy-bytes", 0) + ram.get("downtime-bytes", 0) > ram.get("transferred", 0) + 4096:
        why.append("precopy-bytes + downtime-bytes > transferred")
    R.ok(name + "_stats_sane", not why, "%s: %r" % ("; ".join(why), r))
    src_out = src.console.count(r"^stress")
    time.sleep(1.5)
    R.ok(name + "_src_stopped", src.console.count(r"^stress") == src_out,
         "the source guest printed after completion")


# ------------------------------------------------------------------ (2)

def case_verify(d, vms, backend):
    name = "migrate_verify_" + backend
    sub = os.path.join(d, backend)
    os.mkdir(sub)
    ring = ["--dirty-ring", "4096"]
    uri = tcp_uri()
    cmd = "workload=verify mb=64 report_ms=300"
    if backend == "mixed":      # --dirty-ring need not match (docs/usage.md)
        src = kt.kmig_vm(sub, "src", cmd, memory="256M", extra=ring)
        dst = kt.kmig_vm(sub, "dst", cmd, memory="256M", extra=["--incoming", uri])
    else:
        src, dst = pair(sub, cmd, "256M", uri, extra=ring if backend == "ring" else [])
    vms += [src, dst]
    m = src.console.wait(r"^verify ok round=(\d+)", 40, proc=src.proc)
    if not R.ok(name + "_boot", m is not None, dump(src)):
        return
    # default bandwidth and downtime limit: the guest rewrites 2/3 of its
    # 64 MiB per round, so dirty rounds follow the bulk pass until
    # auto-converge slows it down enough
    r = kt.migrate(src, dst, uri, caps={"x-verify": True, "auto-converge": True}, timeout=70)
    print("# %s: total-time %s ms, downtime %s ms, dirty-sync-count %s, throttle %s%%"
          % (name, r.get("total-time"), r.get("downtime"),
             r.get("ram", {}).get("dirty-sync-count"), r.get("cpu-throttle-percentage")))
    if not R.ok(name + "_completed", r.get("status") == "completed",
                "query-migrate: %r; src %s; dst %s" % (r, dump(src), dump(dst))):
        return
    src_round = max([int(x) for x in re.findall(r"verify ok round=(\d+)", src.console.text())] or [0])
    # the destination goes on: at least two more "verify ok" reports, rounds growing
    deadline = time.time() + 30
    rounds = []
    while time.time() < deadline:
        rounds = [int(x) for x in re.findall(r"^verify ok round=(\d+)", dst.console.text(), re.M)]
        if len(rounds) >= 3 or "verify BAD" in dst.console.text() or dst.proc.poll() is not None:
            break
        time.sleep(0.2)
    R.ok(name + "_dst_verify_ok", len(rounds) >= 3 and rounds == sorted(rounds)
         and len(set(rounds)) == len(rounds) and rounds[0] >= src_round,
         "src last round %d, dst rounds %r; %s" % (src_round, rounds, dump(dst)))
    bad = [l for l in (src.console.text() + "\n" + dst.console.text()).splitlines()
           if "verify BAD" in l or "bad_pages" in l]
    R.ok(name + "_no_bad", not bad, " / ".join(bad[:5]))
    R.ok(name + "_dst_running", dst.qmp().cmd("query-status").get("status") == "running",
         dump(dst))


# ------------------------------------------------------------------ (3)

def idle_migration(d, vms, name, uri, incoming=None, defer_uri=None):
    src, dst = pair(d, "workload=idle report_ms=200", "128M", uri, incoming=incoming)
    vms += [src, dst]
    if not R.ok(name + "_boot", src.console.wait(r"^heartbeat", 30, proc=src.proc) is not None,
                dump(src)):
        return
    if defer_uri:
        # nothing listens before migrate-incoming
        time.sleep(0.3)
        R.ok(name + "_defer_inmigrate",
             dst.qmp().cmd("query-status").get("status") == "inmigrate"
             and "listening" not in dst.output(), dump(dst))
        dst.qmp().cmd("migrate-incoming", uri=defer_uri)
    r = kt.migrate(src, dst, uri, caps={"x-verify": True}, timeout=40)
    if not R.ok(name + "_completed", r.get("status") == "completed",
                "query-migrate: %r; %s; %s" % (r, dump(src), dump(dst))):
        return
    src_t = last_t_ms(src.console) or 0
    ok = False
    deadline = time.time() + 15
    while time.time() < deadline and not ok:
        t = last_t_ms(dst.console)
        ok = t is not None and t > src_t and dst.console.count(r"^heartbeat") >= 2
        time.sleep(0.1)
    R.ok(name + "_dst_heartbeat", ok, "src last t_ms=%d; %s" % (src_t, dump(dst)))
    R.ok(name + "_states", src.qmp().cmd("query-status").get("status") == "postmigrate"
         and dst.qmp().cmd("query-status").get("status") == "running",
         "%r %r" % (src.qmp().cmd("query-status"), dst.qmp().cmd("query-status")))
    dq = dst.qmp().cmd("query-migrate")
    R.ok(name + "_dst_query", dq.get("status") == "completed", repr(dq))


def case_idle_unix(d, vms):
    sub = os.path.join(d, "unix")
    os.mkdir(sub)
    uri = "unix:" + os.path.join(sub, "mig.sock")
    idle_migration(sub, vms, "migrate_idle_unix", uri)


def case_idle_defer(d, vms):
    sub = os.path.join(d, "defer")
    os.mkdir(sub)
    uri = tcp_uri()
    idle_migration(sub, vms, "migrate_idle_defer", uri, incoming="defer", defer_uri=uri)


# ------------------------------------------------------------------ (4)

def case_events(d, vms):
    name = "migrate_events"
    sub = os.path.join(d, "events")
    os.mkdir(sub)
    uri = tcp_uri()
    src, dst = pair(sub, "workload=stress mb=64 report_ms=500", "256M", uri)
    vms += [src, dst]
    if not R.ok(name + "_boot", src.console.wait(r"^stress cpu=0", 30, proc=src.proc) is not None,
                dump(src)):
        return
    # default bandwidth (128 MiB/s) and downtime (300 ms): the 64 MiB the
    # guest dirties during the bulk pass cannot go in one stop, so at least
    # one dirty round follows; auto-converge makes it end.
    r = kt.migrate(src, dst, uri, caps={"events": True, "auto-converge": True},
                   params={"x-cpu-throttle-policy": "computed"}, timeout=70)
    q = src.qmp()
    q.wait_event("NONEXISTENT", timeout=0.5)   # drain what is still queued
    evs = [e for e in q.events if e["event"] in ("MIGRATION", "MIGRATION_PASS")]
    statuses = [e["data"]["status"] for e in evs if e["event"] == "MIGRATION"]
    passes = [e["data"]["pass"] for e in evs if e["event"] == "MIGRATION_PASS"]
    if not R.ok(name + "_completed", r.get("status") == "completed",
                "query-migrate %r; events %r" % (r, evs)):
        return
    # setup, active, [device,] completed, in this order, nothing else
    want = ["setup", "active", "device", "completed"]
    R.ok(name + "_migration_sequence",
         statuses in (want, ["setup", "active", "completed"]), "MIGRATION statuses %r" % statuses)
    R.ok(name + "_pass", len(passes) >= 1 and passes == sorted(passes)
         and len(set(passes)) == len(passes),
         "MIGRATION_PASS passes %r (dirty-sync-count %r)"
         % (passes, r.get("ram", {}).get("dirty-sync-count")))
    # every MIGRATION_PASS comes while active
    order = [(e["event"], e.get("data", {}).get("status")) for e in evs]
    ia = order.index(("MIGRATION", "active")) if ("MIGRATION", "active") in order else -1
    ic = order.index(("MIGRATION", "completed")) if ("MIGRATION", "completed") in order else -1
    inside = all(ia < i < ic for i, o in enumerate(order) if o[0] == "MIGRATION_PASS")
    R.ok(name + "_pass_while_active", ia >= 0 and inside, repr(order))
    ts = [e["timestamp"]["seconds"] * 1e6 + e["timestamp"]["microseconds"] for e in evs]
    R.ok(name + "_timestamps", ts == sorted(ts), repr(ts))


# ------------------------------------------------------------------ (5)

def case_bandwidth(d, vms):
    name = "migrate_max_bandwidth"
    sub = os.path.join(d, "bw")
    os.mkdir(sub)
    uri = tcp_uri()
    limit = 32 * MIB
    # fill-free leaves ~48 MiB of non-zero pages and then idles: a fixed
    # amount of data that must go through the limiter
    src, dst = pair(sub, "workload=fill-free mb=48 report_ms=500", "128M", uri)
    vms += [src, dst]
    if not R.ok(name + "_boot", src.console.wait(r"^heartbeat", 40, proc=src.proc) is not None,
                dump(src)):
        return
    r = kt.migrate(src, dst, uri, params={"max-bandwidth": limit}, timeout=60)
    if not R.ok(name + "_completed", r.get("status") == "completed", repr(r)):
        return
    ram = r["ram"]
    secs = max(r.get("total-time", 0), 1) / 1000.0
    rate = ram["transferred"] / secs
    print("# %s: %.1f MiB in %.2f s = %.1f MiB/s (limit %d MiB/s)"
          % (name, ram["transferred"] / MIB, secs, rate / MIB, limit // MIB))
    R.ok(name + "_data_sent", ram["transferred"] >= 40 * MIB, repr(r))
    # an upper bound on the bytes per second of the whole migration; the
    # token bucket may burst a little, so be lenient
    R.ok(name + "_bounded", rate <= 1.5 * limit,
         "%.1f MiB/s over %.2f s with a %d MiB/s limit: %r" % (rate / MIB, secs, limit // MIB, r))


def main():
    if not kt.have_kvm():
        R.skip("migrate", "no /dev/kvm")
        return
    d = kt.tmpdir()
    try:
        run_case("migrate_stress_tcp", case_stress_tcp, d)
        run_case("migrate_verify_bitmap", lambda d, v: case_verify(d, v, "bitmap"), d)
        run_case("migrate_verify_ring", lambda d, v: case_verify(d, v, "ring"), d)
        run_case("migrate_verify_mixed", lambda d, v: case_verify(d, v, "mixed"), d)
        run_case("migrate_idle_unix", case_idle_unix, d)
        run_case("migrate_idle_defer", case_idle_defer, d)
        run_case("migrate_events", case_events, d)
        run_case("migrate_max_bandwidth", case_bandwidth, d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
    R.done()
