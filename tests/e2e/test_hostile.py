"""Hostile and stuck peers: every wait of a migration ends on a cancel or
quit, and what kmig creates is private.

  socket_modes        under umask 000 the incoming unix socket, the QMP
                      socket and the console file are 0600
  cancel_races_start  migrate-incoming and quit in one write: the
                      destination ends (the cancel used to be lost when it
                      came before the incoming thread registered)
  multifd_silent_channel  a peer announces a channel, connects it and sends
                      nothing: quit ends the destination
  stray_before_source  a silent connector and an HTTP request reach the
                      port before the source: each dropped, counted in
                      query-migrate (x-stray-connections) and logged, the
                      destination waits on; a silent one just before the
                      source holds nothing up, the migration completes
  source_behind_slow_stray  a source that connects first but speaks only
                      while a stray's part of a header is awaited (10 s):
                      taken once the stray is dropped, not closed as
                      silent for having waited that long
  multifd_stray_channel  garbage where a multifd channel is expected:
                      dropped and counted, the real channel after it taken
  multifd_intruder    a CHANNEL record with another session claims channel
                      1 before the source's: dropped (its socket closed),
                      the source's channel taken
  multifd_sync_without_data  a peer's channel never reaches the main
                      stream's SYNC: quit ends the destination
  multifd_main_fails_after_sync  every channel reached SYNC(1), then the
                      main stream ends before its own SYNC(1): the destination
                      fails the migration and exits (its channel threads
                      used to wait at that barrier for ever, and quit and
                      SIGTERM behind them)
  silent_after_end    a destination that reads everything and never
                      confirms: migrate_cancel after END ends the wait, the
                      guest stays paused here (the destination may run it),
                      quit works
  connect_full_backlog  a unix listener that never accepts: migrate_cancel
                      ends the connect, of the main stream and of a multifd
                      channel, and the guest runs on
  yank_stuck_peer     a destination that never reads (a connection left in
                      a listener's backlog): QMP `yank` of the migration
                      ends it within 5 s, the migration fails and the guest
                      runs on; query-yank lists the instance only while a
                      link exists; other instances are refused
  silent_after_end_timeout  (slow) without a cancel, the source gives up
                      after 60 s and keeps the guest paused
  refusal_in_two_parts  a destination sends its RP_FAIL in two parts a
                      second apart, its reason holding an escape sequence, a
                      newline and a C1 control: the source keeps the first
                      part until the rest comes (it used to drop it, and the
                      reason with it), and its error and log carry the reason
                      with every control character replaced
  section_swapped     a proxy replaces vCPU 0's LAPIC section with a second
                      FPU section: the destination refuses the stream (it
                      used to count sections only, and ran without the LAPIC)
  stop_races_switchover  stop/cont from a second client during switchovers
                      of failing migrations: afterwards `cont` runs the guest
  balloon_change_flood  the guest writes `actual` 20,000 times: at most one
                      BALLOON_CHANGE a second reaches a client, the last value
                      among them

Each fake peer is a Python socket in this process.
"""
import os
import socket
import stat
import struct
import threading
import time

import pytest

import kmigtest as kt
from faultproxy import FaultProxy

pytestmark = pytest.mark.kvm

MIB = 1 << 20
CMD = "workload=idle report_ms=200"
QUIT_WITHIN = 5.0      # s: quit or cancel must end a migration this soon


def dump(vm, n=12):
    return kt.dump(vm, n)


def record(rtype, payload=b"", flags=0):
    """One stream record: header (type, flags, length) and payload."""
    return struct.pack("<IIQ", rtype, flags, len(payload)) + payload


def start_record(blocks=((0, 256 * MIB),)):
    payload = b"KMIGSTRM" + struct.pack("<III", 2, 4096, len(blocks))
    for gpa, size in blocks:
        payload += struct.pack("<QQ", gpa, size)
    return record(1, payload)


