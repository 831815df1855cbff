#!/usr/bin/env python3
"""Turns benchmark JSON into PNG plots a person would look at
(matplotlib, Debian's python3-matplotlib).

  converge.json (and files like it): per stress size, one figure per run
      of each config (rep 0): the guest's pace (ms per GiB of page writes,
      log scale), bytes sent, the dirty rate and the throttle over the
      migration's time, kmig and QEMU side by side;
  recovery.json: per outcome, the guest's pace over time for every config
      (rep 0), with the start and the end of the migration marked;
  free-pages*.json, linux-free-pages*.json: per case, the MiB each VMM
      sent in each mode (bar: median of the completed runs; dots: runs).

Usage: python3 bench/report/plot.py [JSON ...] [--out DIR]
(default: every converge*, recovery* and *free-pages* JSON in bench/results,
written to bench/results/plots/).  Never asserts.
"""
import argparse
import glob
import json
import os
import statistics
import sys

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.abspath(os.path.join(HERE, "..", "results"))
MIB = 1 << 20
COLORS = {"kmig": "tab:blue", "qemu": "tab:orange"}


def save(fig, path):
    """Writes fig to path as PNG and closes it; returns path."""
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def converge_runs(doc):
    """{stress_mib: [run of rep 0 per config]} with a timeline."""
    out = {}
    for r in doc.get("runs", []):
        if r.get("rep", 0) == 0 and r.get("timeline"):
            out.setdefault(r.get("stress_mib"), []).append(r)
    return out


def pace_series(run):
    """(seconds since migrate, ms/GiB) of cpu 0's guest reports."""
    g = run.get("guest") or {}
    w = g.get("window_guest_ms")
    if not w:
        return [], []
    pts = [((t - w[0]) / 1000.0, v) for c, t, v, _ in g.get("reports", []) if c == 0]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_converge(doc, name, outdir):
    written = []
    for mib, runs in sorted(converge_runs(doc).items(), key=lambda x: x[0] or 0):
        fig, ax = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
        for r in runs:
            label = r["config"]
            tl = r["timeline"]
            t = [x[0] for x in tl]
            ax[0].plot(*pace_series(r), label=label)
            ax[1].plot(t, [(x[2] or 0) / 1e6 for x in tl], label=label)
            ax[2].plot(t, [(x[4] or 0) * 4096 / 1e6 for x in tl], label=label)
            ax[3].plot(t, [x[5] or 0 for x in tl], label=label)
        ax[0].set_yscale("log")
        ax[0].set_ylabel("guest ms per GiB\n(log; lower is faster)")
        ax[1].set_ylabel("sent (MB)")
        ax[2].set_ylabel("dirty rate (MB/s)\nas each VMM reports it")
        ax[3].set_ylabel("cpu throttle (%)")
        ax[3].set_xlabel("seconds since migrate")
        ax[0].legend(fontsize=7)
        fig.suptitle("%s: %s MiB of stress (rep 0)" % (name, mib))
        written.append(save(fig, os.path.join(outdir, "%s-%sM.png" % (name, mib))))
    return written


def run_end(run, default):
    """When the run's migration ended: its first sample after it (with
    --engaged the end waits for the policy to act, so it differs by run)."""
    after = [x["t"] for x in run.get("samples", []) if x.get("phase") == "after"]
    return min(after) if after else default


def plot_recovery(doc, name, outdir):
    written = []
    by_outcome = {}
    for r in doc.get("runs", []):
        if r.get("rep") == 0 and r.get("reports"):
            by_outcome.setdefault(r["outcome"], []).append(r)
    p = doc.get("params", {})
    t_mig = p.get("before_s", 0)
    for outcome, runs in by_outcome.items():
        fig, ax = plt.subplots(figsize=(10, 5))
        for r in runs:
            line, = ax.plot([x[0] for x in r["reports"]], [x[1] for x in r["reports"]],
                            label=r["config"])
            ax.axvline(run_end(r, t_mig + p.get("migrate_s", 0)), color=line.get_color(),
                       linestyle=":")
        ax.axvline(t_mig, color="grey", linestyle="--")
        ax.set_yscale("log")
        ax.set_ylabel("guest ms per GiB (log; lower is faster)")
        ax.set_xlabel("seconds (dashed: migrate; dotted, each run's colour: %s)" % outcome)
        ax.legend(fontsize=7)
        ax.set_title("%s: guest pace around a migration that ends by %s (rep 0)"
                     % (name, outcome))
        written.append(save(fig, os.path.join(outdir, "%s-%s.png" % (name, outcome))))
    return written


def plot_free_pages(doc, name, outdir):
    """Per case, MiB sent by mode, kmig and QEMU side by side: the median
    of the completed runs as a bar, each completed run as a dot."""
    runs = [r for r in doc.get("runs", []) if r.get("status") == "completed"
            and r.get("transferred") is not None]
    written = []
    for case in sorted({r["case"] for r in runs}):
        rc = [r for r in runs if r["case"] == case]
        modes = [m for m in ("none", "hints", "hints-wait", "reporting", "balloon")
                 if any(r["mode"] == m for r in rc)]
        modes += sorted({r["mode"] for r in rc} - set(modes))
        vmms = [v for v in ("kmig", "qemu") if any(r["vmm"] == v for r in rc)]
        fig, ax = plt.subplots(figsize=(1.6 + 1.4 * len(modes), 4))
        width, labeled = 0.8 / max(1, len(vmms)), set()
        for j, vmm in enumerate(vmms):
            for i, mode in enumerate(modes):
                mib = sorted(r["transferred"] / MIB for r in rc
                             if r["vmm"] == vmm and r["mode"] == mode)
                if not mib:
                    continue
                x = i + (j - (len(vmms) - 1) / 2) * width
                ax.bar(x, statistics.median(mib), width * 0.9, color=COLORS[vmm],
                       label=None if vmm in labeled else vmm)
                labeled.add(vmm)
                ax.plot([x] * len(mib), mib, "k.", ms=4)
        ax.set_xticks(range(len(modes)))
        ax.set_xticklabels(modes)
        ax.set_ylabel("MiB sent (bar: median; dots: runs)")
        info = doc.get("info") or {}
        ax.set_title("%s, case %s (%s%s)" % (name, case, (info.get("git_head") or "?")[:7],
                                             ", emulated" if info.get("emulated") else ""))
        ax.legend()
        written.append(save(fig, os.path.join(outdir, "%s-%s.png" % (name, case))))
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*")
    ap.add_argument("--out", default=os.path.join(RESULTS, "plots"))
    a = ap.parse_args()
    files = a.files or sorted(glob.glob(os.path.join(RESULTS, "converge*.json")) +
                              glob.glob(os.path.join(RESULTS, "recovery*.json")) +
                              glob.glob(os.path.join(RESULTS, "*free-pages*.json")))
    os.makedirs(a.out, exist_ok=True)
    for f in files:
        with open(f) as fh:
            doc = json.load(fh)
        name = os.path.splitext(os.path.basename(f))[0]
        kind = doc.get("benchmark")
        if kind == "recovery":
            out = plot_recovery(doc, name, a.out)
        elif kind in ("free-pages", "linux-free-pages"):
            out = plot_free_pages(doc, name, a.out)
        else:
            out = plot_converge(doc, name, a.out)
        for p in out:
            print("wrote %s" % p)
        if not out:
            print("%s: nothing to plot (no timelines: results from before they were recorded)" % f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
