"""Live migration that does not complete: cancelled (in the bulk pass and in
dirty rounds), destination killed, layout mismatch, garbage on the
destination's port (a connection that does not even begin with a START
record's header is dropped as a stray and the destination waits on; one
that does is the migration, and fails it), nobody listening, bad URIs and
a second migrate.  In
every case the source must keep running its guest, and a migration that
fails on the destination side must stop that destination with status 1
(docs/usage.md).  Each fault must give its own error: the source's
query-migrate error-desc, the QMP error, or the destination's
"incoming migration failed: ..." line, whichever kmig reports it in.
"""
import os
import re
import signal
import socket
import struct
import time

import pytest

import kmigtest as kt

pytestmark = pytest.mark.kvm

MIB = 1 << 20
ACTIVE = ("setup", "active", "device", "cancelling")

# What a destination reports when its source closed the connection (a
# cancel: docs/usage.md, "Cancel and failure").
CLOSED_BY_PEER = "stream: connection closed by peer"
# A failed write after the destination process died: RST while data was
# unread there (ECONNRESET), or after its FIN (the kernel then reports EPIPE).
WRITE_TO_DEAD_DST = r"write: (Connection reset by peer|Broken pipe)"
IN_PROGRESS = "There's a migration process in progress"


def tcp_uri():
    return "tcp:127.0.0.1:%d" % kt.free_port()


def dump(vm, n=12):
    return kt.dump(vm, n)


def source(d, vms, cmdline, memory="256M", name="src"):
    vm = kt.kmig_vm(d, name, cmdline, memory=memory)
    vms.append(vm)
    return vm


def dest(d, vms, cmdline, uri, memory="256M", name="dst"):
    vm = kt.kmig_vm(d, name, cmdline, memory=memory, extra=["--incoming", uri])
    vms.append(vm)
    return vm


def dst_error(vm, timeout=None):
    """The reason of the destination's "incoming migration failed: ..."
    line, or None if it has not written one by the time it exits or
    timeout (default kt.slow(10)) passes.  The source learns of the failure
    (RP_FAIL) before the destination has written its line, so a test that
    reads it right after the source's status must wait for it."""
    deadline = time.monotonic() + (kt.slow(10) if timeout is None else timeout)
    while True:
        exited = vm.proc.poll() is not None
        m = re.search(r"incoming migration failed: (.*)", vm.output())
        if m:
            return m.group(1).rstrip()
        if exited or time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def check_dst_error(check, name, vm, want, regex=False):
    """The destination said exactly why it failed: want (a string, or a
    regular expression matching the whole reason when regex)."""
    got = dst_error(vm)
    ok = got is not None and (re.fullmatch(want, got) is not None if regex else got == want)
    return check(name, ok, "want %s %r, destination said %r; %s"
                 % ("/%s/" % want if regex else "", want, got, dump(vm)))


def check_failed(check, name, r, want, regex=False):
    """query-migrate r is failed with error-desc exactly want (or matching
    the regular expression want as a whole)."""
    desc = r.get("error-desc")
    ok = r.get("status") == "failed" and desc is not None and (
        re.fullmatch(want, desc) is not None if regex else desc == want)
    return check(name, ok, "want failed with error-desc %r; query-migrate %r" % (want, r))


def check_qmp_error(check, name, reply, want):
    """A QMP reply that is an error with desc exactly want."""
    desc = reply.get("error", {}).get("desc")
    return check(name, "error" in reply and desc == want, "want error %r; reply %r" % (want, reply))


def wait_until(qmp, cond, timeout):
    """Polls query-migrate until cond(reply) holds; returns the last reply."""
    deadline = time.time() + timeout
    while True:
        r = qmp.cmd("query-migrate")
        if cond(r) or time.time() > deadline or r.get("status") in kt.MIG_FINAL:
            return r
        time.sleep(0.05)


def guest_goes_on(vm, pattern, n=2, timeout=15):
    """True when the guest prints n more lines matching pattern."""
    start = vm.console.count(pattern)
    deadline = time.time() + kt.slow(timeout)
    while time.time() < deadline:
        if vm.console.count(pattern) >= start + n:
            return True
        time.sleep(0.1)
    return False


def status(vm):
    return vm.qmp().cmd("query-status").get("status")


