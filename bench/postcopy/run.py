#!/usr/bin/env python3
"""Post-copy and hybrid migration against kmig's best pre-copy and QEMU 7.2's
post-copy, on the stress guest of bench/converge (2 GiB, 1 vCPU, 125 MB/s
before and after the switch, downtime limit 300 ms, cap 120 s):

  kmig-ring4096+dirty-limit  kmig's best pre-copy (bench/results/converge.md)
  kmig-ring4096+postcopy     migrate-start-postcopy once the bulk pass is over
  kmig-ring4096+hybrid       x-postcopy-auto: kmig switches by itself (during
                             the bulk pass when it sees the guest rewrite
                             what it sent: x-postcopy-early, the default)
  qemu-ring4096+postcopy     QEMU 7.2, postcopy-ram, migrate-start-postcopy at
                             the same point
  kmig-ring4096+postcopy-start, qemu-ring4096+postcopy-start
                             migrate-start-postcopy as soon as the migration
                             is active: the earliest switch either VMM's user
                             can ask for
  kmig-ring4096+postcopy-preempt, qemu-ring4096+postcopy-preempt
                             post-copy after the pass with the
                             postcopy-preempt capability on both sides
                             (QEMU 7.2 has it, off by default; kmig's since
                             its docs/protocol.md "Post-copy preempt"): the
                             pages asked for on a channel of their own

It is bench/converge/run.py with these configurations (its options apply;
--reps 3 for the published figures); results in bench/results/postcopy.json
and .md, with a post-copy table (switch time, request latency, bytes after
the switch, both VMMs' blocktime and QEMU's per-vCPU blocktime).
--rtt-ms N runs source and destination on two namespaced hosts whose wire
adds N ms of round-trip time (scripts/two-hosts' relay)."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CONFIGS = ("kmig-ring4096+dirty-limit,kmig-ring4096+postcopy,qemu-ring4096+postcopy,"
           "kmig-ring4096+hybrid,qemu-ring4096+postcopy-start,kmig-ring4096+postcopy-start,"
           "qemu-ring4096+postcopy-preempt,kmig-ring4096+postcopy-preempt")

if __name__ == "__main__":
    args = [sys.executable, os.path.join(ROOT, "bench", "converge", "run.py"),
            "--configs", CONFIGS, "--sizes", "256,512,1536",
            "--out", os.path.join(ROOT, "bench", "results", "postcopy.json")] + sys.argv[1:]
    os.execv(sys.executable, args)