SESSION = bytes(range(16))           # the fake source's multifd session
SESSION_OTHER = b"other session!!!"


def channel_record(index, count, session=SESSION):
    """CHANNEL (protocol version 2): index, count and the session that the
    main stream's CHANNEL{0, n} announced."""
    return record(8, struct.pack("<II", index, count) + session)


def sync_record(rnd):
    return record(5, struct.pack("<Q", rnd))


def dest(d, vms, uri, name="dst"):
    vm = kt.kmig_vm(d, name, CMD, memory="256M", extra=["--incoming", uri])
    vms.append(vm)
    return vm


def source(d, vms, name="src"):
    vm = kt.kmig_vm(d, name, CMD, memory="256M")
    vms.append(vm)
    return vm


def booted(check, vm):
    return check("boot", vm.console.wait(r"^heartbeat", kt.slow(30), proc=vm.proc) is not None,
                 dump(vm))


def quit_ends(check, name, vm):
    """Sends quit and checks that the process ends within QUIT_WITHIN s."""
    t0 = time.time()
    try:
        vm.qmp().send_raw(b'{"execute": "quit"}\n')
    except OSError:
        pass
    rc = vm.wait_exit(kt.slow(QUIT_WITHIN))
    took = time.time() - t0
    print("# %s: quit took %.2f s, exit %r" % (name, took, rc))
    return check(name, rc is not None, "still running %.1f s after quit; %s" % (took, dump(vm)))


def status(vm):
    return vm.qmp().cmd("query-status").get("status")


# ------------------------------------------------------------- files

def test_socket_modes(d, vms, check):
    sock = os.path.join(d, "in.sock")
    old = os.umask(0)
    try:
        dst = dest(d, vms, "unix:" + sock)
    finally:
        os.umask(old)
    if not check("listening", kt.wait_incoming(dst, kt.slow(30)), dump(dst)):
        return
    for what, path in (("incoming", sock), ("qmp", dst.qmp_path),
                       ("console", dst.console.path)):
        st = os.stat(path)
        check(what + "_0600", stat.S_IMODE(st.st_mode) == 0o600,
              "%s is %o" % (path, stat.S_IMODE(st.st_mode)))


# ------------------------------------------------------------- destination

def test_cancel_races_start(d, vms, check):
    for i in range(3):
        dst = dest(d, vms, "defer", name="dst%d" % i)
        q = dst.qmp()
        uri = "tcp:127.0.0.1:%d" % kt.free_port()
        q.send_raw(('{"execute": "migrate-incoming", "arguments": {"uri": "%s"}}\n'
                    '{"execute": "quit"}\n' % uri).encode())
        rc = dst.wait_exit(kt.slow(QUIT_WITHIN))
        if not check("quit_%d" % i, rc is not None, "still running after quit; " + dump(dst)):
            return


