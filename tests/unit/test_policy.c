/* Convergence policy and throttle math: tables, and a round-by-round
 * migration model to compare the policies. */
#include <errno.h>
#include <stdint.h>

#include "harness.h"
#include "mig/policy/policy.h"
#include "kvm/throttle_math.h"

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* ---- cpu-throttle ---- */

static void t_throttle_sleep_table(struct t *t)
{
	static const struct { unsigned pct; uint64_t slice, sleep, cycle; } rows[] = {
		{ 0, THROTTLE_TIMESLICE_NS, 0, 10000000 },
		{ 1, THROTTLE_TIMESLICE_NS, 101010, 10101010 },
		{ 20, THROTTLE_TIMESLICE_NS, 2500000, 12500000 },
		{ 30, THROTTLE_TIMESLICE_NS, 4285714, 14285714 },
		{ 50, THROTTLE_TIMESLICE_NS, 10000000, 20000000 },
		{ 90, THROTTLE_TIMESLICE_NS, 90000000, 100000000 },
		{ 99, THROTTLE_TIMESLICE_NS, 990000000, 1000000000 },
		{ 100, THROTTLE_TIMESLICE_NS, 990000000, 1000000000 },   /* clamped */
		{ 5000, THROTTLE_TIMESLICE_NS, 990000000, 1000000000 },
		{ 50, 0, 0, 0 },
		{ 99, UINT64_MAX, UINT64_MAX, UINT64_MAX },             /* saturates */
		{ 50, UINT64_MAX / 2, UINT64_MAX / 2, UINT64_MAX - 1 },
	};

	for (unsigned i = 0; i < N(rows); i++) {
		T_CHECK(t, throttle__sleep_ns(rows[i].pct, rows[i].slice) == rows[i].sleep);
		T_CHECK(t, throttle__cycle_ns(rows[i].pct, rows[i].slice) == rows[i].cycle);
	}
	/* The vCPU sleeps p% of each cycle. */
	for (unsigned p = 0; p <= 99; p++) {
		uint64_t s = throttle__sleep_ns(p, THROTTLE_TIMESLICE_NS);
		uint64_t c = throttle__cycle_ns(p, THROTTLE_TIMESLICE_NS);

		T_CHECK(t, s * 100 / c == p || s * 100 / c + 1 == p);
	}
}

/* Above 66% the run slice shrinks: no sleep is longer than 20 ms and the
 * share of time asleep stays what the percentage says. */
static void t_throttle_bounded_stall(struct t *t)
{
	T_CHECK_EQ(t, throttle__slice_ns(0), THROTTLE_TIMESLICE_NS);
	T_CHECK_EQ(t, throttle__slice_ns(19400000), THROTTLE_TIMESLICE_NS);  /* 66%: as QEMU */
	T_CHECK_EQ(t, throttle__slice_ns(THROTTLE_MAX_STALL_NS), THROTTLE_TIMESLICE_NS);
	/* 90%: 2.22 ms run, 20 ms sleep (QEMU: 10 ms run, 90 ms sleep) */
	T_CHECK_EQ(t, throttle__slice_ns(90000000), 2222222);
	/* 99%: 0.202 ms run, 20 ms sleep (QEMU: 10 ms run, 990 ms sleep) */
	uint64_t s99 = throttle__sleep_ns(99, THROTTLE_TIMESLICE_NS);
	T_CHECK_EQ(t, throttle__slice_ns(s99), 202020);
	T_CHECK(t, throttle__scaled_sleep_ns(s99, 202020) <= THROTTLE_MAX_STALL_NS);
	T_CHECK(t, throttle__scaled_sleep_ns(s99, 202020) >= THROTTLE_MAX_STALL_NS - 1000);
	/* a huge dirty-limit sleep: the slice floor */
	T_CHECK_EQ(t, throttle__slice_ns(UINT64_MAX), THROTTLE_MIN_SLICE_NS);
	T_CHECK_EQ(t, throttle__scaled_sleep_ns(UINT64_MAX, THROTTLE_TIMESLICE_NS), UINT64_MAX);
	for (unsigned p = 1; p <= 99; p++) {
		uint64_t s10 = throttle__sleep_ns(p, THROTTLE_TIMESLICE_NS);
		uint64_t slice = throttle__slice_ns(s10);
		uint64_t sleep = throttle__scaled_sleep_ns(s10, slice);

		T_CHECK(t, sleep <= THROTTLE_MAX_STALL_NS);
		T_CHECK(t, slice <= THROTTLE_TIMESLICE_NS && slice >= THROTTLE_MIN_SLICE_NS);
		/* asleep p% of each cycle, within rounding */
		uint64_t pm = sleep * 10000 / (sleep + slice);
		T_CHECK(t, pm + 5 >= p * 100u && pm <= p * 100u + 5);
	}
}

/* The sleep follows the run measured (a late kick), up to twice the slice. */
static void t_throttle_run_sleep(struct t *t)
{
	uint64_t s50 = throttle__sleep_ns(50, THROTTLE_TIMESLICE_NS);       /* 10 ms */
	T_CHECK_EQ(t, throttle__run_sleep_ns(s50, THROTTLE_TIMESLICE_NS, THROTTLE_TIMESLICE_NS), s50);
	T_CHECK_EQ(t, throttle__run_sleep_ns(s50, THROTTLE_TIMESLICE_NS, 15000000), 15000000);
	T_CHECK_EQ(t, throttle__run_sleep_ns(s50, THROTTLE_TIMESLICE_NS, 50000000), 20000000);
	T_CHECK_EQ(t, throttle__run_sleep_ns(s50, THROTTLE_TIMESLICE_NS, 0), 0);
	/* 99%: a 0.202 ms slice that ran 0.22 ms sleeps in proportion */
	uint64_t s99 = throttle__sleep_ns(99, THROTTLE_TIMESLICE_NS);
	uint64_t sl = throttle__slice_ns(s99);
	uint64_t z = throttle__run_sleep_ns(s99, sl, 220000);
	T_CHECK(t, z > THROTTLE_MAX_STALL_NS && z < THROTTLE_MAX_STALL_NS * 11 / 10);
	T_CHECK_EQ(t, throttle__run_sleep_ns(UINT64_MAX, UINT64_MAX, UINT64_MAX), UINT64_MAX);
}