def retry(d, vms, check, src, cmdline, memory, pattern, params=None):
    """Migrates src to a fresh destination; checks it completes and runs."""
    uri = tcp_uri()
    dst = dest(d, vms, cmdline, uri, memory=memory, name="dst2")
    r = kt.migrate(src, dst, uri, caps={"x-verify": True},
                   params=params or {"max-bandwidth": 0, "downtime-limit": 1000},
                   timeout=kt.slow(60))
    check("retry_completed", r.get("status") == "completed",
          "%r; src %s; dst2 %s" % (r, dump(src), dump(dst)))
    check("retry_dst_runs", r.get("status") == "completed"
          and dst.console.wait(pattern, kt.slow(20), proc=dst.proc) is not None
          and status(dst) == "running", dump(dst))


# ----------------------------------------------------------------- cancel

def test_cancel_bulk(d, vms, check):
    cmd = "workload=fill-free mb=512 report_ms=200"
    src = source(d, vms, cmd, memory="1G")
    if not check("boot", src.console.wait(r"^heartbeat", kt.slow(60), proc=src.proc) is not None,
                 dump(src)):
        return
    uri = tcp_uri()
    dst = dest(d, vms, cmd, uri, memory="1G")
    q = src.qmp()
    kt.set_params(q, max_bandwidth=20 * 1000 * 1000)
    kt.wait_incoming(dst, kt.slow(30))
    q.cmd("migrate", uri=uri)
    # in the bulk pass: some bytes sent, far from the 512 MiB of data
    r = wait_until(q, lambda r: r.get("status") == "active"
                   and r.get("ram", {}).get("transferred", 0) > 4 * MIB, kt.slow(30))
    in_bulk = (r.get("status") == "active" and r["ram"].get("dirty-sync-count", 0) == 0
               and r["ram"]["transferred"] < 256 * MIB)
    check("in_bulk", in_bulk, repr(r))
    q.cmd("migrate_cancel")
    r = wait_until(q, lambda r: r.get("status") == "cancelled", kt.slow(20))
    check("cancelled", r.get("status") == "cancelled", repr(r))
    check("src_running", status(src) == "running", dump(src))
    check("src_recovered", *kt.recovered(src.qmp()))
    check("guest_goes_on", guest_goes_on(src, r"^heartbeat"), dump(src))
    rc = dst.wait_exit(kt.slow(20))
    check("dst_exits_nonzero", rc == 1, "exit %r; %s" % (rc, dump(dst)))
    check_dst_error(check, "dst_error", dst, CLOSED_BY_PEER)
    retry(d, vms, check, src, cmd, "1G", r"^heartbeat")


def test_cancel_rounds(d, vms, check):
    cmd = "workload=stress mb=64 report_ms=300"
    src = source(d, vms, cmd)
    if not check("boot", src.console.wait(r"^stress cpu=0", kt.slow(30), proc=src.proc)
                 is not None, dump(src)):
        return
    uri = tcp_uri()
    dst = dest(d, vms, cmd, uri)
    q = src.qmp()
    kt.set_caps(q, auto_converge=False)
    # 1 ms at 10 MB/s is less than 3 pages: the rounds go on unless the
    # guest wrote nearly nothing during a whole round, which a round as
    # long as sending its pages at 10 MB/s makes unlikely even when the
    # guest's vCPU is starved of CPU time for a while (unlimited, a round
    # can be a few ms long and end the migration then)
    kt.set_params(q, downtime_limit=1, max_bandwidth=10 * 1000 * 1000)
    kt.wait_incoming(dst, kt.slow(30))
    q.cmd("migrate", uri=uri)
    r = wait_until(q, lambda r: r.get("status") == "active"
                   and r.get("ram", {}).get("dirty-sync-count", 0) >= 2, kt.slow(40))
    check("in_rounds", r.get("status") == "active"
          and r["ram"].get("dirty-sync-count", 0) >= 2, repr(r))
    q.cmd("migrate_cancel")
    r = wait_until(q, lambda r: r.get("status") == "cancelled", kt.slow(20))
    check("cancelled", r.get("status") == "cancelled", repr(r))
    check("src_running", status(src) == "running", dump(src))
    check("src_recovered", *kt.recovered(src.qmp()))
    check("guest_goes_on", guest_goes_on(src, r"^stress cpu=0"), dump(src))
    rc = dst.wait_exit(kt.slow(20))
    check("dst_exits_nonzero", rc == 1, "exit %r; %s" % (rc, dump(dst)))
    check_dst_error(check, "dst_error", dst, CLOSED_BY_PEER)
    # a cancel with nothing running is harmless
    q.cmd("migrate_cancel")
    check("cancel_idle", q.cmd("query-migrate").get("status") == "cancelled"
          and status(src) == "running", repr(q.cmd("query-migrate")))


