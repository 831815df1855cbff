/* The destination's side of a migration that carries the disk
 * (x-block-migration; docs/protocol.md "DISK"): the DISK records written
 * into this VM's own image.
 *
 * INFO first: the image must exist with the source's size and be
 * writable, and this process must get its write lock (so an image the
 * source itself holds, shared storage given by mistake, is refused
 * before a byte is written).  Then the image is marked incomplete
 * (dev/blkfile.h: PATH.kmig-incomplete, which `kmig run` refuses) and
 * made all zero, so the source's holes, never sent, read as zero here.
 * DATA and ZERO records are checked against the image and written at
 * once.  With x-verify (INFO's checksum flag) the sector digests of what
 * was written are kept (mig/disksum.h) and SUM, after the last DATA, must
 * match their sum.  disk_in__complete, once the guest is this VM's,
 * flushes the image and removes the marker; a migration that fails
 * leaves it.
 *
 * One thread (the incoming migration's). */
#ifndef KMIG_MIG_RECV_DISK_IN_H
#define KMIG_MIG_RECV_DISK_IN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"
#include "mig/disksum.h"
#include "mig/wire/proto.h"

struct blkfile;

struct disk_in {
	struct blkfile *file;       /* NULL: this VM has no disk */
	bool started;               /* INFO came */
	uint8_t *buf;               /* PROTO_DISK_MAX_DATA, 4096-aligned (O_DIRECT) */
	uint64_t data_bytes, zero_bytes, records;
	uint64_t data_chunks, zero_chunks;  /* DATA and ZERO records written */
	uint64_t wire_bytes;        /* every DISK record's size, header included */
	bool want_sum, sum_ok;      /* INFO announced SUM; it came and matched */
	uint64_t wb_bytes;          /* data written since the last write-back kick */
	struct disksum sum;
};

void disk_in__init(struct disk_in *d, struct blkfile *file);
void disk_in__free(struct disk_in *d);
/* 0, or -errno with why set (nothing written for a record refused). */
int disk_in__record(struct disk_in *d, const struct proto_disk *r, char *why,
		    size_t whylen) KMIG_MUST_CHECK;
/* query-migrate's "disk" on this side: the image's size and what came. */
void disk_in__stats(const struct disk_in *d, uint64_t *total, uint64_t *transferred,
		    uint64_t *data_chunks, uint64_t *zero_chunks, uint64_t *data_bytes);
/* After the last record, the guest this VM's: flush, then no marker.  0
 * without INFO. */
int disk_in__complete(struct disk_in *d, char *why, size_t whylen) KMIG_MUST_CHECK;

#endif
