/* The fake virtio-pci driver of the device tests: see vdrv.h. */
#include "vdrv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/timeutil.h"
#include "dev/virtqueue.h"

int vdrv__init(struct vdrv *d, const struct vdrv_conf *c)
{
	memset(d, 0, sizeof(*d));
	if (!c->nq || c->nq > VDRV_MAX_VQS || !c->qsize || c->qsize > VDRV_MAX_QSIZE ||
	    c->qstride < VDRV_RING_BYTES || c->qbase > c->ram_size ||
	    (c->ram_size - c->qbase) / c->qstride < c->nq)
		return -EINVAL;
	int rc = ram__create(&d->ram, -1, c->ram_size);
	if (rc)
		return rc;
	if (d->ram.nr_blocks != 1) {          /* vdrv__host's promise */
		ram__destroy(&d->ram);
		return -EINVAL;
	}
	pthread_mutex_init(&d->mlock, NULL);
	pci__init(&d->bus);
	d->bar = c->bar;
	d->qbase = c->qbase;
	d->qstride = c->qstride;
	d->nq = c->nq;
	d->qsize = c->qsize;
	d->strict = c->strict;
	return 0;
}

int vdrv__plug(struct vdrv *d, unsigned slot, struct pci_dev *dev)
{
	return pci__add(&d->bus, slot, dev);
}

void vdrv__fini(struct vdrv *d)
{
	pci__destroy(&d->bus);
	ram__destroy(&d->ram);
	pthread_mutex_destroy(&d->mlock);
}

uint8_t *vdrv__host(const struct vdrv *d, uint64_t gpa)
{
	return ram__gpa_to_host(&d->ram, gpa, 1);
}

bool vdrv__in_ram(const struct vdrv *d, uint64_t gpa, uint64_t len)
{
	return len && gpa < d->ram.size && len <= d->ram.size - gpa;
}

uint64_t vdrv__read(struct vdrv *d, uint64_t off, unsigned len)
{
	uint64_t v = 0;
	if (!pci__mmio(&d->bus, d->bar + off, false, &v, len))
		return ~0ull;
	return v;
}

int vdrv__write(struct vdrv *d, uint64_t off, uint64_t v, unsigned len)
{
	if (pci__mmio(&d->bus, d->bar + off, true, &v, len))
		return 0;
	if (d->strict)
		abort();
	return -ENODEV;
}

static void cfg_address(struct vdrv *d, unsigned slot, unsigned off)
{
	uint32_t a = 0x80000000u | slot << 11 | (off & 0xfc);
	pci__pio(&d->bus, PCI_CONF_ADDR, true, &a, 4);
}

uint32_t vdrv__cfg_read(struct vdrv *d, unsigned slot, unsigned off, unsigned size)
{
	uint32_t v = 0;
	cfg_address(d, slot, off);
	pci__pio(&d->bus, (uint16_t)(PCI_CONF_DATA + (off & 3)), false, &v, size);
	return v;
}

void vdrv__cfg_write(struct vdrv *d, unsigned slot, unsigned off, uint32_t v, unsigned size)
{
	cfg_address(d, slot, off);
	pci__pio(&d->bus, (uint16_t)(PCI_CONF_DATA + (off & 3)), true, &v, size);
}

uint8_t vdrv__status(struct vdrv *d)
{
	return (uint8_t)vdrv__read(d, VIRTIO_PCI_COMMON + VIRTIO_PCI_STATUS, 1);
}

uint64_t vdrv__offered(struct vdrv *d)
{
	(void)vdrv__write(d, VIRTIO_PCI_DFSELECT, 0, 4);
	uint64_t f = vdrv__read(d, VIRTIO_PCI_DF, 4);
	(void)vdrv__write(d, VIRTIO_PCI_DFSELECT, 1, 4);
	return f | vdrv__read(d, VIRTIO_PCI_DF, 4) << 32;
}

/* The writes of one step in order; the first failure. */
static int write_all(struct vdrv *d, const uint64_t (*w)[3], unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		int rc = vdrv__write(d, w[i][0], w[i][1], (unsigned)w[i][2]);
		if (rc)
			return rc;
	}
	return 0;
}

int vdrv__negotiate(struct vdrv *d, uint64_t features)
{
	const uint64_t s = VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER;
	const uint64_t w[][3] = {
		{ VIRTIO_PCI_STATUS, s, 1 },
		{ VIRTIO_PCI_GFSELECT, 0, 4 }, { VIRTIO_PCI_GF, features & 0xffffffff, 4 },
		{ VIRTIO_PCI_GFSELECT, 1, 4 }, { VIRTIO_PCI_GF, features >> 32, 4 },
		{ VIRTIO_PCI_STATUS, s | VIRTIO_STATUS_FEATURES_OK, 1 },
	};
	int rc = write_all(d, w, sizeof(w) / sizeof(w[0]));
	return rc ? rc : vdrv__status(d);
}

