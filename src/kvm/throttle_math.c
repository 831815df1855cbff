#include "kvm/throttle_math.h"

/* floor(a * b / c), saturated to UINT64_MAX; c == 0 gives UINT64_MAX. */
static uint64_t muldiv(uint64_t a, uint64_t b, uint64_t c)
{
	unsigned __int128 r;

	if (!c)
		return UINT64_MAX;
	r = (unsigned __int128)a * b / c;
	return r > UINT64_MAX ? UINT64_MAX : (uint64_t)r;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
	return a + b < a ? UINT64_MAX : a + b;
}

uint64_t throttle__sleep_ns(unsigned pct, uint64_t timeslice_ns)
{
	if (pct > THROTTLE_PCT_MAX)
		pct = THROTTLE_PCT_MAX;
	return muldiv(timeslice_ns, pct, 100 - pct);
}

uint64_t throttle__slice_ns(uint64_t sleep10_ns)
{
	if (sleep10_ns <= THROTTLE_MAX_STALL_NS)
		return THROTTLE_TIMESLICE_NS;
	uint64_t s = muldiv(THROTTLE_TIMESLICE_NS, THROTTLE_MAX_STALL_NS, sleep10_ns);
	return s < THROTTLE_MIN_SLICE_NS ? THROTTLE_MIN_SLICE_NS : s;
}

uint64_t throttle__scaled_sleep_ns(uint64_t sleep10_ns, uint64_t slice_ns)
{
	return muldiv(sleep10_ns, slice_ns, THROTTLE_TIMESLICE_NS);
}

uint64_t throttle__run_sleep_ns(uint64_t sleep10_ns, uint64_t slice_ns, uint64_t run_ns)
{
	uint64_t cap = slice_ns > UINT64_MAX / 2 ? UINT64_MAX : 2 * slice_ns;
	return throttle__scaled_sleep_ns(sleep10_ns, run_ns < cap ? run_ns : cap);
}

uint64_t throttle__cycle_ns(unsigned pct, uint64_t timeslice_ns)
{
	if (pct > THROTTLE_PCT_MAX)
		pct = THROTTLE_PCT_MAX;
	return muldiv(timeslice_ns, 100, 100 - pct);
}

static uint64_t clamp_sleep(uint64_t sleep_us, uint64_t max_us)
{
	return sleep_us > max_us ? max_us : sleep_us;
}

/* Whether measured is within +-DIRTYLIMIT_DEADBAND_PCT of quota. */
static int in_deadband(uint64_t measured, uint64_t quota)
{
	unsigned __int128 m = (unsigned __int128)measured * 100;

	return m <= (unsigned __int128)quota * (100 + DIRTYLIMIT_DEADBAND_PCT) &&
	       m >= (unsigned __int128)quota * (100 - DIRTYLIMIT_DEADBAND_PCT);
}

/* ceil(measured * cycle / quota) - run, at least 0, saturated; quota > 0. */
static uint64_t target_sleep(uint64_t measured, uint64_t cycle_us,
			     uint64_t quota, uint64_t run_us)
{
	unsigned __int128 want = ((unsigned __int128)measured * cycle_us + quota - 1) / quota;

	if (want <= run_us)
		return 0;
	want -= run_us;
	return want > UINT64_MAX ? UINT64_MAX : (uint64_t)want;
}

uint64_t dirtylimit__next_sleep_us(uint64_t current_sleep_us, uint64_t quota_mbps,
				   uint64_t measured_mbps, uint64_t period_ms)
{
	uint64_t run_us, max_us, target;

	if (!period_ms)
		return current_sleep_us;
	run_us = muldiv(period_ms, 1000, 1);
	max_us = muldiv(run_us, DIRTYLIMIT_MAX_SLEEP_FACTOR, 1);
	if (!measured_mbps)
		return 0;
	if (!quota_mbps)
		return max_us;
	current_sleep_us = clamp_sleep(current_sleep_us, max_us);
	if (in_deadband(measured_mbps, quota_mbps))
		return current_sleep_us;

	target = target_sleep(measured_mbps, sat_add(run_us, current_sleep_us),
			      quota_mbps, run_us);
	if (measured_mbps > quota_mbps)
		return clamp_sleep(target, max_us);
	/* Under the quota: release half of the excess sleep per period. */
	if (target >= current_sleep_us)
		return current_sleep_us;
	return current_sleep_us - (current_sleep_us - target) / 2;
}

uint64_t dirtylimit__next_sleep_pages(uint64_t current_sleep_us, uint64_t quota_mbps,
				      uint64_t measured_pps, uint64_t page_size,
				      uint64_t period_ms)
{
	if (!page_size)
		return current_sleep_us;
	/* quota in pages/s (MB = 2^20 bytes), at least 1 */
	uint64_t quota_pps = quota_mbps ? muldiv(quota_mbps, 1u << 20, page_size) : 0;

	if (quota_mbps && !quota_pps)
		quota_pps = 1;
	return dirtylimit__next_sleep_us(current_sleep_us, quota_pps, measured_pps, period_ms);
}

uint64_t dirtylimit__model_rate(uint64_t unthrottled_mbps, uint64_t sleep_us,
				uint64_t period_ms)
{
	uint64_t run_us = muldiv(period_ms, 1000, 1);

	return muldiv(unthrottled_mbps, run_us, sat_add(run_us, sleep_us));
}
