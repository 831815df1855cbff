"""The fault matrix's machinery: its phases, faults and expected outcomes
(docs/protocol.md "Faults and outcomes"), a Cell that breaks one migration
through a FaultProxy, and run_cell, which checks the outcome.  Used by
tests/e2e/test_faults.py (each cell once), tests/e2e/test_linux_faults.py
(a Linux guest) and tests/lib/chaos.py (cells at random, one guest going
back and forth)."""
import os
import re
import signal
import time

import kmigtest as kt
from faultproxy import FaultProxy

START, PAGES, STATE, DISK = 1, 2, 4, 12
CMD = "workload=verify mb=8 report_ms=200"
MEMORY = "128M"
BANDWIDTH = 8000000          # bytes/s: a bulk pass of ~1.5 s, dirty rounds
OK_RX = r"^verify ok round=(\d+)"
PHASES = ["setup", "bulk", "dirty", "switchover", "after-end"]
FAULTS = ["stall", "cut", "truncate", "duplicate", "corrupt",
          "kill-src", "kill-dst", "stop-src", "stop-dst"]
LINK = ("stall", "cut", "truncate", "duplicate", "corrupt")
AT = {"setup": ("record", START, 1), "bulk": ("record", PAGES, 5), "dirty": ("manual",),
      "switchover": ("record", STATE, 3), "after-end": ("after-end",),
      "disk-bulk": ("record", DISK, 8)}     # DiskGuest: in the disk's bulk pass

# the expected outcome of each cell (docs/protocol.md has the same table)
EXPECT = {}
for _p in ("setup", "bulk", "dirty"):
    EXPECT.update({(_p, "stall"): "runs", (_p, "cut"): "runs", (_p, "truncate"): "runs",
                   (_p, "duplicate"): "completes", (_p, "corrupt"): "runs",
                   (_p, "kill-src"): "dst-fails", (_p, "kill-dst"): "runs",
                   (_p, "stop-src"): "completes", (_p, "stop-dst"): "completes"})
EXPECT[("setup", "duplicate")] = "runs"       # a second START is refused
EXPECT.update({("disk-bulk", f): EXPECT[("bulk", f)] for f in FAULTS})
# before START reaches it the destination holds no migration: a connection
# that sends nothing and closes, or whose first record is not START (a
# corrupt type), is a stray to it (dropped, counted in
# x-stray-connections, not answered), and it listens on for the real source
DST_WAITS = {("setup", "stall"), ("setup", "cut"), ("setup", "kill-src"), ("setup", "corrupt")}
EXPECT[("setup", "kill-src")] = "dst-waits"
EXPECT.update({("switchover", "stall"): "paused", ("switchover", "cut"): "either",
               ("switchover", "truncate"): "either", ("switchover", "duplicate"): "runs",
               ("switchover", "corrupt"): "runs", ("switchover", "kill-src"): "dst-fails",
               ("switchover", "kill-dst"): "either", ("switchover", "stop-src"): "completes",
               ("switchover", "stop-dst"): "completes"})
EXPECT.update({("after-end", "stall"): "dst-runs", ("after-end", "cut"): "dst-runs",
               ("after-end", "truncate"): "dst-runs", ("after-end", "duplicate"): "completes",
               ("after-end", "corrupt"): "dst-runs", ("after-end", "kill-src"): "dst-completes",
               ("after-end", "kill-dst"): "paused", ("after-end", "stop-src"): "completes",
               ("after-end", "stop-dst"): "completes"})

# the cells CI runs (KMIG_TEST_FULL=1: all)
CI_CELLS = {("setup", "cut"), ("setup", "duplicate"), ("bulk", "stall"), ("bulk", "kill-dst"),
            ("bulk", "stop-src"), ("bulk", "duplicate"), ("dirty", "corrupt"),
            ("dirty", "truncate"), ("dirty", "stop-dst"), ("switchover", "stall"),
            ("switchover", "duplicate"), ("switchover", "kill-src"), ("after-end", "cut"),
            ("after-end", "kill-dst"), ("after-end", "duplicate")}
