#!/usr/bin/env python3
"""Dirty-tracking benchmark: bitmap vs dirty ring (fixed and adaptive reaper).

Builds bench/dirty/dirty_bench.c (with the Makefile's flags, linked with
kmig's objects) into build/bench/dirty_bench, which boots the test guest
in-process and measures one thing per run.  Four measurements:

  sync      cost of one dirty__sync per GiB of guest RAM (idle guest of
            1/4/16 GiB) and per dirty page (stressed 1 GiB guest, syncs
            every 2/10/50 ms, least-squares slope of sync time on pages),
            bitmap vs a 16384-entry ring with the fixed reaper;
  ringfull  ring-full exits per second, fixed vs adaptive reaper, guest
            `stress mb=16` and `mb=256` with kmig's vCPU throttle at 0/50/80 %
            (lower write rates), 4096-entry ring, a sync every second;
  pace      the guest's page-write pace (stress ms_per_gib) with tracking
            off, bitmap, ring+fixed, ring+adaptive, a sync every 100 ms;
  startstop time to start and stop tracking on a 16 GiB guest that touched
            1 GiB (fill-free), and the guest's longest heartbeat gap meanwhile.

Writes bench/results/dirty.json and prints a table.  Never asserts.
    python3 bench/dirty/run.py [--quick] [--reps N] [--only sync,ringfull,pace,startstop]
With --only, the other sections of an existing output file are kept.
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
# the migration benchmark's stress line parsing (its warm rule)
sys.path.insert(0, os.path.join(ROOT, "bench", "migrate"))
import run as mb  # noqa: E402  (the migration benchmark's helpers)
RESULTS = os.path.join(ROOT, "bench", "results")
HELPER = os.path.join(ROOT, "build", "bench", "dirty_bench")
CFLAGS = ["-std=c11", "-D_GNU_SOURCE", "-O2", "-g", "-Wall", "-Wextra", "-Werror", "-Isrc", "-pthread"]
LDLIBS = ["-ljansson", "-lzstd", "-llz4", "-lz", "-lgnutls", "-luuid", "-pthread", "-lm"]
GIB = 1 << 30
PAGES_PER_GIB = GIB // 4096
HEARTBEAT = re.compile(r"^heartbeat t_ms=(\d+) gap_ms=(\d+)")
RING = 4096


def build():
    subprocess.run(["make", "-s", "all", "guest"], cwd=ROOT, check=True)
    objs = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(os.path.join(ROOT, "build", "obj"))
                  for f in fs if f.endswith(".o") and not (dp.endswith("obj") and f == "main.o"))
    os.makedirs(os.path.dirname(HELPER), exist_ok=True)
    subprocess.run(["cc"] + CFLAGS + ["-o", HELPER, "bench/dirty/dirty_bench.c"] + objs + LDLIBS,
                   cwd=ROOT, check=True)


def run_helper(tmp, name, mem, cmdline, mode, ring=0, reaper="adaptive", **kw):
    """Runs the helper once; returns (its JSON, the guest's console text)."""
    console = os.path.join(tmp, name + ".console")
    args = [HELPER, "--mem", mem, "--cmdline", cmdline, "--console", console, "--mode", mode,
            "--ring", str(ring), "--reaper", reaper]
    for k, v in kw.items():
        args += ["--" + k.replace("_", "-"), str(v)]
    p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=300)
    try:
        with open(console, "rb") as f:
            text = f.read()
    except OSError:
        text = b""
    if p.returncode != 0 or not p.stdout.strip():
        return {"error": (p.stderr or "")[-400:]}, text
    return json.loads(p.stdout.strip().splitlines()[-1]), text


def lines_between(text, lo, hi):
    return text[lo:hi].decode(errors="replace").splitlines()


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def slope(xs, ys):
    """Least-squares slope and intercept of ys on xs."""
    n = len(xs)
    if n < 2:
        return None, None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if not sxx:
        return None, my
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return b, my - b * mx


BACKENDS = {"bitmap": {"ring": 0}, "ring-fixed": {"ring": RING, "reaper": "fixed"},
            "ring-adaptive": {"ring": RING, "reaper": "adaptive"}}
# The sync-cost runs use a ring that holds 50 ms of writes, so that the sync
# (not ring-full exits on the vCPU thread) harvests the entries.
SYNC_RING = 16384
SYNC_BACKENDS = {"bitmap": {"ring": 0}, "ring%d-fixed" % SYNC_RING: {"ring": SYNC_RING, "reaper": "fixed"}}


# ---------------------------------------------------------------- sync cost

