#include "dev/balloon.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "dev/balloon_impl.h"

int64_t balloon__page_of(const struct balloon *b, uint64_t gpa)
{
	int i = ram__block_of(b->ram, gpa);
	if (i < 0)
		return -1;
	const struct ram_block *blk = &b->ram->blocks[i];
	return (int64_t)(blk->first_page + ((gpa - blk->gpa) >> RAM_PAGE_SHIFT));
}

/* Drops [gpa, gpa + len) (page aligned, inside one block) from the host
 * and records the change (it now reads as zero; while discards are held
 * it stays as it was). */
void balloon__discard(struct balloon *b, uint64_t gpa, uint64_t len)
{
	uint8_t *h = ram__gpa_to_host(b->ram, gpa, len);
	if (!h || !len)
		return;
	if (!atomic_load(&b->hold_discards) && ram__discard(b->ram, h, len))
		log_warn("balloon: discarding 0x%llx+0x%llx failed",
			 (unsigned long long)gpa, (unsigned long long)len);
	if (b->mem.mark)
		b->mem.mark(b->mem.mark_ctx, gpa, len);
}

/* Frames ballooned now, discarded from the host (again, for most). */
static void balloon__discard_ballooned(struct balloon *b)
{
	const struct bitmap *m = &b->ballooned;
	for (size_t p = bitmap__next_set(m, 0); p < m->nbits;) {
		size_t end = p + 1;
		while (end < m->nbits && bitmap__test(m, end))
			end++;
		if (ram__discard(b->ram, b->ram->base + p * RAM_PAGE_SIZE,
				 (end - p) * RAM_PAGE_SIZE))
			log_warn("balloon: discarding after a hold failed");
		p = bitmap__next_set(m, end);
	}
}

void balloon__hold_discards(struct balloon *b, bool hold)
{
	if (!b)
		return;
	pthread_mutex_lock(&b->vp.lock);
	atomic_store(&b->hold_discards, hold);
	if (!hold)
		balloon__discard_ballooned(b);
	pthread_mutex_unlock(&b->vp.lock);
}

/* Accumulates contiguous frames so one madvise covers a run. */
struct balloon_run {
	uint64_t gpa, len;
};

static void balloon__run_add(struct balloon *b, struct balloon_run *r, uint64_t gpa)
{
	if (r->len && r->gpa + r->len == gpa &&
	    ram__block_of(b->ram, gpa) == ram__block_of(b->ram, r->gpa)) {
		r->len += RAM_PAGE_SIZE;
		return;
	}
	balloon__discard(b, r->gpa, r->len);
	*r = (struct balloon_run){ gpa, RAM_PAGE_SIZE };
}

/* One PFN array; inflate marks and discards, deflate unmarks. */
static void balloon__pfns(struct balloon *b, const struct virtq_buf *buf, bool inflate,
			  struct balloon_run *run)
{
	for (uint32_t i = 0; i + 4 <= buf->len; i += 4) {
		uint32_t pfn;
		memcpy(&pfn, buf->host + i, 4);
		uint64_t gpa = (uint64_t)pfn << RAM_PAGE_SHIFT;
		int64_t page = ram__gpa_to_host(b->ram, gpa, RAM_PAGE_SIZE) ? balloon__page_of(b, gpa) : -1;
		if (page < 0) {
			BALLOON_STAT_ADD(b, bad_pfns, 1);
			continue;
		}
		if (inflate && bitmap__test_and_set(&b->ballooned, (size_t)page)) {
			BALLOON_STAT_ADD(b, inflated, 1);
			BALLOON_STAT_ADD(b, ballooned, 1);
			balloon__run_add(b, run, gpa);
		} else if (!inflate && bitmap__test(&b->ballooned, (size_t)page)) {
			bitmap__clear_bit(&b->ballooned, (size_t)page);
			BALLOON_STAT_ADD(b, deflated, 1);
			BALLOON_STAT_ADD(b, ballooned, (uint64_t)-1);
		}
	}
}

int balloon__queue(const struct balloon *b, enum balloon_vq role)
{
	static const unsigned feature[BALLOON_NR_VQS] = {
		[BALLOON_VQ_STATS] = BALLOON_F_STATS_VQ, [BALLOON_VQ_FREE_PAGE] = BALLOON_F_FREE_PAGE_HINT,
		[BALLOON_VQ_REPORTING] = BALLOON_F_REPORTING,
	};
	if ((unsigned)role >= BALLOON_NR_VQS)
		return -1;
	if (role <= BALLOON_VQ_DEFLATE)
		return (int)role;
	if (!virtio_pci__has(&b->vp, feature[role]))
		return -1;
	int qi = BALLOON_VQ_DEFLATE + 1;
	for (unsigned r = BALLOON_VQ_STATS; r < (unsigned)role; r++)
		qi += virtio_pci__has(&b->vp, feature[r]);
	return qi;
}

