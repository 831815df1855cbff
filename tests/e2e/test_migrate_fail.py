#!/usr/bin/env python3
"""Live migration that does not complete: cancelled (in the bulk pass and in
dirty rounds), destination killed, layout mismatch, garbage on the
destination's port, nobody listening, bad URIs and a second migrate.  In
every case the source must keep running its guest, and a migration that
fails on the destination side must stop that destination with status 1
(docs/usage.md).
"""
import os
import re
import shutil
import signal
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kmigtest as kt  # noqa: E402

R = kt.Report()
MIB = 1 << 20
ACTIVE = ("setup", "active", "device", "cancelling")


def tcp_uri():
    return "tcp:127.0.0.1:%d" % kt.free_port()


def dump(vm, n=12):
    return kt.dump(vm, n)


def run_case(name, fn, d):
    sub = os.path.join(d, name)
    os.mkdir(sub)
    kt.run_case(R, name, lambda vms: fn(sub, vms, name))


def source(d, vms, cmdline, memory="256M", name="src"):
    vm = kt.kmig_vm(d, name, cmdline, memory=memory)
    vms.append(vm)
    return vm


def dest(d, vms, cmdline, uri, memory="256M", name="dst"):
    vm = kt.kmig_vm(d, name, cmdline, memory=memory, extra=["--incoming", uri])
    vms.append(vm)
    return vm


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
    deadline = time.time() + timeout
    while time.time() < deadline:
        if vm.console.count(pattern) >= start + n:
            return True
        time.sleep(0.1)
    return False


def status(vm):
    return vm.qmp().cmd("query-status").get("status")


def retry(d, vms, name, src, cmdline, memory, pattern, params=None):
    """Migrates src to a fresh destination; checks it completes and runs."""
    uri = tcp_uri()
    dst = dest(d, vms, cmdline, uri, memory=memory, name="dst2")
    r = kt.migrate(src, dst, uri, caps={"x-verify": True},
                   params=params or {"max-bandwidth": 0, "downtime-limit": 1000}, timeout=60)
    R.ok(name + "_retry_completed", r.get("status") == "completed",
         "%r; src %s; dst2 %s" % (r, dump(src), dump(dst)))
    R.ok(name + "_retry_dst_runs", r.get("status") == "completed"
         and dst.console.wait(pattern, 20, proc=dst.proc) is not None
         and status(dst) == "running", dump(dst))


# ----------------------------------------------------------------- cancel

def case_cancel_bulk(d, vms, name):
    cmd = "workload=fill-free mb=512 report_ms=200"
    src = source(d, vms, cmd, memory="1G")
    if not R.ok(name + "_boot", src.console.wait(r"^heartbeat", 60, proc=src.proc) is not None,
                dump(src)):
        return
    uri = tcp_uri()
    dst = dest(d, vms, cmd, uri, memory="1G")
    q = src.qmp()
    kt.set_params(q, max_bandwidth=20 * 1000 * 1000)
    kt.wait_incoming(dst)
    q.cmd("migrate", uri=uri)
    # in the bulk pass: some bytes sent, far from the 512 MiB of data
    r = wait_until(q, lambda r: r.get("status") == "active"
                   and r.get("ram", {}).get("transferred", 0) > 4 * MIB, 30)
    in_bulk = (r.get("status") == "active" and r["ram"].get("dirty-sync-count", 0) == 0
               and r["ram"]["transferred"] < 256 * MIB)
    R.ok(name + "_in_bulk", in_bulk, repr(r))
    q.cmd("migrate_cancel")
    r = wait_until(q, lambda r: r.get("status") == "cancelled", 20)
    R.ok(name + "_cancelled", r.get("status") == "cancelled", repr(r))
    R.ok(name + "_src_running", status(src) == "running", dump(src))
    R.ok(name + "_guest_goes_on", guest_goes_on(src, r"^heartbeat"), dump(src))
    rc = dst.wait_exit(20)
    R.ok(name + "_dst_exits_nonzero", rc == 1, "exit %r; %s" % (rc, dump(dst)))
    retry(d, vms, name, src, cmd, "1G", r"^heartbeat")


