/* Dirty page tracking: one interface, two KVM backends.
 *   bitmap: KVM_GET_DIRTY_LOG, with KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2
 *           (+ KVM_DIRTY_LOG_INITIALLY_SET) and chunked KVM_CLEAR_DIRTY_LOG
 *           when available;
 *   ring:   per-vCPU dirty rings (KVM_CAP_DIRTY_LOG_RING_ACQ_REL, else
 *           KVM_CAP_DIRTY_LOG_RING), harvested by a sync, by the reaper
 *           thread between syncs and by a vCPU on KVM_EXIT_DIRTY_RING_FULL.
 * Pages are numbered VM-wide (struct ram: block first_page + offset).
 *
 * The tracker knows its VM only through struct dirty_host (fds, RAM, a
 * kick callback): mem/ never calls up into kvm/.
 *
 * Deferred clear (bitmap backend with manual protect): a sync with
 * DIRTY_SYNC_DEFER_CLEAR reports pages without write-protecting them
 * again; dirty__clear_before_read re-protects a chunk's reported pages
 * just before the caller reads the first page of that chunk.  So starting
 * to log (KVM_DIRTY_LOG_INITIALLY_SET: every page reported, nothing
 * protected) touches no guest page at once: the bulk pass protects RAM
 * chunk by chunk as it sends, and a chunk it never reads stays as it is.
 *
 * Threads: dirty__sync / start / stop / clear_before_read come from one
 * controlling thread (the migration thread); dirty__on_ring_full from
 * vCPU threads; dirty__mark from any thread.  Harvesting is serialised
 * inside. */
#ifndef KMIG_MEM_DIRTY_H
#define KMIG_MEM_DIRTY_H

#include <stdbool.h>
#include <stdint.h>

#include "base/bitmap.h"
#include "base/log.h"
#include "mem/reaper_policy.h"

struct ram;
struct dirty;

/* Granularity of the deferred clear: 256 MiB of 4 KiB pages. */
#define DIRTY_CLEAR_CHUNK_PAGES (64ull * 1024)

/* What the tracker needs from its VM. */
struct dirty_host {
	int kvm_fd, vm_fd;
	struct ram *ram;
	unsigned nr_vcpus;
	const int *vcpu_fds;         /* nr_vcpus vCPU fds: the rings are mapped from them */
	uint32_t ring_entries;       /* per vCPU ring; 0 = bitmap backend */
	/* Makes every running vCPU leave KVM_RUN once; returns when each has
	 * (ring entries in flight are then in the rings). */
	void (*kick_all)(void *ctx);
	void *kick_ctx;
	uint64_t clear_chunk_pages;  /* a multiple of 64; 0 = DIRTY_CLEAR_CHUNK_PAGES */
};

enum dirty_backend { DIRTY_BITMAP, DIRTY_RING };

struct dirty_stats {
	uint64_t syncs;              /* dirty__sync calls since start */
	uint64_t harvested;          /* ring entries harvested since start */
	uint64_t reaper_runs;
	uint64_t ring_full_exits;    /* all vCPUs, since VM start */
	uint64_t last_sync_ns;       /* duration of the last sync */
	uint64_t reaper_interval_ms; /* current reaper interval */
	uint64_t rate_pages;         /* current dirty rate, pages/s (ring: per period) */
	uint64_t peak_rate_pages;    /* peak since the last dirty__take_peak */
	uint64_t clear_calls;        /* KVM_CLEAR_DIRTY_LOG calls since start */
	uint64_t cleared_pages;      /* pages those calls re-protected */
	uint64_t pending_pages;      /* deferred: reported, not yet re-protected */
	uint64_t users;              /* dirty__start calls not yet stopped */
};

/* The most entries per vCPU ring KVM offers with acquire/release semantics
 * (KVM_CAP_DIRTY_LOG_RING_ACQ_REL) on vm_fd; 0 when it has no such ring. */
uint32_t dirty__ring_acq_rel_max(int vm_fd);
/* Enables the ring capability on vm->vm_fd; must run before vCPUs exist.
 * entries 0 = bitmap backend.  Returns -errno, -ENOTSUP if KVM lacks it. */