def fake_source(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(start_record() + channel_record(0, 1))
    return s


def listening_dest(d, vms, check):
    """A destination listening on a fresh TCP port: (vm, port), vm None if
    it did not come up."""
    port = kt.free_port()
    dst = dest(d, vms, "tcp:127.0.0.1:%d" % port)
    if not check("listening", kt.wait_incoming(dst, kt.slow(30)), dump(dst)):
        return None, port
    return dst, port


def test_multifd_silent_channel(d, vms, check):
    dst, port = listening_dest(d, vms, check)
    if dst is None:
        return
    main = fake_source(port)
    chan = socket.create_connection(("127.0.0.1", port), timeout=10)   # and nothing
    try:
        time.sleep(1)
        check("dst_waits", dst.proc.poll() is None, dump(dst))
        quit_ends(check, "quit", dst)
    finally:
        chan.close()
        main.close()


def test_multifd_sync_without_data(d, vms, check):
    dst, port = listening_dest(d, vms, check)
    if dst is None:
        return
    main = fake_source(port)
    chan = socket.create_connection(("127.0.0.1", port), timeout=10)
    chan.sendall(channel_record(1, 1))            # and never its SYNC
    main.sendall(sync_record(1))
    try:
        if not check("channels_up", kt.wait_output(dst, r"1 multifd channels", kt.slow(20)),
                     dump(dst)):
            return
        time.sleep(1)
        check("dst_waits", dst.proc.poll() is None, dump(dst))
        quit_ends(check, "quit", dst)
    finally:
        chan.close()
        main.close()


def test_multifd_main_fails_after_sync(d, vms, check):
    dst, port = listening_dest(d, vms, check)
    if dst is None:
        return
    main = fake_source(port)
    chan = socket.create_connection(("127.0.0.1", port), timeout=10)
    chan.sendall(channel_record(1, 1) + sync_record(1))
    try:
        if not check("channels_up", kt.wait_output(dst, r"1 multifd channels", kt.slow(20)),
                     dump(dst)):
            return
        time.sleep(0.5)                  # the channel thread waits at SYNC(1)
        main.close()                     # the main stream ends before its SYNC(1)
        rc = dst.wait_exit(kt.slow(QUIT_WITHIN))
        if not check("dst_exits", rc is not None,
                     "still running %.0f s after the main stream ended; %s"
                     % (kt.slow(QUIT_WITHIN), dump(dst))):
            quit_ends(check, "quit", dst)
            return
        check("dst_failed", rc == 1, "exit %r; %s" % (rc, dump(dst)))
        check("says_why", kt.wait_output(dst, r"incoming migration failed", 1), dump(dst))
    finally:
        chan.close()
        main.close()


def strays(vm):
    """query-migrate's count of dropped connections and the last reason."""
    return vm.qmp().cmd("query-migrate").get("x-stray-connections", {})


def wait_strays(vm, n, timeout):
    deadline = time.time() + timeout
    s = {}
    while time.time() < deadline and vm.proc.poll() is None:
        s = strays(vm)
        if s.get("count", 0) >= n:
            break
        time.sleep(0.1)
    return s


def test_stray_before_source(d, vms, check):
    """A connector that stays silent and one that sends an HTTP request
    reach the destination before the real source: each is dropped (the
    silent one after 10 s), counted in query-migrate and logged, and the
    destination waits on.  Then another silent connector comes just before
    the source: it holds nothing up, and the migration completes."""
    dst, port = listening_dest(d, vms, check)
    if dst is None:
        return
    src = source(d, vms)
    if not booted(check, src):
        return
    silent = socket.create_connection(("127.0.0.1", port), timeout=10)
    junk = socket.create_connection(("127.0.0.1", port), timeout=10)
    junk.sendall(b"GET / HTTP/1.0\r\n\r\n")
    silent2 = None
    try:
        s = wait_strays(dst, 2, kt.slow(15))
        print("# strays before the source: %r" % s)
        if not check("both_dropped", s.get("count") == 2 and
                     "silent" in s.get("last-reason", ""), "%r; %s" % (s, dump(dst))):
            return
        check("logged", dst.output().count("dropped a connection") == 2 and
              "not a kmig migration stream (first bytes 47 45 54 20)" in dst.output(), dump(dst))
        check("dst_waits", status(dst) == "inmigrate" and
              dst.qmp().cmd("query-migrate").get("status") == "setup", dump(dst))
        silent2 = socket.create_connection(("127.0.0.1", port), timeout=10)
        res = kt.migrate(src, None, "tcp:127.0.0.1:%d" % port, timeout=kt.slow(40))
        check("completed", res.get("status") == "completed", "%r; %s" % (res, dump(dst)))
        check("counted", strays(dst).get("count") == 2, "%r" % strays(dst))
    finally:
        for c in (silent, junk, silent2):
            if c is not None:
                c.close()


def test_source_behind_slow_stray(d, vms, check):
    """A source connects, and before it has spoken a stray that sends a
    part of a header is taken: the destination waits its 10 s for the rest
    of that header.  The source spoke meanwhile: when the stray is dropped,
    the source's connection (older than 10 s by then) is taken, not closed
    as a silent one."""
    dst, port = listening_dest(d, vms, check)
    if dst is None:
        return
    main = socket.create_connection(("127.0.0.1", port), timeout=10)
    time.sleep(kt.slow(0.3))       # the listener holds it, silent
    slow = socket.create_connection(("127.0.0.1", port), timeout=10)
    slow.sendall(b"\x01\x00\x00\x00")   # 4 of a header's 16 bytes
    chan = None
    try:
        time.sleep(kt.slow(0.5))   # the stray is taken, its header awaited
        main.sendall(start_record() + channel_record(0, 1))
        s = wait_strays(dst, 1, kt.slow(20))
        check("stray_dropped", s.get("count") == 1 and "silent" in s.get("last-reason", ""),
              "%r; %s" % (s, dump(dst)))
        chan = socket.create_connection(("127.0.0.1", port), timeout=10)
        chan.sendall(channel_record(1, 1))
        if not check("source_taken", kt.wait_output(dst, r"1 multifd channels", kt.slow(20)),
                     dump(dst)):
            return
        s = strays(dst)
        check("only_the_stray", s.get("count") == 1, "%r; %s" % (s, dump(dst)))
        quit_ends(check, "quit", dst)
    finally:
        for c in (slow, main, chan):
            if c is not None:
                c.close()


def test_multifd_stray_channel(d, vms, check):
    """A connection that sends garbage is taken where a multifd channel is
    expected: it is dropped and counted, and the real channel after it is
    taken."""
    dst, port = listening_dest(d, vms, check)
    if dst is None:
        return
    main = fake_source(port)
    junk = socket.create_connection(("127.0.0.1", port), timeout=10)
    junk.sendall(b"\x16\x03\x01\x02\x00" + b"\x01" * 512)   # a TLS ClientHello's start
    chan = socket.create_connection(("127.0.0.1", port), timeout=10)
    chan.sendall(channel_record(1, 1))
    main.sendall(sync_record(1))
    chan.sendall(sync_record(1))
    try:
        if not check("channels_up", kt.wait_output(dst, r"1 multifd channels", kt.slow(20)),
                     dump(dst)):
            return
        s = strays(dst)
        check("counted", s.get("count") == 1 and "channel" in s.get("last-reason", ""),
              "%r" % s)
        check("dst_waits", dst.proc.poll() is None, dump(dst))
        quit_ends(check, "quit", dst)
    finally:
        for s in (junk, chan, main):
            s.close()


def test_multifd_intruder(d, vms, check):
    """A connection claims channel 1 before the source's own channel 1,
    with a CHANNEL record that is not this migration's: it is dropped, the
    source's channel is taken."""
    dst, port = listening_dest(d, vms, check)
    if dst is None:
        return
    main = fake_source(port)
    intruder = socket.create_connection(("127.0.0.1", port), timeout=10)
    intruder.sendall(channel_record(1, 1, SESSION_OTHER))
    chan = socket.create_connection(("127.0.0.1", port), timeout=10)
    chan.sendall(channel_record(1, 1))
    try:
        if not check("channels_up", kt.wait_output(dst, r"1 multifd channels", kt.slow(20)),
                     dump(dst)):
            return
        intruder.settimeout(kt.slow(5))
        try:
            got = intruder.recv(1)
        except socket.timeout:
            got = None
        check("intruder_dropped", got == b"", "intruder still connected; %s" % dump(dst))
        s = strays(dst)
        print("# strays: %r" % s)
        check("counted", s.get("count") == 1, "%r" % s)
        check("dst_waits", dst.proc.poll() is None, dump(dst))
        quit_ends(check, "quit", dst)
    finally:
        for s in (intruder, chan, main):
            s.close()


# ------------------------------------------------------------- source

class SilentDestination:
    """Accepts one connection, reads every record, answers nothing."""

    def __init__(self, d):
        self.path = os.path.join(d, "silent.sock")
        self.lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.lsock.bind(self.path)
        self.lsock.listen(1)
        self.end_seen = threading.Event()
        self.conn = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _read(self, n):
        buf = b""
        while len(buf) < n:
            got = self.conn.recv(min(n - len(buf), 1 << 20))
            if not got:
                raise EOFError
            buf += got
        return buf

    def _run(self):
        try:
            self.conn, _ = self.lsock.accept()
            while True:
                rtype, _, length = struct.unpack("<IIQ", self._read(16))
                while length:
                    length -= len(self._read(min(length, 1 << 20)))
                if rtype == 6:
                    self.end_seen.set()
        except (OSError, EOFError, struct.error):
            pass

    def close(self):
        for s in (self.conn, self.lsock):
            if s is not None:
                s.close()


class RefusingDestination(SilentDestination):
    """Reads every record; once the source's first record is in, sends an
    RP_FAIL in two parts, the second `gap` s after the first."""

    def __init__(self, d, reason, gap=1.0):
        payload = struct.pack("<I", 5) + reason
        self.rec = struct.pack("<IIQ", 0x102, 0, len(payload)) + payload
        self.gap = gap
        self.sent = threading.Event()
        super().__init__(d)

    def _read(self, n):
        buf = super()._read(n)
        if not self.sent.is_set():
            self.sent.set()
            threading.Thread(target=self._refuse, daemon=True).start()
        return buf

    def _refuse(self):
        try:
            half = len(self.rec) // 2
            self.conn.sendall(self.rec[:half])
            time.sleep(self.gap)
            self.conn.sendall(self.rec[half:])
        except OSError:
            pass


def test_refusal_in_two_parts(d, vms, check):
    src = source(d, vms)
    if not booted(check, src):
        return
    reason = b"disk full\x1b[2J\nFAKE LOG LINE\xc2\x9b31m on the destination"
    fake = RefusingDestination(d, reason)
    try:
        q = src.qmp()
        kt.set_params(q, max_bandwidth=16 << 20)     # still sending when the rest comes
        q.cmd("migrate", uri="unix:" + fake.path)
        r = kt.wait_migration(q, kt.slow(30))
        desc = r.get("error-desc") or ""
        print("# refusal: %s: %r" % (r.get("status"), desc))
        check("failed", r.get("status") == "failed", repr(r))
        check("reason_whole", "disk full" in desc and "on the destination" in desc, repr(desc))
        check("no_controls_in_error", not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f
                                              for c in desc), repr(desc))
        out = src.output()
        check("no_controls_in_log", "\x1b" not in out and "\nFAKE LOG LINE" not in out and
              "\u009b" not in out, repr(out[-600:]))
        check("runs_on", status(src) == "running", dump(src))
    finally:
        fake.close()


