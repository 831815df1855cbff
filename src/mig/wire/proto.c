/* Record encoding and decoding; see proto.h and docs/protocol.md. */
#include "mig/wire/proto.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "mig/wire/proto_le.h"

const char *proto__type_name(uint32_t type)
{
	switch (type) {
	case PROTO_START:   return "START";
	case PROTO_PAGES:   return "PAGES";
	case PROTO_ZERO:    return "ZERO";
	case PROTO_STATE:   return "STATE";
	case PROTO_SYNC:    return "SYNC";
	case PROTO_END:     return "END";
	case PROTO_ERROR:   return "ERROR";
	case PROTO_CHANNEL: return "CHANNEL";
	case PROTO_RP_OK:   return "RP_OK";
	case PROTO_RP_FAIL: return "RP_FAIL";
	case PROTO_RP_PING: return "RP_PING";
	case PROTO_DISCARD: return "DISCARD";
	case PROTO_POSTCOPY: return "POSTCOPY";
	case PROTO_RP_REQ:  return "RP_REQ";
	case PROTO_RP_RUNNING: return "RP_RUNNING";
	case PROTO_RESUME:  return "RESUME";
	case PROTO_RP_BITMAP: return "RP_BITMAP";
	case PROTO_RP_ACK:  return "RP_ACK";
	case PROTO_DISK:    return "DISK";
	case PROTO_PREEMPT: return "PREEMPT";
	case PROTO_XBZRLE:  return "XBZRLE";
	case PROTO_SHARED:  return "SHARED";
	default:            return "unknown";
	}
}

int proto__encode_header(void *buf, size_t cap, uint32_t type, uint32_t flags,
			 uint64_t length)
{
	uint8_t *b = buf;
	if (cap < PROTO_HDR_SIZE)
		return -ENOSPC;
	le__put32(b, type);
	le__put32(b + 4, flags);
	le__put64(b + 8, length);
	return 0;
}

/* Allowed flag bits per type. */
static uint32_t proto__allowed_flags(uint32_t type)
{
	switch (type) {
	case PROTO_PAGES: return PROTO_F_COMPRESSED_ANY;
	case PROTO_END:   return PROTO_F_HAS_CHECKSUM | PROTO_F_PAGE_SUM;
	case PROTO_POSTCOPY: return PROTO_F_HAS_CHECKSUM;
	case PROTO_DISK:  return PROTO_F_HAS_CHECKSUM;
	case PROTO_START: return PROTO_F_RAM_SHARED | PROTO_F_UUID;
	default:          return 0;
	}
}

const char *proto__header_problem(const struct proto_hdr *h)
{
	if (strcmp(proto__type_name(h->type), "unknown") == 0)
		return "unknown record type";
	if (h->flags & ~proto__allowed_flags(h->type))
		return "unknown flag bits for this record type";
	if (h->length > PROTO_MAX_PAYLOAD)
		return "record length exceeds the 16 MiB limit";
	if (__builtin_popcount(h->flags & PROTO_F_COMPRESSED_ANY) > 1)
		return "PAGES record with two compression flags";
	switch (h->type) {
	case PROTO_START:
	case PROTO_RESUME:
		if (h->length < PROTO_MAGIC_LEN + 12)
			return "START record too short";
		break;
	case PROTO_RP_BITMAP:
		if (h->length < 16 || (h->length - 16) % 8 ||
		    (h->length - 16) / 8 > PROTO_MAX_BITMAP_WORDS)
			return "RP_BITMAP length out of range";
		break;
	case PROTO_SYNC:
	case PROTO_RP_PING:
	case PROTO_RP_ACK:
	case PROTO_SHARED:
		if (h->length != 8)
			return "record length must be 8";
		break;
	case PROTO_CHANNEL:
		if (h->length != 8 + PROTO_SESSION_LEN)
			return "CHANNEL length must be 24";
		break;
	case PROTO_PREEMPT:
		if (h->length != PROTO_PREEMPT_LEN)
			return "PREEMPT length must be 20";
		break;
	case PROTO_END:
		if (h->length != ((h->flags & PROTO_F_HAS_CHECKSUM) ? PROTO_HASH_LEN : 0))
			return "END length does not match its checksum flag";
		break;
	case PROTO_RP_OK:
	case PROTO_RP_RUNNING:
	case PROTO_POSTCOPY:
		if (h->length != 0)
			return "record must have an empty payload";
		break;
	case PROTO_RP_REQ:
		if (h->length != 16)
			return "RP_REQ length must be 16";
		break;
	case PROTO_DISK:
		if (h->length < PROTO_DISK_HDR || h->length > PROTO_DISK_HDR + PROTO_DISK_MAX_DATA)
			return "DISK length out of range";
		break;
	case PROTO_ERROR:
	case PROTO_RP_FAIL:
		if (h->length < 4 || h->length > 4 + PROTO_MAX_MSG)
			return "error record length out of range";
		break;
	}
	return NULL;
}