/* ---- dirty limit ---- */

static void t_dirtylimit_special(struct t *t)
{
	/* period 0: no information, keep. */
	T_CHECK_EQ(t, dirtylimit__next_sleep_us(1234, 100, 500, 0), 1234);
	/* Not dirtying: no sleep. */
	T_CHECK_EQ(t, dirtylimit__next_sleep_us(50000, 100, 0, 100), 0);
	/* Quota 0: the maximum, 99 x the run slice. */
	T_CHECK_EQ(t, dirtylimit__next_sleep_us(0, 0, 10, 100), 9900000);
	/* Dead band (+-5%): keep. */
	T_CHECK_EQ(t, dirtylimit__next_sleep_us(7000, 100, 105, 100), 7000);
	T_CHECK_EQ(t, dirtylimit__next_sleep_us(7000, 100, 95, 100), 7000);
	T_CHECK_EQ(t, dirtylimit__next_sleep_us(0, 100, 104, 100), 0);
	/* Over: exact inversion.  R = 400 at run 100 ms: sleep 300 ms. */
	T_CHECK_EQ(t, dirtylimit__next_sleep_us(0, 100, 400, 100), 300000);
	/* measured 200 under sleep 100 ms: R = 400 again. */
	T_CHECK_EQ(t, dirtylimit__next_sleep_us(100000, 100, 200, 100), 300000);
	/* Under: half of the excess released.  measured 50 under 300 ms: R = 200,
	 * sleep* = 100 ms, so 300 - 100 = 200 ms. */
	T_CHECK_EQ(t, dirtylimit__next_sleep_us(300000, 100, 50, 100), 200000);
	/* In pages/s: quota 1 MB/s (256 pages of 4 KiB), measured 230 pages/s
	 * (0.9 MB/s, read as 0 MB/s in whole MB/s) under 500 ms of sleep: under
	 * the quota, so half the excess is released, not the whole sleep
	 * (R = 230 * 1.5 = 345 pages/s, sleep* = 1000 * 89 / 256 ms). */
	T_CHECK_EQ(t, dirtylimit__next_sleep_pages(500000, 1, 230, 4096, 1000), 423829);
	/* over it: 512 pages/s (2 MB/s) under no sleep: 1 s more */
	T_CHECK_EQ(t, dirtylimit__next_sleep_pages(0, 1, 512, 4096, 1000), 1000000);
	T_CHECK_EQ(t, dirtylimit__next_sleep_pages(1234, 1, 512, 0, 1000), 1234);
	/* Under with no sleep: stays 0. */
	T_CHECK_EQ(t, dirtylimit__next_sleep_us(0, 100, 10, 100), 0);
	/* Current sleep above the cap is clamped first. */
	T_CHECK_EQ(t, dirtylimit__next_sleep_us(UINT64_MAX, 100, 100, 10), 990000);
	/* Huge numbers: stay within [0, 99 x run]. */
	T_CHECK_EQ(t, dirtylimit__next_sleep_us(UINT64_MAX, 1, UINT64_MAX, 10), 990000);
	T_CHECK(t, dirtylimit__next_sleep_us(0, 1, UINT64_MAX, UINT64_MAX) == UINT64_MAX);
	T_CHECK_EQ(t, dirtylimit__next_sleep_us(UINT64_MAX, UINT64_MAX, 1, 10), 495000);
	/* Model. */
	T_CHECK_EQ(t, dirtylimit__model_rate(400, 300000, 100), 100);
	T_CHECK_EQ(t, dirtylimit__model_rate(400, 0, 100), 400);
	T_CHECK_EQ(t, dirtylimit__model_rate(UINT64_MAX, 0, UINT64_MAX), UINT64_MAX);
}

/* Runs the loop of one vCPU that dirties r MB/s unthrottled, measuring
 * through the model (optionally with +-noise_pct alternating error).
 * Returns the number of periods until the measured rate stays within 10% of
 * the quota (or of the best reachable rate), -1 if never within max_periods. */
static int dirtylimit_sim(struct t *t, uint64_t r, uint64_t quota, uint64_t period_ms,
			  uint64_t start_sleep_us, unsigned noise_pct, int max_periods)
{
	uint64_t sleep = start_sleep_us, max_sleep = period_ms * 1000 * 99;
	uint64_t floor_rate = dirtylimit__model_rate(r, max_sleep, period_ms);
	uint64_t goal = quota > r ? r : quota < floor_rate ? floor_rate : quota;
	int settled_at = -1;

	for (int i = 0; i < max_periods; i++) {
		uint64_t true_rate = dirtylimit__model_rate(r, sleep, period_ms);
		uint64_t m = true_rate;
		int ok;

		if (noise_pct)
			m = i % 2 ? m * (100 + noise_pct) / 100 : m * (100 - noise_pct) / 100;
		ok = true_rate * 10 <= goal * 11 + 10 && true_rate * 10 + 10 >= goal * 9;
		if (ok && settled_at < 0)
			settled_at = i;
		if (!ok)
			settled_at = -1;
		sleep = dirtylimit__next_sleep_us(sleep, quota, m, period_ms);
		T_CHECK(t, sleep <= max_sleep);
	}
	return settled_at;
}

