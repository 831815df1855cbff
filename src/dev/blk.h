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
 * hold it while it waits for a page a post-copy destination lacks).
 *
 * Errors of the image (QEMU's werror/rerror): when a worker's request
 * fails in the kernel, the policy of its direction (rerror for IN,
 * werror for OUT, FLUSH, DISCARD and WRITE_ZEROES) picks the action
 * (blk__error_action): REPORT answers IOERR, IGNORE answers OK (the data
 * of a failed read is whatever reached guest memory), STOP keeps the
 * request unanswered, in the order the failures came, and sets the
 * io-status (failed, or nospace for ENOSPC).  Each calls conf.on_error
 * on the worker, with no lock of this module held: whoever drives the VM
 * emits BLOCK_IO_ERROR and, for STOP, stops the VM.  Kept requests are
 * not in flight (a drain does not wait for them); blk__restart, called
 * when the VM runs again, marks them for the next queue notification,
 * which submits them again, in order, before it takes new chains (so a
 * retry runs on the thread that notifies, never while the VM's devices
 * are held).  A driver reset drops them; the state section carries them
 * (a migration's destination retries them when the guest runs there).
 * Requests the backend refuses at submission (an inactive image, a write
 * to a read-only one) and malformed ones are answered IOERR, no policy. */
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
	uint64_t kept;               /* now: failed with action STOP, waiting for a retry */
};

/* QEMU's BlockdevOnError: what a failed request does.  werror takes all
 * four (default ENOSPC), rerror all but ENOSPC (default REPORT). */
enum blk_on_error { BLK_ON_ERR_REPORT, BLK_ON_ERR_IGNORE, BLK_ON_ERR_STOP, BLK_ON_ERR_ENOSPC };
/* QEMU's BlockErrorAction: what one failure did. */
enum blk_err_action { BLK_ACT_REPORT, BLK_ACT_IGNORE, BLK_ACT_STOP };
/* QEMU's BlockDeviceIoStatus (query-block io-status). */
enum blk_io_status { BLK_IOS_OK, BLK_IOS_FAILED, BLK_IOS_NOSPACE };

/* One failure, as BLOCK_IO_ERROR reports it. */
struct blk_io_error {
	bool write;                  /* operation: "write" (OUT, FLUSH, DISCARD, WRITE_ZEROES) or "read" */
	enum blk_err_action action;
	int error;                   /* positive errno: nospace is error == ENOSPC */
};

/* ENOSPC stops on ENOSPC and reports anything else.  Pure. */
enum blk_err_action blk__error_action(enum blk_on_error on, int error);
const char *blk_on_error__name(enum blk_on_error on);
const char *blk_err_action__name(enum blk_err_action a);
const char *blk_io_status__name(enum blk_io_status s);

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
	enum blk_on_error werror, rerror;   /* zero: REPORT */
	/* On a worker, no lock of this module held; may be NULL. */
	void (*on_error)(void *ctx, const struct blk_io_error *e);
	void *error_ctx;
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
/* Never takes vp.lock. */
enum blk_io_status blk__io_status(struct blk *b);
/* The VM runs again: the io-status goes back to ok and the kept requests
 * (if any) are submitted again at the next queue notification.  True
 * when there are some: the caller then notifies queue 0 (through the
 * thread that handles the device's notifications). */
bool blk__restart(struct blk *b);

/* STATE_DEV_BLK (instance 0): transport, configuration, the image's size
 * (the destination's must be the same), and the requests kept after an
 * I/O error (section version BLK_STATE_VERSION_KEPT, only while there
 * are some; else BLK_STATE_VERSION_PLAIN, the layout of kmig before
 * them).  Waits for requests in flight (a save happens with the VM paused
 * and drained: there are none).  blk__load takes either version; the
 * kept requests are read again from guest RAM (loaded first) and kept
 * here, retried at the first blk__restart. */
#define BLK_STATE_VERSION_PLAIN 1
#define BLK_STATE_VERSION_KEPT 2
int blk__save(struct blk *b, state_put_fn put, void *ctx) KMIG_MUST_CHECK;
int blk__load(struct blk *b, uint32_t version, const void *data, size_t len, char *why,
	      size_t whylen) KMIG_MUST_CHECK;
/* Requests kept now (never takes vp.lock). */
unsigned blk__kept(struct blk *b);

#endif