int proto__decode_header(const void *buf, size_t len, struct proto_hdr *hdr)
{
	const uint8_t *b = buf;
	if (len < PROTO_HDR_SIZE)
		return -EINVAL;
	hdr->type = le__get32(b);
	hdr->flags = le__get32(b + 4);
	hdr->length = le__get64(b + 8);
	return proto__header_problem(hdr) ? -EPROTO : 0;
}

/* Writes a header for a payload of `length` bytes if the whole record fits;
 * returns the header pointer advanced past the header, or NULL. */
static uint8_t *proto__begin(void *buf, size_t cap, uint32_t type, uint32_t flags,
			     uint64_t length)
{
	if (length > PROTO_MAX_PAYLOAD || cap < PROTO_HDR_SIZE ||
	    cap - PROTO_HDR_SIZE < length)
		return NULL;
	if (proto__encode_header(buf, cap, type, flags, length))
		return NULL;
	return (uint8_t *)buf + PROTO_HDR_SIZE;
}

static ssize_t proto__rec_size(uint64_t length)
{
	return (ssize_t)(PROTO_HDR_SIZE + length);
}

void proto_start__from_ram(struct proto_start *st, const struct proto_ram *ram)
{
	memset(st, 0, sizeof(*st));
	st->version = PROTO_VERSION;
	st->page_size = PROTO_PAGE_SIZE;
	st->nr_blocks = ram->nr_blocks <= PROTO_MAX_BLOCKS ? ram->nr_blocks : PROTO_MAX_BLOCKS;
	for (unsigned i = 0; i < st->nr_blocks; i++) {
		st->blocks[i].gpa = ram->blocks[i].gpa;
		st->blocks[i].size = ram->blocks[i].size;
	}
}

static ssize_t proto__encode_layout(void *buf, size_t cap, uint32_t type,
				    const struct proto_start *st)
{
	if (st->nr_blocks > PROTO_MAX_BLOCKS)
		return -EINVAL;
	bool start = type == PROTO_START, uuid = start && st->has_uuid;
	uint64_t len = PROTO_MAGIC_LEN + 12 + 16ull * st->nr_blocks + (uuid ? PROTO_UUID_LEN : 0);
	uint32_t flags = (start && st->ram_shared ? PROTO_F_RAM_SHARED : 0) |
			 (uuid ? PROTO_F_UUID : 0);
	uint8_t *p = proto__begin(buf, cap, type, flags, len);
	if (!p)
		return -ENOSPC;
	memcpy(p, PROTO_MAGIC, PROTO_MAGIC_LEN);
	p += PROTO_MAGIC_LEN;
	le__put32(p, st->version);
	le__put32(p + 4, st->page_size);
	le__put32(p + 8, st->nr_blocks);
	p += 12;
	for (uint32_t i = 0; i < st->nr_blocks; i++, p += 16) {
		le__put64(p, st->blocks[i].gpa);
		le__put64(p + 8, st->blocks[i].size);
	}
	if (uuid)
		memcpy(p, st->uuid, PROTO_UUID_LEN);
	return proto__rec_size(len);
}

ssize_t proto__encode_start(void *buf, size_t cap, const struct proto_start *st)
{
	return proto__encode_layout(buf, cap, PROTO_START, st);
}

ssize_t proto__encode_resume(void *buf, size_t cap, const struct proto_start *st)
{
	return proto__encode_layout(buf, cap, PROTO_RESUME, st);
}

static uint64_t proto__bitmap_words(const struct bitmap *b)
{
	return (b->nbits + 63) / 64;
}

