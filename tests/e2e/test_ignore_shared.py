"""x-ignore-shared (QEMU's capability) with guest RAM in a shared memory
file (--object memory-backend-file,share=on): a second kmig on the same
host takes the running guest over and not one page of RAM is copied; or
the VM is saved as device state only and restored by a new kmig.

- test_local_update: a verify guest, migrated over a unix socket to a
  kmig mapping the same file: completed with no page sent, the guest
  writes on at the destination, x-verify (the RAM's hash, taken at the
  source with the guest stopped, against the destination's view) passes;
  the source cannot `cont` (the destination owns the RAM now), and a third
  kmig cannot boot on the file.
- test_restart_file: the same through a state file (a restart of kmig
  with the guest's RAM left in place): restored once; restored a second
  time it is refused (the RAM's trailer no longer holds the token the file
  was saved with).  With x-verify in the file, the RAM the second restore
  would have run on is shown to differ from the one saved (END's hash):
  what the token check refuses is real data loss.
- test_copy_refused: the destination maps a copy of the file taken while
  the guest ran: refused at the switchover; the source takes its RAM back
  and the guest goes on there.
- test_late_failure: an exec: command that fails after the whole state
  went (no answer can come): with anonymous RAM the source must stay
  paused, not knowing whether a destination runs the guest; here the file
  says nobody took the RAM, so the source takes it back and runs on.
- test_refused_dest: a stream that sends pages into the file the source
  still owns, and a hand-over to a VM whose RAM is not in a file: refused,
  the source goes on.
- test_pages_either_way: ordinary migrations (every page sent) from a VM
  whose RAM is a file to one with anonymous RAM and back, x-verify on:
  dirty logging over a shared mapping.
- test_refusals: the command line's and QMP's refusals.
- test_cli: `kmig migrate --ignore-shared` to a file; `cont` takes the
  RAM back.
"""
import os
import shutil
import subprocess

import pytest

import kmigtest as kt
from verifyguest import VERIFY, VERIFY_OK, goes_on

pytestmark = pytest.mark.kvm

MEM = "128M"
SHARED = {"x-ignore-shared": True, "x-verify": True}


def mem_args(path, size=MEM, share="on"):
    return ["--object", "memory-backend-file,id=ram0,size=%s,mem-path=%s,share=%s"
            % (size, path, share), "--machine", "memory-backend=ram0"]


def dump(vm, n=15):
    return kt.dump(vm, n)


def status(vm):
    return vm.qmp().cmd("query-status").get("status")


def boot(d, vms, check, mf, name="src"):
    extra = mem_args(mf) if mf else []
    vm = kt.kmig_vm(d, name, VERIFY, memory=MEM, extra=extra)
    vms.append(vm)
    ok = check(name + "_boots", vm.console.wait(VERIFY_OK, kt.slow(40), proc=vm.proc)
               is not None, dump(vm))
    return vm if ok else None


def dest(d, vms, name, mf, incoming):
    extra = (mem_args(mf) if mf else []) + ["--incoming", incoming]
    vm = kt.kmig_vm(d, name, VERIFY, memory=MEM, extra=extra)
    vms.append(vm)
    return vm


def no_pages(r):
    ram = r.get("ram", {})
    return ram.get("normal") == 0 and ram.get("duplicate") == 0, repr(ram)


def cont_refused(vm):
    reply = vm.qmp().cmd_full("cont")
    return "in use by another VM" in reply.get("error", {}).get("desc", ""), repr(reply)


def fresh_boot_refused(d, mf):
    """A third kmig booting on the file exits at once, saying it is in use."""
    args = [kt.KMIG, "run", "--kernel", kt.GUEST, "--memory", MEM, "--console", "none"] + \
        mem_args(mf)
    p = subprocess.run(args, capture_output=True, text=True, timeout=60)
    return p.returncode != 0 and "in use by another VM" in p.stderr, p.stderr[-400:]


