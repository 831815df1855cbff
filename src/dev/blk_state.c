/* STATE_DEV_BLK for virtio-blk: layout (little-endian)
 *   u32 magic "BLK1", u32 transport length, transport (virtio_pci__save),
 *   u64 image size in bytes, u32 logical block size, u8 flags (1 read-only,
 *   2 write cache, 4 discard), u8[3] 0, serial[20].
 * No request is carried: the source drained before the save (a request
 * still in flight is waited for here), and a save is refused while
 * requests are kept after an I/O error (werror/rerror=stop).  The destination's device must be
 * configured alike and its image be of the same size. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "dev/blk_impl.h"

#define BLK_STATE_MAGIC 0x314b4c42u /* "BLK1" */
#define BLK_STATE_CONF (8 + 4 + 4 + BLK_ID_LEN) /* after the transport */
#define BLK_STATE_MAX (8 + VIRTIO_PCI_STATE_MAX + BLK_STATE_CONF)

enum { F_RO = 1, F_WB = 2, F_DISCARD = 4 };

static uint8_t blk__flags(const struct blk *b)
{
	return (uint8_t)((b->read_only ? F_RO : 0) | (b->writeback ? F_WB : 0) |
			 (b->discard ? F_DISCARD : 0));
}

int blk__save(struct blk *b, state_put_fn put, void *ctx)
{
	uint8_t buf[BLK_STATE_MAX];
	pthread_mutex_lock(&b->vp.lock);
	while (b->inflight)
		pthread_cond_wait(&b->idle, &b->vp.lock);
	if (b->nkept) {
		log_err("virtio-blk state: %u requests are kept after an I/O error (werror/rerror="
			"stop) and would be lost: not saved", b->nkept);
		pthread_mutex_unlock(&b->vp.lock);
		return -EBUSY;
	}
	long tl = virtio_pci__save(&b->vp, buf + 8, VIRTIO_PCI_STATE_MAX);
	size_t pos = 0;
	if (tl >= 0) {
		uint32_t head[2] = { BLK_STATE_MAGIC, (uint32_t)tl };
		uint64_t size = b->capacity * 512;
		memcpy(buf, head, 8);
		pos = 8 + (size_t)tl;
		memcpy(buf + pos, &size, 8);
		memcpy(buf + pos + 8, &b->lbs, 4);
		buf[pos + 12] = blk__flags(b);
		memset(buf + pos + 13, 0, 3);
		memcpy(buf + pos + 16, b->serial, BLK_ID_LEN);
		pos += BLK_STATE_CONF;
	}
	pthread_mutex_unlock(&b->vp.lock);
	return tl < 0 ? (int)tl : put(ctx, STATE_DEV_BLK, STATE_VERSION, 0, buf, pos);
}

/* The fixed part (after the transport) against this device. */
static int blk__check_conf(const struct blk *b, const uint8_t *p, size_t len, char *why,
			   size_t whylen)
{
	uint64_t size;
	uint32_t lbs;
	if (len != BLK_STATE_CONF) {
		snprintf(why, whylen, "virtio-blk state: %s", len < BLK_STATE_CONF ?
			 "truncated" : "trailing bytes");
		return -EINVAL;
	}
	memcpy(&size, p, 8);
	memcpy(&lbs, p + 8, 4);
	if (size != b->capacity * 512) {
		snprintf(why, whylen, "virtio-blk state: the source's image is %llu bytes, this one "
			 "%llu: the destination's image must be the same size",
			 (unsigned long long)size, (unsigned long long)(b->capacity * 512));
		return -EINVAL;
	}
	if (lbs != b->lbs || p[12] != blk__flags(b) || p[13] || p[14] || p[15] ||
	    memcmp(p + 16, b->serial, BLK_ID_LEN)) {
		snprintf(why, whylen, "virtio-blk state: the source's device is configured otherwise "
			 "(logical_block_size, read-only, write-cache, discard or serial differ)");
		return -EINVAL;
	}
	return 0;
}

int blk__load(struct blk *b, const void *data, size_t len, char *why, size_t whylen)
{
	const uint8_t *p = data;
	uint32_t head[2];
	if (len < 8 || (memcpy(head, p, 8), head[0] != BLK_STATE_MAGIC) || head[1] > len - 8) {
		snprintf(why, whylen, "virtio-blk state: bad header");
		return -EINVAL;
	}
	int rc = blk__check_conf(b, p + 8 + head[1], len - 8 - head[1], why, whylen);
	if (rc)
		return rc;
	pthread_mutex_lock(&b->vp.lock);
	if (b->inflight) {
		snprintf(why, whylen, "virtio-blk state: this device has requests in flight");
		rc = -EBUSY;
	} else {
		const char *vwhy = NULL;
		long tl = virtio_pci__load(&b->vp, p + 8, head[1], &vwhy);
		if (tl < 0 || (size_t)tl != head[1]) {
			snprintf(why, whylen, "virtio-blk state: %s",
				 vwhy ? vwhy : "transport length mismatch");
			rc = -EINVAL;
		} else {
			b->gen++;           /* nothing older may be returned */
			blk__drop_kept(b);
		}
	}
	pthread_mutex_unlock(&b->vp.lock);
	return rc;
}
