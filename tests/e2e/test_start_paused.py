"""A destination started paused, as libvirt starts one, and the VM's
identity (QEMU's -S, -uuid, -name; capabilities late-block-activate and
validate-uuid; docs/usage.md, "A destination started paused").

- test_prelaunch: `kmig run -S` boots nothing: status prelaunch (a
  `stop` keeps it so), no round of the guest's own check.  Migrated so
  (x-verify), the guest arrives in prelaunch on a destination without -S
  and still makes no round; the source, which never ran, heard no STOP
  or RESUME; `cont` there sends RESUME and the guest runs.
  query-uuid and query-name say what --uuid and --name set (the nil UUID
  and {} without them); a bad --uuid or --name is refused at start.
- test_autostart: a guest migrated into a -S destination arrives paused
  (x-verify passes, the guest writes nothing there) and runs at `cont`;
  into a destination that got `stop` while it waited, paused too; into a
  -S destination that got `cont` while it waited, running at once.
- test_stop_cont_race: stop and cont sent to a destination as fast as a
  client can, through its whole incoming migration (plain, then -S):
  afterwards the status says what the guest does, and `cont` runs it.
- test_postcopy_paused: a -S destination switched to post-copy receives
  its pages with the guest paused (it never runs before `cont`); x-verify
  passes and `cont` runs it.
- test_late_block_activate: a disk guest on shared storage migrated into
  a -S destination with late-block-activate: the destination leaves the
  image alone (no write lock) until `cont`, so the source, its migration
  completed, can still `cont` (libvirt's way back when the destination's
  side fails after the migration): it takes its image back and the disk
  rounds go on, while the destination's `cont` is refused (no two VMs
  write the image).  Without the capability (the control) the destination
  takes the image at the end of the migration, the source's `cont` is
  refused, and the destination's guest runs at `cont` with no block wrong.
  A disk guest that never ran (-S) arrives in prelaunch with its image
  left; `cont` there takes it and the guest's disk rounds begin.
- test_validate_uuid: with validate-uuid the source's --uuid goes in the
  stream's START: a destination with another UUID refuses the stream
  before it changes anything (the source runs on), one with the same
  UUID takes the guest; saved into a file it goes with the state: a
  restore into another UUID is refused, one into a VM without --uuid takes
  it and says it did not check.
"""
import os
import subprocess
import socket
import threading
import time

import pytest

import kmigtest as kt
import blkguest
from blkguest import CMDLINE as DISK_CMDLINE, bad_lines as disk_bad, blk_args, image
from verifyguest import VERIFY, VERIFY_OK, bad_lines, goes_on

pytestmark = pytest.mark.kvm

MEM = "128M"
UUID_A = "5b3c2b5e-3f7a-4c1e-9d2a-0f6e8b1c4a7d"
UUID_B = "0d4f6a1e-8c2b-4f3a-b5d6-7e8f9a0b1c2d"
NIL = "00000000-0000-0000-0000-000000000000"


def status(vm):
    return vm.qmp().cmd("query-status").get("status")


def quiet(vm, secs):
    """No round of the guest's check on vm's console for secs: it does not run."""
    n = vm.console.count(VERIFY_OK)
    time.sleep(secs)
    return vm.console.count(VERIFY_OK) == n, "%d rounds before, %d after" % (
        n, vm.console.count(VERIFY_OK))


def dest(d, vms, name, uri, extra=(), cmdline=VERIFY, memory=MEM):
    vm = kt.kmig_vm(d, name, cmdline, memory=memory, extra=list(extra) + ["--incoming", uri])
    vms.append(vm)
    return vm


def unix_uri(d, name):
    return "unix:%s/%s.sock" % (d, name)


def error_of(reply):
    return reply.get("error", {}).get("desc", "")


