"""Chaos: one guest migrated from kmig process to kmig process again and
again, each migration broken once by a fault chosen at random, each
outcome checked against the fault matrix's table.

Every run draws a cell of the fault matrix (tests/lib/faultmatrix.py:
phase x fault, docs/protocol.md "Faults and outcomes", where the expected
outcome of each is written down) or one of the extra faults below, from a
random.Random seeded once: the same seed replays the same sequence, and
`--seed S --only K` replays run K alone.  The guest goes on from wherever
the table says it runs afterwards; where it is lost by design (a source
killed before the end: the destination never ran it) a fresh guest starts.

After each run, beyond the cell's own checks (faultmatrix.run_cell):
  - never two running copies: of the run's kmig processes still alive, at
    most one has its guest running;
  - every QMP call to a side that runs answers within QMP_WITHIN s (slowed
    under emulation as every timeout of the tests);
  - nothing leaked: a source that kept its guest has, once it runs again,
    as many open fds and threads as before the migration.

Extra faults, outside the matrix:
  cancel   migrate_cancel during the bulk pass: the migration is cancelled
           within QUIT_WITHIN s, the guest runs on at the source (then a
           retry as in the matrix);
  yank     QMP yank of the migration during the bulk pass: the same, with
           status failed;
  postcopy-cut  a post-copy migration (x-verify) whose link is cut at a
           random moment of postcopy-active, with the push held back so
           pages are still missing: both sides pause; two migrate-recover
           in one write: the second is refused; the source resumes on the
           new link and the migration completes, every page checked;
  stray    a connection that sends an HTTP request, or nothing, reaches the
           destination's port before the source: it is dropped and
           counted (x-stray-connections), the migration completes with
           x-verify;
  none     no fault: the migration completes with x-verify.
"""
import os
import random
import socket
import time

import faultmatrix as fm
import kmigtest as kt
from faultproxy import FaultProxy

QMP_WITHIN = 3.0       # s: a running side answers a QMP call this soon
QUIT_WITHIN = 5.0      # s: a cancel or yank ends the migration this soon
EXTRA = ["cancel", "yank", "postcopy-cut", "stray", "none"]
EXTRA_WANT = {"cancel": "runs", "yank": "runs", "postcopy-cut": "recovers", "stray": "completes",
              "none": "completes"}
PUSH = 2000000         # B/s after the switch to post-copy: pages stay missing


def choices():
    """Every (phase, fault) a run may draw, in a fixed order."""
    cells = [(p, f) for p in fm.PHASES for f in fm.FAULTS]
    return cells + [("bulk", "cancel"), ("bulk", "yank"), ("postcopy", "postcopy-cut"),
                    ("setup", "stray"), ("any", "none")]


def counts(vm):
    """(open fds, threads) of a live kmig process, or None."""
    try:
        return (len(os.listdir("/proc/%d/fd" % vm.proc.pid)),
                len(os.listdir("/proc/%d/task" % vm.proc.pid)))
    except OSError:
        return None


def qmp_time(vm, name="query-status"):
    """Seconds one QMP call took (None: no answer within the slowed
    QMP_WITHIN, or the process is gone)."""
    q = vm.qmp()
    q.sock.settimeout(kt.slow(QMP_WITHIN))
    t0 = time.time()
    try:
        q.cmd(name)
        return time.time() - t0
    except (OSError, EOFError, ValueError, RuntimeError):
        return None
    finally:
        q.sock.settimeout(30.0)


class Checks:
    """The `check` of faultmatrix.run_cell, collecting what failed."""

    def __init__(self):
        self.failed = []

    def __call__(self, name, cond, msg=""):
        if not cond:
            self.failed.append("%s: %s" % (name, str(msg)[:2000]))
        return bool(cond)


