"""virtio-balloon end to end: kmig --balloon with the test guest's driver
(cmdline balloon=1).

Tests: the seed 002 case (fill-free of 768 MiB on 1 GiB) migrated with and
without free page hints (with hints far fewer bytes, the guest intact and
its pages back on the destination, x-verify's whole-RAM hash equal);
inflate/deflate through QMP (balloon, query-balloon, BALLOON_CHANGE) and a
migration of the ballooned guest (ballooned pages skipped, the balloon
carried over, deflate on the destination); a verify guest migrated with
hints while the balloon is inflated and deflated during the migration;
the destination without --balloon refuses the stream and the source runs
on; QMP without --balloon says DeviceNotActive.

A guest whose balloon driver does not bind fails the test (kmig's own test
guest always has the driver).
"""
import os
import re
import time

import pytest

import kmigtest as kt

pytestmark = pytest.mark.kvm

MIB = 1 << 20
GIB = 1 << 30
BALLOON = ["--balloon"]


@pytest.fixture(autouse=True)
def _vm_tails(request, d, vms):
    """On an exception in the test, each VM's console and output tail (what
    the old harness's run_case printed), while the VMs still run and before
    d is removed.  Failed checks carry their own diagnostics."""
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed and "check(s) failed" not in str(rep.longrepr):
        for vm in vms:
            try:
                print("# %s (exit %r): %s" % (os.path.basename(vm.console.path),
                                              vm.proc.poll(), kt.dump(vm)))
            except OSError as e:
                print("# %s: %s" % (vm.console.path, e))


def tcp_uri():
    return "tcp:127.0.0.1:%d" % kt.free_port()


def dump(vm, n=12):
    return kt.dump(vm, n)


def balloon_pair(d, vms, cmd, memory, name=""):
    """A source and a destination (listening) with --balloon; (src, dst, uri)."""
    uri = tcp_uri()
    src = kt.kmig_vm(d, name + "src", cmd, memory=memory, extra=BALLOON)
    vms.append(src)
    dst = kt.kmig_vm(d, name + "dst", cmd, memory=memory, extra=BALLOON + ["--incoming", uri])
    vms.append(dst)
    return src, dst, uri


def bound(check, name, vm, timeout=30):
    """The guest's driver bound the device (a failed check if not)."""
    ok = vm.console.wait(r"^balloon bound ", kt.slow(timeout), proc=vm.proc) is not None
    return check(name + "bound", ok, dump(vm))


def fill_free_migration(check, d, vms, name, hints):
    """Boots src/dst with fill-free mb=768 on 1 GiB, migrates with x-verify;
    returns (the final query-migrate reply or None, src, dst)."""
    cmd = ("workload=fill-free mb=768 report_ms=500 balloon=1 balloon_report=0 balloon_hint=%d"
           % hints)
    src, dst, uri = balloon_pair(d, vms, cmd, "1G", name + "_")
    if not bound(check, name + "_", src):
        return None, src, dst
    if not check(name + "_filled", src.console.wait(r"^fill-free done", kt.slow(90),
                                                    proc=src.proc) is not None, dump(src)):
        return None, src, dst
    kt.wait_incoming(dst, kt.slow(30))
    r = kt.migrate(src, dst, uri, caps={"x-verify": True}, params={"max-bandwidth": GIB},
                   timeout=kt.slow(120))
    check(name + "_completed", r.get("status") == "completed",
          "query-migrate: %r; src %s; dst %s" % (r, dump(src), dump(dst)))
    hb = dst.console.count(r"^heartbeat")
    deadline = time.time() + kt.slow(10)
    while time.time() < deadline and dst.console.count(r"^heartbeat") < hb + 2:
        time.sleep(0.1)
    check(name + "_dst_runs_guest", dst.console.count(r"^heartbeat") >= hb + 2, dump(dst))
    return r, src, dst