def test_prelaunch(d, vms, check):
    vm = kt.kmig_vm(d, "pre", VERIFY, memory=MEM,
                    extra=["-S", "--uuid", UUID_A.upper(), "--name", "guest=web-1"])
    vms.append(vm)
    q = vm.qmp()
    check("prelaunch", q.cmd("query-status") == {"running": False, "singlestep": False,
                                                   "status": "prelaunch"}, dump(vm))
    check("uuid", q.cmd("query-uuid") == {"UUID": UUID_A}, repr(q.cmd("query-uuid")))
    check("name", q.cmd("query-name") == {"name": "web-1"}, repr(q.cmd("query-name")))
    q.cmd("stop")
    check("stop_keeps_prelaunch", status(vm) == "prelaunch", dump(vm))
    check("not_booted", *quiet(vm, kt.slow(2)))
    # a guest that never ran migrates as it is (QEMU's): it arrives in
    # prelaunch, though the destination has no -S, and runs at `cont`
    uri = unix_uri(d, "pre_dst")
    dst = dest(d, vms, "pre_dst", uri)
    kt.wait_incoming(dst)
    if not migrate_to(check, "from_prelaunch", vm, dst, uri):
        return
    check("src_postmigrate", status(vm) == "postmigrate", dump(vm))
    check("src_no_run_events", not [e for e in q.events if e["event"] in ("STOP", "RESUME")],
          repr(q.events))
    check("dst_prelaunch", status(dst) == "prelaunch", dump(dst))
    check("dst_not_booted", *quiet(dst, kt.slow(2)))
    qd = dst.qmp()
    qd.cmd("cont")
    check("resume_event", qd.wait_event("RESUME", kt.slow(5)) is not None, dump(dst))
    check("running", status(dst) == "running", dump(dst))
    check("boots", dst.console.wait(VERIFY_OK, kt.slow(40), proc=dst.proc) is not None,
          dump(dst))
    # without --uuid and --name: QEMU's answers
    plain = kt.kmig_vm(d, "plain", VERIFY, memory=MEM, extra=["-S"])
    vms.append(plain)
    check("nil_uuid", plain.qmp().cmd("query-uuid") == {"UUID": NIL}, "")
    check("no_name", plain.qmp().cmd("query-name") == {}, "")
    # refused at start, with the reason
    for args, why in ((["--uuid", "5b3c2b5e"], "not a UUID"),
                      (["--uuid", UUID_A + "0"], "not a UUID"),
                      (["--name", "a,b"], "--name a,b"),
                      (["--name", ""], "--name")):
        p = subprocess.run([kt.KMIG, "run", "--kernel", kt.GUEST, "--console", "none"] + args,
                           capture_output=True, text=True, timeout=60)
        check("refused_" + args[0][2:], p.returncode != 0 and why in p.stderr,
              "%r: rc %d %s" % (args, p.returncode, p.stderr[-300:]))


def dump(vm, n=15):
    return kt.dump(vm, n)


def boot(d, vms, check, extra=()):
    """The source, its guest's check running; None (the check failed) if not."""
    src = kt.kmig_vm(d, "src", VERIFY, memory=MEM, extra=list(extra))
    vms.append(src)
    ok = src.console.wait(VERIFY_OK, kt.slow(40), proc=src.proc) is not None
    return src if check("boots", ok, dump(src)) else None


def running(check, vm, name):
    """The guest runs: its check goes on (no page bad) and the status says so."""
    goes_on(check, vm, name)
    check(name + "_running", status(vm) == "running", dump(vm))


def migrate_to(check, name, src, dst, uri, caps=None):
    """x-verify on; the whole guest within the downtime limit at any pace,
    so the migration ends at its first decision (what is tested is the
    run state it leaves, and under ThreadSanitizer a sender never caught
    up with the guest rewriting its 32 MiB: 12 GB in 9 minutes)."""
    r = kt.migrate(src, dst, uri, caps=dict({"x-verify": True}, **(caps or {})),
                   params={"downtime-limit": 600000}, timeout=kt.slow(90))
    ok = check(name + "_completed", r.get("status") == "completed",
               "%r; src %s; dst %s" % (r, dump(src), dump(dst)))
    # the destination says completed before it confirms to the source
    now = dst.qmp().cmd("query-migrate").get("status")
    check(name + "_dst_completed_first", not ok or now == "completed", now)
    rr = kt.wait_migration(dst.qmp(), kt.slow(30))
    ok = check(name + "_dst_completed", rr.get("status") == "completed",
               "%r; %s" % (rr, dump(dst))) and ok
    return ok


