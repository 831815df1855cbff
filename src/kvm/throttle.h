/* vCPU throttling (QEMU's cpu-throttle): at p percent every vCPU, after
 * running for a 10 ms slice, sleeps slice * p / (100 - p); above 66% the
 * slice shrinks so that no sleep exceeds 20 ms (kvm/throttle_math.h).  A
 * timer thread kicks the vCPUs out of KVM_RUN once per slice while p > 0 or a dirty
 * limit is set (it also runs the dirty-limit control step), and the vCPU
 * threads sleep in their run loop (kvm/vcpu.c).  Any thread may set p;
 * throttle__set also wakes the timer after a dirty-limit change. */
#ifndef KMIG_KVM_THROTTLE_H
#define KMIG_KVM_THROTTLE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/log.h"

struct vm;

struct throttle {
	struct vm *vm;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool running, stop;
	/* throttle thread only: the slice end each vCPU was last kicked for
	 * and when, so a vCPU that does not answer (paused) is kicked again
	 * once per timeslice, not in a busy loop */
	uint64_t kicked_due[64];
	uint64_t kicked_at[64];
};

int throttle__start(struct throttle *t, struct vm *vm) KMIG_MUST_CHECK;
void throttle__stop(struct throttle *t);
/* Sets the percentage (clamped to 0..99) and wakes the timer. */
void throttle__set(struct throttle *t, unsigned pct);

#endif
