/* The migration's threads by name (mig/threads.h). */
#include "mig/threads.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void mig_threads__init(struct mig_threads *mt)
{
	memset(mt, 0, sizeof(*mt));
	pthread_mutex_init(&mt->lock, NULL);
}

void mig_threads__destroy(struct mig_threads *mt)
{
	pthread_mutex_destroy(&mt->lock);
}

/* Under mt->lock: tid's slot, or mt->n. */
static unsigned mig_threads__find(const struct mig_threads *mt, pid_t tid)
{
	unsigned i = 0;
	while (i < mt->n && mt->t[i].tid != tid)
		i++;
	return i;
}

int mig_threads__add(struct mig_threads *mt, pid_t tid, const char *fmt, ...)
{
	char name[MIG_THREAD_NAME];
	va_list ap;
	if (!mt)
		return 0;
	va_start(ap, fmt);
	int len = vsnprintf(name, sizeof(name), fmt, ap);
	va_end(ap);
	if (len < 1 || len >= (int)sizeof(name) || tid < 1)
		return -EINVAL;
	int rc = 0;
	pthread_mutex_lock(&mt->lock);
	if (mig_threads__find(mt, tid) < mt->n) {
		rc = -EEXIST;
	} else if (mt->n == MIG_THREADS_MAX) {
		rc = -ENOSPC;
	} else {
		memcpy(mt->t[mt->n].name, name, (size_t)len + 1);
		mt->t[mt->n++].tid = tid;
	}
	pthread_mutex_unlock(&mt->lock);
	return rc;
}

void mig_threads__remove(struct mig_threads *mt, pid_t tid)
{
	if (!mt)
		return;
	pthread_mutex_lock(&mt->lock);
	unsigned i = mig_threads__find(mt, tid);
	if (i < mt->n) {
		memmove(&mt->t[i], &mt->t[i + 1], (mt->n - i - 1) * sizeof(mt->t[0]));
		mt->n--;
	}
	pthread_mutex_unlock(&mt->lock);
}

json_t *mig_threads__json(struct mig_threads *mt)
{
	json_t *list = json_array();
	if (!mt || !list)
		return list;
	pthread_mutex_lock(&mt->lock);
	for (unsigned i = 0; i < mt->n; i++)
		json_array_append_new(list, json_pack("{s:s, s:i}", "name", mt->t[i].name,
						      "thread-id", (int)mt->t[i].tid));
	pthread_mutex_unlock(&mt->lock);
	return list;
}

unsigned mig_threads__count(struct mig_threads *mt)
{
	if (!mt)
		return 0;
	pthread_mutex_lock(&mt->lock);
	unsigned n = mt->n;
	pthread_mutex_unlock(&mt->lock);
	return n;
}