def silent_migration(d, vms, check):
    src = source(d, vms)
    if not booted(check, src):
        return None, None
    fake = SilentDestination(d)
    q = src.qmp()
    q.cmd("migrate", uri="unix:" + fake.path)
    if not check("end_sent", fake.end_seen.wait(kt.slow(30)), dump(src)):
        fake.close()
        return None, None
    time.sleep(0.5)
    r = q.cmd("query-migrate")
    check("waits_in_device", r.get("status") == "device", repr(r))
    return src, fake


PAUSED_HERE = "the guest stays paused here"


def test_silent_after_end(d, vms, check):
    src, fake = silent_migration(d, vms, check)
    if src is None:
        return
    try:
        q = src.qmp()
        t0 = time.time()
        q.cmd("migrate_cancel")
        r = kt.wait_migration(q, kt.slow(QUIT_WITHIN))
        print("# silent_after_end: %s after %.2f s: %r" % (r.get("status"), time.time() - t0,
                                                            r.get("error-desc")))
        check("cancelled", r.get("status") == "cancelled", repr(r))
        check("says_why", PAUSED_HERE in (r.get("error-desc") or ""), repr(r))
        check("stays_paused", status(src) == "paused", dump(src))
        quit_ends(check, "quit", src)
    finally:
        fake.close()


