"""End-to-end live migration between two kmig processes on this host.

Tests: a stress guest over TCP (statistics and run states), a verify guest
with x-verify on both dirty-tracking backends (and ring to bitmap), an idle
guest over a unix socket, through --incoming defer and to port 0 (found in
the destination's socket-address, with multifd), MIGRATION/MIGRATION_PASS
events, and max-bandwidth as an upper bound on the stream's rate.
"""
import os
import re
import time

import pytest

import kmigtest as kt

BITMAP = ["--dirty-ring", "0"]   # kmig's default is the ring where KVM has it

pytestmark = pytest.mark.kvm

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


def dump(vm, n=15):
    return kt.dump(vm, n)


STRESS_REPORT = re.compile(r"^stress cpu=(\d+) t_ms=(\d+) ms_per_gib=([\d.]+) ")


def stress_warm(vm, cpus=(0,), timeout=10):
    """Waits until each CPU's stress workload has written every page of its
    share (docs/guest.md): a report whose ms_per_gib is below half its t_ms
    comes only after the first GiB of page writes (more than one round)
    completed; until then a report gives the time the first GiB has taken
    so far, t_ms less the ~0.1 s before the workload started.  Under
    emulation that first round takes seconds."""
    deadline = time.time() + kt.slow(timeout)
    warm = set()
    while time.time() < deadline and vm.proc.poll() is None:
        vm.console.poll()
        for line in vm.console.lines:
            m = STRESS_REPORT.search(line)
            if m and float(m.group(3)) < int(m.group(2)) / 2:
                warm.add(int(m.group(1)))
        if warm >= set(cpus):
            return True
        time.sleep(0.1)
    return False


# ------------------------------------------------------------------ (1)

def test_stress_tcp(d, vms, check):
    uri = tcp_uri()
    src, dst = pair(d, "workload=stress mb=64 report_ms=500", "256M", uri)
    vms += [src, dst]
    if not check("boot", src.console.wait(r"^stress cpu=0", kt.slow(30), proc=src.proc)
                 is not None, dump(src)):
        return
    # every page written before the migration starts: the check of normal
    # pages below counts on it
    check("stress_warm", stress_warm(src), dump(src))
    r = kt.migrate(src, dst, uri, caps={"auto-converge": True},
                   params={"max-bandwidth": 0, "downtime-limit": 1000}, timeout=kt.slow(60))
    if not check("completed", r.get("status") == "completed", "query-migrate: %r; %s"
                 % (r, dump(src))):
        return
    src_t = last_t_ms(src.console) or 0
    m = dst.console.wait(r"^stress cpu=0 t_ms=(\d+)", kt.slow(20), proc=dst.proc)
    got = None
    deadline = time.time() + kt.slow(20)
    while time.time() < deadline:   # a stress line stamped after the source's last one
        t = last_t_ms(dst.console, r"^stress cpu=0 t_ms=(\d+)")
        if t is not None and t > src_t:
            got = t
            break
        time.sleep(0.1)
    check("dst_runs_guest", m is not None and got is not None,
          "src last t_ms=%d; dst %s" % (src_t, dump(dst)))
    check("src_postmigrate", src.qmp().cmd("query-status").get("status") == "postmigrate",
          repr(src.qmp().cmd("query-status")))
    check("dst_running", dst.qmp().cmd("query-status").get("status") == "running",
          repr(dst.qmp().cmd("query-status")))
    ram = r.get("ram", {})
    missing = [k for k in ("transferred", "remaining", "total", "duplicate", "normal",
                           "normal-bytes", "dirty-pages-rate", "mbps", "dirty-sync-count",
                           "page-size", "pages-per-second", "precopy-bytes", "downtime-bytes")
               if k not in ram]
    missing += [k for k in ("total-time", "downtime", "cpu-throttle-percentage") if k not in r]
    check("fields", not missing, "missing %r in %r" % (missing, r))
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
    check("stats_sane", not why, "%s: %r" % ("; ".join(why), r))
    src_out = src.console.count(r"^stress")
    time.sleep(1.5)
    check("src_stopped", src.console.count(r"^stress") == src_out,
          "the source guest printed after completion")


# ------------------------------------------------------------------ (2)

