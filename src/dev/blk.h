/* virtio-blk (virtio 1.x section 5.2) on the virtio-pci transport: one
 * request queue (BLK_QUEUE_SIZE entries) over a raw image (dev/blkfile.h).
 *
 * Features offered: VERSION_1, SIZE_MAX, SEG_MAX, BLK_SIZE (the logical
 * block size), TOPOLOGY, FLUSH when the write cache is on (write-cache=on,
 * QEMU's default; off: every write is followed by fdatasync), RO for a
 * read-only image, WRITE_ZEROES on a writable one, DISCARD with
 * discard=unmap (holes punched with fallocate).  Configuration: struct
 * virtio_blk_config up to write_zeroes_may_unmap (BLK_CFG_SIZE bytes).
 *
 * Requests: a 16-byte header (type, reserved, sector) in the readable
 * buffers, the data, and the status byte as the last byte of the last
 * writable buffer.  IN, OUT, FLUSH, GET_ID (the serial, 20 bytes, zero
 * padded), DISCARD and WRITE_ZEROES (segments of 16 bytes, at most
 * BLK_MAX_SEGS, each checked); any other type gets UNSUPP.  IOERR for a
 * sector or length outside the image or not aligned to the logical
 * block size, data on the wrong side (writable data for a write, readable
 * for a read), a request over BLK_REQ_MAX bytes, a write to a read-only
 * image, a header too short, and whatever the kernel refused.  A chain
 * without any writable byte has nowhere for a status: it is returned
 * with length 0 and counted.
 *
 * Threads and locks: requests are taken from the queue with the device
 * lock (vp.lock) held, on whichever thread notified (the device's ioevent
 * thread, or a vCPU), and handed to the backend's workers; reads, writes,
 * flushes and fallocate run there without the lock.  A completion takes
 * the lock, marks the data it read and the status byte through
 * virtio_mem.mark, returns the chain on the used ring and raises the
 * interrupt.  A driver reset waits for the requests in flight (their
 * data goes where the driver had said; their chains are not returned).
 * The counters are atomics: QMP never takes vp.lock (a device thread may
 * hold it while it waits for a page a post-copy destination lacks). */
#ifndef KMIG_DEV_BLK_H
#define KMIG_DEV_BLK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"
#include "dev/blkfile.h"
#include "dev/virtio_pci.h"
#include "state/state.h"

#define VIRTIO_ID_BLOCK 2
#define BLK_F_SIZE_MAX 1
#define BLK_F_SEG_MAX 2
#define BLK_F_RO 5
#define BLK_F_BLK_SIZE 6
#define BLK_F_FLUSH 9
#define BLK_F_TOPOLOGY 10
#define BLK_F_DISCARD 13
#define BLK_F_WRITE_ZEROES 14

#define BLK_T_IN 0
#define BLK_T_OUT 1
#define BLK_T_FLUSH 4
#define BLK_T_GET_ID 8
#define BLK_T_DISCARD 11
#define BLK_T_WRITE_ZEROES 13
#define BLK_S_OK 0
#define BLK_S_IOERR 1
#define BLK_S_UNSUPP 2

#define BLK_HDR_LEN 16
#define BLK_SEG_LEN 16               /* one discard / write-zeroes segment */
#define BLK_ID_LEN 20
#define BLK_CFG_SIZE 60
#define BLK_QUEUE_SIZE 256
#define BLK_SEG_MAX 126              /* data buffers of one request */
#define BLK_SIZE_MAX (1u << 20)      /* bytes in one of them (advertised) */
#define BLK_REQ_MAX (8u << 20)       /* bytes of data in one request (enforced) */
#define BLK_MAX_SEGS BLKFILE_MAX_RANGES
#define BLK_MAX_RANGE_SECTORS (1u << 22) /* per discard / write-zeroes segment */

struct blk_stats {
	uint64_t rd_ops, rd_bytes, wr_ops, wr_bytes;
	uint64_t flush_ops, discard_ops, write_zeroes_ops, get_id_ops;
	uint64_t io_errors;          /* the backend failed a request */
	uint64_t bad_requests;       /* refused with IOERR before any I/O */
	uint64_t unsupported;        /* UNSUPP */
	uint64_t no_status;          /* chains with no byte for a status */
	uint64_t inflight;           /* now */
};

struct blk_conf {
	struct ram *ram;
	void (*mark)(void *ctx, uint64_t gpa, uint64_t len); /* dirty__mark; may be NULL */
	void *mark_ctx;
	virtio_irq_fn irq;
	void *irq_ctx;
	uint8_t irq_line;
	uint64_t bar_gpa;
	struct blkfile *file;        /* not owned */
	uint32_t logical_block_size; /* 512..65536, a power of two */
	bool writeback;              /* offer FLUSH (write-cache=on) */
	bool discard;                /* offer DISCARD (discard=unmap) */
	char serial[BLK_ID_LEN + 1];
};

struct blk;

int blk__create(struct blk **out, const struct blk_conf *conf) KMIG_MUST_CHECK;
/* The caller drained first (no request in flight). */
void blk__destroy(struct blk *b);
struct pci_dev *blk__pci(struct blk *b);
struct virtio_pci *blk__transport(struct blk *b);

/* Waits until every request taken from the queue has completed (for
 * ever with timeout_ns 0), then flushes what was written (fdatasync).
 * 0, -ETIMEDOUT (still busy: a request waits on a page a post-copy
 * destination lacks?) or the flush's -errno.  The caller keeps new
 * requests out (the VM is paused and the device's thread held). */
int blk__drain(struct blk *b, uint64_t timeout_ns) KMIG_MUST_CHECK;
/* Never takes vp.lock. */
void blk__get_stats(struct blk *b, struct blk_stats *out);

/* STATE_DEV_BLK (instance 0): transport, configuration, the image's size
 * (the destination's must be the same).  Waits for requests in flight
 * (a save happens with the VM paused and drained: there are none). */
int blk__save(struct blk *b, state_put_fn put, void *ctx) KMIG_MUST_CHECK;
int blk__load(struct blk *b, const void *data, size_t len, char *why, size_t whylen) KMIG_MUST_CHECK;

#endif