def test_autostart(d, vms, check):
    src = boot(d, vms, check)
    if not src:
        return
    # -S: arrives paused, runs at cont
    uri = unix_uri(d, "a")
    a = dest(d, vms, "a", uri, ["-S"])
    kt.wait_incoming(a)
    check("a_inmigrate", status(a) == "inmigrate", dump(a))
    if not migrate_to(check, "a", src, a, uri):
        return
    qa = a.qmp()
    check("a_paused", qa.cmd("query-status") == {"running": False, "singlestep": False,
                                                  "status": "paused"}, dump(a))
    check("a_quiet", *quiet(a, kt.slow(2)))
    check("src_postmigrate", status(src) == "postmigrate", dump(src))
    qa.cmd("cont")
    check("a_resume_event", qa.wait_event("RESUME", kt.slow(5)) is not None, dump(a))
    running(check, a, "a")
    # stop while it waits: arrives paused
    uri = unix_uri(d, "b")
    b = dest(d, vms, "b", uri)
    kt.wait_incoming(b)
    b.qmp().cmd("stop")
    check("b_still_inmigrate", status(b) == "inmigrate", dump(b))
    if not migrate_to(check, "b", a, b, uri):
        return
    check("b_paused", status(b) == "paused", dump(b))
    check("b_quiet", *quiet(b, kt.slow(2)))
    b.qmp().cmd("cont")
    running(check, b, "b")
    # -S, then cont while it waits: runs at once
    uri = unix_uri(d, "c")
    c = dest(d, vms, "c", uri, ["-S"])
    kt.wait_incoming(c)
    c.qmp().cmd("cont")
    check("c_still_inmigrate", status(c) == "inmigrate", dump(c))
    if not migrate_to(check, "c", b, c, uri):
        return
    running(check, c, "c")
    bad = bad_lines(src) + bad_lines(a) + bad_lines(b) + bad_lines(c)
    check("no_page_wrong", not bad, " / ".join(bad[:4]))


def run_events(q):
    """The STOP and RESUME events q received, in order, once nothing
    changes the run state any more: a last command's reply comes after
    every event queued before it."""
    q.cmd("query-status")
    q.sock.settimeout(0.2)
    try:
        while True:
            q.events.append(q._read())
    except (socket.timeout, EOFError):
        pass
    return [e["event"] for e in q.events if e["event"] in ("STOP", "RESUME")]


def test_stop_cont_race(d, vms, check):
    """A second client sends stop and cont to the destination as fast as
    it can while it waits, while the stream loads and as inmigrate ends
    (plain, then -S): afterwards the status must say what the guest does
    (running: its check goes on; paused: no round), and `cont` runs it.
    A stop or cont lost between the decision and the end of inmigrate, or
    a pause level kept or dropped twice, shows as a status that lies."""
    src = boot(d, vms, check)
    if not src:
        return
    for i, extra in enumerate(([], ["-S"])):
        name = "h%d" % i
        uri = unix_uri(d, name)
        dst = dest(d, vms, name, uri, extra)
        kt.wait_incoming(dst)
        spam = kt.QMP(dst.qmp_path)
        done = threading.Event()
        sent = [0]

        def hammer():
            while not done.is_set():
                spam.cmd_full("stop" if sent[0] % 2 == 0 else "cont")
                sent[0] += 1

        t = threading.Thread(target=hammer, daemon=True)
        t.start()
        ok = migrate_to(check, name, src, dst, uri)
        time.sleep(kt.slow(0.5))
        done.set()
        t.join(10)
        if not check(name + "_hammer_ended", not t.is_alive(), ""):
            return
        told = run_events(spam)
        spam.close()
        print("# %s: %d stop/cont sent, %d STOP/RESUME events" % (name, sent[0], len(told)))
        if not ok:
            return
        # each change of the run state told once, in the order made: from
        # inmigrate (not running) RESUME and STOP alternate, and the last
        # says what the status says
        check(name + "_events_in_order", all(e == ("RESUME", "STOP")[i % 2]
                                             for i, e in enumerate(told)),
              " ".join(told[:40]))
        check(name + "_last_event_true", (len(told) % 2 == 1) == (status(dst) == "running"),
              "%d events, last %s, status %s" % (len(told), told[-1:], status(dst)))
        if status(dst) == "paused":
            check(name + "_paused_quiet", *quiet(dst, kt.slow(2)))
            dst.qmp().cmd("cont")
        running(check, dst, name)
        src = dst


