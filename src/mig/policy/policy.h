/* Convergence policy of the migration engine: pure functions of measured
 * numbers.  No clocks, no I/O, no locks; the migration thread owns one
 * struct policy_state per migration and calls policy__decide() (or the
 * pieces below) once per dirty-sync period.
 *
 * Laws (details and reasons in docs/policies.md):
 *  - switchover when remaining * 1000 <= bandwidth * downtime_limit_ms, or
 *    remaining == 0; expected downtime = ceil(remaining * 1000 / bandwidth) ms.
 *  - a period is "high" when dirty_bytes_period > bytes_sent_period *
 *    threshold / 100 (QEMU's test, integer math as QEMU).
 *  - POLICY_STEP (QEMU auto-converge): every second high period (the counter
 *    is not reset by a low period, as in QEMU) start at cpu-throttle-initial,
 *    then add cpu-throttle-increment (tailslow: min(increment, cpu_now -
 *    cpu_now * threshold_bytes / dirty_bytes)), capped at max-cpu-throttle.
 *  - POLICY_COMPUTED: trigger as STEP; then set at once the smallest p with
 *    rate * (100 - p) <= bandwidth * threshold, from both the dirty rate and
 *    the period's byte counts, and correct it every period (raise at once,
 *    raise by a quarter of the remaining run share after two periods without
 *    progress, lower by at most half the gap and at most 10 points when the
 *    need is 10+ points below and the dirty set shrinks). */
#ifndef KMIG_MIG_POLICY_H
#define KMIG_MIG_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#include "base/log.h"

enum policy_kind {
	POLICY_NONE,      /* never throttle */
	POLICY_STEP,      /* QEMU auto-converge */
	POLICY_COMPUTED,  /* throttle computed from rates (seed 000 patch 5) */
};

/* Migration parameters, QEMU names and defaults. */
struct policy_params {
	enum policy_kind kind;
	unsigned throttle_trigger_threshold; /* 1..100, default 50 (%) */
	unsigned cpu_throttle_initial;       /* 1..99, default 20 (%) */
	unsigned cpu_throttle_increment;     /* 1..99, default 10 (points) */
	bool cpu_throttle_tailslow;          /* default false */
	unsigned max_cpu_throttle;           /* 1..99, default 99 (%) */
	uint64_t downtime_limit_ms;          /* 0..2000000, default 300 */
};

/* Measurements of the last period (between two policy calls). */
struct policy_input {
	uint64_t bytes_sent_period;  /* bytes transferred during the period */
	uint64_t period_ms;          /* its duration (informational) */
	uint64_t dirty_bytes_period; /* dirty bytes found by the sync(s) of the period */
	uint64_t remaining_bytes;    /* dirty bytes still to send now */
	uint64_t bandwidth_bps;      /* measured link bandwidth, bytes/s (0: unknown) */
	uint64_t dirty_rate_bps;     /* bytes/s: with the ring, the peak rate since
				      * the previous call (dirtyrate__take_peak);
				      * with the bitmap, the sync rate; 0: unknown */
	unsigned throttle_pct;       /* throttle in effect during the period, 0..99 */
};

/* Per-migration state; zero it (or policy__state_init) at migration start. */
struct policy_state {
	unsigned high_count;      /* high periods since the last throttle change */
	bool computed_active;     /* POLICY_COMPUTED has made its first choice */
	bool have_prev;           /* prev_remaining is valid */
	uint64_t prev_remaining;  /* remaining_bytes of the previous call */
	unsigned stall_count;     /* periods in a row without the dirty set shrinking */
};

enum policy_action {
	POLICY_CONTINUE,      /* iterate again, throttle unchanged */
	POLICY_SET_THROTTLE,  /* iterate again with decision.throttle_pct */
	POLICY_SWITCHOVER,    /* stop the vCPUs and send the rest */
};

struct policy_decision {
	enum policy_action action;
	unsigned throttle_pct;          /* the throttle to have from now on */
	uint64_t expected_downtime_ms;  /* for query-migrate expected-downtime */
};

#define POLICY_STALL_PERIODS  2u   /* periods without progress before a raise */
#define POLICY_LOWER_MARGIN   10u  /* lower only if the need is this far below */
#define POLICY_LOWER_MAX_STEP 10u  /* and by at most this much per period */

