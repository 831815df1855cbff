#!/usr/bin/env bash
# Runs every test of kmig and prints one closing line:
#   N passed, N failed, N skipped
#
#   tests/run.sh [BUILD_DIR] [FILTER]     FILTER: a substring of test file names
#
# Two parts:
#   host  C unit tests (also built with ASan + UBSan and with TSan when
#         build-san/ and build-tsan/ have them), the Python tests that need no KVM, and
#         each fuzz harness for 15 s (KMIG_FUZZ_SECONDS)
#   kvm   C KVM tests (build/tests/test_kvm_*) and the pytest tests marked
#         kvm, qemu or linux; then the migration tests again with kmig
#         built with ASan + UBSan (build-san/kmig, when built) and a cut of
#         them with ThreadSanitizer (build-tsan/kmig)
# Where /dev/kvm is usable both run here.  Where it is not, the kvm part runs
# inside scripts/kvm-vm (a Linux VM under emulation with a real x86 KVM):
# under emulation the tests marked slow are left out unless KMIG_TEST_ALL=1.
# If that VM cannot start either, the run fails and says why: never green
# with the VMM untested.
#
# Each test prints "ok NAME", "not ok NAME: why" or "skip NAME: why";
# everything else is shown as is.  `--part host|kvm` runs one part only
# (how the kvm part is run inside the VM); `--part items` lists the kvm
# part's items in the order it runs them (on a kvm_pvm host the Linux
# files among them run in scripts/kvm-vm after the rest), and runs nothing.
set -u
cd "$(dirname "$0")/.." || exit 2
part=all
if [ "${1:-}" = "--part" ]; then part=$2; shift 2; fi
build=${1:-build}
filter=${2:-}
export KMIG_BUILD=$build
PY=/usr/bin/python3
passed=0; failed=0; skipped=0
log=$(mktemp)
fails=$(mktemp)  # every "not ok" line of the run, printed again at its end
trap 'rm -f "$log" "$log.vm" "$fails"' EXIT

count() {  # count the ok / not ok / skip lines of $log; $1: exit status, $2: name
	local p f s
	p=$(grep -c '^ok ' "$log"); f=$(grep -c '^not ok ' "$log"); s=$(grep -c '^skip ' "$log")
	grep '^not ok ' "$log" >> "$fails"
	if [ "$1" -ne 0 ] && [ "$f" -eq 0 ]; then
		echo "not ok $2: exited with status $1" | tee -a "$fails"
		f=1
	fi
	passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
}