ssize_t proto__encode_rp_bitmap(void *buf, size_t cap, const struct bitmap *b,
				uint64_t first_word, uint32_t nwords)
{
	if (nwords > PROTO_MAX_BITMAP_WORDS || first_word > proto__bitmap_words(b) ||
	    nwords > proto__bitmap_words(b) - first_word)
		return -EINVAL;
	uint64_t len = 16 + 8ull * nwords;
	uint8_t *p = proto__begin(buf, cap, PROTO_RP_BITMAP, 0, len);
	if (!p)
		return -ENOSPC;
	le__put64(p, first_word);
	le__put64(p + 8, b->nbits);
	for (uint32_t i = 0; i < nwords; i++)
		le__put64(p + 16 + 8 * (size_t)i, b->words[first_word + i]);
	return proto__rec_size(len);
}

static int proto__check_run(uint32_t count, uint32_t max)
{
	return count == 0 || count > max ? -EINVAL : 0;
}

ssize_t proto__encode_pages_head(void *buf, size_t cap, uint32_t flags, uint32_t block,
				 uint32_t count, const uint64_t *offsets, uint64_t data_len)
{
	if (proto__check_run(count, PROTO_MAX_PAGES) ||
	    (flags & ~proto__allowed_flags(PROTO_PAGES)) ||
	    __builtin_popcount(flags & PROTO_F_COMPRESSED_ANY) > 1)
		return -EINVAL;
	uint64_t head = 8 + 8ull * count;
	if (data_len > PROTO_MAX_PAYLOAD)
		return -EINVAL;
	uint64_t len = head + data_len;
	if (len > PROTO_MAX_PAYLOAD)
		return -EINVAL;
	if (cap < PROTO_HDR_SIZE + head)
		return -ENOSPC;
	if (proto__encode_header(buf, cap, PROTO_PAGES, flags, len))
		return -ENOSPC;
	uint8_t *p = (uint8_t *)buf + PROTO_HDR_SIZE;
	le__put32(p, block);
	le__put32(p + 4, count);
	for (uint32_t i = 0; i < count; i++)
		le__put64(p + 8 + 8 * (size_t)i, offsets[i]);
	return (ssize_t)(PROTO_HDR_SIZE + head);
}

ssize_t proto__encode_pages(void *buf, size_t cap, uint32_t block, uint32_t count,
			    const uint64_t *offsets, const uint8_t *block_host)
{
	uint64_t data_len = (uint64_t)count * PROTO_PAGE_SIZE;
	if (cap < proto__pages_record_size(count) && count <= PROTO_MAX_PAGES)
		return -ENOSPC;
	ssize_t head = proto__encode_pages_head(buf, cap, 0, block, count, offsets, data_len);
	if (head < 0)
		return head;
	uint8_t *d = (uint8_t *)buf + head;
	for (uint32_t i = 0; i < count; i++)
		memcpy(d + (size_t)i * PROTO_PAGE_SIZE, block_host + offsets[i], PROTO_PAGE_SIZE);
	return head + (ssize_t)data_len;
}

static ssize_t proto__encode_offsets(void *buf, size_t cap, uint32_t type, uint32_t block,
				     uint32_t count, const uint64_t *offsets)
{
	if (proto__check_run(count, PROTO_MAX_ZERO))
		return -EINVAL;
	uint64_t len = 8 + 8ull * count;
	uint8_t *p = proto__begin(buf, cap, type, 0, len);
	if (!p)
		return -ENOSPC;
	le__put32(p, block);
	le__put32(p + 4, count);
	for (uint32_t i = 0; i < count; i++)
		le__put64(p + 8 + 8 * (size_t)i, offsets[i]);
	return proto__rec_size(len);
}

ssize_t proto__encode_zero(void *buf, size_t cap, uint32_t block, uint32_t count,
			   const uint64_t *offsets)
{
	return proto__encode_offsets(buf, cap, PROTO_ZERO, block, count, offsets);
}

ssize_t proto__encode_discard(void *buf, size_t cap, uint32_t block, uint32_t count,
			      const uint64_t *offsets)
{
	return proto__encode_offsets(buf, cap, PROTO_DISCARD, block, count, offsets);
}

ssize_t proto__encode_empty(void *buf, size_t cap, uint32_t type)
{
	if (type != PROTO_POSTCOPY && type != PROTO_RP_RUNNING && type != PROTO_RP_OK)
		return -EINVAL;
	return proto__begin(buf, cap, type, 0, 0) ? (ssize_t)PROTO_HDR_SIZE : -ENOSPC;
}