# ----------------------------------------------------------- destination

def test_dst_killed(d, vms, check):
    cmd = "workload=fill-free mb=192 report_ms=200"
    src = source(d, vms, cmd)
    if not check("boot", src.console.wait(r"^heartbeat", kt.slow(60), proc=src.proc) is not None,
                 dump(src)):
        return
    uri = tcp_uri()
    dst = dest(d, vms, cmd, uri)
    q = src.qmp()
    kt.set_params(q, max_bandwidth=20 * 1000 * 1000)
    kt.wait_incoming(dst, kt.slow(30))
    q.cmd("migrate", uri=uri)
    r = wait_until(q, lambda r: r.get("status") == "active"
                   and r.get("ram", {}).get("transferred", 0) > 4 * MIB, kt.slow(30))
    check("midstream", r.get("status") == "active", repr(r))
    os.killpg(dst.proc.pid, signal.SIGKILL)
    dst.proc.wait()
    r = wait_until(q, lambda r: False, kt.slow(30))
    print("# dst_killed: error-desc %r" % r.get("error-desc"))
    check_failed(check, "failed", r, WRITE_TO_DEAD_DST, regex=True)
    check("src_running", status(src) == "running", dump(src))
    check("src_recovered", *kt.recovered(src.qmp()))
    check("guest_goes_on", guest_goes_on(src, r"^heartbeat"), dump(src))
    retry(d, vms, check, src, cmd, "256M", r"^heartbeat")


def test_layout_mismatch(d, vms, check):
    cmd = "workload=idle report_ms=200"
    src = source(d, vms, cmd, memory="256M")
    if not check("boot", src.console.wait(r"^heartbeat", kt.slow(30), proc=src.proc) is not None,
                 dump(src)):
        return
    uri = tcp_uri()
    dst = dest(d, vms, cmd, uri, memory="512M")
    r = kt.migrate(src, dst, uri, timeout=kt.slow(30))
    print("# layout_mismatch: error-desc %r" % r.get("error-desc"))
    reason = ("START: RAM layout differs: RAM block 0: source gpa 0x0 size 0x10000000, "
              "destination gpa 0x0 size 0x20000000")
    # the destination tells the source why (RP_FAIL): the source's
    # error-desc carries that reason, read while it still sends pages
    # ("refused the stream") or, if it got as far, as the answer to its
    # end record ("failed")
    check_failed(check, "failed", r, r"destination (refused the stream|failed): "
                 + re.escape(reason), regex=True)
    check("src_running", status(src) == "running", dump(src))
    check("src_recovered", *kt.recovered(src.qmp()))
    check("guest_goes_on", guest_goes_on(src, r"^heartbeat"), dump(src))
    rc = dst.wait_exit(kt.slow(20))
    check("dst_exits_nonzero", rc == 1, "exit %r; %s" % (rc, dump(dst)))
    check_dst_error(check, "dst_says_why", dst, reason)
    check("dst_never_ran", dst.console.count(r"^heartbeat") == 0, dump(dst))


