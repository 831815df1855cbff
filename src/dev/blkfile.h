/* The disk's backend: a raw image file (or block device) and the threads
 * that do its I/O off the vCPU and device threads.
 *
 * Why a worker pool and not io_uring: bench/blkio measured both (4 KiB
 * random I/O, one file, this project's 2-core machine with a CI run
 * beside it): buffered on tmpfs the pool did 61k/62k req/s (read/write)
 * at queue depth 1 and 307k/283k at 32, io_uring 148k/96k and 255k/235k;
 * O_DIRECT on the virtual disk the pool (4 threads) did 13k/13k at depth
 * 1 and 32k/30k at 32 (16 threads: 45k/50k), io_uring 19k/16k and
 * 123k/72k.  io_uring wins on O_DIRECT at depth 32.  kmig takes the pool
 * for now because it is plain blocking preadv/pwritev into guest memory:
 * on a post-copy destination a worker that meets a page not yet here
 * just waits on the userfault like a vCPU does, and fdatasync, fallocate
 * and the drain at a pause need no second mechanism.  io_uring is the
 * measured next step for O_DIRECT images at high queue depth.
 *
 * Image locking (QEMU's idea, not its byte layout): open file description
 * locks (F_OFD_SETLK), so they hold between processes and between two
 * opens in one process, and go with the last close.  Byte 101: a shared
 * lock every opener holds while it has the image open.  Byte 100: the
 * permission: an exclusive lock while the image is open writable and
 * active, a shared lock while read-only and active.  So one writer, or
 * any number of readers, and a second writer is refused at start.  An
 * inactive opener (a migration's destination before the switchover, the
 * source after it) holds only byte 101 and may not do I/O.
 *
 * Threads: blkfile__submit from any thread; done runs on a worker, with
 * no lock of this module held.  activate/inactivate/flush from one thread
 * at a time (the migration thread, or start-up), with no request in
 * flight for inactivate (the device drained first). */
#ifndef KMIG_DEV_BLKFILE_H
#define KMIG_DEV_BLKFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "base/log.h"

#define BLKFILE_LOCK_PERM 100
#define BLKFILE_LOCK_USER 101
#define BLKFILE_WORKERS 4
#define BLKFILE_MAX_RANGES 32

enum blkfile_op { BLKFILE_READ, BLKFILE_WRITE, BLKFILE_FLUSH, BLKFILE_DISCARD, BLKFILE_ZERO };

struct blkfile_range {
	uint64_t off, len;
	bool unmap;                   /* BLKFILE_ZERO: may leave a hole */
};

struct blkfile_req {
	enum blkfile_op op;
	uint64_t off;                 /* READ/WRITE: byte offset (caller checked bounds) */
	const struct iovec *iov;      /* READ/WRITE */
	unsigned niov;
	struct blkfile_range ranges[BLKFILE_MAX_RANGES]; /* DISCARD/ZERO */
	unsigned nranges;
	/* On a worker: 0 or -errno (-EIO for a short transfer). */
	void (*done)(struct blkfile_req *r, int res);
	struct blkfile_req *next;     /* the queue's */
};

struct blkfile_conf {
	const char *path;
	bool read_only;               /* O_RDONLY, shared permission lock */
	bool direct;                  /* O_DIRECT (cache.direct=on) */
	bool writethrough;            /* fdatasync after every write (write-cache=off) */
	bool discard_unmap;           /* DISCARD punches holes; else it does nothing */
	bool inactive;                /* --incoming: no permission lock, no I/O until activate */
	unsigned workers;             /* 0: BLKFILE_WORKERS */
};

struct blkfile_stats {
	uint64_t flushes;             /* fdatasync calls that ran */
	uint64_t errors;              /* requests that failed in the kernel */
};

struct blkfile;
/* What a request left in a range it may have changed: the data of its
 * iovecs, zeros, or something not known (it failed part way, or a
 * discard the file system may have ignored). */
enum blkfile_change { BLKFILE_CHANGED_DATA, BLKFILE_CHANGED_ZERO, BLKFILE_CHANGED_UNKNOWN };
/* Told of a range [off, off + len) a request may have changed; iov/niov
 * its data for BLKFILE_CHANGED_DATA (else NULL, 0). */
typedef void (*blkfile_write_fn)(void *ctx, uint64_t off, uint64_t len, enum blkfile_change what,
				 const struct iovec *iov, unsigned niov);

