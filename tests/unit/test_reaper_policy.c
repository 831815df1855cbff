/* Adaptive dirty-ring reaper interval: table and sequence tests. */
#include <stdint.h>

#include "harness.h"
#include "mem/reaper_policy.h"

static void t_level_table(struct t *t)
{
	static const unsigned want[] = { 1000, 500, 250, 125, 64, 32, 16 };

	T_CHECK_EQ(t, sizeof(want) / sizeof(want[0]), REAPER_LEVELS);
	for (unsigned i = 0; i < REAPER_LEVELS; i++)
		T_CHECK_EQ(t, reaper_policy__level_ms(i), want[i]);
	T_CHECK_EQ(t, reaper_policy__level_ms(REAPER_LEVELS), 16);
	T_CHECK_EQ(t, reaper_policy__level_ms(1000), 16);
}

static void t_occupancy_table(struct t *t)
{
	static const struct { uint64_t harvested, total; int step; } rows[] = {
		{ 0, 4096, -1 },
		{ 255, 4096, -1 },         /* just under 1/16 */
		{ 256, 4096, 0 },          /* 1/16 */
		{ 1023, 4096, 0 },
		{ 1024, 4096, 1 },         /* 1/4 */
		{ 2047, 4096, 1 },
		{ 2048, 4096, 2 },         /* 1/2 */
		{ 4095, 4096, 2 },
		{ 4096, 4096, 3 },         /* full */
		{ 100000, 4096, 3 },       /* harvest plus ring-full harvests */
		{ 5000, 0, 0 },            /* no rings: hold */
		{ 0, 0, 0 },
		{ UINT64_MAX, UINT64_MAX, 3 },
		{ UINT64_MAX / 2, UINT64_MAX, 1 },    /* just under 1/2 */
		{ UINT64_MAX / 2 + 1, UINT64_MAX, 2 },
		{ UINT64_MAX, 1, 3 },
		{ 1, UINT64_MAX, -1 },
		{ 8191, 131072, -1 },      /* 2 x 65536 rings */
		{ 8192, 131072, 0 },
	};

	for (unsigned i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		T_CHECK_EQ(t, reaper_policy__occupancy_step(rows[i].harvested, rows[i].total),
			   rows[i].step);
}

static void t_fixed_mode(struct t *t)
{
	struct reaper_policy p;

	reaper_policy__init(&p, REAPER_FIXED);
	T_CHECK_EQ(t, reaper_policy__next_interval_ms(&p, 4096, 4096, 10), 1000);
	T_CHECK_EQ(t, reaper_policy__next_interval_ms(&p, 0, 4096, 0), 1000);
	T_CHECK_EQ(t, reaper_policy__next_interval_ms(&p, UINT64_MAX, 1, UINT64_MAX), 1000);
	T_CHECK_EQ(t, p.level, 0);
}

/* Rows: harvested out of 4096 entries, ring-full exits, expected interval. */
struct step_row { uint64_t harvested, full; unsigned want_ms; };

static void run_rows(struct t *t, struct reaper_policy *p, const struct step_row *rows,
		     unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		unsigned got = reaper_policy__next_interval_ms(p, rows[i].harvested, 4096,
							       rows[i].full);
		if (got != rows[i].want_ms)
			printf("#   row %u: got %u ms, want %u ms\n", i, got, rows[i].want_ms);
		T_CHECK_EQ(t, got, rows[i].want_ms);
	}
}

static void t_ramp_up(struct t *t)
{
	static const struct step_row rows[] = {
		{ 500, 0, 1000 },   /* 12%: hold */
		{ 1200, 0, 500 },   /* 29%: +1 */
		{ 1200, 0, 250 },   /* +1 */
		{ 2100, 0, 64 },    /* 51%: +2 */
		{ 4096, 0, 16 },    /* full: +3, capped at the floor */
		{ 4096, 0, 16 },
		{ 600, 0, 16 },     /* hold */
	};
	struct reaper_policy p;

	reaper_policy__init(&p, REAPER_ADAPTIVE);
	run_rows(t, &p, rows, sizeof(rows) / sizeof(rows[0]));
}

static void t_ring_full_jump(struct t *t)
{
	static const struct step_row rows[] = {
		{ 10, 1, 250 },     /* low occupancy but a ring-full exit: +2 */
		{ 10, 0, 250 },     /* low, 1 of K */
		{ 1100, 3, 64 },    /* 27% (+1) with exits: +2 wins */
		{ 4096, 7, 16 },    /* full (+3) with exits: +3, capped */
		{ 0, 1, 16 },       /* at the floor: stays */
	};
	struct reaper_policy p;

	reaper_policy__init(&p, REAPER_ADAPTIVE);
	run_rows(t, &p, rows, sizeof(rows) / sizeof(rows[0]));
	T_CHECK_EQ(t, p.low_calls, 0);
}

