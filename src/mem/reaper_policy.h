/* How long the dirty-ring reaper sleeps between harvests.  Pure: no clocks,
 * no I/O; the reaper thread owns one struct reaper_policy and calls
 * reaper_policy__next_interval_ms() after each harvest.
 *
 * Modes:
 *   REAPER_FIXED     always 1000 ms (what QEMU's reaper does).
 *   REAPER_ADAPTIVE  an interval from the level table below, chosen from the
 *                    ring occupancy of the last harvest (harvested entries /
 *                    total entries of all vCPU rings) and from ring-full exits.
 *
 * Level table (halving per level; 16 ms can drain a 4096-entry ring at
 * ~256k pages/s, well above what a vCPU can dirty under tracking):
 *   level     0     1    2    3    4   5   6
 *   interval  1000  500  250  125  64  32  16 ms
 *
 * Occupancy -> level change (reaper_policy__occupancy_step), occupancy o
 * measured at the current interval:
 *   o <  1/16          -1  (only after REAPER_SLOWDOWN_CALLS such calls in a row)
 *   1/16 <= o < 1/4     0  (hold band)
 *   1/4  <= o < 1/2    +1
 *   1/2  <= o < 1      +2
 *   o >= 1             +3
 * Speeding up is immediate.  New ring-full exits since the last call mean
 * the harvest undercounts the real rate: at least +2 levels at once.  The
 * hold band spans a factor 4 while one level changes the interval by a
 * factor 2, so a step in either direction lands inside the band at a steady
 * dirty rate: no oscillation.  See docs/policies.md. */
#ifndef KMIG_MEM_REAPER_POLICY_H
#define KMIG_MEM_REAPER_POLICY_H

#include <stdint.h>

enum reaper_mode {
	REAPER_FIXED,
	REAPER_ADAPTIVE,
};

#define REAPER_FIXED_INTERVAL_MS  1000u
#define REAPER_LEVELS             7u   /* levels 0 .. REAPER_LEVELS - 1 */
#define REAPER_SLOWDOWN_CALLS     5u   /* K: low calls in a row before -1 */
#define REAPER_RING_FULL_STEP     2    /* minimum speed-up on ring-full exits */

struct reaper_policy {
	enum reaper_mode mode;
	unsigned level;          /* index into the level table */
	unsigned low_calls;      /* consecutive calls with occupancy < 1/16 */
	unsigned slowdown_calls; /* K; REAPER_SLOWDOWN_CALLS after init */
};

/* Starts at level 0 (1000 ms). */
void reaper_policy__init(struct reaper_policy *p, enum reaper_mode mode);

/* Interval of a level in ms; levels past the table give the last entry. */
unsigned reaper_policy__level_ms(unsigned level);

/* Level change for one harvest (table above): -1, 0, +1, +2 or +3.
 * ring_entries_total 0 (no rings) gives 0. */
int reaper_policy__occupancy_step(uint64_t harvested, uint64_t ring_entries_total);

/* Updates the state from the last harvest and returns how long to sleep
 * before the next one, in ms.  harvested: entries collected by this harvest;
 * ring_entries_total: the sum of all vCPU ring sizes (entries);
 * ring_full_exits_since_last: KVM_EXIT_DIRTY_RING_FULL exits seen since the
 * previous call. */
unsigned reaper_policy__next_interval_ms(struct reaper_policy *p, uint64_t harvested,
					 uint64_t ring_entries_total,
					 uint64_t ring_full_exits_since_last);

#endif
