#include "kvm/throttle.h"

#include <errno.h>

#include "base/timeutil.h"
#include "kvm/vm.h"
#include "kvm/throttle_math.h"

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
		time__sleep_ns(THROTTLE_TIMESLICE_NS);
		if (limit)
			dirtylimit__tick(&t->vm->dirtylimit, time__now_ms());
		vm__kick_all(t->vm);
		pthread_mutex_lock(&t->lock);
	}
	pthread_mutex_unlock(&t->lock);
	return NULL;
}

int throttle__start(struct throttle *t, struct vm *vm)
{
	t->vm = vm;
	t->stop = false;
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
