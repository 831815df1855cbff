/* Compression of page runs and the RAM checksum; see proto.h. */
#include "mig/wire/proto.h"

#include <errno.h>
#include <limits.h>
#include <lz4.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "mig/wire/proto_le.h"

void proto_codec__free(struct proto_codec *c)
{
	ZSTD_freeCCtx(c->zc);
	ZSTD_freeDCtx(c->zd);
	if (c->zlc)
		(void)deflateEnd(c->zlc);
	if (c->zld)
		(void)inflateEnd(c->zld);
	free(c->zlc);
	free(c->zld);
	free(c->stage);
	memset(c, 0, sizeof(*c));
}

bool proto__comp_level_ok(enum proto_comp kind, int level)
{
	switch (kind) {
	case PROTO_COMP_ZSTD:
		return level >= 0 && level <= PROTO_ZSTD_LEVEL_MAX;
	case PROTO_COMP_ZLIB:
		return level >= 0 && level <= PROTO_ZLIB_LEVEL_MAX;
	case PROTO_COMP_LZ4:
		return level == 0;
	default:
		return false;
	}
}

size_t proto__compress_bound(enum proto_comp kind, size_t len)
{
	switch (kind) {
	case PROTO_COMP_ZSTD:
		return ZSTD_compressBound(len);
	case PROTO_COMP_LZ4:
		return len > LZ4_MAX_INPUT_SIZE ? 0 : (size_t)LZ4_compressBound((int)len);
	case PROTO_COMP_ZLIB:
		return compressBound(len);
	default:
		return 0;
	}
}

static ssize_t proto__zstd_compress(struct proto_codec *c, int level, const void *src,
				    size_t len, void *dst, size_t cap)
{
	size_t r;
	if (c) {
		if (!c->zc && !(c->zc = ZSTD_createCCtx()))
			return -ENOMEM;
		r = ZSTD_compressCCtx(c->zc, dst, cap, src, len, level);
	} else {
		r = ZSTD_compress(dst, cap, src, len, level);
	}
	if (ZSTD_isError(r))
		return ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall ? -ENOSPC : -EINVAL;
	return (ssize_t)r;
}

/* The codec's deflate stream, set up for level and reset; NULL without
 * memory. */
static z_stream *proto__deflater(struct proto_codec *c, int level)
{
	z_stream *z = c->zlc;
	if (z && c->zlc_level != level) {
		(void)deflateEnd(z);
		free(z);
		c->zlc = z = NULL;
	}
	if (z)
		return deflateReset(z) == Z_OK ? z : NULL;
	if (!(z = calloc(1, sizeof(*z))))
		return NULL;
	if (deflateInit(z, level) != Z_OK) {
		free(z);
		return NULL;
	}
	c->zlc = z;
	c->zlc_level = level;
	return z;
}

/* One zlib stream (RFC 1950) per call; len and cap fit zlib's uInt as
 * both are bounded by PROTO_MAX_PAYLOAD. */
static ssize_t proto__zlib_compress(struct proto_codec *c, int level, const void *src,
				    size_t len, void *dst, size_t cap)
{
	z_stream one = { 0 };
	z_stream *z = c ? proto__deflater(c, level) : &one;
	if (!z || (!c && deflateInit(z, level) != Z_OK))
		return -ENOMEM;
	z->next_in = (Bytef *)src;
	z->avail_in = (uInt)len;
	z->next_out = dst;
	z->avail_out = cap > PROTO_MAX_PAYLOAD ? PROTO_MAX_PAYLOAD : (uInt)cap;
	int r = deflate(z, Z_FINISH);
	ssize_t n = r == Z_STREAM_END ? (ssize_t)z->total_out :
		    r == Z_OK || r == Z_BUF_ERROR ? -ENOSPC : -EINVAL;
	if (!c)
		(void)deflateEnd(z);
	return n;
}

static int proto__zlib_decompress(struct proto_codec *c, const void *src, size_t len,
				  void *dst, size_t expected)
{
	z_stream one = { 0 };
	z_stream *z = c ? c->zld : &one;
	if (c && !z) {
		if (!(z = calloc(1, sizeof(*z))))
			return -ENOMEM;
		if (inflateInit(z) != Z_OK) {
			free(z);
			return -ENOMEM;
		}
		c->zld = z;
	} else if (c ? inflateReset(z) != Z_OK : inflateInit(z) != Z_OK) {
		return -ENOMEM;
	}
	z->next_in = (Bytef *)src;
	z->avail_in = (uInt)len;
	z->next_out = dst;
	z->avail_out = (uInt)expected;
	int r = inflate(z, Z_FINISH);
	/* one whole stream, exactly expected bytes, nothing after it */
	bool ok = r == Z_STREAM_END && z->total_out == expected && z->avail_in == 0;
	if (!c)
		(void)inflateEnd(z);
	return ok ? 0 : -EPROTO;
}