ssize_t proto__encode_postcopy(void *buf, size_t cap, bool verify)
{
	return proto__begin(buf, cap, PROTO_POSTCOPY, verify ? PROTO_F_HAS_CHECKSUM : 0, 0)
		       ? (ssize_t)PROTO_HDR_SIZE : -ENOSPC;
}

ssize_t proto__encode_rp_req(void *buf, size_t cap, uint32_t block, uint64_t offset)
{
	uint8_t *p = proto__begin(buf, cap, PROTO_RP_REQ, 0, 16);
	if (!p)
		return -ENOSPC;
	le__put32(p, block);
	le__put32(p + 4, 0);
	le__put64(p + 8, offset);
	return proto__rec_size(16);
}

ssize_t proto__encode_state(void *buf, size_t cap, uint32_t id, uint32_t version,
			    uint32_t instance, const void *data, size_t len)
{
	if (len > PROTO_MAX_PAYLOAD - 12 || (len && !data))
		return -EINVAL;
	uint8_t *p = proto__begin(buf, cap, PROTO_STATE, 0, 12 + (uint64_t)len);
	if (!p)
		return -ENOSPC;
	le__put32(p, id);
	le__put32(p + 4, version);
	le__put32(p + 8, instance);
	if (len)
		memcpy(p + 12, data, len);
	return proto__rec_size(12 + (uint64_t)len);
}

static ssize_t proto__encode_u64(void *buf, size_t cap, uint32_t type, uint64_t v)
{
	uint8_t *p = proto__begin(buf, cap, type, 0, 8);
	if (!p)
		return -ENOSPC;
	le__put64(p, v);
	return proto__rec_size(8);
}

ssize_t proto__encode_sync(void *buf, size_t cap, uint64_t round)
{
	return proto__encode_u64(buf, cap, PROTO_SYNC, round);
}

ssize_t proto__encode_shared(void *buf, size_t cap, uint64_t token)
{
	return token ? proto__encode_u64(buf, cap, PROTO_SHARED, token) : -EINVAL;
}

ssize_t proto__encode_channel(void *buf, size_t cap, uint32_t index, uint32_t count,
			      const uint8_t session[PROTO_SESSION_LEN])
{
	uint8_t *p = proto__begin(buf, cap, PROTO_CHANNEL, 0, 8 + PROTO_SESSION_LEN);
	if (!p)
		return -ENOSPC;
	le__put32(p, index);
	le__put32(p + 4, count);
	memcpy(p + 8, session, PROTO_SESSION_LEN);
	return proto__rec_size(8 + PROTO_SESSION_LEN);
}

ssize_t proto__encode_preempt(void *buf, size_t cap, const uint8_t session[PROTO_SESSION_LEN],
			      uint32_t channels)
{
	uint8_t *p = proto__begin(buf, cap, PROTO_PREEMPT, 0, PROTO_PREEMPT_LEN);
	if (!p)
		return -ENOSPC;
	memcpy(p, session, PROTO_SESSION_LEN);
	le__put32(p + PROTO_SESSION_LEN, channels);
	return proto__rec_size(PROTO_PREEMPT_LEN);
}

ssize_t proto__encode_rp_ping(void *buf, size_t cap, uint64_t cookie)
{
	return proto__encode_u64(buf, cap, PROTO_RP_PING, cookie);
}

ssize_t proto__encode_rp_ack(void *buf, size_t cap, uint64_t bytes)
{
	return proto__encode_u64(buf, cap, PROTO_RP_ACK, bytes);
}

ssize_t proto__encode_end(void *buf, size_t cap, const uint8_t *hash)
{
	uint64_t len = hash ? PROTO_HASH_LEN : 0;
	uint8_t *p = proto__begin(buf, cap, PROTO_END, hash ? PROTO_F_HAS_CHECKSUM : 0, len);
	if (!p)
		return -ENOSPC;
	if (hash)
		memcpy(p, hash, PROTO_HASH_LEN);
	return proto__rec_size(len);
}

ssize_t proto__encode_end_sum(void *buf, size_t cap, const uint8_t *sum)
{
	uint8_t *p = proto__begin(buf, cap, PROTO_END, PROTO_F_HAS_CHECKSUM | PROTO_F_PAGE_SUM,
				  PROTO_HASH_LEN);
	if (!p)
		return -ENOSPC;
	memcpy(p, sum, PROTO_HASH_LEN);
	return proto__rec_size(PROTO_HASH_LEN);
}