static void t_dirtylimit_convergence(struct t *t)
{
	static const uint64_t rates[] = { 20, 100, 400, 1500, 4000, 100000 };
	static const uint64_t quotas[] = { 1, 10, 50, 100, 300, 1000 };
	static const uint64_t periods[] = { 10, 100, 1000 };

	for (unsigned a = 0; a < N(rates); a++)
		for (unsigned b = 0; b < N(quotas); b++)
			for (unsigned c = 0; c < N(periods); c++) {
				int n = dirtylimit_sim(t, rates[a], quotas[b], periods[c], 0, 0, 30);

				if (n < 0 || n > 2)
					printf("#   R %lu q %lu period %lu: settled at %d\n",
					       (unsigned long)rates[a], (unsigned long)quotas[b],
					       (unsigned long)periods[c], n);
				T_CHECK(t, n >= 0 && n <= 2);
			}
}

static void t_dirtylimit_release_and_noise(struct t *t)
{
	int n;

	/* From the maximum sleep, a vCPU at 2x its quota: halving releases. */
	n = dirtylimit_sim(t, 200, 100, 100, 9900000, 0, 40);
	T_CHECK(t, n >= 0 && n <= 10);
	/* The guest calms down: quota above its rate, sleep goes to ~0. */
	T_CHECK(t, dirtylimit__next_sleep_us(0, 100, 50, 100) == 0);
	n = dirtylimit_sim(t, 50, 100, 100, 3000000, 0, 40);
	T_CHECK(t, n >= 0 && n <= 10);
	/* +-8% measurement noise: still settles and stays. */
	n = dirtylimit_sim(t, 1000, 100, 100, 0, 8, 40);
	T_CHECK(t, n >= 0 && n <= 5);
	n = dirtylimit_sim(t, 400, 37, 10, 0, 8, 40);
	T_CHECK(t, n >= 0 && n <= 5);
}

/* ---- policy parameters and building blocks ---- */

static void t_params(struct t *t)
{
	struct policy_params p;

	policy__params_default(&p);
	T_CHECK_EQ(t, p.kind, POLICY_NONE);
	T_CHECK_EQ(t, p.throttle_trigger_threshold, 50);
	T_CHECK_EQ(t, p.cpu_throttle_initial, 20);
	T_CHECK_EQ(t, p.cpu_throttle_increment, 10);
	T_CHECK_EQ(t, p.cpu_throttle_tailslow, 0);
	T_CHECK_EQ(t, p.max_cpu_throttle, 99);
	T_CHECK_EQ(t, p.downtime_limit_ms, 300);
	T_CHECK_EQ(t, policy__params_check(&p), 0);
	p.throttle_trigger_threshold = 0;
	T_CHECK_EQ(t, policy__params_check(&p), -EINVAL);
	p.throttle_trigger_threshold = 100;
	T_CHECK_EQ(t, policy__params_check(&p), 0);
	p.max_cpu_throttle = 100;
	T_CHECK_EQ(t, policy__params_check(&p), -EINVAL);
	p.max_cpu_throttle = 99;
	p.cpu_throttle_initial = 0;
	T_CHECK_EQ(t, policy__params_check(&p), -EINVAL);
	p.cpu_throttle_initial = 20;
	p.cpu_throttle_increment = 100;
	T_CHECK_EQ(t, policy__params_check(&p), -EINVAL);
	p.cpu_throttle_increment = 10;
	p.downtime_limit_ms = 2000001;
	T_CHECK_EQ(t, policy__params_check(&p), -EINVAL);
	p.downtime_limit_ms = 300;
	p.kind = (enum policy_kind)7;
	T_CHECK_EQ(t, policy__params_check(&p), -EINVAL);
}

static void t_switchover_table(struct t *t)
{
	static const struct {
		uint64_t remaining, bw, limit;
		int want;
		uint64_t expected;
	} rows[] = {
		{ 0, 0, 0, 1, 0 },                         /* nothing left */
		{ 0, 125000000, 300, 1, 0 },
		{ 1, 0, 300, 0, UINT64_MAX },               /* no bandwidth */
		{ 37500000, 125000000, 300, 1, 300 },       /* exactly the limit */
		{ 37500001, 125000000, 300, 0, 301 },       /* rounded up */
		{ 1, 125000000, 0, 0, 1 },                  /* limit 0: only when empty */
		{ 537000000, 125000000, 300, 0, 4296 },
		{ UINT64_MAX, UINT64_MAX, 1000, 1, 1000 },  /* no overflow */
		{ UINT64_MAX, 1, 2000000, 0, UINT64_MAX },  /* saturates */
		{ 4096, UINT64_MAX, 0, 0, 1 },
	};

	for (unsigned i = 0; i < N(rows); i++) {
		struct policy_input in = {
			.remaining_bytes = rows[i].remaining, .bandwidth_bps = rows[i].bw,
		};
		uint64_t e = 42;

		T_CHECK_EQ(t, policy__should_switchover(&in, rows[i].limit, &e), rows[i].want);
		T_CHECK(t, e == rows[i].expected);
		T_CHECK(t, policy__expected_downtime_ms(rows[i].remaining, rows[i].bw) ==
			   rows[i].expected);
	}
	{
		struct policy_input in = { .remaining_bytes = 10, .bandwidth_bps = 100000 };

		T_CHECK(t, policy__should_switchover(&in, 300, NULL));
	}
}

