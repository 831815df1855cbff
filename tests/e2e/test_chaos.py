"""A short chaos run (tests/lib/chaos.py): KMIG_CHAOS_RUNS migrations
(default 10) of one guest, each broken by a fault drawn at random, each
outcome checked against the fault matrix's table, with no second running
copy, QMP answering and no fd or thread leaked.  The seed comes from
KMIG_CHAOS_SEED or the clock and is printed: a failure replays with
`scripts/chaos.py -n N --seed S` (or --only K).  `make chaos` runs 200."""
import os
import time

import pytest

import chaos
import kmigtest as kt

pytestmark = pytest.mark.kvm


def test_chaos(d, check):
    runs = int(os.environ.get("KMIG_CHAOS_RUNS", "10"))
    seed = int(os.environ.get("KMIG_CHAOS_SEED") or int(time.time() * 1000) % 1000000007)
    print("# chaos: seed %d, %d runs (replay: scripts/chaos.py -n %d --seed %d)"
          % (seed, runs, runs, seed))
    c = chaos.Chaos(d, seed)
    try:
        s = c.run(runs)
    finally:
        c.close()
    print("# chaos summary: %r" % s)
    for r in c.runs:
        check("run%d_%s_%s" % (r["run"], r["phase"], r["fault"]), not r["failed"],
              "seed %d: %s" % (seed, " | ".join(r["failed"])))
    check("ran", len(c.runs) == runs and kt.KMIG, repr(s))
