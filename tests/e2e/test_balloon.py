#!/usr/bin/env python3
"""virtio-balloon end to end: kmig --balloon with the test guest's driver
(cmdline balloon=1).

Cases: the seed 002 case (fill-free of 768 MiB on 1 GiB) migrated with and
without free page hints (with hints far fewer bytes, the guest intact and
its pages back on the destination, x-verify's whole-RAM hash equal);
inflate/deflate through QMP (balloon, query-balloon, BALLOON_CHANGE) and a
migration of the ballooned guest (ballooned pages skipped, the balloon
carried over, deflate on the destination); a verify guest migrated with
hints while the balloon is inflated and deflated during the migration;
the destination without --balloon refuses the stream and the source runs
on; QMP without --balloon says DeviceNotActive.
"""
import os
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import kmigtest as kt  # noqa: E402

R = kt.Report()
MIB = 1 << 20
GIB = 1 << 30
BALLOON = ["--balloon"]


def tcp_uri():
    return "tcp:127.0.0.1:%d" % kt.free_port()


def dump(vm, n=12):
    return kt.dump(vm, n)


def run_case(name, fn, d):
    sub = os.path.join(d, name)
    os.mkdir(sub)
    kt.run_case(R, name, lambda vms: fn(sub, vms))


def bound(vm, timeout=30):
    return vm.console.wait(r"^balloon bound ", timeout, proc=vm.proc) is not None


def driver_present(name, vm):
    """False (and a skip) when the guest has no balloon driver."""
    if bound(vm):
        return True
    text = vm.console.text()
    if "unknown option \"balloon\"" in text or "kmig-guest ready" in text:
        R.skip(name, "the test guest has no balloon driver (%s)" % dump(vm, 4))
    else:
        R.ok(name + "_bound", False, dump(vm))
    return False


def fill_free_migration(d, vms, name, hints):
    """Boots src/dst with fill-free mb=768 on 1 GiB, migrates with x-verify;
    returns the final query-migrate reply (or None)."""
    cmd = "workload=fill-free mb=768 report_ms=500 balloon=1 balloon_report=0 balloon_hint=%d" % hints
    uri = tcp_uri()
    src = kt.kmig_vm(d, name + "_src", cmd, memory="1G", extra=BALLOON)
    dst = kt.kmig_vm(d, name + "_dst", cmd, memory="1G", extra=BALLOON + ["--incoming", uri])
    vms += [src, dst]
    if not driver_present(name, src):
        return None, src, dst
    if not R.ok(name + "_filled", src.console.wait(r"^fill-free done", 90, proc=src.proc) is not None,
                dump(src)):
        return None, src, dst
    r = kt.migrate(src, dst, uri, caps={"x-verify": True}, params={"max-bandwidth": GIB},
                   timeout=120)
    R.ok(name + "_completed", r.get("status") == "completed",
         "query-migrate: %r; src %s; dst %s" % (r, dump(src), dump(dst)))
    hb = dst.console.count(r"^heartbeat")
    deadline = time.time() + 10
    while time.time() < deadline and dst.console.count(r"^heartbeat") < hb + 2:
        time.sleep(0.1)
    R.ok(name + "_dst_runs_guest", dst.console.count(r"^heartbeat") >= hb + 2, dump(dst))
    return r, src, dst


def case_hints(d, vms):
    name = "balloon_hints_fill_free"
    r0, _, _ = fill_free_migration(d, vms, name + "_off", 0)
    r1, src, dst = fill_free_migration(d, vms, name + "_on", 1)
    if not r0 or not r1 or r0.get("status") != "completed" or r1.get("status") != "completed":
        return
    t0, t1 = r0["ram"]["transferred"], r1["ram"]["transferred"]
    print("# %s: without hints %.1f MiB in %d ms, with hints %.1f MiB in %d ms (setup %d ms),"
          " %d pages skipped" % (name, t0 / MIB, r0["total-time"], t1 / MIB, r1["total-time"],
                                 r1.get("setup-time", 0), r1.get("x-free-pages-skipped", -1)))
    R.ok(name + "_without_sends_filled_pages", t0 >= 700 * MIB, repr(r0))
    R.ok(name + "_fewer_bytes", t1 * 4 < t0, "with %d, without %d bytes" % (t1, t0))
    R.ok(name + "_skipped_counted", r1.get("x-free-pages-skipped", 0) >= 768 * 256
         and r0.get("x-free-pages-skipped", -1) == 0,
         "on %r, off %r" % (r1.get("x-free-pages-skipped"), r0.get("x-free-pages-skipped")))
    text = src.console.text()
    m = re.search(r"^balloon hint start id=(\d+)", text, re.M)
    R.ok(name + "_guest_saw_id", m is not None and int(m.group(1)) >= 0x80000000, dump(src))
    R.ok(name + "_guest_done", re.search(r"^balloon hint done id=", text, re.M) is not None,
         dump(src))
    # the guest gets its hinted pages back (cmd id DONE, set after the bulk
    # pass): still on the source or already on the destination
    back = r"^balloon hint returned blocks="
    R.ok(name + "_pages_back", src.console.count(back) > 0 or
         dst.console.wait(back, 10, proc=dst.proc) is not None, "%s; %s" % (dump(src), dump(dst)))


def wait_actual(vm, want, timeout=30):
    deadline = time.time() + timeout
    got = None
    while time.time() < deadline:
        got = vm.qmp().cmd("query-balloon").get("actual")
        if got == want:
            return got
        time.sleep(0.1)
    return got


