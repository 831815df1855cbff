/* Dirty tracking: the common part and the bitmap backend. The ring
 * backend and the reaper live in dirty_ring.c. */
#include "mem/dirty_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include "base/timeutil.h"

static int dirty__start_locked(struct dirty *d);
static int dirty__stop_locked(struct dirty *d);

/* d->lock held */
static void dirty__forget_pending(struct dirty *d)
{
	if (!__atomic_load_n(&d->any_pending, __ATOMIC_RELAXED))
		return;
	bitmap__clear_all(&d->pending);
	bitmap__clear_all(&d->pending_chunks);
	__atomic_store_n(&d->any_pending, false, __ATOMIC_RELAXED);
}

/* Bitmap backend: the log buffer, manual protect when KVM has it, and the
 * deferred-clear maps. */
static int dirty__create_bitmap(struct dirty *d)
{
	d->kvm_bitmap = calloc(BITMAP_WORDS(d->ram->npages), sizeof(uint64_t));
	if (!d->kvm_bitmap)
		return -ENOMEM;
	int caps = ioctl(d->host.kvm_fd, KVM_CHECK_EXTENSION, KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2);
	if (caps <= 0)
		return 0;
	struct kvm_enable_cap cap = { .cap = KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
				      .args = { (uint64_t)caps } };
	if (ioctl(d->host.vm_fd, KVM_ENABLE_CAP, &cap) < 0)
		return 0;
	d->manual_protect = true;
	d->initially_set = caps & KVM_DIRTY_LOG_INITIALLY_SET;
	uint64_t chunks = 0;
	for (unsigned i = 0; i < d->ram->nr_blocks; i++) {
		d->chunk_base[i] = chunks;
		uint64_t np = d->ram->blocks[i].size >> RAM_PAGE_SHIFT;
		chunks += (np + d->chunk_pages - 1) / d->chunk_pages;
	}
	int rc = bitmap__init(&d->pending, d->ram->npages);
	return rc ? rc : bitmap__init(&d->pending_chunks, chunks ? chunks : 1);
}