static void t_final_round_table(struct t *t)
{
	static const struct {
		uint64_t remaining, bw, limit;
		int want;
	} rows[] = {
		{ 0, 125000000, 300, 0 },                  /* nothing left */
		{ 37500000, 125000000, 300, 1 },           /* 300 ms of 300 */
		{ 9375000, 125000000, 300, 0 },            /* 75 ms: a quarter, not more */
		{ 9375001, 125000000, 300, 1 },            /* 76 ms (rounded up) */
		{ 2500000, 125000000, 300, 0 },            /* 20 ms: too small to bother */
		{ 2500001, 125000000, 40, 1 },             /* 21 ms of 40 */
		{ 4096, 0, 300, 0 },                        /* no bandwidth: unknown */
		{ UINT64_MAX, 1, 2000000, 0 },              /* saturated: unknown */
		{ 125000000, 125000000, 2000, 1 },          /* 1000 ms of 2000 */
		{ 3125000, 125000000, 100, 0 },             /* 25 ms of 100: a quarter */
	};

	for (unsigned i = 0; i < N(rows); i++) {
		struct policy_input in = {
			.remaining_bytes = rows[i].remaining, .bandwidth_bps = rows[i].bw,
		};
		T_CHECK_EQ(t, policy__final_round(&in, rows[i].limit), rows[i].want);
	}
}

static void t_postcopy_now_table(struct t *t)
{
	/* bandwidth 125 MB/s, limit 300 ms: the target is 37.5 MB */
	static const struct {
		uint64_t remaining, bw, rate, limit;
		int want;
	} rows[] = {
		{ 37500000, 125000000, 500000000, 300, 0 },   /* switchover test passes */
		{ 512000000, 125000000, 500000000, 300, 1 },  /* r = 4: never */
		{ 512000000, 125000000, 125000000, 300, 1 },  /* r = 1: never */
		{ 512000000, 125000000, 62500000, 300, 1 },   /* r = 1/2: 64 MB after 3 */
		{ 300000000, 125000000, 62500000, 300, 0 },   /* r = 1/2: 37.5 MB after 3 */
		{ 300000001, 125000000, 62500000, 300, 1 },   /* just over */
		{ 512000000, 125000000, 12500000, 300, 0 },   /* r = 1/10: 51.2 MB, 5.1 MB */
		{ 512000000, 125000000, 0, 300, 0 },          /* rate unknown */
		{ 512000000, 0, 500000000, 300, 0 },          /* bandwidth unknown */
		{ UINT64_MAX, 1, UINT64_MAX, 2000000, 1 },    /* no overflow */
		{ 100000000, 125000000, 500000000, 0, 1 },    /* limit 0: only nothing left */
	};

	for (unsigned i = 0; i < N(rows); i++) {
		struct policy_input in = {
			.remaining_bytes = rows[i].remaining, .bandwidth_bps = rows[i].bw,
			.dirty_rate_bps = rows[i].rate,
		};
		T_CHECK_EQ(t, policy__postcopy_now(&in, rows[i].limit), rows[i].want);
	}
}

/* During the bulk pass: the rewritten pages stand in for what is left;
 * nothing before POLICY_EARLY_MIN_MS, nothing for a set the downtime
 * limit covers, and a yes for a set stays a yes for any larger one. */
static void t_postcopy_early_table(struct t *t)
{
	static const struct {
		uint64_t rewritten, bw, rate, elapsed;
		int want;
	} rows[] = {
		{ 60000000, 125000000, 500000000, 499, 0 },   /* too early */
		{ 60000000, 125000000, 500000000, 500, 1 },   /* r = 4 */
		{ 37500000, 125000000, 500000000, 2000, 0 },  /* within the limit */
		{ 37500001, 125000000, 125000000, 2000, 1 },  /* r = 1: never less */
		{ 0, 125000000, 500000000, 2000, 0 },         /* nothing rewritten */
		{ 200000000, 125000000, 12500000, 2000, 0 },  /* r = 1/10: converges */
		{ 60000000, 0, 500000000, 2000, 0 },          /* bandwidth unknown */
		{ 60000000, 125000000, 0, 2000, 0 },          /* rate unknown */
	};
	for (unsigned i = 0; i < N(rows); i++) {
		struct policy_input in = {
			.remaining_bytes = rows[i].rewritten, .bandwidth_bps = rows[i].bw,
			.dirty_rate_bps = rows[i].rate,
		};
		T_CHECK_EQ(t, policy__postcopy_early(&in, rows[i].elapsed, 300), rows[i].want);
	}
	/* monotone in the rewritten set, whatever the rates */
	static const uint64_t rates[] = { 1000000, 31250000, 62500000, 110000000, 125000000, 900000000 };
	for (unsigned i = 0; i < N(rates); i++) {
		bool was = false;
		for (uint64_t r = 0; r <= 2000000000ull; r += 10000000) {
			struct policy_input in = { .remaining_bytes = r, .bandwidth_bps = 125000000,
						   .dirty_rate_bps = rates[i] };
			bool now = policy__postcopy_early(&in, 1000, 300);
			T_CHECK(t, now || !was);
			T_CHECK_EQ(t, now, r && policy__postcopy_now(&in, 300));
			was = now;
		}
	}
}

