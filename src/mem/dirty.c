/* Dirty tracking: the common part and the bitmap backend. The ring
 * backend and the reaper live in dirty_ring.c. */
#include "mem/dirty_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include "base/timeutil.h"
#include "kvm/vm.h"

#define CLEAR_CHUNK_PAGES (256ull * 1024) /* 1 GiB per KVM_CLEAR_DIRTY_LOG */

static int dirty__start_locked(struct dirty *d);
static int dirty__stop_locked(struct dirty *d);

int dirty__create(struct dirty **out, struct vm *vm, enum reaper_mode mode)
{
	struct dirty *d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->vm = vm;
	d->ram = &vm->ram;
	d->backend = vm->cfg.dirty_ring ? DIRTY_RING : DIRTY_BITMAP;
	d->mode = mode;
	pthread_mutex_init(&d->lock, NULL);
	pthread_mutex_init(&d->users_lock, NULL);
	pthread_mutex_init(&d->reaper_lock, NULL);
	pthread_cond_init(&d->reaper_cond, NULL);
	int rc = dirtyrate__init(&d->est, vm->nr_vcpus, DIRTYRATE_DEFAULT_PERIOD_MS, time__now_ms());
	if (!rc)
		rc = bitmap__init(&d->acc, d->ram->npages);
	if (!rc)
		rc = bitmap__init(&d->vmm, d->ram->npages);
	if (!rc)
		rc = bitmap__init(&d->period, d->ram->npages);
	if (!rc && d->backend == DIRTY_BITMAP) {
		d->kvm_bitmap = calloc(BITMAP_WORDS(d->ram->npages), sizeof(uint64_t));
		if (!d->kvm_bitmap)
			rc = -ENOMEM;
		int caps = ioctl(vm->kvm_fd, KVM_CHECK_EXTENSION, KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2);
		if (!rc && caps > 0) {
			struct kvm_enable_cap cap = { .cap = KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
						      .args = { (uint64_t)caps } };
			if (ioctl(vm->vm_fd, KVM_ENABLE_CAP, &cap) == 0) {
				d->manual_protect = true;
				d->initially_set = caps & KVM_DIRTY_LOG_INITIALLY_SET;
			}
		}
	}
	if (!rc && d->backend == DIRTY_RING)
		rc = dirty_ring__map(d);
	if (rc) {
		dirty__destroy(d);
		return rc;
	}
	*out = d;
	return 0;
}

void dirty__destroy(struct dirty *d)
{
	if (!d)
		return;
	if (d->active && dirty__stop_locked(d))
		log_warn("dirty tracking did not stop cleanly");
	dirtyrate__free(&d->est);
	bitmap__free(&d->acc);
	bitmap__free(&d->vmm);
	bitmap__free(&d->period);
	free(d->kvm_bitmap);
	free(d->vcpu_entries);
	pthread_mutex_destroy(&d->lock);
	free(d);
}

enum dirty_backend dirty__backend(const struct dirty *d)
{
	return d->backend;
}

bool dirty__active(const struct dirty *d)
{
	return __atomic_load_n(&d->active, __ATOMIC_ACQUIRE);
}

int dirty__start(struct dirty *d)
{
	pthread_mutex_lock(&d->users_lock);
	int rc = d->users++ ? 0 : dirty__start_locked(d);
	if (rc)
		d->users--;
	pthread_mutex_unlock(&d->users_lock);
	return rc;
}

int dirty__stop(struct dirty *d)
{
	pthread_mutex_lock(&d->users_lock);
	int rc = 0;
	if (d->users && !--d->users)
		rc = dirty__stop_locked(d);
	pthread_mutex_unlock(&d->users_lock);
	return rc;
}

static int dirty__start_locked(struct dirty *d)
{
	pthread_mutex_lock(&d->lock);
	bitmap__clear_all(&d->acc);
	bitmap__clear_all(&d->period);
	d->stats.syncs = d->stats.harvested = 0;
	dirtyrate__reset(&d->est, time__now_ms());
	int rc = ram__set_logging(d->ram, true);
	if (!rc)
		__atomic_store_n(&d->active, true, __ATOMIC_RELEASE);
	else if (ram__set_logging(d->ram, false)) /* undo a half-done switch */
		log_warn("dirty tracking: memslot logging left on after a failed start");
	pthread_mutex_unlock(&d->lock);
	if (!rc && d->backend == DIRTY_RING) {
		rc = dirty_ring__start_reaper(d);
		if (rc && dirty__stop_locked(d))
			log_warn("dirty tracking: could not undo a failed start");
	}
	return rc;
}

static int dirty__stop_locked(struct dirty *d)
{
	if (d->backend == DIRTY_RING)
		dirty_ring__stop_reaper(d);
	pthread_mutex_lock(&d->lock);
	__atomic_store_n(&d->active, false, __ATOMIC_RELEASE);
	if (d->backend == DIRTY_RING)
		dirty_ring__harvest_all(d, NULL); /* leave the rings empty */
	int rc = ram__set_logging(d->ram, false);
	pthread_mutex_unlock(&d->lock);
	return rc;
}

void dirty__mark(struct dirty *d, uint64_t gpa, uint64_t len)
{
	if (!len)
		return;
	for (unsigned i = 0; i < d->ram->nr_blocks; i++) {
		const struct ram_block *b = &d->ram->blocks[i];
		if (gpa >= b->gpa + b->size || gpa + len <= b->gpa)
			continue;
		uint64_t lo = gpa > b->gpa ? gpa : b->gpa;
		uint64_t hi = gpa + len < b->gpa + b->size ? gpa + len : b->gpa + b->size;
		uint64_t first = b->first_page + ((lo - b->gpa) >> RAM_PAGE_SHIFT);
		uint64_t last = b->first_page + ((hi - 1 - b->gpa) >> RAM_PAGE_SHIFT);
		bitmap__set_range(&d->vmm, first, last - first + 1);
	}
}

