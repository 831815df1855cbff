#include "dev/blk.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/timeutil.h"
#include "dev/blk_impl.h"

/* ---------------- completion ---------------- */

/* r is no longer in flight: back to the free list, or kept. */
static void blk__req_done(struct blk *b, struct blk_req *r, bool keep)
{
	if (keep) {
		blk__keep(b, r);
	} else {
		r->next_free = b->free;
		b->free = r;
	}
	if (!--b->inflight)
		pthread_cond_broadcast(&b->idle);
	BLK_STAT_ADD(b, inflight, (uint64_t)-1);
}

static void blk__count_done(struct blk *b, const struct blk_req *r, int res)
{
	if (res) {
		BLK_STAT_ADD(b, io_errors, 1);
		return;
	}
	switch (r->type) {
	case BLK_T_IN: BLK_STAT_ADD(b, rd_ops, 1); BLK_STAT_ADD(b, rd_bytes, r->bytes); break;
	case BLK_T_OUT: BLK_STAT_ADD(b, wr_ops, 1); BLK_STAT_ADD(b, wr_bytes, r->bytes); break;
	case BLK_T_FLUSH: BLK_STAT_ADD(b, flush_ops, 1); break;
	case BLK_T_DISCARD: BLK_STAT_ADD(b, discard_ops, 1); break;
	default: BLK_STAT_ADD(b, write_zeroes_ops, 1); break;
	}
}

/* On a backend worker: the request ran (res 0 or -errno). */
static void blk__complete(struct blkfile_req *io, int res)
{
	struct blk_req *r = (struct blk_req *)io;
	struct blk *b = r->b;
	struct blk_io_error e = { .action = BLK_ACT_REPORT };
	bool failed = false, keep = false;
	pthread_mutex_lock(&b->vp.lock);
	blk__count_done(b, r, res);
	if (r->gen == b->gen) {
		failed = res != 0;
		keep = failed && blk__on_failure(b, r, res, &e) == BLK_ACT_STOP;
		uint32_t len = 1;
		if (r->type == BLK_T_IN) {  /* the data is in guest memory, even on failure */
			for (unsigned i = 0; b->mem.mark && i < r->niov; i++)
				b->mem.mark(b->mem.mark_ctx, r->gpa[i], r->iov[i].iov_len);
			len += (uint32_t)r->bytes;
		}
		if (!keep) {
			uint8_t s = failed && e.action == BLK_ACT_REPORT ? BLK_S_IOERR : BLK_S_OK;
			blk__answer(b, r->head, r->status, r->status_gpa, s, len);
			virtio_pci__queue_used(&b->vp, 0);
		}
	}
	/* copied under the lock: once r is done a destroy may free b */
	void (*on_error)(void *, const struct blk_io_error *) = failed ? b->on_error : NULL;
	void *error_ctx = b->error_ctx;
	blk__req_done(b, r, keep);
	pthread_mutex_unlock(&b->vp.lock);
	if (on_error)
		on_error(error_ctx, &e);
}

/* ---------------- the queue ---------------- */

bool blk__submit(struct blk *b, struct blk_req *r)
{
	r->gen = b->gen;
	r->io.iov = r->iov;
	r->io.niov = r->niov;
	r->io.done = blk__complete;
	b->inflight++;
	BLK_STAT_ADD(b, inflight, 1);
	int rc = blkfile__submit(b->file, &r->io);
	if (!rc)
		return false;
	BLK_STAT_ADD(b, io_errors, 1);
	blk__answer(b, r->head, r->status, r->status_gpa, BLK_S_IOERR, 1);
	blk__req_done(b, r, false);
	return true;
}

static void blk__notify(void *ctx, unsigned qi)
{
	struct blk *b = ctx;
	struct virtq *q = &b->vp.vqs[0];
	const char *why = NULL;
	bool used = false;
	int rc = 0;
	if (qi != 0)
		return;
	blk__resubmit_kept(b, &used);
	while (b->free && (rc = virtq__pop(q, &b->mem, &b->chain, &why)) == 1) {
		struct blk_req *r = b->free;
		bool answered;
		b->free = r->next_free;
		r->b = b;
		if (blk__parse(b, &b->chain, r, &answered))
			answered = blk__submit(b, r);
		else
			r->next_free = b->free, b->free = r;
		used |= answered;
	}
	if (rc < 0)
		virtio_pci__fail(&b->vp, why);
	if (used)
		virtio_pci__queue_used(&b->vp, 0);
}

/* Lock held: until nothing is in flight, or the deadline (0: none). */
static int blk__wait_idle(struct blk *b, uint64_t timeout_ns)
{
	struct timespec ts = time__deadline(timeout_ns);
	while (b->inflight) {
		if (!timeout_ns)
			pthread_cond_wait(&b->idle, &b->vp.lock);
		else if (pthread_cond_timedwait(&b->idle, &b->vp.lock, &ts) == ETIMEDOUT)
			return b->inflight ? -ETIMEDOUT : 0;
	}
	return 0;
}

int blk__drain(struct blk *b, uint64_t timeout_ns)
{
	pthread_mutex_lock(&b->vp.lock);
	int rc = blk__wait_idle(b, timeout_ns);
	pthread_mutex_unlock(&b->vp.lock);
	return rc ? rc : blkfile__flush(b->file);
}

/* ---------------- transport callbacks ---------------- */

