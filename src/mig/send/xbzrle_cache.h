/* The source's copies of pages as the destination holds them (capability
 * xbzrle, parameter xbzrle-cache-size): what a page's delta is taken
 * against.  Direct-mapped: page p may live in slot p mod slots only, and
 * a page put there replaces whichever was.  Every copy must be exactly
 * what the destination holds (the bytes that were sent, not the page as
 * it reads later), else a delta against it corrupts the destination's.
 * Pure memory; not thread-safe (the migration thread's). */
#ifndef KMIG_MIG_XBZRLE_CACHE_H
#define KMIG_MIG_XBZRLE_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/log.h"

struct xbzrle_cache {
	uint64_t slots;             /* a power of two; 0 before init */
	uint64_t *tag;              /* page + 1 held by each slot, 0 = none */
	uint8_t *data;              /* slots pages (mapped, touched as used) */
};

/* Whether bytes is a valid xbzrle-cache-size: a power of two, at least a
 * page (QEMU's rule). */
bool xbzrle_cache__size_ok(uint64_t bytes);
/* Room for bytes (xbzrle_cache__size_ok) worth of pages, but no more
 * slots than a power of two holding npages needs.  0, -EINVAL or -ENOMEM. */
int xbzrle_cache__init(struct xbzrle_cache *c, uint64_t bytes, uint64_t npages) KMIG_MUST_CHECK;
void xbzrle_cache__free(struct xbzrle_cache *c);
/* The copy of page held, or NULL. */
uint8_t *xbzrle_cache__find(struct xbzrle_cache *c, uint64_t page);
/* The slot of page, now holding page (the caller fills its 4096 bytes);
 * whichever page held it is gone. */
uint8_t *xbzrle_cache__claim(struct xbzrle_cache *c, uint64_t page);

#endif