static void t_needed_pct_table(struct t *t)
{
	static const struct { uint64_t rate, bw; unsigned thr, want; } rows[] = {
		{ 0, 125000000, 50, 0 },             /* no dirtying */
		{ 0, 0, 50, 0 },
		{ 1, 0, 50, 100 },                   /* no bandwidth: impossible */
		{ 400000000, 125000000, 50, 85 },    /* 400 * 0.15 = 60 <= 62.5 */
		{ 62500000, 125000000, 50, 0 },      /* exactly at the threshold */
		{ 62500001, 125000000, 50, 1 },
		{ 50, 100, 50, 0 },
		{ 51, 100, 50, 2 },                  /* 51 * 0.98 <= 50 < 51 * 0.99 */
		{ 1000, 100, 100, 90 },
		{ 1000, 100, 1, 100 },               /* needs 99.9%: nothing below 100 */
		{ 1000, 1000, 1, 99 },               /* exactly 1% */
		{ UINT64_MAX, UINT64_MAX, 100, 0 },
		{ UINT64_MAX, UINT64_MAX, 50, 50 },
		{ UINT64_MAX, 1, 50, 100 },
		{ 1, UINT64_MAX, 1, 0 },
	};

	for (unsigned i = 0; i < N(rows); i++) {
		unsigned got = policy__needed_pct(rows[i].rate, rows[i].bw, rows[i].thr);

		if (got != rows[i].want)
			printf("#   row %u: %u, want %u\n", i, got, rows[i].want);
		T_CHECK_EQ(t, got, rows[i].want);
	}
	/* Exhaustive check of minimality against the definition. */
	for (uint64_t rate = 1; rate < 3000; rate += 37)
		for (unsigned thr = 1; thr <= 100; thr += 9) {
			unsigned p = policy__needed_pct(rate, 1000, thr);

			T_CHECK(t, p == 100 || rate * (100 - p) <= 1000 * thr);
			T_CHECK(t, p == 0 || rate * (100 - (p - 1)) > 1000 * thr);
		}
}

static void t_period_high_table(struct t *t)
{
	static const struct { uint64_t sent, dirty; unsigned thr; int want; } rows[] = {
		{ 1000, 500, 50, 0 },
		{ 1000, 501, 50, 1 },
		{ 1000, 0, 50, 0 },
		{ 0, 0, 50, 0 },
		{ 0, 1, 50, 1 },                /* nothing sent, something dirtied */
		{ 999, 499, 50, 0 },            /* threshold 499 (integer, as QEMU) */
		{ 1000, 1000, 100, 0 },
		{ UINT64_MAX, UINT64_MAX, 100, 0 },
		{ UINT64_MAX, UINT64_MAX, 99, 1 },
	};

	for (unsigned i = 0; i < N(rows); i++) {
		struct policy_input in = {
			.bytes_sent_period = rows[i].sent, .dirty_bytes_period = rows[i].dirty,
		};

		T_CHECK_EQ(t, policy__period_high(&in, rows[i].thr), rows[i].want);
	}
}

/* ---- step (QEMU auto-converge) ---- */

static struct policy_input high_in(unsigned pct)
{
	return (struct policy_input){
		.bytes_sent_period = 1000, .dirty_bytes_period = 900,
		.remaining_bytes = 1 << 30, .bandwidth_bps = 1000, .throttle_pct = pct,
	};
}

static struct policy_input low_in(unsigned pct)
{
	struct policy_input in = high_in(pct);

	in.dirty_bytes_period = 100;
	return in;
}

static void t_step_two_high_periods(struct t *t)
{
	struct policy_params p;
	struct policy_state s;
	struct policy_input hi = high_in(0), lo = low_in(0);

	policy__params_default(&p);
	policy__state_init(&s);
	T_CHECK_EQ(t, policy__step(&s, &p, &lo), 0);
	T_CHECK_EQ(t, policy__step(&s, &p, &hi), 0);     /* first high */
	T_CHECK_EQ(t, policy__step(&s, &p, &hi), 20);    /* second: initial */
	hi.throttle_pct = 20;
	T_CHECK_EQ(t, policy__step(&s, &p, &hi), 20);    /* counter restarted */
	T_CHECK_EQ(t, policy__step(&s, &p, &hi), 30);
	/* QEMU does not reset the count on a low period: high, low, high fires. */
	hi.throttle_pct = lo.throttle_pct = 30;
	T_CHECK_EQ(t, policy__step(&s, &p, &hi), 30);
	T_CHECK_EQ(t, policy__step(&s, &p, &lo), 30);
	T_CHECK_EQ(t, policy__step(&s, &p, &lo), 30);
	T_CHECK_EQ(t, policy__step(&s, &p, &hi), 40);
}

static void t_step_march_and_cap(struct t *t)
{
	static const unsigned want[] = { 20, 30, 40, 50, 60, 70, 80, 90, 99, 99 };
	struct policy_params p;
	struct policy_state s;
	unsigned pct = 0;

	policy__params_default(&p);
	policy__state_init(&s);
	for (unsigned i = 0; i < N(want); i++) {
		struct policy_input in = high_in(pct);

		T_CHECK_EQ(t, policy__step(&s, &p, &in), pct);
		pct = policy__step(&s, &p, &in);
		T_CHECK_EQ(t, pct, want[i]);
	}
	/* max-cpu-throttle 45 caps both the increment and the initial value. */
	p.max_cpu_throttle = 45;
	{
		struct policy_input in = high_in(40);

		policy__state_init(&s);
		(void)policy__step(&s, &p, &in);
		T_CHECK_EQ(t, policy__step(&s, &p, &in), 45);
		p.cpu_throttle_initial = 60;
		in.throttle_pct = 0;
		(void)policy__step(&s, &p, &in);
		T_CHECK_EQ(t, policy__step(&s, &p, &in), 45);
	}
}