static void blk__put(uint8_t *p, uint64_t v, unsigned len)
{
	for (unsigned i = 0; i < len; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void blk__cfg_read(void *ctx, uint32_t off, uint8_t *data, unsigned len)
{
	struct blk *b = ctx;
	uint8_t img[BLK_CFG_SIZE] = { 0 };
	blk__put(img + 0, b->capacity, 8);
	blk__put(img + 8, BLK_SIZE_MAX, 4);
	blk__put(img + 12, BLK_SEG_MAX, 4);
	blk__put(img + 20, b->lbs, 4);
	blk__put(img + 26, 0, 2);            /* topology: min_io_size 0, */
	blk__put(img + 28, 0, 4);            /* opt_io_size 0 (none said) */
	img[32] = b->writeback;
	blk__put(img + 34, 1, 2);            /* num_queues */
	blk__put(img + 36, BLK_MAX_RANGE_SECTORS, 4);
	blk__put(img + 40, BLK_MAX_SEGS, 4);
	blk__put(img + 44, b->lbs / 512, 4);
	blk__put(img + 48, BLK_MAX_RANGE_SECTORS, 4);
	blk__put(img + 52, BLK_MAX_SEGS, 4);
	img[56] = b->discard;                /* write_zeroes_may_unmap */
	memcpy(data, img + off, len);
}

/* writeback is not writable (CONFIG_WCE is not offered) */
static void blk__cfg_write(void *ctx, uint32_t off, const uint8_t *data, unsigned len)
{
	(void)ctx, (void)off, (void)data, (void)len;
}

/* The transport is reset already: chains in flight are not returned
 * (their generation is old); wait for them, so that no buffer of the
 * old driver is written once the reset is done. */
static void blk__reset(void *ctx)
{
	struct blk *b = ctx;
	b->gen++;
	blk__drop_kept(b);
	(void)blk__wait_idle(b, 0);
}

static const struct virtio_ops blk__ops = {
	blk__cfg_read, blk__cfg_write, blk__notify, blk__reset, NULL,
};

/* ---------------- life cycle ---------------- */

static uint64_t blk__features(const struct blk *b)
{
	uint64_t f = 1ull << BLK_F_SIZE_MAX | 1ull << BLK_F_SEG_MAX | 1ull << BLK_F_BLK_SIZE |
		     1ull << BLK_F_TOPOLOGY;
	if (b->writeback)
		f |= 1ull << BLK_F_FLUSH;
	if (b->read_only)
		f |= 1ull << BLK_F_RO;
	else
		f |= 1ull << BLK_F_WRITE_ZEROES | (b->discard ? 1ull << BLK_F_DISCARD : 0);
	return f;
}

int blk__create(struct blk **out, const struct blk_conf *conf)
{
	uint32_t lbs = conf->logical_block_size;
	*out = NULL;
	if (!conf->file || lbs < 512 || lbs > 65536 || (lbs & (lbs - 1)) ||
	    blkfile__size(conf->file) % lbs)
		return -EINVAL;
	struct blk *b = calloc(1, sizeof(*b));
	if (!b || !(b->reqs = calloc(BLK_QUEUE_SIZE, sizeof(*b->reqs)))) {
		free(b);
		return -ENOMEM;
	}
	b->file = conf->file;
	b->capacity = blkfile__size(conf->file) / 512;
	b->lbs = lbs;
	b->read_only = blkfile__read_only(conf->file);
	b->writeback = conf->writeback;
	b->discard = conf->discard;
	b->werror = conf->werror;
	b->rerror = conf->rerror;
	b->on_error = conf->on_error;
	b->error_ctx = conf->error_ctx;
	memcpy(b->serial, conf->serial, strnlen(conf->serial, BLK_ID_LEN));
	for (unsigned i = 0; i < BLK_QUEUE_SIZE; i++) {
		b->reqs[i].next_free = b->free;
		b->free = &b->reqs[i];
	}
	b->mem = (struct virtio_mem){ conf->ram, conf->mark, conf->mark_ctx };
	struct virtio_pci_conf vc = {
		.virtio_id = VIRTIO_ID_BLOCK, .class_code = 0x010000, .features = blk__features(b),
		.nqueues = 1, .queue_max = BLK_QUEUE_SIZE, .cfg_size = BLK_CFG_SIZE,
		.irq_line = conf->irq_line, .bar_gpa = conf->bar_gpa,
	};
	int rc = virtio_pci__init(&b->vp, &vc, &blk__ops, b, &b->mem, conf->irq, conf->irq_ctx);
	if (!rc)
		rc = time__cond_init(&b->idle);
	if (rc) {
		free(b->reqs);
		free(b);
		return rc;
	}
	*out = b;
	return 0;
}

void blk__destroy(struct blk *b)
{
	if (!b)
		return;
	pthread_mutex_lock(&b->vp.lock);
	(void)blk__wait_idle(b, 0);
	pthread_mutex_unlock(&b->vp.lock);
	pthread_cond_destroy(&b->idle);
	virtio_pci__destroy(&b->vp);
	free(b->reqs);
	free(b);
}

struct pci_dev *blk__pci(struct blk *b) { return &b->vp.pci; }
struct virtio_pci *blk__transport(struct blk *b) { return &b->vp; }

void blk__get_stats(struct blk *b, struct blk_stats *out)
{
	const uint64_t *src = (const uint64_t *)&b->stats;
	uint64_t *dst = (uint64_t *)out;
	for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); i++)
		dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}