def test_local_update(d, vms, check):
    mf = os.path.join(d, "ram")
    src = boot(d, vms, check, mf)
    if not src:
        return
    sock = os.path.join(d, "mig.sock")
    # the capability at the source only: the stream tells the destination
    dst = dest(d, vms, "dst", mf, "unix:" + sock)
    r = kt.migrate(src, dst, "unix:" + sock, caps=SHARED, timeout=kt.slow(60))
    print("# local update: status %s, total-time %s ms, downtime %s ms, transferred %s bytes"
          % (r.get("status"), r.get("total-time"), r.get("downtime"),
             r.get("ram", {}).get("transferred")))
    check("completed", r.get("status") == "completed", "%r; %s" % (r, dump(src)))
    check("no_page_sent", *no_pages(r))
    check("state_only", r.get("ram", {}).get("transferred", 1 << 30) < (1 << 20), repr(r))
    rr = kt.wait_migration(dst.qmp(), kt.slow(30))
    check("dst_completed", rr.get("status") == "completed" and status(dst) == "running",
          "%r; %s" % (rr, dump(dst)))
    check("dst_no_page", *no_pages(rr))
    goes_on(check, dst, "dst", n=3)
    check("src_postmigrate", status(src) == "postmigrate", dump(src))
    check("src_cont_refused", *cont_refused(src))
    check("third_refused", *fresh_boot_refused(d, mf))
    goes_on(check, dst, "dst_still", n=1)


def save(check, src, path, caps):
    r = kt.migrate(src, None, "file:" + path, caps=caps, timeout=kt.slow(60))
    check("saved", r.get("status") == "completed", "%r; %s" % (r, dump(src)))
    size = os.path.getsize(path) if os.path.exists(path) else -1
    check("file_is_state_only", 0 < size < (1 << 20), "%d bytes" % size)
    return r


def restore(d, vms, name, mf, path):
    vm = dest(d, vms, name, mf, "file:" + path)
    return vm, kt.wait_migration(vm.qmp(), kt.slow(60))


def restore_fails(d, vms, check, name, mf, path, want):
    """The restore exits 1 with want in its output; the guest never ran."""
    vm = dest(d, vms, name, mf, "file:" + path)
    rc = vm.wait_exit(kt.slow(60))
    out = vm.output()
    check(name + "_exits_1", rc == 1, "exit %r; %s" % (rc, dump(vm)))
    check(name + "_reason", want in out, out[-600:])
    check(name + "_never_ran", "verify ok" not in vm.console.text(), dump(vm))
    return out


def test_restart_file(d, vms, check):
    mf = os.path.join(d, "ram")
    src = boot(d, vms, check, mf)
    if not src:
        return
    plain = os.path.join(d, "vm.state")
    save(check, src, plain, {"x-ignore-shared": True})
    src.kill()
    dst, rr = restore(d, vms, "dst", mf, plain)
    check("restored", rr.get("status") == "completed" and status(dst) == "running",
          "%r; %s" % (rr, dump(dst)))
    goes_on(check, dst, "dst", n=2)
    # saved again, now with x-verify, from the restored guest
    verified = os.path.join(d, "vm-verify.state")
    save(check, dst, verified, SHARED)
    dst.kill()
    # the first file again: its RAM has moved on (the restored guest ran)
    restore_fails(d, vms, check, "again", mf, plain,
                  "does not hold the RAM that was handed over")
    # the second file, restored once and run, then again: x-verify shows
    # that RAM is not the one saved
    ok, rk = restore(d, vms, "ok", mf, verified)
    check("verified_restore", rk.get("status") == "completed", "%r; %s" % (rk, dump(ok)))
    goes_on(check, ok, "ok", n=1)
    ok.kill()
    out = restore_fails(d, vms, check, "bad", mf, verified, "checksum mismatch")
    print("# the second restore of the x-verify file: %s" %
          [l for l in out.splitlines() if "mismatch" in l][:1])


