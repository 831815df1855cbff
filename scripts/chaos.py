#!/usr/bin/python3
"""make chaos: one verify guest migrated N times (default 200), each
migration broken once by a fault chosen at random from the fault matrix
and a few more (tests/lib/chaos.py), each outcome checked against the
matrix's table.  Prints the seed first and a line per run; writes every
run and the summary as JSON (--out, default build/chaos.json).  The same
--seed replays the same runs; --only K replays run K alone.  Exit status 0
only if no run failed a check.  Needs /dev/kvm: `make chaos` runs it inside
scripts/kvm-vm where there is none."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))

import chaos  # noqa: E402
import kmigtest as kt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=200, help="migrations (default 200)")
    ap.add_argument("--seed", type=int, default=None, help="default: from the clock")
    ap.add_argument("--only", type=int, default=None, help="replay this run of the seed")
    ap.add_argument("--faults", default=None,
                    help="comma-separated: draw only these (e.g. postcopy-cut,yank,kill-src)")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "chaos.json"))
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else int(time.time() * 1000) % 1000000007
    print("# chaos: seed %d, %d runs (replay: scripts/chaos.py -n %d --seed %d)"
          % (seed, a.n, a.n, seed), flush=True)
    d = kt.tmpdir()
    c = chaos.Chaos(d, seed, log=lambda m: print(m, flush=True))
    try:
        summary = c.run(a.n, a.only, a.faults.split(",") if a.faults else None)
    finally:
        c.close()
    summary["commit"] = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                       capture_output=True, text=True).stdout.strip()
    summary["emulated"] = kt.emulated()
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump({"summary": summary, "runs": c.runs}, f, indent=1)
    print(json.dumps(summary, indent=1))
    if not summary["failed_runs"]:
        shutil.rmtree(d, ignore_errors=True)
    return 0 if summary["failed_runs"] == 0 and summary["runs"] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
