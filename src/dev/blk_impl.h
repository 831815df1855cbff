/* Internals of the virtio-blk device (blk.c, blk_req.c, blk_state.c).
 * Fields below vp are under vp.lock unless noted. */
#ifndef KMIG_DEV_BLK_IMPL_H
#define KMIG_DEV_BLK_IMPL_H

#include <pthread.h>

#include "dev/blk.h"

struct blk;

/* One request between the queue and its completion. */
struct blk_req {
	struct blkfile_req io;         /* first: the backend hands it back */
	struct blk *b;
	uint64_t gen;                  /* the device's generation when taken */
	uint16_t head;
	uint8_t type;
	uint8_t *status;               /* host address of the status byte */
	uint64_t status_gpa;
	uint64_t bytes;                /* data bytes */
	unsigned niov;
	struct iovec iov[VIRTQ_MAX_CHAIN];
	uint64_t gpa[VIRTQ_MAX_CHAIN]; /* of each iov (IN: what to mark) */
	struct blk_req *next_free;
};

struct blk {
	struct virtio_pci vp;          /* vp.lock is the device lock */
	struct virtio_mem mem;
	struct blkfile *file;
	uint64_t capacity;             /* 512-byte sectors */
	uint32_t lbs;                  /* logical block size */
	bool read_only, writeback, discard;
	char serial[BLK_ID_LEN];       /* zero padded */
	uint64_t gen;                  /* bumped by a reset: older completions return nothing */
	unsigned inflight;             /* requests handed to the backend */
	pthread_cond_t idle;           /* with vp.lock: inflight reached 0 */
	struct blk_req *reqs;          /* BLK_QUEUE_SIZE of them */
	struct blk_req *free;
	enum blk_on_error werror, rerror;
	void (*on_error)(void *ctx, const struct blk_io_error *e);
	void *error_ctx;
	struct blk_req *kept, *kept_tail; /* failed with STOP, in order (next_free links them) */
	unsigned nkept;
	bool restart;                  /* submit the kept ones at the next notification */
	int io_status;                 /* atomic: enum blk_io_status */
	struct virtq_chain chain;      /* the one being parsed */
	struct blk_stats stats;        /* atomics: BLK_STAT_ADD */
};

#define BLK_STAT_ADD(b, f, v) __atomic_fetch_add(&(b)->stats.f, (v), __ATOMIC_RELAXED)

/* blk_req.c: lock held.  Turns the chain just taken into r, or answers
 * it at once: 1 the request goes to the backend (r filled), 0 it was
 * answered (status written, chain returned).  *used: a chain was
 * returned. */
int blk__parse(struct blk *b, const struct virtq_chain *c, struct blk_req *r, bool *used);
/* Lock held.  Writes the status byte (and marks it), returns the chain
 * with len bytes written. */
void blk__answer(struct blk *b, uint16_t head, uint8_t *status, uint64_t status_gpa,
		 uint8_t s, uint32_t len);

/* blk.c, lock held: hands r to the backend, or answers it if refused
 * (true: a chain was returned). */
bool blk__submit(struct blk *b, struct blk_req *r);

/* blk_error.c, lock held. */
/* r failed with res (-errno): fills e, sets the io-status for STOP. */
enum blk_err_action blk__on_failure(struct blk *b, const struct blk_req *r, int res,
				    struct blk_io_error *e);
/* r joins the end of the kept list, unanswered. */
void blk__keep(struct blk *b, struct blk_req *r);
/* A reset or a state load: the kept requests go back to the free list. */
void blk__drop_kept(struct blk *b);
/* After blk__restart: submits the kept requests, in order (*used: a
 * chain was returned). */
void blk__resubmit_kept(struct blk *b, bool *used);

#endif
