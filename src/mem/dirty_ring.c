/* Dirty tracking, ring backend: per-vCPU rings and the reaper thread. */
#include "mem/dirty_impl.h"

#include <errno.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/timeutil.h"

#define RESET_TRIES 8

uint32_t dirty__ring_acq_rel_max(int vm_fd)
{
	int max = ioctl(vm_fd, KVM_CHECK_EXTENSION, KVM_CAP_DIRTY_LOG_RING_ACQ_REL);
	return max > 0 ? (uint32_t)((unsigned)max / sizeof(struct kvm_dirty_gfn)) : 0;
}

int dirty__enable_ring_cap(int vm_fd, uint32_t entries, bool *acq_rel)
{
	if (entries & (entries - 1))
		return -EINVAL;
	uint64_t bytes = (uint64_t)entries * sizeof(struct kvm_dirty_gfn);
	int cap = KVM_CAP_DIRTY_LOG_RING_ACQ_REL;
	int max = ioctl(vm_fd, KVM_CHECK_EXTENSION, cap);
	*acq_rel = max > 0;
	if (max <= 0) {
		cap = KVM_CAP_DIRTY_LOG_RING;
		max = ioctl(vm_fd, KVM_CHECK_EXTENSION, cap);
	}
	if (max <= 0)
		return -ENOTSUP;
	if (bytes > (uint64_t)max || bytes < 4096)
		return -EINVAL;
	struct kvm_enable_cap ec = { .cap = cap, .args = { bytes } };
	if (ioctl(vm_fd, KVM_ENABLE_CAP, &ec) < 0)
		return errno == EINVAL ? -EINVAL : -errno;
	return 0;
}

int dirty_ring__map(struct dirty *d)
{
	size_t bytes = (size_t)d->host.ring_entries * sizeof(struct kvm_dirty_gfn);
	long pg = sysconf(_SC_PAGESIZE);
	d->rings = calloc(d->host.nr_vcpus, sizeof(*d->rings));
	d->vcpu_entries = calloc(d->host.nr_vcpus, sizeof(*d->vcpu_entries));
	if (!d->rings || !d->vcpu_entries)
		return -ENOMEM;
	for (unsigned i = 0; i < d->host.nr_vcpus; i++) {
		void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, d->host.vcpu_fds[i],
			       (off_t)KVM_DIRTY_LOG_PAGE_OFFSET * pg);
		if (p == MAP_FAILED)
			return -errno;
		d->rings[i].gfns = p;
	}
	return 0;
}

void dirty_ring__unmap(struct dirty *d)
{
	size_t bytes = (size_t)d->host.ring_entries * sizeof(struct kvm_dirty_gfn);
	for (unsigned i = 0; d->rings && i < d->host.nr_vcpus; i++)
		if (d->rings[i].gfns)
			munmap(d->rings[i].gfns, bytes);
	free(d->rings);
	d->rings = NULL;
}

/* Marks one harvested gfn; returns 1 if the page is new in this rate period. */
static int dirty_ring__note(struct dirty *d, uint32_t slot, uint64_t offset)
{
	uint16_t id = slot & 0xffff;
	for (unsigned i = 0; i < d->ram->nr_blocks; i++) {
		const struct ram_block *b = &d->ram->blocks[i];
		if (b->slot != id || (slot >> 16) != 0)
			continue;
		if (offset >= (b->size >> RAM_PAGE_SHIFT))
			return 0;
		uint64_t page = b->first_page + offset;
		bitmap__set(&d->acc, page);
		return bitmap__test_and_set(&d->period, page);
	}
	return 0;
}

static uint64_t dirty_ring__harvest_one(struct dirty *d, unsigned vcpu)
{
	struct dirty_vring *r = &d->rings[vcpu];
	uint32_t n = d->host.ring_entries;
	uint64_t count = 0, fresh = 0;
	for (;;) {
		struct kvm_dirty_gfn *e = &r->gfns[r->next & (n - 1)];
		uint32_t flags = __atomic_load_n(&e->flags, __ATOMIC_ACQUIRE);
		if (!(flags & KVM_DIRTY_GFN_F_DIRTY))
			break;
		fresh += dirty_ring__note(d, e->slot, e->offset);
		__atomic_store_n(&e->flags, KVM_DIRTY_GFN_F_RESET, __ATOMIC_RELEASE);
		r->next++;
		count++;
	}
	if (dirtyrate__add(&d->est, vcpu, fresh))
		log_debug("dirty rate: no vCPU %u", vcpu);
	d->vcpu_entries[vcpu] += count;
	return count;
}

/* Closes a rate period when it is due: a page counts once per period. */
static void dirty_ring__rate_tick(struct dirty *d)
{
	if (!dirtyrate__tick(&d->est, time__now_ms()))
		return;
	d->stats.rate_pages = dirtyrate__rate(&d->est);
	d->stats.peak_rate_pages = dirtyrate__peak(&d->est);
	bitmap__clear_all(&d->period);
}

