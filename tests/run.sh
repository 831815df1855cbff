#!/usr/bin/env bash
# Runs every test of kmig and prints one closing line:
#   N passed, N failed, N skipped
# Each test program prints "ok NAME", "not ok NAME: why" or "skip NAME: why"
# lines; everything else it prints is shown as is.
#   tests/run.sh [BUILD_DIR] [FILTER]   (FILTER: substring of the test file name)
set -u
cd "$(dirname "$0")/.."
build=${1:-build}
filter=${2:-}
export KMIG_BUILD=$build
passed=0; failed=0; skipped=0
log=$(mktemp)
run_one() {
  local name=$1; shift
  [ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && return
  echo "== $name"
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local p f s
  p=$(grep -c '^ok ' "$log"); f=$(grep -c '^not ok ' "$log"); s=$(grep -c '^skip ' "$log")
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "not ok $name: exited with status $rc"
    f=1
  fi
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
}
for t in "$build"/tests/test_*; do
  [ -x "$t" ] && run_one "$(basename "$t")" "$t"
done
for t in tests/guest/test_*.py tests/kvm/test_*.py tests/e2e/test_*.py; do
  [ -f "$t" ] && run_one "$(basename "$t")" /usr/bin/python3 "$t"
done
rm -f "$log"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