@pytest.mark.parametrize("backend", ["bitmap", "ring", "mixed"])
def test_verify(d, vms, check, backend):
    ring = ["--dirty-ring", "4096"]
    uri = tcp_uri()
    cmd = "workload=verify mb=64 report_ms=300"
    if backend == "mixed":      # --dirty-ring need not match (docs/usage.md)
        src = kt.kmig_vm(d, "src", cmd, memory="256M", extra=ring)
        dst = kt.kmig_vm(d, "dst", cmd, memory="256M", extra=BITMAP + ["--incoming", uri])
    else:
        src, dst = pair(d, cmd, "256M", uri, extra=ring if backend == "ring" else BITMAP)
    vms += [src, dst]
    m = src.console.wait(r"^verify ok round=(\d+)", kt.slow(40), proc=src.proc)
    if not check("boot", m is not None, dump(src)):
        return
    # default bandwidth and downtime limit: the guest rewrites 2/3 of its
    # 64 MiB per round, so dirty rounds follow the bulk pass until
    # auto-converge slows it down enough
    r = kt.migrate(src, dst, uri, caps={"x-verify": True, "auto-converge": True},
                   timeout=kt.slow(70))
    print("# verify_%s: total-time %s ms, downtime %s ms, dirty-sync-count %s, throttle %s%%"
          % (backend, r.get("total-time"), r.get("downtime"),
             r.get("ram", {}).get("dirty-sync-count"), r.get("cpu-throttle-percentage")))
    if not check("completed", r.get("status") == "completed",
                 "query-migrate: %r; src %s; dst %s" % (r, dump(src), dump(dst))):
        return
    src_round = max([int(x) for x in re.findall(r"verify ok round=(\d+)", src.console.text())] or [0])
    # the destination goes on: at least two more "verify ok" reports, rounds growing
    deadline = time.time() + kt.slow(30)
    rounds = []
    while time.time() < deadline:
        rounds = [int(x) for x in re.findall(r"^verify ok round=(\d+)", dst.console.text(), re.M)]
        if len(rounds) >= 3 or "verify BAD" in dst.console.text() or dst.proc.poll() is not None:
            break
        time.sleep(0.2)
    check("dst_verify_ok", len(rounds) >= 3 and rounds == sorted(rounds)
          and len(set(rounds)) == len(rounds) and rounds[0] >= src_round,
          "src last round %d, dst rounds %r; %s" % (src_round, rounds, dump(dst)))
    bad = [l for l in (src.console.text() + "\n" + dst.console.text()).splitlines()
           if "verify BAD" in l or "bad_pages" in l]
    check("no_bad", not bad, " / ".join(bad[:5]))
    check("dst_running", dst.qmp().cmd("query-status").get("status") == "running", dump(dst))


# ------------------------------------------------------------------ (3)