def case_cancel_rounds(d, vms, name):
    cmd = "workload=stress mb=64 report_ms=300"
    src = source(d, vms, cmd)
    if not R.ok(name + "_boot", src.console.wait(r"^stress cpu=0", 30, proc=src.proc) is not None,
                dump(src)):
        return
    uri = tcp_uri()
    dst = dest(d, vms, cmd, uri)
    q = src.qmp()
    kt.set_caps(q, auto_converge=False)
    kt.set_params(q, downtime_limit=1)
    kt.wait_incoming(dst)
    q.cmd("migrate", uri=uri)
    r = wait_until(q, lambda r: r.get("status") == "active"
                   and r.get("ram", {}).get("dirty-sync-count", 0) >= 2, 40)
    R.ok(name + "_in_rounds", r.get("status") == "active"
         and r["ram"].get("dirty-sync-count", 0) >= 2, repr(r))
    q.cmd("migrate_cancel")
    r = wait_until(q, lambda r: r.get("status") == "cancelled", 20)
    R.ok(name + "_cancelled", r.get("status") == "cancelled", repr(r))
    R.ok(name + "_src_running", status(src) == "running", dump(src))
    R.ok(name + "_guest_goes_on", guest_goes_on(src, r"^stress cpu=0"), dump(src))
    rc = dst.wait_exit(20)
    R.ok(name + "_dst_exits_nonzero", rc == 1, "exit %r; %s" % (rc, dump(dst)))
    # a cancel with nothing running is harmless
    q.cmd("migrate_cancel")
    R.ok(name + "_cancel_idle", q.cmd("query-migrate").get("status") == "cancelled"
         and status(src) == "running", repr(q.cmd("query-migrate")))


# ----------------------------------------------------------- destination

def case_dst_killed(d, vms, name):
    cmd = "workload=fill-free mb=192 report_ms=200"
    src = source(d, vms, cmd)
    if not R.ok(name + "_boot", src.console.wait(r"^heartbeat", 60, proc=src.proc) is not None,
                dump(src)):
        return
    uri = tcp_uri()
    dst = dest(d, vms, cmd, uri)
    q = src.qmp()
    kt.set_params(q, max_bandwidth=20 * 1000 * 1000)
    kt.wait_incoming(dst)
    q.cmd("migrate", uri=uri)
    r = wait_until(q, lambda r: r.get("status") == "active"
                   and r.get("ram", {}).get("transferred", 0) > 4 * MIB, 30)
    R.ok(name + "_midstream", r.get("status") == "active", repr(r))
    os.killpg(dst.proc.pid, signal.SIGKILL)
    dst.proc.wait()
    r = wait_until(q, lambda r: False, 30)
    R.ok(name + "_failed", r.get("status") == "failed" and bool(r.get("error-desc")), repr(r))
    print("# %s: error-desc %r" % (name, r.get("error-desc")))
    R.ok(name + "_src_running", status(src) == "running", dump(src))
    R.ok(name + "_guest_goes_on", guest_goes_on(src, r"^heartbeat"), dump(src))
    retry(d, vms, name, src, cmd, "256M", r"^heartbeat")


def case_layout_mismatch(d, vms, name):
    cmd = "workload=idle report_ms=200"
    src = source(d, vms, cmd, memory="256M")
    if not R.ok(name + "_boot", src.console.wait(r"^heartbeat", 30, proc=src.proc) is not None,
                dump(src)):
        return
    uri = tcp_uri()
    dst = dest(d, vms, cmd, uri, memory="512M")
    r = kt.migrate(src, dst, uri, timeout=30)
    R.ok(name + "_failed", r.get("status") == "failed" and bool(r.get("error-desc")), repr(r))
    print("# %s: error-desc %r" % (name, r.get("error-desc")))
    R.ok(name + "_src_running", status(src) == "running", dump(src))
    R.ok(name + "_guest_goes_on", guest_goes_on(src, r"^heartbeat"), dump(src))
    rc = dst.wait_exit(20)
    R.ok(name + "_dst_exits_nonzero", rc == 1, "exit %r; %s" % (rc, dump(dst)))
    R.ok(name + "_dst_says_why", re.search(r"layout|memory|size|block", dst.output(), re.I)
         is not None, dump(dst))
    # the destination tells the source why (RP_FAIL): the source's
    # error-desc should carry that reason, not only a broken connection
    R.ok(name + "_src_error_has_reason",
         re.search(r"destination|layout|memory|size|block", r.get("error-desc", ""), re.I)
         is not None, "source error-desc %r; destination said: %s"
         % (r.get("error-desc"), dst.output().strip()[-300:]))
    R.ok(name + "_dst_never_ran", dst.console.count(r"^heartbeat") == 0, dump(dst))


def case_cpus_mismatch(d, vms, name):
    cmd = "workload=idle report_ms=200"
    src = kt.kmig_vm(d, "src", cmd, memory="256M", cpus=1)
    vms.append(src)
    if not R.ok(name + "_boot", src.console.wait(r"^heartbeat", 30, proc=src.proc) is not None,
                dump(src)):
        return
    uri = tcp_uri()
    dst = kt.kmig_vm(d, "dst", cmd, memory="256M", cpus=2, extra=["--incoming", uri])
    vms.append(dst)
    r = kt.migrate(src, dst, uri, timeout=30)
    R.ok(name + "_failed", r.get("status") == "failed" and bool(r.get("error-desc")), repr(r))
    print("# %s: error-desc %r" % (name, r.get("error-desc")))
    R.ok(name + "_src_running", status(src) == "running", dump(src))
    R.ok(name + "_guest_goes_on", guest_goes_on(src, r"^heartbeat"), dump(src))
    rc = dst.wait_exit(20)
    R.ok(name + "_dst_exits_nonzero", rc == 1, "exit %r; %s" % (rc, dump(dst)))
    R.ok(name + "_dst_never_ran", dst.console.count(r"^heartbeat") == 0, dump(dst))