def test_postcopy_paused(d, vms, check):
    """A -S destination switched to post-copy: its pages come while the
    guest stays paused (the source gave up its copy: the destination
    holds the guest), then `cont` runs it with every page right."""
    src = boot(d, vms, check)
    if not src:
        return
    uri = unix_uri(d, "pc")
    dst = dest(d, vms, "pc", uri, ["-S"])
    kt.wait_incoming(dst)
    kt.set_caps(dst.qmp(), postcopy_ram=True)
    q = src.qmp()
    kt.set_caps(q, postcopy_ram=True, x_verify=True)
    kt.set_params(q, max_bandwidth=16 << 20, max_postcopy_bandwidth=16 << 20)
    q.cmd("migrate", uri=uri)
    kt.after_bulk_pass(q, kt.slow(60))
    q.cmd("migrate-start-postcopy")
    seen = set()
    dq = dst.qmp()
    deadline = time.time() + kt.slow(90)
    while time.time() < deadline:
        r = q.cmd("query-migrate")
        seen.add((r.get("status"), status(dst)))
        if r.get("status") in ("completed", "failed", "cancelled"):
            break
        time.sleep(0.05)
    check("completed", r.get("status") == "completed", "%r; src %s; dst %s"
          % (r, dump(src), dump(dst)))
    check("postcopy_while_paused", ("postcopy-active", "paused") in seen, repr(seen))
    check("never_ran", not any(st == "running" for _, st in seen), repr(seen))
    rr = kt.wait_migration(dq, kt.slow(30))
    check("dst_completed", rr.get("status") == "completed", "%r; %s" % (rr, dump(dst)))
    check("x_verify", kt.wait_output(dst, r"x-verify: every page as it came matches",
                                     kt.slow(5)) is not None, dst.output()[-400:])
    check("paused_after", status(dst) == "paused", dump(dst))
    check("quiet", *quiet(dst, kt.slow(2)))
    dq.cmd("cont")
    running(check, dst, "dst")


def block(vm):
    b = vm.qmp().cmd("query-block")
    return b[0] if b else {}


def disk_dest(d, vms, name, img, uri, late):
    vm = dest(d, vms, name, uri, blk_args(img) + ["-S"],
              cmdline=DISK_CMDLINE, memory="256M")
    if late:
        kt.wait_incoming(vm)
        kt.set_caps(vm.qmp(), late_block_activate=True)
    return vm