def idle_migration(d, vms, check, uri, incoming=None, defer_uri=None, caps=None):
    """uri None: the destination listens on incoming (port 0), the
    source learns where from its socket-address."""
    src, dst = pair(d, "workload=idle report_ms=200", "128M", uri, incoming=incoming)
    vms += [src, dst]
    if not check("boot", src.console.wait(r"^heartbeat", kt.slow(30), proc=src.proc) is not None,
                 dump(src)):
        return
    if defer_uri:
        # nothing listens before migrate-incoming
        time.sleep(0.3)
        check("defer_inmigrate",
              dst.qmp().cmd("query-status").get("status") == "inmigrate"
              and "listening" not in dst.output(), dump(dst))
        dst.qmp().cmd("migrate-incoming", uri=defer_uri)
    check("listening", kt.wait_incoming(dst, kt.slow(10)), dump(dst))
    # where the destination listens (QMP's socket-address): with port 0
    # the only way to learn the port it bound
    addr = dst.qmp().cmd("query-migrate").get("socket-address")
    if uri is None:
        ok = check("socket_address", isinstance(addr, list) and len(addr) == 1
                   and addr[0].get("type") == "inet" and addr[0].get("host") == "127.0.0.1"
                   and addr[0].get("port", "0").isdigit() and addr[0]["port"] != "0", repr(addr))
        if not ok:
            return
        uri = "tcp:127.0.0.1:%s" % addr[0]["port"]
    else:
        kind, where = uri.split(":", 1)
        want = ({"type": "unix", "path": where} if kind == "unix" else
                {"type": "inet", "host": where.rsplit(":", 1)[0], "port": where.rsplit(":", 1)[1]})
        check("socket_address", addr == [want], "%r, not [%r]" % (addr, want))
    if caps:
        kt.set_caps(dst.qmp(), **caps)
    r = kt.migrate(src, dst, uri, caps=dict({"x-verify": True}, **{
        k.replace("_", "-"): v for k, v in (caps or {}).items()}), timeout=kt.slow(40))
    if not check("completed", r.get("status") == "completed",
                 "query-migrate: %r; %s; %s" % (r, dump(src), dump(dst))):
        return
    src_t = last_t_ms(src.console) or 0
    ok = False
    deadline = time.time() + kt.slow(15)
    while time.time() < deadline and not ok:
        t = last_t_ms(dst.console)
        ok = t is not None and t > src_t and dst.console.count(r"^heartbeat") >= 2
        time.sleep(0.1)
    check("dst_heartbeat", ok, "src last t_ms=%d; %s" % (src_t, dump(dst)))
    check("states", src.qmp().cmd("query-status").get("status") == "postmigrate"
          and dst.qmp().cmd("query-status").get("status") == "running",
          "%r %r" % (src.qmp().cmd("query-status"), dst.qmp().cmd("query-status")))
    dq = dst.qmp().cmd("query-migrate")
    check("dst_query", dq.get("status") == "completed", repr(dq))
    check("no_socket_address_after", "socket-address" not in dq, repr(dq))


def test_idle_unix(d, vms, check):
    idle_migration(d, vms, check, "unix:" + os.path.join(d, "mig.sock"))


def test_idle_defer(d, vms, check):
    uri = tcp_uri()
    idle_migration(d, vms, check, uri, incoming="defer", defer_uri=uri)


def test_idle_port_zero(d, vms, check):
    """--incoming tcp:127.0.0.1:0 and multifd: the channels connect to the
    port the destination bound, read from its socket-address."""
    idle_migration(d, vms, check, None, incoming="tcp:127.0.0.1:0", caps={"multifd": True})


# ------------------------------------------------------------------ (4)

def test_events(d, vms, check):
    uri = tcp_uri()
    src, dst = pair(d, "workload=stress mb=64 report_ms=500", "256M", uri)
    vms += [src, dst]
    if not check("boot", src.console.wait(r"^stress cpu=0", kt.slow(30), proc=src.proc)
                 is not None, dump(src)):
        return
    # default bandwidth (128 MiB/s) and downtime (300 ms): the 64 MiB the
    # guest dirties during the bulk pass cannot go in one stop, so at least
    # one dirty round follows; auto-converge makes it end.
    r = kt.migrate(src, dst, uri, caps={"events": True, "auto-converge": True},
                   params={"x-cpu-throttle-policy": "computed"}, timeout=kt.slow(70))
    q = src.qmp()
    q.wait_event("NONEXISTENT", timeout=0.5)   # drain what is still queued
    evs = [e for e in q.events if e["event"] in ("MIGRATION", "MIGRATION_PASS")]
    statuses = [e["data"]["status"] for e in evs if e["event"] == "MIGRATION"]
    passes = [e["data"]["pass"] for e in evs if e["event"] == "MIGRATION_PASS"]
    if not check("completed", r.get("status") == "completed",
                 "query-migrate %r; events %r" % (r, evs)):
        return
    # setup, active, [device,] completed, in this order, nothing else
    want = ["setup", "active", "device", "completed"]
    check("migration_sequence",
          statuses in (want, ["setup", "active", "completed"]), "MIGRATION statuses %r" % statuses)
    check("pass", len(passes) >= 1 and passes == sorted(passes)
          and len(set(passes)) == len(passes),
          "MIGRATION_PASS passes %r (dirty-sync-count %r)"
          % (passes, r.get("ram", {}).get("dirty-sync-count")))
    # every MIGRATION_PASS comes while active
    order = [(e["event"], e.get("data", {}).get("status")) for e in evs]
    ia = order.index(("MIGRATION", "active")) if ("MIGRATION", "active") in order else -1
    ic = order.index(("MIGRATION", "completed")) if ("MIGRATION", "completed") in order else -1
    inside = all(ia < i < ic for i, o in enumerate(order) if o[0] == "MIGRATION_PASS")
    check("pass_while_active", ia >= 0 and inside, repr(order))
    ts = [e["timestamp"]["seconds"] * 1e6 + e["timestamp"]["microseconds"] for e in evs]
    check("timestamps", ts == sorted(ts), repr(ts))