FULL = os.environ.get("KMIG_TEST_FULL") == "1"
STOPPED_S = 2.0              # how long a stopped process stays stopped
STALL_S = 2.0                # how long a stalled link is watched before the cancel


def dump(vm, n=12):
    return kt.dump(vm, n)


def status(vm):
    try:
        return vm.qmp().cmd("query-status").get("status")
    except (OSError, EOFError, ValueError):
        return None


def sig(vm, s):
    try:
        os.kill(vm.proc.pid, s)
    except ProcessLookupError:
        pass


class VerifyGuest:
    """kmig's test guest (verify workload) for the cells; tests/e2e/
    test_linux_faults.py has a Linux one with the same methods."""
    ok_rx = OK_RX        # a line the running guest prints again and again
    boot_s = 40
    caps = {}            # capabilities every migration of it needs

    def __init__(self, d):
        self.d = d

    def vm(self, name, extra=()):
        vm = kt.kmig_vm(self.d, name, CMD, memory=MEMORY, extra=list(extra))
        vm.ok_rx = self.ok_rx
        return vm


class DiskGuest(VerifyGuest):
    """The test guest with its disk workload (docs/guest.md, disk=1) on an
    image of each VM's own, the disk carried in the stream
    (x-block-migration); its progress lines are the disk's reports."""
    ok_rx = r"^disk ok round="
    caps = {"x-block-migration": True}
    cmd = CMD + " disk=1 disk_mb=2 disk_rate=0"

    def vm(self, name, extra=()):
        img = os.path.join(self.d, name + ".img")
        with open(img, "wb") as f:
            f.truncate(16 << 20)
        blk = ["--drive", "file=%s,format=raw,if=none,id=d0" % img,
               "--device", "virtio-blk-pci,drive=d0"]
        vm = kt.kmig_vm(self.d, name, self.cmd, memory=MEMORY, extra=blk + list(extra))
        vm.ok_rx = self.ok_rx
        return vm


def ran(vm):
    return vm.console.count(vm.ok_rx) > 0


def goes_on(vm, timeout=20):
    """The guest reports a new round on vm."""
    vm.console.poll()
    n = len(vm.console.lines)
    return vm.console.wait(vm.ok_rx, kt.slow(timeout), start=n, proc=vm.proc) is not None


def in_dirty_round(r):
    return r.get("status") == "active" and r.get("ram", {}).get("dirty-sync-count", 0) >= 2


def wait_dirty_round(q, timeout):
    """The source's query-migrate once it is in a dirty round or ended, or
    its last one when timeout passed first (in_dirty_round tells)."""
    deadline = time.time() + timeout
    while True:
        r = q.cmd("query-migrate")
        if r.get("status") not in ("none", "setup", "active") or in_dirty_round(r) or \
                time.time() >= deadline:
            return r
        time.sleep(0.05)


def retry(guest, vms, check, src, name="retry"):
    """A fresh destination, no proxy, x-verify: must complete.  Returns it."""
    uri = "tcp:127.0.0.1:%d" % kt.free_port()
    dst = guest.vm(name, ["--incoming", uri])
    vms.append(dst)
    q = src.qmp()
    q.cmd("migrate-set-parameters", **{"max-bandwidth": 0, "downtime-limit": 10000})
    caps = dict(guest.caps, **{"x-verify": True})
    r = kt.migrate(src, dst, uri, caps=caps, timeout=kt.slow(60))
    check("retry_completes", r.get("status") == "completed", "query-migrate %r; %s; %s"
          % (r, dump(src), dump(dst)))
    check("retry_guest_goes_on", goes_on(dst), dump(dst))
    return dst


def src_clean(check, src):
    r = src.qmp().cmd("query-migrate")
    check("src_tracking_off", r.get("x-dirty-tracking") is False
          and r.get("x-cpu-throttle-now") == 0, "query-migrate %r" % r)