def test_cpus_mismatch(d, vms, check):
    cmd = "workload=idle report_ms=200"
    src = kt.kmig_vm(d, "src", cmd, memory="256M", cpus=1)
    vms.append(src)
    if not check("boot", src.console.wait(r"^heartbeat", kt.slow(30), proc=src.proc) is not None,
                 dump(src)):
        return
    uri = tcp_uri()
    dst = kt.kmig_vm(d, "dst", cmd, memory="256M", cpus=2, extra=["--incoming", uri])
    vms.append(dst)
    r = kt.migrate(src, dst, uri, timeout=kt.slow(30))
    print("# cpus_mismatch: error-desc %r" % r.get("error-desc"))
    # the destination loads everything, then checks at END that each of
    # its state sections came: vCPU 1's are missing.  With V sections of
    # the VM and P per vCPU, it got N = V + P and wanted M = V + 2P, so
    # N < M < 2N
    rx = r"state section sregs \(1\) instance 1 missing \((\d+) of (\d+) arrived\)"
    got = dst_error(dst)
    m = re.fullmatch(rx, got or "")
    check("dst_says_why", m is not None
          and int(m.group(1)) < int(m.group(2)) < 2 * int(m.group(1)),
          "want /%s/ with one vCPU's sections missing, destination said %r; %s"
          % (rx, got, dump(dst)))
    check_failed(check, "failed", r, "destination failed: " + (m.group(0) if m else rx),
                 regex=m is None)
    check("src_running", status(src) == "running", dump(src))
    check("src_recovered", *kt.recovered(src.qmp()))
    check("guest_goes_on", guest_goes_on(src, r"^heartbeat"), dump(src))
    rc = dst.wait_exit(kt.slow(20))
    check("dst_exits_nonzero", rc == 1, "exit %r; %s" % (rc, dump(dst)))
    check("dst_never_ran", dst.console.count(r"^heartbeat") == 0, dump(dst))


def test_cancel_stalled(d, vms, check):
    """The destination stops reading (SIGSTOP): the source's writes block;
    migrate_cancel must still end the migration and leave the guest running."""
    cmd = "workload=stress mb=64 report_ms=300"
    src = source(d, vms, cmd)
    if not check("boot", src.console.wait(r"^stress cpu=0", kt.slow(30), proc=src.proc)
                 is not None, dump(src)):
        return
    uri = tcp_uri()
    dst = dest(d, vms, cmd, uri)
    q = src.qmp()
    # 1 ms of downtime at 256 MiB/s lets no more than 256 KiB remain: the
    # stress guest never converges (unlimited, natively a 12 GB/s loopback
    # let 1.5 MB go in 1 ms and the migration was at its switchover already)
    kt.set_params(q, max_bandwidth=256 << 20, downtime_limit=1)
    kt.wait_incoming(dst, kt.slow(30))
    q.cmd("migrate", uri=uri)
    wait_until(q, lambda r: r.get("status") == "active"
               and r.get("ram", {}).get("transferred", 0) > 8 * MIB, kt.slow(30))
    os.killpg(dst.proc.pid, signal.SIGSTOP)
    try:
        # let the socket buffers fill up so that the sender blocks
        t0 = q.cmd("query-migrate").get("ram", {}).get("transferred", 0)
        deadline = time.time() + kt.slow(10)
        while time.time() < deadline:
            time.sleep(0.5)
            t1 = q.cmd("query-migrate").get("ram", {}).get("transferred", 0)
            if t1 == t0:
                break
            t0 = t1
        r = q.cmd("query-migrate")
        check("stalled", r.get("status") == "active", repr(r))
        q.cmd("migrate_cancel")
        r = wait_until(q, lambda r: r.get("status") == "cancelled", kt.slow(20))
        check("cancelled", r.get("status") == "cancelled", repr(r))
        check("src_running", status(src) == "running", dump(src))
        check("src_recovered", *kt.recovered(src.qmp()))
        check("guest_goes_on", guest_goes_on(src, r"^stress cpu=0"), dump(src))
    finally:
        os.killpg(dst.proc.pid, signal.SIGCONT)
    rc = dst.wait_exit(kt.slow(20))
    check("dst_exits_nonzero", rc == 1, "exit %r; %s" % (rc, dump(dst)))
    check_dst_error(check, "dst_error", dst, CLOSED_BY_PEER)


# ----------------------------------------------------------- garbage

def start_record(magic=b"KMIGSTRM", version=2, blocks=((0, 256 * MIB),)):
    payload = magic + struct.pack("<III", version, 4096, len(blocks))
    for gpa, size in blocks:
        payload += struct.pack("<QQ", gpa, size)
    return struct.pack("<IIQ", 1, 0, len(payload)) + payload


