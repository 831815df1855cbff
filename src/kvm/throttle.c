#include "kvm/throttle.h"

#include <errno.h>
#include <string.h>

#include "base/timeutil.h"
#include "kvm/throttle_math.h"

#define THROTTLE_KICK_EARLY_NS 20000ull /* a slice this close to its end counts as over */
#include "kvm/vcpu.h"
#include "kvm/vm.h"

/* When vCPU i wants its next kick: at the end of its slice, or one
 * timeslice after the last kick if it has not started a new slice since. */
static uint64_t throttle__kick_time(const struct throttle *t, unsigned i, uint64_t due)
{
	return due == t->kicked_due[i] ? t->kicked_at[i] + THROTTLE_TIMESLICE_NS : due;
}

/* Sleeps until the first vCPU's run slice is due (at most one timeslice,
 * so the dirty-limit step and a throttle change are seen), then kicks each
 * vCPU whose slice is over into its sleep (kvm/vcpu.c). */
static void throttle__tick(struct throttle *t)
{
	struct vm *vm = t->vm;
	unsigned n = vm->nr_vcpus < 64 ? vm->nr_vcpus : 64;
	uint64_t now = time__now_ns(), next = now + THROTTLE_TIMESLICE_NS;
	for (unsigned i = 0; i < n; i++) {
		uint64_t k = throttle__kick_time(t, i, atomic_load(&vm->vcpus[i].throttle_due_ns));
		if (k < next)
			next = k;
	}
	if (next > now)
		time__sleep_ns(next - now);
	now = time__now_ns();
	for (unsigned i = 0; i < n; i++) {
		uint64_t due = atomic_load(&vm->vcpus[i].throttle_due_ns);
		if (throttle__kick_time(t, i, due) > now + THROTTLE_KICK_EARLY_NS)
			continue;
		t->kicked_due[i] = due;
		t->kicked_at[i] = now;
		vm__kick(vm, i);
	}
}

static void *throttle__thread(void *arg)
{
	struct throttle *t = arg;
	pthread_setname_np(pthread_self(), "throttle");
	pthread_mutex_lock(&t->lock);
	while (!t->stop) {
		bool limit = dirtylimit__active(&t->vm->dirtylimit);
		if (!atomic_load(&t->vm->throttle_pct) && !limit) {
			pthread_cond_wait(&t->cond, &t->lock);
			continue;
		}
		pthread_mutex_unlock(&t->lock);
		throttle__tick(t);
		if (limit)
			dirtylimit__tick(&t->vm->dirtylimit, time__now_ms());
		pthread_mutex_lock(&t->lock);
	}
	pthread_mutex_unlock(&t->lock);
	return NULL;
}

int throttle__start(struct throttle *t, struct vm *vm)
{
	t->vm = vm;
	t->stop = false;
	memset(t->kicked_due, 0, sizeof(t->kicked_due));
	memset(t->kicked_at, 0, sizeof(t->kicked_at));
	pthread_mutex_init(&t->lock, NULL);
	pthread_cond_init(&t->cond, NULL);
	int rc = pthread_create(&t->thread, NULL, throttle__thread, t);
	if (rc)
		return -rc;
	t->running = true;
	return 0;
}

void throttle__stop(struct throttle *t)
{
	if (!t->running)
		return;
	pthread_mutex_lock(&t->lock);
	t->stop = true;
	pthread_cond_broadcast(&t->cond);
	pthread_mutex_unlock(&t->lock);
	pthread_join(t->thread, NULL);
	t->running = false;
}

void throttle__set(struct throttle *t, unsigned pct)
{
	if (pct > 99)
		pct = 99;
	pthread_mutex_lock(&t->lock);
	atomic_store(&t->vm->throttle_pct, pct);
	pthread_cond_broadcast(&t->cond);
	pthread_mutex_unlock(&t->lock);
}