class Chaos:
    def __init__(self, d, seed, log=print):
        self.d, self.seed, self.log = d, seed, log
        self.guest = fm.VerifyGuest(d)
        self.vms = []
        self.runs = []

    def _postcopy_cut(self, check, src, dst, port, delay):
        """The post-copy fault (see the module's text); the VM running the
        guest afterwards."""
        proxy = FaultProxy(port, ("manual",), "cut")
        try:
            q, dq = src.qmp(), dst.qmp()
            kt.set_caps(dq, postcopy_ram=True)
            kt.set_caps(q, postcopy_ram=True, x_verify=True)
            kt.set_params(q, max_bandwidth=fm.BANDWIDTH, max_postcopy_bandwidth=PUSH)
            q.cmd("migrate", uri="tcp:127.0.0.1:%d" % proxy.port)
            r = fm.wait_dirty_round(q, kt.slow(60))
            if not check("dirty_round", fm.in_dirty_round(r), "%r; proxy: %s"
                         % (r, proxy.state())):
                return src
            q.cmd("migrate-start-postcopy")
            r = kt.wait_migration(q, kt.slow(20), statuses=("postcopy-active",), interval=0.05)
            if not check("postcopy_active", r.get("status") == "postcopy-active", repr(r)):
                return src
            time.sleep(delay)
            proxy.fire()
            check("cut", proxy.triggered.wait(kt.slow(10)), "proxy never triggered")
            for side, name in ((q, "src"), (dq, "dst")):
                r = kt.wait_migration(side, kt.slow(20), statuses=("postcopy-paused",),
                                      interval=0.05)
                check(name + "_paused", r.get("status") == "postcopy-paused", repr(r))
            uri2 = "tcp:127.0.0.1:%d" % kt.free_port()
            dq.send_raw(('{"execute": "migrate-recover", "arguments": {"uri": "%s"}}\n' % uri2)
                        .encode() * 2)
            first, second = dq.read_reply(), dq.read_reply()
            check("recover_once", "return" in first and "error" in second,
                  "%r / %r" % (first, second))
            r = kt.wait_migration(dq, kt.slow(10), statuses=("postcopy-recover",), interval=0.05)
            check("dst_listens", r.get("status") == "postcopy-recover", repr(r))
            kt.set_params(q, max_postcopy_bandwidth=0)
            q.cmd("migrate", uri=uri2, resume=True)
            r = kt.wait_migration(q, kt.slow(60))
            ok = check("completed", r.get("status") == "completed",
                       "%r; %s; %s" % (r, fm.dump(src), fm.dump(dst)))
            dr = kt.wait_migration(dq, kt.slow(20))
            check("dst_completed", dr.get("status") == "completed", repr(dr))
            check("x_verify", kt.wait_output(dst, r"x-verify: every page as it came matches",
                                             kt.slow(5)) is not None, dst.output()[-400:])
            check("guest_goes_on", fm.goes_on(dst), fm.dump(dst))
            return dst if ok else None
        finally:
            proxy.close()

    def _extra(self, check, kind, src, tag, rng):
        """cancel / yank / postcopy-cut / none from src; returns the VM
        running the guest afterwards."""
        port = kt.free_port()
        uri = "tcp:127.0.0.1:%d" % port
        dst = self.guest.vm("dst" + tag, ["--incoming", uri])
        self.vms.append(dst)
        if not check("dst_listening", kt.wait_incoming(dst, kt.slow(30)), fm.dump(dst)):
            return src
        if kind == "postcopy-cut":
            return self._postcopy_cut(check, src, dst, port, rng.uniform(0, 1.0))
        if kind in ("none", "stray"):
            stray, garbage = None, rng.random() < 0.5
            if kind == "stray":       # garbage, or silence (dropped after 10 s)
                stray = socket.create_connection(("127.0.0.1", port), timeout=10)
                if garbage:
                    stray.sendall(b"GET / HTTP/1.0\r\n\r\n")
            try:
                r = kt.migrate(src, dst, uri, caps={"x-verify": True},
                               params={"downtime-limit": 10000}, timeout=kt.slow(90))
            finally:
                if stray is not None:
                    stray.close()
            check("completed", r.get("status") == "completed", repr(r))
            check("guest_goes_on", fm.goes_on(dst), fm.dump(dst))
            if kind == "stray" and garbage:
                n = dst.qmp().cmd("query-migrate").get("x-stray-connections", {})
                check("stray_counted", n.get("count", 0) >= 1, repr(n))
            return dst if r.get("status") == "completed" else src
        q = src.qmp()
        before = counts(src)
        q.cmd("migrate-set-parameters", **{"max-bandwidth": fm.BANDWIDTH, "downtime-limit": 1})
        q.cmd("migrate", uri=uri)
        deadline = time.time() + kt.slow(30)
        while time.time() < deadline:
            r = q.cmd("query-migrate")
            if r.get("status") == "active" and r.get("ram", {}).get("transferred", 0) > 0:
                break
            time.sleep(0.05)
        t0 = time.time()
        if kind == "cancel":
            q.cmd("migrate_cancel")
        else:
            q.cmd("yank", instances=[{"type": "migration"}])
        r = kt.wait_migration(q, kt.slow(QUIT_WITHIN))
        want = "cancelled" if kind == "cancel" else "failed"
        check(kind + "_ends", r.get("status") == want, "after %.1f s: %r"
              % (time.time() - t0, r))
        check("src_runs", fm.status(src) == "running", fm.dump(src))
        check("src_guest_goes_on", fm.goes_on(src), fm.dump(src))
        fm.src_clean(check, src)
        rc = dst.wait_exit(kt.slow(30))
        check("dst_exits_nonzero", rc not in (None, 0), "exit %r; %s" % (rc, fm.dump(dst)))
        check("dst_never_ran", not fm.ran(dst), fm.dump(dst))
        self._no_leak(check, src, before)
        return fm.retry(self.guest, self.vms, check, src, "retry" + tag)

    def _no_leak(self, check, src, before):
        """src's fds and threads back to `before` (within a few seconds:
        the migration's threads end after its status)."""
        now = counts(src)
        deadline = time.time() + kt.slow(5)
        while before and now and now > before and time.time() < deadline:
            time.sleep(0.1)
            now = counts(src)
        check("no_fd_or_thread_leak", before is None or now is None or
              (now[0] <= before[0] and now[1] <= before[1]),
              "(fds, threads) before %r, after %r" % (before, now))

    def _invariants(self, check, mine):
        """At most one running copy; the running one answers QMP in time."""
        alive = [vm for vm in mine if vm.proc.poll() is None]
        running = [vm for vm in alive if fm.status(vm) == "running"]
        check("one_copy", len(running) <= 1, "%d running: %s"
              % (len(running), "; ".join(fm.dump(vm) for vm in running)))
        for vm in running:
            took = qmp_time(vm)
            check("qmp_answers", took is not None, "no answer within %.0f s; %s"
                  % (kt.slow(QMP_WITHIN), fm.dump(vm)))

    def one(self, i, rng_choice, cur, rng):
        """Run i with (phase, fault) from cur (None: a fresh guest); returns
        the VM running the guest afterwards and the run's record."""
        phase, fault = rng_choice
        tag = "_%d" % i
        check = Checks()
        first = len(self.vms)
        t0 = time.time()
        if cur is None:
            cur = self.guest.vm("src" + tag)
            self.vms.append(cur)
            check("boot", cur.console.wait(self.guest.ok_rx, kt.slow(self.guest.boot_s),
                                           proc=cur.proc) is not None, fm.dump(cur))
        cur.qmp()                       # its QMP connection counts in `before`
        if fault in EXTRA:
            nxt = self._extra(check, fault, cur, tag, rng)
        else:
            before = counts(cur)
            nxt = fm.run_cell(self.guest, self.vms, check, phase, fault, src=cur, tag=tag,
                              on_src_back=lambda s: self._no_leak(check, s, before))
        mine = [cur] + [vm for vm in self.vms[first:] if vm is not cur]
        self._invariants(check, mine)
        want = fm.EXPECT.get((phase, fault), EXTRA_WANT.get(fault))
        rec = {"run": i, "phase": phase, "fault": fault, "want": want,
               "seconds": round(time.time() - t0, 1), "failed": check.failed,
               "guest_on": "lost" if nxt is None else os.path.basename(nxt.console.path)}
        for vm in mine:                 # only the guest's VM goes on
            if vm is not nxt:
                vm.kill()
        self.vms = [vm for vm in self.vms if vm.proc.poll() is None]
        return nxt, rec

    def run(self, n, only=None, faults=None):
        """n runs; only: just run `only` of the sequence; faults: draw only
        these faults (names of the matrix's or EXTRA)."""
        rng = random.Random(self.seed)
        all_choices = [c for c in choices() if not faults or c[1] in faults]
        plan = [(rng.choice(all_choices), random.Random(rng.random())) for _ in range(n)]
        cur = None
        for i, (c, run_rng) in enumerate(plan):
            if only is not None and i != only:
                continue
            cur, rec = self.one(i, c, cur, run_rng)
            self.runs.append(rec)
            self.log("# chaos run %d (seed %d): %s-%s, want %s, %.0f s: %s"
                     % (i, self.seed, c[0], c[1], rec["want"], rec["seconds"],
                        "ok" if not rec["failed"] else "FAILED " + " | ".join(rec["failed"])))
        return self.summary(n)

    def summary(self, n):
        bad = [r for r in self.runs if r["failed"]]
        return {"seed": self.seed, "runs_planned": n, "runs": len(self.runs),
                "failed_runs": len(bad), "lost_by_design": sum(r["guest_on"] == "lost"
                                                               for r in self.runs),
                "first_failure": bad[0] if bad else None}

    def close(self):
        for vm in self.vms:
            vm.kill()
