#include "mig/recv/blocktime.h"

#include <errno.h>
#include <string.h>

int blocktime__init(struct blocktime *b, const int *tids, unsigned nr_vcpus)
{
	if (!nr_vcpus || nr_vcpus > BLOCKTIME_MAX_VCPUS)
		return -EINVAL;
	memset(b, 0, sizeof(*b));
	b->nr_vcpus = nr_vcpus;
	memcpy(b->tid, tids, nr_vcpus * sizeof(tids[0]));
	return -pthread_mutex_init(&b->lock, NULL);
}

static int blocktime__vcpu_of(const struct blocktime *b, int tid)
{
	for (unsigned i = 0; i < b->nr_vcpus; i++)
		if (b->tid[i] == tid)
			return (int)i;
	return -1;
}

/* Callers read their clocks before the lock: a placement may carry an
 * earlier time than the fault it ends. */
static uint64_t blocktime__since(uint64_t now, uint64_t since)
{
	return now > since ? now - since : 0;
}

int blocktime__fault(struct blocktime *b, int tid, uint64_t page, uint64_t now)
{
	pthread_mutex_lock(&b->lock);
	int i = blocktime__vcpu_of(b, tid);
	if (i >= 0 && b->page[i]) {
		/* its wait was cut short (a kick) and it faulted elsewhere:
		 * the same wait, for the new page */
		b->page[i] = page + 1;
	} else if (i >= 0) {
		b->page[i] = page + 1;
		b->since[i] = now;
		if (++b->blocked == b->nr_vcpus)
			b->all_since = now;
	}
	pthread_mutex_unlock(&b->lock);
	return i;
}

void blocktime__placed(struct blocktime *b, uint64_t page, uint64_t now)
{
	pthread_mutex_lock(&b->lock);
	for (unsigned i = 0; i < b->nr_vcpus && b->blocked; i++) {
		if (b->page[i] != page + 1)
			continue;
		if (b->blocked == b->nr_vcpus)
			b->all_ns += blocktime__since(now, b->all_since);
		b->vcpu_ns[i] += blocktime__since(now, b->since[i]);
		b->page[i] = 0;
		b->blocked--;
	}
	pthread_mutex_unlock(&b->lock);
}

uint64_t blocktime__read(struct blocktime *b, uint64_t now, uint64_t *vcpu_ms)
{
	pthread_mutex_lock(&b->lock);
	for (unsigned i = 0; i < b->nr_vcpus; i++)
		vcpu_ms[i] = (b->vcpu_ns[i] + (b->page[i] ? blocktime__since(now, b->since[i]) : 0)) /
			     1000000;
	uint64_t all = b->all_ns +
		       (b->blocked == b->nr_vcpus ? blocktime__since(now, b->all_since) : 0);
	pthread_mutex_unlock(&b->lock);
	return all / 1000000;
}

void blocktime__free(struct blocktime *b)
{
	pthread_mutex_destroy(&b->lock);
}
