#include "mig/policy/calcrate.h"

#include <errno.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timeutil.h"
#include "kvm/vm.h"
#include "mem/dirty.h"
#include "mem/dirtyrate.h"
#include "mig/wire/proto.h"

static const char *const calc_mode_names[] = { "page-sampling", "dirty-ring", "dirty-bitmap" };
static const char *const calc_status_names[] = { "unstarted", "measuring", "measured" };

void calcrate__init(struct calcrate *c, struct vm *vm)
{
	memset(c, 0, sizeof(*c));
	c->vm = vm;
	pthread_mutex_init(&c->lock, NULL);
	time__cond_init(&c->cond);
}

void calcrate__stop(struct calcrate *c)
{
	pthread_mutex_lock(&c->lock);
	c->stop = true;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
	if (c->thread_running)
		pthread_join(c->thread, NULL);
	c->thread_running = false;
}

void calcrate__destroy(struct calcrate *c)
{
	calcrate__stop(c);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->lock);
}

/* Waits out the measurement interval; false if calcrate__stop came first. */
static bool calcrate__wait(struct calcrate *c)
{
	struct timespec ts = time__deadline((uint64_t)c->calc_time_s * 1000000000ull);
	pthread_mutex_lock(&c->lock);
	while (!c->stop && pthread_cond_timedwait(&c->cond, &c->lock, &ts) != ETIMEDOUT)
		;
	bool go = !c->stop;
	pthread_mutex_unlock(&c->lock);
	return go;
}

bool calcrate__measuring_bitmap(struct calcrate *c)
{
	pthread_mutex_lock(&c->lock);
	bool busy = c->status == CALC_MEASURING && c->mode == CALC_DIRTY_BITMAP;
	pthread_mutex_unlock(&c->lock);
	return busy;
}

static uint64_t calcrate__page_hash(struct vm *vm, uint64_t page)
{
	uint8_t h[PROTO_HASH_LEN];
	proto__hash_buf(ram__page_host(&vm->ram, page), RAM_PAGE_SIZE, h);
	uint64_t v;
	memcpy(&v, h, sizeof(v));
	return v;
}

/* Page sampling: no tracking at all, like QEMU's default mode. */
static uint64_t calcrate__sample(struct calcrate *c)
{
	struct ram *ram = &c->vm->ram;
	uint64_t n = c->sample_pages * (ram->size >> 30 ? ram->size >> 30 : 1);
	uint64_t *pages = calloc(n, sizeof(*pages)), *hash = calloc(n, sizeof(*hash));
	uint64_t changed = 0, seed = time__now_ns() | 1;
	if (!pages || !hash)
		goto out;
	for (uint64_t i = 0; i < n; i++) {
		seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17; /* xorshift64 */
		pages[i] = seed % ram->npages;
		hash[i] = calcrate__page_hash(c->vm, pages[i]);
	}
	if (!calcrate__wait(c))
		n = 0;
	for (uint64_t i = 0; i < n; i++)
		changed += calcrate__page_hash(c->vm, pages[i]) != hash[i];
out:
	free(pages);
	free(hash);
	return n ? changed * (ram->size / DIRTYRATE_MB) / n / c->calc_time_s : 0;
}

static uint64_t calcrate__ring(struct calcrate *c)
{
	struct vm *vm = c->vm;
	uint64_t before[CALCRATE_MAX_VCPUS], total = 0;
	if (dirty__start(vm->dirty))
		return 0;
	dirty__harvest(vm->dirty);
	for (unsigned i = 0; i < vm->nr_vcpus && i < CALCRATE_MAX_VCPUS; i++)
		before[i] = dirty__vcpu_entries(vm->dirty, i);
	if (!calcrate__wait(c)) {
		if (dirty__stop(vm->dirty))
			log_warn("calc-dirty-rate: tracking did not stop cleanly");
		return 0;
	}
	vm__kick_all_sync(vm);
	dirty__harvest(vm->dirty);
	for (unsigned i = 0; i < vm->nr_vcpus && i < CALCRATE_MAX_VCPUS; i++) {
		uint64_t pages = dirty__vcpu_entries(vm->dirty, i) - before[i];
		c->vcpu_mbps[i] = pages * RAM_PAGE_SIZE / DIRTYRATE_MB / c->calc_time_s;
		total += pages;
	}
	if (dirty__stop(vm->dirty))
		log_warn("calc-dirty-rate: tracking did not stop cleanly");
	return total * RAM_PAGE_SIZE / DIRTYRATE_MB / c->calc_time_s;
}