run_one() {
	local name=$1; shift
	[ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && return
	echo "== $name"
	local t0=$SECONDS
	# a hung test fails (status 124) instead of hanging the run
	timeout -k 10 "${KMIG_C_TEST_TIMEOUT:-900}" "$@" 2>&1 | tee "$log"
	count "${PIPESTATUS[0]}" "$name"
	[ $((SECONDS - t0)) -ge 5 ] && echo "# $name: $((SECONDS - t0)) s"
	return 0
}

pytest_files() {  # one per line
	local t
	for t in tests/guest/test_*.py tests/kvm/test_*.py tests/e2e/test_*.py tests/net/test_*.py tests/bench/test_*.py tests/meta/test_*.py; do
		[ -f "$t" ] || continue
		[ -n "$filter" ] && [[ "$(basename "$t")" != *"$filter"* ]] && continue
		echo "$t"
	done
}

# The pytest files with a test marked kvm, qemu or linux (a file without
# one would only start pytest to select nothing: 8 s an item under
# emulation).  tests/meta/test_run_items.py holds this to pytest's own
# collection.
kvm_pytest_files() {
	local t
	for t in $(pytest_files); do
		grep -qE 'mark\.(kvm|qemu|linux)\b' "$t" && echo "$t"
	done
}

run_pytest() {  # $1: marker expression, $2...: files
	local expr=$1 extra=(--durations=0 --durations-min=15)  # the slow tests' seconds
	shift
	[ "${KMIG_TEST_EMULATED:-}" = 1 ] && extra+=(--timeout=1500)
	[ $# -gt 0 ] || return 0
	echo "== pytest -m '$expr' $*$([ "$KMIG_BUILD" != "$build" ] && echo " with $KMIG_BUILD/kmig")"
	PYTHONUNBUFFERED=1 $PY -m pytest -q -o console_output_style=classic "${extra[@]}" -m "$expr" "$@" 2>&1 |
		tee "$log"
	local rc=${PIPESTATUS[0]}
	[ "$rc" -eq 5 ] && rc=0   # nothing selected
	count "$rc" "pytest $*"
}

# The C unit tests of the host part, KMIG_HOST_JOBS at a time (default
# one per core): each one's output goes to a file of its own, shown (and
# counted as run_one does) in the list's order once all have run.
# $1: a file of lines "NAME BINARY ENV=VALUE..." (ENV optional).
run_units() {
	local list=$1 dir jobs=${KMIG_HOST_JOBS:-$(nproc)} running=0 i=0 name bin envs
	dir=$(mktemp -d)
	while read -r name bin envs; do
		i=$((i + 1))
		[ -n "$filter" ] && [[ "$name" != *"$filter"* ]] && continue
		if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
		: > "$dir/$i.run"
		{
			local t0=$SECONDS
			# shellcheck disable=SC2086
			env $envs timeout -k 10 "${KMIG_C_TEST_TIMEOUT:-900}" "$bin" < /dev/null \
				> "$dir/$i.out" 2>&1
			echo "$? $((SECONDS - t0))" > "$dir/$i.rc"
		} &
		running=$((running + 1))
	done < "$list"
	wait
	i=0
	while read -r name bin envs; do
		i=$((i + 1))
		[ -f "$dir/$i.run" ] || continue     # left out by the filter
		local rc=1 secs=0
		if [ -f "$dir/$i.rc" ]; then
			read -r rc secs < "$dir/$i.rc"
		else     # killed before it could say: a failure, never a silent gap
			echo "not ok $name: left no exit status" >> "$dir/$i.out"
		fi
		echo "== $name"
		tee "$log" < "$dir/$i.out"
		count "$rc" "$name"
		[ "$secs" -ge 5 ] && echo "# $name: $secs s"
	done < "$list"
	rm -rf "$dir"
}

run_host_part() {
	local t list
	list=$(mktemp)
	for t in "$build"/tests/test_*; do
		[[ "$(basename "$t")" == test_kvm_* ]] && continue
		[ -x "$t" ] && echo "$(basename "$t") $t"
	done >> "$list"
	# the same unit tests built with ASan + UBSan (make SAN=1 unit): any
	# report ends the test with a non-zero status
	for t in build-san/tests/test_*; do
		[[ "$(basename "$t")" == test_kvm_* ]] && continue
		[ -x "$t" ] && echo "san:$(basename "$t") $t UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1"
	done >> "$list"
	# and with ThreadSanitizer (make TSAN=1 unit): a report fails the test
	for t in build-tsan/tests/test_*; do
		[[ "$(basename "$t")" == test_kvm_* ]] && continue
		[ -x "$t" ] && echo "tsan:$(basename "$t") $t TSAN_OPTIONS=halt_on_error=1"
	done >> "$list"
	run_units "$list"
	rm -f "$list"
	# shellcheck disable=SC2046
	run_pytest "not kvm and not qemu and not linux" $(pytest_files)
	# each libFuzzer harness briefly (`make fuzz` runs them for longer)
	if ls build-fuzz/fuzz/fuzz_* > /dev/null 2>&1; then
		run_one "fuzz" scripts/fuzz.sh "${KMIG_FUZZ_SECONDS:-15}"
	elif [ -z "$filter" ]; then
		echo "skip fuzz: the harnesses are not built (make FUZZ=1 fuzz-bins; make test does)"
		skipped=$((skipped + 1))
	fi
}

# The migration, multifd, failure and hostile-peer tests again with kmig
# built with ASan + UBSan (make SAN=1 all): a sanitizer report fails the test.
SAN_E2E="tests/e2e/test_migrate.py tests/e2e/test_multifd.py tests/e2e/test_migrate_fail.py
	tests/e2e/test_hostile.py tests/e2e/test_tls.py tests/e2e/test_postcopy.py
	tests/e2e/test_save_restore.py tests/e2e/test_postcopy_preempt.py tests/e2e/test_xbzrle.py
	tests/e2e/test_background_snapshot.py tests/e2e/test_ignore_shared.py
	tests/e2e/test_start_paused.py tests/e2e/test_early_channels.py"
# Under emulation ASan's slowdown on top of TCG's made that cut take ten
# minutes, and post-copy's alone seven; there it keeps the one-VMM
# migrations, failures and post-copy's verified migrations (multifd, TLS,
# post-copy's recovery and the hostile peers run plainly there).
SAN_E2E_EMULATED="tests/e2e/test_migrate.py tests/e2e/test_migrate_fail.py
	tests/e2e/test_postcopy.py::test_verify tests/e2e/test_save_restore.py
	tests/e2e/test_postcopy_preempt.py::test_preempt tests/e2e/test_xbzrle.py::test_stress_deltas
	tests/e2e/test_xbzrle.py::test_verify_guest
	tests/e2e/test_background_snapshot.py::test_snapshot_restore
	tests/e2e/test_ignore_shared.py::test_local_update
	tests/e2e/test_start_paused.py::test_autostart tests/e2e/test_early_channels.py"
# Cancel, failure and hostile-peer tests with kmig built with
# ThreadSanitizer (make TSAN=1 all): a data race reported fails the test.
# TSan slows kmig's page loops tenfold and more, so the cut leaves out the
# tests that need many pages moved in time (under emulation a migration
# that should reach its rounds did not within four minutes, and one that
# should converge moved 33 MB in two minutes).  Nor a migration of a
# device's guest: the sender reads guest pages while the disk's or network's
# threads write into them (used rings, data), which is by design (the
# write marks the page dirty, it is sent again) but is a race to TSan.
TSAN_E2E="tests/e2e/test_hostile.py tests/e2e/test_migrate_fail.py::test_cancel_stalled
	tests/e2e/test_migrate_fail.py::test_layout_mismatch
	tests/e2e/test_migrate_fail.py::test_nobody_listens_and_bad_uris
	tests/e2e/test_migrate_fail.py::test_second_migrate tests/e2e/test_migrate_fail.py::test_garbage
	tests/e2e/test_converge.py::test_dirty_limit_refused
	tests/e2e/test_save_restore.py::test_exec_failures
	tests/e2e/test_ignore_shared.py::test_local_update tests/e2e/test_ignore_shared.py::test_late_failure
	tests/e2e/test_start_paused.py::test_autostart tests/e2e/test_start_paused.py::test_stop_cont_race
	tests/e2e/test_early_channels.py"
# Under emulation the hostile peers run plainly only (they were two thirds
# of this cut's four minutes there).
TSAN_E2E_EMULATED="tests/e2e/test_migrate_fail.py::test_cancel_stalled
	tests/e2e/test_migrate_fail.py::test_layout_mismatch
	tests/e2e/test_migrate_fail.py::test_nobody_listens_and_bad_uris
	tests/e2e/test_migrate_fail.py::test_second_migrate tests/e2e/test_migrate_fail.py::test_garbage
	tests/e2e/test_converge.py::test_dirty_limit_refused
	tests/e2e/test_save_restore.py::test_exec_failures
	tests/e2e/test_ignore_shared.py::test_local_update tests/e2e/test_ignore_shared.py::test_late_failure
	tests/e2e/test_start_paused.py::test_autostart tests/e2e/test_start_paused.py::test_stop_cont_race
	tests/e2e/test_early_channels.py::test_early[all_reversed]"
# $1: the whole list, $2: its cut under emulation (unless KMIG_TEST_ALL=1)
cut_list() {
	if [ "${KMIG_TEST_EMULATED:-}" = 1 ] && [ "${KMIG_TEST_ALL:-}" != 1 ]; then
		echo "$2"
	else
		echo "$1"
	fi
}

# kvm_pvm cannot run a stock Linux kernel (docs/platform.md): on it the
# Linux tests run inside scripts/kvm-vm (kvm_amd under emulation) after the
# rest, instead of skipping here
LINUX_TESTS=test_linux
linux_elsewhere() { [ -d /sys/module/kvm_pvm ] && [ "${KMIG_TEST_EMULATED:-}" != 1 ]; }

kvm_items() {  # the kvm part, one item per line: C tests, pytest files, san:e2e
	local t
	for t in "$build"/tests/test_kvm_*; do
		[ -x "$t" ] || continue
		[ -n "$filter" ] && [[ "$(basename "$t")" != *"$filter"* ]] && continue
		echo "$t"
	done
	if [ "${skip_linux:-0}" = 1 ]; then
		kvm_pytest_files | grep -Ev "/${LINUX_TESTS}(_[a-z]+)?\.py$"
	else
		kvm_pytest_files
	fi
	if [ -x build-san/kmig ]; then
		for t in $(cut_list "$SAN_E2E" "$SAN_E2E_EMULATED"); do
			[ -z "$filter" ] || [[ "san:$t" == *"$filter"* ]] && echo "san:$t"
		done
	fi
	if [ -x build-tsan/kmig ] && { [ -z "$filter" ] || [[ "tsan:e2e" == *"$filter"* ]]; }; then
		echo "tsan:e2e"
	fi
}

# Items of the kvm part, longest first (measured under emulation, see
# docs/testing.md "The kvm part in two VMs"): several VMs take them from one
# queue, so the long ones start early and the short ones fill the gaps.
LONG_ITEMS="tests/e2e/test_linux_load.py tests/e2e/test_linux_faults.py tests/e2e/test_linux.py tests/e2e/test_matrix.py san:tests/e2e/test_postcopy.py san:tests/e2e/test_postcopy.py::test_verify
	tests/e2e/test_postcopy.py tests/e2e/test_net.py tests/e2e/test_faults.py tsan:e2e tests/e2e/test_converge.py
	san:tests/e2e/test_migrate_fail.py san:tests/e2e/test_migrate.py tests/e2e/test_hostile.py
	tests/e2e/test_migrate_fail.py tests/e2e/test_balloon.py tests/e2e/test_multifd.py"

ordered_items() {  # kvm_items, the long ones first in LONG_ITEMS' order
	local all i
	all=$(kvm_items)
	for i in $LONG_ITEMS; do
		grep -qxF "$i" <<< "$all" && echo "$i"
	done
	for i in $all; do
		[[ " $(echo $LONG_ITEMS) " == *" $i "* ]] || echo "$i"
	done
}

# Takes item $1 for this runner: true when no runner took it before.
# KMIG_CLAIMS is a directory shared by all the runners (the VMs see the
# checkout over 9p, where mkdir is the host's, atomic); each claim names
# its runner, so a runner started again after a freeze finds its own.
claim() {
	[ -z "${KMIG_CLAIMS:-}" ] && return 0
	local c
	c=$KMIG_CLAIMS/$(echo "$1" | tr '/:' '__')
	if mkdir "$c" 2>/dev/null; then
		echo "${KMIG_RUNNER:-0}" > "$c/runner"
		return 0
	fi
	[ "$(cat "$c/runner" 2>/dev/null)" = "${KMIG_RUNNER:-0}" ]
}

# Whether item $1 is already in a progress file (this runner's or another's).
finished() {
	[ -n "${KMIG_PROGRESS:-}" ] || return 1
	cat "$KMIG_PROGRESS" "${KMIG_PROGRESS%.*}".* 2>/dev/null | grep -q "^$1 "
}

# Runs the kvm part here.  With KMIG_PROGRESS set, each finished item adds
# "ITEM PASSED FAILED SKIPPED SECONDS" to that file, and items already
# there (or in another runner's file, KMIG_PROGRESS.*) are left out: a run
# that stopped (a frozen emulated machine) goes on where it was.  With
# KMIG_CLAIMS set, several runners share the items (claim).
run_kvm_part() {
	local item expr="kvm or qemu or linux" p0 f0 s0 t0 skip_linux=0
	linux_elsewhere && skip_linux=1
	if [ "${KMIG_TEST_EMULATED:-}" = 1 ] && [ "${KMIG_TEST_ALL:-}" != 1 ]; then
		expr="($expr) and not slow"
		echo "# under emulation: tests marked slow are left out (KMIG_TEST_ALL=1 runs them)"
	fi
	for item in $(ordered_items); do
		finished "$item" && continue
		claim "$item" || continue
		p0=$passed f0=$failed s0=$skipped t0=$SECONDS
		# shellcheck disable=SC2046
		case "$item" in
		san:*) KMIG_BUILD=build-san run_pytest "$expr" "${item#san:}" ;;
		*.py) run_pytest "$expr" "$item" ;;
		tsan:e2e) KMIG_BUILD=build-tsan TSAN_OPTIONS=${TSAN_OPTIONS:-second_deadlock_stack=1} \
			run_pytest "$expr" $(cut_list "$TSAN_E2E" "$TSAN_E2E_EMULATED") ;;
		*) run_one "$(basename "$item")" "$item" ;;
		esac
		[ -n "${KMIG_PROGRESS:-}" ] && echo "$item $((passed - p0)) $((failed - f0))" \
			"$((skipped - s0)) $((SECONDS - t0))" >> "$KMIG_PROGRESS"
	done
}