def test_copy_refused(d, vms, check):
    mf = os.path.join(d, "ram")
    src = boot(d, vms, check, mf)
    if not src:
        return
    copy = os.path.join(d, "ram-copy")
    shutil.copyfile(mf, copy)   # taken while the guest runs: not a hand-over
    sock = os.path.join(d, "mig.sock")
    dst = dest(d, vms, "dst", copy, "unix:" + sock)
    # no x-verify: its hash at END would see the copy's other RAM before
    # the token is looked at
    r = kt.migrate(src, dst, "unix:" + sock, caps={"x-ignore-shared": True},
                   timeout=kt.slow(60))
    check("failed", r.get("status") == "failed", repr(r))
    check("says_why", "does not hold the RAM" in (r.get("error-desc") or ""), repr(r))
    check("src_running", status(src) == "running", dump(src))
    goes_on(check, src, "src", n=2)
    check("dst_exits", dst.wait_exit(kt.slow(20)) not in (None, 0), dump(dst))
    # and the RAM is the source's again: a save and restore work
    path = os.path.join(d, "vm.state")
    save(check, src, path, SHARED)
    src.kill()
    back, rb = restore(d, vms, "back", mf, path)
    check("restored", rb.get("status") == "completed", "%r; %s" % (rb, dump(back)))
    goes_on(check, back, "back", n=1)


def test_late_failure(d, vms, check):
    mf = os.path.join(d, "ram")
    src = boot(d, vms, check, mf)
    if not src:
        return
    q = src.qmp()
    kt.set_caps(q, x_ignore_shared=True)
    q.cmd("migrate", uri="exec:cat > /dev/null; exit 4")
    r = kt.wait_migration(q, kt.slow(60))
    check("failed", r.get("status") == "failed" and "status 4" in r.get("error-desc", ""),
          repr(r))
    check("handed_and_back", r.get("x-ignore-shared", {}).get("handed-over") is False, repr(r))
    check("took_back", "it is this VM's again" in src.output(), src.output()[-600:])
    check("says_it_runs", "stays paused" not in r.get("error-desc", ""), repr(r))
    check("src_running", status(src) == "running", dump(src))
    goes_on(check, src, "src", n=2)


@pytest.mark.parametrize("how", ["without-cap", "anonymous-dest"])
def test_refused_dest(d, vms, check, how):
    """without-cap: the source sends pages (no x-ignore-shared) to a kmig
    on its own file, which would write into the running guest's RAM: the
    destination refuses (the source owns the file).  anonymous-dest: the
    RAM is handed over to a kmig whose RAM is not in a file.  The source
    goes on, its dirty tracking off."""
    mf = os.path.join(d, "ram")
    src = boot(d, vms, check, mf)
    if not src:
        return
    sock = os.path.join(d, "mig.sock")
    without = how == "without-cap"
    dst = dest(d, vms, "dst", mf if without else None, "unix:" + sock)
    r = kt.migrate(src, dst, "unix:" + sock, caps={"x-verify": True} if without else SHARED,
                   timeout=kt.slow(60))
    check("failed", r.get("status") == "failed", repr(r))
    want = "in use by another VM" if without else "not in one"
    check("says_why", want in (r.get("error-desc") or ""), repr(r))
    check("src_running", status(src) == "running", dump(src))
    check("src_tracking_off", *kt.recovered(src.qmp()))
    goes_on(check, src, "src", n=2)


def test_pages_either_way(d, vms, check):
    mf = os.path.join(d, "ram")
    src = boot(d, vms, check, mf)
    if not src:
        return
    sock = os.path.join(d, "a.sock")
    mid = dest(d, vms, "mid", None, "unix:" + sock)
    r = kt.migrate(src, mid, "unix:" + sock, caps={"x-verify": True}, timeout=kt.slow(120))
    check("to_anonymous", r.get("status") == "completed" and
          r.get("ram", {}).get("normal", 0) > 0, repr(r))
    goes_on(check, mid, "mid", n=2)
    src.kill()
    sock2 = os.path.join(d, "b.sock")
    mf2 = os.path.join(d, "ram2")
    back = dest(d, vms, "back", mf2, "unix:" + sock2)
    r2 = kt.migrate(mid, back, "unix:" + sock2, caps={"x-verify": True}, timeout=kt.slow(120))
    check("to_file", r2.get("status") == "completed", repr(r2))
    goes_on(check, back, "back", n=2)
    check("file_sized", os.path.getsize(mf2) == (128 << 20) + 4096, os.path.getsize(mf2))


