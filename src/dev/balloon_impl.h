/* Internals of the balloon device (balloon.c, balloon_hint.c,
 * balloon_state.c).  Every field below vp is under vp.lock unless noted. */
#ifndef KMIG_DEV_BALLOON_IMPL_H
#define KMIG_DEV_BALLOON_IMPL_H

#include <pthread.h>

#include "dev/balloon.h"

struct balloon {
	struct virtio_pci vp;          /* vp.lock is the device lock */
	struct ram *ram;
	struct virtio_mem mem;
	/* configuration space */
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
	struct balloon_stats stats;
	balloon_change_fn on_change;
	void *on_change_ctx;
};

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
