/* virtio-blk: one chain taken from the queue, checked and turned into a
 * backend request, or answered at once (dev/blk.h says what is refused). */
#include <string.h>

#include "dev/blk_impl.h"

void blk__answer(struct blk *b, uint16_t head, uint8_t *status, uint64_t status_gpa, uint8_t s,
		 uint32_t len)
{
	if (status) {
		*status = s;
		if (b->mem.mark)
			b->mem.mark(b->mem.mark_ctx, status_gpa, 1);
	}
	if (virtq__push(&b->vp.vqs[0], &b->mem, head, len))
		log_debug("virtio-blk: chain %u not returned (queue reset)", head);
}

/* Copies len readable bytes from byte skip on into dst: bytes copied. */
static size_t blk__gather(const struct virtq_chain *c, size_t skip, uint8_t *dst, size_t len)
{
	size_t done = 0;
	for (unsigned i = 0; i < c->nout && done < len; i++) {
		const struct virtq_buf *bf = &c->bufs[i];
		if (skip >= bf->len) {
			skip -= bf->len;
			continue;
		}
		size_t k = bf->len - skip < len - done ? bf->len - skip : len - done;
		memcpy(dst + done, bf->host + skip, k);
		done += k;
		skip = 0;
	}
	return done;
}

/* The iovecs of bytes [from, to) of buffers [first, last) of the chain. */
static void blk__slice(const struct virtq_chain *c, unsigned first, unsigned last, uint64_t from,
		       uint64_t to, struct blk_req *r)
{
	uint64_t pos = 0;
	r->niov = 0;
	for (unsigned i = first; i < last && pos < to; i++) {
		const struct virtq_buf *bf = &c->bufs[i];
		uint64_t lo = from > pos ? from - pos : 0;
		uint64_t hi = to - pos < bf->len ? to - pos : bf->len;
		if (lo < hi) {
			r->iov[r->niov] = (struct iovec){ bf->host + lo, (size_t)(hi - lo) };
			r->gpa[r->niov++] = bf->gpa + lo;
		}
		pos += bf->len;
	}
}

/* Whether [sector, sector + bytes / 512) lies in the image, aligned to
 * the logical block size. */
static bool blk__range_ok(const struct blk *b, uint64_t sector, uint64_t bytes)
{
	uint64_t spb = b->lbs / 512;
	return !(bytes % b->lbs) && !(sector % spb) && sector <= b->capacity &&
	       bytes / 512 <= b->capacity - sector;
}

/* GET_ID: the serial into the data buffers (zero padded to 20 bytes, or
 * cut to what they hold); bytes written. */
static uint32_t blk__get_id(struct blk *b, struct blk_req *r)
{
	uint32_t done = 0;
	for (unsigned i = 0; i < r->niov && done < BLK_ID_LEN; i++) {
		size_t k = r->iov[i].iov_len < BLK_ID_LEN - done ? r->iov[i].iov_len : BLK_ID_LEN - done;
		memcpy(r->iov[i].iov_base, b->serial + done, k);
		if (b->mem.mark)
			b->mem.mark(b->mem.mark_ctx, r->gpa[i], k);
		done += (uint32_t)k;
	}
	return done;
}

/* DISCARD / WRITE_ZEROES segments (readable data, 16 bytes each) into
 * r->io.ranges: BLK_S_OK, or the status to answer with. */
static uint8_t blk__segments(struct blk *b, const struct virtq_chain *c, uint64_t data,
			     struct blk_req *r)
{
	uint8_t raw[BLK_MAX_SEGS * BLK_SEG_LEN];
	unsigned n = (unsigned)(data / BLK_SEG_LEN);
	if (!data || data % BLK_SEG_LEN || data > sizeof(raw))
		return BLK_S_IOERR;
	if (blk__gather(c, BLK_HDR_LEN, raw, (size_t)data) != data)
		return BLK_S_IOERR;
	r->io.nranges = 0;
	for (unsigned i = 0; i < n; i++) {
		uint64_t sector;
		uint32_t num, flags;
		memcpy(&sector, raw + BLK_SEG_LEN * i, 8);
		memcpy(&num, raw + BLK_SEG_LEN * i + 8, 4);
		memcpy(&flags, raw + BLK_SEG_LEN * i + 12, 4);
		if (r->type == BLK_T_DISCARD ? flags != 0 : (flags & ~1u) != 0)
			return BLK_S_UNSUPP;
		if (num > BLK_MAX_RANGE_SECTORS || !blk__range_ok(b, sector, (uint64_t)num * 512))
			return BLK_S_IOERR;
		if (!num)
			continue;
		r->io.ranges[r->io.nranges++] = (struct blkfile_range){
			sector * 512, (uint64_t)num * 512, flags & 1 };
	}
	return BLK_S_OK;
}

