#!/usr/bin/env bash
# Re-runs every benchmark but seed 000's table (bench/seed000/run.sh), one
# cell after the other, through the resumable suite (bench/suite/run.py:
# a cell done under the same build is not run again; the published JSON,
# markdown and plots are written once a benchmark's cells are all done).
# Needs a native /dev/kvm (the Linux guest's cells run in scripts/kvm-vm);
# nothing else should run on the machine meanwhile.
#
#   bench/run-all.sh              3 rounds a benchmark (medians and spread)
#   REPS=1 bench/run-all.sh       one round each (a smoke test)
#   bench/run-all.sh --hours 2    more options: bench/suite/run.py --help
set -euo pipefail
cd "$(dirname "$0")/.."
exec /usr/bin/python3 bench/suite/run.py --reps "${REPS:-3}" --only '^(?!seed000)' "$@"