@pytest.mark.slow
def test_silent_after_end_timeout(d, vms, check):
    src, fake = silent_migration(d, vms, check)
    if src is None:
        return
    try:
        q = src.qmp()
        r = kt.wait_migration(q, 60 + kt.slow(15))
        check("failed", r.get("status") == "failed", repr(r))
        check("says_why", "within 60 s" in (r.get("error-desc") or "")
              and PAUSED_HERE in r.get("error-desc"), repr(r))
        check("stays_paused", status(src) == "paused", dump(src))
    finally:
        fake.close()


class FullListener:
    """A unix listener with a backlog of one that never accepts: the first
    connection waits in the backlog, every later one cannot get in.  With
    prefill, a connection of ours takes the one place first."""

    def __init__(self, d, prefill):
        self.path = os.path.join(d, "full.sock")
        self.lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.lsock.bind(self.path)
        self.lsock.listen(0)
        self.fill = []
        for _ in range(prefill):
            f = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            f.connect(self.path)
            self.fill.append(f)

    def close(self):
        for s in self.fill + [self.lsock]:
            s.close()


@pytest.mark.parametrize("multifd", [False, True], ids=["main", "multifd"])
def test_connect_full_backlog(d, vms, check, multifd):
    src = source(d, vms)
    if not booted(check, src):
        return
    # main: ours fills the backlog, the main stream cannot connect;
    # multifd: the main stream takes the place, its channel cannot connect
    full = FullListener(d, prefill=0 if multifd else 1)
    try:
        q = src.qmp()
        if multifd:
            kt.set_caps(q, multifd=True)
            kt.set_params(q, **{"multifd-channels": 2})
        q.cmd("migrate", uri="unix:" + full.path)
        time.sleep(1)
        r = q.cmd("query-migrate")
        check("connecting", r.get("status") == "setup", repr(r))
        t0 = time.time()
        q.cmd("migrate_cancel")
        r = kt.wait_migration(q, kt.slow(QUIT_WITHIN))
        print("# connect_full_backlog: %s after %.2f s" % (r.get("status"), time.time() - t0))
        check("cancelled", r.get("status") == "cancelled", repr(r))
        check("src_running", status(src) == "running", dump(src))
        n = src.console.count(r"^heartbeat")
        check("guest_goes_on", src.console.wait(r"^heartbeat", kt.slow(5),
                                                start=len(src.console.lines)) is not None
              and src.console.count(r"^heartbeat") > n, dump(src))
    finally:
        full.close()


