#include <errno.h>

#include "mig/policy/policy.h"

#define PCT_CAP 99u

static uint64_t sat64(unsigned __int128 v)
{
	return v > UINT64_MAX ? UINT64_MAX : (uint64_t)v;
}

static unsigned umin(unsigned a, unsigned b) { return a < b ? a : b; }
static unsigned umax(unsigned a, unsigned b) { return a > b ? a : b; }

static unsigned clamp_pct(unsigned v, unsigned lo, unsigned hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

void policy__params_default(struct policy_params *p)
{
	*p = (struct policy_params){
		.kind = POLICY_NONE,
		.throttle_trigger_threshold = 50,
		.cpu_throttle_initial = 20,
		.cpu_throttle_increment = 10,
		.cpu_throttle_tailslow = false,
		.max_cpu_throttle = 99,
		.downtime_limit_ms = 300,
	};
}

int policy__params_check(const struct policy_params *p)
{
	if (p->kind != POLICY_NONE && p->kind != POLICY_STEP && p->kind != POLICY_COMPUTED)
		return -EINVAL;
	if (p->throttle_trigger_threshold < 1 || p->throttle_trigger_threshold > 100)
		return -EINVAL;
	if (p->cpu_throttle_initial < 1 || p->cpu_throttle_initial > PCT_CAP)
		return -EINVAL;
	if (p->cpu_throttle_increment < 1 || p->cpu_throttle_increment > PCT_CAP)
		return -EINVAL;
	if (p->max_cpu_throttle < 1 || p->max_cpu_throttle > PCT_CAP)
		return -EINVAL;
	if (p->downtime_limit_ms > 2000000)
		return -EINVAL;
	return 0;
}

void policy__state_init(struct policy_state *s)
{
	*s = (struct policy_state){0};
}

uint64_t policy__expected_downtime_ms(uint64_t remaining_bytes, uint64_t bandwidth_bps)
{
	if (!remaining_bytes)
		return 0;
	if (!bandwidth_bps)
		return UINT64_MAX;
	return sat64(((unsigned __int128)remaining_bytes * 1000 + bandwidth_bps - 1) / bandwidth_bps);
}

bool policy__should_switchover(const struct policy_input *in, uint64_t downtime_limit_ms,
			       uint64_t *expected_downtime_ms)
{
	if (expected_downtime_ms)
		*expected_downtime_ms = policy__expected_downtime_ms(in->remaining_bytes,
								     in->bandwidth_bps);
	if (!in->remaining_bytes)
		return true;
	return (unsigned __int128)in->remaining_bytes * 1000 <=
	       (unsigned __int128)in->bandwidth_bps * downtime_limit_ms;
}

bool policy__final_round(const struct policy_input *in, uint64_t downtime_limit_ms)
{
	uint64_t e = policy__expected_downtime_ms(in->remaining_bytes, in->bandwidth_bps);
	return e > POLICY_FINAL_ROUND_MIN_MS && e != UINT64_MAX && e * 4 > downtime_limit_ms;
}

bool policy__postcopy_now(const struct policy_input *in, uint64_t downtime_limit_ms)
{
	uint64_t bw = in->bandwidth_bps, rate = in->dirty_rate_bps;
	if (!bw || !rate || policy__should_switchover(in, downtime_limit_ms, 0))
		return false;
	if (rate >= bw)
		return true;    /* r >= 1: the rest never shrinks */
	unsigned __int128 target = (unsigned __int128)bw * downtime_limit_ms;
	unsigned __int128 rest = (unsigned __int128)in->remaining_bytes * 1000;
	for (unsigned n = 0; n < POLICY_POSTCOPY_ROUNDS; n++) {
		/* rest * rate / bw without overflow (rate < bw) */
		rest = rest / bw * rate + rest % bw * rate / bw;
		if (rest <= target)
			return false;
	}
	return true;
}

bool policy__postcopy_early(const struct policy_input *in, uint64_t elapsed_ms,
			    uint64_t downtime_limit_ms)
{
	return elapsed_ms >= POLICY_EARLY_MIN_MS && in->remaining_bytes &&
	       policy__postcopy_now(in, downtime_limit_ms);
}

bool policy__period_high(const struct policy_input *in, unsigned threshold_pct)
{
	uint64_t limit = sat64((unsigned __int128)in->bytes_sent_period * threshold_pct / 100);

	return in->dirty_bytes_period > limit;
}

unsigned policy__needed_pct(uint64_t dirty_rate_bps, uint64_t bandwidth_bps,
			    unsigned threshold_pct)
{
	/* rate * (100 - p) <= bw * T  <=>  100 - p <= floor(bw * T / rate) */
	unsigned __int128 allowed;

	if (!dirty_rate_bps)
		return 0;
	allowed = (unsigned __int128)bandwidth_bps * threshold_pct / dirty_rate_bps;
	return allowed >= 100 ? 0 : 100 - (unsigned)allowed;
}

/* Need from the period's byte counts: the smallest p' with
 * dirty * (100 - p') / (100 - p) <= sent * T / 100, p the throttle in
 * effect during the period (dirtying scales with the guest's run share). */
static unsigned need_from_period(const struct policy_input *in, unsigned T)
{
	unsigned run = 100 - umin(in->throttle_pct, PCT_CAP);
	unsigned __int128 allowed;

	if (!in->dirty_bytes_period)
		return 0;
	allowed = (unsigned __int128)in->bytes_sent_period * T * run /
		  ((unsigned __int128)100 * in->dirty_bytes_period);
	return allowed >= 100 ? 0 : 100 - (unsigned)allowed;
}

/* Need from the measured rate, first scaled back to the unthrottled rate
 * rate * 100 / (100 - p).  0 when rate or bandwidth is unknown. */
static unsigned need_from_rate(const struct policy_input *in, unsigned T)
{
	unsigned run = 100 - umin(in->throttle_pct, PCT_CAP);
	uint64_t unthrottled;

	if (!in->dirty_rate_bps || !in->bandwidth_bps)
		return 0;
	unthrottled = sat64((unsigned __int128)in->dirty_rate_bps * 100 / run);
	return policy__needed_pct(unthrottled, in->bandwidth_bps, T);
}

/* The two-high-periods trigger shared by STEP and COMPUTED (QEMU's
 * dirty_rate_high_cnt: a low period does not reset the count). */
static bool trigger(struct policy_state *s, const struct policy_input *in, unsigned T)
{
	if (!policy__period_high(in, T) || ++s->high_count < 2)
		return false;
	s->high_count = 0;
	return true;
}

unsigned policy__step(struct policy_state *s, const struct policy_params *p,
		      const struct policy_input *in)
{
	unsigned cur = umin(in->throttle_pct, PCT_CAP), inc, cpu_now;
	uint64_t limit, cpu_ideal;

	if (!trigger(s, in, p->throttle_trigger_threshold))
		return cur;
	if (!cur)
		return umin(p->cpu_throttle_initial, p->max_cpu_throttle);
	inc = p->cpu_throttle_increment;
	if (p->cpu_throttle_tailslow) {
		/* Guest CPU share that would bring the dirty bytes down to the
		 * threshold; dirty_bytes_period > limit >= 0 here. */
		limit = sat64((unsigned __int128)in->bytes_sent_period * p->throttle_trigger_threshold / 100);
		cpu_now = 100 - cur;
		cpu_ideal = sat64((unsigned __int128)cpu_now * limit / in->dirty_bytes_period);
		inc = umin((unsigned)(cpu_now - cpu_ideal), inc);
	}
	return umin(cur + inc, p->max_cpu_throttle);
}

static void track_progress(struct policy_state *s, const struct policy_input *in,
			   bool *shrinking)
{
	*shrinking = s->have_prev && in->remaining_bytes < s->prev_remaining;
	if (s->have_prev && !*shrinking && in->remaining_bytes)
		s->stall_count++;
	else
		s->stall_count = 0;
	s->prev_remaining = in->remaining_bytes;
	s->have_prev = true;
}

unsigned policy__computed(struct policy_state *s, const struct policy_params *p,
			  const struct policy_input *in)
{
	unsigned T = p->throttle_trigger_threshold, max = p->max_cpu_throttle;
	unsigned cur = umin(in->throttle_pct, PCT_CAP), need, next = cur;
	bool shrinking;

	track_progress(s, in, &shrinking);
	need = umax(need_from_rate(in, T), need_from_period(in, T));
	if (!s->computed_active) {
		if (!trigger(s, in, T))
			return cur;
		s->computed_active = true;
		s->stall_count = 0;
		return clamp_pct(umax(need, cur), 1, max);
	}
	if (need > cur) {
		next = need;
	} else if (s->stall_count >= POLICY_STALL_PERIODS) {
		/* The model says enough, the dirty set says no: cut the guest's
		 * run share by a quarter. */
		next = cur + umax(1, (100 - cur) / 4);
		s->stall_count = 0;
	} else if (need + POLICY_LOWER_MARGIN <= cur && shrinking) {
		next = cur - umin(POLICY_LOWER_MAX_STEP, umax(1, (cur - need) / 2));
	}
	return clamp_pct(next, 1, max);
}

void policy__decide(struct policy_state *s, const struct policy_params *p,
		    const struct policy_input *in, struct policy_decision *out)
{
	unsigned cur = in->throttle_pct, next = cur;

	out->throttle_pct = cur;
	if (policy__should_switchover(in, p->downtime_limit_ms, &out->expected_downtime_ms)) {
		out->action = POLICY_SWITCHOVER;
		return;
	}
	if (p->kind == POLICY_STEP)
		next = policy__step(s, p, in);
	else if (p->kind == POLICY_COMPUTED)
		next = policy__computed(s, p, in);
	out->action = next != cur ? POLICY_SET_THROTTLE : POLICY_CONTINUE;
	out->throttle_pct = next;
}