TEXT = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)) * 64
HUGE = struct.pack("<IIQ", 1, 0, 1 << 62)
NOT_KMIG = "connection: not a kmig migration stream (first bytes %s)"

# (kind, bytes sent, the destination's exact reason, whether it fails: a
# connection that does not begin with a START record's header is dropped
# as a stray and the destination waits on for its source)
GARBAGE = [
    ("text", TEXT, NOT_KMIG % "47 45 54 20", False),
    # decode_start fails before it reads version and page size: both 0
    ("bad_magic", start_record(magic=b"NOTKMIG!"),
     "START: bad magic (not a kmig migration stream) (version 0, page size 0)", True),
    ("bad_version", start_record(version=99),
     "START: unsupported protocol version (version 99, page size 4096)", True),
    ("old_version", start_record(version=1),
     "START: unsupported protocol version (version 1, page size 4096)", True),
    # a valid START (the layout matches) and then a PAGES record whose
    # offset lies outside guest RAM
    ("out_of_range", start_record() + struct.pack("<IIQ", 2, 0, 8 + 8 + 4096)
     + struct.pack("<IIQ", 0, 1, 1 << 40) + b"\xaa" * 4096,
     "PAGES: offset 0x10000000000 beyond block 0 (size 0x10000000)", True),
    ("huge_length", HUGE, NOT_KMIG % "01 00 00 00", False),
    ("truncated", start_record()[:10], "connection: connection closed by peer", False),
]


@pytest.mark.parametrize("kind,junk,reason,fails", GARBAGE, ids=[g[0] for g in GARBAGE])
def test_garbage(d, vms, check, kind, junk, reason, fails):
    cmd = "workload=idle report_ms=200"
    port = kt.free_port()
    dst = dest(d, vms, cmd, "tcp:127.0.0.1:%d" % port, name="dst_" + kind)
    if not check("listening", kt.wait_incoming(dst, kt.slow(30)), dump(dst)):
        return
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        s.sendall(junk)
    except OSError:
        pass        # the destination may close before reading it all
    s.shutdown(socket.SHUT_WR)
    if not fails:
        deadline = time.time() + kt.slow(20)
        got = {}
        while time.time() < deadline and dst.proc.poll() is None:
            got = dst.qmp().cmd("query-migrate")
            if got.get("x-stray-connections"):
                break
            time.sleep(0.1)
        s.close()
        st = got.get("x-stray-connections", {})
        check("dropped", st.get("count") == 1 and st.get("last-reason") == reason,
              "want %r, got %r; %s" % (reason, got, dump(dst)))
        check("waits_on", dst.proc.poll() is None and got.get("status") == "setup",
              "%r; %s" % (got, dump(dst)))
        check("no_guest", dst.console.text().strip() == "", dump(dst))
        return
    rc = dst.wait_exit(kt.slow(20))
    s.close()
    check("exits_nonzero", rc == 1, "exit %r; %s" % (rc, dump(dst)))
    check_dst_error(check, "message", dst, reason)
    check("no_guest", dst.console.text().strip() == "", dump(dst))


# ----------------------------------------------------------- URIs