ssize_t proto__compress(struct proto_codec *c, enum proto_comp kind, int level, const void *src,
			size_t len, void *dst, size_t cap)
{
	if (len > PROTO_MAX_PAYLOAD || !proto__comp_level_ok(kind, level))
		return -EINVAL;
	switch (kind) {
	case PROTO_COMP_ZSTD:
		return proto__zstd_compress(c, level, src, len, dst, cap);
	case PROTO_COMP_ZLIB:
		return proto__zlib_compress(c, level, src, len, dst, cap);
	case PROTO_COMP_LZ4: {
		int n = LZ4_compress_default(src, dst, (int)len, cap > INT_MAX ? INT_MAX : (int)cap);
		return n > 0 ? n : -ENOSPC;
	}
	default:
		return -EINVAL;
	}
}

int proto__decompress(struct proto_codec *c, enum proto_comp kind, const void *src,
		      size_t len, void *dst, size_t expected)
{
	if (expected > PROTO_MAX_PAYLOAD || len > PROTO_MAX_PAYLOAD)
		return -EPROTO;
	switch (kind) {
	case PROTO_COMP_ZSTD: {
		size_t r;
		if (c) {
			if (!c->zd && !(c->zd = ZSTD_createDCtx()))
				return -ENOMEM;
			r = ZSTD_decompressDCtx(c->zd, dst, expected, src, len);
		} else {
			r = ZSTD_decompress(dst, expected, src, len);
		}
		return !ZSTD_isError(r) && r == expected ? 0 : -EPROTO;
	}
	case PROTO_COMP_LZ4: {
		int n = LZ4_decompress_safe(src, dst, (int)len, (int)expected);
		return n >= 0 && (size_t)n == expected ? 0 : -EPROTO;
	}
	case PROTO_COMP_ZLIB:
		return proto__zlib_decompress(c, src, len, dst, expected);
	default:
		return -EINVAL;
	}
}

ssize_t proto__encode_pages_comp(struct proto_codec *c, enum proto_comp kind, int level,
				 void *buf, size_t cap, uint32_t block, uint32_t count,
				 const uint64_t *offsets, const uint8_t *block_host)
{
	uint32_t flag = kind == PROTO_COMP_ZSTD ? PROTO_F_COMPRESSED_ZSTD :
			kind == PROTO_COMP_LZ4 ? PROTO_F_COMPRESSED_LZ4 :
			kind == PROTO_COMP_ZLIB ? PROTO_F_COMPRESSED_ZLIB : 0;
	if (!c || !flag || !proto__comp_level_ok(kind, level) || count == 0 ||
	    count > PROTO_MAX_PAGES)
		return -EINVAL;
	if (!c->stage && !(c->stage = malloc((size_t)PROTO_MAX_PAGES * PROTO_PAGE_SIZE)))
		return -ENOMEM;
	size_t raw = (size_t)count * PROTO_PAGE_SIZE;
	for (uint32_t i = 0; i < count; i++)
		memcpy(c->stage + (size_t)i * PROTO_PAGE_SIZE, block_host + offsets[i],
		       PROTO_PAGE_SIZE);
	size_t head = PROTO_HDR_SIZE + 8 + 8 * (size_t)count;
	if (cap < head + 4)
		return -ENOSPC;
	size_t room = cap - head - 4;
	if (room > raw - 1)
		room = raw - 1;         /* only worth it if it shrinks */
	uint8_t *blob = (uint8_t *)buf + head + 4;
	/* zlib's level 0 stores, which never shrinks: plain without trying */
	ssize_t clen = kind == PROTO_COMP_ZLIB && level == 0 ? -ENOSPC :
		       proto__compress(c, kind, level, c->stage, raw, blob, room);
	if (clen == -ENOMEM)
		return clen;
	if (clen <= 0) {
		/* Incompressible: send the snapshot as plain pages. */
		ssize_t h = proto__encode_pages_head(buf, cap, 0, block, count, offsets, raw);
		if (h < 0)
			return h;
		if (cap - (size_t)h < raw)
			return -ENOSPC;
		memcpy((uint8_t *)buf + h, c->stage, raw);
		return h + (ssize_t)raw;
	}
	ssize_t h = proto__encode_pages_head(buf, cap, flag, block, count, offsets,
					     4 + (uint64_t)clen);
	if (h < 0)
		return h;
	le__put32((uint8_t *)buf + h, (uint32_t)raw);
	return h + 4 + clen;
}