uint64_t vdrv__desc_gpa(const struct vdrv *d, unsigned q) { return d->qbase + q * d->qstride; }
uint64_t vdrv__avail_gpa(const struct vdrv *d, unsigned q) { return vdrv__desc_gpa(d, q) + 0x1000; }
uint64_t vdrv__used_gpa(const struct vdrv *d, unsigned q) { return vdrv__desc_gpa(d, q) + 0x2000; }

static bool queue_ok(const struct vdrv *d, unsigned q)
{
	return q < d->nq && d->qsize && d->qsize <= VDRV_MAX_QSIZE;
}

int vdrv__enable_queue(struct vdrv *d, unsigned q)
{
	if (!queue_ok(d, q))
		return -EINVAL;
	uint64_t desc = vdrv__desc_gpa(d, q), used = vdrv__used_gpa(d, q);
	const uint64_t w[][3] = {
		{ VIRTIO_PCI_Q_SELECT, q, 2 }, { VIRTIO_PCI_Q_SIZE, d->qsize, 2 },
		{ VIRTIO_PCI_Q_DESC, desc & 0xffffffff, 4 },
		{ VIRTIO_PCI_Q_DESC + 4, desc >> 32, 4 },
		{ VIRTIO_PCI_Q_AVAIL, vdrv__avail_gpa(d, q), 8 },
		{ VIRTIO_PCI_Q_USED, used & 0xffffffff, 4 },
		{ VIRTIO_PCI_Q_USED + 4, used >> 32, 4 },
		{ VIRTIO_PCI_Q_ENABLE, 1, 2 },
	};
	return write_all(d, w, sizeof(w) / sizeof(w[0]));
}

void vdrv__rings_reset(struct vdrv *d)
{
	memset(d->next_desc, 0, sizeof(d->next_desc));
	memset(d->avail_idx, 0, sizeof(d->avail_idx));
	memset(ram__gpa_to_host(&d->ram, d->qbase, d->nq * d->qstride), 0, d->nq * d->qstride);
}

int vdrv__driver_ok(struct vdrv *d)
{
	const unsigned ok = VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER |
			    VIRTIO_STATUS_FEATURES_OK | VIRTIO_STATUS_DRIVER_OK;
	int rc = 0;
	for (unsigned q = 0; q < d->nq && !rc; q++)
		rc = vdrv__enable_queue(d, q);
	return rc ? rc : vdrv__write(d, VIRTIO_PCI_STATUS, ok, 1);
}

int vdrv__start(struct vdrv *d, uint64_t features)
{
	int rc = vdrv__write(d, VIRTIO_PCI_STATUS, 0, 1);
	int st = rc ? rc : vdrv__negotiate(d, features);
	if (st < 0 || !(st & VIRTIO_STATUS_FEATURES_OK))
		return st;
	vdrv__rings_reset(d);
	rc = vdrv__driver_ok(d);
	return rc ? rc : vdrv__status(d);
}

/* Descriptor i of queue q (i < qsize). */
static void put_desc(struct vdrv *d, unsigned q, uint16_t i, const struct vdrv_desc *desc)
{
	uint8_t *p = ram__gpa_to_host(&d->ram, vdrv__desc_gpa(d, q) + 16u * i, 16);
	memcpy(p, &desc->gpa, 8);
	memcpy(p + 8, &desc->len, 4);
	memcpy(p + 12, &desc->flags, 2);
	memcpy(p + 14, &desc->next, 2);
}

/* head into the available ring's next slot, then the index (release:
 * a device worker may be reading the ring). */
static void publish(struct vdrv *d, unsigned q, uint16_t head)
{
	uint8_t *avail = ram__gpa_to_host(&d->ram, vdrv__avail_gpa(d, q), 4 + 2u * d->qsize);
	uint16_t slot = d->avail_idx[q] % d->qsize;
	memcpy(avail + 4 + 2u * slot, &head, 2);
	d->avail_idx[q]++;
	__atomic_store_n((uint16_t *)(avail + 2), d->avail_idx[q], __ATOMIC_RELEASE);
}

int vdrv__add_desc(struct vdrv *d, unsigned q, const struct vdrv_desc *desc)
{
	if (!queue_ok(d, q))
		return -EINVAL;
	uint16_t i = d->next_desc[q] % d->qsize;
	put_desc(d, q, i, desc);
	d->next_desc[q] = (uint16_t)((i + 1) % d->qsize);
	publish(d, q, i);
	return i;
}