int dirty__create(struct dirty **out, const struct dirty_host *host, enum reaper_mode mode)
{
	uint64_t chunk = host->clear_chunk_pages ? host->clear_chunk_pages : DIRTY_CLEAR_CHUNK_PAGES;
	if (chunk % 64 || chunk > UINT32_MAX || !host->ram || !host->kick_all ||
	    (host->ring_entries && (!host->vcpu_fds || !host->nr_vcpus)))
		return -EINVAL;
	struct dirty *d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->host = *host;
	d->ram = host->ram;
	d->chunk_pages = chunk;
	d->backend = host->ring_entries ? DIRTY_RING : DIRTY_BITMAP;
	d->mode = mode;
	pthread_mutex_init(&d->lock, NULL);
	pthread_mutex_init(&d->users_lock, NULL);
	pthread_mutex_init(&d->reaper_lock, NULL);
	pthread_cond_init(&d->reaper_cond, NULL);
	int rc = dirtyrate__init(&d->est, host->nr_vcpus ? host->nr_vcpus : 1,
				 DIRTYRATE_DEFAULT_PERIOD_MS, time__now_ms());
	if (!rc)
		rc = bitmap__init(&d->acc, d->ram->npages);
	if (!rc)
		rc = bitmap__init(&d->vmm, d->ram->npages);
	if (!rc)
		rc = bitmap__init(&d->period, d->ram->npages);
	if (!rc && d->backend == DIRTY_BITMAP)
		rc = dirty__create_bitmap(d);
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
	bitmap__free(&d->pending);
	bitmap__free(&d->pending_chunks);
	free(d->kvm_bitmap);
	free(d->vcpu_entries);
	dirty_ring__unmap(d);
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
	d->stats.clear_calls = d->stats.cleared_pages = 0;
	dirty__forget_pending(d);
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
		dirty_ring__harvest_all(d, -1); /* leave the rings empty */
	dirty__forget_pending(d);            /* logging off: nothing left to protect */
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

/* Re-protects the pages set in bits (the log of block b from page p, n
 * pages) with KVM_CLEAR_DIRTY_LOG; skipped when none is set. */
static int dirty__clear_range(struct dirty *d, unsigned b, uint64_t p, uint64_t n,
			      uint64_t *bits)
{
	uint64_t set = 0;
	for (uint64_t w = 0; w < (n + 63) / 64; w++)
		set += (uint64_t)__builtin_popcountll(bits[w]);
	if (!set)
		return 0;
	struct kvm_clear_dirty_log clr = { .slot = d->ram->blocks[b].slot, .first_page = p,
		.num_pages = (uint32_t)n, .dirty_bitmap = bits };
	if (ioctl(d->host.vm_fd, KVM_CLEAR_DIRTY_LOG, &clr) < 0)
		return -errno;
	d->stats.clear_calls++;
	d->stats.cleared_pages += set;
	return 0;
}

/* Deferred: the block's log becomes its pending set (pages a previous
 * sync reported and no clear has protected are in this log again). */
static void dirty__defer_block(struct dirty *d, unsigned b, uint64_t npages)
{
	const struct ram_block *blk = &d->ram->blocks[b];
	for (uint64_t p = 0; p < npages; p += d->chunk_pages) {
		uint64_t n = npages - p < d->chunk_pages ? npages - p : d->chunk_pages;
		uint64_t c = d->chunk_base[b] + p / d->chunk_pages;
		bitmap__clear_bit(&d->pending_chunks, c);
		bool any = false;
		for (uint64_t w = p / 64; w < (p + n + 63) / 64 && !any; w++)
			any = d->kvm_bitmap[w] != 0;
		if (!any)
			continue;
		bitmap__set(&d->pending_chunks, c);
		__atomic_store_n(&d->any_pending, true, __ATOMIC_RELAXED);
	}
	/* pending's words for the block, replaced: blocks are multiples of
	 * 2 MiB and start at one (ram.h), so both ends fall on whole words */
	memcpy(d->pending.words + blk->first_page / 64, d->kvm_bitmap,
	       (npages / 64) * sizeof(uint64_t));
}

/* Bitmap backend: fetch each slot's log into acc; re-protect the pages it
 * reports at once, or record them for dirty__clear_before_read. */
static int dirty__bitmap_collect(struct dirty *d, bool defer)
{
	for (unsigned i = 0; i < d->ram->nr_blocks; i++) {
		const struct ram_block *b = &d->ram->blocks[i];
		uint64_t npages = b->size >> RAM_PAGE_SHIFT;
		memset(d->kvm_bitmap, 0, BITMAP_WORDS(npages) * sizeof(uint64_t));
		struct kvm_dirty_log log = { .slot = b->slot, .dirty_bitmap = d->kvm_bitmap };
		if (ioctl(d->host.vm_fd, KVM_GET_DIRTY_LOG, &log) < 0)
			return -errno;
		bitmap__or_words(&d->acc, b->first_page, d->kvm_bitmap, npages);
		if (!d->manual_protect)
			continue;
		if (defer) {
			dirty__defer_block(d, i, npages);
			continue;
		}
		for (uint64_t p = 0; p < npages; p += d->chunk_pages) {
			uint64_t n = npages - p < d->chunk_pages ? npages - p : d->chunk_pages;
			int rc = dirty__clear_range(d, i, p, n, d->kvm_bitmap + p / 64);
			if (rc)
				return rc;
		}
	}
	if (!defer)
		dirty__forget_pending(d); /* the whole log was just protected */
	return 0;
}

int dirty__clear_before_read(struct dirty *d, uint64_t page)
{
	if (!__atomic_load_n(&d->any_pending, __ATOMIC_RELAXED))
		return 0;
	const struct ram *r = d->ram;
	unsigned b = r->nr_blocks > 1 && page >= r->blocks[1].first_page ? 1 : 0;
	uint64_t off = page - r->blocks[b].first_page;
	uint64_t np = r->blocks[b].size >> RAM_PAGE_SHIFT;
	if (page < r->blocks[b].first_page || off >= np)
		return -EINVAL;
	uint64_t c = d->chunk_base[b] + off / d->chunk_pages;
	if (!bitmap__test(&d->pending_chunks, c))
		return 0;
	pthread_mutex_lock(&d->lock);
	int rc = 0;
	if (d->active && bitmap__test(&d->pending_chunks, c)) {
		uint64_t p = off / d->chunk_pages * d->chunk_pages;
		uint64_t n = np - p < d->chunk_pages ? np - p : d->chunk_pages;
		uint64_t *words = d->pending.words + (r->blocks[b].first_page + p) / 64;
		rc = dirty__clear_range(d, b, p, n, words);
		if (!rc) {
			bitmap__clear_range(&d->pending, r->blocks[b].first_page + p, n);
			bitmap__clear_bit(&d->pending_chunks, c);
		}
	}
	pthread_mutex_unlock(&d->lock);
	return rc;
}

int64_t dirty__sync(struct dirty *d, struct bitmap *dst, unsigned flags)
{
	uint64_t t0 = time__now_ns();
	int rc = 0;
	if (!d->active)
		return -EINVAL;
	if ((flags & DIRTY_SYNC_KICK) && d->backend == DIRTY_RING)
		d->host.kick_all(d->host.kick_ctx);
	pthread_mutex_lock(&d->lock);
	if (d->backend == DIRTY_RING)
		dirty_ring__harvest_all(d, -1);
	else
		rc = dirty__bitmap_collect(d, flags & DIRTY_SYNC_DEFER_CLEAR);
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

bool dirty__logging(const struct dirty *d)
{
	return ram__logging(d->ram);
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
	pthread_mutex_lock(&d->users_lock);
	unsigned users = d->users;
	pthread_mutex_unlock(&d->users_lock);
	pthread_mutex_lock(&d->lock);
	*out = d->stats;
	out->ring_full_exits = dirty_ring__full_exits(d);
	out->users = users;
	out->pending_pages = __atomic_load_n(&d->any_pending, __ATOMIC_RELAXED) ? bitmap__count(&d->pending) : 0;
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

void dirty__rate_restart(struct dirty *d)
{
	pthread_mutex_lock(&d->lock);
	dirtyrate__reset(&d->est, time__now_ms());
	bitmap__clear_all(&d->period);
	d->stats.rate_pages = d->stats.peak_rate_pages = 0;
	pthread_mutex_unlock(&d->lock);
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
	if (d->vcpu_entries && vcpu < d->host.nr_vcpus)
		n = d->vcpu_entries[vcpu];
	pthread_mutex_unlock(&d->lock);
	return n;
}

void dirty__harvest(struct dirty *d)
{
	if (d->backend != DIRTY_RING || !dirty__active(d))
		return;
	pthread_mutex_lock(&d->lock);
	dirty_ring__harvest_all(d, -1);
	pthread_mutex_unlock(&d->lock);
}
