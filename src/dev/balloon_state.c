/* STATE_DEV_VIRTIO for the balloon: layout (little-endian)
 *   u32 magic "BLN1", u32 transport length, transport (virtio_pci__save),
 *   u32 num_pages, actual, cmd_id, poison_val, next_cmd_id,
 *   u64 RAM pages, then the ballooned frames, whichever form is smaller:
 *   u32 ranges, ranges x (u32 first page, u32 pages); or
 *   u32 BALLOON_STATE_BITMAP, ceil(RAM pages / 64) x u64 bitmap words.
 * So the section never exceeds RAM pages / 8 bytes plus a few hundred,
 * however fragmented the guest's balloon (a 64 GiB guest: 2 MiB).
 * The hinted bitmap is not carried: the source sets DONE before it stops. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev/balloon_impl.h"

#define BALLOON_STATE_MAGIC 0x314e4c42u /* "BLN1" */
#define BALLOON_STATE_BITMAP 0xffffffffu
#define BALLOON_STATE_FIXED (8 + 20 + 8 + 4)

static size_t balloon__next_clear(const struct bitmap *m, size_t i)
{
	while (i < m->nbits && bitmap__test(m, i))
		i++;
	return i;
}

static size_t balloon__count_ranges(const struct bitmap *m)
{
	size_t n = 0;
	for (size_t i = bitmap__next_set(m, 0); i < m->nbits;
	     i = bitmap__next_set(m, balloon__next_clear(m, i)))
		n++;
	return n;
}

/* The ballooned frames at p (room checked by the caller): a range list or
 * the bitmap; returns the bytes written. */
static size_t balloon__put_frames(const struct balloon *b, uint8_t *p, bool bitmap)
{
	const struct bitmap *m = &b->ballooned;
	uint32_t n = 0;
	if (bitmap) {
		uint32_t mark = BALLOON_STATE_BITMAP;
		size_t bytes = (m->nbits + 63) / 64 * 8;
		memcpy(p, &mark, 4);
		memcpy(p + 4, m->words, bytes);
		return 4 + bytes;
	}
	for (size_t i = bitmap__next_set(m, 0); i < m->nbits; i = bitmap__next_set(m, i)) {
		size_t end = balloon__next_clear(m, i);
		uint32_t r[2] = { (uint32_t)i, (uint32_t)(end - i) };
		memcpy(p + 4 + (size_t)n * 8, r, 8);
		n++;
		i = end;
	}
	memcpy(p, &n, 4);
	return 4 + (size_t)n * 8;
}

int balloon__save(struct balloon *b, state_put_fn put, void *ctx)
{
	pthread_mutex_lock(&b->vp.lock);
	size_t ranges = balloon__count_ranges(&b->ballooned);
	size_t bitmap_bytes = (b->ballooned.nbits + 63) / 64 * 8;
	bool bitmap = ranges * 8 > bitmap_bytes;
	size_t cap = BALLOON_STATE_FIXED + VIRTIO_PCI_STATE_MAX + (bitmap ? bitmap_bytes : ranges * 8);
	uint8_t *buf = malloc(cap);
	if (!buf) {
		pthread_mutex_unlock(&b->vp.lock);
		return -ENOMEM;
	}
	long tl = virtio_pci__save(&b->vp, buf + 8, VIRTIO_PCI_STATE_MAX);
	int rc = tl < 0 ? (int)tl : 0;
	size_t pos = 8 + (size_t)(tl > 0 ? tl : 0);
	if (!rc) {
		uint32_t head[2] = { BALLOON_STATE_MAGIC, (uint32_t)tl };
		uint32_t cfg[5] = { __atomic_load_n(&b->num_pages, __ATOMIC_RELAXED),
				    __atomic_load_n(&b->actual, __ATOMIC_RELAXED), b->cmd_id,
				    b->poison_val, b->next_cmd_id };
		uint64_t npages = b->ram->npages;
		memcpy(buf, head, 8);
		memcpy(buf + pos, cfg, 20);
		memcpy(buf + pos + 20, &npages, 8);
		pos += 28;
		pos += balloon__put_frames(b, buf + pos, bitmap);
	}
	pthread_mutex_unlock(&b->vp.lock);
	if (!rc)
		rc = put(ctx, STATE_DEV_VIRTIO, STATE_VERSION, 0, buf, pos);
	free(buf);
	return rc;
}

