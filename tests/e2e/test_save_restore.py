"""Migration without a connection: a VM saved into a file (file:) or a
command's input (exec:) and restored from it by a new kmig, and a live
migration over a pipe passed with QMP getfd (fd:), as libvirt drives QEMU.
Such a stream has no return path: what it cannot carry is refused up
front, a command that fails or stalls fails or cancels the migration with
the guest kept, and a damaged save is refused by the VM that restores it.
"""
import json
import os
import re
import select
import socket
import struct
import subprocess
import time

import pytest

import kmigtest as kt

pytestmark = pytest.mark.kvm

MIB = 1 << 20
VERIFY = "workload=verify mb=32 report_ms=300"
VERIFY_OK = r"^verify ok round=(\d+)"


def dump(vm, n=15):
    return kt.dump(vm, n)


def status(vm):
    return vm.qmp().cmd("query-status").get("status")


def booted(vm, check, pattern=VERIFY_OK):
    return check("boot", vm.console.wait(pattern, kt.slow(40), proc=vm.proc) is not None,
                 dump(vm))


def verify_goes_on(check, src, dst):
    """The restored guest goes on from where the saved one stopped: three
    more verify rounds, growing, none bad (the guest checks every page's
    generation stamp before it rewrites it)."""
    src_round = max([int(x) for x in re.findall(VERIFY_OK, src.console.text(), re.M)] or [0])
    deadline = time.time() + kt.slow(30)
    rounds = []
    while time.time() < deadline:
        rounds = [int(x) for x in re.findall(VERIFY_OK, dst.console.text(), re.M)]
        if len(rounds) >= 3 or "verify BAD" in dst.console.text() or dst.proc.poll() is not None:
            break
        time.sleep(0.2)
    check("dst_verify_ok", len(rounds) >= 3 and rounds == sorted(rounds) and
          len(set(rounds)) == len(rounds) and rounds[0] >= src_round,
          "src last round %d, dst rounds %r; %s" % (src_round, rounds, dump(dst)))
    bad = [l for l in (src.console.text() + "\n" + dst.console.text()).splitlines()
           if "verify BAD" in l or "bad_pages" in l]
    check("no_bad", not bad, " / ".join(bad[:5]))


def save(check, src, uri):
    """Saves src into uri with x-verify; True when it completed."""
    r = kt.migrate(src, None, uri, caps={"x-verify": True},
                   params={"max-bandwidth": 0, "downtime-limit": 1000}, timeout=kt.slow(90))
    print("# save %s: total-time %s ms, downtime %s ms, transferred %s"
          % (uri.split(":")[0], r.get("total-time"), r.get("downtime"),
             r.get("ram", {}).get("transferred")))
    ok = check("saved", r.get("status") == "completed", "%r; %s" % (r, dump(src)))
    # as after any completed migration: the guest stays stopped here
    check("src_postmigrate", status(src) == "postmigrate", dump(src))
    check("src_tracking_off", *kt.recovered(src.qmp()))
    return ok


@pytest.mark.parametrize("how", ["file", "exec"])
def test_save_restore(d, vms, check, how):
    """Save a guest, restore it in a new kmig: nothing lost.  file: saves
    it live over QMP; exec: as `virsh save` does, stopped first and
    compressed (gzip), through `kmig migrate`, restored stopped and then
    continued (under emulation gzip would not keep up with the guest's
    rewrites anyway)."""
    src = kt.kmig_vm(d, "src", VERIFY, memory="128M")
    vms.append(src)
    if not booted(src, check):
        return
    path = os.path.join(d, "vm.sav" + (".gz" if how == "exec" else ""))
    out = "file:" + path if how == "file" else "exec:gzip -1 > '%s'" % path
    back = "file:" + path if how == "file" else "exec:gzip -dc '%s'" % path
    if how == "file":
        if not save(check, src, out):
            return
    else:               # stopped, through the CLI: kmig migrate --verify exec:...
        src.qmp().cmd("stop")
        cli = subprocess.run([kt.KMIG, "migrate", "--qmp", "unix:" + src.qmp_path, "--verify",
                              "--json", out], capture_output=True, text=True,
                             timeout=kt.slow(120))
        r = json.loads(cli.stdout) if cli.returncode == 0 and cli.stdout.strip() else {}
        if not check("saved_cli", r.get("status") == "completed", "%s %r %r; %s" % (
                cli.returncode, cli.stdout[-300:], cli.stderr[-500:], dump(src))):
            return
        check("src_postmigrate", status(src) == "postmigrate", dump(src))
    check("saved_file", os.path.getsize(path) > 0, path)
    dst = kt.kmig_vm(d, "dst", VERIFY, memory="128M", extra=["--incoming", back])
    vms.append(dst)
    r = kt.wait_migration(dst.qmp(), kt.slow(60))
    check("restored", r.get("status") == "completed", "%r; %s" % (r, dump(dst)))
    if how == "exec":   # stopped when saved: restored stopped, as in QEMU
        check("dst_paused", status(dst) == "paused", dump(dst))
        dst.qmp().cmd("cont")
    check("dst_running", r.get("status") == "completed" and status(dst) == "running", dump(dst))
    verify_goes_on(check, src, dst)


