/* Event rate limit; see evthrottle.h. */
#include "ctl/evthrottle.h"

void ev_throttle__init(struct ev_throttle *t, uint64_t period_ms)
{
	pthread_mutex_init(&t->lock, NULL);
	t->period_ms = period_ms;
	t->last_ms = 0;
	t->pending = NULL;
}

void ev_throttle__destroy(struct ev_throttle *t)
{
	json_decref(t->pending);
	t->pending = NULL;
	pthread_mutex_destroy(&t->lock);
}

static int ev_throttle__quiet(const struct ev_throttle *t, uint64_t now_ms)
{
	return t->last_ms == 0 || now_ms >= t->last_ms + t->period_ms;
}

json_t *ev_throttle__offer(struct ev_throttle *t, uint64_t now_ms, json_t *data)
{
	pthread_mutex_lock(&t->lock);
	if (!t->pending && ev_throttle__quiet(t, now_ms)) {
		t->last_ms = now_ms ? now_ms : 1;
		pthread_mutex_unlock(&t->lock);
		return data;
	}
	json_decref(t->pending);
	t->pending = data;
	pthread_mutex_unlock(&t->lock);
	return NULL;
}

json_t *ev_throttle__due(struct ev_throttle *t, uint64_t now_ms)
{
	json_t *out = NULL;
	pthread_mutex_lock(&t->lock);
	if (t->pending && ev_throttle__quiet(t, now_ms)) {
		out = t->pending;
		t->pending = NULL;
		t->last_ms = now_ms ? now_ms : 1;
	}
	pthread_mutex_unlock(&t->lock);
	return out;
}