def test_hints_fill_free(d, vms, check):
    name = "balloon_hints_fill_free"
    r0, _, _ = fill_free_migration(check, d, vms, "off", 0)
    r1, src, dst = fill_free_migration(check, d, vms, "on", 1)
    if not r0 or not r1 or r0.get("status") != "completed" or r1.get("status") != "completed":
        return
    t0, t1 = r0["ram"]["transferred"], r1["ram"]["transferred"]
    print("# %s: without hints %.1f MiB in %d ms, with hints %.1f MiB in %d ms (setup %d ms),"
          " %d pages skipped" % (name, t0 / MIB, r0["total-time"], t1 / MIB, r1["total-time"],
                                 r1.get("setup-time", 0), r1.get("x-free-pages-skipped", -1)))
    check("without_sends_filled_pages", t0 >= 700 * MIB, repr(r0))
    check("fewer_bytes", t1 * 4 < t0, "with %d, without %d bytes" % (t1, t0))
    check("skipped_counted", r1.get("x-free-pages-skipped", 0) >= 768 * 256
          and r0.get("x-free-pages-skipped", -1) == 0,
          "on %r, off %r" % (r1.get("x-free-pages-skipped"), r0.get("x-free-pages-skipped")))
    text = src.console.text()
    m = re.search(r"^balloon hint start id=(\d+)", text, re.M)
    check("guest_saw_id", m is not None and int(m.group(1)) >= 0x80000000, dump(src))
    check("guest_done", re.search(r"^balloon hint done id=", text, re.M) is not None, dump(src))
    # Whether the guest gets its hinted pages back (command id DONE, set
    # after the bulk pass) is not checked here: when the switchover follows
    # DONE within ~100 ms the guest on the destination has been seen (1 run
    # in 5) never to take them back, a known bug (docs/testing.md).
    # test_hints_leave_memory checks that it gets them back, intact, on the
    # source.


def test_hints_leave_memory(d, vms, check):
    """x-verify with free page hints reads the hinted pages and never
    changes them.  The guest fills all its free memory (fill_check=1 makes
    fill-free take all of it), hints it when the migration starts, and with fill_check=1
    checks every page it gets back at DONE against the fill.  The migration
    is cancelled once the bulk pass has skipped hinted pages (the pass first
    sends the 1-2 MiB of used pages below them at 128 KiB/s: 10-15 s on
    native KVM), so the guest checks on the source: every hinted page must
    come back as it was (a source that wiped them so that both hashes agree
    fails here with "fill-check BAD").  Once the pass is past them an idle
    guest converges at once, so pause-before-switchover holds the
    migration at pre-switchover for the cancel."""
    cmd = ("workload=fill-free mb=1 report_ms=50 balloon=1 balloon_report=0 "
           "balloon_hint=1 fill_check=1")
    src, dst, uri = balloon_pair(d, vms, cmd, "256M")
    if not bound(check, "src_", src):
        return
    m = src.console.wait(r"^fill-free done mb=\d+ free_pages=(\d+)", kt.slow(60), proc=src.proc)
    if not check("filled", m is not None, dump(src)):
        return
    kt.wait_incoming(dst, kt.slow(30))
    q = src.qmp()
    kt.set_caps(q, x_verify=True, pause_before_switchover=True)
    kt.set_params(q, max_bandwidth=128 << 10, downtime_limit=1)
    q.cmd("migrate", uri=uri)
    hinted = src.console.wait(r"^balloon hint done id=\d+ blocks=\d+ mb=(\d+)", kt.slow(30),
                              proc=src.proc)
    r = q.cmd("query-migrate")
    check("hinted_while_active", hinted is not None and r.get("status") == "active",
          "query-migrate %r; %s" % (r, dump(src)))
    # the bulk pass skips the hinted pages as it reaches them
    deadline = time.time() + kt.slow(40)
    while time.time() < deadline and r.get("x-free-pages-skipped", 0) == 0 \
            and r.get("status") == "active":
        time.sleep(0.2)
        r = q.cmd("query-migrate")
    check("skipping", r.get("x-free-pages-skipped", 0) > 0
          and r.get("status") in ("active", "pre-switchover"), "query-migrate %r" % r)
    q.cmd("migrate_cancel")
    r = kt.wait_migration(q, kt.slow(30))
    check("cancelled", r.get("status") == "cancelled", "query-migrate %r" % r)
    got = src.console.wait(r"^fill-check (ok pages=(\d+)|bad_pages=(\d+) pages=(\d+))",
                           kt.slow(60), proc=src.proc)
    print("# hints_leave_memory: %s" % (got.group(0) if got else None))
    check("pages_intact", got is not None and got.group(2) is not None
          and src.console.count(r"^fill-check BAD") == 0, dump(src, 20))
    # about all free memory was hinted and checked
    free_pages = int(m.group(1))
    check("checked_all_hinted", got is not None and got.group(2) is not None
          and int(got.group(2)) * 10 >= free_pages * 9,
          "checked %s of %d free pages" % (got.group(0) if got else None, free_pages))
    check("src_running", q.cmd("query-status").get("status") == "running", dump(src))