ssize_t proto__encode_rp_ok(void *buf, size_t cap)
{
	return proto__begin(buf, cap, PROTO_RP_OK, 0, 0) ? (ssize_t)PROTO_HDR_SIZE : -ENOSPC;
}

static ssize_t proto__encode_fail(void *buf, size_t cap, uint32_t type, uint32_t code,
				  const char *msg)
{
	size_t n = msg ? strnlen(msg, PROTO_MAX_MSG) : 0;
	uint8_t *p = proto__begin(buf, cap, type, 0, 4 + (uint64_t)n);
	if (!p)
		return -ENOSPC;
	le__put32(p, code);
	if (n)
		memcpy(p + 4, msg, n);
	return proto__rec_size(4 + (uint64_t)n);
}

ssize_t proto__encode_error(void *buf, size_t cap, uint32_t code, const char *msg)
{
	return proto__encode_fail(buf, cap, PROTO_ERROR, code, msg);
}

ssize_t proto__encode_rp_fail(void *buf, size_t cap, uint32_t code, const char *msg)
{
	return proto__encode_fail(buf, cap, PROTO_RP_FAIL, code, msg);
}

/* ---- decoders ---- */

static int proto__bad(const char **why, const char *msg)
{
	if (why)
		*why = msg;
	return -EPROTO;
}

int proto__decode_start(const void *payload, size_t len, uint32_t flags,
			struct proto_start *st, const char **why)
{
	const uint8_t *p = payload;
	memset(st, 0, sizeof(*st));
	if (len < PROTO_MAGIC_LEN + 12)
		return proto__bad(why, "START record too short");
	if (memcmp(p, PROTO_MAGIC, PROTO_MAGIC_LEN) != 0)
		return proto__bad(why, "bad magic (not a kmig migration stream)");
	st->version = le__get32(p + 8);
	st->page_size = le__get32(p + 12);
	st->nr_blocks = le__get32(p + 16);
	if (st->version != PROTO_VERSION)
		return proto__bad(why, "unsupported protocol version");
	if (st->page_size != PROTO_PAGE_SIZE)
		return proto__bad(why, "unsupported page size");
	if (st->nr_blocks == 0 || st->nr_blocks > PROTO_MAX_BLOCKS)
		return proto__bad(why, "START block count out of range");
	st->has_uuid = flags & PROTO_F_UUID;
	st->ram_shared = flags & PROTO_F_RAM_SHARED;
	if (len != PROTO_MAGIC_LEN + 12 + 16 * (size_t)st->nr_blocks +
		   (st->has_uuid ? PROTO_UUID_LEN : 0))
		return proto__bad(why, st->has_uuid ? "START length does not match its block count "
				  "and UUID" : "START length does not match its block count");
	p += PROTO_MAGIC_LEN + 12;
	for (uint32_t i = 0; i < st->nr_blocks; i++, p += 16) {
		st->blocks[i].gpa = le__get64(p);
		st->blocks[i].size = le__get64(p + 8);
	}
	if (st->has_uuid)
		memcpy(st->uuid, p, PROTO_UUID_LEN);
	return 0;
}

/* Block, count and offsets common to PAGES and ZERO; returns bytes used. */
static int proto__decode_run(const uint8_t *p, size_t len, uint32_t max,
			     struct proto_pages *pg, const char **why)
{
	memset(pg, 0, sizeof(*pg));
	if (len < 8)
		return proto__bad(why, "page record too short");
	pg->block = le__get32(p);
	pg->count = le__get32(p + 4);
	if (pg->count == 0)
		return proto__bad(why, "page record with count 0");
	if (pg->count > max)
		return proto__bad(why, "page record count exceeds the per-record limit");
	if ((uint64_t)pg->count * 8 > len - 8)
		return proto__bad(why, "page record offsets exceed the payload");
	pg->offsets = p + 8;
	return 8 + 8 * (int)pg->count;
}

