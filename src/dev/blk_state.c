/* STATE_DEV_BLK for virtio-blk: layout (little-endian)
 *   u32 magic, u32 transport length, transport (virtio_pci__save),
 *   u64 image size in bytes, u32 logical block size, u8 flags (1 read-only,
 *   2 write cache, 4 discard), u8[3] 0, serial[20];
 * version 2 (magic "BLK2", only while requests are kept after an I/O
 * error with action stop) goes on with
 *   u8 io-status, u8 0, u16 n, u16 head[n]: the kept requests' chains, in
 *   the order they are to be retried;
 * version 1 (magic "BLK1") ends there: a source with nothing kept sends
 * it, so an older destination still takes it, and it still loads here.
 * Nothing in flight is carried: the source drained before the save (a
 * request still in flight is waited for here).  The destination reads
 * each kept chain again from the descriptor table in the guest RAM that
 * came with the stream and keeps it as the source did, to be retried
 * when the guest runs there.  The destination's device must be
 * configured alike and its image be of the same size. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "dev/blk_impl.h"

#define BLK_STATE_MAGIC 0x314b4c42u    /* "BLK1" */
#define BLK_STATE_MAGIC_KEPT 0x324b4c42u /* "BLK2" */
#define BLK_STATE_CONF (8 + 4 + 4 + BLK_ID_LEN) /* after the transport */
#define BLK_STATE_KEPT(n) (4 + 2 * (size_t)(n))  /* after the configuration */
#define BLK_STATE_MAX (8 + VIRTIO_PCI_STATE_MAX + BLK_STATE_CONF + BLK_STATE_KEPT(BLK_QUEUE_SIZE))

enum { F_RO = 1, F_WB = 2, F_DISCARD = 4 };

static uint8_t blk__flags(const struct blk *b)
{
	return (uint8_t)((b->read_only ? F_RO : 0) | (b->writeback ? F_WB : 0) |
			 (b->discard ? F_DISCARD : 0));
}

/* Lock held: the kept requests' part (version 2) at p; its length. */
static size_t blk__save_kept(struct blk *b, uint8_t *p)
{
	uint16_t n = 0;
	p[0] = (uint8_t)blk__io_status(b);
	p[1] = 0;
	for (const struct blk_req *r = b->kept; r && n < BLK_QUEUE_SIZE; r = r->next_free, n++)
		memcpy(p + 4 + 2 * n, &r->head, 2);
	memcpy(p + 2, &n, 2);
	return BLK_STATE_KEPT(n);
}

int blk__save(struct blk *b, state_put_fn put, void *ctx)
{
	uint8_t buf[BLK_STATE_MAX];
	pthread_mutex_lock(&b->vp.lock);
	while (b->inflight)
		pthread_cond_wait(&b->idle, &b->vp.lock);
	bool kept = b->nkept > 0;
	long tl = virtio_pci__save(&b->vp, buf + 8, VIRTIO_PCI_STATE_MAX);
	size_t pos = 0;
	if (tl >= 0) {
		uint32_t head[2] = { kept ? BLK_STATE_MAGIC_KEPT : BLK_STATE_MAGIC, (uint32_t)tl };
		uint64_t size = b->capacity * 512;
		memcpy(buf, head, 8);
		pos = 8 + (size_t)tl;
		memcpy(buf + pos, &size, 8);
		memcpy(buf + pos + 8, &b->lbs, 4);
		buf[pos + 12] = blk__flags(b);
		memset(buf + pos + 13, 0, 3);
		memcpy(buf + pos + 16, b->serial, BLK_ID_LEN);
		pos += BLK_STATE_CONF;
		if (kept)
			pos += blk__save_kept(b, buf + pos);
	}
	pthread_mutex_unlock(&b->vp.lock);
	if (tl < 0)
		return (int)tl;
	return put(ctx, STATE_DEV_BLK, kept ? BLK_STATE_VERSION_KEPT : BLK_STATE_VERSION_PLAIN, 0,
		   buf, pos);
}