/* Re-protects the harvested entries (at least want of them).  Since Linux
 * 6.17, KVM_RESET_DIRTY_RINGS stops when the calling thread has a signal
 * pending and returns the count so far: the entries of the batch it was
 * coalescing are then consumed without their pages being write-protected,
 * so later writes to those pages are never logged.  vCPU threads (the
 * ring-full path) receive kick signals: block every signal meanwhile, and
 * call again while entries are left. */
static void dirty_ring__reset(struct dirty *d, uint64_t want)
{
	sigset_t all, old;
	uint64_t done = 0;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	for (int i = 0; i < RESET_TRIES && (done < want || !i); i++) {
		int r = ioctl(d->host.vm_fd, KVM_RESET_DIRTY_RINGS, 0);
		if (r < 0 && errno != EINTR) {
			log_warn("KVM_RESET_DIRTY_RINGS failed: %s", strerror(errno));
			break;
		}
		if (r == 0)
			break;
		done += r > 0 ? (uint64_t)r : 0;
	}
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (done < want)
		log_warn("KVM_RESET_DIRTY_RINGS reset %llu of %llu entries",
			 (unsigned long long)done, (unsigned long long)want);
}

uint64_t dirty_ring__harvest_all(struct dirty *d, int only)
{
	uint64_t count = 0;
	for (unsigned i = 0; i < d->host.nr_vcpus; i++)
		if (d->rings[i].gfns && (only < 0 || (unsigned)only == i))
			count += dirty_ring__harvest_one(d, i);
	/* A ring-full exit with nothing new still needs a reset: KVM counts
	 * harvested entries as used until they are reset. */
	if (count || only >= 0)
		dirty_ring__reset(d, count);
	d->stats.harvested += count;
	dirty_ring__rate_tick(d);
	return count;
}

void dirty__on_ring_full(struct dirty *d, unsigned vcpu)
{
	if (d->backend != DIRTY_RING || vcpu >= d->host.nr_vcpus)
		return;
	atomic_fetch_add(&d->rings[vcpu].full_exits, 1);
	pthread_mutex_lock(&d->lock);
	dirty_ring__harvest_all(d, (int)vcpu);
	pthread_mutex_unlock(&d->lock);
}

uint64_t dirty_ring__full_exits(struct dirty *d)
{
	uint64_t full = 0;
	for (unsigned i = 0; d->rings && i < d->host.nr_vcpus; i++)
		full += atomic_load(&d->rings[i].full_exits);
	return full;
}

static unsigned dirty_ring__next_interval(struct dirty *d, uint64_t harvested)
{
	uint64_t full = dirty_ring__full_exits(d);
	uint64_t cap = (uint64_t)d->host.ring_entries * d->host.nr_vcpus;
	unsigned ms = reaper_policy__next_interval_ms(&d->reaper_policy, harvested, cap,
						      full - d->reaper_full_seen);
	d->reaper_full_seen = full;
	return ms;
}

static void *dirty_ring__reaper(void *arg)
{
	struct dirty *d = arg;
	unsigned interval = 1000;
	pthread_setname_np(pthread_self(), "reaper");
	pthread_mutex_lock(&d->reaper_lock);
	while (!d->reaper_stop) {
		struct timespec ts = time__deadline((uint64_t)interval * 1000000ull);
		pthread_cond_timedwait(&d->reaper_cond, &d->reaper_lock, &ts);
		if (d->reaper_stop)
			break;
		pthread_mutex_unlock(&d->reaper_lock);
		pthread_mutex_lock(&d->lock);
		uint64_t got = dirty_ring__harvest_all(d, -1);
		interval = dirty_ring__next_interval(d, got);
		d->stats.reaper_runs++;
		d->stats.reaper_interval_ms = interval;
		pthread_mutex_unlock(&d->lock);
		pthread_mutex_lock(&d->reaper_lock);
	}
	pthread_mutex_unlock(&d->reaper_lock);
	return NULL;
}

int dirty_ring__start_reaper(struct dirty *d)
{
	pthread_cond_destroy(&d->reaper_cond);
	time__cond_init(&d->reaper_cond);
	d->reaper_stop = false;
	reaper_policy__init(&d->reaper_policy, d->mode);
	int rc = pthread_create(&d->reaper, NULL, dirty_ring__reaper, d);
	if (rc)
		return -rc;
	d->reaper_running = true;
	return 0;
}

void dirty_ring__stop_reaper(struct dirty *d)
{
	if (!d->reaper_running)
		return;
	pthread_mutex_lock(&d->reaper_lock);
	d->reaper_stop = true;
	pthread_cond_broadcast(&d->reaper_cond);
	pthread_mutex_unlock(&d->reaper_lock);
	pthread_join(d->reaper, NULL);
	d->reaper_running = false;
}
