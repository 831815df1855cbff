#include "dev/virtqueue.h"

#include <errno.h>
#include <string.h>

struct virtq_desc {
	uint64_t addr;
	uint32_t len;
	uint16_t flags;
	uint16_t next;
};

void virtq__reset(struct virtq *q, uint16_t max_size)
{
	memset(q, 0, sizeof(*q));
	q->max_size = max_size;
	q->size = max_size;
	q->msix_vector = 0xffff;
}

static uint8_t *virtq__map(const struct virtio_mem *mem, uint64_t gpa, uint64_t len,
			   uint64_t align)
{
	if (!gpa || (gpa & (align - 1)))
		return NULL;
	return ram__gpa_to_host(mem->ram, gpa, len);
}

int virtq__enable(struct virtq *q, const struct virtio_mem *mem, const char **why)
{
	uint16_t n = q->size;
	q->ready = false;
	if (!n || n > q->max_size || (n & (n - 1))) {
		*why = "queue size is not a power of two within the maximum";
		return -EINVAL;
	}
	q->desc_h = virtq__map(mem, q->desc, 16ull * n, 16);
	q->avail_h = virtq__map(mem, q->avail, 6 + 2ull * n, 2);
	q->used_h = virtq__map(mem, q->used, 6 + 8ull * n, 4);
	if (!q->desc_h || !q->avail_h || !q->used_h) {
		*why = "ring address misaligned or outside guest RAM";
		return -EINVAL;
	}
	q->ready = true;
	return 0;
}

static uint16_t virtq__load16(const uint8_t *p)
{
	return __atomic_load_n((const uint16_t *)p, __ATOMIC_ACQUIRE);
}

/* Reads and checks the descriptor chain starting at head into c. */
static int virtq__walk(const struct virtq *q, const struct virtio_mem *mem, uint16_t head,
		       struct virtq_chain *c, const char **why)
{
	unsigned limit = q->size < VIRTQ_MAX_CHAIN ? q->size : VIRTQ_MAX_CHAIN;
	uint16_t i = head;
	memset(c, 0, offsetof(struct virtq_chain, bufs));
	c->head = head;
	for (;;) {
		if (i >= q->size) {
			*why = "descriptor index out of range";
			return -EINVAL;
		}
		if (c->n >= limit) {
			*why = "descriptor chain too long or looping";
			return -EINVAL;
		}
		struct virtq_desc d;
		memcpy(&d, q->desc_h + 16u * i, sizeof(d));
		bool w = d.flags & VIRTQ_DESC_F_WRITE;
		if (d.flags & VIRTQ_DESC_F_INDIRECT) {
			*why = "indirect descriptor (not negotiated)";
			return -EINVAL;
		}
		if (!w && c->nin) {
			*why = "readable descriptor after a writable one";
			return -EINVAL;
		}
		uint8_t *h = d.len ? ram__gpa_to_host(mem->ram, d.addr, d.len) : NULL;
		if (d.len && !h) {
			*why = "buffer outside guest RAM";
			return -EINVAL;
		}
		c->bufs[c->n++] = (struct virtq_buf){ d.addr, d.len, w, h };
		if (w)
			c->nin++;
		else
			c->nout++;
		if (!(d.flags & VIRTQ_DESC_F_NEXT))
			return 0;
		i = d.next;
	}
}

int virtq__pop(struct virtq *q, const struct virtio_mem *mem, struct virtq_chain *c,
	       const char **why)
{
	if (!q->ready)
		return 0;
	uint16_t avail_idx = virtq__load16(q->avail_h + 2);
	uint16_t pending = (uint16_t)(avail_idx - q->last_avail);
	if (!pending)
		return 0;
	if (pending > q->size || q->inflight >= q->size) {
		*why = "more buffers available than the queue holds";
		return -EINVAL;
	}
	uint16_t head = virtq__load16(q->avail_h + 4 + 2u * (q->last_avail % q->size));
	int rc = virtq__walk(q, mem, head, c, why);
	if (rc)
		return rc;
	q->last_avail++;
	q->inflight++;
	return 1;
}

int virtq__chain_at(const struct virtq *q, const struct virtio_mem *mem, uint16_t head,
		    struct virtq_chain *c, const char **why)
{
	if (!q->ready) {
		*why = "queue not ready";
		return -EINVAL;
	}
	return virtq__walk(q, mem, head, c, why);
}

bool virtq__has_avail(const struct virtq *q)
{
	return q->ready && virtq__load16(q->avail_h + 2) != q->last_avail;
}

void virtq__unpop(struct virtq *q, uint16_t k)
{
	if (k > q->inflight)
		k = q->inflight;
	q->last_avail = (uint16_t)(q->last_avail - k);
	q->inflight = (uint16_t)(q->inflight - k);
}

int virtq__fill(struct virtq *q, const struct virtio_mem *mem, uint16_t i, uint16_t head,
		uint32_t len)
{
	if (!q->ready || i >= q->inflight || head >= q->size)
		return -EINVAL;
	unsigned slot = (uint16_t)(q->used_idx + i) % q->size;
	uint32_t elem[2] = { head, len };
	memcpy(q->used_h + 4 + 8u * slot, elem, sizeof(elem));
	if (mem->mark)
		mem->mark(mem->mark_ctx, q->used + 4 + 8ull * slot, 8);
	return 0;
}

void virtq__flush(struct virtq *q, const struct virtio_mem *mem, uint16_t k)
{
	if (!q->ready || !k)
		return;
	if (k > q->inflight)
		k = q->inflight;
	q->used_idx = (uint16_t)(q->used_idx + k);
	q->inflight = (uint16_t)(q->inflight - k);
	__atomic_store_n((uint16_t *)(q->used_h + 2), q->used_idx, __ATOMIC_RELEASE);
	if (mem->mark)
		mem->mark(mem->mark_ctx, q->used + 2, 2);
}

int virtq__push(struct virtq *q, const struct virtio_mem *mem, uint16_t head, uint32_t len)
{
	int rc = virtq__fill(q, mem, 0, head, len);
	if (!rc)
		virtq__flush(q, mem, 1);
	return rc;
}

bool virtq__want_irq(const struct virtq *q)
{
	return q->ready && !(virtq__load16(q->avail_h) & VIRTQ_AVAIL_F_NO_INTERRUPT);
}
