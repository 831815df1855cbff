/* The source's side of a migration that carries the disk
 * (x-block-migration; docs/protocol.md "DISK"): which parts of the image
 * are still to send.
 *
 * The image is tracked in DISK_OUT_BLOCK blocks (4 KiB: a guest's
 * random 4 KiB write costs 4 KiB at the switchover, not a whole chunk)
 * and sent in runs of them that never cross a DISK_OUT_CHUNK boundary
 * (64 KiB, one read and one record).  start registers a write hook with
 * the image's backend (dev/blkfile.h), so every range a guest request
 * changed, from then on, sets its blocks in `dirty` once the kernel did
 * the write and before the guest hears of it; then the bulk pass's
 * blocks are put in `todo`: those that may hold data (SEEK_DATA), never
 * the holes (the destination clears its image first).  collect moves
 * dirty into todo (each round, and after the guest stopped and its
 * requests drained: then nothing can be missed); take clears a run's
 * bits before reading it, so a write that lands during the read sets
 * them again and the blocks go again next round.
 *
 * With x-verify the sector digests (mig/disksum.h) are kept too: the
 * holes the scan found are known zero, each write tells its sectors'
 * digests from its own data, and take learns the others from what it
 * read, unless a write to the chunk completed meanwhile (its generation
 * moved); disk_out__sum learns what is still not known (chunks the
 * passes never read) and gives the sum.
 *
 * Threads: the hook on the backend's workers; everything else on the
 * migration thread; the digests and generations under lock. */
#ifndef KMIG_MIG_SEND_DISK_OUT_H
#define KMIG_MIG_SEND_DISK_OUT_H

#include <stdbool.h>
#include <stdint.h>

#include <pthread.h>

#include "base/bitmap.h"
#include "base/log.h"
#include "mig/disksum.h"

#define DISK_OUT_CHUNK (64u << 10)
#define DISK_OUT_BLOCK 4096u
#define DISK_OUT_CHUNK_BLOCKS (DISK_OUT_CHUNK / DISK_OUT_BLOCK)

struct blkfile;

struct disk_out {
	struct blkfile *file;
	uint64_t size, nchunks, nblocks;
	struct bitmap dirty;         /* per block: atomic bits, set by the hook */
	struct bitmap todo;          /* per block: the migration thread's */
	uint8_t *buf;                /* one chunk, 4096-aligned */
	bool hooked;
	uint64_t dirtied;            /* blocks collect took from dirty, in all */
	bool sum_on;                 /* x-verify: the digests below */
	pthread_mutex_t lock;
	struct disksum sum;
	uint32_t *gen;               /* per chunk: writes reported */
};

/* 0 or -errno (no memory, or the image cannot be scanned); sum: keep
 * the digests. */
int disk_out__start(struct disk_out *d, struct blkfile *f, bool sum) KMIG_MUST_CHECK;
/* Unhooks and frees; idempotent. */
void disk_out__stop(struct disk_out *d);
/* todo |= dirty, dirty cleared: the blocks newly put in todo. */
uint64_t disk_out__collect(struct disk_out *d);
/* Bytes in todo and dirty. */
uint64_t disk_out__pending(const struct disk_out *d);
/* Bytes in dirty (written since the last collect). */
uint64_t disk_out__dirty_bytes(const struct disk_out *d);
/* The next run in todo at or after block *block: its blocks in todo
 * that follow one another inside one chunk, cleared and read into d->buf;
 * *off, *len its range (the image's last block may be short), *zero
 * whether it reads as all zero; *block moves past it.  0, -ENOENT when
 * todo is empty from *block on, or the read's -errno (the run stays in
 * todo). */
int disk_out__take(struct disk_out *d, uint64_t *block, uint64_t *off, uint64_t *len,
		   bool *zero) KMIG_MUST_CHECK;
/* x-verify, the guest stopped and its requests drained: the sum of the
 * image as it is (sectors not known yet are read now).  0 or the read's
 * -errno. */
int disk_out__sum(struct disk_out *d, uint64_t *sum) KMIG_MUST_CHECK;

#endif
