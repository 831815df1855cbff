/* Throttle arithmetic: pure functions, no state, no clocks, no threads.
 *
 * 1. cpu-throttle (QEMU semantics).  At throttle percentage p (0..99) a vCPU
 *    runs for one timeslice and then sleeps timeslice * p / (100 - p), so it
 *    is asleep p% of the time.  QEMU's timeslice is 10 ms.
 *
 * 2. dirty-limit (the QEMU 8.1 idea, our own control law).  A vCPU runs for
 *    period_ms, then sleeps sleep_us; the caller measures its dirty rate over
 *    whole run+sleep cycles and calls dirtylimit__next_sleep_us() once per
 *    measurement with the sleep that was in effect while measuring.  The law
 *    (docs/policies.md):
 *      model      rate = R * run / (run + sleep)   (R = unthrottled rate)
 *      estimate   R    = measured * (run + sleep) / run
 *      target     sleep* = run * (R - quota) / quota
 *                        = measured * (run + sleep) / quota - run
 *      over quota  (measured > quota * 1.05): sleep' = sleep*   (one step)
 *      under quota (measured < quota * 0.95): sleep' = sleep - (sleep - max(sleep*, 0)) / 2
 *      otherwise (dead band of +-5%):         sleep' = sleep
 *    clamped to [0, DIRTYLIMIT_MAX_SLEEP_FACTOR * run]. */
#ifndef KMIG_KVM_THROTTLE_MATH_H
#define KMIG_KVM_THROTTLE_MATH_H

#include <stdint.h>

#define THROTTLE_TIMESLICE_NS   10000000ull /* QEMU CPU_THROTTLE_TIMESLICE_NS */
#define THROTTLE_PCT_MAX        99u
#define THROTTLE_MAX_STALL_NS   20000000ull  /* longest single throttle sleep */
#define THROTTLE_MIN_SLICE_NS   200000ull    /* shortest run slice */

/* Sleep after each run timeslice at throttle pct; pct above 99 counts as 99,
 * pct 0 gives 0.  Exact integer math (floor), no overflow for any timeslice
 * up to UINT64_MAX / 99. */
uint64_t throttle__sleep_ns(unsigned pct, uint64_t timeslice_ns);

/* Length of one run + sleep cycle: timeslice * 100 / (100 - pct), floor. */
uint64_t throttle__cycle_ns(unsigned pct, uint64_t timeslice_ns);

/* Bounded stalls.  A vCPU that should sleep sleep10_ns after every
 * THROTTLE_TIMESLICE_NS of running (the larger of the cpu-throttle and
 * dirty-limit sleeps) keeps that ratio of sleep to run but, where the sleep
 * would be longer than THROTTLE_MAX_STALL_NS (a throttle above 66%), runs
 * for a shorter slice and sleeps proportionally less: at 99% it runs 0.2 ms
 * and sleeps 20 ms instead of running 10 ms and sleeping 990 ms, so the
 * guest never stops for more than 20 ms at a time (its clients see no
 * longer silence), with the same share of time asleep.  Returns the run
 * slice, at least THROTTLE_MIN_SLICE_NS. */
uint64_t throttle__slice_ns(uint64_t sleep10_ns);
/* The sleep after a run slice of slice_ns: sleep10_ns scaled by
 * slice_ns / THROTTLE_TIMESLICE_NS (floor, saturating). */
uint64_t throttle__scaled_sleep_ns(uint64_t sleep10_ns, uint64_t slice_ns);
/* The sleep after a run of run_ns that was due to end after slice_ns (the
 * kick comes a little late): sleep10_ns scaled to the run, so the share
 * asleep stays exact, but for at most twice the slice (a run far longer
 * than its slice was not throttled: it does not owe a longer sleep). */
uint64_t throttle__run_sleep_ns(uint64_t sleep10_ns, uint64_t slice_ns, uint64_t run_ns);
/* A run longer than this since the last sleep means the throttle was off
 * meanwhile: the vCPU starts a fresh slice instead of sleeping. */
#define THROTTLE_STALE_NS       (4 * THROTTLE_TIMESLICE_NS + THROTTLE_MAX_STALL_NS)

/* Upper bound of the dirty-limit sleep: the vCPU keeps at least 1% of the
 * time (as QEMU's DIRTYLIMIT_THROTTLE_PCT_MAX 99). */
#define DIRTYLIMIT_MAX_SLEEP_FACTOR 99u
/* Dead band in percent of the quota: inside it the sleep is kept. */
#define DIRTYLIMIT_DEADBAND_PCT     5u

/* Next sleep per period for one vCPU.  quota_mbps and measured_mbps are in
 * MB/s with MB = 2^20 bytes (QEMU's unit for dirty rates), though any unit
 * works as long as both use it.  Special cases: period_ms 0 returns
 * current_sleep_us unchanged; measured 0 returns 0 (nothing to limit);
 * quota 0 returns the maximum sleep.  Never overflows; the result is always
 * within [0, DIRTYLIMIT_MAX_SLEEP_FACTOR * period_ms * 1000]. */
uint64_t dirtylimit__next_sleep_us(uint64_t current_sleep_us, uint64_t quota_mbps,
				   uint64_t measured_mbps, uint64_t period_ms);

/* dirtylimit__next_sleep_us for a quota in MB/s and a rate measured in
 * pages of page_size per second: the law is applied in pages/s, so a rate
 * under 1 MB/s is not read as 0 (which would drop the whole sleep) when the
 * quota itself is a few MB/s.  page_size 0 returns current_sleep_us. */
uint64_t dirtylimit__next_sleep_pages(uint64_t current_sleep_us, uint64_t quota_mbps,
				      uint64_t measured_pps, uint64_t page_size,
				      uint64_t period_ms);

/* Dirty rate the model predicts for a vCPU dirtying unthrottled_mbps when it
 * runs period_ms and then sleeps sleep_us: R * run / (run + sleep).  Used by
 * tests and by the engine to report the expected effect of a sleep. */
uint64_t dirtylimit__model_rate(uint64_t unthrottled_mbps, uint64_t sleep_us,
				uint64_t period_ms);

#endif