def wait_actual(vm, want, timeout=30):
    return kt.wait_balloon(vm.qmp(), want, kt.slow(timeout))


def test_inflate_deflate(d, vms, check):
    cmd = "workload=idle report_ms=500 balloon=1 balloon_report=0"
    src, dst, uri = balloon_pair(d, vms, cmd, "1G")
    if not bound(check, "", src):
        return
    q = src.qmp()
    check("initial", q.cmd("query-balloon").get("actual") == GIB, repr(q.cmd("query-balloon")))
    q.cmd("balloon", value=768 * MIB)
    got = wait_actual(src, 768 * MIB)
    check("inflated", got == 768 * MIB, "actual %r; %s" % (got, dump(src)))
    ev = q.wait_event("BALLOON_CHANGE", kt.slow(5))
    check("event", ev is not None and "actual" in ev.get("data", {}), repr(ev))
    err = q.cmd_full("balloon", value=0)
    check("bad_value", "error" in err, repr(err))
    kt.wait_incoming(dst, kt.slow(30))
    r = kt.migrate(src, dst, uri, caps={"x-verify": True}, params={"max-bandwidth": GIB},
                   timeout=kt.slow(60))
    if not check("migrated", r.get("status") == "completed", "%r; %s" % (r, dump(dst))):
        return
    check("ballooned_skipped", r.get("x-balloon-pages-skipped", 0) >= 256 * 256 - 256, repr(r))
    qd = dst.qmp()
    check("dst_actual", qd.cmd("query-balloon").get("actual") == 768 * MIB,
          repr(qd.cmd("query-balloon")))
    qd.cmd("balloon", value=GIB)
    got = wait_actual(dst, GIB)
    check("dst_deflated", got == GIB, "actual %r; %s" % (got, dump(dst)))
    check("dst_alive", dst.console.wait(r"^heartbeat", kt.slow(10), start=len(dst.console.lines),
                                        proc=dst.proc) is not None, dump(dst))


@pytest.mark.parametrize("ioeventfd", ["on", "off"])
def test_ioeventfd(d, vms, check, ioeventfd):
    """The balloon's queue notifications: with ioeventfd=on (the default)
    every one reaches the device through an ioeventfd and none as a vCPU
    exit, on the source and, after a migration (the BAR's address carried
    in its state), on the destination; with ioeventfd=off every one is a
    vCPU exit.  The balloon moves the same either way."""
    cmd = "workload=idle report_ms=500 balloon=1 balloon_report=0"
    uri = tcp_uri()
    extra = ["--balloon=ioeventfd=%s" % ioeventfd]
    src = kt.kmig_vm(d, "src", cmd, memory="1G", extra=extra)
    vms.append(src)
    dst = kt.kmig_vm(d, "dst", cmd, memory="1G", extra=extra + ["--incoming", uri])
    vms.append(dst)
    if not bound(check, "", src):
        return

    def moved(name, vm, target, before):
        vm.qmp().cmd("balloon", value=target)
        got = wait_actual(vm, target)
        b = vm.qmp().cmd("query-balloon")
        exits = b.get("x-notify-exits", -1) - before.get("x-notify-exits", 0)
        fds = b.get("x-notify-ioeventfds", -1) - before.get("x-notify-ioeventfds", 0)
        print("# %s: %s notifications through ioeventfds, %s vCPU exits" % (name, fds, exits))
        check(name + "_moved", got == target, "actual %r; %s" % (got, dump(vm)))
        if ioeventfd == "on":
            check(name + "_ioeventfds", fds > 0 and exits == 0, repr(b))
        else:
            check(name + "_exits", exits > 0 and fds == 0, repr(b))
        return b

    moved("src", src, 768 * MIB, {})
    kt.wait_incoming(dst, kt.slow(30))
    r = kt.migrate(src, dst, uri, caps={"x-verify": True}, params={"max-bandwidth": GIB},
                   timeout=kt.slow(60))
    if not check("migrated", r.get("status") == "completed", "%r; %s" % (r, dump(dst))):
        return
    moved("dst", dst, GIB, dst.qmp().cmd("query-balloon"))


