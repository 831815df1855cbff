/* Save/restore of the virtio-pci transport state (see virtio_pci.h). */
#include <errno.h>
#include <string.h>

#include "dev/virtio_pci.h"

struct vp_buf {
	uint8_t *w;            /* writer, or NULL */
	const uint8_t *r;      /* reader */
	size_t pos, cap;
	bool bad;
};

static void vpb__io(struct vp_buf *b, void *v, size_t n)
{
	if (b->bad || n > b->cap - b->pos) {
		b->bad = true;
		if (!b->w)
			memset(v, 0, n);
		return;
	}
	if (b->w)
		memcpy(b->w + b->pos, v, n);
	else
		memcpy(v, b->r + b->pos, n);
	b->pos += n;
}

/* One routine for both directions keeps the layout in one place. */
static void vp__state_io(struct vp_buf *b, uint64_t *feat, uint32_t sel[2], uint16_t *qsel,
			 uint8_t flags[4], uint8_t cfg[PCI_CFG_SIZE], struct virtq *vqs, uint32_t *nq)
{
	vpb__io(b, feat, 8);
	vpb__io(b, sel, 8);
	vpb__io(b, qsel, 2);
	vpb__io(b, flags, 4);
	vpb__io(b, cfg, PCI_CFG_SIZE);
	vpb__io(b, nq, 4);
	for (uint32_t i = 0; i < *nq && i < VIRTIO_MAX_QUEUES && !b->bad; i++) {
		struct virtq *q = &vqs[i];
		uint16_t ready = q->ready;
		vpb__io(b, &q->size, 2);
		vpb__io(b, &ready, 2);
		vpb__io(b, &q->last_avail, 2);
		vpb__io(b, &q->used_idx, 2);
		vpb__io(b, &q->inflight, 2);
		vpb__io(b, &q->desc, 8);
		vpb__io(b, &q->avail, 8);
		vpb__io(b, &q->used, 8);
		q->ready = ready != 0;
	}
}

long virtio_pci__save(struct virtio_pci *vp, uint8_t *buf, size_t cap)
{
	struct vp_buf b = { .w = buf, .cap = cap };
	uint64_t feat = vp->driver_features;
	uint32_t sel[2] = { vp->dfselect, vp->gfselect };
	uint16_t qsel = vp->queue_select;
	pthread_mutex_lock(&vp->irq_lock);
	uint8_t flags[4] = { vp->status, vp->cfg_gen, vp->isr, vp->broken };
	pthread_mutex_unlock(&vp->irq_lock);
	uint8_t cfg[PCI_CFG_SIZE];
	struct virtq vqs[VIRTIO_MAX_QUEUES];
	uint32_t nq = vp->conf.nqueues;
	memcpy(cfg, vp->pci.cfg, sizeof(cfg));
	memcpy(vqs, vp->vqs, sizeof(vqs));
	vp__state_io(&b, &feat, sel, &qsel, flags, cfg, vqs, &nq);
	return b.bad ? -ENOSPC : (long)b.pos;
}

/* Checks every queue before any is changed: a refused load leaves the
 * device as it was. */
static int vp__load_queues(struct virtio_pci *vp, struct virtq *vqs, const char **why)
{
	struct virtq out[VIRTIO_MAX_QUEUES];
	for (unsigned i = 0; i < vp->conf.nqueues; i++) {
		struct virtq *q = &out[i];
		virtq__reset(q, vp->conf.queue_max);
		q->size = vqs[i].size;
		q->desc = vqs[i].desc;
		q->avail = vqs[i].avail;
		q->used = vqs[i].used;
		q->last_avail = vqs[i].last_avail;
		q->used_idx = vqs[i].used_idx;
		q->inflight = vqs[i].inflight;
		if (!vqs[i].ready)
			continue;
		if (virtq__enable(q, &vp->mem, why))
			return -EINVAL;
		if (q->inflight > q->size) {
			*why = "queue has more buffers in flight than entries";
			return -EINVAL;
		}
	}
	memcpy(vp->vqs, out, sizeof(out[0]) * vp->conf.nqueues);
	return 0;
}

long virtio_pci__load(struct virtio_pci *vp, const uint8_t *buf, size_t len, const char **why)
{
	struct vp_buf b = { .r = buf, .cap = len };
	uint64_t feat;
	uint32_t sel[2], nq;
	uint16_t qsel;
	uint8_t flags[4], cfg[PCI_CFG_SIZE];
	struct virtq vqs[VIRTIO_MAX_QUEUES];
	memset(vqs, 0, sizeof(vqs));
	vp__state_io(&b, &feat, sel, &qsel, flags, cfg, vqs, &nq);
	if (b.bad) {
		*why = "virtio transport state truncated";
		return -EINVAL;
	}
	/* the driver may write any feature bits; only a negotiation the
	 * device accepted (FEATURES_OK) holds offered ones alone */
	if (nq != vp->conf.nqueues ||
	    ((flags[0] & VIRTIO_STATUS_FEATURES_OK) && (feat & ~vp->device_features))) {
		*why = "virtio device layout or features differ";
		return -EINVAL;
	}
	int rc = vp__load_queues(vp, vqs, why);
	if (rc)
		return rc;
	vp->driver_features = feat;
	vp->dfselect = sel[0];
	vp->gfselect = sel[1];
	vp->queue_select = qsel;
	vp->status = flags[0];
	vp->broken = flags[3] != 0;
	pci_dev__cfg_write(&vp->pci, 0, cfg, PCI_CFG_SIZE); /* writable bytes only */
	virtio_pci__remap_notify(vp);                       /* the BAR may have moved */
	pthread_mutex_lock(&vp->irq_lock);
	vp->cfg_gen = flags[1];
	vp->isr = flags[2];
	vp->irq_level = false;
	if (vp->isr && vp->conf.irq_line && vp->irq &&
	    !(vp->pci.cfg[PCI_COMMAND + 1] & (PCI_COMMAND_INTX_DISABLE >> 8))) {
		vp->irq_level = true;
		vp->irq(vp->irq_ctx, true);
	}
	pthread_mutex_unlock(&vp->irq_lock);
	if ((vp->status & VIRTIO_STATUS_DRIVER_OK) && vp->ops->driver_ok)
		vp->ops->driver_ok(vp->ctx);
	return (long)b.pos;
}
