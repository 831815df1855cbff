#!/usr/bin/env python3
"""Every benchmark, cell by cell, resumable, at one build (issue 29 item 6).

  bench/suite/run.py --plan             the cells, their estimates, the key
  bench/suite/run.py                    runs every cell not done yet
  bench/suite/run.py --hours 2.5        ... but starts no cell that would end
                                        after 2.5 hours from now
  bench/suite/run.py --only 'seed000'   the cells whose name matches
  bench/suite/run.py --status           what is done under the current key
  bench/suite/run.py --commit           commits the suite's state after each
                                        cell (so the next session, or the next
                                        machine, goes on from there)

The key is the hash of what is measured (suite.py): build/kmig, the guest,
QEMU's version, the Linux guest's initramfs sources and the benchmark
scripts.  Cells done under the same key are not run again; after any change
to those the key is new and the suite starts over, so its results always
measure one build.  The state is kept in bench/results/suite/KEY/ (commit
it to carry it to the next session).  When every cell of a benchmark is
done, its published JSON (and markdown) is written to bench/results/, with
rounds merged and retabled by the benchmark itself, then the plots
(bench/report/plot.py) and bench/results/suite.json, the suite's record:
key, commits, hosts, wall time of every cell and the total.

Native cells need a native /dev/kvm; the Linux guest's cells always run
inside scripts/kvm-vm (stock Linux cannot boot on kvm_pvm) and their
results say so.  --allow-emulated lets the native cells run under
emulation, to try the runner itself: then the results go only where
--results says, never into bench/results/.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))
import suite  # noqa: E402

RESULTS = os.path.join(ROOT, "bench", "results")
PY = "/usr/bin/python3"   # Debian's: matplotlib for the plots
CONVERGE = ["bench/converge/run.py"]
RETABLE_CONVERGE = [PY, "bench/converge/run.py", "--retable", "{json}", "--out", "{out}"]
RETABLE_MIGRATE = [PY, "bench/migrate/run.py", "--retable", "{json}", "--out", "{out}"]
CONV7 = ("kmig-bitmap+step,qemu-bitmap+ac,kmig-bitmap+computed,kmig-ring4096+step,"
         "qemu-ring4096+ac,kmig-ring4096+computed,kmig-ring4096+dirty-limit")
CONV1536 = "qemu-ring4096+ac,kmig-ring4096+computed,kmig-ring4096+dirty-limit"
MIGRATE_ONLY = (r"^(idle-2G unlimited (kmig|qemu)-(bitmap|ring4096)$|"
                r"stress128M-2G unlimited (kmig|qemu)-(bitmap|ring4096)$|"
                r"stress128M-2G 125MB/s (kmig-ring4096\+ac-computed|kmig-bitmap\+ac-step|"
                r"qemu-bitmap\+ac|qemu-ring4096\+ac)$)")
# seed 000's own table (bench/seed000/README.md): its ideas all on, all off,
# QEMU's auto-converge between them, and `kmig migrate`'s default (the goal
# is measured on it); each idea off alone at ring 4096
SEED_MAIN = ",".join("kmig-%s+seed-all,qemu-%s+ac,kmig-%s+seed-none,kmig-%s+default"
                     % (b, b, b, b) for b in ("bitmap", "ring4096", "ring65536"))
SEED_EACH = ",".join("kmig-ring4096+seed-%s" % x
                     for x in ("all", "no1", "no2", "no3", "no4", "no5"))
PUSH = "kmig-ring4096+postcopy,qemu-ring4096+postcopy"
XBZRLE = "kmig-ring4096+xbzrle,qemu-ring4096+xbzrle"
PC_RTT = ("kmig-ring4096+postcopy,qemu-ring4096+postcopy,qemu-ring4096+postcopy-preempt,"
          "kmig-ring4096+postcopy-preempt")


def rounds(name, group, argv, sizes, reps, est, retable=RETABLE_CONVERGE):
    """A benchmark run as rounds: one per size and repetition, each with
    every configuration (interleaved as the benchmark does, so outside load
    hits them all)."""
    out = []
    for rep in range(reps):
        for size in sizes:
            tail = ["--sizes", str(size)] if size else []
            out.append(suite.Cell("%s%s-r%d" % (name, "-%dM" % size if size else "", rep),
                                  [PY] + argv + tail + ["--reps", "1", "--out", "{out}"],
                                  group=group, round_=rep, retable=retable, est_min=est))
    return out


def catalogue(reps, seed_reps):
    r = str(reps)
    cells = [suite.Cell("boot", [PY, "bench/boot/run.py", "--runs", "5", "--out", "{out}"],
                        publish="boot.json", est_min=3)]
    cells += rounds("converge", "converge.json", CONVERGE + ["--cap", "120", "--configs", CONV7],
                    (256, 512), reps, 16)
    cells += rounds("converge", "converge-1536.json",
                    CONVERGE + ["--cap", "120", "--configs", CONV1536], (1536,), reps, 8)
    for rep in range(reps):
        cells.append(suite.Cell(
            "migrate-r%d" % rep,
            [PY, "bench/migrate/run.py", "--reps", "1", "--reps-expensive", "1", "--cap", "120",
             "--only", MIGRATE_ONLY, "--out", "{out}"],
            group="migrate.json", round_=rep, retable=RETABLE_MIGRATE, est_min=12))
    cells += rounds("postcopy", "postcopy.json", ["bench/postcopy/run.py"], (256, 512, 1536),
                    reps, 12)
    for rtt in (1, 10):     # post-copy behind a link that adds round-trip time
        cells += rounds("postcopy-rtt%dms" % rtt, "postcopy-rtt%dms.json" % rtt,
                        ["bench/postcopy/run.py", "--rtt-ms", str(rtt), "--configs", PC_RTT],
                        (512,), reps, 6)
    cells += rounds("postcopy-push", "postcopy-push.json",
                    CONVERGE + ["--cap", "120", "--configs", PUSH], (512, 1536), reps, 5)
    # xbzrle alone (no throttle) against QEMU's, a cache that holds the stress
    cells += rounds("xbzrle", "xbzrle.json", CONVERGE + ["--cap", "120", "--configs", XBZRLE,
                                                          "--xbzrle-cache", "2048"],
                    (512, 1536), reps, 5)
    lone = [("recovery", ["bench/recovery/run.py", "--configs",
                          "kmig-bitmap-step,kmig-ring-computed,kmig-ring-dirty-limit,"
                          "qemu-bitmap-step"], 20),
            ("logstart", ["bench/logstart/run.py", "--sizes", "2,8,16"], 15),
            # seed 003 on big guests: memory touched first (huge pages
            # mapped), the policies engaged before the cancel or failure
            ("logstart-touched", ["bench/logstart/run.py", "--sizes", "2,8,16", "--touch"], 20),
            ("recovery-8g", ["bench/recovery/run.py", "--memory", "8G", "--touch", "--engaged",
                             "--configs", "kmig-bitmap-step,kmig-ring-computed,"
                             "kmig-ring-dirty-limit,qemu-bitmap-step,qemu-ring-step"], 45),
            ("free-pages", ["bench/free-pages/run.py"], 25),
            ("free-pages-ioeventfd", ["bench/free-pages/run.py", "--modes", "hints,hints-exits"],
             15),
            ("tls", ["bench/tls/run.py"], 15),
            ("dirty", ["bench/dirty/run.py"], 10),
            ("cost", ["bench/cost/run.py"], 25),
            ("net-blackout", ["bench/net-blackout/run.py", "--reps", r], 30),
            ("disk", ["bench/disk/run.py"], 30),
            # saving a busy guest: background-snapshot, stopped, live
            ("snapshot", ["bench/snapshot/run.py", "--restore", "--cap", "60"], 20),
            # a new VMM process on the host: RAM handed over (x-ignore-shared)
            # against copied, 4 GiB stressed and 8 GiB idle
            ("local-update", ["bench/local-update/run.py"], 10),
            ("local-update-8g-idle", ["bench/local-update/run.py", "--memory", "8G",
                                      "--workload", "idle"], 10)]
    for name, argv, est in lone:
        tail = [] if "--reps" in argv else ["--reps", r]
        cells.append(suite.Cell(name, [PY] + argv + tail + ["--out", "{out}"],
                                publish=name + ".json", est_min=est))
    vm = ["scripts/kvm-vm", "--timeout", "14400", "--", PY, "bench/linux-free-pages/run.py",
          "--reps", r]
    # estimates: 1405, 878 and 442 s, two side by side (--jobs 2), 2026-12-07
    for name, tail, est in (("linux-free-pages", [], 25),
                            ("linux-free-pages-churn", ["--cases", "churn"], 15),
                            ("linux-free-pages-churn-512",
                             ["--cases", "churn", "--churn-mb", "512", "--modes", "none,hints",
                              "--cap", "90"], 8)):
        cells.append(suite.Cell(name, vm + tail + ["--out", "{out}"], where="emulated",
                                publish=name + ".json", est_min=est))
    for cpus in (2, 1):
        for bw, bwname in ((125000000, "125MBs"), (0, "unlimited")):
            part = "seed000-cpus%d-%s" % (cpus, bwname)
            cells += rounds(part, part + ".json", CONVERGE + [
                "--memory", "4G", "--cpus", str(cpus), "--bandwidth", str(bw), "--downtime", "300",
                "--cap", "300", "--configs", SEED_MAIN], (1024, 3072), seed_reps, 40)
    part = "seed000-each-off-cpus2-125MBs"
    cells += rounds(part, part + ".json", CONVERGE + [
        "--memory", "4G", "--cpus", "2", "--bandwidth", "125000000", "--downtime", "300",
        "--cap", "300", "--configs", SEED_EACH], (1024, 3072), seed_reps, 20)
    return cells


def key():
    qemu = subprocess.run(["qemu-system-x86_64", "--version"], capture_output=True,
                          text=True).stdout.splitlines() if os.path.exists(
                              "/usr/bin/qemu-system-x86_64") else []
    bench = [d for d in os.listdir(os.path.join(ROOT, "bench"))
             if os.path.isdir(os.path.join(ROOT, "bench", d))
             and d not in ("results", "suite", "report")]
    harness = suite.tree_digest(ROOT, ["bench/" + d for d in bench] + ["tests/lib", "guest/linux"],
                                skip_suffixes=(".md",))
    build = os.path.join(ROOT, os.environ.get("KMIG_BUILD", "build"))
    return suite.suite_key({"kmig": os.path.join(build, "kmig"),
                            "guest": os.path.join(ROOT, "build", "guest", "kmig-guest.elf")},
                           {"qemu": qemu[0] if qemu else "none", "harness": harness})


def native_kvm():
    import kmigtest as kt
    return kt.kvm_state() == "ok" and not kt.emulated()


def show_plan(cells, k, parts):
    print("suite %s  (%s)" % (k, ", ".join("%s %s" % (n, v[:12]) for n, v in parts.items())))
    tot = 0
    for c in cells:
        tot += c.est_min
        print("  %-40s %-8s ~%3d min  %s" % (c.name, c.where, c.est_min,
                                               "-> " + (c.group or c.publish or "")))
    print("%d cells, about %.1f hours" % (len(cells), tot / 60))


def show_status(state, cells):
    s = suite.summary(state, cells)
    for r in s["rows"]:
        print("  %-40s %-11s %2d attempt(s) %7.0f s" % (r["cell"], r["status"], r["attempts"],
                                                         r["wall_s"]))
    print("%d of %d cells done, %.1f hours so far, commits %s" % (
        s["cells_done"], s["cells"], s["wall_s_total"] / 3600, ", ".join(
            h[:7] for h in s["git_heads"]) or "none"))


def git_commit(state_dir, cell):
    rel = os.path.relpath(state_dir, ROOT)
    subprocess.run(["git", "-C", ROOT, "add", "--", rel], check=True)
    subprocess.run(["git", "-C", ROOT, "commit", "-q", "-m",
                    "bench suite %s: cell %s done" % (os.path.basename(state_dir), cell.name),
                    "--", rel], check=True)


def finish(state, allcells, results):
    written = suite.finish(state, allcells, ROOT, results)
    if not written:
        return
    plot = [p for p in written if re.search(
        r"/(converge|postcopy|seed000|recovery|free-pages|linux-free-pages)[^/]*\.json$", p)]
    if plot:
        subprocess.run([PY, "bench/report/plot.py", "--out", os.path.join(results, "plots")]
                       + plot, cwd=ROOT)
    if any(re.search(r"/seed000-[^/]*\.json$", p) for p in written):
        # the seed's table over every part published so far
        parts = sorted(glob.glob(os.path.join(results, "seed000-*.json")))
        rc = subprocess.run([PY, "bench/report/seed000_table.py",
                             "--out", os.path.join(results, "seed000.md"),
                             "--json", os.path.join(results, "seed000.json")] + parts,
                            cwd=ROOT).returncode
        if rc:
            print("suite: bench/report/seed000_table.py: exit status %d, the table was not "
                  "written" % rc, file=sys.stderr)
    with open(os.path.join(results, "suite.json"), "w") as f:
        json.dump(suite.summary(state, allcells), f, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3, help="rounds of each benchmark (default 3)")
    ap.add_argument("--seed-reps", type=int, default=10,
                    help="rounds of seed 000's table (default 10)")
    ap.add_argument("--only", default=None, help="regex on the cells' names")
    ap.add_argument("--hours", type=float, default=None,
                    help="start no cell whose estimate ends past this many hours from now")
    ap.add_argument("--max-failures", type=int, default=3)
    ap.add_argument("--plan", action="store_true")
    ap.add_argument("--status", action="store_true")
    ap.add_argument("--commit", action="store_true", help="git commit the state after each cell")
    ap.add_argument("--state-root", default=os.path.join(RESULTS, "suite"))
    ap.add_argument("--results", default=None, help="where the published results go "
                    "(default bench/results; required with --allow-emulated)")
    ap.add_argument("--allow-emulated", action="store_true",
                    help="run native cells under emulation (to try the runner; no figures)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="cells run side by side (emulated cells only: each takes one core)")
    a = ap.parse_args()
    allcells = catalogue(a.reps, a.seed_reps)
    cells = [c for c in allcells if not a.only or re.search(a.only, c.name)]
    k, parts = key()
    if a.plan:
        show_plan(cells, k, parts)
        return 0
    state = suite.State(os.path.join(a.state_root, k), k, parts)
    if a.status:
        show_status(state, cells)
        return 0
    if not native_kvm() and any(c.where == "native" for c in cells):
        if not a.allow_emulated:
            print("suite: native cells need a native /dev/kvm (kvm_pvm or real hardware); "
                  "use --only to choose the emulated ones, or --allow-emulated to try the "
                  "runner", file=sys.stderr)
            return 2
        if not a.results:
            print("suite: --allow-emulated needs --results DIR (no figures go to bench/results)",
                  file=sys.stderr)
            return 2
        state.doc["emulated"] = True
    if a.jobs > 1 and any(c.where == "native" for c in cells) and not a.allow_emulated:
        print("suite: --jobs %d: native cells measure time, so they run alone; choose the "
              "emulated ones with --only" % a.jobs, file=sys.stderr)
        return 2
    results = a.results or RESULTS
    deadline = time.time() + a.hours * 3600 if a.hours else None
    print("suite %s: %d cells, %d done" % (k, len(cells), sum(state.done(c.name) for c in cells)),
          flush=True)
    left = suite.run(state, cells, ROOT, deadline=deadline, max_failures=a.max_failures,
                     on_done=(lambda c: git_commit(state.dir, c)) if a.commit else None,
                     log=lambda s: print(s, flush=True), jobs=a.jobs)
    finish(state, allcells, results)
    print("suite %s: %d cells left%s" % (k, len(left), (": " + ", ".join(left[:8]) +
                                                         (" ..." if len(left) > 8 else ""))
                                          if left else ""))
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