def test_late_block_activate(d, vms, check):
    img = image(d)
    src = blkguest.start(d, vms, check, "src", img)
    if not src:
        return
    q = src.qmp()
    # late-block-activate: the source can go back
    uri = unix_uri(d, "late")
    late = disk_dest(d, vms, "late", img, uri, True)
    if not migrate_to(check, "late", src, late, uri):
        return
    b = block(late)
    check("late_not_taken", b.get("x-active") is False and b.get("x-image-lock") != "write",
          repr(b))
    check("late_paused", status(late) == "paused", dump(late))
    reply = q.cmd_full("cont")
    check("src_cont", "return" in reply and status(src) == "running", repr(reply))
    sb = block(src)
    check("src_took_back", sb.get("x-active") is True and sb.get("x-image-lock") == "write",
          repr(sb))
    check("src_disk_goes_on", blkguest.goes_on(src, kt.slow(60)), dump(src))
    err = error_of(late.qmp().cmd_full("cont"))
    check("late_cont_refused", "in use by another process" in err and
          status(late) == "paused", "%s; %s" % (err, dump(late)))
    late.qmp().cmd("quit")
    late.wait_exit(kt.slow(20))
    # the control: without it the destination takes the image at once
    uri = unix_uri(d, "early")
    early = disk_dest(d, vms, "early", img, uri, False)
    if not migrate_to(check, "early", src, early, uri):
        return
    b = block(early)
    check("early_taken", b.get("x-active") is True and b.get("x-image-lock") == "write",
          repr(b))
    check("early_paused", status(early) == "paused", dump(early))
    err = error_of(q.cmd_full("cont"))
    check("src_cont_refused", "in use by another process" in err and
          status(src) == "postmigrate", err)
    early.qmp().cmd("cont")
    check("early_disk_goes_on", blkguest.goes_on(early, kt.slow(60)), dump(early))
    # a guest that never ran arrives in prelaunch, the image left: `cont`
    # there takes it, and the guest's first disk rounds come
    img2 = image(d, "never.img")
    pre = kt.kmig_vm(d, "never", DISK_CMDLINE, memory="256M", extra=blk_args(img2) + ["-S"])
    vms.append(pre)
    uri = unix_uri(d, "never_dst")
    never = disk_dest(d, vms, "never_dst", img2, uri, True)
    if not migrate_to(check, "never", pre, never, uri):
        return
    b = block(never)
    check("never_not_taken", status(never) == "prelaunch" and b.get("x-active") is False,
          "%r; %s" % (b, dump(never)))
    never.qmp().cmd("cont")
    b = block(never)
    check("never_cont_takes", b.get("x-active") is True and b.get("x-image-lock") == "write",
          repr(b))
    check("never_disk_runs", never.console.wait(r"^disk ok round=", kt.slow(90),
                                                proc=never.proc) is not None, dump(never))
    bad = disk_bad(src) + disk_bad(late) + disk_bad(early) + disk_bad(never)
    check("no_block_wrong", not bad, " / ".join(bad[:4]))


def test_validate_uuid(d, vms, check):
    src = boot(d, vms, check, ["--uuid", UUID_A])
    if not src:
        return
    q = src.qmp()
    kt.set_caps(q, validate_uuid=True)
    # another UUID: refused at START, the source runs on
    uri = unix_uri(d, "other")
    other = dest(d, vms, "other", uri, ["--uuid", UUID_B])
    r = kt.migrate(src, other, uri, timeout=kt.slow(60))
    check("mismatch_failed", r.get("status") == "failed" and
          "validate-uuid" in r.get("error-desc", ""), repr(r))
    rc = other.wait_exit(kt.slow(20))
    why = "the source VM's UUID is %s, this VM's is %s" % (UUID_A, UUID_B)
    check("mismatch_said", rc == 1 and why in other.output(),
          "rc %r: %s" % (rc, other.output()[-400:]))
    running(check, src, "src")
    # the same UUID
    uri = unix_uri(d, "same")
    same = dest(d, vms, "same", uri, ["--uuid", UUID_A])
    if not migrate_to(check, "same", src, same, uri):
        return
    running(check, same, "same")
    # saved into a file, the UUID goes with it: restored into another
    # UUID, refused; into a VM with none, taken and not checked
    kt.set_caps(same.qmp(), validate_uuid=True)
    path = os.path.join(d, "vm.state")
    r = kt.migrate(same, None, "file:" + path, params={"downtime-limit": 600000},
                   timeout=kt.slow(90))
    if not check("saved", r.get("status") == "completed", "%r; %s" % (r, dump(same))):
        return
    wrong = dest(d, vms, "wrong", "file:" + path, ["--uuid", UUID_B])
    rc = wrong.wait_exit(kt.slow(30))
    check("restore_refused", rc == 1 and why in wrong.output(),
          "rc %r: %s" % (rc, wrong.output()[-400:]))
    none = dest(d, vms, "none", "file:" + path)
    rr = kt.wait_migration(none.qmp(), kt.slow(60))
    check("none_restored", rr.get("status") == "completed", "%r; %s" % (rr, dump(none)))
    check("none_warned", "this VM has none (--uuid): not checked" in none.output(),
          none.output()[-400:])
    running(check, none, "none")