/* Moves the VMM's marks into acc; d->lock held.  dirty__mark runs without
 * the lock, so each word is taken with an atomic exchange: an OR followed
 * by a clear of the whole map would drop marks set in between. */
static void dirty__take_vmm(struct dirty *d)
{
	for (size_t w = 0; w < BITMAP_WORDS(d->vmm.nbits); w++) {
		if (!__atomic_load_n(&d->vmm.words[w], __ATOMIC_RELAXED))
			continue;
		uint64_t bits = __atomic_exchange_n(&d->vmm.words[w], 0, __ATOMIC_ACQ_REL);
		__atomic_fetch_or(&d->acc.words[w], bits, __ATOMIC_RELAXED);
	}
}

/* Bitmap backend: fetch each slot's log into acc, re-protecting as we go. */
static int dirty__bitmap_collect(struct dirty *d)
{
	for (unsigned i = 0; i < d->ram->nr_blocks; i++) {
		const struct ram_block *b = &d->ram->blocks[i];
		uint64_t npages = b->size >> RAM_PAGE_SHIFT;
		memset(d->kvm_bitmap, 0, BITMAP_WORDS(npages) * sizeof(uint64_t));
		struct kvm_dirty_log log = { .slot = b->slot, .dirty_bitmap = d->kvm_bitmap };
		if (ioctl(d->vm->vm_fd, KVM_GET_DIRTY_LOG, &log) < 0)
			return -errno;
		bitmap__or_words(&d->acc, b->first_page, d->kvm_bitmap, npages);
		if (!d->manual_protect)
			continue;
		for (uint64_t p = 0; p < npages; p += CLEAR_CHUNK_PAGES) {
			uint64_t n = npages - p < CLEAR_CHUNK_PAGES ? npages - p : CLEAR_CHUNK_PAGES;
			bool any = false;
			for (uint64_t w = p / 64; w < (p + n + 63) / 64 && !any; w++)
				any = d->kvm_bitmap[w] != 0;
			if (!any)
				continue;
			struct kvm_clear_dirty_log clr = { .slot = b->slot, .first_page = p,
				.num_pages = (uint32_t)n, .dirty_bitmap = d->kvm_bitmap + p / 64 };
			if (ioctl(d->vm->vm_fd, KVM_CLEAR_DIRTY_LOG, &clr) < 0)
				return -errno;
		}
	}
	return 0;
}

int64_t dirty__sync(struct dirty *d, struct bitmap *dst, bool kick)
{
	uint64_t t0 = time__now_ns();
	int rc = 0;
	if (!d->active)
		return -EINVAL;
	if (kick && d->backend == DIRTY_RING)
		vm__kick_all_sync(d->vm);
	pthread_mutex_lock(&d->lock);
	if (d->backend == DIRTY_RING)
		dirty_ring__harvest_all(d, NULL);
	else
		rc = dirty__bitmap_collect(d);
	dirty__take_vmm(d);
	uint64_t added = bitmap__or(dst, &d->acc);
	uint64_t found = bitmap__count(&d->acc);
	bitmap__clear_all(&d->acc);
	uint64_t now = time__now_ns();
	if (d->backend == DIRTY_BITMAP && now > d->last_sync_end_ns && d->last_sync_end_ns)
		dirty__rate_update(d, found, now - d->last_sync_end_ns);
	d->last_sync_end_ns = now;
	d->stats.syncs++;
	d->stats.last_sync_ns = now - t0;
	pthread_mutex_unlock(&d->lock);
	return rc ? rc : (int64_t)added;
}

void dirty__rate_update(struct dirty *d, uint64_t pages, uint64_t interval_ns)
{
	uint64_t rate = interval_ns ? pages * 1000000000ull / interval_ns : 0;
	d->stats.rate_pages = rate;
	if (rate > d->stats.peak_rate_pages)
		d->stats.peak_rate_pages = rate;
}

void dirty__get_stats(struct dirty *d, struct dirty_stats *out)
{
	pthread_mutex_lock(&d->lock);
	*out = d->stats;
	out->ring_full_exits = 0;
	for (unsigned i = 0; i < d->vm->nr_vcpus; i++)
		out->ring_full_exits += atomic_load(&d->vm->vcpus[i].ring_full_exits);
	pthread_mutex_unlock(&d->lock);
}

uint64_t dirty__take_peak(struct dirty *d)
{
	pthread_mutex_lock(&d->lock);
	uint64_t peak = d->stats.peak_rate_pages;
	if (d->backend == DIRTY_RING)
		dirtyrate__take_peak(&d->est);
	d->stats.peak_rate_pages = d->stats.rate_pages;
	pthread_mutex_unlock(&d->lock);
	return peak;
}

uint64_t dirty__vcpu_rate(struct dirty *d, unsigned vcpu)
{
	pthread_mutex_lock(&d->lock);
	uint64_t r = dirtyrate__vcpu_rate(&d->est, vcpu);
	pthread_mutex_unlock(&d->lock);
	return r;
}

uint64_t dirty__vcpu_entries(struct dirty *d, unsigned vcpu)
{
	uint64_t n = 0;
	pthread_mutex_lock(&d->lock);
	if (d->vcpu_entries && vcpu < d->vm->nr_vcpus)
		n = d->vcpu_entries[vcpu];
	pthread_mutex_unlock(&d->lock);
	return n;
}

void dirty__harvest(struct dirty *d)
{
	if (d->backend != DIRTY_RING || !dirty__active(d))
		return;
	pthread_mutex_lock(&d->lock);
	dirty_ring__harvest_all(d, NULL);
	pthread_mutex_unlock(&d->lock);
}