int vdrv__add_chain(struct vdrv *d, unsigned q, const struct vdrv_seg *s, unsigned n)
{
	if (!queue_ok(d, q) || !n || n > d->qsize)
		return -EINVAL;
	uint16_t head = d->next_desc[q] % d->qsize;
	for (unsigned k = 0; k < n; k++) {
		uint16_t i = (uint16_t)((head + k) % d->qsize);
		uint16_t flags = (uint16_t)((s[k].w ? VIRTQ_DESC_F_WRITE : 0) |
					    (k + 1 < n ? VIRTQ_DESC_F_NEXT : 0));
		struct vdrv_desc desc = { s[k].gpa, s[k].len, flags, (uint16_t)((i + 1) % d->qsize) };
		put_desc(d, q, i, &desc);
	}
	d->next_desc[q] = (uint16_t)((head + n) % d->qsize);
	publish(d, q, head);
	return head;
}

int vdrv__kick(struct vdrv *d, unsigned q)
{
	if (q >= d->nq)
		return -EINVAL;
	return vdrv__write(d, VIRTIO_PCI_NOTIFY + VIRTIO_PCI_NOTIFY_MULT * q, q, 2);
}

/* The used ring of queue q, its entries included. */
static const uint8_t *used_ring(const struct vdrv *d, unsigned q)
{
	if (!queue_ok(d, q))
		return NULL;
	return ram__gpa_to_host(&d->ram, vdrv__used_gpa(d, q), 4 + 8u * d->qsize);
}

int vdrv__used_idx(const struct vdrv *d, unsigned q)
{
	const uint8_t *u = used_ring(d, q);
	if (!u)
		return -EINVAL;
	return __atomic_load_n((const uint16_t *)(u + 2), __ATOMIC_ACQUIRE);
}

int vdrv__wait_used(const struct vdrv *d, unsigned q, uint16_t n, unsigned timeout_ms)
{
	int idx = vdrv__used_idx(d, q);
	for (unsigned i = 0; i < timeout_ms && idx >= 0 && idx != n; i++) {
		time__sleep_ns(1000000);
		idx = vdrv__used_idx(d, q);
	}
	return idx < 0 ? idx : idx == n ? 0 : -ETIMEDOUT;
}

/* Word w (0: id, 1: len) of used entry i; ~0u for a bad q. */
static uint32_t used_word(const struct vdrv *d, unsigned q, uint16_t i, unsigned w)
{
	const uint8_t *u = used_ring(d, q);
	uint32_t v = ~0u;
	if (u)
		memcpy(&v, u + 4 + 8u * (i % d->qsize) + 4 * w, 4);
	return v;
}

uint32_t vdrv__used_id(const struct vdrv *d, unsigned q, uint16_t i)
{
	return used_word(d, q, i, 0);
}

uint32_t vdrv__used_len(const struct vdrv *d, unsigned q, uint16_t i)
{
	return used_word(d, q, i, 1);
}

uint32_t vdrv__used_len_of(const struct vdrv *d, unsigned q, uint16_t head)
{
	int n = vdrv__used_idx(d, q);
	for (int i = 0; i < n; i++)
		if (vdrv__used_id(d, q, (uint16_t)i) == head)
			return vdrv__used_len(d, q, (uint16_t)i);
	return ~0u;
}

void vdrv__mark(void *ctx, uint64_t gpa, uint64_t len)
{
	struct vdrv *d = ctx;
	pthread_mutex_lock(&d->mlock);
	d->mark_calls++;
	d->mark_outside += !vdrv__in_ram(d, gpa, len);
	if (d->nmarks < VDRV_MARKS)
		d->marks[d->nmarks++] = (struct vdrv_mark){ gpa, len };
	pthread_mutex_unlock(&d->mlock);
}

void vdrv__irq(void *ctx, bool level)
{
	struct vdrv *d = ctx;
	__atomic_store_n(&d->irq_level, level, __ATOMIC_RELAXED);
	__atomic_fetch_add(&d->irq_changes, 1, __ATOMIC_RELAXED);
}

static bool byte_marked(const struct vdrv *d, uint64_t a)
{
	for (unsigned i = 0; i < d->nmarks; i++)
		if (a >= d->marks[i].gpa && a - d->marks[i].gpa < d->marks[i].len)
			return true;
	return false;
}

bool vdrv__marked(struct vdrv *d, uint64_t gpa, uint64_t len)
{
	bool all = true;
	pthread_mutex_lock(&d->mlock);
	for (uint64_t a = gpa; a < gpa + len && all; a++)
		all = byte_marked(d, a);
	pthread_mutex_unlock(&d->mlock);
	return all;
}

void vdrv__marks_reset(struct vdrv *d)
{
	pthread_mutex_lock(&d->mlock);
	d->nmarks = 0;
	pthread_mutex_unlock(&d->mlock);
}
