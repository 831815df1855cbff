/* The xbzrle cache; see xbzrle_cache.h. */
#include "mig/send/xbzrle_cache.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "mig/wire/proto.h"

bool xbzrle_cache__size_ok(uint64_t bytes)
{
	return bytes >= PROTO_PAGE_SIZE && !(bytes & (bytes - 1));
}

int xbzrle_cache__init(struct xbzrle_cache *c, uint64_t bytes, uint64_t npages)
{
	*c = (struct xbzrle_cache){ 0 };
	if (!xbzrle_cache__size_ok(bytes) || !npages)
		return -EINVAL;
	uint64_t slots = bytes / PROTO_PAGE_SIZE, need = 1;
	while (need < npages)
		need <<= 1;
	if (slots > need)
		slots = need;
	c->tag = calloc(slots, sizeof(*c->tag));
	void *d = mmap(NULL, slots * PROTO_PAGE_SIZE, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (!c->tag || d == MAP_FAILED) {
		free(c->tag);
		if (d != MAP_FAILED)
			munmap(d, slots * PROTO_PAGE_SIZE);
		c->tag = NULL;
		return -ENOMEM;
	}
	c->data = d;
	c->slots = slots;
	return 0;
}

void xbzrle_cache__free(struct xbzrle_cache *c)
{
	if (c->data)
		munmap(c->data, c->slots * PROTO_PAGE_SIZE);
	free(c->tag);
	*c = (struct xbzrle_cache){ 0 };
}

uint8_t *xbzrle_cache__find(struct xbzrle_cache *c, uint64_t page)
{
	uint64_t i = page & (c->slots - 1);
	return c->tag[i] == page + 1 ? c->data + i * PROTO_PAGE_SIZE : NULL;
}

uint8_t *xbzrle_cache__claim(struct xbzrle_cache *c, uint64_t page)
{
	uint64_t i = page & (c->slots - 1);
	c->tag[i] = page + 1;
	return c->data + i * PROTO_PAGE_SIZE;
}