def stuck(q, timeout):
    """Waits until the migration is active and sends nothing for 1 s."""
    deadline, last, since = time.time() + timeout, None, time.time()
    while time.time() < deadline:
        r = q.cmd("query-migrate")
        sent = r.get("ram", {}).get("transferred")
        if r.get("status") != "active" or sent != last:
            last, since = sent, time.time()
        elif time.time() - since >= 1.0:
            return True
        time.sleep(0.1)
    return False


def test_yank_stuck_peer(d, vms, check):
    src = kt.kmig_vm(d, "src", "workload=verify mb=32 report_ms=200", memory="256M")
    vms.append(src)
    if not check("boot", src.console.wait(r"^verify ok", kt.slow(30), proc=src.proc)
                 is not None, dump(src)):
        return
    q = src.qmp()
    e = q.cmd_full("yank", instances=[{"type": "migration"}]).get("error", {}).get("desc", "")
    check("nothing_to_yank", "not found" in e, e)
    check("no_instance", q.cmd("query-yank") == [], repr(q.cmd("query-yank")))
    full = FullListener(d, prefill=0)
    try:
        q.cmd("migrate", uri="unix:" + full.path)
        if not check("stuck", stuck(q, kt.slow(20)), repr(q.cmd("query-migrate"))):
            return
        check("listed", q.cmd("query-yank") == [{"type": "migration"}],
              repr(q.cmd("query-yank")))
        e = q.cmd_full("yank", instances=[{"type": "chardev", "id": "c0"}])
        check("other_refused", "error" in e, repr(e))
        t0 = time.time()
        q.cmd("yank", instances=[{"type": "migration"}])
        r = kt.wait_migration(q, kt.slow(QUIT_WITHIN))
        print("# yank: %s after %.2f s: %r" % (r.get("status"), time.time() - t0,
                                                r.get("error-desc")))
        check("failed", r.get("status") == "failed", repr(r))
        check("tracking_off", r.get("x-dirty-tracking") is False, repr(r))
        check("src_running", status(src) == "running", dump(src))
        n = len(src.console.lines)
        check("guest_goes_on", src.console.wait(r"^verify ok", kt.slow(10), start=n)
              is not None, dump(src))
        check("unlisted", q.cmd("query-yank") == [], repr(q.cmd("query-yank")))
    finally:
        full.close()


