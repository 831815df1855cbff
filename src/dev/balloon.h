/* virtio-balloon (virtio 1.x section 5.5) on the virtio-pci transport,
 * with free page hinting and free page reporting.
 *
 * Queues, at QEMU's fixed indices whatever the driver negotiates:
 *   0 inflate, 1 deflate, 2 stats (present, never consumed),
 *   3 free page hints, 4 free page reporting.
 * Features offered: VERSION_1, STATS_VQ, FREE_PAGE_HINT, REPORTING.
 * Configuration (16 bytes, little-endian): num_pages (target, set by the
 * host), actual (written by the driver), free_page_hint_cmd_id (host),
 * poison_val (driver).
 *
 * Inflate: each readable buffer is an array of u32 PFNs (4 KiB frames);
 * a frame inside guest RAM is marked ballooned, discarded from the host
 * (MADV_DONTNEED: it reads as zero afterwards) and reported as written
 * (virtio_mem.mark), so a migration that already sent it sends it again
 * (as a zero page).  Frames outside RAM are ignored.  Deflate clears the
 * mark; the frame stays zero until the guest writes it.  A device reset
 * deflates everything.
 *
 * Free page hinting: balloon__hint_start publishes a new command id
 * (increasing, >= BALLOON_CMD_ID_MIN) and bumps the configuration
 * generation.  On the hint queue the driver sends a readable u32 with the
 * id it saw, then device-writable buffers, each one free range
 * [addr, addr + len), then a readable STOP (0).  Ranges count only after
 * the driver echoed the current id and before the host moves the id on;
 * everything else (stale ids, ranges outside RAM, short buffers) is
 * returned unused and ignored.  Whole pages of an accepted range are set
 * in the hinted bitmap, which the sender consults during the bulk pass.
 * balloon__hint_done (id DONE = 1) lets the guest reuse the pages and
 * clears the bitmap; by then dirty tracking is on, so reuse is caught.
 *
 * Free page reporting: each device-writable buffer on the reporting queue
 * is a free range; its whole pages are discarded and marked written.
 *
 * Threads: the queues run on the vCPU thread that notified; QMP calls come
 * from the loop thread; hint calls from the migration thread.  The device
 * lock (b->vp.lock) serialises them.  balloon__skip is lock-free. */
#ifndef KMIG_DEV_BALLOON_H
#define KMIG_DEV_BALLOON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/bitmap.h"
#include "base/log.h"
#include "dev/virtio_pci.h"
#include "state/state.h"

#define VIRTIO_ID_BALLOON 5
#define BALLOON_F_MUST_TELL_HOST 0
#define BALLOON_F_STATS_VQ 1
#define BALLOON_F_DEFLATE_ON_OOM 2
#define BALLOON_F_FREE_PAGE_HINT 3
#define BALLOON_F_PAGE_POISON 4
#define BALLOON_F_REPORTING 5

#define BALLOON_CMD_ID_STOP 0
#define BALLOON_CMD_ID_DONE 1
#define BALLOON_CMD_ID_MIN 0x80000000u

#define BALLOON_CFG_SIZE 16
#define BALLOON_QUEUE_SIZE 128

/* Where kmig puts the device: PCI slot, INTA's GSI, the BAR (MMIO hole). */
#define BALLOON_PCI_SLOT 3
#define BALLOON_IRQ 10
#define BALLOON_BAR_GPA 0xe0000000ull

/* The queues' roles.  Inflate and deflate are queues 0 and 1; the others
 * follow in this order, each only when its feature was negotiated, with no
 * gap (as Linux's driver numbers them; QEMU's device always has a statsq,
 * so the two differ only for a driver that refuses STATS_VQ): with statsq
 * and reporting but no hinting, reporting is queue 3. */
enum balloon_vq { BALLOON_VQ_INFLATE, BALLOON_VQ_DEFLATE, BALLOON_VQ_STATS,
		  BALLOON_VQ_FREE_PAGE, BALLOON_VQ_REPORTING, BALLOON_NR_VQS };

/* Why the sender may skip a page. */
enum balloon_skip { BALLOON_SKIP_NONE, BALLOON_SKIP_FREE, BALLOON_SKIP_BALLOONED };