def run_dies(args, want):
    p = subprocess.run([kt.KMIG, "run", "--kernel", kt.GUEST, "--console", "none"] + args,
                       capture_output=True, text=True, timeout=60)
    return p.returncode != 0 and want in p.stderr, p.stderr[-300:]


def test_refusals(d, vms, check):
    mf = os.path.join(d, "ram")
    check("share_off", *run_dies(mem_args(mf, share="off"), "share=on is required"))
    check("no_machine", *run_dies(mem_args(mf)[:2], "add --machine memory-backend=ram0"))
    check("size_differs", *run_dies(["--memory", "256M"] + mem_args(mf),
                                    "--memory is 256 MiB but memory backend ram0"))
    check("no_backend", *run_dies(["--machine", "memory-backend=x"], "no memory-backend-file"))
    with open(os.path.join(d, "odd"), "wb") as f:
        f.write(b"x" * 4096)
    check("odd_size", *run_dies(mem_args(os.path.join(d, "odd")) + ["--incoming", "defer"],
                                "holds 4096 bytes"))
    src = boot(d, vms, check, mf)
    if not src:
        return
    q = src.qmp()
    for cap in ("postcopy-ram", "multifd", "x-block-migration", "background-snapshot"):
        reply = q.cmd_full("migrate-set-capabilities", capabilities=[
            {"capability": "x-ignore-shared", "state": True},
            {"capability": cap, "state": True}])
        err = reply.get("error", {}).get("desc", "")
        check("refuses_" + cap, "x-ignore-shared is not compatible with " + cap in err,
              repr(reply))
    check("src_running", status(src) == "running", dump(src))


def test_cli(d, vms, check):
    """kmig migrate --ignore-shared saves the VM as state only; the summary
    says where the RAM is; `cont` takes it back (nobody restored it) and
    the guest runs on."""
    mf = os.path.join(d, "ram")
    src = boot(d, vms, check, mf)
    if not src:
        return
    path = os.path.join(d, "vm.state")
    cli = subprocess.run([kt.KMIG, "migrate", "--qmp", "unix:" + src.qmp_path,
                          "--ignore-shared", "--verify", "file:" + path],
                         capture_output=True, text=True, timeout=kt.slow(120))
    print("# cli: %s" % cli.stdout.strip().replace("\n", " / "))
    check("cli_ok", cli.returncode == 0 and "status completed" in cli.stdout and
          "RAM: handed over in %s, not sent" % mf in cli.stdout,
          "%s %r %r" % (cli.returncode, cli.stdout[-500:], cli.stderr[-500:]))
    check("state_only", os.path.getsize(path) < (1 << 20), os.path.getsize(path))
    check("src_postmigrate", status(src) == "postmigrate", dump(src))
    q = src.qmp()
    q.cmd("cont")
    check("src_running", status(src) == "running", dump(src))
    check("not_handed", q.cmd("query-migrate").get("x-ignore-shared", {}).get("handed-over")
          is False, repr(q.cmd("query-migrate")))
    goes_on(check, src, "src")
    refused = subprocess.run([kt.KMIG, "migrate", "--qmp", "unix:" + src.qmp_path,
                              "--ignore-shared", "--postcopy", "auto", "unix:/nowhere"],
                             capture_output=True, text=True, timeout=30)
    check("cli_refuses", refused.returncode != 0 and "--ignore-shared takes none of"
          in refused.stderr, refused.stderr)
