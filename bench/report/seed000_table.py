#!/usr/bin/env python3
"""Seed 000's table from bench/seed000's results (issue 29 item 1).

Reads the seed000-*.json documents the suite publishes (each a
bench/converge document: one part, i.e. vCPUs and bandwidth, its rounds
merged) and writes one markdown report: per part, tracking and stress
size, the mean migration time with its spread and 95 % confidence
interval, the seconds the guest ran below half its pace, and the ratios
the seed argues in (ideas on / off, ring / bitmap with the ideas off,
kmig / QEMU), the seed's published ratios beside ours; and for the part
with each idea off alone, each idea's own gain with a bootstrap interval.

A run still migrating at the cap ("did not converge") counts at the cap:
a mean with such a run is a lower bound (marked >=), and so is a ratio
whose numerator is one, an upper bound (<=) when its denominator is. A run
that failed or could not start (any other status but completed) is left
out and counted as failed.

  bench/report/seed000_table.py [--out bench/results/seed000.md] [--json F] [FILES...]

(in bench/report, as the plots: the suite's key leaves it out, so a fix to
the table does not make the measured cells run again)

Pure Python and the standard library; tested without KVM
(tests/bench/test_seed000_table.py).
"""
import argparse
import glob
import json
import math
import os
import random
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CAPPED = "did not converge"   # bench/converge's status of a run cancelled at the cap
# the seed's cover letter, Test1 "2C4G": mean ms over 50-200 runs, 10 GbE
# (bench/seed000/README.md): (ring, stress MiB) -> (optimized, unoptimized)
SEED_RING = {(4096, 1024): (15888, 23992), (4096, 3072): (13320, 44234),
             (65536, 1024): (10036, 24546), (65536, 3072): (12132, 44939)}
SEED_BITMAP = {1024: 24597, 3072: 45254}
IDEAS = {1: "one ring harvest per sync", 2: "adaptive reaper",
         3: "no all-vCPU kick while throttled", 4: "ring-based dirty rate",
         5: "computed throttle"}
TRACKINGS = ((0, "bitmap"), (4096, "ring 4096"), (65536, "ring 65536"))
# two-sided 95 % Student t for 1..30 degrees of freedom; the normal's beyond
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
       2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
       2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t95(df):
    return T95[df - 1] if 1 <= df <= len(T95) else 1.960


def run_time_s(run, cap_s):
    """(seconds, capped): query-migrate's total time of a completed run;
    the cap (or the run's wall time, if longer) for one cancelled there;
    None for a run that failed or never started."""
    if run.get("status") == "completed" and run.get("total_time_ms") is not None:
        return run["total_time_ms"] / 1000.0, False
    if run.get("status") == CAPPED:
        return max(cap_s, run.get("wall_s") or 0.0), True
    return None


def cell_stats(runs, cap_s):
    """Mean, spread and 95 % interval of a cell's times; None for no runs
    that completed or reached the cap."""
    timed = [(r, run_time_s(r, cap_s)) for r in runs]
    failed = sum(1 for _, t in timed if t is None)
    runs = [r for r, t in timed if t is not None]
    times = [t for _, t in timed if t is not None]
    if not runs:
        return None
    xs = [t for t, _ in times]
    n = len(xs)
    sd = statistics.stdev(xs) if n > 1 else None
    below = [(r.get("guest") or {}).get("s_below_half_pace") for r in runs]
    below = [b for b in below if b is not None]
    mbs = [r["sent_bytes"] / (r["total_time_ms"] / 1000.0) / 1e6 for r in runs
           if r.get("status") == "completed" and r.get("sent_bytes") and r.get("total_time_ms")]
    return {"n": n, "failed": failed, "completed": sum(1 for _, c in times if not c),
            "lower_bound": any(c for _, c in times), "times_s": xs,
            "mean_s": statistics.fmean(xs), "sd_s": sd,
            "ci95_s": t95(n - 1) * sd / math.sqrt(n) if sd is not None else None,
            "min_s": min(xs), "max_s": max(xs),
            "mean_s_below_half_pace": statistics.fmean(below) if below else None,
            "sd_s_below_half_pace": statistics.stdev(below) if len(below) > 1 else None,
            "mean_mb_per_s": statistics.fmean(mbs) if mbs else None}


