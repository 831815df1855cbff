/* x-verify of a disk carried in the stream (x-block-migration): one
 * digest per 512-byte sector and their sum (proto.h, "the disk's sum"),
 * kept up to date as sectors change, so neither side hashes its image in
 * the downtime.
 *
 * A sector's digest is known (valid) or not: the source knows the holes
 * its scan found and every sector a guest write told it of (from the
 * write's own data), and learns the others from the reads that send them
 * (disksum__learn: only sectors not known yet, so a read never overwrites
 * what a write said).  The destination starts with every sector zero.
 * Not thread-safe: the caller locks. */
#ifndef KMIG_MIG_DISKSUM_H
#define KMIG_MIG_DISKSUM_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "base/bitmap.h"
#include "base/log.h"

struct disksum {
	uint64_t nsectors;
	uint64_t *dig;              /* per sector; 0 while not known */
	struct bitmap known;
	uint64_t sum;               /* of the known digests */
};

/* Every sector zero and known (zero = true), or none known. */
int disksum__init(struct disksum *s, uint64_t nsectors, bool zero) KMIG_MUST_CHECK;
void disksum__free(struct disksum *s);
/* Sectors [first, first + n) hold data (n * 512 bytes gathered from the
 * iovecs, or zeros when iov is NULL) / are no longer known. */
void disksum__set(struct disksum *s, uint64_t first, uint64_t n, const struct iovec *iov,
		  unsigned niov);
void disksum__forget(struct disksum *s, uint64_t first, uint64_t n);
/* Sectors of [first, first + n) not known yet: their digests from data. */
void disksum__learn(struct disksum *s, uint64_t first, uint64_t n, const uint8_t *data);
/* Sectors not known. */
uint64_t disksum__unknown(const struct disksum *s);

#endif
