#!/usr/bin/python3
"""make soak: one verify guest migrated N times (default 500) between two
kmig slots with x-verify, the configuration changing at every hop
(tests/lib/soak.py).  Prints a progress line every 10 hops and a summary;
writes every hop and the summary as JSON (--out, default build/soak.json).
Exit status 0 only if every hop completed, passed x-verify and the guest
went on verifying.  Needs /dev/kvm: `make soak` runs it inside
scripts/kvm-vm where there is none."""
import argparse
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "lib"))

import kmigtest as kt  # noqa: E402
import soak  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=500, help="migrations (default 500)")
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--mb", type=int, default=8, help="verify MiB per vCPU")
    ap.add_argument("--memory", default="128M")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "soak.json"))
    a = ap.parse_args()
    d = kt.tmpdir()
    s = soak.Soak(d, cpus=a.cpus, mb=a.mb, memory=a.memory,
                  log=lambda m: print(m, flush=True))
    try:
        summary = s.run(a.n)
    finally:
        s.close()
    summary["commit"] = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                       capture_output=True, text=True).stdout.strip()
    summary["emulated"] = kt.emulated()
    soak.write(summary, s.hops, a.out)
    print(json.dumps(summary, indent=1))
    print("soak: %d of %d migrations done, %d failures; x-verify covered %d pages, "
          "the guest checked %d" % (summary["hops_done"], a.n, summary["failures"],
                                    summary["xverify_pages"], summary["guest_checked_pages"]))
    if not summary["failures"]:
        shutil.rmtree(d, ignore_errors=True)
    return 0 if summary["failures"] == 0 and summary["hops_done"] == a.n else 1


if __name__ == "__main__":
    sys.exit(main())
