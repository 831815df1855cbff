/* dirty-limit: holds each vCPU's dirty rate under a quota (MB/s, MB = 2^20)
 * by making it sleep, in proportion to how far it is over, measured from
 * its dirty ring (ring backend only).  The control law is
 * dirtylimit__next_sleep_us (kvm/throttle_math.h), applied in pages/s by
 * dirtylimit__next_sleep_pages; the sleep is spread over
 * the 10 ms run slices of the throttle timer (kvm/throttle.c) so the guest
 * sees short pauses rather than one long one.
 *
 * Used by QMP set/cancel/query-vcpu-dirty-limit and by the migration's
 * `dirty-limit` capability.  While any quota is set, dirty tracking is held
 * on.  Any thread may call; dl->lock guards the tables. */
#ifndef KMIG_KVM_DIRTYLIMIT_H
#define KMIG_KVM_DIRTYLIMIT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/log.h"

struct vm;

#define DIRTYLIMIT_MAX_VCPUS 64
#define DIRTYLIMIT_DEFAULT_PERIOD_MS 1000
#define DIRTYLIMIT_MIN_PERIOD_MS 1000 /* the ring rate estimator's period */

struct dirtylimit {
	struct vm *vm;
	pthread_mutex_t lock;
	unsigned limited;                          /* vCPUs with a quota */
	bool tracking;                             /* we hold dirty tracking on */
	uint64_t period_ms;
	uint64_t last_ms;                          /* last control step */
	bool skip_next;                            /* the next step only measures */
	uint64_t quota[DIRTYLIMIT_MAX_VCPUS];      /* MB/s; 0 = no limit */
	uint64_t sleep_us[DIRTYLIMIT_MAX_VCPUS];   /* per period */
};

void dirtylimit__init(struct dirtylimit *dl, struct vm *vm);
void dirtylimit__destroy(struct dirtylimit *dl);
/* Sets a quota for vCPU cpu, or every vCPU when cpu < 0.  -ENOTSUP on the
 * bitmap backend, -EINVAL for a vCPU out of range or a zero rate. */
int dirtylimit__set(struct dirtylimit *dl, int cpu, uint64_t mbps) KMIG_MUST_CHECK;
/* Removes the quota of vCPU cpu (every vCPU when cpu < 0). */
int dirtylimit__cancel(struct dirtylimit *dl, int cpu) KMIG_MUST_CHECK;
void dirtylimit__set_period(struct dirtylimit *dl, uint64_t period_ms);
/* Copies every vCPU's quota out / puts saved quotas back (0 = none), so a
 * migration can limit all vCPUs and leave the user's limits as they were. */
void dirtylimit__save(struct dirtylimit *dl, uint64_t quota[DIRTYLIMIT_MAX_VCPUS]);
int dirtylimit__restore(struct dirtylimit *dl, const uint64_t quota[DIRTYLIMIT_MAX_VCPUS]) KMIG_MUST_CHECK;
bool dirtylimit__active(struct dirtylimit *dl);
/* One control step when a period has passed (throttle timer thread). */
void dirtylimit__tick(struct dirtylimit *dl, uint64_t now_ms);
/* quota (0 = none) and current rate (MB/s) of a vCPU. */
void dirtylimit__get(struct dirtylimit *dl, unsigned cpu, uint64_t *quota, uint64_t *rate);
/* Average sleep per period over limited vCPUs (µs) and average time for a
 * vCPU to fill its ring at its current rate (µs), for query-migrate. */
void dirtylimit__stats(struct dirtylimit *dl, uint64_t *sleep_us, uint64_t *ring_full_us);

#endif