int dirty__enable_ring_cap(int vm_fd, uint32_t entries, bool *acq_rel) KMIG_MUST_CHECK;
/* Creates the tracker (after the vCPUs; maps their rings).  host is
 * copied; its ram and kick_ctx must outlive the tracker. */
int dirty__create(struct dirty **out, const struct dirty_host *host,
		  enum reaper_mode mode) KMIG_MUST_CHECK;
void dirty__destroy(struct dirty *d);
enum dirty_backend dirty__backend(const struct dirty *d);

/* Starts tracking: memslots get KVM_MEM_LOG_DIRTY_PAGES, the reaper runs.
 * Cheap: no vCPU is paused.  Counted: several users (migration,
 * dirty-limit, calc-dirty-rate) may hold tracking on; each start needs
 * one stop, and tracking goes off with the last. */
int dirty__start(struct dirty *d) KMIG_MUST_CHECK;
/* Stops tracking and the reaper; memslots drop logging so KVM can map
 * huge pages again.  Safe to call when not started. */
int dirty__stop(struct dirty *d) KMIG_MUST_CHECK;
bool dirty__active(const struct dirty *d);

enum dirty_sync_flags {
	/* first make every vCPU leave KVM_RUN so entries still in flight
	 * reach the rings (ring backend; the migration engine skips it while
	 * throttled and kicks once before stop-and-copy) */
	DIRTY_SYNC_KICK = 1u << 0,
	/* bitmap backend with manual protect: leave the reported pages
	 * unprotected until dirty__clear_before_read (else: ignored) */
	DIRTY_SYNC_DEFER_CLEAR = 1u << 1,
};
/* ORs every page dirtied since the previous sync (or since start) into
 * dst (npages bits) and, unless deferred, re-protects them.  flags: enum
 * dirty_sync_flags.  Returns the number of pages newly set in dst or
 * -errno. */
int64_t dirty__sync(struct dirty *d, struct bitmap *dst, unsigned flags) KMIG_MUST_CHECK;
/* Re-protects the pages of page's chunk that a deferred sync reported and
 * no call has re-protected since: call it before reading any page of the
 * chunk (to send it, or to decide not to), so a write after the read is
 * logged.  Cheap when nothing is pending there.  Returns 0 or -errno. */
int dirty__clear_before_read(struct dirty *d, uint64_t page) KMIG_MUST_CHECK;
/* Whether KVM logs writes to every memslot (KVM_MEM_LOG_DIRTY_PAGES set
 * on all of them): what a user checks after a migration ended. */
bool dirty__logging(const struct dirty *d);

/* Records a write by the VMM itself into guest RAM [gpa, gpa + len). */
void dirty__mark(struct dirty *d, uint64_t gpa, uint64_t len);

/* Called on vCPU `vcpu`'s thread after KVM_EXIT_DIRTY_RING_FULL. */
void dirty__on_ring_full(struct dirty *d, unsigned vcpu);

void dirty__get_stats(struct dirty *d, struct dirty_stats *out);
/* Returns the peak dirty rate (pages/s) and starts a new peak window. */
uint64_t dirty__take_peak(struct dirty *d);
/* The guest's speed changed (a new throttle or dirty limit): forgets the
 * rates measured so far, so the next dirty__take_peak reports only periods
 * that began afterwards (0 until one has closed: not known yet).  Without
 * it a peak measured before a throttle would be read as a rate under it. */
void dirty__rate_restart(struct dirty *d);
/* Ring backend: one vCPU's rate of the last closed period (pages newly
 * dirtied per second, a page counted once per period), and the ring
 * entries harvested from it since the VM started.  0 on the bitmap. */
uint64_t dirty__vcpu_rate(struct dirty *d, unsigned vcpu);
uint64_t dirty__vcpu_entries(struct dirty *d, unsigned vcpu);
/* Ring backend: harvests every ring now (rates stay current between
 * syncs); no-op on the bitmap or when tracking is off. */
void dirty__harvest(struct dirty *d);

#endif
