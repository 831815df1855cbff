/* Self-announcement after a migration (QEMU's announce-self): `rounds`
 * calls of fn, the first at once (the network must learn where the guest
 * is before anyone can reach it), the second `initial` ms later, each
 * next gap `step` ms longer than the one before it, no gap longer than
 * `max` ms (QEMU's defaults 50, 550, 5, 100: at 0, 50, 200, 450, 800 ms,
 * as QEMU sends them).
 * fn runs on a thread of the announcer's own, never with a caller's
 * lock held.  Starting again restarts the schedule. */
#ifndef KMIG_DEV_ANNOUNCE_H
#define KMIG_DEV_ANNOUNCE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/log.h"

struct announce_params {
	uint64_t initial_ms, max_ms, rounds, step_ms;
};
#define ANNOUNCE_DEFAULTS { 50, 550, 5, 100 }
#define ANNOUNCE_MAX_MS 100000u
#define ANNOUNCE_MAX_ROUNDS 1000u

/* 0 if every value is within range (initial, max, step 1..ANNOUNCE_MAX_MS,
 * initial <= max, rounds 1..ANNOUNCE_MAX_ROUNDS), else -EINVAL. */
int announce__check(const struct announce_params *p);
/* The gap before round k (0-based): 0 for the first. */
uint64_t announce__gap_ms(const struct announce_params *p, uint64_t k);

struct announcer {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	void (*fn)(void *ctx);
	void *ctx;
	struct announce_params p;    /* under lock */
	uint64_t generation;         /* under lock: bumped by each start */
	uint64_t rounds_done;        /* under lock: fn calls so far, all schedules */
	bool stop, started;
	pthread_t thread;
};

int announcer__init(struct announcer *a, void (*fn)(void *ctx), void *ctx) KMIG_MUST_CHECK;
/* Begins (or restarts) a schedule; -EINVAL for bad parameters. */
int announcer__start(struct announcer *a, const struct announce_params *p) KMIG_MUST_CHECK;
uint64_t announcer__rounds(struct announcer *a);
void announcer__destroy(struct announcer *a);

#endif
