/* XBZRLE deltas and records; see xbzrle.h and docs/protocol.md. */
#include "mig/wire/xbzrle.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "mig/wire/proto_le.h"

#define PAGE PROTO_PAGE_SIZE
/* A run of changed bytes ends only at this many unchanged ones in a row:
 * fewer cost more as a new run's two numbers than as bytes in this one. */
#define XBZRLE_GAP 3

static size_t uleb__len(size_t v)
{
	return v < 0x80 ? 1 : 2;
}

static size_t uleb__put(uint8_t *o, size_t v)
{
	if (v < 0x80) {
		o[0] = (uint8_t)v;
		return 1;
	}
	o[0] = (uint8_t)(0x80 | (v & 0x7f));
	o[1] = (uint8_t)(v >> 7);
	return 2;
}

/* A number at enc[*i] of at most 2 bytes and at most PAGE; -1 if not. */
static int uleb__get(const uint8_t *enc, size_t len, size_t *i, size_t *v)
{
	if (*i >= len)
		return -1;
	size_t x = enc[(*i)++] & 0x7f;
	if (enc[*i - 1] & 0x80) {
		if (*i >= len || (enc[*i] & 0x80))
			return -1;
		x |= (size_t)enc[(*i)++] << 7;
	}
	*v = x;
	return x > PAGE ? -1 : 0;
}

/* The first index from i on where the pages differ (PAGE if none). */
static size_t same__until(const uint8_t *a, const uint8_t *b, size_t i)
{
	while (i < PAGE && (i % 8) && a[i] == b[i])
		i++;
	while (i + 8 <= PAGE) {
		uint64_t x, y;
		memcpy(&x, a + i, 8);
		memcpy(&y, b + i, 8);
		if (x != y)
			break;
		i += 8;
	}
	while (i < PAGE && a[i] == b[i])
		i++;
	return i;
}

/* The end of the run of changed bytes that starts at i. */
static size_t diff__until(const uint8_t *a, const uint8_t *b, size_t i)
{
	size_t end = i + 1, same = 0;
	for (size_t j = i + 1; j < PAGE && same < XBZRLE_GAP; j++) {
		if (a[j] != b[j]) {
			end = j + 1;
			same = 0;
		} else {
			same++;
		}
	}
	return end;
}

ssize_t xbzrle__encode(const uint8_t *old, const uint8_t *cur, uint8_t *out, size_t cap)
{
	size_t i = 0, o = 0;
	for (;;) {
		size_t start = i;
		i = same__until(old, cur, i);
		if (i == PAGE)
			return (ssize_t)o;
		size_t end = diff__until(old, cur, i), n = end - i, skip = i - start;
		if (uleb__len(skip) + uleb__len(n) + n > cap - o)
			return -ENOSPC;
		o += uleb__put(out + o, skip);
		o += uleb__put(out + o, n);
		memcpy(out + o, cur + i, n);
		o += n;
		i = end;
	}
}

int xbzrle__check(const uint8_t *enc, size_t len, const char **why)
{
	size_t i = 0, pos = 0;
	if (!len || len > XBZRLE_MAX_DELTA) {
		*why = "XBZRLE delta is empty or not shorter than a page";
		return -EPROTO;
	}
	while (i < len) {
		size_t skip, n;
		if (uleb__get(enc, len, &i, &skip) || uleb__get(enc, len, &i, &n)) {
			*why = "XBZRLE delta has a truncated or oversized number";
			return -EPROTO;
		}
		if (!n || (pos && !skip)) {
			*why = "XBZRLE delta has an empty or unseparated run";
			return -EPROTO;
		}
		if (skip > PAGE - pos || n > PAGE - pos - skip) {
			*why = "XBZRLE delta runs past the page's end";
			return -EPROTO;
		}
		if (n > len - i) {
			*why = "XBZRLE delta's bytes run past its end";
			return -EPROTO;
		}
		pos += skip + n;
		i += n;
	}
	return 0;
}

void xbzrle__apply(const uint8_t *enc, size_t len, uint8_t *page)
{
	size_t i = 0, pos = 0;
	while (i < len) {
		size_t skip = 0, n = 0;
		(void)uleb__get(enc, len, &i, &skip);
		(void)uleb__get(enc, len, &i, &n);
		pos += skip;
		memcpy(page + pos, enc + i, n);
		pos += n;
		i += n;
	}
}

ssize_t proto__encode_xbzrle_head(void *buf, size_t cap, uint32_t block, uint32_t count,
				  uint64_t entries_len)
{
	if (!count || count > PROTO_MAX_PAGES || entries_len > PROTO_MAX_PAYLOAD - 8)
		return -EINVAL;
	if (cap < XBZRLE_RECORD_HEAD || cap - XBZRLE_RECORD_HEAD < entries_len)
		return -ENOSPC;
	uint8_t *b = buf;
	if (proto__encode_header(b, cap, PROTO_XBZRLE, 0, 8 + entries_len))
		return -ENOSPC;
	le__put32(b + PROTO_HDR_SIZE, block);
	le__put32(b + PROTO_HDR_SIZE + 4, count);
	return XBZRLE_RECORD_HEAD;
}

void proto__put_xbzrle_entry(uint8_t *buf, uint64_t offset, uint16_t len)
{
	le__put64(buf, offset);
	buf[8] = (uint8_t)len;
	buf[9] = (uint8_t)(len >> 8);
}

void proto__xbzrle_entry(const struct proto_xbzrle *x, size_t *pos, struct proto_xbzrle_entry *e)
{
	const uint8_t *b = x->entries + *pos;
	e->offset = le__get64(b);
	e->len = (uint32_t)b[8] | (uint32_t)b[9] << 8;
	e->data = b + XBZRLE_ENTRY_HEAD;
	*pos += XBZRLE_ENTRY_HEAD + e->len;
}

int proto__decode_xbzrle(const void *payload, size_t len, struct proto_xbzrle *x,
			 const char **why)
{
	const uint8_t *p = payload;
	if (len < 8) {
		*why = "XBZRLE record too short";
		return -EPROTO;
	}
	x->block = le__get32(p);
	x->count = le__get32(p + 4);
	x->entries = p + 8;
	x->len = len - 8;
	if (!x->count || x->count > PROTO_MAX_PAGES) {
		*why = "XBZRLE page count out of range";
		return -EPROTO;
	}
	size_t pos = 0;
	for (uint32_t k = 0; k < x->count; k++) {
		struct proto_xbzrle_entry e;
		if (x->len - pos < XBZRLE_ENTRY_HEAD) {
			*why = "XBZRLE record ends inside an entry";
			return -EPROTO;
		}
		proto__xbzrle_entry(x, &pos, &e);
		if (pos > x->len) {
			*why = "XBZRLE entry's bytes run past the record's end";
			return -EPROTO;
		}
		if (e.len && e.len != PAGE && xbzrle__check(e.data, e.len, why))
			return -EPROTO;
	}
	if (pos != x->len) {
		*why = "XBZRLE record has bytes after its last entry";
		return -EPROTO;
	}
	return 0;
}