def ratio(a, b, reps=2000, seed=0):
    """a's mean over b's, with a 95 % bootstrap interval (percentiles,
    each side resampled on its own; a fixed seed: the same input gives the
    same interval) and its bound: ">=" when a holds capped runs, "<=" when
    b does, None when both or neither (both: not a bound either way)."""
    if not a or not b or b["mean_s"] <= 0:
        return None
    rng = random.Random(seed)
    boots = []
    for _ in range(reps):
        ma = statistics.fmean(rng.choices(a["times_s"], k=len(a["times_s"])))
        mb = statistics.fmean(rng.choices(b["times_s"], k=len(b["times_s"])))
        boots.append(ma / mb)
    boots.sort()
    bound = None
    if a["lower_bound"] != b["lower_bound"]:
        bound = ">=" if a["lower_bound"] else "<="
    both = a["lower_bound"] and b["lower_bound"]
    return {"ratio": a["mean_s"] / b["mean_s"], "lo": boots[int(0.025 * reps)],
            "hi": boots[int(0.975 * reps) - 1], "bound": bound, "both_capped": both,
            "n_min": min(a["n"], b["n"])}


def part_of(doc):
    cfg = doc.get("config", {})
    return {"cpus": cfg.get("cpus"), "bandwidth": cfg.get("max_bandwidth_bytes_per_s"),
            "cap_s": cfg.get("cap_s") or 300.0, "memory": cfg.get("memory"),
            "git_head": (doc.get("host") or {}).get("git_head"),
            "kmig_sha256": (doc.get("binaries") or {}).get("kmig_sha256"),
            "rounds": len({r.get("rep") for r in doc.get("runs", [])}) or None}


def cells_of(doc):
    """(config, stress MiB) -> cell stats."""
    cap = part_of(doc)["cap_s"]
    groups = {}
    for r in doc.get("runs", []):
        groups.setdefault((r["config"], r["stress_mib"]), []).append(r)
    return {k: cell_stats(v, cap) for k, v in groups.items()}


def tracking_name(ring):
    return "bitmap" if not ring else "ring%d" % ring


def main_rows(cells, sizes):
    """One row per tracking and stress size of the main part."""
    rows = []
    for ring, label in TRACKINGS:
        t = tracking_name(ring)
        for mib in sizes:
            on = cells.get(("kmig-%s+seed-all" % t, mib))
            off = cells.get(("kmig-%s+seed-none" % t, mib))
            qemu = cells.get(("qemu-%s+ac" % t, mib))
            dflt = cells.get(("kmig-%s+default" % t, mib))
            if not (qemu or dflt or off):    # the each-off part: its own table
                continue
            bm_off = cells.get(("kmig-bitmap+seed-none", mib))
            seed = SEED_RING.get((ring, mib))
            row = {"tracking": label, "ring": ring, "stress_mib": mib, "seed_all": on,
                   "seed_none": off, "qemu_ac": qemu, "default": dflt,
                   "on_over_off": ratio(on, off), "all_over_qemu": ratio(on, qemu),
                   "default_over_qemu": ratio(dflt, qemu),
                   "off_ring_over_bitmap": ratio(off, bm_off) if ring else None,
                   "seed_on_over_off": seed[0] / seed[1] if seed else None,
                   "seed_off_ring_over_bitmap": (seed[1] / SEED_BITMAP[mib]
                                                 if seed and mib in SEED_BITMAP else None)}
            best = row["default_over_qemu"] or row["all_over_qemu"]
            row["goal_half_qemu"] = goal(best)
            rows.append(row)
    return rows


