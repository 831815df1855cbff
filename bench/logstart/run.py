#!/usr/bin/env python3
"""Dirty logging start (seed 003): what starting a migration costs a big
guest.  An idle guest (`workload=idle`, a heartbeat every --beat-ms from a
vCPU that spins on its TSC) of --sizes GiB; the migration starts at
--bandwidth (slow enough that the bulk pass is still running when the
window ends) and is cancelled after --window-s seconds.  Recorded:
query-migrate's setup-time, and the longest gap between two heartbeats the
guest saw (`gap_ms`) in the window, against the longest in the same time
before the migration (the noise floor).

VMMs: kmig (bitmap, the default; the dirty log of each 256 MiB chunk is
cleared only when the bulk pass reaches it), kmig-old (--kmig-old PATH: a
kmig built before that change, which cleared the whole log in the first
sync) and QEMU 7.2 (its own lazy clear, 1 GiB chunks).

Seed 003 on big guests: with --touch the guest writes a one to every free
page before its heartbeats start (touch=2), so all its memory is mapped,
with huge pages where the host can, logging has them to split, and the
bulk pass has every page to send (zero pages would go in a moment); KVM's 2 MiB
mappings are recorded before the migration and at the window's end.  A
run whose migration was no longer active when the window closed measured
less than the window and is not counted (`valid`).  Writes
bench/results/logstart.json and prints medians.  Never asserts.
"""
import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "migrate"))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import run as mig  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")
BEAT_RX = re.compile(r"^heartbeat t_ms=(\d+) gap_ms=(\d+)")


def max_gap(src, t_from, t_to):
    """Longest gap_ms of the heartbeats seen between host times t_from..t_to."""
    gaps = [int(m.group(2)) for t, l in src.seen if t_from <= t <= t_to
            for m in [BEAT_RX.match(l)] if m]
    return (max(gaps) if gaps else None), len(gaps)


def one_run(env, vmm, gib, rep, a):
    d = tempfile.mkdtemp(prefix="ls-", dir=env["tmp"])
    uri = "tcp:127.0.0.1:%d" % mig.free_port()
    cl = "workload=idle report_ms=%d tsc_khz=%d%s" % (a.beat_ms, env["tsc_khz"],
                                                      " touch=2" if a.touch else "")
    e = dict(env, kmig=env["kmig_old"]) if vmm == "kmig-old" else env
    kind = "qemu" if vmm.startswith("qemu") else "kmig"
    # "-ring4096": the dirty ring (no initially-set log: KVM protects all at once)
    ring = 4096 if vmm.endswith("-ring4096") else 0
    mem = "%dG" % gib
    res = {"vmm": vmm, "gib": gib, "rep": rep, "dirty_ring": ring, "loadavg": mig.loadavg()}
    src = mig.Proc(d, "src", mig.vm_args(e, kind, ring, cl, mem, 1, d, "src"))
    dst = mig.Proc(d, "dst", mig.vm_args(e, kind, ring, cl, mem, 1, d, "dst", incoming=uri))
    try:
        deadline = time.monotonic() + 120 + (gib * 10 if a.touch else 0)
        while time.monotonic() < deadline and src.alive():
            src.poll_lines()
            if sum(1 for _, l in src.seen if l.startswith("heartbeat")) >= 10:
                break
            time.sleep(0.05)
        if not mig.wait_dst_ready(dst, kind):
            res["status"] = "setup-failed"
            return res
        q = src.qmp()
        q.cmd("migrate-set-parameters", **{"max-bandwidth": a.bandwidth})
        res["pages_before"] = mig.kvm_pages(kind, q)
        t_quiet = time.monotonic()
        while time.monotonic() < t_quiet + a.window_s:
            src.poll_lines()
            time.sleep(0.02)
        t0 = time.monotonic()
        q.cmd("migrate", uri=uri)
        r = {}
        while time.monotonic() < t0 + a.window_s:
            src.poll_lines()
            r = q.cmd("query-migrate")
            time.sleep(0.02)
        t1 = time.monotonic()
        res["pages_in_window"] = mig.kvm_pages(kind, q)
        q.cmd("migrate_cancel")
        time.sleep(0.5)
        src.poll_lines()
        res["touched"] = next((l for _, l in src.seen if l.startswith("touch done")), None)
        res["gap_before_ms"], _ = max_gap(src, t_quiet, t0)
        res["gap_start_ms"], res["beats_in_window"] = max_gap(src, t0, t1 + 0.3)
        # a migration that ended inside the window measured less than the
        # window: such a run does not count
        res.update(status_in_window=r.get("status"), setup_ms=r.get("setup-time"),
                   transferred=r.get("ram", {}).get("transferred"),
                   valid=r.get("status") == "active")
        return res
    finally:
        src.kill()
        dst.kill()
        shutil.rmtree(d, ignore_errors=True)


