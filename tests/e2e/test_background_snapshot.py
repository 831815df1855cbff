"""background-snapshot (QEMU's capability): the guest's RAM and devices
saved as they were at one instant while the guest runs on, then restored
by a new kmig.

- test_snapshot_restore: a verify guest writing all the while; the
  snapshot written to a file at a limited bandwidth, so the guest writes
  pages the snapshot has not read yet (their writes wait, write-faults >
  0); the source runs on throughout; the restored guest checks every page
  against its own expectations (no `verify BAD`) and x-verify checks the
  destination's RAM against the page sum of what was sent.
- test_catches (negative control; the build-san binary): KMIG_FAULT=
  snapshot-unprotected lifts the write protection as soon as it is set, so
  the file holds each page as the scan found it, from instants seconds
  apart: the restored guest must find that (`verify BAD`, or it fails).
- test_disk_busy: the same while the guest reads and writes its disk:
  the disk workers' writes into guest RAM wait as the vCPU's do.
- test_ends: a cancel, and an exec: command that fails, in the middle of
  a snapshot: the guest is released from write protection and goes on.
- test_refusals: the capabilities it does not go with, and a URI that
  would start a second copy of the guest.
"""
import os
import subprocess
import time

import pytest

import blkguest
import kmigtest as kt
from verifyguest import VERIFY, VERIFY_OK, bad_lines, goes_on, rounds

pytestmark = pytest.mark.kvm

CAPS = {"background-snapshot": True, "x-verify": True}
# 32 MiB of the guest's data at 4 MB/s: seconds during which it writes
SLOW = {"max-bandwidth": 4 << 20}


def dump(vm, n=15):
    return kt.dump(vm, n)


def status(vm):
    return vm.qmp().cmd("query-status").get("status")


def boot(d, vms, check, name="src", kmig=None, env=None):
    vm = kt.kmig_vm(d, name, VERIFY, memory="128M", kmig=kmig, env=env)
    vms.append(vm)
    ok = check("boot", vm.console.wait(VERIFY_OK, kt.slow(40), proc=vm.proc) is not None,
               dump(vm))
    return vm if ok else None


def snapshot(check, src, path, caps=CAPS, params=SLOW):
    """Takes the snapshot; returns the final query-migrate reply and the
    run states the source was seen in meanwhile."""
    q = src.qmp()
    q.cmd("migrate-set-capabilities",
          capabilities=[{"capability": k, "state": v} for k, v in caps.items()])
    q.cmd("migrate-set-parameters", **params)
    q.cmd("migrate", uri="file:" + path)
    states = set()
    deadline = time.time() + kt.slow(120)
    while True:
        r = q.cmd("query-migrate")
        states.add(q.cmd("query-status").get("status"))
        if r.get("status") in kt.MIG_FINAL or time.time() > deadline:
            break
        time.sleep(0.1)
    snap = r.get("x-background-snapshot", {})
    print("# snapshot: status %s, total-time %s ms, downtime %s ms, transferred %s, %r; "
          "source states %r" % (r.get("status"), r.get("total-time"), r.get("downtime"),
                                r.get("ram", {}).get("transferred"), snap, sorted(states)))
    check("completed", r.get("status") == "completed", "%r; %s" % (r, dump(src)))
    check("released", r.get("x-write-protect") is False, repr(r))
    return r, states


def restore(d, vms, path):
    dst = kt.kmig_vm(d, "dst", VERIFY, memory="128M", extra=["--incoming", "file:" + path])
    vms.append(dst)
    return dst, kt.wait_migration(dst.qmp(), kt.slow(60))


def test_snapshot_restore(d, vms, check):
    src = boot(d, vms, check)
    if not src:
        return
    path = os.path.join(d, "vm.snap")
    r, states = snapshot(check, src, path)
    snap = r.get("x-background-snapshot", {})
    # the guest wrote pages the snapshot had not read: those writes waited
    check("writes_waited", snap.get("write-faults", 0) > 0 and snap.get("pages-ahead", 0) > 0,
          repr(snap))
    # the waits above show it ran meanwhile; it was never seen stopped
    check("src_ran_on", states <= {"running", "finish-migrate"}, repr(states))
    check("src_running", status(src) == "running", dump(src))
    check("src_tracking_off", *kt.recovered(src.qmp()))
    goes_on(check, src, "src")
    dst, rr = restore(d, vms, path)
    # x-verify: the destination's RAM matches the page sum of what was sent
    check("restored", rr.get("status") == "completed" and status(dst) == "running",
          "%r; %s" % (rr, dump(dst)))
    goes_on(check, dst, "dst", n=3)
    got = rounds(dst)
    check("dst_rounds_grow", got == sorted(got) and len(set(got)) == len(got), repr(got))