def test_pause_before_switchover(d, vms, check):
    """QEMU's pause-before-switchover: the migration stops in status
    pre-switchover with the source's vCPUs stopped (query-status
    finish-migrate, the guest prints nothing) until migrate-continue; a
    cancel there resumes the source guest with tracking released, and a
    second migration continued from there completes with x-verify."""
    uri = tcp_uri()
    cmd = "workload=verify mb=16 report_ms=100"
    src, dst = pair(d, cmd, "256M", uri)
    vms += [src, dst]
    if not check("boot", src.console.wait(r"^verify ok round=", kt.slow(40), proc=src.proc)
                 is not None, dump(src)):
        return
    q = src.qmp()
    early = q.cmd_full("migrate-continue", state="pre-switchover")
    check("continue_refused_idle", "not in expected state: none" in
          early.get("error", {}).get("desc", ""), repr(early))
    kt.set_caps(q, pause_before_switchover=True, events=True, x_verify=True)
    caps = {c["capability"]: c["state"] for c in q.cmd("query-migrate-capabilities")}
    check("cap_listed", caps.get("pause-before-switchover") is True, repr(caps))
    kt.set_params(q, max_bandwidth=1 << 30)

    def reach_pre_switchover(dst, uri):
        kt.wait_incoming(dst, kt.slow(30))
        q.cmd("migrate", uri=uri)
        return kt.wait_migration(q, kt.slow(60), statuses=("pre-switchover",) + kt.MIG_FINAL)

    r = reach_pre_switchover(dst, uri)
    if not check("pre_switchover", r.get("status") == "pre-switchover", "query-migrate %r" % r):
        return
    st = q.cmd("query-status").get("status")
    check("stopped", st == "finish-migrate", "query-status %r" % st)
    n = len(src.console.text().splitlines())
    time.sleep(0.5)
    check("guest_stopped", len(src.console.text().splitlines()) == n, dump(src))
    wrong = q.cmd_full("migrate-continue", state="active")
    check("continue_wrong_state", "not in expected state: pre-switchover" in
          wrong.get("error", {}).get("desc", ""), repr(wrong))
    junk = q.cmd_full("migrate-continue", state="sideways")
    check("continue_unknown_state", "does not accept value 'sideways'" in
          junk.get("error", {}).get("desc", ""), repr(junk))
    check("still_waiting", q.cmd("query-migrate").get("status") == "pre-switchover", "")
    # a cancel while waiting: the source guest runs again
    q.cmd("migrate_cancel")
    r = kt.wait_migration(q, kt.slow(10))
    check("cancelled", r.get("status") == "cancelled", "query-migrate %r" % r)
    check("src_running", q.cmd("query-status").get("status") == "running", dump(src))
    ok, why = kt.recovered(q)
    check("recovered", ok, why)
    n = len(re.findall(r"^verify ok", src.console.text(), re.M))
    deadline = time.time() + kt.slow(10)
    while time.time() < deadline and len(re.findall(r"^verify ok", src.console.text(), re.M)) <= n:
        time.sleep(0.1)
    check("guest_resumed", len(re.findall(r"^verify ok", src.console.text(), re.M)) > n, dump(src))
    # again, to a new destination (the first one failed with the stream),
    # and continue: it completes
    check("dst_failed", dst.wait_exit(kt.slow(20)) == 1, dump(dst))
    uri = tcp_uri()
    dst = kt.kmig_vm(d, "dst2", cmd, memory="256M", extra=["--incoming", uri])
    vms.append(dst)
    q.events.clear()
    r = reach_pre_switchover(dst, uri)
    if not check("pre_switchover_again", r.get("status") == "pre-switchover",
                 "query-migrate %r; dst %s" % (r, dump(dst))):
        return
    q.cmd("migrate-continue", state="pre-switchover")
    r = kt.wait_migration(q, kt.slow(30))
    if not check("completed", r.get("status") == "completed",
                 "query-migrate %r; dst %s" % (r, dump(dst))):
        return
    q.wait_event("NONEXISTENT", timeout=0.3)
    statuses = [e["data"]["status"] for e in q.events if e["event"] == "MIGRATION"]
    check("sequence", statuses == ["setup", "active", "pre-switchover", "device", "completed"],
          repr(statuses))
    check("dst_running", dst.qmp().cmd("query-status").get("status") == "running", dump(dst))
    got = dst.console.wait(r"^verify ok round=", kt.slow(20), start=len(dst.console.lines),
                           proc=dst.proc)
    check("dst_verify_ok", got is not None and "verify BAD" not in dst.console.text(), dump(dst))