class Cell:
    def __init__(self, guest, vms, phase, fault, src=None, tag=""):
        """src: a VM running the guest already (else a new one); tag: a
        suffix for the new VMs' names."""
        self.phase, self.fault = phase, fault
        self.caps = guest.caps
        self.dst_uri_port = kt.free_port()
        self.src = src or guest.vm("src" + tag)
        self.dst = guest.vm("dst" + tag, ["--incoming", "tcp:127.0.0.1:%d" % self.dst_uri_port])
        vms += [self.dst] if src else [self.src, self.dst]
        self.stopped = None
        # a killed source sends nothing more: what it had written and the
        # proxy had not yet forwarded is dropped (after END: nothing is left)
        action = fault if fault in LINK else "none"
        if fault == "kill-src" and phase != "after-end":
            action = "cut"
        self.proxy = FaultProxy(self.dst_uri_port, AT[phase], action, self.on_trigger,
                                drop_early=fault == "kill-dst")

    def on_trigger(self):
        who = self.src if self.fault.endswith("-src") else self.dst
        if self.fault.startswith("kill-"):
            sig(who, signal.SIGKILL)
            who.proc.wait()
        elif self.fault.startswith("stop-"):
            sig(who, signal.SIGSTOP)
            self.stopped = who

    def run(self, check):
        """Starts the migration through the proxy, breaks it, and returns
        the source's final query-migrate (None if the source was killed)."""
        src, q = self.src, self.src.qmp()
        kt.wait_incoming(self.dst, kt.slow(30))
        # the late phases need a migration that converges; the early ones
        # one that does not yet (raised after the fault when it must end)
        converge = self.phase in ("switchover", "after-end")
        kt.set_caps(q, x_verify=True, **{k.replace("-", "_"): v for k, v in self.caps.items()})
        q.cmd("migrate-set-parameters", **{"max-bandwidth": BANDWIDTH,
                                           "downtime-limit": 10000 if converge else 1})
        q.cmd("migrate", uri="tcp:127.0.0.1:%d" % self.proxy.port)
        if self.phase == "dirty":
            r = wait_dirty_round(q, kt.slow(60))
            check("dirty_round", in_dirty_round(r), "%r; proxy: %s; src %s; dst %s"
                  % (r, self.proxy.state(), dump(src), dump(self.dst)))
            self.proxy.fire()
        hit = self.proxy.triggered.wait(kt.slow(60))
        if not check("fault_hit", hit, "proxy: %s; %s" % (self.proxy.state(), dump(src))):
            return None
        if self.fault == "kill-src":
            return None
        if self.stopped is not None:
            time.sleep(STOPPED_S)
            sig(self.stopped, signal.SIGCONT)
        if self.fault == "stall":
            time.sleep(STALL_S)
            if self.phase == "after-end":   # the destination runs: then cancel
                deadline = time.time() + kt.slow(30)
                while time.time() < deadline and status(self.dst) != "running":
                    time.sleep(0.1)
            r = q.cmd("query-migrate")
            check("stalled", r.get("status") in ("setup", "active", "device"), repr(r))
            q.cmd("migrate_cancel")
        elif EXPECT[(self.phase, self.fault)] == "completes" and not converge:
            q.cmd("migrate-set-parameters", **{"downtime-limit": 10000})
        return kt.wait_migration(q, kt.slow(90))


def dst_waits(check, dst):
    """The destination took the broken connection for a stray: it dropped
    and counted it and listens on, the guest never ran there."""
    deadline = time.time() + kt.slow(15)
    n = {}
    while time.time() < deadline and dst.proc.poll() is None:
        n = dst.qmp().cmd("query-migrate").get("x-stray-connections", {})
        if n.get("count", 0) >= 1:
            break
        time.sleep(0.1)
    check("dst_drops_stray", n.get("count", 0) >= 1, "%r; %s" % (n, dump(dst)))
    check("dst_listens_on", dst.proc.poll() is None and status(dst) == "inmigrate",
          dump(dst))
    check("dst_never_ran", not ran(dst), dump(dst))