int balloon__role(const struct balloon *b, unsigned qi)
{
	for (unsigned r = 0; r < BALLOON_NR_VQS; r++)
		if (balloon__queue(b, (enum balloon_vq)r) == (int)qi)
			return (int)r;
	return -1;
}

void balloon__drain(struct balloon *b, unsigned qi, balloon_chain_fn fn)
{
	struct virtq *q = &b->vp.vqs[qi];
	struct virtq_chain c;
	const char *why = NULL;
	bool used = false;
	int rc;
	while ((rc = virtq__pop(q, &b->mem, &c, &why)) == 1) {
		fn(b, qi, &c);
		if (virtq__push(q, &b->mem, c.head, 0))
			break;
		used = true;
	}
	if (rc < 0)
		virtio_pci__fail(&b->vp, why);
	if (used)
		virtio_pci__queue_used(&b->vp, qi);
}

/* Inflate/deflate: the readable buffers hold 32-bit page frame numbers. */
static void balloon__page_chain(struct balloon *b, unsigned qi, const struct virtq_chain *c)
{
	struct balloon_run run = { 0, 0 };
	for (unsigned i = 0; i < c->nout; i++)
		balloon__pfns(b, &c->bufs[i], balloon__role(b, qi) == BALLOON_VQ_INFLATE, &run);
	balloon__discard(b, run.gpa, run.len);
}

/* Free page reporting: every writable buffer is a free range to drop. */
static void balloon__report_chain(struct balloon *b, unsigned qi, const struct virtq_chain *c)
{
	(void)qi;
	for (unsigned i = c->nout; i < c->n; i++) {
		uint64_t lo = (c->bufs[i].gpa + RAM_PAGE_SIZE - 1) & ~(RAM_PAGE_SIZE - 1);
		uint64_t hi = (c->bufs[i].gpa + c->bufs[i].len) & ~(RAM_PAGE_SIZE - 1);
		if (hi > lo) {
			balloon__discard(b, lo, hi - lo);
			BALLOON_STAT_ADD(b, reported_pages, (hi - lo) >> RAM_PAGE_SHIFT);
		}
	}
}

static void balloon__notify(void *ctx, unsigned q)
{
	struct balloon *b = ctx;
	switch (balloon__role(b, q)) {
	case BALLOON_VQ_INFLATE:
	case BALLOON_VQ_DEFLATE: balloon__drain(b, q, balloon__page_chain); break;
	case BALLOON_VQ_FREE_PAGE: balloon__drain(b, q, balloon__hint_chain); break;
	case BALLOON_VQ_REPORTING: balloon__drain(b, q, balloon__report_chain); break;
	default: break; /* stats: buffers stay with the device */
	}
}

static void balloon__cfg_image(const struct balloon *b, uint8_t img[BALLOON_CFG_SIZE])
{
	uint32_t w[4] = { __atomic_load_n(&b->num_pages, __ATOMIC_RELAXED),
			  __atomic_load_n(&b->actual, __ATOMIC_RELAXED), b->cmd_id, b->poison_val };
	memcpy(img, w, sizeof(w));
}

static void balloon__cfg_read(void *ctx, uint32_t off, uint8_t *data, unsigned len)
{
	uint8_t img[BALLOON_CFG_SIZE];
	balloon__cfg_image(ctx, img);
	memcpy(data, img + off, len);
}

static void balloon__cfg_write(void *ctx, uint32_t off, const uint8_t *data, unsigned len)
{
	struct balloon *b = ctx;
	uint8_t img[BALLOON_CFG_SIZE];
	balloon__cfg_image(b, img);
	memcpy(img + off, data, len);
	uint32_t actual, poison;
	memcpy(&actual, img + 4, 4);
	memcpy(&poison, img + 12, 4);
	b->poison_val = poison;
	if (actual != __atomic_load_n(&b->actual, __ATOMIC_RELAXED)) {
		__atomic_store_n(&b->actual, actual, __ATOMIC_RELAXED);
		if (b->on_change)
			b->on_change(b->on_change_ctx, balloon__actual_bytes_locked(b));
	}
}

static void balloon__reset(void *ctx)
{
	struct balloon *b = ctx;
	bitmap__clear_all(&b->ballooned);
	BALLOON_STAT_SET(b, ballooned, 0);
	__atomic_store_n(&b->actual, 0, __ATOMIC_RELAXED);
	b->poison_val = 0;
	balloon__hint_reset(b);
}

static const struct virtio_ops balloon__ops = {
	balloon__cfg_read, balloon__cfg_write, balloon__notify, balloon__reset, NULL,
};

