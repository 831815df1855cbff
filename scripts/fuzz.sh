#!/usr/bin/env bash
# Runs each libFuzzer harness (build-fuzz/fuzz/fuzz_*, `make FUZZ=1 fuzz-bins`)
# for SECONDS, starting from its seed corpus tests/fuzz/corpus/NAME (new
# inputs go to build-fuzz/corpus/NAME, never into the repository).
#
#   scripts/fuzz.sh [SECONDS] [NAME]...      default 60 s, every harness
#
# KMIG_FUZZ_JOBS harnesses run at once (default: one per host core); each
# is single-threaded, so every one still gets its SECONDS of a core.
# Prints, in the harnesses' order, "ok fuzz_NAME: ..." with executions and
# coverage, or "not ok fuzz_NAME: ..." with the crashing input saved in
# build-fuzz/crashes/.
set -u
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
	for f in build-fuzz/fuzz/fuzz_*; do [ -x "$f" ] && names+=("$(basename "$f" | sed 's/^fuzz_//')"); done
fi
[ ${#names[@]} -gt 0 ] || { echo "not ok fuzz: no harness built (make FUZZ=1 fuzz-bins)"; exit 1; }
jobs=${KMIG_FUZZ_JOBS:-$(nproc)}
mkdir -p build-fuzz/crashes
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# One harness: its report line (and on failure the log's tail) in $out/NAME.
fuzz_one() {
	local n=$1 bin=build-fuzz/fuzz/fuzz_$1 work=build-fuzz/corpus/$1 log=$out/$1.log rc execs cov
	mkdir -p "$work"
	"$bin" -max_total_time="$secs" -max_len=65536 -print_final_stats=1 \
		-artifact_prefix="build-fuzz/crashes/${n}-" "$work" "tests/fuzz/corpus/$n" \
		> "$log" 2>&1
	rc=$?
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
	cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
	if [ "$rc" -eq 0 ]; then
		echo "ok fuzz_$n: ${execs:-?} executions in $secs s, ${cov:-cov: ?}, corpus $(ls "$work" | wc -l)"
	else
		echo "not ok fuzz_$n: exit $rc; $(grep -m1 -E 'ERROR|SUMMARY|deadly' "$log")" \
			"input: $(ls -t build-fuzz/crashes/${n}-* 2>/dev/null | head -1)"
		tail -40 "$log" | sed 's/^/# /'
	fi > "$out/$n"
}

running=0
for n in "${names[@]}"; do
	if [ "$running" -ge "$jobs" ]; then
		wait -n
		running=$((running - 1))
	fi
	fuzz_one "$n" &
	running=$((running + 1))
done
wait
failed=0
for n in "${names[@]}"; do
	cat "$out/$n" 2>/dev/null || echo "not ok fuzz_$n: no report"
	grep -q '^ok ' "$out/$n" 2>/dev/null || failed=1
done
exit $failed