# One runner of the kvm part inside scripts/kvm-vm: $1 its number, $2 its
# progress file, $3 the seconds left.  When its emulated machine freezes
# (status 126) a new VM goes on from the item that was running, twice at most.
# Prints the runner's last status on fd 3.
vm_runner() {
	local n=$1 progress=$2 budget=$3 t0=$SECONDS rc attempt=1
	while :; do
		KMIG_RUNNER=$n KMIG_PROGRESS=$PWD/$progress scripts/kvm-vm --cpus "${KMIG_VM_CPUS:-1}" \
			--mem "${KMIG_VM_MEM:-8G}" --timeout $((budget - (SECONDS - t0))) \
			--env KMIG_TEST_ALL --env KMIG_TEST_FULL --env KMIG_TEST_KEEP \
			--env KMIG_CHAOS_RUNS --env KMIG_CHAOS_SEED \
			--env KMIG_PROGRESS --env KMIG_CLAIMS --env KMIG_RUNNER -- \
			tests/run.sh --part kvm "$build" "$filter" 2>&1
		rc=$?
		[ "$rc" = 126 ] && [ "$attempt" -lt 3 ] && [ $((SECONDS - t0)) -lt "$budget" ] ||
			break
		attempt=$((attempt + 1))
		echo "# the emulated machine froze; a new VM goes on from where it stopped"
	done
	echo "# VM runner $n: $((SECONDS - t0)) s, status $rc, VMs $attempt"
	echo "$rc" >&3
}