static int balloon__load_bitmap(struct balloon *b, const uint8_t *p, size_t len, char *why,
				size_t whylen)
{
	struct bitmap *m = &b->ballooned;
	size_t bytes = (m->nbits + 63) / 64 * 8;
	if (len != bytes) {
		snprintf(why, whylen, "balloon state: bitmap of %zu bytes, expected %zu", len, bytes);
		return -EINVAL;
	}
	memcpy(m->words, p, bytes);
	if (m->nbits % 64)             /* no frame beyond guest RAM */
		m->words[m->nbits / 64] &= (1ull << (m->nbits % 64)) - 1;
	BALLOON_STAT_SET(b, ballooned, bitmap__count(m));
	return 0;
}

static int balloon__load_ranges(struct balloon *b, const uint8_t *p, size_t len, char *why, size_t whylen)
{
	uint32_t n;
	if (len >= 4 && (memcpy(&n, p, 4), n == BALLOON_STATE_BITMAP))
		return balloon__load_bitmap(b, p + 4, len - 4, why, whylen);
	if (len < 4 || (memcpy(&n, p, 4), (len - 4) / 8 != n || (len - 4) % 8)) {
		snprintf(why, whylen, "balloon state: bad range list");
		return -EINVAL;
	}
	bitmap__clear_all(&b->ballooned);
	BALLOON_STAT_SET(b, ballooned, 0);
	for (uint32_t i = 0; i < n; i++) {
		uint32_t r[2];
		memcpy(r, p + 4 + 8ull * i, 8);
		if (!r[1] || (uint64_t)r[0] + r[1] > b->ram->npages) {
			snprintf(why, whylen, "balloon state: range outside guest RAM");
			return -EINVAL;
		}
		bitmap__set_range(&b->ballooned, r[0], r[1]);
		BALLOON_STAT_ADD(b, ballooned, r[1]);
	}
	return 0;
}

int balloon__load(struct balloon *b, const void *data, size_t len, char *why, size_t whylen)
{
	const uint8_t *p = data;
	uint32_t head[2];
	if (len < BALLOON_STATE_FIXED || (memcpy(head, p, 8), head[0] != BALLOON_STATE_MAGIC) ||
	    head[1] > len - BALLOON_STATE_FIXED) {
		snprintf(why, whylen, "balloon state: bad header");
		return -EINVAL;
	}
	uint32_t cfg[5];
	uint64_t npages;
	size_t pos = 8 + head[1];
	memcpy(cfg, p + pos, 20);
	memcpy(&npages, p + pos + 20, 8);
	if (npages != b->ram->npages) {
		snprintf(why, whylen, "balloon state: RAM size differs");
		return -EINVAL;
	}
	pthread_mutex_lock(&b->vp.lock);
	const char *vwhy = NULL;
	long tl = virtio_pci__load(&b->vp, p + 8, head[1], &vwhy);
	int rc = 0;
	if (tl < 0 || (size_t)tl != head[1]) {
		snprintf(why, whylen, "balloon state: %s", vwhy ? vwhy : "transport length mismatch");
		rc = -EINVAL;
	}
	if (!rc)
		rc = balloon__load_ranges(b, p + pos + 28, len - pos - 28, why, whylen);
	if (!rc) {
		__atomic_store_n(&b->num_pages, cfg[0], __ATOMIC_RELAXED);
		__atomic_store_n(&b->actual, cfg[1], __ATOMIC_RELAXED);
		b->cmd_id = cfg[2] >= BALLOON_CMD_ID_MIN ? BALLOON_CMD_ID_DONE : cfg[2];
		b->poison_val = cfg[3];
		b->next_cmd_id = cfg[4] >= BALLOON_CMD_ID_MIN ? cfg[4] : BALLOON_CMD_ID_MIN;
	}
	pthread_mutex_unlock(&b->vp.lock);
	return rc;
}
