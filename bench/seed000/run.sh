#!/usr/bin/env bash
# Seed 000's own table, reproduced (issue 29 item 1): kmig with the seed's
# five ideas on, with all of them off, and (at 125 MB/s, ring 4096) with
# each off alone, beside QEMU 7.2's auto-converge on the same tracking,
# for guests of 4 GiB stressing 1 GiB and 3 GiB, one and two vCPUs, the
# bitmap and rings of 4096 and 65536 entries, max-bandwidth 0 (unlimited:
# what loopback gives) and 125 MB/s, the same settings for both VMMs.
# Each cell REPS times (default 10).  Every row is a bench/converge run
# (its guest, its measurements, its JSON); the ideas and their switches:
# docs/policies.md.  The seed's published figures are in
# bench/seed000/README.md, to be set beside these.
#
#   bench/seed000/run.sh                 the whole set (many hours)
#   REPS=3 bench/seed000/run.sh          fewer runs a cell
#   ONLY=cpus1 bench/seed000/run.sh      the parts whose name holds ONLY
#
# Needs a native /dev/kvm: under emulation the times mean nothing.
# Results: bench/results/seed000-PART.json and .md, one per part (vCPUs,
# bandwidth, and the each-off-alone part), each naming its commit.
# The cells (one round of a part at one stress size each) are defined and
# run by the resumable suite, bench/suite/run.py: an interrupted run goes
# on where it stopped, as long as the build is the same.
set -euo pipefail
cd "$(dirname "$0")/../.."
exec /usr/bin/python3 bench/suite/run.py --seed-reps "${REPS:-10}" \
	--only "^seed000-.*${ONLY:-}" "$@"