def test_nobody_listens_and_bad_uris(d, vms, check):
    cmd = "workload=idle report_ms=200"
    src = source(d, vms, cmd)
    if not check("boot", src.console.wait(r"^heartbeat", kt.slow(30), proc=src.proc) is not None,
                 dump(src)):
        return
    q = src.qmp()
    port = kt.free_port()
    sock = os.path.join(d, "nobody.sock")
    for kind, uri, want in (
            ("tcp", "tcp:127.0.0.1:%d" % port,
             "connect to 127.0.0.1:%d: Connection refused" % port),
            ("unix", "unix:" + sock, "connect to unix:%s: No such file or directory" % sock)):
        # migrate only parses the URI; the connection fails in the background
        reply = q.cmd_full("migrate", uri=uri)
        if check(kind + "_accepted", "error" not in reply, repr(reply)):
            r = kt.wait_migration(q, kt.slow(15))
            print("# nobody_listens_%s: error-desc %r" % (kind, r.get("error-desc")))
            check_failed(check, kind + "_failed", r, want)
        check(kind + "_src_running", status(src) == "running", dump(src))
        check(kind + "_src_recovered", *kt.recovered(src.qmp()))
    check("guest_goes_on", guest_goes_on(src, r"^heartbeat"), dump(src))

    # bad URIs: a QMP error saying what is wrong, nothing started, the guest runs on
    for uri, want in (
            ("", "unknown URI scheme '' (want tcp:, unix:, exec:, file: or fd:)"),
            ("foo:bar", "unknown URI scheme 'foo' (want tcp:, unix:, exec:, file: or fd:)"),
            ("tcp:127.0.0.1", "tcp URI needs HOST:PORT, got '127.0.0.1'"),
            ("tcp:127.0.0.1:notaport", "tcp: bad port 'notaport' (want 0..65535)"),
            ("tcp:127.0.0.1:70000", "tcp: bad port '70000' (want 0..65535)"),
            ("unix:", "unix: empty socket path"),
            ("unix:" + "x" * 200, "unix: socket path too long (max 107)"),
            ("rdma:127.0.0.1:4444", "unknown URI scheme 'rdma' (want tcp:, unix:, exec:, file: or fd:)"),
            ("exec:", "exec: empty command"),
            ("file:", "file: empty path"),
            ("tcp:127.0.0.1:-1", "tcp: bad port '-1' (want 0..65535)")):
        check_qmp_error(check, "bad_uri_%r" % uri, q.cmd_full("migrate", uri=uri), want)
    # URIs that parse but cannot be connected to (port 0 is for listening,
    # an empty host likewise): accepted, then failed when connecting
    for uri in ("tcp:127.0.0.1:0", "tcp::%d" % kt.free_port()):
        reply = q.cmd_full("migrate", uri=uri)
        if check("unconnectable_uri_%r_accepted" % uri, "error" not in reply, repr(reply)):
            reply = kt.wait_migration(q, kt.slow(15))
            check_failed(check, "unconnectable_uri_%r" % uri, reply,
                         "tcp: connect needs a host and a port > 0")
    check_qmp_error(check, "no_uri", q.cmd_full("migrate"), "Parameter 'uri' is missing")
    check_qmp_error(check, "uri_not_str", q.cmd_full("migrate", uri=123),
                    "Invalid parameter type for 'uri', expected: string")
    # the refused commands started nothing: still the last one's failure
    r = q.cmd("query-migrate")
    check("bad_uri_nothing_started", r.get("status") == "failed" and r.get("error-desc")
          == "tcp: connect needs a host and a port > 0", repr(r))
    check("bad_uri_src_running", status(src) == "running", dump(src))
    check("src_recovered", *kt.recovered(src.qmp()))


def test_second_migrate(d, vms, check):
    cmd = "workload=fill-free mb=128 report_ms=200"
    src = source(d, vms, cmd)
    if not check("boot", src.console.wait(r"^heartbeat", kt.slow(60), proc=src.proc) is not None,
                 dump(src)):
        return
    uri = tcp_uri()
    dst = dest(d, vms, cmd, uri)
    q = src.qmp()
    kt.set_params(q, max_bandwidth=20 * 1000 * 1000)
    kt.wait_incoming(dst, kt.slow(30))
    q.cmd("migrate", uri=uri)
    r = wait_until(q, lambda r: r.get("status") == "active", kt.slow(20))
    check_qmp_error(check, "second_refused", q.cmd_full("migrate", uri=tcp_uri()), IN_PROGRESS)
    reply = q.cmd_full("migrate-set-capabilities",
                       capabilities=[{"capability": "x-verify", "state": True}])
    check_qmp_error(check, "caps_refused_while_active", reply, IN_PROGRESS)
    r = q.cmd("query-migrate")
    check("first_goes_on", r.get("status") in ACTIVE, repr(r))
    # the first one can still finish, faster now
    kt.set_params(q, max_bandwidth=0)
    r = kt.wait_migration(q, kt.slow(60))
    check("first_completed", r.get("status") == "completed", repr(r))
    check("dst_runs", dst.console.wait(r"^heartbeat", kt.slow(20), proc=dst.proc) is not None,
          dump(dst))
    # a migrate after completion: the guest is no longer here
    check_qmp_error(check, "after_completion_refused", q.cmd_full("migrate", uri=tcp_uri()),
                    "Cannot migrate a VM that is postmigrate")