def run_cell(guest, vms, check, phase, fault, src=None, tag="", on_src_back=None):
    """One cell of the matrix with guest (VerifyGuest or a Linux one),
    from src (a VM running the guest) or a new one.  Returns the VM that
    runs the guest afterwards (None if it was lost, by design or not).
    on_src_back(src): called once a source that kept the guest runs it
    again, before the retry takes it elsewhere."""
    want = EXPECT[(phase, fault)]
    c = Cell(guest, vms, phase, fault, src, tag)
    src, dst = c.src, c.dst
    try:
        if not check("boot", src.console.wait(guest.ok_rx, kt.slow(guest.boot_s), proc=src.proc)
                     is not None, dump(src)):
            return None
        r = c.run(check)
    finally:
        c.proxy.close()
    st = r.get("status") if r else None
    print("# fault %s-%s: want %s; source %r (%s), error-desc %r; vm %s"
          % (phase, fault, want, st, r and r.get("x-iterations"),
             r and r.get("error-desc"), status(src) if fault != "kill-src" else "killed"))
    if want == "dst-waits":
        dst_waits(check, dst)
        return None
    if want == "dst-fails" or want == "dst-completes":
        rc = None
        if want == "dst-fails":
            rc = dst.wait_exit(kt.slow(30))
            check("dst_exits_nonzero", rc not in (None, 0), "exit %r; %s" % (rc, dump(dst)))
            check("dst_never_ran", not ran(dst), dump(dst))
        else:
            check("dst_runs", goes_on(dst), dump(dst))
        return dst if want == "dst-completes" else None
    if want == "completes":
        check("completed", st == "completed", "query-migrate %r; %s; %s"
              % (r, dump(src), dump(dst)))
        check("guest_goes_on", goes_on(dst), dump(dst))
        check("src_postmigrate", status(src) == "postmigrate", dump(src))
        return dst
    if want == "dst-runs":
        check("src_failed", st in ("failed", "cancelled"), repr(r))
        check("src_paused", status(src) == "paused"
              and "stays paused" in (r.get("error-desc") or ""), "%r; %s" % (r, dump(src)))
        check("dst_runs", goes_on(dst), dump(dst))
        check("one_copy", status(src) != "running", "both run")
        return dst
    # runs, paused, either: the destination must not have run the guest
    check("src_failed", st in ("failed", "cancelled"), repr(r))
    if (phase, fault) in DST_WAITS:
        dst_waits(check, dst)
    elif fault != "kill-dst":
        rc = dst.wait_exit(kt.slow(30))
        check("dst_exits_nonzero", rc not in (None, 0), "exit %r; %s" % (rc, dump(dst)))
    check("dst_never_ran", not ran(dst), dump(dst))
    if fault in ("corrupt", "duplicate") and want == "runs" and (phase, fault) not in DST_WAITS:
        # the destination's reason reaches the source, also after a record
        # it could not even frame
        check("reason", re.search(r"destination (refused the stream|failed): .*"
                                  r"(unknown record type|second START|twice)",
                                  r.get("error-desc") or "") is not None, repr(r))
    s = status(src)
    paused = s == "paused" and "stays paused" in (r.get("error-desc") or "")
    if want == "runs":
        check("src_runs", s == "running", "%s; %r; %s" % (s, r, dump(src)))
    elif want == "paused":
        check("src_paused", paused, "%s; %r; %s" % (s, r, dump(src)))
    else:
        check("src_runs_or_paused", s == "running" or paused, "%s; %r" % (s, r))
    if s == "paused":
        src.qmp().cmd("cont")   # the destination is known not to run it
    check("src_guest_goes_on", goes_on(src), dump(src))
    src_clean(check, src)
    if on_src_back:
        on_src_back(src)
    return retry(guest, vms, check, src, "retry" + tag)