static uint64_t calcrate__bitmap(struct calcrate *c)
{
	struct vm *vm = c->vm;
	struct bitmap bm;
	uint64_t rate = 0;
	if (bitmap__init(&bm, vm->ram.npages))
		return 0;
	if (!dirty__start(vm->dirty)) {
		int64_t got = dirty__sync(vm->dirty, &bm, DIRTY_SYNC_KICK); /* the baseline */
		bitmap__clear_all(&bm);
		if (got >= 0 && calcrate__wait(c) && dirty__sync(vm->dirty, &bm, DIRTY_SYNC_KICK) >= 0)
			rate = dirtyrate__qemu_mbps(bitmap__count(&bm), RAM_PAGE_SIZE,
						    c->calc_time_s * 1000);
		if (dirty__stop(vm->dirty))
			log_warn("calc-dirty-rate: tracking did not stop cleanly");
	}
	bitmap__free(&bm);
	return rate;
}

static void *calcrate__thread(void *arg)
{
	struct calcrate *c = arg;
	pthread_setname_np(pthread_self(), "calc-dirty-rate");
	uint64_t rate = c->mode == CALC_DIRTY_RING ? calcrate__ring(c) :
			c->mode == CALC_DIRTY_BITMAP ? calcrate__bitmap(c) : calcrate__sample(c);
	pthread_mutex_lock(&c->lock);
	c->rate_mbps = rate;
	c->status = CALC_MEASURED;
	pthread_mutex_unlock(&c->lock);
	return NULL;
}

int calcrate__start(struct calcrate *c, uint64_t calc_time_s, uint64_t sample_pages,
		    enum calcrate_mode mode, char *err, size_t errlen)
{
	struct vm *vm = c->vm;
	if (calc_time_s < 1 || calc_time_s > 60 || sample_pages < 128 || sample_pages > 4096) {
		snprintf(err, errlen, "calc-time must be 1..60 s and sample-pages 128..4096");
		return -EINVAL;
	}
	if (mode == CALC_DIRTY_RING && dirty__backend(vm->dirty) != DIRTY_RING) {
		snprintf(err, errlen, "mode dirty-ring needs kmig run --dirty-ring");
		return -EINVAL;
	}
	if (mode == CALC_DIRTY_BITMAP && (dirty__backend(vm->dirty) != DIRTY_BITMAP ||
					  dirty__active(vm->dirty))) {
		snprintf(err, errlen, "mode dirty-bitmap needs the bitmap backend and no migration in progress");
		return -EINVAL;
	}
	pthread_mutex_lock(&c->lock);
	bool busy = c->status == CALC_MEASURING;
	pthread_mutex_unlock(&c->lock);
	if (busy) {
		snprintf(err, errlen, "the previous dirty rate calculation is still running");
		return -EBUSY;
	}
	if (c->thread_running)
		pthread_join(c->thread, NULL);
	c->thread_running = false;
	c->stop = false;
	c->calc_time_s = calc_time_s;
	c->sample_pages = sample_pages;
	c->mode = mode;
	c->start_time_s = time__now_ms() / 1000;
	memset(c->vcpu_mbps, 0, sizeof(c->vcpu_mbps));
	c->status = CALC_MEASURING;
	if (pthread_create(&c->thread, NULL, calcrate__thread, c)) {
		c->status = CALC_UNSTARTED;
		snprintf(err, errlen, "cannot start the measurement thread");
		return -EAGAIN;
	}
	c->thread_running = true;
	return 0;
}

json_t *calcrate__query(struct calcrate *c)
{
	pthread_mutex_lock(&c->lock);
	json_t *r = json_pack("{s:s, s:I, s:I, s:I, s:s}",
			      "status", calc_status_names[c->status],
			      "start-time", (json_int_t)c->start_time_s,
			      "calc-time", (json_int_t)c->calc_time_s,
			      "sample-pages", (json_int_t)c->sample_pages,
			      "mode", calc_mode_names[c->mode]);
	if (c->status == CALC_MEASURED) {
		json_object_set_new(r, "dirty-rate", json_integer((json_int_t)c->rate_mbps));
		if (c->mode == CALC_DIRTY_RING) {
			json_t *list = json_array();
			for (unsigned i = 0; i < c->vm->nr_vcpus && i < CALCRATE_MAX_VCPUS; i++)
				json_array_append_new(list, json_pack("{s:i, s:I}", "id", i, "dirty-rate",
								      (json_int_t)c->vcpu_mbps[i]));
			json_object_set_new(r, "vcpu-dirty-rate", list);
		}
	}
	pthread_mutex_unlock(&c->lock);
	return r;
}