def getfd(q, name, fd):
    """QMP getfd with fd passed as SCM_RIGHTS on the command's own bytes."""
    req = json.dumps({"execute": "getfd", "arguments": {"fdname": name}}).encode() + b"\n"
    socket.send_fds(q.sock, [req], [fd])
    return q.read_reply()


@pytest.mark.parametrize("kind", ["pipe", "socket"])
def test_fd_live(d, vms, check, kind):
    """Live migration over a descriptor: the source's end passed with getfd
    (migrate fd:NAME), the destination's inherited (--incoming fd:N).  A
    pipe is one-way; a socket pair keeps the return path (the source then
    waits for the destination's RP_OK, as over unix:)."""
    src = kt.kmig_vm(d, "src", VERIFY, memory="128M")
    vms.append(src)
    if not booted(src, check):
        return
    if kind == "pipe":
        rfd, wfd = os.pipe()
    else:
        a, b = socket.socketpair()
        rfd, wfd = b.detach(), a.detach()
    dst = kt.kmig_vm(d, "dst", VERIFY, memory="128M", extra=["--incoming", "fd:%d" % rfd],
                     pass_fds=(rfd,))
    vms.append(dst)
    os.close(rfd)
    q = src.qmp()
    reply = getfd(q, "mig", wfd)
    os.close(wfd)
    check("getfd", "return" in reply, repr(reply))
    r = kt.migrate(src, None, "fd:mig", caps={"x-verify": True, "auto-converge": True},
                   timeout=kt.slow(90))
    check("completed", r.get("status") == "completed", "%r; %s; %s" % (r, dump(src), dump(dst)))
    r = kt.wait_migration(dst.qmp(), kt.slow(30))
    check("dst_completed", r.get("status") == "completed", "%r; %s" % (r, dump(dst)))
    verify_goes_on(check, src, dst)
    way = "a socket's" if kind == "socket" else "a one-way"
    check("way", "migration: %s stream to fd:mig" % way in src.output(), dump(src))
    # the name was used up by the migration, as in QEMU
    e = q.cmd_full("closefd", fdname="mig")
    check("fd_taken", "not found" in e.get("error", {}).get("desc", ""), repr(e))


def test_refusals(d, vms, check):
    """What a stream without a return path cannot carry is refused before
    anything starts, with QEMU's words where QEMU has them."""
    src = kt.kmig_vm(d, "src", "workload=idle report_ms=200", memory="128M")
    vms.append(src)
    if not booted(src, check, r"^heartbeat"):
        return
    q = src.qmp()
    f = "file:" + os.path.join(d, "x.sav")

    def err(name, **args):
        return q.cmd_full(name, **args).get("error", {}).get("desc", "")

    kt.set_caps(q, **{"postcopy-ram": True})
    check("no_postcopy", "return path" in err("migrate", uri=f), err("migrate", uri=f))
    kt.set_caps(q, **{"postcopy-ram": False, "multifd": True})
    check("no_multifd", "multifd needs" in err("migrate", uri="exec:cat >/dev/null"))
    kt.set_caps(q, multifd=False)
    check("fd_unknown", err("migrate", uri="fd:nosuch") ==
          "File descriptor named 'nosuch' has not been found")
    check("fd_number", "use getfd and a name" in err("migrate", uri="fd:5"))
    check("getfd_none", err("getfd", fdname="x") == "No file descriptor supplied via SCM_RIGHTS")
    check("getfd_digit", "not starting with a digit" in err("getfd", fdname="0x"))
    check("closefd_unknown", err("closefd", fdname="x") == "File descriptor named 'x' not found")
    check("bad_scheme", "exec:, file: or fd:" in err("migrate", uri="rdma:h:1"))
    # a getfd'd descriptor is kept until closefd
    rfd, wfd = os.pipe()
    check("getfd", "return" in getfd(q, "p", wfd))
    os.close(wfd)
    check("closefd", "return" in q.cmd_full("closefd", fdname="p"))
    # the last write end is gone: EOF (and not a read that waits for ever)
    check("closed", select.select([rfd], [], [], 10)[0] == [rfd] and os.read(rfd, 1) == b"")
    os.close(rfd)
    check("nothing_started", q.cmd("query-migrate").get("status") in (None, "none")
          and status(src) == "running", repr(q.cmd("query-migrate")))
    check("no_file", not os.path.exists(f[5:]))