def ended(vm):
    """Whether the guest has failed: its VMM exited, or says it stopped.
    A VMM that exits between the two looks resets the QMP connection;
    that is the same ending, seen a moment later (CI run of e4b2085)."""
    if vm.proc.poll() is not None:
        return True
    try:
        return status(vm) in ("guest-panicked", "internal-error", "shutdown")
    except (OSError, EOFError):
        vm.proc.wait(timeout=kt.slow(10))
        return True


def test_catches(d, vms, check):
    """Without x-verify (whose page sum, taken a moment before each page
    is sent, would see a page change in between when nothing protects
    it): the guest's own check is what must find the torn instant."""
    if not os.path.exists(kt.KMIG_FAULTS):
        pytest.fail("no fault build at %s (make SAN=1)" % kt.KMIG_FAULTS)
    src = boot(d, vms, check, kmig=kt.KMIG_FAULTS, env={"KMIG_FAULT": "snapshot-unprotected"})
    if not src:
        return
    path = os.path.join(d, "vm.snap")
    r, _ = snapshot(check, src, path, caps={"background-snapshot": True})
    check("fault_injected", "fault injected: snapshot-unprotected" in src.output(), dump(src))
    check("nothing_waited", r.get("x-background-snapshot", {}).get("write-faults") == 0,
          repr(r))
    dst, rr = restore(d, vms, path)
    check("restored", rr.get("status") == "completed", "%r; %s" % (rr, dump(dst)))
    deadline = time.time() + kt.slow(30)
    failed = None
    while time.time() < deadline and not bad_lines(dst) and not failed:
        time.sleep(0.2)
        dst.console.poll()
        failed = ended(dst)
    print("# catches: %s" % (" / ".join(bad_lines(dst)[:3]) or "the guest failed"))
    check("guest_finds_it", bad_lines(dst) != [] or failed, dump(dst))
    # the guest may fail; its VMM may end with it, but not by a signal
    rc = dst.proc.poll()
    check("vmm_not_killed", rc is None or rc >= 0, "exit %s; %s" % (rc, dump(dst)))


def test_disk_busy(d, vms, check):
    """A guest that reads and rewrites its disk all the while (blkguest's
    workload beside verify): kmig's disk workers write the blocks they
    read, and the used ring, into guest RAM, and those writes wait on the
    protection as the vCPU's do.  The snapshot completes and the disk
    goes on, no request failed.  (The disk is not in a snapshot, so no
    restore here: the image has moved on from the instant.)"""
    img = blkguest.image(d)
    src = blkguest.start(d, vms, check, "src", img)
    if not src:
        return
    r, _ = snapshot(check, src, os.path.join(d, "vm.snap"))
    check("writes_waited", r.get("x-background-snapshot", {}).get("write-faults", 0) > 0,
          repr(r))
    check("disk_goes_on", blkguest.goes_on(src, kt.slow(60)), dump(src))
    check("no_bad", not blkguest.bad_lines(src), " / ".join(blkguest.bad_lines(src)[:5]))
    b = (src.qmp().cmd("query-block") or [{}])[0]
    check("io_ok", b.get("io-status") == "ok" and status(src) == "running", repr(b))