/* ---- RAM hash ----
 * Four 64-bit lanes; each 32-byte chunk feeds one little-endian u64 to
 * each lane: v = (v ^ w) * P1; v ^= v >> 32.  Both steps are bijective
 * in v, so a change to any single word always changes the result.  A
 * block whose size is not a multiple of 32 is padded with zero bytes.
 * Finalisation mixes in the total length and the neighbouring lane. */
#define H_P1 0x9E3779B97F4A7C15ull
#define H_P2 0xC2B2AE3D27D4EB4Full
#define H_P3 0x165667B19E3779F9ull

struct proto_hash { uint64_t v[4]; uint64_t total; };

static void proto_hash__init(struct proto_hash *h)
{
	for (int i = 0; i < 4; i++)
		h->v[i] = H_P2 + (uint64_t)i * H_P1;
	h->total = 0;
}

static inline uint64_t proto__load64(const uint8_t *p)
{
	uint64_t w;
	memcpy(&w, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
	w = __builtin_bswap64(w);
#endif
	return w;
}

static void proto_hash__update(struct proto_hash *h, const uint8_t *p, size_t len)
{
	uint64_t v0 = h->v[0], v1 = h->v[1], v2 = h->v[2], v3 = h->v[3];
	size_t n = len / 32;
	for (size_t i = 0; i < n; i++, p += 32) {
		v0 = (v0 ^ proto__load64(p)) * H_P1;       v0 ^= v0 >> 32;
		v1 = (v1 ^ proto__load64(p + 8)) * H_P1;   v1 ^= v1 >> 32;
		v2 = (v2 ^ proto__load64(p + 16)) * H_P1;  v2 ^= v2 >> 32;
		v3 = (v3 ^ proto__load64(p + 24)) * H_P1;  v3 ^= v3 >> 32;
	}
	h->v[0] = v0; h->v[1] = v1; h->v[2] = v2; h->v[3] = v3;
	h->total += len;
	size_t tail = len % 32;
	if (tail) {
		uint8_t pad[32] = {0};
		memcpy(pad, p, tail);
		h->total -= 32;   /* the padded chunk must not count as 32 */
		proto_hash__update(h, pad, 32);
	}
}

static uint64_t proto__fmix64(uint64_t k)
{
	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	k *= 0xc4ceb9fe1a85ec53ull;
	k ^= k >> 33;
	return k;
}

static void proto_hash__final(const struct proto_hash *h, uint8_t out[PROTO_HASH_LEN])
{
	for (int i = 0; i < 4; i++) {
		uint64_t n = h->v[(i + 1) & 3];
		uint64_t x = h->v[i] ^ (h->total * H_P3) ^ ((n << 23) | (n >> 41));
		le__put64(out + 8 * i, proto__fmix64(x));
	}
}

void proto__ram_hash(const struct proto_ram *ram, uint8_t out[PROTO_HASH_LEN])
{
	proto__ram_hash_as_zero(ram, NULL, out);
}

/* One block, pages [first, first + block pages) of the VM-wide numbering;
 * runs of pages set in zero are hashed as zero pages. */
static void proto_hash__block(struct proto_hash *h, const struct proto_ram_block *b,
			      const struct bitmap *zero, size_t first)
{
	static const uint8_t zpage[PROTO_PAGE_SIZE];
	size_t npages = b->size / PROTO_PAGE_SIZE, p = 0;
	while (p < npages) {
		size_t i = first + p;
		size_t next = zero && i < zero->nbits ? bitmap__next_set(zero, i) : SIZE_MAX;
		size_t plain = next - first > npages ? npages - p : next - first - p;
		if (plain) {
			proto_hash__update(h, b->host + p * PROTO_PAGE_SIZE, plain * PROTO_PAGE_SIZE);
			p += plain;
			continue;
		}
		proto_hash__update(h, zpage, PROTO_PAGE_SIZE);
		p++;
	}
	if (b->size % PROTO_PAGE_SIZE)
		proto_hash__update(h, b->host + npages * PROTO_PAGE_SIZE, b->size % PROTO_PAGE_SIZE);
}

void proto__ram_hash_as_zero(const struct proto_ram *ram, const struct bitmap *zero,
			     uint8_t out[PROTO_HASH_LEN])
{
	struct proto_hash h;
	proto_hash__init(&h);
	unsigned n = ram->nr_blocks <= PROTO_MAX_BLOCKS ? ram->nr_blocks : PROTO_MAX_BLOCKS;
	size_t first = 0;
	for (unsigned i = 0; i < n; i++) {
		proto_hash__block(&h, &ram->blocks[i], zero, first);
		first += ram->blocks[i].size / PROTO_PAGE_SIZE;
	}
	proto_hash__final(&h, out);
}

void proto__hash_buf(const void *buf, size_t len, uint8_t out[PROTO_HASH_LEN])
{
	struct proto_hash h;
	proto_hash__init(&h);
	proto_hash__update(&h, buf, len);
	proto_hash__final(&h, out);
}

/* ---- post-copy sum ---- */

void proto__page_sum_add(uint64_t acc[4], uint64_t page, const void *data)
{
	struct proto_hash h;
	proto_hash__init(&h);
	proto_hash__update(&h, data, PROTO_PAGE_SIZE);
	for (int i = 0; i < 4; i++) {
		uint64_t n = h.v[(i + 1) & 3];
		acc[i] += proto__fmix64(h.v[i] ^ ((page + 1) * H_P3) ^ ((n << 23) | (n >> 41)));
	}
}

void proto__page_sum_out(const uint64_t acc[4], uint8_t out[PROTO_HASH_LEN])
{
	for (int i = 0; i < 4; i++)
		le__put64(out + 8 * i, acc[i]);
}

void proto__ram_page_sum_as_zero(const struct proto_ram *ram, const struct bitmap *zero,
				 uint8_t out[PROTO_HASH_LEN])
{
	static const uint8_t zpage[PROTO_PAGE_SIZE];
	uint64_t acc[4] = { 0 };
	uint64_t page = 0;
	unsigned n = ram->nr_blocks <= PROTO_MAX_BLOCKS ? ram->nr_blocks : PROTO_MAX_BLOCKS;
	for (unsigned i = 0; i < n; i++)
		for (uint64_t off = 0; off + PROTO_PAGE_SIZE <= ram->blocks[i].size;
		     off += PROTO_PAGE_SIZE, page++) {
			bool z = zero && page < zero->nbits && bitmap__test(zero, page);
			proto__page_sum_add(acc, page, z ? zpage : ram->blocks[i].host + off);
		}
	proto__page_sum_out(acc, out);
}

void proto__ram_page_sum(const struct proto_ram *ram, uint8_t out[PROTO_HASH_LEN])
{
	proto__ram_page_sum_as_zero(ram, NULL, out);
}

/* ---- the disk's sum (x-block-migration with x-verify) ---- */

static uint64_t proto__sector_mix(uint64_t sector, uint64_t h)
{
	return proto__fmix64(h ^ ((sector + 1) * H_P3));
}

/* The hash of one sector's bytes, folded to 64 bits. */
static uint64_t proto__sector_hash(const void *data)
{
	struct proto_hash h;
	proto_hash__init(&h);
	proto_hash__update(&h, data, PROTO_DISK_SECTOR);
	return h.v[0] ^ ((h.v[1] << 17) | (h.v[1] >> 47)) ^ ((h.v[2] << 31) | (h.v[2] >> 33)) ^
	       ((h.v[3] << 47) | (h.v[3] >> 17));
}

uint64_t proto__sector_digest(uint64_t sector, const void *data)
{
	return proto__sector_mix(sector, proto__sector_hash(data));
}

uint64_t proto__zero_sector_digest(uint64_t sector)
{
	static const uint8_t zero[PROTO_DISK_SECTOR];
	static uint64_t hz;      /* the same value from any thread that computes it */
	uint64_t h = __atomic_load_n(&hz, __ATOMIC_RELAXED);
	if (!h) {
		h = proto__sector_hash(zero);
		__atomic_store_n(&hz, h, __ATOMIC_RELAXED);
	}
	return proto__sector_mix(sector, h);
}