def bench_sync(tmp, reps, quick):
    out = {"per_gib": [], "per_page": []}
    sizes = ["1G", "4G"] if quick else ["1G", "4G", "16G"]
    for backend in SYNC_BACKENDS:
        for mem in sizes:
            meds = []
            for r in range(reps):
                res, _ = run_helper(tmp, "sync-%s-%s-%d" % (backend, mem, r), mem,
                                    "workload=idle report_ms=1000", "sync", settle_ms=300,
                                    duration_ms=1500, interval_ms=5, kick=1, **SYNC_BACKENDS[backend])
                if "error" not in res:
                    meds.append(median(res["sync_ns"][1:]))
            gib = int(mem[:-1])
            m = median(meds)
            out["per_gib"].append({"backend": backend, "mem_gib": gib, "median_sync_us": m and m / 1e3,
                                   "us_per_gib": m and m / 1e3 / gib, "runs": meds})
            print("  sync idle %-16s %4s: %s us" % (backend, mem, m and round(m / 1e3, 1)), flush=True)
        for iv in ([2, 20] if quick else [2, 10, 50]):
            xs, ys = [], []
            for r in range(reps):
                res, _ = run_helper(tmp, "syncp-%s-%d-%d" % (backend, iv, r), "1G",
                                    "workload=stress mb=256 report_ms=1000", "sync", settle_ms=1000,
                                    duration_ms=2000, interval_ms=iv, kick=1, **SYNC_BACKENDS[backend])
                if "error" not in res:
                    xs += res["pages"][2:]
                    ys += res["sync_ns"][2:]
            out["per_page"].append({"backend": backend, "interval_ms": iv, "samples": len(xs),
                                    "median_pages": median(xs), "median_sync_us": median(ys) and median(ys) / 1e3})
            print("  sync stress %-16s every %2d ms: %s pages, %s us" %
                  (backend, iv, median(xs), median(ys) and round(median(ys) / 1e3, 1)), flush=True)
            out.setdefault("_xy", {}).setdefault(backend, ([], []))
            out["_xy"][backend][0].extend(xs)
            out["_xy"][backend][1].extend(ys)
    fits = {}
    for backend, (xs, ys) in out.pop("_xy").items():
        b, a = slope(xs, ys)
        fits[backend] = {"ns_per_page": b, "intercept_us": a and a / 1e3, "samples": len(xs)}
    out["per_page_fit"] = fits
    for backend in SYNC_BACKENDS:
        rows = [r for r in out["per_gib"] if r["backend"] == backend and r["median_sync_us"]]
        if len(rows) >= 2:
            b, a = slope([r["mem_gib"] for r in rows], [r["median_sync_us"] for r in rows])
            fits[backend].update({"us_per_gib_slope": b, "us_at_0_gib": a})
    return out


# ---------------------------------------------------------------- ring-full exits

def stress_reports(text, lo, hi):
    """vCPU 0's stress reports between console offsets lo and hi, as
    (t_ms, ms/GiB, max ms/GiB): warm ones only (bench/migrate's
    stress_lines: none counts a first write to a page, which costs seconds
    per GiB when the host has given that memory back)."""
    before = len(text[:lo].decode(errors="replace").splitlines())
    whole = text[:text.rfind(b"\n", 0, hi) + 1]    # a line still being written left out
    seen = list(enumerate(whole.decode(errors="replace").splitlines()))
    return [(l["t_ms"], l["ms_per_gib"], l["max_ms_per_gib"]) for l in mb.stress_lines(seen)
            if l["host"] >= before and l["cpu"] == 0 and l["warm"]]


def bench_ringfull(tmp, reps, quick):
    """Write rates: the stress size (working set) and kmig's vCPU throttle."""
    rows = []
    points = [(16, 0), (256, 0), (256, 80)] if quick else [(16, 0), (256, 0), (256, 50), (256, 80)]
    for mib, thr in points:
        for reaper in ("fixed", "adaptive"):
            runs = []
            for r in range(reps):
                res, text = run_helper(tmp, "full-%d-%d-%s-%d" % (mib, thr, reaper, r), "1G",
                                       "workload=stress mb=%d report_ms=1000" % mib, "sync",
                                       ring=RING, reaper=reaper, settle_ms=1000, throttle=thr,
                                       duration_ms=3000 if quick else 6000, interval_ms=1000, kick=1)
                if "error" in res:
                    continue
                s = res["elapsed_ns"] / 1e9
                rep = stress_reports(text, res["console_from"], res["console_to"])
                runs.append({"ring_full_per_s": res["ring_full_exits"] / s,
                             "harvested_per_s": res["harvested"] / s,
                             "reaper_runs_per_s": res["reaper_runs"] / s,
                             "guest_ms_per_gib": median([x[1] for x in rep[1:]])})
            row = {"mb": mib, "throttle_pct": thr, "reaper": reaper, "ring": RING, "runs": runs}
            for k in ("ring_full_per_s", "harvested_per_s", "reaper_runs_per_s", "guest_ms_per_gib"):
                row[k] = median([x[k] for x in runs])
            rows.append(row)
            print("  ring-full mb=%-4d throttle=%2d%% %-8s: %s exits/s, %s entries/s" %
                  (mib, thr, reaper, row["ring_full_per_s"] and round(row["ring_full_per_s"], 1),
                   row["harvested_per_s"] and round(row["harvested_per_s"])), flush=True)
    return rows