def case_inflate_deflate(d, vms):
    name = "balloon_inflate_deflate"
    cmd = "workload=idle report_ms=500 balloon=1 balloon_report=0"
    uri = tcp_uri()
    src = kt.kmig_vm(d, "src", cmd, memory="1G", extra=BALLOON)
    dst = kt.kmig_vm(d, "dst", cmd, memory="1G", extra=BALLOON + ["--incoming", uri])
    vms += [src, dst]
    if not driver_present(name, src):
        return
    q = src.qmp()
    R.ok(name + "_initial", q.cmd("query-balloon").get("actual") == GIB, repr(q.cmd("query-balloon")))
    q.cmd("balloon", value=768 * MIB)
    got = wait_actual(src, 768 * MIB)
    R.ok(name + "_inflated", got == 768 * MIB, "actual %r; %s" % (got, dump(src)))
    ev = q.wait_event("BALLOON_CHANGE", 5)
    R.ok(name + "_event", ev is not None and "actual" in ev.get("data", {}), repr(ev))
    err = q.cmd_full("balloon", value=0)
    R.ok(name + "_bad_value", "error" in err, repr(err))
    r = kt.migrate(src, dst, uri, caps={"x-verify": True}, params={"max-bandwidth": GIB}, timeout=60)
    if not R.ok(name + "_migrated", r.get("status") == "completed", "%r; %s" % (r, dump(dst))):
        return
    R.ok(name + "_ballooned_skipped", r.get("x-balloon-pages-skipped", 0) >= 256 * 256 - 256, repr(r))
    qd = dst.qmp()
    R.ok(name + "_dst_actual", qd.cmd("query-balloon").get("actual") == 768 * MIB,
         repr(qd.cmd("query-balloon")))
    qd.cmd("balloon", value=GIB)
    got = wait_actual(dst, GIB)
    R.ok(name + "_dst_deflated", got == GIB, "actual %r; %s" % (got, dump(dst)))
    R.ok(name + "_dst_alive", dst.console.wait(r"^heartbeat", 10, start=len(dst.console.lines),
                                               proc=dst.proc) is not None, dump(dst))


def case_verify_churn(d, vms):
    """A verify guest migrated with hints and x-verify while QMP inflates
    and deflates the balloon during the migration's rounds."""
    name = "balloon_verify_churn"
    cmd = "workload=verify mb=64 report_ms=300 balloon=1"
    uri = tcp_uri()
    src = kt.kmig_vm(d, "src", cmd, memory="512M", extra=BALLOON)
    dst = kt.kmig_vm(d, "dst", cmd, memory="512M", extra=BALLOON + ["--incoming", uri])
    vms += [src, dst]
    if not driver_present(name, src):
        return
    if not R.ok(name + "_boot", src.console.wait(r"^verify ok round=", 40, proc=src.proc) is not None,
                dump(src)):
        return
    q = src.qmp()
    kt.set_caps(q, x_verify=True, auto_converge=True)
    kt.set_params(q, max_bandwidth=32 * MIB, downtime_limit=1500)
    kt.wait_incoming(dst)
    q.cmd("migrate", uri=uri)
    targets = [384 * MIB, 512 * MIB, 448 * MIB, 512 * MIB]
    i = 0
    deadline = time.time() + 90
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
    if not R.ok(name + "_completed", r.get("status") == "completed",
                "%r; src %s; dst %s" % (r, dump(src), dump(dst))):
        return
    start = len(dst.console.lines)
    ok = dst.console.wait(r"^verify ok round=", 20, start=start, proc=dst.proc)
    time.sleep(1)
    bad = [l for l in (src.console.text() + "\n" + dst.console.text()).splitlines()
           if "verify BAD" in l or "bad_pages" in l or "balloon error" in l]
    R.ok(name + "_dst_verify_ok", ok is not None and not bad, " / ".join(bad[:5]) or dump(dst))


def case_dst_without_balloon(d, vms):
    name = "balloon_dst_without_device"
    cmd = "workload=idle report_ms=300 balloon=1"
    uri = tcp_uri()
    src = kt.kmig_vm(d, "src", cmd, memory="256M", extra=BALLOON)
    dst = kt.kmig_vm(d, "dst", cmd, memory="256M", extra=["--incoming", uri])
    vms += [src, dst]
    if not R.ok(name + "_boot", src.console.wait(r"^heartbeat", 30, proc=src.proc) is not None,
                dump(src)):
        return
    r = kt.migrate(src, dst, uri, timeout=40)
    R.ok(name + "_failed", r.get("status") == "failed" and "balloon" in r.get("error-desc", ""),
         repr(r))
    n = src.console.count(r"^heartbeat")
    time.sleep(1.0)
    R.ok(name + "_src_runs", src.qmp().cmd("query-status").get("status") == "running"
         and src.console.count(r"^heartbeat") > n, dump(src))


def case_no_device(d, vms):
    name = "balloon_qmp_without_device"
    vm = kt.kmig_vm(d, "vm", "workload=idle", memory="128M")
    vms.append(vm)
    q = vm.qmp()
    for cmd, args in (("query-balloon", {}), ("balloon", {"value": 64 * MIB})):
        rep = q.cmd_full(cmd, **args)
        R.ok(name + "_" + cmd, rep.get("error", {}).get("class") == "DeviceNotActive", repr(rep))


def main():
    if not kt.have_kvm():
        R.skip("balloon", "no /dev/kvm")
        return
    d = kt.tmpdir()
    try:
        run_case("balloon_qmp_without_device", case_no_device, d)
        run_case("balloon_hints_fill_free", case_hints, d)
        run_case("balloon_inflate_deflate", case_inflate_deflate, d)
        run_case("balloon_verify_churn", case_verify_churn, d)
        run_case("balloon_dst_without_device", case_dst_without_balloon, d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
    R.done()
