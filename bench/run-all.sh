#!/usr/bin/env bash
# Re-runs every benchmark, one after the other, on the build in this tree
# (make all guest first; nothing else should run on the machine meanwhile).
# Results go to bench/results/ (JSON + markdown) and bench/results/plots/.
# Each benchmark copies build/kmig and the guest at its start and records
# the git HEAD, so a result names the code it measured.
#
#   bench/run-all.sh            the published set (about 80 minutes on 2 cores)
#   REPS=1 bench/run-all.sh     one run per cell (a smoke test, ~30 minutes)
#
# The set: every comparison with QEMU 7.2 the docs quote, each cell REPS
# times (3: medians and spread), every VMM under the same 120 s cap.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
PY=${PY:-/usr/bin/python3}   # Debian's: matplotlib for the plots
[ -c /dev/kvm ] || { echo "run-all: benchmarks need a native /dev/kvm" >&2; exit 1; }
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; "$@"; }

step $PY bench/boot/run.py --runs 5
step $PY bench/converge/run.py --sizes 256,512 --reps "$REPS" --cap 120 \
	--configs kmig-bitmap+step,qemu-bitmap+ac,kmig-bitmap+computed,kmig-ring4096+step,qemu-ring4096+ac,kmig-ring4096+computed,kmig-ring4096+dirty-limit
step $PY bench/converge/run.py --sizes 1536 --reps "$REPS" --cap 120 \
	--configs qemu-ring4096+ac,kmig-ring4096+computed,kmig-ring4096+dirty-limit \
	--out bench/results/converge-1536.json
step $PY bench/migrate/run.py --reps "$REPS" --reps-expensive "$REPS" --cap 120 \
	--only '^(idle-2G unlimited (kmig|qemu)-(bitmap|ring4096)$|stress128M-2G unlimited (kmig|qemu)-(bitmap|ring4096)$|stress128M-2G 125MB/s (kmig-ring4096\+ac-computed|kmig-bitmap\+ac-step|qemu-bitmap\+ac|qemu-ring4096\+ac)$)'
step $PY bench/recovery/run.py --reps "$REPS" \
	--configs kmig-bitmap-step,kmig-ring-computed,kmig-ring-dirty-limit,qemu-bitmap-step
step $PY bench/logstart/run.py --reps "$REPS" --sizes 2,8,16
step $PY bench/free-pages/run.py --reps "$REPS"
step $PY bench/tls/run.py --reps "$REPS"
step $PY bench/dirty/run.py --reps "$REPS"
step $PY bench/report/plot.py
echo; echo "=== done ($(date -u +%H:%M:%S))"