# ---------------------------------------------------------------- guest pace

def bench_pace(tmp, reps, quick):
    rows = []
    for cfg in ("off", "bitmap", "ring-fixed", "ring-adaptive"):
        runs = []
        for r in range(reps):
            kw = dict(settle_ms=1500, duration_ms=6000 if quick else 10000)
            if cfg == "off":
                res, text = run_helper(tmp, "pace-off-%d" % r, "1G",
                                       "workload=stress mb=256 report_ms=2000", "off", **kw)
            else:
                res, text = run_helper(tmp, "pace-%s-%d" % (cfg, r), "1G",
                                       "workload=stress mb=256 report_ms=2000", "sync",
                                       interval_ms=100, kick=1, **kw, **BACKENDS[cfg])
            if "error" in res:
                continue
            rep = stress_reports(text, res["console_from"], res["console_to"])[1:]
            if rep:
                runs.append({"ms_per_gib": median([x[1] for x in rep]),
                             "max_ms_per_gib": max(x[2] for x in rep), "reports": rep})
        ms = median([x["ms_per_gib"] for x in runs])
        row = {"tracking": cfg, "ms_per_gib": ms, "pages_per_s": ms and PAGES_PER_GIB / (ms / 1e3),
               "max_ms_per_gib": median([x["max_ms_per_gib"] for x in runs]), "runs": runs}
        rows.append(row)
        print("  pace %-13s: %s ms/GiB" % (cfg, ms), flush=True)
    base = rows[0]["ms_per_gib"]
    for row in rows:
        row["slowdown_vs_off"] = row["ms_per_gib"] / base if base and row["ms_per_gib"] else None
    return rows


# ---------------------------------------------------------------- start / stop

def gaps(lines):
    return [int(m.group(2)) for m in (HEARTBEAT.match(l) for l in lines) if m]


def bench_startstop(tmp, reps, quick):
    rows = []
    for backend in ("bitmap", "ring-adaptive"):
        res, text = run_helper(tmp, "ss-%s" % backend, "16G",
                               "workload=fill-free mb=1024 report_ms=10", "startstop",
                               ready="fill-free done", settle_ms=1000, reps=reps,
                               hold_ms=1000 if quick else 2000, gap_ms=1000, **BACKENDS[backend])
        if "error" in res:
            rows.append({"backend": backend, "error": res["error"]})
            continue
        base = gaps(lines_between(text, 0, res["console_from"][0]))[5:]
        during_start = [max(gaps(lines_between(text, a, b)) or [0])
                        for a, b in zip(res["console_from"], res["console_stopping"])]
        during_stop = [max(gaps(lines_between(text, a, b)) or [0])
                       for a, b in zip(res["console_stopping"], res["console_to"])]
        row = {"backend": backend, "mem_gib": 16, "touched_mib": 1024,
               "start_ms": median(res["start_ns"]) / 1e6, "stop_ms": median(res["stop_ns"]) / 1e6,
               "start_ms_runs": [x / 1e6 for x in res["start_ns"]],
               "stop_ms_runs": [x / 1e6 for x in res["stop_ns"]],
               "heartbeat_ms": 10, "baseline_max_gap_ms": max(base) if base else None,
               "max_gap_after_start_ms": median(during_start), "max_gap_after_stop_ms": median(during_stop),
               "gap_after_start_runs": during_start, "gap_after_stop_runs": during_stop}
        rows.append(row)
        print("  start/stop 16G %-13s: start %.2f ms, stop %.2f ms, heartbeat gap %s/%s ms (baseline %s)" %
              (backend, row["start_ms"], row["stop_ms"], row["max_gap_after_start_ms"],
               row["max_gap_after_stop_ms"], row["baseline_max_gap_ms"]), flush=True)
    return rows


# ---------------------------------------------------------------- report

def fmt(x, nd=1):
    if x is None:
        return "-"
    return ("%%.%df" % nd) % x


