/* Internals of the balloon device (balloon.c, balloon_hint.c,
 * balloon_state.c).  Every field below vp is under vp.lock unless noted.
 *
 * QMP reads and sets what it needs without vp.lock (num_pages, actual,
 * stats: atomics; the config interrupt: virtio_pci's irq_lock): on a
 * post-copy destination the lock may be held by a thread waiting for a
 * guest page that has not arrived, for ever while post-copy is paused,
 * and QMP must stay free to recover it. */
#ifndef KMIG_DEV_BALLOON_IMPL_H
#define KMIG_DEV_BALLOON_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "dev/balloon.h"

struct balloon {
	struct virtio_pci vp;          /* vp.lock is the device lock */
	struct ram *ram;
	struct virtio_mem mem;
	atomic_bool hold_discards;     /* balloon__hold_discards */
	/* configuration space; num_pages and actual are atomics (QMP's) */
	uint32_t num_pages, actual, cmd_id, poison_val;
	/* free page hinting */
	uint32_t next_cmd_id;
	bool hint_acked;               /* the driver echoed cmd_id */
	bool hint_stopped;             /* ... and then sent STOP */
	uint64_t hint_last_ns;         /* time of the last accepted hint buffer */
	uint64_t hint_round_pages;     /* pages hinted for cmd_id */
	pthread_cond_t hint_cond;      /* hint progress (with vp.lock) */
	/* page maps, VM-wide page numbers; bits change atomically */
	struct bitmap ballooned, hinted;
	struct balloon_stats stats;    /* atomics: BALLOON_STAT_ADD/SET, loads */
	balloon_change_fn on_change;
	void *on_change_ctx;
};

#define BALLOON_STAT_ADD(b, f, n) __atomic_fetch_add(&(b)->stats.f, (n), __ATOMIC_RELAXED)
#define BALLOON_STAT_SET(b, f, v) __atomic_store_n(&(b)->stats.f, (v), __ATOMIC_RELAXED)

/* balloon.c */
/* The role of queue qi under the negotiated features, or -1; the queue
 * index of a role, or -1 (lock held). */
int balloon__role(const struct balloon *b, unsigned qi);
int balloon__queue(const struct balloon *b, enum balloon_vq role);
int64_t balloon__page_of(const struct balloon *b, uint64_t gpa);
void balloon__discard(struct balloon *b, uint64_t gpa, uint64_t len);
uint64_t balloon__actual_bytes_locked(const struct balloon *b);
/* Pops every available chain of queue qi, hands it to fn, returns it
 * used; a malformed ring marks the device broken (lock held). */
typedef void (*balloon_chain_fn)(struct balloon *b, unsigned qi, const struct virtq_chain *c);
void balloon__drain(struct balloon *b, unsigned qi, balloon_chain_fn fn);
/* balloon_hint.c: one chain of the free page hint queue (lock held). */
void balloon__hint_chain(struct balloon *b, unsigned qi, const struct virtq_chain *c);
void balloon__hint_reset(struct balloon *b);

#endif
