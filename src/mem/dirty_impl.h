/* Internals shared by dirty.c (common + bitmap) and dirty_ring.c. */
#ifndef KMIG_MEM_DIRTY_IMPL_H
#define KMIG_MEM_DIRTY_IMPL_H

#include <linux/kvm.h>
#include <pthread.h>
#include <stdatomic.h>

#include "mem/dirty.h"
#include "mem/dirtyrate.h"
#include "mem/ram.h"

/* One vCPU's ring (ring backend). */
struct dirty_vring {
	struct kvm_dirty_gfn *gfns;
	uint32_t next;               /* next entry to harvest; under d->lock */
	atomic_ullong full_exits;    /* KVM_EXIT_DIRTY_RING_FULL, since creation */
};

struct dirty {
	struct dirty_host host;
	struct ram *ram;
	enum dirty_backend backend;
	enum reaper_mode mode;
	bool active;                 /* atomic: tracking on */
	bool manual_protect, initially_set;

	pthread_mutex_t users_lock;  /* guards users */
	unsigned users;              /* dirty__start calls not yet stopped */
	pthread_mutex_t lock;        /* serialises harvests, syncs, stats */
	struct bitmap acc;           /* harvested since the last sync */
	struct bitmap vmm;           /* written by the VMM since the last sync */
	struct bitmap period;        /* ring: pages seen in the current rate period */
	uint64_t *kvm_bitmap;        /* bitmap backend: buffer for one slot's log */
	/* deferred clear: pages reported and not re-protected, and which
	 * chunks (block b's chunk k is bit chunk_base[b] + k) have any */
	struct bitmap pending;
	struct bitmap pending_chunks;
	uint64_t chunk_pages;
	uint64_t chunk_base[RAM_MAX_BLOCKS];
	bool any_pending;
	uint64_t last_sync_end_ns;
	struct dirtyrate est;        /* ring: new pages per vCPU per period */
	uint64_t *vcpu_entries;      /* ring: entries harvested per vCPU, ever */
	struct dirty_vring *rings;   /* ring: host.nr_vcpus */
	struct dirty_stats stats;

	/* reaper (ring backend) */
	pthread_t reaper;
	bool reaper_running, reaper_stop;
	pthread_mutex_t reaper_lock;
	pthread_cond_t reaper_cond;
	uint64_t reaper_full_seen;   /* ring-full exits seen at the previous run */
	struct reaper_policy reaper_policy;
};

int dirty_ring__map(struct dirty *d);
/* Harvests every vCPU ring into acc and resets them; d->lock held.
 * Returns entries harvested.  only: harvest just this vCPU (-1: all). */
uint64_t dirty_ring__harvest_all(struct dirty *d, int only);
void dirty_ring__unmap(struct dirty *d);
/* KVM_EXIT_DIRTY_RING_FULL exits of every vCPU since creation. */
uint64_t dirty_ring__full_exits(struct dirty *d);
int dirty_ring__start_reaper(struct dirty *d);
void dirty_ring__stop_reaper(struct dirty *d);
/* Records a rate measurement; d->lock held. */
void dirty__rate_update(struct dirty *d, uint64_t pages, uint64_t interval_ns);

#endif