struct balloon_stats {
	uint64_t inflated, deflated;           /* frames */
	uint64_t ballooned;                    /* frames marked now */
	uint64_t hint_bufs, hinted_pages;      /* accepted hint ranges, their pages */
	uint64_t stale_hints;                  /* hint buffers ignored */
	uint64_t reported_pages;               /* discarded by free page reporting */
	uint64_t bad_pfns;                     /* inflate/deflate frames outside RAM */
	uint64_t notify_exits, notify_events;  /* queue notifications: vCPU exits, ioeventfds */
};

/* Called (device lock held) when the driver changes `actual`. */
typedef void (*balloon_change_fn)(void *ctx, uint64_t actual_bytes);

struct balloon_conf {
	struct ram *ram;
	void (*mark)(void *ctx, uint64_t gpa, uint64_t len); /* dirty__mark; may be NULL */
	void *mark_ctx;
	virtio_irq_fn irq;                     /* may be NULL: polling drivers */
	void *irq_ctx;
	uint8_t irq_line;
	uint64_t bar_gpa;
	bool no_free_page_hint;                /* do not offer FREE_PAGE_HINT */
	bool no_reporting;                     /* do not offer REPORTING */
};

struct balloon;

int balloon__create(struct balloon **out, const struct balloon_conf *conf) KMIG_MUST_CHECK;
void balloon__destroy(struct balloon *b);
/* The PCI function to plug into a bus, and its virtio transport. */
struct pci_dev *balloon__pci(struct balloon *b);
struct virtio_pci *balloon__transport(struct balloon *b);
void balloon__set_change_cb(struct balloon *b, balloon_change_fn fn, void *ctx);

/* These three never take the device lock and never touch guest memory:
 * QMP calls them, and on a post-copy destination the lock may be held by
 * a thread waiting for a page that has not arrived.
 * QMP `balloon`: the guest should keep `bytes` of its RAM (clamped to the
 * RAM size); num_pages = (RAM - bytes) / 4 KiB.  -EINVAL for 0. */
int balloon__set_target(struct balloon *b, uint64_t bytes) KMIG_MUST_CHECK;
/* QMP `query-balloon`: RAM size minus the driver's `actual`. */
uint64_t balloon__actual_bytes(struct balloon *b);
/* The counters, each read atomically (not one snapshot of them all). */
void balloon__get_stats(struct balloon *b, struct balloon_stats *out);

/* Whether the driver runs with free page hinting negotiated and its
 * queue enabled. */
bool balloon__hint_ready(struct balloon *b);
/* Publishes a new command id.  Hinted pages keep their content (nothing
 * is dropped or marked).  -ENOTSUP unless balloon__hint_ready. */
int balloon__hint_start(struct balloon *b) KMIG_MUST_CHECK;
/* Waits until the driver finished the current id (sent STOP), or echoed
 * it and then sent nothing for quiet_ms, or did not echo it within
 * ack_ms, or max_ms passed.  Returns the pages hinted for this id. */
uint64_t balloon__hint_wait(struct balloon *b, unsigned ack_ms, unsigned quiet_ms, unsigned max_ms);
/* Command id STOP: the driver stops hinting, keeps the pages for now. */
void balloon__hint_stop(struct balloon *b);
/* Command id DONE: the driver takes its pages back; the hinted bitmap is
 * cleared.  No-op unless a hint round is active or stopped. */
void balloon__hint_done(struct balloon *b);
/* While held, frames the guest gives up (inflate, free page reporting)
 * are recorded as usual but stay in host memory, holding what they held:
 * a background snapshot's write protection does not see a discard, so
 * a page it has not read yet must not lose its data that way.  The end
 * of a hold discards every frame ballooned then; frames free page
 * reporting gave meanwhile stay until the guest reports them again. */
void balloon__hold_discards(struct balloon *b, bool hold);
/* The current command id (tests). */
uint32_t balloon__hint_cmd_id(struct balloon *b);

/* Lock-free: whether VM-wide page `page` is hinted free or ballooned. */
enum balloon_skip balloon__skip(const struct balloon *b, uint64_t page);

/* STATE_DEV_VIRTIO (instance 0): transport, configuration, hint id and
 * the ballooned frames as ranges.  VM paused. */
int balloon__save(struct balloon *b, state_put_fn put, void *ctx) KMIG_MUST_CHECK;
int balloon__load(struct balloon *b, const void *data, size_t len, char *why, size_t whylen) KMIG_MUST_CHECK;

#endif
