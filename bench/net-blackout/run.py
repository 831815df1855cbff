#!/usr/bin/env python3
"""The blackout a client sees: kmig against QEMU 7.2, same guest, same run.

The test guest (net=1: its ring-3 virtio-net driver answers UDP probes,
docs/guest.md) runs on host A of scripts/two-hosts; the destination VMM
waits on host B; a client in the client namespace sends a probe every
--interval-ms (1 ms) to the guest and records each echo.  For every case
(workload x configuration) and repetition, a fresh source and destination
are started for one VMM, the guest's link comes up, the probes start, the
migration runs at --bandwidth (125 MB/s, set for both VMMs) over the wire
from A to B, and from the prober's record:
  gap_ms        the longest time between two replies (the blackout)
  lost          probes never answered
  first_ms      from the instant the source's query-migrate said completed
                to the first reply after it (negative: replies came before
                the host saw completion, e.g. post-copy)
  gap_during_ms the longest gap that ended more than SWITCH_WINDOW (1 s)
                before the host saw completion: silences during the
                migration (a throttle's sleep, the dirty log's costs)
  gap_switch_ms the longest that ended within 1 s of completion (the
                switchover, the network learning where the guest went,
                post-copy's first faults)
  gaps_over_10ms_during, gap_at_ms (when the longest began, after `migrate`)
and from the source's query-migrate: status, total-time, downtime (QEMU's
definition: source vCPUs stopped to destination resumed), bytes sent, and
the highest cpu-throttle-percentage seen (throttle_max).

Configurations (like for like first, then each VMM's best):
  kmig-precopy / qemu-precopy       no convergence help
  kmig-ac / qemu-ac                 auto-converge (kmig: computed policy)
  kmig-hybrid / qemu-postcopy       kmig's x-postcopy-auto; QEMU's post-copy
                                    started once the bulk pass is over
Workloads: idle (2 GiB, workload=idle) and stress (2 GiB, 512 MiB rewritten).

Writes bench/results/net-blackout.json (info, binaries, raw runs) and .md
(medians and ranges).  Timings mean something only on a native /dev/kvm:
the script refuses to run inside scripts/kvm-vm unless --emulated-smoke is
given (which runs one repetition and writes nothing).  Never asserts.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
RESULTS = os.path.join(ROOT, "bench", "results")
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import kmigtest as kt  # noqa: E402
import netprobe  # noqa: E402
import twohosts  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "bench", "migrate"))
import run as mig  # noqa: E402  (the migration benchmark's helpers)

MAC = "52:54:00:4b:10:01"
GUEST_IP = "10.77.0.10"
PORT = 7777
MIB = 1 << 20
WORKLOADS = {"idle": "workload=idle", "stress": "workload=stress mb=512"}
CONFIGS = {
    "kmig-precopy": ("kmig", {}, None),
    "qemu-precopy": ("qemu", {}, None),
    "kmig-ac": ("kmig", {"auto-converge": True}, None),
    "qemu-ac": ("qemu", {"auto-converge": True}, None),
    "kmig-hybrid": ("kmig", {"postcopy-ram": True, "x-postcopy-auto": True}, None),
    "qemu-postcopy": ("qemu", {"postcopy-ram": True}, "after-bulk"),
}


def net_args(vmm):
    if vmm == "kmig":
        return ["--netdev", "tap,id=n0,ifname=tap0,script=no",
                "--device", "virtio-net-pci,netdev=n0,mac=" + MAC]
    return ["-netdev", "tap,id=n0,ifname=tap0,script=no,downscript=no,vhost=off",
            "-device", "virtio-net-pci,netdev=n0,mac=" + MAC]


def start(env, vmm, d, name, cmdline, netns, incoming=None):
    args = mig.vm_args(env, vmm, 4096, cmdline, "2G", 1, d, name, incoming) + net_args(vmm)
    return mig.Proc(d, name, kt.in_netns(netns, args))


def link_up(p, timeout):
    return p.console.wait(r"^net: mac=%s ip=\S+ link=up" % MAC, timeout) is not None


def one_run(env, d, h, wl, cfg, a):
    vmm, caps, postcopy = CONFIGS[cfg]
    cmdline = "%s report_ms=100 net=1 ip=%s udp_port=%d" % (WORKLOADS[wl], GUEST_IP, PORT)
    uri = "tcp:%s:%d" % (h["KMIG_NET_B"], 4500)
    src = start(env, vmm, d, "src", cmdline, h["a"])
    dst = start(env, vmm, d, "dst", cmdline, h["b"], incoming=uri)
    run = {"workload": wl, "config": cfg, "vmm": vmm}
    try:
        if not link_up(src, 60) or not mig.wait_dst_ready(dst, vmm):
            run["error"] = "guest or destination not ready"
            return run
        q, dq = src.qmp(), dst.qmp()
        both = [q, dq] if "postcopy-ram" in caps else [q]
        for c in both:
            c.cmd("migrate-set-capabilities", capabilities=[
                {"capability": k, "state": v} for k, v in caps.items()
                if c is q or k == "postcopy-ram"])
        q.cmd("migrate-set-parameters", **{"max-bandwidth": a.bandwidth,
                                           "downtime-limit": 300})
        time.sleep(2)                                  # the workload settles
        p = netprobe.probe(GUEST_IP, PORT, interval_ms=a.interval_ms, netns=h["c"])
        time.sleep(1)
        t0 = time.monotonic()
        q.cmd("migrate", uri=uri)
        r, done, switched, thr = {}, None, False, 0
        while time.monotonic() - t0 < a.cap:
            r = q.cmd("query-migrate")
            thr = max(thr, r.get("cpu-throttle-percentage", 0))
            if postcopy and not switched and r.get("status") == "active" and \
                    r.get("ram", {}).get("transferred", 0) >= 2048 * MIB:
                q.cmd("migrate-start-postcopy")
                switched = True
            if r.get("status") in ("completed", "failed", "cancelled"):
                done = time.monotonic()
                break
            time.sleep(0.01)
        if done is None:
            q.cmd("migrate_cancel")
        time.sleep(2)
        pr = p.stop()
        first = pr.first_reply_after(done) if done else None
        run.update(status=r.get("status"), total_ms=r.get("total-time"),
                   downtime_ms=r.get("downtime"), bytes=r.get("ram", {}).get("transferred"),
                   gap_ms=round(pr.max_gap()[0] * 1000, 1), lost=pr.lost, sent=len(pr.sent),
                   first_ms=round((first - done) * 1000, 1) if first else None,
                   mismatched=pr.mismatched, throttle_max=thr)
        run.update(where_gaps(pr, t0, done))
        return run
    finally:
        src.kill()
        dst.kill()


SWITCH_WINDOW = 1.0   # s either side of the host's `completed`


def where_gaps(pr, t0, done):
    """Where the silences were: the longest gap between replies that ended
    before the switchover window (during the migration: a throttle's sleep,
    post-copy's faults), the longest that ended in the window (the
    switchover: downtime, the network learning where the guest went), the
    number of gaps over 10 ms during the migration, and when the longest
    gap of all began (ms after `migrate`)."""
    ts = pr.reply_times()
    gaps = [(b - a, a, b) for a, b in zip(ts, ts[1:]) if b >= t0]
    lim = (done - SWITCH_WINDOW) if done else float("inf")
    during = [g for g in gaps if g[2] < lim]
    switch = [g for g in gaps if g[2] >= lim and (done is None or g[2] <= done + SWITCH_WINDOW)]
    top = max(gaps) if gaps else None
    return {"gap_during_ms": round(max(during)[0] * 1000, 1) if during else None,
            "gap_switch_ms": round(max(switch)[0] * 1000, 1) if switch else None,
            "gaps_over_10ms_during": len([g for g in during if g[0] > 0.010]),
            "gap_at_ms": round((top[1] - t0) * 1000) if top else None}


def summarize(runs):
    rows = {}
    for r in runs:
        rows.setdefault((r["workload"], r["config"]), []).append(r)
    out = []
    for (wl, cfg), rs in rows.items():
        ok = [r for r in rs if r.get("status") == "completed"]

        def stat(k):
            xs = [r[k] for r in ok if r.get(k) is not None]
            return (statistics.median(xs), min(xs), max(xs)) if xs else None
        out.append({"workload": wl, "config": cfg, "runs": len(rs), "completed": len(ok),
                    "gap_ms": stat("gap_ms"), "downtime_ms": stat("downtime_ms"),
                    "lost": stat("lost"), "first_ms": stat("first_ms"),
                    "total_ms": stat("total_ms"), "gap_during_ms": stat("gap_during_ms"),
                    "gap_switch_ms": stat("gap_switch_ms"),
                    "throttle_max": stat("throttle_max")})
    return out


def fmt(s):
    return "–" if s is None else "%g (%g–%g)" % s


def table(summary, info, a):
    lines = ["# Client-observed blackout, kmig vs QEMU 7.2", "",
             "commit %s, %s, probes every %g ms, %d MB/s for both, %d runs a cell; "
             "median (min–max)" % (info["git_head"], info["kernel"], a.interval_ms,
                                   a.bandwidth // 1000000, a.reps), "",
             "| workload | config | completed | longest gap ms | during migration | "
             "at switchover | downtime ms | probes lost | first reply after completion ms | "
             "total ms | max throttle % |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        lines.append("| %s | %s | %d/%d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            s["workload"], s["config"], s["completed"], s["runs"], fmt(s["gap_ms"]),
            fmt(s.get("gap_during_ms")), fmt(s.get("gap_switch_ms")),
            fmt(s["downtime_ms"]), fmt(s["lost"]), fmt(s["first_ms"]), fmt(s["total_ms"]),
            fmt(s.get("throttle_max"))))
    lines += ["", "\"during migration\": the longest gap that ended more than %g s before "
              "the source's `completed`; \"at switchover\": the longest that ended within "
              "%g s of it." % (SWITCH_WINDOW, SWITCH_WINDOW)]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--workloads", default="idle,stress")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--bandwidth", type=int, default=125000000, help="bytes/s, both VMMs")
    ap.add_argument("--interval-ms", type=float, default=1.0)
    ap.add_argument("--cap", type=float, default=120.0, help="seconds before a cancel")
    ap.add_argument("--emulated-smoke", action="store_true",
                    help="inside scripts/kvm-vm: one repetition, nothing written")
    ap.add_argument("--out", default=os.path.join(RESULTS, "net-blackout.json"))
    a = ap.parse_args()
    if kt.emulated() and not a.emulated_smoke:
        sys.exit("net-blackout: timings under emulation mean nothing; run it where /dev/kvm "
                 "is native (or --emulated-smoke to check the script)")
    if a.emulated_smoke:
        a.reps = 1
    info = mig.host_info()
    d = tempfile.mkdtemp(prefix="kmig-netbo-")
    env = {}
    env["kmig"], env["guest"], bins = mig.snapshot_binaries(d)
    runs = []
    with twohosts.topology("nbo") as h:
        for rep in range(a.reps):
            for wl in a.workloads.split(","):
                for cfg in a.configs.split(","):
                    r = one_run(env, d, h, wl, cfg, a)
                    r["rep"] = rep
                    print(json.dumps(r), flush=True)
                    runs.append(r)
    summary = summarize(runs)
    text = table(summary, info, a)
    if a.emulated_smoke:
        print(text)
        return
    mig.save_results(a, "net-blackout", info, bins, runs, summary, text)
    with open(os.path.splitext(a.out)[0] + ".md", "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