def goal(r):
    """kmig at most half QEMU's time: True where the whole 95 % interval
    is at most 0.5, False where it is all above; a ratio over capped runs
    only in the direction its bound allows (<=: only True, >=: only
    False); else None (undecided), as with one run a side (no interval)."""
    if not r or r["both_capped"] or r["n_min"] < 2:
        return None
    if r["hi"] <= 0.5 and r["bound"] != ">=":
        return True
    if r["lo"] > 0.5 and r["bound"] != "<=":
        return False
    return None


def each_rows(cells, sizes):
    rows = []
    for mib in sizes:
        on = cells.get(("kmig-ring4096+seed-all", mib))
        for i, what in IDEAS.items():
            off = cells.get(("kmig-ring4096+seed-no%d" % i, mib))
            if not off:
                continue
            rows.append({"stress_mib": mib, "idea": i, "what": what, "seed_all": on,
                         "off_alone": off, "off_over_on": ratio(off, on)})
    return rows


# ------------------------------------------------------------ markdown

def fmt_cell(c):
    if not c:
        return "–"
    ge = "≥" if c["lower_bound"] else ""
    ci = " ± %.1f" % c["ci95_s"] if c["ci95_s"] is not None and not c["lower_bound"] else ""
    sd = ", sd %.1f" % c["sd_s"] if c["sd_s"] is not None else ""
    done = "" if c["completed"] == c["n"] else ", %d/%d ended" % (c["completed"], c["n"])
    failed = ", %d failed" % c["failed"] if c["failed"] else ""
    return "%s%.1f%s (n %d%s%s%s)" % (ge, c["mean_s"], ci, c["n"], sd, done, failed)


def fmt_below(c):
    if not c or c["mean_s_below_half_pace"] is None:
        return "–"
    return "%.1f" % c["mean_s_below_half_pace"]


def fmt_ratio(r):
    if not r:
        return "–"
    if r["both_capped"]:
        return "– (both capped)"
    return "%s%.2f (%.2f–%.2f)" % ({">=": "≥", "<=": "≤"}.get(r["bound"], ""), r["ratio"],
                                   r["lo"], r["hi"])


def fmt_goal(g):
    return {True: "yes", False: "**no**", None: "undecided"}[g]