/* The fixed part (after the transport) against this device. */
static int blk__check_conf(const struct blk *b, const uint8_t *p, char *why, size_t whylen)
{
	uint64_t size;
	uint32_t lbs;
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

/* The kept requests' part (version 2; NULL for version 1) of rest bytes:
 * its length fits, the heads are in range and distinct.  *n their count. */
static int blk__check_kept(const uint8_t *p, size_t rest, uint16_t *n, char *why, size_t whylen)
{
	uint8_t seen[BLK_QUEUE_SIZE] = { 0 };
	*n = 0;
	if (!p)
		return rest ? -EINVAL : 0;
	if (rest < BLK_STATE_KEPT(0))
		return -EINVAL;
	memcpy(n, p + 2, 2);
	if (rest != BLK_STATE_KEPT(*n) || !*n || *n > BLK_QUEUE_SIZE || p[0] > BLK_IOS_NOSPACE ||
	    p[1])
		return -EINVAL;
	for (uint16_t i = 0; i < *n; i++) {
		uint16_t h;
		memcpy(&h, p + 4 + 2 * i, 2);
		if (h >= BLK_QUEUE_SIZE || seen[h]++) {
			snprintf(why, whylen, "virtio-blk state: kept request %u: chain head %u out of "
				 "range or twice", i, h);
			return -ERANGE;
		}
	}
	return 0;
}

/* Lock held, the transport loaded: each kept chain read again from guest
 * RAM and kept as on the source. */
static int blk__load_kept(struct blk *b, const uint8_t *p, uint16_t n, char *why, size_t whylen)
{
	struct virtq *q = &b->vp.vqs[0];
	if (n > q->inflight) {
		snprintf(why, whylen, "virtio-blk state: %u requests kept, but the queue has %u "
			 "chains taken", n, q->inflight);
		return -EINVAL;
	}
	for (uint16_t i = 0; i < n; i++) {
		uint16_t h;
		const char *vwhy = "not a request it can retry";
		bool answered;
		memcpy(&h, p + 4 + 2 * i, 2);
		struct blk_req *r = b->free;
		if (!r || h >= q->size || virtq__chain_at(q, &b->mem, h, &b->chain, &vwhy) ||
		    blk__parse(b, &b->chain, r, &answered) != 1) {
			snprintf(why, whylen, "virtio-blk state: kept request at chain %u: %s", h, vwhy);
			return -EINVAL;
		}
		b->free = r->next_free;
		r->b = b;
		r->gen = b->gen;
		r->io.iov = r->iov;
		r->io.niov = r->niov;
		blk__keep(b, r);
	}
	__atomic_store_n(&b->io_status, p ? p[0] : BLK_IOS_OK, __ATOMIC_RELAXED);
	return 0;
}

int blk__load(struct blk *b, uint32_t version, const void *data, size_t len, char *why,
	      size_t whylen)
{
	const uint8_t *p = data;
	uint32_t head[2];
	bool v2 = version == BLK_STATE_VERSION_KEPT;
	uint32_t magic = v2 ? BLK_STATE_MAGIC_KEPT : BLK_STATE_MAGIC;
	if ((!v2 && version != BLK_STATE_VERSION_PLAIN) || len < 8 ||
	    (memcpy(head, p, 8), head[0] != magic) || head[1] > len - 8) {
		snprintf(why, whylen, "virtio-blk state: bad header");
		return -EINVAL;
	}
	size_t rest = len - 8 - head[1];
	const uint8_t *conf = p + 8 + head[1], *kept = v2 ? conf + BLK_STATE_CONF : NULL;
	uint16_t n;
	if (rest < BLK_STATE_CONF) {
		snprintf(why, whylen, "virtio-blk state: truncated");
		return -EINVAL;
	}
	int rc = blk__check_kept(kept, rest - BLK_STATE_CONF, &n, why, whylen);
	if (rc == -EINVAL)
		snprintf(why, whylen, "virtio-blk state: %s", v2 ? "malformed kept requests" :
			 "trailing bytes");
	if (!rc)
		rc = blk__check_conf(b, conf, why, whylen);
	if (rc)
		return -EINVAL;
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
			rc = blk__load_kept(b, kept, n, why, whylen);
		}
	}
	pthread_mutex_unlock(&b->vp.lock);
	return rc;
}
