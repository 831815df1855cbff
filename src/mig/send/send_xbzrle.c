/* The outgoing side of xbzrle (send_impl.h, mig/wire/xbzrle.h).
 *
 * Each page is first copied (the guest may write it meanwhile), and that
 * copy alone is judged, sent and kept: the cache then holds exactly what
 * the destination holds.  A page in the cache goes as its delta, or whole
 * when the delta would not be shorter (an overflow); a page not in it
 * goes whole and takes its slot; a zero page goes as an entry without
 * bytes (its copy, if cached, becomes zero).  A page equal to its copy is
 * not sent at all. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "mig/migration.h"
#include "mig/send/send_impl.h"
#include "mig/wire/xbzrle.h"

#define XB_REC_CAP (XBZRLE_RECORD_HEAD + \
		    (size_t)SENDER_BATCH_PAGES * (XBZRLE_ENTRY_HEAD + RAM_PAGE_SIZE))

int sender__xbzrle_init(struct sender *s)
{
	struct migration *m = s->m;
	pthread_mutex_lock(&m->lock);
	bool on = m->params.cap_xbzrle;
	uint64_t size = m->params.xbzrle_cache_size;
	pthread_mutex_unlock(&m->lock);
	if (!on)
		return 0;
	int rc = xbzrle_cache__init(&s->xb.cache, size, s->ram->npages);
	s->xb.snap = malloc(RAM_PAGE_SIZE);
	s->xb.rec = malloc(XB_REC_CAP);
	if (!rc && (!s->xb.snap || !s->xb.rec))
		rc = -ENOMEM;
	if (rc) {
		migration__set_error(m, "xbzrle: no cache of %llu bytes: %s",
				     (unsigned long long)size, strerror(-rc));
		return rc;
	}
	s->xb.on = true;
	s->xb.cache_size = size;
	log_info("migration: xbzrle with a cache of %llu pages once the bulk pass is over",
		 (unsigned long long)s->xb.cache.slots);
	return 0;
}

void sender__xbzrle_resize(struct sender *s)
{
	struct sender_xbzrle *x = &s->xb;
	if (!x->on || x->stopped)
		return;
	pthread_mutex_lock(&s->m->lock);
	uint64_t size = s->m->params.xbzrle_cache_size;
	pthread_mutex_unlock(&s->m->lock);
	if (size == x->cache_size)
		return;
	/* an empty cache of the new size: its pages go whole once more */
	struct xbzrle_cache c;
	int rc = xbzrle_cache__init(&c, size, s->ram->npages);
	if (rc) {
		log_warn("migration: xbzrle keeps its cache of %llu bytes: none of %llu: %s",
			 (unsigned long long)x->cache_size, (unsigned long long)size,
			 strerror(-rc));
		return;
	}
	xbzrle_cache__free(&x->cache);
	x->cache = c;
	log_info("migration: xbzrle cache resized from %llu to %llu bytes (%llu pages)",
		 (unsigned long long)x->cache_size, (unsigned long long)size,
		 (unsigned long long)c.slots);
	x->cache_size = size;
}

void sender__xbzrle_free(struct sender *s)
{
	xbzrle_cache__free(&s->xb.cache);
	free(s->xb.snap);
	free(s->xb.rec);
	s->xb.snap = s->xb.rec = NULL;
	s->xb.on = false;
}

int sender__xbzrle_flush(struct sender *s)
{
	struct sender_xbzrle *x = &s->xb;
	if (!x->n) {            /* unchanged pages only */
		s->comp_saved += x->saved;
		x->saved = 0;
		return 0;
	}
	ssize_t h = proto__encode_xbzrle_head(x->rec, XB_REC_CAP, (uint32_t)x->block, x->n, x->len);
	int rc = h < 0 ? (int)h : mig_stream__write(s->stream, x->rec, XBZRLE_RECORD_HEAD + x->len);
	if (!rc)
		s->comp_saved += x->saved;
	x->n = 0;
	x->len = 0;
	x->saved = 0;
	return rc;
}

/* The entry of x->snap at e (room for a whole page is there): its length
 * (0 for nothing to send), and the cache updated to what it brings. */
static long xb__entry(struct sender *s, uint64_t page, uint8_t *e)
{
	struct sender_xbzrle *x = &s->xb;
	uint8_t *copy = xbzrle_cache__find(&x->cache, page);
	ssize_t d = -ENOSPC;
	if (s->zero_detect && sender__page_is_zero(x->snap) &&
	    !(copy && sender__page_is_zero(copy))) {
		if (copy)
			memset(copy, 0, RAM_PAGE_SIZE);
		s->zero_pages++;
		return XBZRLE_ENTRY_HEAD;
	}
	if (copy)
		d = xbzrle__encode(copy, x->snap, e + XBZRLE_ENTRY_HEAD, XBZRLE_MAX_DELTA);
	else
		x->misses++;
	if (!d) {               /* moved as much as a page sent, at no cost */
		x->unchanged++;
		x->saved += RAM_PAGE_SIZE;
		return 0;
	}
	if (d > 0) {
		x->pages++;
		x->bytes += XBZRLE_ENTRY_HEAD + (uint64_t)d;
		/* a delta of 4087 bytes or more saves nothing */
		uint64_t cost = XBZRLE_ENTRY_HEAD + (uint64_t)d;
		x->saved += cost < RAM_PAGE_SIZE ? RAM_PAGE_SIZE - cost : 0;
		if (mig_fault__xbzrle_flip(&s->fault, s->paused))
			e[XBZRLE_ENTRY_HEAD + d - 1] ^= 0xff;
	} else {
		if (copy)
			x->overflows++;
		d = RAM_PAGE_SIZE;
		memcpy(e + XBZRLE_ENTRY_HEAD, x->snap, RAM_PAGE_SIZE);
		s->normal_pages++;
	}
	memcpy(copy ? copy : xbzrle_cache__claim(&x->cache, page), x->snap, RAM_PAGE_SIZE);
	return XBZRLE_ENTRY_HEAD + d;
}

int sender__xbzrle_page(struct sender *s, int b, uint64_t off, uint64_t page,
			const uint8_t *host)
{
	struct sender_xbzrle *x = &s->xb;
	int rc = 0;
	if (x->n && (x->block != b || x->n == SENDER_BATCH_PAGES))
		rc = sender__xbzrle_flush(s);
	if (rc)
		return rc;
	x->block = b;
	x->looked++;
	memcpy(x->snap, host, RAM_PAGE_SIZE);
	uint8_t *e = x->rec + XBZRLE_RECORD_HEAD + x->len;
	long n = xb__entry(s, page, e);
	if (!n)
		return 0;
	proto__put_xbzrle_entry(e, off, (uint16_t)(n - XBZRLE_ENTRY_HEAD));
	x->len += (size_t)n;
	x->n++;
	return 0;
}

void sender__xbzrle_stats(const struct sender *s, struct mig_stats *st)
{
	const struct sender_xbzrle *x = &s->xb;
	if (!x->on)
		return;
	st->xbzrle = true;
	st->xbzrle_cache_size = x->cache_size;
	st->xbzrle_pages = x->pages;
	st->xbzrle_bytes = x->bytes;
	st->xbzrle_misses = x->misses;
	st->xbzrle_overflow = x->overflows;
	st->xbzrle_unchanged = x->unchanged;
	st->xbzrle_looked = x->looked;
}
