#!/usr/bin/env bash
# Runs every test of kmig and prints one closing line:
#   N passed, N failed, N skipped
#
#   tests/run.sh [BUILD_DIR] [FILTER]     FILTER: a substring of test file names
#
# Two parts:
#   host  C unit tests and the Python tests that need no KVM
#   kvm   C KVM tests (build/tests/test_kvm_*) and the pytest tests marked
#         kvm, qemu or linux
# Where /dev/kvm is usable both run here.  Where it is not, the kvm part runs
# inside scripts/kvm-vm (a Linux VM under emulation with a real x86 KVM):
# under emulation the tests marked slow are left out unless KMIG_TEST_ALL=1.
# If that VM cannot start either, the run fails and says why: never green
# with the VMM untested.
#
# Each test prints "ok NAME", "not ok NAME: why" or "skip NAME: why";
# everything else is shown as is.  `--part host|kvm` runs one part only
# (how the kvm part is run inside the VM).
set -u
cd "$(dirname "$0")/.."
part=all
if [ "${1:-}" = "--part" ]; then part=$2; shift 2; fi
build=${1:-build}
filter=${2:-}
export KMIG_BUILD=$build
PY=/usr/bin/python3
passed=0; failed=0; skipped=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

count() {  # count the ok / not ok / skip lines of $log; $1: exit status, $2: name
	local p f s
	p=$(grep -c '^ok ' "$log"); f=$(grep -c '^not ok ' "$log"); s=$(grep -c '^skip ' "$log")
	if [ "$1" -ne 0 ] && [ "$f" -eq 0 ]; then
		echo "not ok $2: exited with status $1"
		f=1
	fi
	passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
}

run_one() {
	local name=$1; shift
	[ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && return
	echo "== $name"
	# a hung test fails (status 124) instead of hanging the run
	timeout -k 10 "${KMIG_C_TEST_TIMEOUT:-900}" "$@" 2>&1 | tee "$log"
	count "${PIPESTATUS[0]}" "$name"
}

pytest_files() {
	local t
	for t in tests/guest/test_*.py tests/kvm/test_*.py tests/e2e/test_*.py; do
		[ -f "$t" ] || continue
		[ -n "$filter" ] && [[ "$(basename "$t")" != *"$filter"* ]] && continue
		echo "$t"
	done
}

run_pytest() {  # $1: marker expression
	local files extra=()
	files=$(pytest_files)
	[ "${KMIG_TEST_EMULATED:-}" = 1 ] && extra+=(--timeout=1500)
	[ -n "$files" ] || return 0
	echo "== pytest -m '$1'"
	# shellcheck disable=SC2086
	$PY -m pytest -q -o console_output_style=classic "${extra[@]}" -m "$1" $files 2>&1 |
		tee "$log"
	local rc=${PIPESTATUS[0]}
	[ "$rc" -eq 5 ] && rc=0   # nothing selected
	count "$rc" "pytest"
}

run_host_part() {
	local t
	for t in "$build"/tests/test_*; do
		[[ "$(basename "$t")" == test_kvm_* ]] && continue
		[ -x "$t" ] && run_one "$(basename "$t")" "$t"
	done
	run_pytest "not kvm and not qemu and not linux"
}

run_kvm_part() {
	local t expr="kvm or qemu or linux"
	for t in "$build"/tests/test_kvm_*; do
		[ -x "$t" ] && run_one "$(basename "$t")" "$t"
	done
	if [ "${KMIG_TEST_EMULATED:-}" = 1 ] && [ "${KMIG_TEST_ALL:-}" != 1 ]; then
		expr="($expr) and not slow"
		echo "# under emulation: tests marked slow are left out (KMIG_TEST_ALL=1 runs them)"
	fi
	run_pytest "$expr"
}

run_kvm_part_in_vm() {
	echo "== kvm part inside scripts/kvm-vm (no usable /dev/kvm here)"
	local t0=$SECONDS
	scripts/kvm-vm --timeout "${KMIG_VM_TIMEOUT:-2400}" --env KMIG_TEST_ALL \
		--env KMIG_TEST_KEEP -- tests/run.sh --part kvm "$build" "$filter" 2>&1 | tee "$log"
	local rc=${PIPESTATUS[0]}
	echo "# kvm part inside scripts/kvm-vm: $((SECONDS - t0)) s, status $rc"
	if ! grep -q '^platform: kvm' "$log"; then
		local msg="not ok kvm-vm: no VM with a usable KVM could be started (status $rc), so"
		msg+=" the tests that need KVM did not run; see scripts/kvm-vm's messages above"
		echo "$msg"
		echo "$msg" >> "$log"
	fi
	count "$rc" "kvm-vm"
}

t_start=$SECONDS
$PY tests/lib/kvm_platform.py
kvm_ok=$?
case "$part" in
host) run_host_part ;;
kvm)
	if [ "$kvm_ok" -ne 0 ]; then
		echo "not ok kvm part: no usable /dev/kvm"
		failed=$((failed + 1))
	else
		run_kvm_part
	fi ;;
all)
	run_host_part
	if [ "$kvm_ok" -eq 0 ]; then run_kvm_part; else run_kvm_part_in_vm; fi ;;
*) echo "tests/run.sh: unknown part $part" >&2; exit 2 ;;
esac
echo "# tests/run.sh --part $part: $((SECONDS - t_start)) s"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
