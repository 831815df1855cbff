#include "mem/reaper_policy.h"

static const unsigned level_ms[REAPER_LEVELS] = { 1000, 500, 250, 125, 64, 32, 16 };

void reaper_policy__init(struct reaper_policy *p, enum reaper_mode mode)
{
	*p = (struct reaper_policy){
		.mode = mode,
		.slowdown_calls = REAPER_SLOWDOWN_CALLS,
	};
}

unsigned reaper_policy__level_ms(unsigned level)
{
	return level_ms[level < REAPER_LEVELS ? level : REAPER_LEVELS - 1];
}

int reaper_policy__occupancy_step(uint64_t harvested, uint64_t ring_entries_total)
{
	/* Compare harvested * 16 against total * {1, 4, 8, 16} in 128 bits. */
	unsigned __int128 h = (unsigned __int128)harvested * 16;
	unsigned __int128 n = ring_entries_total;

	if (!ring_entries_total)
		return 0;
	if (h >= n * 16)
		return 3;
	if (h >= n * 8)
		return 2;
	if (h >= n * 4)
		return 1;
	if (h >= n)
		return 0;
	return -1;
}

static void level_up(struct reaper_policy *p, int step)
{
	unsigned top = REAPER_LEVELS - 1;

	p->level = p->level + (unsigned)step > top ? top : p->level + (unsigned)step;
	p->low_calls = 0;
}

unsigned reaper_policy__next_interval_ms(struct reaper_policy *p, uint64_t harvested,
					 uint64_t ring_entries_total,
					 uint64_t ring_full_exits_since_last)
{
	int step;

	if (p->mode != REAPER_ADAPTIVE)
		return REAPER_FIXED_INTERVAL_MS;

	step = reaper_policy__occupancy_step(harvested, ring_entries_total);
	if (ring_full_exits_since_last && step < REAPER_RING_FULL_STEP)
		step = REAPER_RING_FULL_STEP;

	if (step > 0) {
		level_up(p, step);
	} else if (step == 0) {
		p->low_calls = 0;
	} else if (++p->low_calls >= p->slowdown_calls) {
		if (p->level > 0)
			p->level--;
		p->low_calls = 0;
	}
	return reaper_policy__level_ms(p->level);
}
