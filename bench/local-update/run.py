#!/usr/bin/env python3
"""A guest taken over by a new VMM process on the same host (a VMM
upgrade): its RAM handed over in a shared memory file (x-ignore-shared)
against copied page by page, kmig against QEMU 7.2 on the same guest, same
run.

Each run starts a source VM running the test guest (`--workload`: idle, or
stress rewriting --mb MiB; a report every 50 ms), lets it settle, starts a
destination of the same VMM on this host listening on a unix socket, and
migrates, in one of two modes:
- `shared`: guest RAM is a memory-backend-file (share=on) on tmpfs
  (--shm-dir), the same file on both sides, capability x-ignore-shared on
  both: no page is sent;
- `copy`: anonymous RAM, an ordinary pre-copy migration (the same
  downtime-limit, max-bandwidth unlimited for both: kmig 0, QEMU 100 GB/s;
  no convergence policy), what the same host would do without the file.
Recorded per run: status, total-time, downtime (the VMM's), the guest's
pause as its consoles show it (host ms from the source's last report to
the destination's first: bench/migrate's switchover_gap) and the bytes
the migration carried.

Writes bench/results/local-update.json and prints a table of medians.
Never asserts.  Measure natively only (emulated timings are not
performance).
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

MODES = ("shared", "copy")


def mem_args(vmm, args, memory, path):
    """The VMM's arguments with guest RAM in the file path, mapped shared."""
    obj = "memory-backend-file,id=ram0,size=%s,mem-path=%s,share=on" % (memory, path)
    if vmm == "kmig":
        return args + ["--object", obj, "--machine", "memory-backend=ram0"]
    out = list(args)
    out[out.index("-machine") + 1] += ",memory-backend=ram0"
    return out + ["-object", obj]


def vm(env, vmm, mode, cl, a, d, name, mf, incoming=None):
    args = mig.vm_args(env, vmm, a.ring, cl, a.memory, 1, d, name, incoming=incoming)
    return mig.Proc(d, name, mem_args(vmm, args, a.memory, mf) if mode == "shared" else args)


def settle(src, prefix, lines, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and src.alive():
        src.poll_lines()
        if sum(1 for _, l in src.seen if l.startswith(prefix)) >= lines:
            return True
        time.sleep(0.05)
    return False


def migrate(src, dst, vmm, mode, uri, a):
    caps = [{"capability": "x-ignore-shared", "state": mode == "shared"}]
    for q in (src.qmp(), dst.qmp()):
        q.cmd("migrate-set-capabilities", capabilities=caps)
    q = src.qmp()
    bw = 0 if vmm == "kmig" else mig.QEMU_UNLIMITED
    q.cmd("migrate-set-parameters", **{"max-bandwidth": bw, "downtime-limit": a.downtime})
    t0 = time.monotonic()
    q.cmd("migrate", uri=uri)
    r = {}
    while time.monotonic() - t0 < a.cap:
        mig.poll_consoles((src, dst), mig.POLL_LINES_S * 4)
        r = q.cmd("query-migrate")
        if r.get("status") in kt.MIG_FINAL:
            break
    if r.get("status") not in kt.MIG_FINAL:
        q.cmd("migrate_cancel")
        r = dict(r, status="not done at cap")
    mig.poll_consoles((src, dst), 1.0)      # the destination's first reports
    return r, t0, time.monotonic()


def one_run(env, vmm, mode, rep, a):
    d = tempfile.mkdtemp(prefix="lu-", dir=env["tmp"])
    mf = os.path.join(a.shm_dir, "kmig-lu-%d-%s" % (os.getpid(), vmm))
    wl = "workload=idle" if a.workload == "idle" else "workload=stress mb=%d" % a.mb
    cl = "%s report_ms=%d tsc_khz=%d" % (wl, mig.REPORT_MS, env["tsc_khz"])
    prefix = "heartbeat" if a.workload == "idle" else "stress cpu=0 "
    res = {"vmm": vmm, "mode": mode, "rep": rep, "workload": a.workload,
           "memory": a.memory, "loadavg": mig.loadavg()}
    sock = os.path.join(d, "mig.sock")
    src = dst = None
    try:
        src = vm(env, vmm, mode, cl, a, d, "src", mf)
        if not settle(src, prefix, mig.SETTLE_LINES):
            res["status"] = "setup-failed"
            return res
        inc = "unix:" + sock
        dst = vm(env, vmm, mode, cl, a, d, "dst", mf, incoming=inc)
        if not mig.wait_dst_ready(dst, vmm):
            res.update(status="dst-failed", output=dst.output()[-500:])
            return res
        r, t0, t1 = migrate(src, dst, vmm, mode, "unix:" + sock, a)
        ram = r.get("ram", {})
        res.update(status=r.get("status"), total_ms=r.get("total-time"),
                   downtime_ms=r.get("downtime"), wall_s=round(t1 - t0, 3),
                   transferred=ram.get("transferred"), pages=ram.get("normal"),
                   guest_gap_ms=mig.switchover_gap(src.seen, dst.seen, prefix),
                   error=r.get("error-desc"))
        return res
    except (OSError, EOFError, RuntimeError) as e:
        res.update(status="error", error=repr(e))
        return res
    finally:
        for p in (src, dst):
            if p:
                p.kill()
        if os.path.exists(mf):
            os.unlink(mf)
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
                    "guest_gap_ms": mig.med([r.get("guest_gap_ms") for r in done]),
                    "mib": mig.med([(r.get("transferred") or 0) / (1 << 20) for r in done])})
    return out


def table(summary):
    f = lambda x, p="%d": "-" if x is None else p % x  # noqa: E731
    lines = ["%-7s %-5s %6s %9s %9s %9s %9s" % (
        "mode", "vmm", "done", "total ms", "down ms", "guest ms", "MiB")]
    for s in summary:
        lines.append("%-7s %-5s %6s %9s %9s %9s %9s" % (
            s["mode"], s["vmm"], "%d/%d" % (s["completed"], s["runs"]), f(s["total_ms"]),
            f(s["downtime_ms"]), f(s["guest_gap_ms"]), f(s["mib"], "%.1f")))
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--memory", default="4G")
    p.add_argument("--workload", choices=("idle", "stress"), default="stress")
    p.add_argument("--mb", type=int, default=1024, help="stress: MiB the guest rewrites")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--vmms", default="kmig,qemu")
    p.add_argument("--downtime", type=int, default=300, help="downtime-limit, ms")
    p.add_argument("--ring", type=int, default=4096, help="dirty ring entries, 0 = bitmap")
    p.add_argument("--cap", type=float, default=120.0, help="seconds before it is cancelled")
    p.add_argument("--shm-dir", default="/dev/shm", help="where the memory files go (tmpfs)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tsc-khz", type=int, default=0)
    p.add_argument("--out", default=os.path.join(mig.RESULTS, "local-update.json"))
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="kmig-lu-")
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
        mig.save_results(a, "local-update", info, bins, runs, summary, table(summary))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