void policy__params_default(struct policy_params *p);
/* 0 or -EINVAL if a field is outside the ranges above. */
int policy__params_check(const struct policy_params *p) KMIG_MUST_CHECK;
void policy__state_init(struct policy_state *s);

/* Expected downtime in ms, rounded up; 0 if remaining is 0, UINT64_MAX if
 * the bandwidth is 0 and remaining is not. */
uint64_t policy__expected_downtime_ms(uint64_t remaining_bytes, uint64_t bandwidth_bps);

/* True if the rest can be sent within downtime_limit_ms at the measured
 * bandwidth (or nothing remains).  *expected_downtime_ms (may be NULL) gets
 * policy__expected_downtime_ms(). */
bool policy__should_switchover(const struct policy_input *in, uint64_t downtime_limit_ms,
			       uint64_t *expected_downtime_ms);

/* After a switchover decision: whether one more round with the guest
 * running (and throttled as it is) should come first, so the stop-and-copy
 * carries only what the guest dirties during that short round.  True when
 * the expected downtime is more than a quarter of the limit and more than
 * POLICY_FINAL_ROUND_MIN_MS. */
#define POLICY_FINAL_ROUND_MIN_MS 20u
bool policy__final_round(const struct policy_input *in, uint64_t downtime_limit_ms);

/* Hybrid (capability x-postcopy-auto), asked after the bulk pass when the
 * switchover test failed: whether to switch to post-copy now because
 * pre-copy would not get the rest under the downtime limit within
 * POLICY_POSTCOPY_ROUNDS more rounds at the measured rates, unthrottled.
 * A round sends what is left at the bandwidth while the guest dirties at
 * its rate, so with r = dirty_rate / bandwidth the rest after n rounds is
 * remaining * r^n (r >= 1: never less).  False when a rate is unknown (0)
 * or the switchover test passes already. */
#define POLICY_POSTCOPY_ROUNDS 3u
bool policy__postcopy_now(const struct policy_input *in, uint64_t downtime_limit_ms);

/* Hybrid during the bulk pass (x-postcopy-auto with x-postcopy-early, on
 * by default), asked every few hundred ms of the pass: remaining_bytes is
 * what the pass has sent and the guest has written again since (reported
 * by a sync during the pass).  Those pages stay to send until the next
 * round, so they are a lower bound of what the pass will leave, and
 * policy__postcopy_now only grows with remaining_bytes: a yes now is the
 * yes the test after the pass would give, were the rates to stay.
 * Switching then spares sending twice every hot page the pass has yet to
 * reach.  False before elapsed_ms (of the pass) reaches
 * POLICY_EARLY_MIN_MS: the rates need that long to mean something. */
#define POLICY_EARLY_MIN_MS 500u
bool policy__postcopy_early(const struct policy_input *in, uint64_t elapsed_ms,
			    uint64_t downtime_limit_ms);

/* QEMU's trigger test for one period (see the laws above). */
bool policy__period_high(const struct policy_input *in, unsigned threshold_pct);

/* Smallest p in 0..100 with rate * (100 - p) <= bandwidth * threshold_pct,
 * exact.  0 if rate is 0; 100 if no p below 100 suffices (e.g. bandwidth 0). */
unsigned policy__needed_pct(uint64_t dirty_rate_bps, uint64_t bandwidth_bps,
			    unsigned threshold_pct);

/* QEMU auto-converge.  Returns the throttle to apply (== in->throttle_pct if
 * unchanged); updates s->high_count. */
unsigned policy__step(struct policy_state *s, const struct policy_params *p,
		      const struct policy_input *in);

/* Computed throttle.  Returns the throttle to apply (== in->throttle_pct if
 * unchanged, in particular before the first trigger); updates s.  A
 * bandwidth of 0 (unknown) or a dirty rate of 0 (unknown) leaves only the
 * byte-count estimate. */
unsigned policy__computed(struct policy_state *s, const struct policy_params *p,
			  const struct policy_input *in);

/* One call per period: switchover check first, then the policy of
 * p->kind.  Fills *out. */
void policy__decide(struct policy_state *s, const struct policy_params *p,
		    const struct policy_input *in, struct policy_decision *out);

#endif