int balloon__create(struct balloon **out, const struct balloon_conf *conf)
{
	struct balloon *b = calloc(1, sizeof(*b));
	if (!b)
		return -ENOMEM;
	b->ram = conf->ram;
	b->mem = (struct virtio_mem){ conf->ram, conf->mark, conf->mark_ctx };
	b->next_cmd_id = BALLOON_CMD_ID_MIN;
	pthread_cond_init(&b->hint_cond, NULL);
	struct virtio_pci_conf vc = {
		.virtio_id = VIRTIO_ID_BALLOON, .class_code = 0xff0000,
		.features = 1ull << BALLOON_F_STATS_VQ |
			    (conf->no_free_page_hint ? 0 : 1ull << BALLOON_F_FREE_PAGE_HINT) |
			    (conf->no_reporting ? 0 : 1ull << BALLOON_F_REPORTING),
		.nqueues = BALLOON_NR_VQS, .queue_max = BALLOON_QUEUE_SIZE,
		.cfg_size = BALLOON_CFG_SIZE, .irq_line = conf->irq_line, .bar_gpa = conf->bar_gpa,
	};
	int rc = bitmap__init(&b->ballooned, conf->ram->npages);
	if (!rc)
		rc = bitmap__init(&b->hinted, conf->ram->npages);
	if (!rc)
		rc = virtio_pci__init(&b->vp, &vc, &balloon__ops, b, &b->mem, conf->irq, conf->irq_ctx);
	if (rc) {
		bitmap__free(&b->ballooned);
		bitmap__free(&b->hinted);
		free(b);
		return rc;
	}
	*out = b;
	return 0;
}

void balloon__destroy(struct balloon *b)
{
	if (!b)
		return;
	virtio_pci__destroy(&b->vp);
	pthread_cond_destroy(&b->hint_cond);
	bitmap__free(&b->ballooned);
	bitmap__free(&b->hinted);
	free(b);
}

struct pci_dev *balloon__pci(struct balloon *b)
{
	return &b->vp.pci;
}

struct virtio_pci *balloon__transport(struct balloon *b)
{
	return &b->vp;
}

void balloon__set_change_cb(struct balloon *b, balloon_change_fn fn, void *ctx)
{
	pthread_mutex_lock(&b->vp.lock);
	b->on_change = fn;
	b->on_change_ctx = ctx;
	pthread_mutex_unlock(&b->vp.lock);
}

/* Without vp.lock (balloon_impl.h). */
int balloon__set_target(struct balloon *b, uint64_t bytes)
{
	if (!bytes)
		return -EINVAL;
	if (bytes > b->ram->size)
		bytes = b->ram->size;
	uint32_t target = (uint32_t)((b->ram->size - bytes) >> RAM_PAGE_SHIFT);
	if (__atomic_exchange_n(&b->num_pages, target, __ATOMIC_RELAXED) != target)
		virtio_pci__config_changed(&b->vp);
	return 0;
}

uint64_t balloon__actual_bytes_locked(const struct balloon *b)
{
	uint64_t out = (uint64_t)__atomic_load_n(&b->actual, __ATOMIC_RELAXED) << RAM_PAGE_SHIFT;
	return out < b->ram->size ? b->ram->size - out : 0;
}

uint64_t balloon__actual_bytes(struct balloon *b)
{
	return balloon__actual_bytes_locked(b);
}

void balloon__get_stats(struct balloon *b, struct balloon_stats *out)
{
	const struct balloon_stats *s = &b->stats;
	out->inflated = __atomic_load_n(&s->inflated, __ATOMIC_RELAXED);
	out->deflated = __atomic_load_n(&s->deflated, __ATOMIC_RELAXED);
	out->ballooned = __atomic_load_n(&s->ballooned, __ATOMIC_RELAXED);
	out->hint_bufs = __atomic_load_n(&s->hint_bufs, __ATOMIC_RELAXED);
	out->hinted_pages = __atomic_load_n(&s->hinted_pages, __ATOMIC_RELAXED);
	out->stale_hints = __atomic_load_n(&s->stale_hints, __ATOMIC_RELAXED);
	out->reported_pages = __atomic_load_n(&s->reported_pages, __ATOMIC_RELAXED);
	out->bad_pfns = __atomic_load_n(&s->bad_pfns, __ATOMIC_RELAXED);
	virtio_pci__notify_counts(&b->vp, &out->notify_exits, &out->notify_events);
}

enum balloon_skip balloon__skip(const struct balloon *b, uint64_t page)
{
	if (page >= b->ballooned.nbits)
		return BALLOON_SKIP_NONE;
	if (bitmap__test(&b->ballooned, page))
		return BALLOON_SKIP_BALLOONED;
	if (bitmap__test(&b->hinted, page))
		return BALLOON_SKIP_FREE;
	return BALLOON_SKIP_NONE;
}