def bw_name(bw):
    return "unlimited (max-bandwidth 0)" if not bw else "%d MB/s" % (bw // 1000000)


def part_md(name, part, cells):
    sizes = sorted({mib for _, mib in cells})
    head = "## %s: %s vCPU(s), %s, %s guest, cap %.0f s, commit %s, %s rounds\n\n" % (
        name, part["cpus"], bw_name(part["bandwidth"]), part["memory"], part["cap_s"],
        (part["git_head"] or "?")[:7], part["rounds"] or "?")
    out = [head]
    rows = main_rows(cells, sizes)
    if rows:
        out.append("| tracking | stress | kmig ideas on (s) | kmig ideas off (s) | QEMU 7.2 "
                   "auto-converge (s) | kmig default (s) | s below ½ pace on / off / QEMU | "
                   "on / off (seed's) | off: ring / bitmap (seed's) | kmig / QEMU "
                   "(default, else on) | ≤ ½ QEMU |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            seed = " (%.2f)" % r["seed_on_over_off"] if r["seed_on_over_off"] else " (–)"
            seedrb = (" (%.2f)" % r["seed_off_ring_over_bitmap"]
                      if r["seed_off_ring_over_bitmap"] else "")
            kq = r["default_over_qemu"] or r["all_over_qemu"]
            out.append("| %s | %d MiB | %s | %s | %s | %s | %s / %s / %s | %s%s | %s%s | %s | %s |\n"
                       % (r["tracking"], r["stress_mib"], fmt_cell(r["seed_all"]),
                          fmt_cell(r["seed_none"]), fmt_cell(r["qemu_ac"]),
                          fmt_cell(r["default"]), fmt_below(r["seed_all"]),
                          fmt_below(r["seed_none"]), fmt_below(r["qemu_ac"]),
                          fmt_ratio(r["on_over_off"]), seed,
                          fmt_ratio(r["off_ring_over_bitmap"]), seedrb, fmt_ratio(kq),
                          fmt_goal(r["goal_half_qemu"])))
    each = each_rows(cells, sizes)
    if each:
        out.append("\nEach idea off alone (ring 4096), against all on: a ratio above 1 is "
                   "the idea's gain.\n\n| stress | idea off | time (s) | all on (s) | off / on "
                   "(95 %) | s below ½ pace off / on |\n|---|---|---|---|---|---|\n")
        for r in each:
            out.append("| %d MiB | %d, %s | %s | %s | %s | %s / %s |\n" % (
                r["stress_mib"], r["idea"], r["what"], fmt_cell(r["off_alone"]),
                fmt_cell(r["seed_all"]), fmt_ratio(r["off_over_on"]), fmt_below(r["off_alone"]),
                fmt_below(r["seed_all"])))
    tput = {k: c["mean_mb_per_s"] for k, c in cells.items() if c and c["mean_mb_per_s"]}
    if tput and not part["bandwidth"]:
        out.append("\nThe throughput loopback gave (sent bytes over total time, MB/s, mean "
                   "of the completed runs):\n\n| config | %s |\n|---|%s\n" % (
                       " | ".join("%d MiB" % m for m in sizes), "---|" * len(sizes)))
        for cfg in sorted({k[0] for k in tput}):
            out.append("| %s | %s |\n" % (cfg, " | ".join(
                "%.0f" % tput[(cfg, m)] if (cfg, m) in tput else "–" for m in sizes)))
    return "".join(out), rows, each


LEGEND = """
Times: query-migrate's total time of each run, mean over the runs ± the
95 % confidence interval (Student t), sd the standard deviation, n the
runs; a run still migrating at the cap counts at the cap, so a mean with
one is a lower bound (≥, no interval) and "k/n ended" says how many
completed; a run that failed or never started is left out ("k failed"). Ratios:
of the means, with a 95 % bootstrap interval in brackets; ≥ or ≤ when one
side holds capped runs, "both capped" when both do. The seed's ratios
(in brackets) come from its published means (bench/seed000/README.md:
10 GbE, a 64-CPU host, 50-200 runs a cell; its bitmap row, ring 0, is set
beside both ring sizes); compare ratios, not times.
"≤ ½ QEMU": kmig's default (its ideas-on row where no default row ran)
over QEMU's auto-converge on the same tracking: yes when the whole
interval is at most 0.5, no when all of it is above; undecided when the
interval straddles 0.5, a cap hides the answer or a side has one run.
"""


def report(paths):
    docs = []
    for p in paths:
        with open(p) as f:
            docs.append((os.path.splitext(os.path.basename(p))[0], json.load(f)))
    md, summary = ["# Seed 000's table, measured\n"], []
    for name, doc in docs:
        part = part_of(doc)
        cells = cells_of(doc)
        text, rows, each = part_md(name, part, cells)
        md.append("\n" + text)
        summary.append({"part": name, **part, "rows": rows, "each_off": each})
    md.append(LEGEND)
    return "".join(md), summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--out", default=None, help="markdown here (default: stdout)")
    ap.add_argument("--json", default=None, help="the summary as JSON here")
    a = ap.parse_args(argv)
    files = a.files or sorted(glob.glob(os.path.join(ROOT, "bench", "results",
                                                     "seed000-*.json")))
    if not files:
        print("seed000 table: no results (bench/results/seed000-*.json); run "
              "bench/seed000/run.sh on a native /dev/kvm first", file=sys.stderr)
        return 2
    md, summary = report(files)
    if a.out:
        with open(a.out, "w") as f:
            f.write(md)
    else:
        sys.stdout.write(md)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
