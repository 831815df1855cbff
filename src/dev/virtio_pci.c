#include "dev/virtio_pci.h"

#include <errno.h>
#include <string.h>

#define VIRTIO_PCI_CAP_VNDR 0x09
enum { CAP_COMMON = 1, CAP_NOTIFY = 2, CAP_ISR = 3, CAP_DEVICE = 4 };

static void vp__put(uint8_t *p, uint64_t v, unsigned len)
{
	for (unsigned i = 0; i < len; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t vp__get(const uint8_t *p, unsigned len)
{
	uint64_t v = 0;
	for (unsigned i = 0; i < len; i++)
		v |= (uint64_t)p[i] << (8 * i);
	return v;
}

/* irq_lock held. */
static void vp__set_irq(struct virtio_pci *vp)
{
	bool level = vp->isr && vp->conf.irq_line &&
		     !(vp__get(&vp->pci.cfg[PCI_COMMAND], 2) & PCI_COMMAND_INTX_DISABLE);
	if (level != vp->irq_level && vp->irq) {
		vp->irq_level = level;
		vp->irq(vp->irq_ctx, level);
	}
}

/* Sets ISR bits (0: none), bumps the generation if asked, and sets the
 * line's level, under irq_lock. */
static void vp__isr_update(struct virtio_pci *vp, uint8_t bits, bool cfg_gen)
{
	pthread_mutex_lock(&vp->irq_lock);
	vp->isr |= bits;
	if (cfg_gen)
		vp->cfg_gen++;
	vp__set_irq(vp);
	pthread_mutex_unlock(&vp->irq_lock);
}

void virtio_pci__config_changed(struct virtio_pci *vp)
{
	vp__isr_update(vp, VIRTIO_ISR_CONFIG, true);
}

void virtio_pci__queue_used(struct virtio_pci *vp, unsigned q)
{
	if (q < vp->conf.nqueues && virtq__want_irq(&vp->vqs[q]))
		vp__isr_update(vp, VIRTIO_ISR_QUEUE, false);
}

void virtio_pci__notify_counts(struct virtio_pci *vp, uint64_t *exits, uint64_t *events)
{
	*exits = __atomic_load_n(&vp->notify_exits, __ATOMIC_RELAXED);
	*events = __atomic_load_n(&vp->notify_events, __ATOMIC_RELAXED);
}

void virtio_pci__fail(struct virtio_pci *vp, const char *why)
{
	if (!vp->broken)
		log_warn("virtio device %u: %s: device needs reset", vp->conf.virtio_id, why);
	vp->broken = true;
	vp->status |= VIRTIO_STATUS_NEEDS_RESET;
	virtio_pci__config_changed(vp);
}

bool virtio_pci__has(const struct virtio_pci *vp, unsigned bit)
{
	return (vp->status & VIRTIO_STATUS_FEATURES_OK) && bit < 64 &&
	       ((vp->driver_features >> bit) & 1);
}

bool virtio_pci__running(const struct virtio_pci *vp)
{
	return (vp->status & VIRTIO_STATUS_DRIVER_OK) && !vp->broken;
}

static void vp__reset(struct virtio_pci *vp)
{
	vp->driver_features = 0;
	vp->dfselect = vp->gfselect = 0;
	vp->queue_select = 0;
	vp->status = 0;
	vp->broken = false;
	for (unsigned i = 0; i < VIRTIO_MAX_QUEUES; i++)
		virtq__reset(&vp->vqs[i], i < vp->conf.nqueues ? vp->conf.queue_max : 0);
	pthread_mutex_lock(&vp->irq_lock);
	vp->isr = 0;
	vp__set_irq(vp);
	pthread_mutex_unlock(&vp->irq_lock);
	if (vp->ops->reset)
		vp->ops->reset(vp->ctx);
}

static struct virtq *vp__selected(struct virtio_pci *vp)
{
	return vp->queue_select < vp->conf.nqueues ? &vp->vqs[vp->queue_select] : NULL;
}

/* The common configuration as the driver reads it now. */
static void vp__common_image(struct virtio_pci *vp, uint8_t img[VIRTIO_PCI_COMMON_LEN])
{
	memset(img, 0, VIRTIO_PCI_COMMON_LEN);
	vp__put(img + VIRTIO_PCI_DFSELECT, vp->dfselect, 4);
	vp__put(img + VIRTIO_PCI_DF, vp->dfselect < 2 ? vp->device_features >> (32 * vp->dfselect) : 0, 4);
	vp__put(img + VIRTIO_PCI_GFSELECT, vp->gfselect, 4);
	vp__put(img + VIRTIO_PCI_GF, vp->gfselect < 2 ? vp->driver_features >> (32 * vp->gfselect) : 0, 4);
	vp__put(img + VIRTIO_PCI_MSIX_CONFIG, VIRTIO_NO_VECTOR, 2);
	vp__put(img + VIRTIO_PCI_NUM_QUEUES, vp->conf.nqueues, 2);
	img[VIRTIO_PCI_STATUS] = vp->status;
	pthread_mutex_lock(&vp->irq_lock);
	img[VIRTIO_PCI_CFG_GEN] = vp->cfg_gen;
	pthread_mutex_unlock(&vp->irq_lock);
	vp__put(img + VIRTIO_PCI_Q_SELECT, vp->queue_select, 2);
	struct virtq *q = vp__selected(vp);
	if (!q)
		return;
	vp__put(img + VIRTIO_PCI_Q_SIZE, q->size, 2);
	vp__put(img + VIRTIO_PCI_Q_MSIX, VIRTIO_NO_VECTOR, 2);
	vp__put(img + VIRTIO_PCI_Q_ENABLE, q->ready, 2);
	vp__put(img + VIRTIO_PCI_Q_NOFF, vp->queue_select, 2);
	vp__put(img + VIRTIO_PCI_Q_DESC, q->desc, 8);
	vp__put(img + VIRTIO_PCI_Q_AVAIL, q->avail, 8);
	vp__put(img + VIRTIO_PCI_Q_USED, q->used, 8);
}

static void vp__write_status(struct virtio_pci *vp, uint8_t v)
{
	if (!v) {
		vp__reset(vp);
		return;
	}
	uint8_t old = vp->status;
	if ((v & VIRTIO_STATUS_FEATURES_OK) && !(old & VIRTIO_STATUS_FEATURES_OK)) {
		bool ok = !(vp->driver_features & ~vp->device_features) &&
			  ((vp->driver_features >> VIRTIO_F_VERSION_1) & 1);
		if (!ok)
			v &= (uint8_t)~VIRTIO_STATUS_FEATURES_OK;
	}
	vp->status = (uint8_t)((v & ~VIRTIO_STATUS_NEEDS_RESET) | (old & VIRTIO_STATUS_NEEDS_RESET));
	if ((v & VIRTIO_STATUS_DRIVER_OK) && !(old & VIRTIO_STATUS_DRIVER_OK) && vp->ops->driver_ok)
		vp->ops->driver_ok(vp->ctx);
	if ((v & VIRTIO_STATUS_DRIVER_OK) && !(old & VIRTIO_STATUS_DRIVER_OK) && !vp->broken)
		for (unsigned i = 0; i < vp->conf.nqueues && !vp->broken; i++)
			if (vp->vqs[i].ready)
				vp->ops->queue_notify(vp->ctx, i);
}

static void vp__write_queue_field(struct virtio_pci *vp, unsigned field, const uint8_t *img)
{
	struct virtq *q = vp__selected(vp);
	if (!q)
		return;
	if (field == VIRTIO_PCI_Q_ENABLE) {
		const char *why = NULL;
		if (vp__get(img + field, 2) == 1 && !q->ready && virtq__enable(q, &vp->mem, &why))
			virtio_pci__fail(vp, why);
		return;
	}
	if (q->ready)
		return; /* the layout of an enabled queue is fixed */
	switch (field) {
	case VIRTIO_PCI_Q_SIZE: q->size = (uint16_t)vp__get(img + field, 2); break;
	case VIRTIO_PCI_Q_DESC: q->desc = vp__get(img + field, 8); break;
	case VIRTIO_PCI_Q_AVAIL: q->avail = vp__get(img + field, 8); break;
	case VIRTIO_PCI_Q_USED: q->used = vp__get(img + field, 8); break;
	default: break;
	}
}

/* Applies a driver write of [off, off + len) to the common configuration:
 * the bytes go into the current image, then every field they touch is
 * taken from it (so 64-bit fields may be written as two 32-bit halves). */
static void vp__common_write(struct virtio_pci *vp, uint32_t off, const uint8_t *data, unsigned len)
{
	static const struct { uint8_t off, len; } fields[] = {
		{ VIRTIO_PCI_DFSELECT, 4 }, { VIRTIO_PCI_GFSELECT, 4 }, { VIRTIO_PCI_GF, 4 },
		{ VIRTIO_PCI_STATUS, 1 }, { VIRTIO_PCI_Q_SELECT, 2 }, { VIRTIO_PCI_Q_SIZE, 2 },
		{ VIRTIO_PCI_Q_ENABLE, 2 }, { VIRTIO_PCI_Q_DESC, 8 }, { VIRTIO_PCI_Q_AVAIL, 8 },
		{ VIRTIO_PCI_Q_USED, 8 },
	};
	if (off >= VIRTIO_PCI_COMMON_LEN || len > VIRTIO_PCI_COMMON_LEN - off)
		return;
	uint8_t img[VIRTIO_PCI_COMMON_LEN];
	vp__common_image(vp, img);
	memcpy(img + off, data, len);
	for (unsigned i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
		unsigned f = fields[i].off;
		if (off >= f + fields[i].len || off + len <= f)
			continue;
		switch (f) {
		case VIRTIO_PCI_DFSELECT: vp->dfselect = (uint32_t)vp__get(img + f, 4); break;
		case VIRTIO_PCI_GFSELECT: vp->gfselect = (uint32_t)vp__get(img + f, 4); break;
		case VIRTIO_PCI_GF:
			if (vp->gfselect < 2 && !(vp->status & VIRTIO_STATUS_FEATURES_OK)) {
				unsigned sh = 32 * vp->gfselect;
				vp->driver_features = (vp->driver_features & ~(0xffffffffull << sh)) |
						      vp__get(img + f, 4) << sh;
			}
			break;
		case VIRTIO_PCI_STATUS: vp__write_status(vp, img[f]); break;
		case VIRTIO_PCI_Q_SELECT: vp->queue_select = (uint16_t)vp__get(img + f, 2); break;
		default: vp__write_queue_field(vp, f, img); break;
		}
	}
}

/* Lock held.  Queue q was notified. */
static void vp__queue_notify(struct virtio_pci *vp, unsigned q)
{
	if (q < vp->conf.nqueues && vp->vqs[q].ready && virtio_pci__running(vp))
		vp->ops->queue_notify(vp->ctx, q);
}

static void vp__bar_read(void *ctx, unsigned bar, uint64_t off, void *data, unsigned len)
{
	struct virtio_pci *vp = ctx;
	uint8_t *out = data;
	memset(out, 0, len);
	if (bar != VIRTIO_PCI_BAR)
		return;
	pthread_mutex_lock(&vp->lock);
	uint64_t region = off & ~(uint64_t)(VIRTIO_PCI_REGION_SIZE - 1);
	uint32_t r = (uint32_t)(off - region);
	if (region == VIRTIO_PCI_COMMON && r < VIRTIO_PCI_COMMON_LEN && len <= VIRTIO_PCI_COMMON_LEN - r) {
		uint8_t img[VIRTIO_PCI_COMMON_LEN];
		vp__common_image(vp, img);
		memcpy(out, img + r, len);
	} else if (region == VIRTIO_PCI_ISR && r == 0) {
		pthread_mutex_lock(&vp->irq_lock);
		out[0] = vp->isr; /* reading acknowledges */
		vp->isr = 0;
		vp__set_irq(vp);
		pthread_mutex_unlock(&vp->irq_lock);
	} else if (region == VIRTIO_PCI_DEVCFG && r < vp->conf.cfg_size && len <= vp->conf.cfg_size - r) {
		vp->ops->cfg_read(vp->ctx, r, out, len);
	}
	pthread_mutex_unlock(&vp->lock);
}

static void vp__bar_write(void *ctx, unsigned bar, uint64_t off, const void *data, unsigned len)
{
	struct virtio_pci *vp = ctx;
	if (bar != VIRTIO_PCI_BAR)
		return;
	pthread_mutex_lock(&vp->lock);
	uint64_t region = off & ~(uint64_t)(VIRTIO_PCI_REGION_SIZE - 1);
	uint32_t r = (uint32_t)(off - region);
	if (region == VIRTIO_PCI_COMMON) {
		vp__common_write(vp, r, data, len);
	} else if (region == VIRTIO_PCI_DEVCFG && r < vp->conf.cfg_size && len <= vp->conf.cfg_size - r) {
		vp->ops->cfg_write(vp->ctx, r, data, len);
	} else if (region == VIRTIO_PCI_NOTIFY && r % VIRTIO_PCI_NOTIFY_MULT == 0) {
		__atomic_fetch_add(&vp->notify_exits, 1, __ATOMIC_RELAXED);
		vp__queue_notify(vp, r / VIRTIO_PCI_NOTIFY_MULT);
	}
	pthread_mutex_unlock(&vp->lock);
}

static uint64_t vp__notify_gpa(const struct virtio_pci *vp)
{
	uint64_t bar = pci_dev__bar_decode(&vp->pci, VIRTIO_PCI_BAR);
	return bar ? bar + VIRTIO_PCI_NOTIFY : 0;
}

static void vp__bar_moved(void *ctx, unsigned bar, uint64_t gpa)
{
	struct virtio_pci *vp = ctx;
	(void)gpa;
	if (bar == VIRTIO_PCI_BAR && vp->notify_map)
		vp->notify_map(vp->notify_map_ctx, vp__notify_gpa(vp));
}

static const struct pci_dev_ops vp__pci_ops = { vp__bar_read, vp__bar_write, vp__bar_moved };

void virtio_pci__set_notify_map(struct virtio_pci *vp, virtio_notify_map_fn fn, void *ctx)
{
	vp->notify_map = fn;
	vp->notify_map_ctx = ctx;
	virtio_pci__remap_notify(vp);
}

void virtio_pci__remap_notify(struct virtio_pci *vp)
{
	if (vp->notify_map)
		vp->notify_map(vp->notify_map_ctx, vp__notify_gpa(vp));
}

void virtio_pci__notify(struct virtio_pci *vp, unsigned q)
{
	pthread_mutex_lock(&vp->lock);
	__atomic_fetch_add(&vp->notify_events, 1, __ATOMIC_RELAXED);
	vp__queue_notify(vp, q);
	pthread_mutex_unlock(&vp->lock);
}

static int vp__add_caps(struct pci_dev *d, const struct virtio_pci_conf *conf)
{
	static const struct { uint8_t at, type; uint32_t off; } caps[] = {
		{ 0x40, CAP_COMMON, VIRTIO_PCI_COMMON }, { 0x50, CAP_ISR, VIRTIO_PCI_ISR },
		{ 0x60, CAP_DEVICE, VIRTIO_PCI_DEVCFG }, { 0x70, CAP_NOTIFY, VIRTIO_PCI_NOTIFY },
	};
	int rc = 0;
	for (unsigned i = 0; !rc && i < sizeof(caps) / sizeof(caps[0]); i++) {
		uint8_t c[20] = { VIRTIO_PCI_CAP_VNDR, 0, 16, caps[i].type, VIRTIO_PCI_BAR };
		uint32_t len = caps[i].type == CAP_COMMON ? VIRTIO_PCI_COMMON_LEN :
			       caps[i].type == CAP_ISR ? 1 :
			       caps[i].type == CAP_DEVICE ? conf->cfg_size :
			       conf->nqueues * VIRTIO_PCI_NOTIFY_MULT;
		vp__put(c + 8, caps[i].off, 4);
		vp__put(c + 12, len, 4);
		if (caps[i].type == CAP_NOTIFY) {
			c[2] = 20;
			vp__put(c + 16, VIRTIO_PCI_NOTIFY_MULT, 4);
		}
		rc = pci_dev__add_cap(d, caps[i].at, c, c[2]);
	}
	return rc;
}

int virtio_pci__init(struct virtio_pci *vp, const struct virtio_pci_conf *conf,
		     const struct virtio_ops *ops, void *ctx, const struct virtio_mem *mem,
		     virtio_irq_fn irq, void *irq_ctx)
{
	if (!conf->nqueues || conf->nqueues > VIRTIO_MAX_QUEUES || !conf->queue_max ||
	    conf->queue_max > VIRTQ_MAX_SIZE || (conf->queue_max & (conf->queue_max - 1)) ||
	    conf->cfg_size > VIRTIO_PCI_REGION_SIZE)
		return -EINVAL;
	memset(vp, 0, sizeof(*vp));
	pthread_mutex_init(&vp->lock, NULL);
	pthread_mutex_init(&vp->irq_lock, NULL);
	vp->conf = *conf;
	vp->ops = ops;
	vp->ctx = ctx;
	vp->mem = *mem;
	vp->irq = irq;
	vp->irq_ctx = irq_ctx;
	vp->device_features = conf->features | 1ull << VIRTIO_F_VERSION_1;
	pci_dev__init(&vp->pci, VIRTIO_PCI_VENDOR, VIRTIO_PCI_DEVICE_BASE + conf->virtio_id, 1,
		      conf->class_code, VIRTIO_PCI_VENDOR, VIRTIO_PCI_SUBSYS_ID, conf->irq_line);
	vp->pci.ops = &vp__pci_ops;
	vp->pci.ctx = vp;
	int rc = pci_dev__set_bar64(&vp->pci, VIRTIO_PCI_BAR, VIRTIO_PCI_BAR_SIZE, conf->bar_gpa);
	if (!rc)
		rc = vp__add_caps(&vp->pci, conf);
	if (rc)
		return rc;
	if (conf->bar_gpa) /* as firmware would leave it */
		vp->pci.cfg[PCI_COMMAND] |= PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
	for (unsigned i = 0; i < VIRTIO_MAX_QUEUES; i++)
		virtq__reset(&vp->vqs[i], i < conf->nqueues ? conf->queue_max : 0);
	return 0;
}

void virtio_pci__destroy(struct virtio_pci *vp)
{
	pthread_mutex_destroy(&vp->lock);
	pthread_mutex_destroy(&vp->irq_lock);
}
