/* Internals of the image backend (blkfile.c, blkfile_mig.c). */
#ifndef KMIG_DEV_BLKFILE_IMPL_H
#define KMIG_DEV_BLKFILE_IMPL_H

#include <pthread.h>

#include "dev/blkfile.h"

#define BLKFILE_MAX_WORKERS 64
#define BLKFILE_ZERO_CHUNK (1u << 20)
#define BLKFILE_DEFAULT_ALIGN 4096u

struct blkfile {
	int fd;
	char path[4096];
	uint64_t size;
	bool read_only, direct, writethrough, discard_unmap;
	uint32_t mem_align, off_align;      /* O_DIRECT's (1 when buffered) */
	bool active;                        /* atomic */
	bool dirty;                         /* atomic: written since the last fdatasync */
	struct blkfile_stats stats;         /* atomics */
	pthread_mutex_t lock;               /* the queue */
	pthread_cond_t cond;
	struct blkfile_req *head, *tail;
	bool stopping;
	unsigned nworkers;
	pthread_t workers[BLKFILE_MAX_WORKERS];
	uint8_t *zeros;                     /* BLKFILE_ZERO_CHUNK, aligned */
	/* under lock: told of every range a request may have written */
	blkfile_write_fn on_write;
	void *on_write_ctx;
};

/* blkfile.c: preadv/pwritev until every byte moved (a short transfer is
 * -EIO); zeros written over a range. */
int blkfile__rw_loop(struct blkfile *f, bool wr, struct iovec *iov, unsigned n, uint64_t off);
int blkfile__write_zeroes(struct blkfile *f, uint64_t off, uint64_t len);

#endif
