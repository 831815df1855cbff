/* XBZRLE records (capability xbzrle; docs/protocol.md "XBZRLE"): a page
 * the destination already holds is sent as the bytes that changed since
 * the copy it holds, which the source keeps in a cache.
 *
 * A delta is a sequence of runs, each two ULEB128 numbers and bytes:
 *   skip   bytes left as they are (0 only in the first run)
 *   n      bytes replaced (1..4096), followed by their n new values
 * Runs never reach past the page's 4096 bytes; bytes after the last run
 * stay as they are.  Numbers take at most 2 bytes (values up to 4096).
 *
 * The record's payload: u32 block, u32 count (1..PROTO_MAX_PAGES), then
 * count entries: u64 offset, u16 len, len bytes:
 *   len 0     the page now reads as zero
 *   len 4096  the page whole
 *   otherwise a delta against the destination's copy of the page
 * and nothing after the last entry.
 *
 * Pure functions over memory, as proto.h: decoders never read outside
 * their input and explain a malformed one through *why. */
#ifndef KMIG_MIG_XBZRLE_H
#define KMIG_MIG_XBZRLE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/log.h"
#include "mig/wire/proto.h"

#define XBZRLE_ENTRY_HEAD 10u                   /* u64 offset, u16 len */
#define XBZRLE_RECORD_HEAD (PROTO_HDR_SIZE + 8) /* header, block, count */
#define XBZRLE_MAX_DELTA (PROTO_PAGE_SIZE - 1)  /* longer: the page goes whole */

/* The delta that turns old into cur (PROTO_PAGE_SIZE bytes each) into
 * out[0..cap): its length, 0 when the pages are equal, -ENOSPC when it
 * would be longer than cap (an overflow: send the page whole). */
ssize_t xbzrle__encode(const uint8_t *old, const uint8_t *cur, uint8_t *out, size_t cap);
/* 0 if enc[0..len) is a well-formed delta of 1..XBZRLE_MAX_DELTA bytes,
 * else -EPROTO with *why set. */
int xbzrle__check(const uint8_t *enc, size_t len, const char **why) KMIG_MUST_CHECK;
/* Applies a delta that passed xbzrle__check to page. */
void xbzrle__apply(const uint8_t *enc, size_t len, uint8_t *page);

/* Writes the record's header, block and count into buf (cap at least
 * XBZRLE_RECORD_HEAD) for entries of entries_len bytes that follow it;
 * returns XBZRLE_RECORD_HEAD or -EINVAL/-ENOSPC. */
ssize_t proto__encode_xbzrle_head(void *buf, size_t cap, uint32_t block, uint32_t count,
				  uint64_t entries_len) KMIG_MUST_CHECK;
/* One entry's head at buf (XBZRLE_ENTRY_HEAD bytes). */
void proto__put_xbzrle_entry(uint8_t *buf, uint64_t offset, uint16_t len);

struct proto_xbzrle {
	uint32_t block, count;
	const uint8_t *entries;     /* count entries, as laid out above */
	size_t len;
};
struct proto_xbzrle_entry {
	uint64_t offset;            /* not checked against RAM here */
	uint32_t len;               /* 0 (zero), PROTO_PAGE_SIZE (whole) or a delta's */
	const uint8_t *data;
};
/* Checks the whole payload, every delta included.  0 or -EPROTO. */
int proto__decode_xbzrle(const void *p, size_t len, struct proto_xbzrle *x,
			 const char **why) KMIG_MUST_CHECK;
/* The entry at *pos (0 for the first) of a decoded record; advances *pos. */
void proto__xbzrle_entry(const struct proto_xbzrle *x, size_t *pos, struct proto_xbzrle_entry *e);

#endif