def case_cancel_stalled(d, vms, name):
    """The destination stops reading (SIGSTOP): the source's writes block;
    migrate_cancel must still end the migration and leave the guest running."""
    cmd = "workload=stress mb=64 report_ms=300"
    src = source(d, vms, cmd)
    if not R.ok(name + "_boot", src.console.wait(r"^stress cpu=0", 30, proc=src.proc) is not None,
                dump(src)):
        return
    uri = tcp_uri()
    dst = dest(d, vms, cmd, uri)
    q = src.qmp()
    kt.set_params(q, max_bandwidth=0, downtime_limit=1)
    kt.wait_incoming(dst)
    q.cmd("migrate", uri=uri)
    wait_until(q, lambda r: r.get("status") == "active"
               and r.get("ram", {}).get("transferred", 0) > 8 * MIB, 30)
    os.killpg(dst.proc.pid, signal.SIGSTOP)
    try:
        # let the socket buffers fill up so that the sender blocks
        t0 = q.cmd("query-migrate").get("ram", {}).get("transferred", 0)
        deadline = time.time() + 10
        while time.time() < deadline:
            time.sleep(0.5)
            t1 = q.cmd("query-migrate").get("ram", {}).get("transferred", 0)
            if t1 == t0:
                break
            t0 = t1
        r = q.cmd("query-migrate")
        R.ok(name + "_stalled", r.get("status") == "active", repr(r))
        q.cmd("migrate_cancel")
        r = wait_until(q, lambda r: r.get("status") == "cancelled", 20)
        R.ok(name + "_cancelled", r.get("status") == "cancelled", repr(r))
        R.ok(name + "_src_running", status(src) == "running", dump(src))
        R.ok(name + "_guest_goes_on", guest_goes_on(src, r"^stress cpu=0"), dump(src))
    finally:
        os.killpg(dst.proc.pid, signal.SIGCONT)
    rc = dst.wait_exit(20)
    R.ok(name + "_dst_exits_nonzero", rc == 1, "exit %r; %s" % (rc, dump(dst)))


def start_record(magic=b"KMIGSTRM", version=1, blocks=((0, 256 * MIB),)):
    payload = magic + struct.pack("<III", version, 4096, len(blocks))
    for gpa, size in blocks:
        payload += struct.pack("<QQ", gpa, size)
    return struct.pack("<IIQ", 1, 0, len(payload)) + payload


GARBAGE = [
    ("text", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + bytes(range(256)) * 64),
    ("bad_magic", start_record(magic=b"NOTKMIG!")),
    ("bad_version", start_record(version=99)),
    # a valid START (if the layout matches) and then a PAGES record whose
    # offset lies outside guest RAM
    ("out_of_range", start_record() + struct.pack("<IIQ", 2, 0, 8 + 8 + 4096)
     + struct.pack("<IIQ", 0, 1, 1 << 40) + b"\xaa" * 4096),
    ("huge_length", struct.pack("<IIQ", 1, 0, 1 << 62)),
    ("truncated", start_record()[:10]),
]


def case_garbage(d, vms, name):
    cmd = "workload=idle report_ms=200"
    for kind, junk in GARBAGE:
        n = name + "_" + kind
        port = kt.free_port()
        dst = dest(d, vms, cmd, "tcp:127.0.0.1:%d" % port, name="dst_" + kind)
        if not R.ok(n + "_listening", kt.wait_incoming(dst), dump(dst)):
            continue
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            s.sendall(junk)
        except OSError:
            pass        # the destination may close before reading it all
        s.shutdown(socket.SHUT_WR)
        rc = dst.wait_exit(20)
        s.close()
        R.ok(n + "_exits_nonzero", rc == 1, "exit %r; %s" % (rc, dump(dst)))
        out = dst.output()
        R.ok(n + "_message", re.search(r"incoming migration failed: \S", out) is not None, out)
        R.ok(n + "_no_guest", dst.console.text().strip() == "", dump(dst))


