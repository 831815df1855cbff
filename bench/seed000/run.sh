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
set -euo pipefail
cd "$(dirname "$0")/../.."
REPS=${REPS:-10}
ONLY=${ONLY:-}
PY=${PY:-/usr/bin/python3}
[ -c /dev/kvm ] || { echo "seed000: needs a native /dev/kvm" >&2; exit 1; }
CAP=${CAP:-300}

part() {  # NAME CPUS BANDWIDTH CONFIGS
	local name=$1 cpus=$2 bw=$3 configs=$4
	[ -n "$ONLY" ] && [[ "$name" != *"$ONLY"* ]] && return 0
	echo "=== seed000 $name ($(date -u +%H:%M:%S))"
	$PY bench/converge/run.py --memory 4G --cpus "$cpus" --sizes 1024,3072 \
		--bandwidth "$bw" --downtime 300 --cap "$CAP" --reps "$REPS" --configs "$configs" \
		--out "bench/results/seed000-$name.json"
}

# on against off, every backend, QEMU between them (outside load hits both)
MAIN="kmig-bitmap+seed-all,qemu-bitmap+ac,kmig-bitmap+seed-none"
MAIN+=",kmig-ring4096+seed-all,qemu-ring4096+ac,kmig-ring4096+seed-none"
MAIN+=",kmig-ring65536+seed-all,qemu-ring65536+ac,kmig-ring65536+seed-none"
# each idea off alone, ring 4096
EACH="kmig-ring4096+seed-all,kmig-ring4096+seed-no1,kmig-ring4096+seed-no2"
EACH+=",kmig-ring4096+seed-no3,kmig-ring4096+seed-no4,kmig-ring4096+seed-no5"

for cpus in 2 1; do
	part "cpus$cpus-125MBs" "$cpus" 125000000 "$MAIN"
	part "cpus$cpus-unlimited" "$cpus" 0 "$MAIN"
done
part "each-off-cpus2-125MBs" 2 125000000 "$EACH"
echo "=== seed000 done ($(date -u +%H:%M:%S))"