static void t_step_tailslow(struct t *t)
{
	/* cur 50, sent 1000, threshold 50 -> 500 allowed dirty bytes. */
	static const struct { uint64_t dirty; unsigned cur, want; } rows[] = {
		{ 600, 50, 59 },    /* cpu 50 -> ideal 41: +9 */
		{ 1000, 50, 60 },   /* ideal 25: +25 capped at the increment */
		{ 501, 50, 51 },    /* ideal 49: +1 */
		{ 550, 90, 91 },    /* cpu 10 -> ideal 9: +1 */
		{ 5000, 95, 99 },   /* cpu 5 -> ideal 0: +5 capped at max 99 */
		{ 900, 0, 20 },     /* first time: initial, tailslow or not */
	};
	struct policy_params p;

	policy__params_default(&p);
	p.cpu_throttle_tailslow = true;
	for (unsigned i = 0; i < N(rows); i++) {
		struct policy_state s;
		struct policy_input in = high_in(rows[i].cur);

		policy__state_init(&s);
		in.dirty_bytes_period = rows[i].dirty;
		(void)policy__step(&s, &p, &in);
		T_CHECK_EQ(t, policy__step(&s, &p, &in), rows[i].want);
	}
}

/* ---- computed ---- */

static void t_computed_first_trigger(struct t *t)
{
	static const struct {
		uint64_t rate, bw, sent, dirty;
		unsigned max, want;
	} rows[] = {
		/* 400 MB/s over 125 MB/s: 85 at once (QEMU would march 20..90). */
		{ 400000000, 125000000, 1000, 900, 99, 85 },
		/* The byte counts need more than the rate: they win (100 - 10). */
		{ 100000000, 125000000, 1000, 5000, 99, 90 },
		/* Rate unknown: the byte counts alone, 100 - 50*1000/1000. */
		{ 0, 125000000, 1000, 1000, 99, 50 },
		/* Bandwidth unknown: the byte counts alone. */
		{ 400000000, 0, 1000, 1000, 99, 50 },
		/* Hopeless: clamped at max. */
		{ UINT64_MAX, 1, 1000, 900, 99, 99 },
		{ UINT64_MAX, 1, 1000, 900, 70, 70 },
		/* Barely over: at least 1. */
		{ 1, UINT64_MAX, 1000000, 500001, 99, 1 },
		/* Huge numbers everywhere. */
		{ UINT64_MAX, UINT64_MAX, UINT64_MAX, UINT64_MAX, 99, 50 },
	};
	struct policy_params p;

	policy__params_default(&p);
	p.kind = POLICY_COMPUTED;
	for (unsigned i = 0; i < N(rows); i++) {
		struct policy_state s;
		struct policy_input in = {
			.bytes_sent_period = rows[i].sent, .dirty_bytes_period = rows[i].dirty,
			.remaining_bytes = 1 << 30, .bandwidth_bps = rows[i].bw,
			.dirty_rate_bps = rows[i].rate,
		};
		unsigned got;

		policy__state_init(&s);
		p.max_cpu_throttle = rows[i].max;
		T_CHECK_EQ(t, policy__computed(&s, &p, &in), 0);
		got = policy__computed(&s, &p, &in);
		if (got != rows[i].want)
			printf("#   row %u: %u, want %u\n", i, got, rows[i].want);
		T_CHECK_EQ(t, got, rows[i].want);
		T_CHECK(t, s.computed_active);
	}
	/* Not high: never triggers, however high the rate. */
	{
		struct policy_state s;
		struct policy_input in = low_in(0);

		policy__state_init(&s);
		in.dirty_rate_bps = UINT64_MAX;
		for (int i = 0; i < 5; i++)
			T_CHECK_EQ(t, policy__computed(&s, &p, &in), 0);
	}
}

/* Active at 85% with 125 MB/s.  The period's dirty bytes are kept low so
 * that the rate estimate drives the decisions, except where noted. */
static void t_computed_corrections(struct t *t)
{
	struct policy_params p;
	struct policy_state s;
	struct policy_input in = {
		.bytes_sent_period = 1000, .dirty_bytes_period = 100,
		.bandwidth_bps = 125000000, .throttle_pct = 85,
		.dirty_rate_bps = 60000000, .remaining_bytes = 900,
	};
	unsigned pct;

	policy__params_default(&p);
	p.kind = POLICY_COMPUTED;
	policy__state_init(&s);
	s.computed_active = true;
	s.have_prev = true;
	s.prev_remaining = 1000;

	T_CHECK_EQ(t, policy__computed(&s, &p, &in), 85);   /* U = 400: need 85, keep */
	in.dirty_rate_bps = 90000000;                       /* U = 600: need 90 */
	in.remaining_bytes = 800;
	pct = policy__computed(&s, &p, &in);
	T_CHECK_EQ(t, pct, 90);                             /* raised at once */
	in.throttle_pct = pct;
	in.dirty_rate_bps = 60000000;                       /* U = 600 at 90: keep */
	in.remaining_bytes = 700;
	T_CHECK_EQ(t, policy__computed(&s, &p, &in), 90);
	in.dirty_rate_bps = 20000000;                       /* U = 200: need 69 */
	in.remaining_bytes = 700;                           /* not shrinking: keep */
	T_CHECK_EQ(t, policy__computed(&s, &p, &in), 90);
	in.remaining_bytes = 600;                           /* shrinking */
	pct = policy__computed(&s, &p, &in);
	T_CHECK_EQ(t, pct, 80);                             /* -min(10, 21/2) */
	in.throttle_pct = pct;
	in.dirty_rate_bps = 10000000;                       /* U = 50: need 0 */
	in.remaining_bytes = 500;
	pct = policy__computed(&s, &p, &in);
	T_CHECK_EQ(t, pct, 70);                             /* at most -10 */
	in.throttle_pct = pct;
	in.dirty_rate_bps = 18000000;                       /* U = 60: need 0, */
	in.dirty_bytes_period = 450;                        /* but the bytes need */
	in.remaining_bytes = 400;                           /* 100 - 1500000/45000 = 67 */
	T_CHECK_EQ(t, policy__computed(&s, &p, &in), 70);   /* 67 + 10 > 70: keep */
	in.dirty_bytes_period = 300;                        /* need 50: lower by 10 */
	in.remaining_bytes = 300;
	T_CHECK_EQ(t, policy__computed(&s, &p, &in), 60);
	in.throttle_pct = 60;
	in.dirty_bytes_period = 600;                        /* high: need 100 - 33 */
	in.remaining_bytes = 200;
	T_CHECK_EQ(t, policy__computed(&s, &p, &in), 67);
}