def test_switchover_unlimited(d, vms, check):
    """The stop-and-copy ignores max-bandwidth, as QEMU's does: the guest
    is stopped, so what is left goes as fast as the link allows.  An 8 MiB
    stress set at 4 MB/s with a 3 s downtime limit switches over after the
    bulk pass with all of it dirty: rate-limited that stop would take about
    2 s, unlimited on loopback a few ms."""
    uri = tcp_uri()
    src, dst = pair(d, "workload=stress mb=8 report_ms=200", "256M", uri)
    vms += [src, dst]
    if not check("boot", stress_warm(src), dump(src)):
        return
    limit = 4000000
    r = kt.migrate(src, dst, uri, caps={"auto-converge": False},
                   params={"max-bandwidth": limit, "downtime-limit": 3000,
                           "x-final-round": False}, timeout=kt.slow(60))
    if not check("completed", r.get("status") == "completed", "query-migrate %r" % r):
        return
    ram = r["ram"]
    down, dbytes = r.get("downtime", 0), ram.get("downtime-bytes", 0)
    print("# switchover_unlimited: %d KiB in %d ms (limit %d B/s)" % (dbytes >> 10, down, limit))
    check("much_in_stop", dbytes >= 4 * MIB, "query-migrate %r" % r)
    # unthrottled, the switchover does not wait for throttle sleeps
    w = r.get("x-switchover-throttle-wait") or {}
    check("no_sleep_wait", w.get("timed-out") is False and 0 <= w.get("us", -1) < 20000,
          "x-switchover-throttle-wait %r" % w)
    # rate-limited, the stop would carry at most the limit per second
    check("faster_than_limit", dbytes * 1000 > 2 * limit * max(down, 1),
          "downtime %d ms for %d bytes" % (down, dbytes))
    # the next migration's limit is the user's again
    p = src.qmp().cmd("query-migrate-parameters")
    check("limit_kept", p.get("max-bandwidth") == limit, repr(p))


# ------------------------------------------------------------------ (5)

def test_max_bandwidth(d, vms, check):
    uri = tcp_uri()
    limit = 32 * MIB
    # fill-free leaves ~48 MiB of non-zero pages and then idles: a fixed
    # amount of data that must go through the limiter
    src, dst = pair(d, "workload=fill-free mb=48 report_ms=500", "128M", uri)
    vms += [src, dst]
    if not check("boot", src.console.wait(r"^heartbeat", kt.slow(40), proc=src.proc) is not None,
                 dump(src)):
        return
    r = kt.migrate(src, dst, uri, params={"max-bandwidth": limit}, timeout=kt.slow(60))
    if not check("completed", r.get("status") == "completed", repr(r)):
        return
    ram = r["ram"]
    secs = max(r.get("total-time", 0), 1) / 1000.0
    rate = ram["transferred"] / secs
    print("# max_bandwidth: %.1f MiB in %.2f s = %.1f MiB/s (limit %d MiB/s)"
          % (ram["transferred"] / MIB, secs, rate / MIB, limit // MIB))
    check("data_sent", ram["transferred"] >= 40 * MIB, repr(r))
    # an upper bound on the bytes per second of the whole migration; the
    # token bucket may burst a little, so be lenient
    check("bounded", rate <= 1.5 * limit,
          "%.1f MiB/s over %.2f s with a %d MiB/s limit: %r" % (rate / MIB, secs, limit // MIB, r))