int proto__decode_pages(const void *payload, size_t len, uint32_t flags,
			struct proto_pages *pg, const char **why)
{
	const uint8_t *p = payload;
	int used = proto__decode_run(p, len, PROTO_MAX_PAGES, pg, why);
	if (used < 0)
		return used;
	size_t rest = len - (size_t)used;
	uint64_t raw = (uint64_t)pg->count * PROTO_PAGE_SIZE;
	pg->comp = (flags & PROTO_F_COMPRESSED_ZSTD) ? PROTO_COMP_ZSTD :
		   (flags & PROTO_F_COMPRESSED_LZ4) ? PROTO_COMP_LZ4 :
		   (flags & PROTO_F_COMPRESSED_ZLIB) ? PROTO_COMP_ZLIB : PROTO_COMP_NONE;
	pg->raw_len = (uint32_t)raw;
	if (pg->comp == PROTO_COMP_NONE) {
		if (rest != raw)
			return proto__bad(why, "PAGES data length is not count * page size");
		pg->data = p + used;
		pg->data_len = rest;
		return 0;
	}
	if (rest < 4)
		return proto__bad(why, "compressed PAGES record without raw length");
	if (le__get32(p + used) != raw)
		return proto__bad(why, "compressed PAGES raw length is not count * page size");
	pg->data = p + used + 4;
	pg->data_len = rest - 4;
	if (pg->data_len == 0)
		return proto__bad(why, "compressed PAGES record with empty blob");
	return 0;
}

/* ZERO and DISCARD: a run of offsets and nothing after it. */
static int proto__decode_offsets(const void *payload, size_t len, struct proto_pages *pg,
				 const char **why, const char *trailing)
{
	int used = proto__decode_run(payload, len, PROTO_MAX_ZERO, pg, why);
	if (used < 0)
		return used;
	if ((size_t)used != len)
		return proto__bad(why, trailing);
	return 0;
}

int proto__decode_zero(const void *payload, size_t len, struct proto_pages *pg,
		       const char **why)
{
	return proto__decode_offsets(payload, len, pg, why, "ZERO record has trailing bytes");
}

int proto__decode_state(const void *payload, size_t len, struct proto_state *st,
			const char **why)
{
	const uint8_t *p = payload;
	memset(st, 0, sizeof(*st));
	if (len < 12)
		return proto__bad(why, "STATE record too short");
	st->id = le__get32(p);
	st->version = le__get32(p + 4);
	st->instance = le__get32(p + 8);
	st->data = p + 12;
	st->len = len - 12;
	return 0;
}

static int proto__decode_u64(const void *payload, size_t len, uint64_t *v, const char **why)
{
	if (len != 8)
		return proto__bad(why, "record length must be 8");
	*v = le__get64(payload);
	return 0;
}

int proto__decode_sync(const void *p, size_t len, uint64_t *round, const char **why)
{
	return proto__decode_u64(p, len, round, why);
}

int proto__decode_shared(const void *p, size_t len, uint64_t *token, const char **why)
{
	int rc = proto__decode_u64(p, len, token, why);
	return rc ? rc : *token ? 0 : proto__bad(why, "SHARED token 0");
}

int proto__decode_channel(const void *p, size_t len, uint32_t *index, uint32_t *count,
			  uint8_t session[PROTO_SESSION_LEN], const char **why)
{
	const uint8_t *b = p;
	if (len != 8 + PROTO_SESSION_LEN)
		return proto__bad(why, "CHANNEL length must be 24");
	*index = le__get32(b);
	*count = le__get32(b + 4);
	memcpy(session, b + 8, PROTO_SESSION_LEN);
	if (*count < 1 || *count > PROTO_MAX_CHANNELS || *index > *count) {
		*why = "channel index or count out of range";
		return -EPROTO;
	}
	return 0;
}

int proto__decode_preempt(const void *p, size_t len, uint8_t session[PROTO_SESSION_LEN],
			  uint32_t *channels, const char **why)
{
	if (len != PROTO_PREEMPT_LEN)
		return proto__bad(why, "PREEMPT length must be 20");
	memcpy(session, p, PROTO_SESSION_LEN);
	*channels = le__get32((const uint8_t *)p + PROTO_SESSION_LEN);
	if (*channels > PROTO_MAX_CHANNELS)
		return proto__bad(why, "PREEMPT: more multifd channels than 16");
	return 0;
}

bool proto__same_session(const uint8_t a[PROTO_SESSION_LEN], const uint8_t b[PROTO_SESSION_LEN])
{
	uint8_t d = 0;
	for (unsigned i = 0; i < PROTO_SESSION_LEN; i++)
		d |= a[i] ^ b[i];
	return d == 0;
}

