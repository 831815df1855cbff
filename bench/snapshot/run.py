#!/usr/bin/env python3
"""Saving a busy guest: background-snapshot against the other two ways to
save it, kmig against QEMU 7.2 on the same guest, same run.

A stress guest (--mb MiB of its --memory rewritten all the time, a report
every 50 ms) is saved into a file on this host, in one of three modes:
- `bg`: capability background-snapshot: one short stop, then RAM as it was
  at that stop, written while the guest runs (its first write to a page not
  written out yet waits for it);
- `stopped`: QMP stop, a save, cont (what `virsh save` does to a guest:
  unreachable for the whole save);
- `live`: a live save (pre-copy into the file, no convergence policy): ends
  only if the guest's rewrites fit in the downtime limit at the file's
  speed; any save still running after --cap seconds is cancelled ("not
  done at cap").
kmig writes to `file:PATH`; QEMU 7.2, which has no `file:` URI, to
`exec:cat > PATH`.  Both at the same max-bandwidth (--bandwidth, bytes/s; 0 =
unlimited, QEMU then 100 GB/s).  Recorded per run: status, total-time,
downtime (bg: the one stop), the file's size, the guest's time lost while
saving (from its own work count: bench/migrate's guest_lost), seconds below
half pace, its longest silence (cpu 0's report gap) and, for kmig, the
writes that waited.  With --restore each completed save is loaded by a new
VMM of the same kind and must resume the guest (`restored`).

Writes bench/results/snapshot.json and prints a table of medians.  Never
asserts.  Measure natively only (emulated timings are not performance).
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench", "migrate"))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import run as mig  # noqa: E402
import kmigtest as kt  # noqa: E402

MODES = ("bg", "stopped", "live")


def save_uri(vmm, path):
    return "file:" + path if vmm == "kmig" else "exec:cat > '%s'" % path


def settle(src, lines, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and src.alive():
        src.poll_lines()
        if mig.warm_reports(src.seen, 1)[0] >= lines:     # its first writes done
            return True
        time.sleep(0.05)
    return False


def drive(src, q, vmm, mode, path, a):
    """Starts the save and follows it to the end (or the cap); the last
    query-migrate reply and the host times it ran between."""
    caps = [{"capability": "background-snapshot", "state": mode == "bg"}]
    bw = a.bandwidth or (0 if vmm == "kmig" else mig.QEMU_UNLIMITED)
    q.cmd("migrate-set-capabilities", capabilities=caps)
    q.cmd("migrate-set-parameters", **{"max-bandwidth": bw, "downtime-limit": a.downtime})
    t0 = time.monotonic()
    if mode == "stopped":
        q.cmd("stop")
    q.cmd("migrate", uri=save_uri(vmm, path))
    r = {}
    while time.monotonic() - t0 < a.cap:
        src.poll_lines()
        r = q.cmd("query-migrate")
        if r.get("status") in kt.MIG_FINAL:
            break
        time.sleep(0.02)
    if r.get("status") not in kt.MIG_FINAL:
        q.cmd("migrate_cancel")
        r = dict(r, status="not done at cap")
    if mode == "stopped" or (r.get("status") == "completed" and mode == "live"):
        q.cmd("cont")       # a save leaves the source stopped, as in QEMU
    return r, t0, time.monotonic()


def restore(env, vmm, cl, a, d, path):
    inc = "file:" + path if vmm == "kmig" else "exec:cat '%s'" % path
    dst = mig.Proc(d, "dst", mig.vm_args(env, vmm, a.ring, cl, a.memory, 1, d, "dst",
                                         incoming=inc))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and dst.alive():
            dst.poll_lines()
            if any(l.startswith("stress cpu=0") for _, l in dst.seen):
                return True
            # a guest saved stopped is restored stopped (both VMMs)
            q = dst.qmp()
            if q.cmd("query-migrate").get("status") == "completed" and \
                    q.cmd("query-status").get("status") == "paused":
                q.cmd("cont")
            time.sleep(0.1)
        return False
    finally:
        dst.kill()


def one_run(env, vmm, mode, rep, a):
    d = tempfile.mkdtemp(prefix="snap-", dir=env["tmp"])
    cl = "workload=stress mb=%d report_ms=%d tsc_khz=%d" % (a.mb, mig.REPORT_MS, env["tsc_khz"])
    path = os.path.join(d, "vm.sav")
    res = {"vmm": vmm, "mode": mode, "rep": rep, "loadavg": mig.loadavg()}
    src = mig.Proc(d, "src", mig.vm_args(env, vmm, a.ring, cl, a.memory, 1, d, "src"))
    try:
        if not settle(src, mig.SETTLE_LINES):
            res["status"] = "setup-failed"
            return res
        q = src.qmp()
        r, t0, t1 = drive(src, q, vmm, mode, path, a)
        time.sleep(0.5)
        src.poll_lines()
        g = mig.slowdown(src.seen, t0, t1) or {}
        res.update(status=r.get("status"), total_ms=r.get("total-time"),
                   downtime_ms=r.get("downtime"), wall_s=round(t1 - t0, 3),
                   file_bytes=os.path.getsize(path) if os.path.exists(path) else None,
                   snapshot=r.get("x-background-snapshot"), error=r.get("error-desc"),
                   guest_lost_s=g.get("guest_lost_s"),
                   s_below_half_pace=g.get("s_below_half_pace"),
                   max_report_gap_ms=g.get("max_report_gap_ms"))
        if a.restore and res["status"] == "completed":
            res["restored"] = restore(env, vmm, cl, a, d, path)
        return res
    except (OSError, EOFError, RuntimeError) as e:
        res.update(status="error", error=repr(e), output=src.output()[-500:])
        return res
    finally:
        src.kill()
        shutil.rmtree(d, ignore_errors=True)


def summarize(runs):
    rows = {}
    for r in runs:
        rows.setdefault((r["mode"], r["vmm"]), []).append(r)
    out = []
    for (mode, vmm), rs in sorted(rows.items()):
        done = [r for r in rs if r.get("status") == "completed"]
        out.append({"mode": mode, "vmm": vmm, "runs": len(rs), "completed": len(done),
                    "total_ms": mig.med([r.get("total_ms") for r in done]),
                    "downtime_ms": mig.med([r.get("downtime_ms") for r in done]),
                    "guest_lost_s": mig.med([r.get("guest_lost_s") for r in done]),
                    "s_below_half_pace": mig.med([r.get("s_below_half_pace") for r in done]),
                    "max_report_gap_ms": mig.med([r.get("max_report_gap_ms") for r in done]),
                    "file_mib": mig.med([(r.get("file_bytes") or 0) / (1 << 20) for r in done]),
                    "write_faults": mig.med([(r.get("snapshot") or {}).get("write-faults")
                                             for r in done])})
    return out


def table(summary):
    f = lambda x, p="%d": "-" if x is None else p % x  # noqa: E731
    lines = ["%-8s %-5s %6s %9s %9s %9s %9s %9s %8s %8s" % (
        "mode", "vmm", "done", "total ms", "stop ms", "lost s", "<half s", "gap ms",
        "MiB", "waits")]
    for s in summary:
        lines.append("%-8s %-5s %6s %9s %9s %9s %9s %9s %8s %8s" % (
            s["mode"], s["vmm"], "%d/%d" % (s["completed"], s["runs"]), f(s["total_ms"]),
            f(s["downtime_ms"]), f(s["guest_lost_s"], "%.2f"), f(s["s_below_half_pace"], "%.2f"),
            f(s["max_report_gap_ms"]), f(s["file_mib"]), f(s["write_faults"])))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--memory", default="2G")
    p.add_argument("--mb", type=int, default=1024, help="MiB the guest rewrites")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--vmms", default="kmig,qemu")
    p.add_argument("--bandwidth", type=int, default=125000000, help="bytes/s, 0 = unlimited")
    p.add_argument("--downtime", type=int, default=300, help="live: downtime-limit, ms")
    p.add_argument("--ring", type=int, default=4096, help="dirty ring entries, 0 = bitmap")
    p.add_argument("--cap", type=float, default=120.0, help="seconds before a save is cancelled")
    p.add_argument("--restore", action="store_true", help="load each completed save again")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tsc-khz", type=int, default=0)
    p.add_argument("--out", default=os.path.join(mig.RESULTS, "snapshot.json"))
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="kmig-snap-")
    try:
        env, info, bins = mig.bench_env(tmp, a.tsc_khz)
        runs = []
        for rep in range(a.reps):
            for mode in a.modes.split(","):
                for vmm in a.vmms.split(","):
                    r = one_run(env, vmm, mode, rep, a)
                    print("# %s" % json.dumps(r), flush=True)
                    runs.append(r)
        summary = summarize(runs)
        mig.save_results(a, "snapshot", info, bins, runs, summary, table(summary))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
