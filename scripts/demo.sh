#!/usr/bin/env bash
# The kmig live-migration demo: a source VM running a memory-stressing
# guest (dirty ring tracking) and a destination VM waiting for it, on
# loopback; the migration is driven with `kmig migrate` over the source's
# QMP socket at 125 MB/s (1 Gbit/s) with no convergence option: it picks a
# per-vCPU dirty limit (dirty ring), since the guest dirties memory faster
# than the link carries it; the guest's lines
# continue on the destination.  Run through `make demo`, which builds
# everything first.
set -euo pipefail
cd "$(dirname "$0")/.."
KMIG=${KMIG:-build/kmig}
GUEST=build/guest/kmig-guest.elf
CMDLINE=${DEMO_CMDLINE:-"workload=stress mb=256 report_ms=1000"}
MEM=${DEMO_MEMORY:-1G}
VMOPTS=(--memory "$MEM" --dirty-ring 4096)
d=$(mktemp -d /tmp/kmig-demo.XXXXXX)
port=$((20000 + RANDOM % 20000))
cleanup() { kill "$src" "$dst" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT

echo "== source VM: $CMDLINE, $MEM of RAM (console: $d/source.log)"
"$KMIG" run --kernel "$GUEST" --cmdline "$CMDLINE" "${VMOPTS[@]}" \
	--console "file:$d/source.log" --qmp "unix:$d/source.qmp" 2>"$d/source.err" &
src=$!
echo "== destination VM waiting on tcp:127.0.0.1:$port (console: $d/dest.log)"
"$KMIG" run --kernel "$GUEST" --cmdline "$CMDLINE" "${VMOPTS[@]}" \
	--console "file:$d/dest.log" --qmp "unix:$d/dest.qmp" \
	--incoming "tcp:127.0.0.1:$port" 2>"$d/dest.err" &
dst=$!
# the guest's first lines (seconds natively, longer under emulation)
for _ in $(seq 120); do
	[ -f "$d/source.log" ] && [ "$(wc -l < "$d/source.log")" -ge 3 ] && break
	kill -0 "$src" 2>/dev/null || { cat "$d/source.err" >&2; exit 1; }
	sleep 0.5
done
echo "== the guest on the source:"
tail -n 3 "$d/source.log"
echo "== migrating at 125 MB/s, downtime limit 300 ms (kmig migrate picks the convergence policy)"
"$KMIG" migrate --qmp "unix:$d/source.qmp" "tcp:127.0.0.1:$port" \
	--bandwidth 125 --downtime 300
sleep 3
echo "== the guest carries on at the destination:"
tail -n 4 "$d/dest.log"
if [ -n "${DEMO_IN_VM:-}" ]; then   # the VM's /tmp goes with it: keep the logs
	mkdir -p build/demo && cp "$d"/*.log "$d"/*.err build/demo/
	echo "== the logs are in build/demo"
else
	echo "== logs and sockets are in $d"
fi
