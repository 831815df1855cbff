/* Split virtqueues (virtio 1.x, section 2.7) as seen by the device.
 *
 * Everything a queue reads comes from guest RAM, which the guest may
 * change at any moment, so every value is read once into a local and
 * checked before use: ring addresses and sizes when the queue is enabled
 * (inside one RAM block, aligned, size a power of two <= the maximum),
 * the avail index (never more than size buffers outstanding), each head
 * and next index (< size), chain length (<= size and VIRTQ_MAX_CHAIN: a
 * loop ends there), descriptor flags (no indirect descriptors: the
 * feature is not offered; device-writable buffers only after readable
 * ones) and every buffer's [addr, addr + len) (inside one RAM block).  A
 * check that fails returns -EINVAL with a reason and consumes nothing;
 * the transport then sets DEVICE_NEEDS_RESET.  The device writes only the
 * used ring (and buffers it was given, through the host pointers here),
 * and reports each write through virtio_mem.mark so that migration sends
 * the page again.
 *
 * Host byte order is little-endian (x86-64), as the rings are.  A queue
 * has no lock of its own: its device's lock covers it. */
#ifndef KMIG_DEV_VIRTQUEUE_H
#define KMIG_DEV_VIRTQUEUE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/log.h"
#include "mem/ram.h"

#define VIRTQ_MAX_SIZE 1024
#define VIRTQ_MAX_CHAIN 128

#define VIRTQ_DESC_F_NEXT 1
#define VIRTQ_DESC_F_WRITE 2
#define VIRTQ_DESC_F_INDIRECT 4
#define VIRTQ_AVAIL_F_NO_INTERRUPT 1

/* Guest memory as a device sees it. */
struct virtio_mem {
	const struct ram *ram;
	/* Records a device write into guest RAM (dirty__mark); may be NULL. */
	void (*mark)(void *ctx, uint64_t gpa, uint64_t len);
	void *mark_ctx;
};

struct virtq {
	/* programmed by the driver through the transport */
	uint16_t size, max_size;
	uint16_t msix_vector;
	uint64_t desc, avail, used;         /* guest-physical ring addresses */
	bool ready;                         /* enabled and validated */
	/* device progress */
	uint16_t last_avail;                /* next avail entry to take */
	uint16_t used_idx;                  /* next used entry to write */
	uint16_t inflight;                  /* taken, not yet returned */
	/* host views of the rings, valid while ready */
	uint8_t *desc_h, *avail_h, *used_h;
};

struct virtq_buf {
	uint64_t gpa;
	uint32_t len;
	bool writable;                      /* device-writable (an "in" buffer) */
	uint8_t *host;                      /* NULL when len == 0 */
};

struct virtq_chain {
	uint16_t head;
	unsigned n, nout, nin;              /* readable buffers come first */
	struct virtq_buf bufs[VIRTQ_MAX_CHAIN];
};

/* Puts a queue back to its reset state with the given maximum size. */
void virtq__reset(struct virtq *q, uint16_t max_size);
/* Validates the programmed size and ring addresses and maps them.
 * -EINVAL with *why set if they do not fit guest RAM. */
int virtq__enable(struct virtq *q, const struct virtio_mem *mem, const char **why) KMIG_MUST_CHECK;
/* Takes the next available chain: 1 if one was taken, 0 if none is
 * pending (or the queue is not ready), -EINVAL with *why if the ring is
 * malformed. */
int virtq__pop(struct virtq *q, const struct virtio_mem *mem, struct virtq_chain *c,
	       const char **why) KMIG_MUST_CHECK;
/* Reads and checks the chain at head again (one taken before, not yet
 * returned: a request a migration carried): 0, or -EINVAL with *why. */
int virtq__chain_at(const struct virtq *q, const struct virtio_mem *mem, uint16_t head,
		    struct virtq_chain *c, const char **why) KMIG_MUST_CHECK;
/* Whether the driver has made buffers available that are not taken yet
 * (false when not ready). */
bool virtq__has_avail(const struct virtq *q);
/* Gives back the last k chains taken (none of them returned yet): the
 * next pops take them again. */
void virtq__unpop(struct virtq *q, uint16_t k);
/* Returns chain head to the driver with len bytes written.  -EINVAL if
 * nothing is in flight or head is out of range. */
int virtq__push(struct virtq *q, const struct virtio_mem *mem, uint16_t head, uint32_t len) KMIG_MUST_CHECK;
/* Several chains the driver must see used together (one received frame
 * in mergeable buffers): virtq__fill writes the i-th used entry after
 * the published index, virtq__flush then publishes k of them at once.
 * -EINVAL as for push (i must be below the chains in flight). */
int virtq__fill(struct virtq *q, const struct virtio_mem *mem, uint16_t i, uint16_t head,
		uint32_t len) KMIG_MUST_CHECK;
void virtq__flush(struct virtq *q, const struct virtio_mem *mem, uint16_t k);
/* Whether the driver wants an interrupt for used buffers. */
bool virtq__want_irq(const struct virtq *q);

#endif