/* The request's type against what it carries: BLK_S_OK with r->io set
 * up, or the status to answer with. */
static uint8_t blk__check(struct blk *b, const struct virtq_chain *c, uint64_t rd, uint64_t wr,
			  uint64_t sector, struct blk_req *r)
{
	uint64_t out = rd - BLK_HDR_LEN, in = wr - 1;
	switch (r->type) {
	case BLK_T_IN:
	case BLK_T_OUT: {
		bool w = r->type == BLK_T_OUT;
		r->bytes = w ? out : in;
		if ((w ? in : out) || r->bytes > BLK_REQ_MAX || !blk__range_ok(b, sector, r->bytes) ||
		    (w && b->read_only))
			return BLK_S_IOERR;
		if (w)
			blk__slice(c, 0, c->nout, BLK_HDR_LEN, rd, r);
		else
			blk__slice(c, c->nout, c->n, 0, in, r);
		r->io.op = w ? BLKFILE_WRITE : BLKFILE_READ;
		r->io.off = sector * 512;
		return BLK_S_OK;
	}
	case BLK_T_FLUSH:
		r->io.op = BLKFILE_FLUSH;
		return BLK_S_OK;
	case BLK_T_GET_ID:
		return in ? BLK_S_OK : BLK_S_IOERR;
	case BLK_T_DISCARD:
	case BLK_T_WRITE_ZEROES: {
		bool d = r->type == BLK_T_DISCARD;
		if (!virtio_pci__has(&b->vp, d ? BLK_F_DISCARD : BLK_F_WRITE_ZEROES))
			return BLK_S_UNSUPP;
		if (b->read_only)
			return BLK_S_IOERR;
		r->io.op = d ? BLKFILE_DISCARD : BLKFILE_ZERO;
		return blk__segments(b, c, out, r);
	}
	default:
		return BLK_S_UNSUPP;
	}
}

static void blk__count(struct blk *b, uint8_t s)
{
	if (s == BLK_S_UNSUPP)
		BLK_STAT_ADD(b, unsupported, 1);
	else if (s != BLK_S_OK)
		BLK_STAT_ADD(b, bad_requests, 1);
}

int blk__parse(struct blk *b, const struct virtq_chain *c, struct blk_req *r, bool *used)
{
	uint64_t rd = 0, wr = 0;
	uint8_t hdr[BLK_HDR_LEN];
	for (unsigned i = 0; i < c->n; i++)
		*(c->bufs[i].writable ? &wr : &rd) += c->bufs[i].len;
	int last = -1;                      /* the last writable buffer with a byte */
	for (unsigned i = c->nout; i < c->n; i++)
		if (c->bufs[i].len)
			last = (int)i;
	*used = true;
	if (last < 0) {
		BLK_STAT_ADD(b, no_status, 1);
		blk__answer(b, c->head, NULL, 0, 0, 0);
		return 0;
	}
	const struct virtq_buf *sb = &c->bufs[last];
	r->status = sb->host + sb->len - 1;
	r->status_gpa = sb->gpa + sb->len - 1;
	r->head = c->head;
	r->niov = 0;
	r->bytes = 0;
	r->io.nranges = 0;
	if (rd < BLK_HDR_LEN || blk__gather(c, 0, hdr, BLK_HDR_LEN) != BLK_HDR_LEN) {
		BLK_STAT_ADD(b, bad_requests, 1);
		blk__answer(b, c->head, r->status, r->status_gpa, BLK_S_IOERR, 1);
		return 0;
	}
	uint32_t type;
	uint64_t sector;
	memcpy(&type, hdr, 4);
	memcpy(&sector, hdr + 8, 8);
	r->type = type > 0xff ? 0xff : (uint8_t)type;
	uint8_t s = type > 0xff ? BLK_S_UNSUPP : blk__check(b, c, rd, wr, sector, r);
	if (s == BLK_S_OK && r->type == BLK_T_GET_ID) {
		blk__slice(c, c->nout, c->n, 0, wr - 1, r);
		uint32_t n = blk__get_id(b, r);
		BLK_STAT_ADD(b, get_id_ops, 1);
		blk__answer(b, c->head, r->status, r->status_gpa, n ? BLK_S_OK : BLK_S_IOERR, n + 1);
		return 0;
	}
	bool nothing = s == BLK_S_OK && ((r->type <= BLK_T_OUT && !r->bytes) ||
					 ((r->type == BLK_T_DISCARD || r->type == BLK_T_WRITE_ZEROES) &&
					  !r->io.nranges));
	if (s != BLK_S_OK || nothing) {
		blk__count(b, s);
		blk__answer(b, c->head, r->status, r->status_gpa, s, 1);
		return 0;
	}
	*used = false;
	return 1;
}