static void t_computed_stall(struct t *t)
{
	struct policy_params p;
	struct policy_state s;
	struct policy_input in = {
		.bytes_sent_period = 1000, .dirty_bytes_period = 400,
		.bandwidth_bps = 125000000, .throttle_pct = 60,
		.dirty_rate_bps = 10000000, .remaining_bytes = 5000,
	};

	policy__params_default(&p);
	p.kind = POLICY_COMPUTED;
	policy__state_init(&s);
	s.computed_active = true;
	/* The model is content (need < 60) but the dirty set does not shrink. */
	T_CHECK_EQ(t, policy__computed(&s, &p, &in), 60);   /* first sample */
	T_CHECK_EQ(t, policy__computed(&s, &p, &in), 60);   /* stall 1 */
	T_CHECK_EQ(t, policy__computed(&s, &p, &in), 70);   /* stall 2: +40/4 */
	in.throttle_pct = 70;
	T_CHECK_EQ(t, policy__computed(&s, &p, &in), 70);
	T_CHECK_EQ(t, policy__computed(&s, &p, &in), 77);   /* +30/4 */
	in.throttle_pct = 98;
	T_CHECK_EQ(t, policy__computed(&s, &p, &in), 98);
	T_CHECK_EQ(t, policy__computed(&s, &p, &in), 99);   /* +max(1, 2/4) */
	in.throttle_pct = 99;
	T_CHECK_EQ(t, policy__computed(&s, &p, &in), 99);
	T_CHECK_EQ(t, policy__computed(&s, &p, &in), 99);   /* capped */
	/* Remaining 0 is progress, not a stall. */
	in.remaining_bytes = 0;
	T_CHECK_EQ(t, policy__computed(&s, &p, &in), 99);
	T_CHECK_EQ(t, s.stall_count, 0);
}

static void t_decide(struct t *t)
{
	struct policy_params p;
	struct policy_state s;
	struct policy_decision d;
	struct policy_input in = high_in(0);

	policy__params_default(&p);
	policy__state_init(&s);
	in.bandwidth_bps = 125000000;
	in.remaining_bytes = 37500000;
	policy__decide(&s, &p, &in, &d);
	T_CHECK_EQ(t, d.action, POLICY_SWITCHOVER);
	T_CHECK_EQ(t, d.expected_downtime_ms, 300);
	T_CHECK_EQ(t, d.throttle_pct, 0);

	in.remaining_bytes = 1 << 30;
	for (int i = 0; i < 4; i++) {
		policy__decide(&s, &p, &in, &d);
		T_CHECK_EQ(t, d.action, POLICY_CONTINUE);       /* none never throttles */
		T_CHECK_EQ(t, d.throttle_pct, 0);
	}
	p.kind = POLICY_STEP;
	policy__state_init(&s);
	policy__decide(&s, &p, &in, &d);
	T_CHECK_EQ(t, d.action, POLICY_CONTINUE);
	policy__decide(&s, &p, &in, &d);
	T_CHECK_EQ(t, d.action, POLICY_SET_THROTTLE);
	T_CHECK_EQ(t, d.throttle_pct, 20);
	T_CHECK_EQ(t, d.expected_downtime_ms, 8590);
	/* A zeroed input is not an error: nothing remains, switch over. */
	{
		struct policy_input zero = {0};

		policy__decide(&s, &p, &zero, &d);
		T_CHECK_EQ(t, d.action, POLICY_SWITCHOVER);
		T_CHECK_EQ(t, d.expected_downtime_ms, 0);
	}
	/* All maxed out: no overflow, a valid throttle. */
	{
		struct policy_input big = {
			UINT64_MAX, UINT64_MAX, UINT64_MAX, UINT64_MAX, 1, UINT64_MAX, 99,
		};

		p.kind = POLICY_COMPUTED;
		policy__state_init(&s);
		for (int i = 0; i < 3; i++) {
			policy__decide(&s, &p, &big, &d);
			T_CHECK(t, d.throttle_pct <= 99);
			T_CHECK_EQ(t, d.action, POLICY_CONTINUE);
		}
	}
}

/* ---- round-by-round migration model ----
 * The guest dirties dirty_bps bytes/s at full speed, spread over a working
 * set of wss bytes (so at most wss distinct dirty bytes per round).  A round
 * sends what was dirty at its start at link_bps, so it lasts remaining /
 * link seconds, during which the guest, running (100 - p)% of the time,
 * dirties min(wss, dirty_bps * (100 - p) / 100 * t) bytes.  Round 1 is the
 * bulk pass over ram bytes.  The dirty-rate estimator reports rate_bias_pct
 * of the true (throttled) rate.  The policy is called once per round. */
struct sim_model {
	uint64_t dirty_bps, wss, link_bps, ram, limit_ms;
	unsigned rate_bias_pct;
};

struct sim_result {
	int rounds;            /* rounds until switchover, -1 if none */
	unsigned final_pct, max_pct, changes;
	uint64_t lost_ms;      /* guest run time taken by the throttle */
};