# The kvm part inside scripts/kvm-vm: KMIG_VMS VMs side by side (default:
# one per host core, at most 2), each with one emulated CPU, sharing the
# items.  Single-threaded TCG runs on one host thread, so two such VMs use
# the machine's two cores (docs/testing.md).
run_kvm_part_in_vm() {
	echo "== kvm part inside scripts/kvm-vm (${1:-no usable /dev/kvm here})"
	local t0=$SECONDS budget=${KMIG_VM_TIMEOUT:-3300} n vms rc=0 all finished_items base
	vms=${KMIG_VMS:-$(( $(nproc) >= 2 ? 2 : 1 ))}
	base=$(mktemp -d -p "$build" kvm-run.XXXXXX)
	export KMIG_CLAIMS=$PWD/$base/claims
	mkdir -p "$KMIG_CLAIMS"
	: > "$log.vm"
	echo "# $vms VMs side by side, ${KMIG_VM_CPUS:-1} emulated CPU each"
	for n in $(seq 1 "$vms"); do
		{ vm_runner "$n" "$base/progress.$n" "$budget" 3> "$base/rc.$n" |
			sed -u "s/^/vm$n| /" | tee -a "$log.vm"; } &
	done
	wait
	for n in $(seq 1 "$vms"); do
		[ "$(cat "$base/rc.$n" 2>/dev/null)" = 0 ] || rc=$(cat "$base/rc.$n" 2>/dev/null || echo 125)
	done
	echo "# kvm part inside scripts/kvm-vm: $((SECONDS - t0)) s, status $rc, $vms VMs"
	if ! grep -q '^vm[0-9]*| platform: kvm' "$log.vm"; then
		echo "not ok kvm-vm: no VM with a usable KVM could be started (status $rc), so" \
			"the tests that need KVM did not run; see scripts/kvm-vm's messages above" |
			tee -a "$fails"
		failed=$((failed + 1))
	fi
	# the counts are the finished items'; an item cut short is a failure
	grep -E '^vm[0-9]+\| not ok ' "$log.vm" >> "$fails"
	echo "# items by seconds in the VMs (item passed failed skipped seconds):"
	cat "$base"/progress.* 2>/dev/null | sort -k5 -n -r | sed 's/^/#   /'
	while read -r _ p f s _; do
		passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
	done < <(cat "$base"/progress.* 2>/dev/null)
	# the items as the VMs see them (under emulation the ASan cut is shorter)
	all=$(KMIG_TEST_EMULATED=1 kvm_items | wc -l)
	finished_items=$(cat "$base"/progress.* 2>/dev/null | wc -l)
	if [ "$finished_items" -lt "$all" ] || { [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; }; then
		echo "not ok kvm-vm: status $rc; $finished_items of $all items finished" | tee -a "$fails"
		failed=$((failed + 1))
	fi
	rm -rf "$base" "$log.vm"
}

# The Linux tests inside scripts/kvm-vm, where /dev/kvm is kvm_pvm here.
run_linux_in_vm() {
	local f=$filter
	[ -n "$f" ] && [[ "$LINUX_TESTS" != *"$f"* ]] && return 0
	filter=$LINUX_TESTS
	run_kvm_part_in_vm "kvm_pvm here cannot run Linux: $LINUX_TESTS.py"
	filter=$f
}

if [ "$part" = items ]; then   # the kvm part's items, in the order it takes them
	ordered_items
	exit 0
fi
t_start=$SECONDS
$PY tests/lib/kvm_platform.py
kvm_ok=$?
case "$part" in
host) run_host_part ;;
kvm)
	if [ "$kvm_ok" -ne 0 ]; then
		echo "not ok kvm part: no usable /dev/kvm" | tee -a "$fails"
		failed=$((failed + 1))
	else
		run_kvm_part
	fi ;;
all)
	run_host_part
	if [ "$kvm_ok" -eq 0 ]; then
		run_kvm_part
		linux_elsewhere && run_linux_in_vm
	else
		run_kvm_part_in_vm
	fi ;;
*) echo "tests/run.sh: unknown part $part" >&2; exit 2 ;;
esac
echo "# tests/run.sh --part $part: $((SECONDS - t_start)) s"
# the failures again, last, where a tail of the log shows them (each cut
# to 300 characters, at most 20)
if [ -s "$fails" ]; then
	echo "# what failed:"
	awk '!seen[$0]++' "$fails" | head -n 20 | cut -c1-300
fi
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