/* Opens, checks (a regular file or block device, size a non-zero multiple
 * of 512) and locks the image, starts the workers.  -errno with err set:
 * "image X is in use by another process (locked)" when the lock is held. */
int blkfile__open(struct blkfile **out, const struct blkfile_conf *c, char *err,
		  size_t errlen) KMIG_MUST_CHECK;
/* The caller has no request in flight. */
void blkfile__close(struct blkfile *f);
uint64_t blkfile__size(const struct blkfile *f);
bool blkfile__read_only(const struct blkfile *f);
const char *blkfile__path(const struct blkfile *f);
/* Alignment O_DIRECT needs for file offsets and lengths (1 when buffered). */
uint32_t blkfile__offset_align(const struct blkfile *f);
bool blkfile__active(const struct blkfile *f);
/* "write", "shared" or "none": the permission lock held now. */
const char *blkfile__lock_name(const struct blkfile *f);
void blkfile__get_stats(struct blkfile *f, struct blkfile_stats *out);

/* Queues r; r->done is called once it ran.  -EROFS (a write to a
 * read-only image) or -EPERM (inactive): refused at once, done not
 * called. */
int blkfile__submit(struct blkfile *f, struct blkfile_req *r) KMIG_MUST_CHECK;
/* fdatasync now if anything was written since the last one. */
int blkfile__flush(struct blkfile *f) KMIG_MUST_CHECK;
/* Gives up the permission lock after a flush (the source at the
 * switchover).  Idempotent. */
int blkfile__inactivate(struct blkfile *f) KMIG_MUST_CHECK;
/* Takes the permission lock (the destination at the switchover, the
 * source when the migration failed) and drops the page cache's view of
 * the image (the other host wrote it).  -EAGAIN with err set when
 * another process holds it.  Idempotent. */
int blkfile__activate(struct blkfile *f, char *err, size_t errlen) KMIG_MUST_CHECK;

/* ---- for a migration that carries the image (blkfile_mig.c) ----
 * fn (NULL: none) is told of every range a write, discard (with
 * discard_unmap) or write-zeroes request may have changed, on a worker, after the kernel
 * did it and before the request's done; with the backend's queue lock
 * held (fn must be quick and take no lock that is held around
 * blkfile__submit).  Once this returns, the old hook is never called. */
void blkfile__set_write_hook(struct blkfile *f, blkfile_write_fn fn, void *ctx);
/* Synchronous I/O on the caller's thread, whatever the image's state (the
 * caller knows it may: the source reads while the guest writes, the
 * destination writes before the guest runs).  buf aligned to 4096 and
 * off, len to blkfile__offset_align; the range inside the image, else
 * -EINVAL. */
int blkfile__read_at(struct blkfile *f, void *buf, size_t len, uint64_t off) KMIG_MUST_CHECK;
int blkfile__write_at(struct blkfile *f, const void *buf, size_t len,
		      uint64_t off) KMIG_MUST_CHECK;
/* Starts the kernel writing the image's dirty cached pages to the disk
 * and returns without waiting for them (sync_file_range WRITE over the
 * whole file: pages already clean cost nothing), so that a later
 * blkfile__flush has little left to do.  Advice only: 0, or -errno where
 * the kernel refused (nothing to undo). */
int blkfile__writeback(struct blkfile *f);
/* The range reads as zero afterwards (a hole where the file system can
 * punch one, else zeros written). */
int blkfile__zero_at(struct blkfile *f, uint64_t off, uint64_t len) KMIG_MUST_CHECK;
/* The first range at or after off that may hold data: [*start, *end)
 * (SEEK_DATA/SEEK_HOLE; the whole rest of the image where the file
 * system cannot tell); 0, or -ENXIO when only holes are left. */
int blkfile__next_data(struct blkfile *f, uint64_t off, uint64_t *start,
		       uint64_t *end) KMIG_MUST_CHECK;
/* The marker of a destination image whose migration did not complete:
 * the file PATH.kmig-incomplete beside the image.  mark creates it (and
 * syncs its directory entry), unmark removes it; marked: whether it is
 * there for path. */
int blkfile__mark_incomplete(struct blkfile *f) KMIG_MUST_CHECK;
int blkfile__unmark_incomplete(struct blkfile *f) KMIG_MUST_CHECK;
bool blkfile__marked_incomplete(const char *path);
#define BLKFILE_INCOMPLETE_SUFFIX ".kmig-incomplete"

#endif