int proto__decode_rp_ping(const void *p, size_t len, uint64_t *cookie, const char **why)
{
	return proto__decode_u64(p, len, cookie, why);
}

int proto__decode_rp_ack(const void *p, size_t len, uint64_t *bytes, const char **why)
{
	return proto__decode_u64(p, len, bytes, why);
}

int proto__decode_discard(const void *payload, size_t len, struct proto_pages *pg,
			  const char **why)
{
	return proto__decode_offsets(payload, len, pg, why, "DISCARD record has trailing bytes");
}

int proto__decode_rp_req(const void *payload, size_t len, uint32_t *block, uint64_t *offset,
			 const char **why)
{
	const uint8_t *p = payload;
	if (len != 16)
		return proto__bad(why, "RP_REQ length must be 16");
	if (le__get32(p + 4))
		return proto__bad(why, "RP_REQ reserved word is not zero");
	*block = le__get32(p);
	*offset = le__get64(p + 8);
	return 0;
}

int proto__decode_end(const void *p, size_t len, uint32_t flags, uint8_t *hash,
		      bool *has_hash, const char **why)
{
	*has_hash = flags & PROTO_F_HAS_CHECKSUM;
	if ((flags & PROTO_F_PAGE_SUM) && !*has_hash)
		return proto__bad(why, "END with PAGE_SUM but no checksum");
	if (len != (*has_hash ? PROTO_HASH_LEN : 0))
		return proto__bad(why, "END length does not match its checksum flag");
	if (*has_hash)
		memcpy(hash, p, PROTO_HASH_LEN);
	return 0;
}

int proto__decode_error(const void *payload, size_t len, struct proto_error *e,
			const char **why)
{
	const uint8_t *p = payload;
	memset(e, 0, sizeof(*e));
	if (len < 4 || len > 4 + PROTO_MAX_MSG)
		return proto__bad(why, "error record length out of range");
	e->code = le__get32(p);
	e->msg = (const char *)p + 4;
	e->msg_len = len - 4;
	return 0;
}

int proto__decode_rp_bitmap(const void *payload, size_t len, struct bitmap *b,
			    uint64_t *next_word, const char **why)
{
	const uint8_t *p = payload;
	if (len < 16 || (len - 16) % 8 || (len - 16) / 8 > PROTO_MAX_BITMAP_WORDS)
		return proto__bad(why, "RP_BITMAP length out of range");
	uint64_t first = le__get64(p), nbits = le__get64(p + 8), n = (len - 16) / 8;
	if (nbits != b->nbits)
		return proto__bad(why, "RP_BITMAP is not of this VM's page count");
	if (first > proto__bitmap_words(b) || n > proto__bitmap_words(b) - first)
		return proto__bad(why, "RP_BITMAP words past the end of the bitmap");
	for (uint64_t i = 0; i < n; i++)
		b->words[first + i] = le__get64(p + 16 + 8 * i);
	if (n && first + n == proto__bitmap_words(b) && nbits % 64)
		b->words[first + n - 1] &= (1ull << (nbits % 64)) - 1;  /* no bits past nbits */
	*next_word = first + n;
	return 0;
}

const char *proto__layout_mismatch(const struct proto_start *st, const struct proto_ram *ram,
				   char *msg, size_t msglen)
{
	if (st->page_size != PROTO_PAGE_SIZE) {
		snprintf(msg, msglen, "page size %" PRIu32 " != %u", st->page_size,
			 PROTO_PAGE_SIZE);
		return msg;
	}
	if (st->nr_blocks != ram->nr_blocks) {
		snprintf(msg, msglen, "source has %" PRIu32 " RAM blocks, destination %u",
			 st->nr_blocks, ram->nr_blocks);
		return msg;
	}
	for (uint32_t i = 0; i < st->nr_blocks; i++) {
		if (st->blocks[i].gpa == ram->blocks[i].gpa &&
		    st->blocks[i].size == ram->blocks[i].size)
			continue;
		snprintf(msg, msglen,
			 "RAM block %" PRIu32 ": source gpa 0x%" PRIx64 " size 0x%" PRIx64
			 ", destination gpa 0x%" PRIx64 " size 0x%" PRIx64,
			 i, st->blocks[i].gpa, st->blocks[i].size,
			 ram->blocks[i].gpa, ram->blocks[i].size);
		return msg;
	}
	return NULL;
}