def test_exec_failures(d, vms, check):
    """A command that exits before reading fails the migration with the
    guest running; one that stalls is cancelled with the guest running; one
    that reads everything and then fails leaves the guest paused (it may
    have handed the guest on), and `cont` runs it."""
    src = kt.kmig_vm(d, "src", VERIFY, memory="128M")
    vms.append(src)
    if not booted(src, check):
        return
    q = src.qmp()
    kt.set_params(q, max_bandwidth=0, downtime_limit=1000)
    q.cmd("migrate", uri="exec:exit 3")
    r = kt.wait_migration(q, kt.slow(30))
    check("early_exit_failed", r.get("status") == "failed", repr(r))
    check("early_exit_running", status(src) == "running", dump(src))
    check("early_exit_recovered", *kt.recovered(q))

    q.cmd("migrate", uri="exec:exec sleep 600")
    r = kt.wait_migration(q, kt.slow(20), statuses=("active",) + kt.MIG_FINAL)
    check("stall_active", r.get("status") == "active", repr(r))
    t0 = time.time()
    q.cmd("migrate_cancel")
    r = kt.wait_migration(q, kt.slow(20))
    check("stall_cancelled", r.get("status") == "cancelled", repr(r))
    check("stall_cancel_quick", time.time() - t0 < kt.slow(5), "%.1f s" % (time.time() - t0))
    check("stall_running", status(src) == "running", dump(src))
    check("stall_recovered", *kt.recovered(q))

    # the whole guest within the downtime limit at any pace: the migration
    # ends at its first decision, so what is tested is the command's late
    # exit (under ThreadSanitizer and emulation a sender at 16 MB/s never
    # met 1 s against a guest rewriting its 32 MiB, once in 2 runs)
    kt.set_params(q, downtime_limit=600000)
    q.cmd("migrate", uri="exec:cat > /dev/null; exit 4")
    r = kt.wait_migration(q, kt.slow(60))
    check("late_exit_failed", r.get("status") == "failed" and "status 4" in
          r.get("error-desc", ""), repr(r))
    check("late_exit_paused", status(src) == "paused", dump(src))
    check("late_exit_recovered", *kt.recovered(q))
    q.cmd("cont")
    check("cont_runs", status(src) == "running" and
          src.console.wait(VERIFY_OK, kt.slow(20), start=len(src.console.lines),
                           proc=src.proc) is not None, dump(src))
    check("no_bad", "verify BAD" not in src.console.text(), dump(src))


def restore_fails(d, vms, check, name, path, want):
    dst = kt.kmig_vm(d, name, VERIFY, memory="128M", extra=["--incoming", "file:" + path])
    vms.append(dst)
    rc = dst.wait_exit(kt.slow(60))
    out = dst.output()
    check(name + "_exits_1", rc == 1, "exit %r; %s" % (rc, dump(dst)))
    check(name + "_reason", re.search(want, out) is not None, dump(dst))
    check(name + "_never_ran", "verify ok" not in dst.console.text(), dump(dst))


def test_restore_damaged(d, vms, check):
    """A save cut short, one with a byte changed in its page data, a
    file that is no save and one that begins as a multifd channel does: each restore fails with its reason and exit
    status 1, and the guest never runs there.  The changed byte is the
    negative control of x-verify on this path: without the checksum the
    guest would run with one wrong byte."""
    src = kt.kmig_vm(d, "src", VERIFY, memory="128M")
    vms.append(src)
    if not booted(src, check):
        return
    # stopped first: one pass, every page in the file once, so a changed
    # byte cannot be overwritten by a later copy of its page
    q = src.qmp()
    q.cmd("stop")
    path = os.path.join(d, "vm.sav")
    r = kt.migrate(src, None, "file:" + path, caps={"x-verify": True},
                   params={"max-bandwidth": 0}, timeout=kt.slow(90))
    if not check("saved", r.get("status") == "completed", "%r; %s" % (r, dump(src))):
        return
    data = open(path, "rb").read()
    cut = os.path.join(d, "cut.sav")
    with open(cut, "wb") as f:
        f.write(data[:len(data) // 2])
    restore_fails(d, vms, check, "cut", cut, r"incoming migration failed: .*the stream ended early")
    # a byte inside a page the guest wrote: the 16-byte record headers
    # and offset lists are a few bytes in a thousand, the pages' payload
    # the rest.  A verify page's 8-byte words are a 40-bit hash under a
    # small generation (about 2 zero bytes a word); headers and page
    # offsets are mostly zeros.  So: the first 64 bytes from the middle on
    # with at most 24 zeros
    flip = len(data) // 2
    while flip < len(data) - 4096 and data[flip:flip + 64].count(0) > 24:
        flip += 4096 + 8
    check("flip_found", flip < len(data) - 4096, "no page data found from %d" % (len(data) // 2))
    flipped = os.path.join(d, "flipped.sav")
    with open(flipped, "wb") as f:
        f.write(data[:flip] + bytes([data[flip] ^ 0x40]) + data[flip + 1:])
    restore_fails(d, vms, check, "flipped", flipped, r"checksum mismatch")
    junk = os.path.join(d, "junk.sav")
    with open(junk, "wb") as f:
        f.write(b"GET / HTTP/1.1\r\n" * 64)
    restore_fails(d, vms, check, "junk", junk, r"not a kmig migration stream")
    # a multifd channel's first record header, and the file ends: no
    # later connection comes on a file, so it is refused at once (a
    # listener would hold such a connection for its turn)
    chan = os.path.join(d, "channel.sav")
    with open(chan, "wb") as f:
        f.write(struct.pack("<IIQ", 8, 0, 24))
    restore_fails(d, vms, check, "channel", chan,
                  r"not a kmig migration stream \(it begins with a multifd channel's record\)")