# ------------------------------------------------------------- stream rewriting

class RewritingProxy:
    """Relays one migration from the source (connecting to self.port) to the
    destination at dst_port, record by record forward (rewrite(type, flags,
    payload) returns the records to send instead) and bytes as they come on
    the return path."""

    def __init__(self, dst_port, rewrite):
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(1)
        self.port = self.lsock.getsockname()[1]
        self.dst_port, self.rewrite = dst_port, rewrite
        self.socks = [self.lsock]
        threading.Thread(target=self._run, daemon=True).start()

    _read = staticmethod(FaultProxy._read)

    def _back(self, src, dst):
        try:
            while True:
                got = dst.recv(65536)
                if not got:
                    break
                src.sendall(got)
        except OSError:
            pass

    def _run(self):
        try:
            src, _ = self.lsock.accept()
            dst = socket.create_connection(("127.0.0.1", self.dst_port), timeout=30)
            dst.settimeout(None)
            self.socks += [src, dst]
            threading.Thread(target=self._back, args=(src, dst), daemon=True).start()
            while True:
                rtype, flags, length = struct.unpack("<IIQ", self._read(src, 16))
                payload = self._read(src, length)
                dst.sendall(b"".join(self.rewrite(rtype, flags, payload)))
        except (OSError, EOFError, struct.error):
            pass

    def close(self):
        for s in self.socks:
            s.close()


FPU_SIZE = 416          # struct kvm_fpu


def fpu_for_lapic(rtype, flags, payload):
    """The STATE record of vCPU 0's LAPIC (section 7) replaced by an FPU
    section (4): as many sections as before, one of them the wrong one."""
    if rtype == 4:
        sid, ver, inst = struct.unpack("<III", payload[:12])
        if sid == 7 and inst == 0:
            return [record(4, struct.pack("<III", 4, ver, 0) + bytes(FPU_SIZE), flags)]
    return [record(rtype, payload, flags)]


def test_section_swapped(d, vms, check):
    src = source(d, vms)
    if not booted(check, src):
        return
    dst, dst_port = listening_dest(d, vms, check)
    if dst is None:
        return
    proxy = RewritingProxy(dst_port, fpu_for_lapic)
    try:
        q = src.qmp()
        q.cmd("migrate", uri="tcp:127.0.0.1:%d" % proxy.port)
        r = kt.wait_migration(q, kt.slow(30))
        want = "state section fpu (4) for instance 0 twice"
        print("# section_swapped: %s: %r" % (r.get("status"), r.get("error-desc")))
        check("failed", r.get("status") == "failed"
              and r.get("error-desc") == "destination failed: " + want, repr(r))
        check("src_running", status(src) == "running", dump(src))
        rc = dst.wait_exit(kt.slow(20))
        check("dst_exits_nonzero", rc == 1, "exit %r; %s" % (rc, dump(dst)))
        check("dst_never_ran", dst.console.count(r"^heartbeat") == 0, dump(dst))
    finally:
        proxy.close()