@pytest.mark.parametrize("how", ["cancel", "exec-fails"])
def test_ends(d, vms, check, how):
    src = boot(d, vms, check)
    if not src:
        return
    q = src.qmp()
    q.cmd("migrate-set-capabilities",
          capabilities=[{"capability": "background-snapshot", "state": True}])
    if how == "cancel":
        q.cmd("migrate-set-parameters", **{"max-bandwidth": 1 << 20})
        q.cmd("migrate", uri="file:" + os.path.join(d, "vm.snap"))
        deadline = time.time() + kt.slow(60)
        while time.time() < deadline:
            r = q.cmd("query-migrate")
            if r.get("x-background-snapshot", {}).get("write-faults", 0) > 0 or \
                    r.get("status") in kt.MIG_FINAL:
                break
            time.sleep(0.1)
        check("protected_meanwhile", r.get("x-write-protect") is True, repr(r))
        q.cmd("migrate_cancel")
        want = "cancelled"
    else:       # the command reads 1 MB, then exits 1
        q.cmd("migrate-set-parameters", **{"max-bandwidth": 4 << 20})
        q.cmd("migrate", uri="exec:head -c 1000000 > /dev/null; exit 1")
        want = "failed"
    r = kt.wait_migration(q, kt.slow(60))
    print("# %s: %r" % (how, {k: r.get(k) for k in ("status", "error-desc", "x-write-protect",
                                                     "x-background-snapshot")}))
    check(want, r.get("status") == want, repr(r))
    check("released", r.get("x-write-protect") is False, repr(r))
    check("src_running", status(src) == "running", dump(src))
    check("src_tracking_off", *kt.recovered(q))
    goes_on(check, src, "src")


def test_refusals(d, vms, check):
    vm = kt.kmig_vm(d, "vm", "workload=idle report_ms=300", memory="128M")
    vms.append(vm)
    q = vm.qmp()
    caps = {c["capability"]: c["state"] for c in q.cmd("query-migrate-capabilities")}
    check("capability_listed", caps.get("background-snapshot") is False, repr(caps))
    others = ("postcopy-ram", "multifd", "xbzrle", "auto-converge", "dirty-limit",
              "pause-before-switchover", "x-block-migration")
    for other in others:
        rep = q.cmd_full("migrate-set-capabilities",
                         capabilities=[{"capability": "background-snapshot", "state": True},
                                       {"capability": other, "state": True}])
        check("refused_with_" + other, rep.get("error", {}).get("desc") ==
              "Background-snapshot is not compatible with " + other, repr(rep))
    caps = {c["capability"]: c["state"] for c in q.cmd("query-migrate-capabilities")}
    check("nothing_set", caps.get("background-snapshot") is False and
          not any(caps.get(o) for o in others), repr(caps))
    q.cmd("migrate-set-capabilities",
          capabilities=[{"capability": "background-snapshot", "state": True}])
    for uri in ("tcp:127.0.0.1:%d" % kt.free_port(), "unix:" + os.path.join(d, "m.sock")):
        rep = q.cmd_full("migrate", uri=uri)
        check("refused_" + uri.split(":")[0], "background-snapshot writes a snapshot"
              in rep.get("error", {}).get("desc", ""), repr(rep))
    check("no_migration", q.cmd("query-migrate").get("status") == "none",
          repr(q.cmd("query-migrate")))
    check("running", status(vm) == "running", dump(vm))


def test_cli(d, vms, check):
    """kmig migrate --background-snapshot: the save completes with the
    guest running on, no convergence policy set, and the summary says
    what waited."""
    src = boot(d, vms, check)
    if not src:
        return
    path = os.path.join(d, "vm.snap")
    cli = subprocess.run([kt.KMIG, "migrate", "--qmp", "unix:" + src.qmp_path,
                          "--background-snapshot", "--bandwidth", "8", "--verify",
                          "file:" + path], capture_output=True, text=True, timeout=kt.slow(120))
    print("# cli: %s" % cli.stdout.strip().replace("\n", " / "))
    check("cli_ok", cli.returncode == 0 and "status completed" in cli.stdout and
          "background snapshot: the guest ran on" in cli.stdout,
          "%s %r %r" % (cli.returncode, cli.stdout[-500:], cli.stderr[-500:]))
    check("no_policy", "policy:" not in cli.stdout + cli.stderr, cli.stdout + cli.stderr)
    caps = {c["capability"]: c["state"] for c in src.qmp().cmd("query-migrate-capabilities")}
    check("caps", caps.get("background-snapshot") and not caps.get("auto-converge") and
          not caps.get("dirty-limit"), repr(caps))
    check("src_running", status(src) == "running", dump(src))
    goes_on(check, src, "src")
    refused = subprocess.run([kt.KMIG, "migrate", "--qmp", "unix:" + src.qmp_path,
                              "--background-snapshot", "--postcopy", "auto", "file:" + path],
                             capture_output=True, text=True, timeout=30)
    check("cli_refuses", refused.returncode != 0 and "--background-snapshot takes none of"
          in refused.stderr, refused.stderr)