def table(res):
    out = []
    s = res.get("sync")
    if s:
        out.append("sync cost (one dirty__sync, kick on)")
        out.append("  %-17s %12s %12s %12s" % ("backend", "us per GiB", "ns per page", "us at 0 GiB"))
        for b, f in s["per_page_fit"].items():
            out.append("  %-17s %12s %12s %12s" % (b, fmt(f.get("us_per_gib_slope")),
                                                   fmt(f.get("ns_per_page"), 0), fmt(f.get("us_at_0_gib"))))
        out.append("  %-17s %6s %12s" % ("backend", "GiB", "median us"))
        for r in s["per_gib"]:
            out.append("  %-17s %6d %12s" % (r["backend"], r["mem_gib"], fmt(r["median_sync_us"])))
    if res.get("ringfull"):
        out.append("ring-full exits, ring %d entries, sync every 1 s" % RING)
        out.append("  %-5s %-9s %-9s %10s %10s %14s %13s" % ("mb", "throttle", "reaper", "exits/s",
                                                               "entries/s", "reaper runs/s", "guest ms/GiB"))
        for r in res["ringfull"]:
            out.append("  %-5d %-9s %-9s %10s %10s %14s %13s" % (r["mb"], "%d%%" % r["throttle_pct"], r["reaper"],
                                                               fmt(r["ring_full_per_s"]),
                                                          fmt(r["harvested_per_s"], 0),
                                                          fmt(r["reaper_runs_per_s"]), fmt(r["guest_ms_per_gib"])))
    if res.get("pace"):
        out.append("guest write pace, stress mb=256, sync every 100 ms")
        out.append("  %-14s %12s %12s %10s" % ("tracking", "ms per GiB", "pages/s", "slowdown"))
        for r in res["pace"]:
            out.append("  %-14s %12s %12s %10s" % (r["tracking"], fmt(r["ms_per_gib"], 2),
                                                  fmt(r["pages_per_s"], 0), fmt(r["slowdown_vs_off"], 1)))
    if res.get("startstop"):
        out.append("start/stop tracking, 16 GiB guest, 1 GiB touched, heartbeat every 10 ms")
        out.append("  %-14s %10s %10s %14s %14s %12s" % ("backend", "start ms", "stop ms", "gap@start ms",
                                                      "gap@stop ms", "base gap ms"))
        for r in res["startstop"]:
            if "error" in r:
                out.append("  %-14s error" % r["backend"])
                continue
            out.append("  %-14s %10s %10s %14s %14s %12s" % (r["backend"], fmt(r["start_ms"], 2),
                                                          fmt(r["stop_ms"], 2), r["max_gap_after_start_ms"],
                                                          r["max_gap_after_stop_ms"], r["baseline_max_gap_ms"]))
    return "\n".join(out)


def host_info():
    with open("/proc/loadavg") as f:
        load = [float(x) for x in f.read().split()[:3]]
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"nproc": os.cpu_count(), "loadavg_start": load, "kernel": platform.release(), "git_head": head}


SECTIONS = ("sync", "ringfull", "pace", "startstop")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3, help="runs per point (medians), default 3")
    ap.add_argument("--quick", action="store_true", help="1 run per point, fewer points, shorter runs")
    ap.add_argument("--only", default="sync,ringfull,pace,startstop")
    ap.add_argument("--out", default=os.path.join(RESULTS, "dirty.json"))
    a = ap.parse_args()
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        print("no /dev/kvm: nothing to measure")
        return 0
    reps = 1 if a.quick else a.reps
    build()
    res = {"host": host_info(), "config": {"reps": reps, "quick": a.quick, "ring_entries": RING,
                                           "sync_ring_entries": SYNC_RING}}
    only = a.only.split(",")
    if set(SECTIONS) - set(only) and os.path.exists(a.out):
        with open(a.out) as f:           # keep the sections not rerun
            old = json.load(f)
        res.update({k: old[k] for k in SECTIONS if k in old and k not in only})
        res["kept_from_earlier_run"] = {"host": old.get("host"), "sections": [k for k in SECTIONS if k in old and k not in only]}
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="kmigbench-dirty-") as tmp:
        for name, fn in (("sync", bench_sync), ("ringfull", bench_ringfull), ("pace", bench_pace),
                         ("startstop", bench_startstop)):
            if name in only:
                print("== %s" % name, flush=True)
                res[name] = fn(tmp, reps, a.quick)
    with open("/proc/loadavg") as f:
        res["host"]["loadavg_end"] = [float(x) for x in f.read().split()[:3]]
    res["wall_s"] = round(time.time() - t0, 1)
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    print(table(res))
    print("wrote %s (%.0f s)" % (os.path.relpath(a.out, ROOT), res["wall_s"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