def case_nobody_listens(d, vms, name):
    cmd = "workload=idle report_ms=200"
    src = source(d, vms, cmd)
    if not R.ok(name + "_boot", src.console.wait(r"^heartbeat", 30, proc=src.proc) is not None,
                dump(src)):
        return
    q = src.qmp()
    for kind, uri in (("tcp", tcp_uri()), ("unix", "unix:" + os.path.join(d, "nobody.sock"))):
        n = name + "_" + kind
        try:
            q.cmd("migrate", uri=uri)
            r = kt.wait_migration(q, 15)
            R.ok(n + "_failed", r.get("status") == "failed" and bool(r.get("error-desc")), repr(r))
            print("# %s: error-desc %r" % (n, r.get("error-desc")))
        except RuntimeError as e:    # refusing at once is fine too
            R.ok(n + "_failed", True)
            print("# %s: %s" % (n, e))
        R.ok(n + "_src_running", status(src) == "running", dump(src))
    R.ok(name + "_guest_goes_on", guest_goes_on(src, r"^heartbeat"), dump(src))

    # bad URIs: a QMP error, nothing started, the guest runs on
    for uri in ("", "foo:bar", "tcp:127.0.0.1", "tcp:127.0.0.1:notaport", "tcp:127.0.0.1:70000",
                "unix:", "unix:" + "x" * 200, "exec:cat", "tcp:127.0.0.1:-1"):
        reply = q.cmd_full("migrate", uri=uri)
        desc = reply.get("error", {}).get("desc", "")
        R.ok(name + "_bad_uri_%r" % uri, "error" in reply and "in progress" not in desc,
             repr(reply))
    # URIs that parse but cannot be connected to (port 0 is for listening,
    # an empty host likewise): refused at once, or failed soon after
    for uri in ("tcp:127.0.0.1:0", "tcp::%d" % kt.free_port()):
        reply = q.cmd_full("migrate", uri=uri)
        if "error" in reply:
            ok = "in progress" not in reply["error"].get("desc", "")
        else:
            reply = kt.wait_migration(q, 15)
            ok = reply.get("status") == "failed" and bool(reply.get("error-desc"))
        R.ok(name + "_unconnectable_uri_%r" % uri, ok, repr(reply))
    reply = q.cmd_full("migrate")
    R.ok(name + "_no_uri", "error" in reply, repr(reply))
    reply = q.cmd_full("migrate", uri=123)
    R.ok(name + "_uri_not_str", "error" in reply, repr(reply))
    st = q.cmd("query-migrate").get("status")
    R.ok(name + "_bad_uri_nothing_started", st in ("failed", "none"), st)
    R.ok(name + "_bad_uri_src_running", status(src) == "running", dump(src))


def case_second_migrate(d, vms, name):
    cmd = "workload=fill-free mb=128 report_ms=200"
    src = source(d, vms, cmd)
    if not R.ok(name + "_boot", src.console.wait(r"^heartbeat", 60, proc=src.proc) is not None,
                dump(src)):
        return
    uri = tcp_uri()
    dst = dest(d, vms, cmd, uri)
    q = src.qmp()
    kt.set_params(q, max_bandwidth=20 * 1000 * 1000)
    kt.wait_incoming(dst)
    q.cmd("migrate", uri=uri)
    r = wait_until(q, lambda r: r.get("status") == "active", 20)
    reply = q.cmd_full("migrate", uri=tcp_uri())
    R.ok(name + "_second_refused", "error" in reply, repr(reply))
    reply = q.cmd_full("migrate-set-capabilities",
                       capabilities=[{"capability": "x-verify", "state": True}])
    R.ok(name + "_caps_refused_while_active", "error" in reply, repr(reply))
    r = q.cmd("query-migrate")
    R.ok(name + "_first_goes_on", r.get("status") in ACTIVE, repr(r))
    # the first one can still finish, faster now
    kt.set_params(q, max_bandwidth=0)
    r = kt.wait_migration(q, 60)
    R.ok(name + "_first_completed", r.get("status") == "completed", repr(r))
    R.ok(name + "_dst_runs", dst.console.wait(r"^heartbeat", 20, proc=dst.proc) is not None,
         dump(dst))
    # a migrate after completion: the guest is no longer here
    reply = q.cmd_full("migrate", uri=tcp_uri())
    R.ok(name + "_after_completion_refused", "error" in reply, repr(reply))


def main():
    if not kt.have_kvm():
        R.skip("migrate_fail", "no /dev/kvm")
        return
    d = kt.tmpdir()
    try:
        run_case("fail_cancel_bulk", case_cancel_bulk, d)
        run_case("fail_cancel_rounds", case_cancel_rounds, d)
        run_case("fail_dst_killed", case_dst_killed, d)
        run_case("fail_layout_mismatch", case_layout_mismatch, d)
        run_case("fail_cpus_mismatch", case_cpus_mismatch, d)
        run_case("fail_cancel_stalled", case_cancel_stalled, d)
        run_case("fail_garbage", case_garbage, d)
        run_case("fail_nobody_listens", case_nobody_listens, d)
        run_case("fail_second_migrate", case_second_migrate, d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
    R.done()