static void t_slow_decay_hysteresis(struct t *t)
{
	struct reaper_policy p;
	unsigned ms = 0;

	reaper_policy__init(&p, REAPER_ADAPTIVE);
	p.level = REAPER_LEVELS - 1;
	/* K - 1 low calls: no change. */
	for (unsigned i = 0; i + 1 < REAPER_SLOWDOWN_CALLS; i++)
		T_CHECK_EQ(t, reaper_policy__next_interval_ms(&p, 0, 4096, 0), 16);
	/* A hold call breaks the run. */
	T_CHECK_EQ(t, reaper_policy__next_interval_ms(&p, 300, 4096, 0), 16);
	for (unsigned i = 0; i + 1 < REAPER_SLOWDOWN_CALLS; i++)
		T_CHECK_EQ(t, reaper_policy__next_interval_ms(&p, 0, 4096, 0), 16);
	/* The K-th low call in a row: one level slower only. */
	T_CHECK_EQ(t, reaper_policy__next_interval_ms(&p, 0, 4096, 0), 32);
	/* Another K to the next level; all the way to 1000 and no further. */
	for (unsigned i = 0; i < REAPER_SLOWDOWN_CALLS * (REAPER_LEVELS + 2); i++)
		ms = reaper_policy__next_interval_ms(&p, 0, 4096, 0);
	T_CHECK_EQ(t, ms, 1000);
	T_CHECK_EQ(t, p.level, 0);
	/* Speed-up is immediate after all that. */
	T_CHECK_EQ(t, reaper_policy__next_interval_ms(&p, 2048, 4096, 0), 250);
}

/* Steady guest: rate pages/s spread over vcpus equal rings of ring_size;
 * what one harvest finds after interval ms, and whether a ring filled. */
static void model(uint64_t rate, unsigned vcpus, uint64_t ring_size, unsigned ms,
		  uint64_t *harvested, uint64_t *full)
{
	uint64_t per_vcpu = rate / vcpus * ms / 1000;

	*full = per_vcpu >= ring_size ? vcpus : 0;
	*harvested = (per_vcpu >= ring_size ? ring_size : per_vcpu) * vcpus;
}

static void t_steady_no_oscillation(struct t *t)
{
	static const struct { uint64_t rate; unsigned vcpus; uint64_t ring; } rows[] = {
		{ 0, 1, 4096 }, { 500, 1, 4096 }, { 5000, 1, 4096 }, { 20000, 2, 4096 },
		{ 50000, 1, 4096 }, { 50000, 2, 4096 }, { 90000, 2, 4096 },
		{ 200000, 2, 65536 }, { 45000, 2, 65536 }, { 1000, 2, 65536 },
	};

	for (unsigned i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		struct reaper_policy p;
		unsigned ms = 1000, changes = 0, full_late = 0, last = 0;
		uint64_t h, full;

		reaper_policy__init(&p, REAPER_ADAPTIVE);
		for (unsigned call = 0; call < 300; call++) {
			model(rows[i].rate, rows[i].vcpus, rows[i].ring, ms, &h, &full);
			ms = reaper_policy__next_interval_ms(&p, h, rows[i].ring * rows[i].vcpus,
							     full);
			if (call >= 20) {
				changes += ms != last;
				full_late += full != 0;
			}
			last = ms;
		}
		if (changes || full_late)
			printf("#   row %u: %u changes, %u ring-full after settling, at %u ms\n",
			       i, changes, full_late, ms);
		T_CHECK_EQ(t, changes, 0);
		T_CHECK_EQ(t, full_late, 0);
		/* Settled inside the hold band, or at an end of the table. */
		model(rows[i].rate, rows[i].vcpus, rows[i].ring, ms, &h, &full);
		T_CHECK(t, reaper_policy__occupancy_step(h, rows[i].ring * rows[i].vcpus) == 0 ||
			   (ms == 1000 && h * 4 < rows[i].ring * rows[i].vcpus));
	}
}

static void t_rate_changes(struct t *t)
{
	struct reaper_policy p;
	unsigned ms = 1000, calls_to_fast = 0;
	uint64_t h, full;

	reaper_policy__init(&p, REAPER_ADAPTIVE);
	/* Idle guest starts dirtying 50k pages/s on one 4096 ring. */
	while (calls_to_fast < 10) {
		model(50000, 1, 4096, ms, &h, &full);
		ms = reaper_policy__next_interval_ms(&p, h, 4096, full);
		calls_to_fast++;
		if (reaper_policy__occupancy_step(50000 * ms / 1000, 4096) <= 0)
			break;
	}
	T_CHECK(t, calls_to_fast <= 2);
	T_CHECK_EQ(t, ms, 16);
	/* The guest goes idle: back to 1000 ms after K calls per level. */
	for (unsigned i = 0; i < REAPER_SLOWDOWN_CALLS * REAPER_LEVELS; i++)
		ms = reaper_policy__next_interval_ms(&p, 0, 4096, 0);
	T_CHECK_EQ(t, ms, 1000);
}

int main(void)
{
	struct t t = {0};

	T_RUN(&t, t_level_table);
	T_RUN(&t, t_occupancy_table);
	T_RUN(&t, t_fixed_mode);
	T_RUN(&t, t_ramp_up);
	T_RUN(&t, t_ring_full_jump);
	T_RUN(&t, t_slow_decay_hysteresis);
	T_RUN(&t, t_steady_no_oscillation);
	T_RUN(&t, t_rate_changes);
	return T_DONE(&t);
}