# ------------------------------------------------------------- stop vs switchover

def test_stop_races_switchover(d, vms, check):
    """A second client sends stop and cont as fast as it can while
    migrations that fail at END (the destination has a second vCPU) go
    through their switchover.  Afterwards `cont` must leave a running
    guest whose status says so (the pause of a `stop` that slipped in
    between the switchover's status read and its pause used to be kept
    while the status said running, and `cont` did nothing)."""
    src = source(d, vms)
    if not booted(check, src):
        return
    q = src.qmp()
    for i in range(4):
        uri = "tcp:127.0.0.1:%d" % kt.free_port()
        dst = kt.kmig_vm(d, "dst%d" % i, CMD, memory="256M", cpus=2, extra=["--incoming", uri])
        vms.append(dst)
        if not check("listening_%d" % i, kt.wait_incoming(dst, kt.slow(30)), dump(dst)):
            return
        spam = kt.QMP(src.qmp_path)
        stop = threading.Event()

        def hammer():
            n = 0
            while not stop.is_set():
                spam.cmd_full("stop" if n % 2 == 0 else "cont")
                n += 1

        t = threading.Thread(target=hammer, daemon=True)
        t.start()
        q.cmd("migrate", uri=uri)
        r = kt.wait_migration(q, kt.slow(30))
        stop.set()
        t.join(10)
        spam.close()
        check("failed_%d" % i, r.get("status") == "failed", repr(r))
        dst.wait_exit(kt.slow(10))
        q.cmd_full("cont")
        check("running_%d" % i, status(src) == "running", dump(src))
        n = src.console.count(r"^heartbeat")
        if not check("guest_goes_on_%d" % i,
                     src.console.wait(r"^heartbeat", kt.slow(5), start=len(src.console.lines))
                     is not None and src.console.count(r"^heartbeat") > n, dump(src)):
            return


# ------------------------------------------------------------- guest floods

def test_balloon_change_flood(d, vms, check):
    """The guest writes the balloon's `actual` 20,000 times in a burst: a
    client gets at most one BALLOON_CHANGE a second (QEMU's limit), the
    last one with the final value, and stays connected."""
    vm = kt.kmig_vm(d, "flood", "workload=idle report_ms=200 balloon=1 balloon_test=flood",
                    memory="256M", extra=["--balloon"])
    vms.append(vm)
    q = vm.qmp()                  # connected before the guest's flood (1 s after binding)
    t0 = time.time()
    done = vm.console.wait(r"^balloon flood writes=(\d+) last=(\d+)", kt.slow(30), proc=vm.proc)
    if not check("flood", done is not None, dump(vm)):
        return
    last = 256 * MIB - int(done.group(2)) * 4096     # as QEMU: the memory the guest keeps
    time.sleep(2.5)               # past the end of the period the burst fell in
    seen = []
    while True:
        e = q.wait_event("BALLOON_CHANGE", 0.2)
        if e is None:
            break
        seen.append(e)
    took = time.time() - t0
    print("# balloon_change_flood: %d events in %.1f s, last actual %r"
          % (len(seen), took, seen[-1]["data"]["actual"] if seen else None))
    check("events", 1 <= len(seen) <= took + 1, "%d events in %.1f s" % (len(seen), took))
    check("last_value", seen and seen[-1]["data"]["actual"] == last,
          "last event %r, want actual %d" % (seen[-1] if seen else None, last))
    check("client_kept", q.cmd("query-balloon").get("actual") == last, "")