def summarize(runs):
    out = {}
    for r in runs:
        out.setdefault((r["gib"], r["vmm"]), []).append(r)
    two_m = lambda r, k: (r.get(k) or {}).get("pages_2m")  # noqa: E731
    every = out
    out = {k: [r for r in rs if r.get("valid")] for k, rs in every.items()}
    return [{"gib": g, "vmm": v, "runs": len(every[(g, v)]), "valid": len(rs),
             "pages_2m_before": mig.med([two_m(r, "pages_before") for r in rs]),
             "pages_2m_in_window": mig.med([two_m(r, "pages_in_window") for r in rs]),
             "setup_ms": mig.med([r.get("setup_ms") for r in rs]),
             "gap_start_ms": mig.med([r.get("gap_start_ms") for r in rs]),
             "gap_start_max_ms": max((r.get("gap_start_ms") or 0 for r in rs), default=None),
             "gap_before_ms": mig.med([r.get("gap_before_ms") for r in rs])}
            for (g, v), rs in sorted(out.items())]


def table(summary):
    f = lambda x: "-" if x is None else "%d" % x  # noqa: E731
    lines = ["%5s %-13s %5s %9s %14s %14s %14s %9s %9s" % (
        "GiB", "vmm", "valid", "setup ms", "gap start ms", "(worst run)", "gap before ms",
        "2M pre", "2M window")]
    for s in summary:
        lines.append("%5d %-13s %5s %9s %14s %14s %14s %9s %9s" % (
            s["gib"], s["vmm"], "%d/%d" % (s["valid"], s["runs"]), f(s["setup_ms"]),
            f(s["gap_start_ms"]), f(s["gap_start_max_ms"]), f(s["gap_before_ms"]),
            f(s["pages_2m_before"]), f(s["pages_2m_in_window"])))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="2,8,16", help="guest sizes, GiB")
    p.add_argument("--vmms", default="kmig,qemu,kmig-ring4096,qemu-ring4096",
                   help="kmig, qemu (bitmap), kmig-ring4096, qemu-ring4096 (dirty ring)")
    p.add_argument("--kmig-old", default=None, help="a kmig binary for the kmig-old rows")
    p.add_argument("--beat-ms", type=int, default=10)
    p.add_argument("--bandwidth", type=int, default=20000000, help="bytes/s")
    p.add_argument("--window-s", type=float, default=3.0)
    p.add_argument("--touch", action="store_true",
                   help="the guest writes a one to every free page first (touch=2): all its "
                        "memory mapped, with huge pages where the host can, and to be sent")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tsc-khz", type=int, default=0)
    p.add_argument("--out", default=os.path.join(RESULTS, "logstart.json"))
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="kmig-ls-")
    try:
        kmig, guest, bins = mig.snapshot_binaries(tmp)
        env = {"kmig": kmig, "guest": guest, "tmp": tmp}
        vmms = a.vmms.split(",")
        if a.kmig_old:
            env["kmig_old"] = os.path.join(tmp, "kmig-old")
            shutil.copy2(a.kmig_old, env["kmig_old"])
            bins["kmig_old_sha256"] = mig.sha256(env["kmig_old"])
            vmms.append("kmig-old")
        info = mig.host_info()
        info["emulated"] = bool(os.environ.get("KMIG_TEST_EMULATED"))
        env["tsc_khz"] = a.tsc_khz or mig.calibrate_tsc(env, tmp) or 2000000
        runs = []
        for rep in range(a.reps):
            for gib in [int(x) for x in a.sizes.split(",")]:
                for vmm in vmms:
                    r = one_run(env, vmm, gib, rep, a)
                    print("# %s" % json.dumps(r), flush=True)
                    runs.append(r)
        summary = summarize(runs)
        mig.save_results(a, "logstart", info, bins, runs, summary, table(summary))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