def test_verify_churn(d, vms, check):
    """A verify guest migrated with hints and x-verify while QMP inflates
    and deflates the balloon during the migration's rounds."""
    name = "balloon_verify_churn"
    cmd = "workload=verify mb=64 report_ms=300 balloon=1"
    src, dst, uri = balloon_pair(d, vms, cmd, "512M")
    if not bound(check, "", src):
        return
    if not check("boot", src.console.wait(r"^verify ok round=", kt.slow(40), proc=src.proc)
                 is not None, dump(src)):
        return
    q = src.qmp()
    kt.set_caps(q, x_verify=True, auto_converge=True)
    kt.set_params(q, max_bandwidth=32 * MIB, downtime_limit=1500)
    kt.wait_incoming(dst, kt.slow(30))
    q.cmd("migrate", uri=uri)
    targets = [384 * MIB, 512 * MIB, 448 * MIB, 512 * MIB]
    i = 0
    deadline = time.time() + kt.slow(90)
    r = {}
    while time.time() < deadline:
        r = q.cmd("query-migrate")
        if r.get("status") in kt.MIG_FINAL:
            break
        if r.get("status") == "active" and i < len(targets):
            q.cmd("balloon", value=targets[i])
            i += 1
        time.sleep(0.4)
    print("# %s: %d balloon changes during the migration; %r" % (name, i, {
        k: r.get(k) for k in ("status", "total-time", "x-free-pages-skipped",
                              "x-balloon-pages-skipped", "x-iterations")}))
    if not check("completed", r.get("status") == "completed",
                 "%r; src %s; dst %s" % (r, dump(src), dump(dst))):
        return
    start = len(dst.console.lines)
    ok = dst.console.wait(r"^verify ok round=", kt.slow(20), start=start, proc=dst.proc)
    time.sleep(1)
    bad = [l for l in (src.console.text() + "\n" + dst.console.text()).splitlines()
           if "verify BAD" in l or "bad_pages" in l or "balloon error" in l]
    check("dst_verify_ok", ok is not None and not bad,
          " / ".join(bad[:5]) or "%s; src %s" % (dump(dst), dump(src)))


def test_dst_without_device(d, vms, check):
    cmd = "workload=idle report_ms=300 balloon=1"
    uri = tcp_uri()
    src = kt.kmig_vm(d, "src", cmd, memory="256M", extra=BALLOON)
    vms.append(src)
    dst = kt.kmig_vm(d, "dst", cmd, memory="256M", extra=["--incoming", uri])
    vms.append(dst)
    if not check("boot", src.console.wait(r"^heartbeat", kt.slow(30), proc=src.proc) is not None,
                 dump(src)):
        return
    kt.wait_incoming(dst, kt.slow(30))
    r = kt.migrate(src, dst, uri, timeout=kt.slow(40))
    check("failed", r.get("status") == "failed" and "balloon" in r.get("error-desc", ""),
          repr(r))
    n = src.console.count(r"^heartbeat")
    time.sleep(1.0)
    check("src_runs", src.qmp().cmd("query-status").get("status") == "running"
          and src.console.count(r"^heartbeat") > n, dump(src))


def test_qmp_without_device(d, vms, check):
    vm = kt.kmig_vm(d, "vm", "workload=idle", memory="128M")
    vms.append(vm)
    q = vm.qmp()
    for cmd, args in (("query-balloon", {}), ("balloon", {"value": 64 * MIB})):
        rep = q.cmd_full(cmd, **args)
        check(cmd, rep.get("error", {}).get("class") == "DeviceNotActive", repr(rep))
