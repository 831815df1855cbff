#include "dev/announce.h"

#include <errno.h>
#include <string.h>

#include "base/timeutil.h"

int announce__check(const struct announce_params *p)
{
	bool ok = p->initial_ms >= 1 && p->initial_ms <= ANNOUNCE_MAX_MS &&
		  p->max_ms >= p->initial_ms && p->max_ms <= ANNOUNCE_MAX_MS &&
		  p->step_ms >= 1 && p->step_ms <= ANNOUNCE_MAX_MS &&
		  p->rounds >= 1 && p->rounds <= ANNOUNCE_MAX_ROUNDS;
	return ok ? 0 : -EINVAL;
}

uint64_t announce__gap_ms(const struct announce_params *p, uint64_t k)
{
	if (!k)
		return 0;
	uint64_t gap = p->initial_ms + (k - 1) * p->step_ms;
	return gap < p->max_ms ? gap : p->max_ms;
}

/* Waits until the deadline, a stop, or a new schedule; lock held.
 * Whether the deadline came with nothing else. */
static bool announcer__sleep(struct announcer *a, uint64_t ms, uint64_t gen)
{
	struct timespec ts = time__deadline(ms * 1000000ull);
	while (!a->stop && a->generation == gen)
		if (pthread_cond_timedwait(&a->cond, &a->lock, &ts) == ETIMEDOUT)
			return !a->stop && a->generation == gen;
	return false;
}

static void *announcer__thread(void *arg)
{
	struct announcer *a = arg;
	pthread_setname_np(pthread_self(), "announce");
	pthread_mutex_lock(&a->lock);
	while (!a->stop) {
		uint64_t gen = a->generation;
		struct announce_params p = a->p;
		for (uint64_t k = 0; k < p.rounds && announcer__sleep(a, announce__gap_ms(&p, k), gen); k++) {
			pthread_mutex_unlock(&a->lock);
			a->fn(a->ctx);
			pthread_mutex_lock(&a->lock);
			a->rounds_done++;
		}
		while (!a->stop && a->generation == gen)
			pthread_cond_wait(&a->cond, &a->lock);
	}
	pthread_mutex_unlock(&a->lock);
	return NULL;
}

int announcer__init(struct announcer *a, void (*fn)(void *ctx), void *ctx)
{
	memset(a, 0, sizeof(*a));
	pthread_mutex_init(&a->lock, NULL);
	time__cond_init(&a->cond);
	a->fn = fn;
	a->ctx = ctx;
	return 0;
}

int announcer__start(struct announcer *a, const struct announce_params *p)
{
	if (announce__check(p))
		return -EINVAL;
	pthread_mutex_lock(&a->lock);
	a->p = *p;
	a->generation++;
	int rc = 0;
	if (!a->started) {
		rc = -pthread_create(&a->thread, NULL, announcer__thread, a);
		a->started = rc == 0;
	}
	pthread_cond_broadcast(&a->cond);
	pthread_mutex_unlock(&a->lock);
	return rc;
}

uint64_t announcer__rounds(struct announcer *a)
{
	pthread_mutex_lock(&a->lock);
	uint64_t n = a->rounds_done;
	pthread_mutex_unlock(&a->lock);
	return n;
}

void announcer__destroy(struct announcer *a)
{
	pthread_mutex_lock(&a->lock);
	a->stop = true;
	pthread_cond_broadcast(&a->cond);
	bool started = a->started;
	pthread_mutex_unlock(&a->lock);
	if (started)
		pthread_join(a->thread, NULL);
	pthread_cond_destroy(&a->cond);
	pthread_mutex_destroy(&a->lock);
}