static struct sim_result sim_run(const struct sim_model *m, enum policy_kind kind,
				 int max_rounds)
{
	struct sim_result res = { .rounds = -1 };
	struct policy_params p;
	struct policy_state s;
	uint64_t remaining = m->ram;
	unsigned pct = 0;

	policy__params_default(&p);
	p.kind = kind;
	p.downtime_limit_ms = m->limit_ms;
	policy__state_init(&s);
	for (int r = 1; r <= max_rounds; r++) {
		uint64_t t_ms = remaining * 1000 / m->link_bps;
		uint64_t eff = m->dirty_bps * (100 - pct) / 100;
		uint64_t dirtied = eff / 1000 * (t_ms ? t_ms : 1);
		struct policy_input in;
		struct policy_decision d;

		if (dirtied > m->wss)
			dirtied = m->wss;
		in = (struct policy_input){
			.bytes_sent_period = remaining, .period_ms = t_ms,
			.dirty_bytes_period = dirtied, .remaining_bytes = dirtied,
			.bandwidth_bps = m->link_bps, .throttle_pct = pct,
			.dirty_rate_bps = (eff < m->wss ? eff : m->wss) / 100 * m->rate_bias_pct,
		};
		res.lost_ms += t_ms * pct / 100;
		policy__decide(&s, &p, &in, &d);
		if (d.action == POLICY_SWITCHOVER) {
			res.rounds = r;
			break;
		}
		if (d.action == POLICY_SET_THROTTLE) {
			pct = d.throttle_pct;
			res.changes++;
			if (pct > res.max_pct)
				res.max_pct = pct;
		}
		remaining = dirtied;
	}
	res.final_pct = pct;
	return res;
}

static void print_sim(const char *what, const struct sim_result *r)
{
	printf("#   %-9s rounds %3d  throttle final %2u max %2u changes %u  lost %lu ms\n",
	       what, r->rounds, r->final_pct, r->max_pct, r->changes,
	       (unsigned long)r->lost_ms);
}

#define MB 1000000ull

static void t_sim_policies(struct t *t)
{
	static const struct sim_model models[] = {
		/* 2 GiB guest, 512 MiB stress at 400 MB/s, 1 Gbit/s, 300 ms. */
		{ 400 * MB, 512ull << 20, 125 * MB, 2048ull << 20, 300, 100 },
		/* Faster stress, smaller link. */
		{ 1000 * MB, 1024ull << 20, 100 * MB, 4096ull << 20, 300, 100 },
		/* Just over the link. */
		{ 150 * MB, 256ull << 20, 125 * MB, 1024ull << 20, 300, 100 },
		/* The estimator sees only half the rate: corrections must fix it. */
		{ 400 * MB, 512ull << 20, 125 * MB, 2048ull << 20, 300, 50 },
		/* No rate at all (bitmap without a rate yet). */
		{ 400 * MB, 512ull << 20, 125 * MB, 2048ull << 20, 300, 0 },
		/* Tight downtime. */
		{ 600 * MB, 512ull << 20, 125 * MB, 2048ull << 20, 30, 100 },
	};

	for (unsigned i = 0; i < N(models); i++) {
		struct sim_result none = sim_run(&models[i], POLICY_NONE, 300);
		struct sim_result step = sim_run(&models[i], POLICY_STEP, 300);
		struct sim_result comp = sim_run(&models[i], POLICY_COMPUTED, 300);

		printf("#   model %u\n", i);
		print_sim("none", &none);
		print_sim("step", &step);
		print_sim("computed", &comp);
		T_CHECK_EQ(t, none.rounds, -1);          /* D > B: never converges */
		T_CHECK(t, step.rounds > 0);
		T_CHECK(t, comp.rounds > 0);
		T_CHECK(t, comp.rounds < step.rounds);
		T_CHECK(t, comp.changes <= 4);           /* no march by tens */
		T_CHECK(t, comp.lost_ms < step.lost_ms);  /* less guest time taken */
	}
}

static void t_sim_light_guest(struct t *t)
{
	/* Dirtying well under the link: everyone converges without a throttle. */
	static const struct sim_model m = {
		20 * MB, 512ull << 20, 125 * MB, 2048ull << 20, 300, 100,
	};
	enum policy_kind kinds[] = { POLICY_NONE, POLICY_STEP, POLICY_COMPUTED };

	for (unsigned i = 0; i < N(kinds); i++) {
		struct sim_result r = sim_run(&m, kinds[i], 300);

		T_CHECK(t, r.rounds > 0 && r.rounds <= 4);
		T_CHECK_EQ(t, r.max_pct, 0);
	}
}

int main(void)
{
	struct t t = {0};

	T_RUN(&t, t_throttle_sleep_table);
	T_RUN(&t, t_throttle_bounded_stall);
	T_RUN(&t, t_throttle_run_sleep);
	T_RUN(&t, t_dirtylimit_special);
	T_RUN(&t, t_dirtylimit_convergence);
	T_RUN(&t, t_dirtylimit_release_and_noise);
	T_RUN(&t, t_params);
	T_RUN(&t, t_switchover_table);
	T_RUN(&t, t_final_round_table);
	T_RUN(&t, t_postcopy_now_table);
	T_RUN(&t, t_postcopy_early_table);
	T_RUN(&t, t_needed_pct_table);
	T_RUN(&t, t_period_high_table);
	T_RUN(&t, t_step_two_high_periods);
	T_RUN(&t, t_step_march_and_cap);
	T_RUN(&t, t_step_tailslow);
	T_RUN(&t, t_computed_first_trigger);
	T_RUN(&t, t_computed_corrections);
	T_RUN(&t, t_computed_stall);
	T_RUN(&t, t_decide);
	T_RUN(&t, t_sim_policies);
	T_RUN(&t, t_sim_light_guest);
	return T_DONE(&t);
}
