/* Unit tests of the wire protocol encoders/decoders, compression and hash. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/timeutil.h"
#include "harness.h"
#include "mig/wire/proto.h"

static uint8_t *page_block(size_t pages, unsigned seed)
{
	uint8_t *b = malloc(pages * PROTO_PAGE_SIZE);
	for (size_t i = 0; i < pages * PROTO_PAGE_SIZE; i++)
		b[i] = (uint8_t)(i * 7 + seed + i / 4096);
	return b;
}

static void t_header(struct t *t)
{
	uint8_t b[16];
	struct proto_hdr h;
	T_CHECK_EQ(t, proto__encode_header(b, sizeof(b), PROTO_PAGES, PROTO_F_COMPRESSED_LZ4, 1234), 0);
	T_CHECK_EQ(t, b[0], 2);
	T_CHECK_EQ(t, b[4], 2);
	T_CHECK_EQ(t, b[8], 1234 & 0xff);
	T_CHECK_EQ(t, b[9], 1234 >> 8);
	T_CHECK_EQ(t, proto__decode_header(b, sizeof(b), &h), 0);
	T_CHECK_EQ(t, h.type, PROTO_PAGES);
	T_CHECK_EQ(t, h.flags, PROTO_F_COMPRESSED_LZ4);
	T_CHECK_EQ(t, h.length, 1234);
	T_CHECK_EQ(t, proto__decode_header(b, 15, &h), -EINVAL);
	T_CHECK_EQ(t, proto__encode_header(b, 15, 1, 0, 0), -ENOSPC);
	/* malformed headers */
	uint32_t bad[][3] = {
		{ 99, 0, 0 },                                  /* unknown type */
		{ PROTO_ZERO, PROTO_F_COMPRESSED_ZSTD, 16 },   /* flag not allowed */
		{ PROTO_PAGES, 1u << 31, 16 },                 /* unknown bit */
		{ PROTO_PAGES, PROTO_F_COMPRESSED_ZSTD | PROTO_F_COMPRESSED_LZ4, 16 },
		{ PROTO_PAGES, PROTO_F_COMPRESSED_ZLIB | PROTO_F_COMPRESSED_ZSTD, 16 },
		{ PROTO_PAGES, PROTO_F_COMPRESSED_ZLIB | PROTO_F_COMPRESSED_LZ4, 16 },
		{ PROTO_ZERO, PROTO_F_COMPRESSED_ZLIB, 16 },   /* flag not allowed */
		{ PROTO_END, 0, 32 },                          /* len vs flag */
		{ PROTO_END, PROTO_F_HAS_CHECKSUM, 0 },
		{ PROTO_SYNC, 0, 4 },
		{ PROTO_RP_OK, 0, 1 },
		{ PROTO_ERROR, 0, 2 },
		{ PROTO_START, 0, 4 },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		T_CHECK_EQ(t, proto__encode_header(b, 16, bad[i][0], bad[i][1], bad[i][2]), 0);
		T_CHECK_EQ(t, proto__decode_header(b, 16, &h), -EPROTO);
		T_CHECK(t, proto__header_problem(&h) != NULL);
	}
	T_CHECK_EQ(t, proto__encode_header(b, 16, PROTO_PAGES, 0, PROTO_MAX_PAYLOAD + 1ull), 0);
	T_CHECK_EQ(t, proto__decode_header(b, 16, &h), -EPROTO);
	T_CHECK_EQ(t, proto__encode_header(b, 16, PROTO_PAGES, 0, UINT64_MAX), 0);
	T_CHECK_EQ(t, proto__decode_header(b, 16, &h), -EPROTO);
	T_CHECK_EQ(t, proto__encode_header(b, 16, PROTO_PAGES, 0, PROTO_MAX_PAYLOAD), 0);
	T_CHECK_EQ(t, proto__decode_header(b, 16, &h), 0);
}

static void t_start(struct t *t)
{
	struct proto_ram ram = { .nr_blocks = 2 };
	ram.blocks[0] = (struct proto_ram_block){ 0, 0xa0000, NULL };
	ram.blocks[1] = (struct proto_ram_block){ 0x100000000ull, 1ull << 33, NULL };
	struct proto_start st, out;
	proto_start__from_ram(&st, &ram);
	uint8_t b[256];
	ssize_t n = proto__encode_start(b, sizeof(b), &st);
	T_CHECK_EQ(t, n, 16 + 8 + 12 + 32);
	T_CHECK(t, memcmp(b + 16, "KMIGSTRM", 8) == 0);
	struct proto_hdr h;
	const char *why = NULL;
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	T_CHECK_EQ(t, h.type, PROTO_START);
	T_CHECK_EQ(t, proto__decode_start(b + 16, h.length, 0, &out, &why), 0);
	T_CHECK_EQ(t, out.version, 2);
	T_CHECK_EQ(t, out.page_size, 4096);
	T_CHECK_EQ(t, out.nr_blocks, 2);
	T_CHECK(t, out.blocks[1].gpa == 0x100000000ull && out.blocks[1].size == 1ull << 33);
	char msg[160];
	T_CHECK(t, proto__layout_mismatch(&out, &ram, msg, sizeof(msg)) == NULL);
	ram.blocks[1].size -= 4096;
	T_CHECK(t, proto__layout_mismatch(&out, &ram, msg, sizeof(msg)) != NULL);
	T_CHECK(t, strstr(msg, "block 1") != NULL);
	ram.nr_blocks = 1;
	T_CHECK(t, proto__layout_mismatch(&out, &ram, msg, sizeof(msg)) != NULL);
	/* malformed */
	T_CHECK_EQ(t, proto__encode_start(b, 40, &st), -ENOSPC);
	uint8_t c[256];
	memcpy(c, b, n);
	c[16] = 'X';
	T_CHECK_EQ(t, proto__decode_start(c + 16, h.length, 0, &out, &why), -EPROTO);
	T_CHECK(t, why && strstr(why, "magic"));
	memcpy(c, b, n);
	c[24] = 1;     /* version 1: before CHANNEL carried the session */
	T_CHECK_EQ(t, proto__decode_start(c + 16, h.length, 0, &out, &why), -EPROTO);
	T_CHECK(t, strstr(why, "version") != NULL);
	memcpy(c, b, n);
	c[29] = 0x20;   /* page size 8192 */
	T_CHECK_EQ(t, proto__decode_start(c + 16, h.length, 0, &out, &why), -EPROTO);
	T_CHECK(t, strstr(why, "page size") != NULL);
	memcpy(c, b, n);
	c[32] = 3;      /* nr_blocks 3 but only 2 present */
	T_CHECK_EQ(t, proto__decode_start(c + 16, h.length, 0, &out, &why), -EPROTO);
	c[32] = 0;
	T_CHECK_EQ(t, proto__decode_start(c + 16, h.length, 0, &out, &why), -EPROTO);
	c[32] = 0xff; c[33] = 0xff; c[34] = 0xff; c[35] = 0xff;
	T_CHECK_EQ(t, proto__decode_start(c + 16, h.length, 0, &out, &why), -EPROTO);
	T_CHECK_EQ(t, proto__decode_start(b + 16, 10, 0, &out, &why), -EPROTO);
	T_CHECK_EQ(t, proto__decode_start(b + 16, h.length - 1, 0, &out, &why), -EPROTO);
}

/* validate-uuid: START's flag UUID and the 16 bytes after the blocks */
static void t_start_uuid(struct t *t)
{
	struct proto_ram ram = { .nr_blocks = 1 };
	ram.blocks[0] = (struct proto_ram_block){ 0, 1 << 20, NULL };
	struct proto_start st, out;
	proto_start__from_ram(&st, &ram);
	st.has_uuid = true;
	for (int i = 0; i < PROTO_UUID_LEN; i++)
		st.uuid[i] = (uint8_t)(0xa0 + i);
	uint8_t b[256];
	ssize_t n = proto__encode_start(b, sizeof(b), &st);
	T_CHECK_EQ(t, n, 16 + 8 + 12 + 16 + 16);
	struct proto_hdr h;
	const char *why = NULL;
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	T_CHECK_EQ(t, h.flags, PROTO_F_UUID);
	T_CHECK(t, proto__header_problem(&h) == NULL);
	T_CHECK_EQ(t, proto__decode_start(b + 16, h.length, h.flags, &out, &why), 0);
	T_CHECK(t, out.has_uuid && !out.ram_shared && !memcmp(out.uuid, st.uuid, PROTO_UUID_LEN));
	/* the flag and the length must agree */
	T_CHECK_EQ(t, proto__decode_start(b + 16, h.length, 0, &out, &why), -EPROTO);
	T_CHECK_EQ(t, proto__decode_start(b + 16, h.length - PROTO_UUID_LEN, PROTO_F_UUID, &out,
					  &why), -EPROTO);
	T_CHECK(t, why && strstr(why, "UUID"));
	/* RESUME never carries one */
	h.type = PROTO_RESUME;
	T_CHECK(t, proto__header_problem(&h) != NULL);
	n = proto__encode_resume(b, sizeof(b), &st);
	T_CHECK_EQ(t, n, 16 + 8 + 12 + 16);
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	T_CHECK_EQ(t, h.flags, 0);
}

static void t_pages(struct t *t)
{
	uint8_t *blk = page_block(8, 3);
	uint64_t offs[3] = { 0, 5 * 4096, 2 * 4096 };
	size_t cap = proto__pages_record_size(3);
	uint8_t *b = malloc(cap);
	ssize_t n = proto__encode_pages(b, cap, 1, 3, offs, blk);
	T_CHECK_EQ(t, n, (ssize_t)cap);
	struct proto_hdr h;
	struct proto_pages pg;
	const char *why = NULL;
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	T_CHECK_EQ(t, proto__decode_pages(b + 16, h.length, h.flags, &pg, &why), 0);
	T_CHECK_EQ(t, pg.block, 1);
	T_CHECK_EQ(t, pg.count, 3);
	T_CHECK_EQ(t, pg.comp, PROTO_COMP_NONE);
	for (uint32_t i = 0; i < 3; i++) {
		T_CHECK(t, proto__offset(&pg, i) == offs[i]);
		T_CHECK(t, memcmp(pg.data + i * 4096, blk + offs[i], 4096) == 0);
	}
	T_CHECK_EQ(t, proto__encode_pages(b, cap - 1, 1, 3, offs, blk), -ENOSPC);
	T_CHECK_EQ(t, proto__encode_pages(b, cap, 1, 0, offs, blk), -EINVAL);
	/* short data, count 0, offsets past payload, huge count */
	T_CHECK_EQ(t, proto__decode_pages(b + 16, h.length - 1, 0, &pg, &why), -EPROTO);
	T_CHECK_EQ(t, proto__decode_pages(b + 16, 7, 0, &pg, &why), -EPROTO);
	T_CHECK_EQ(t, proto__decode_pages(b + 16, 8 + 16, 0, &pg, &why), -EPROTO);
	uint8_t c[64];
	memcpy(c, b + 16, 64);
	c[4] = 0; c[5] = 0; c[6] = 0; c[7] = 0;
	T_CHECK_EQ(t, proto__decode_pages(c, 64, 0, &pg, &why), -EPROTO);
	T_CHECK(t, strstr(why, "count 0") != NULL);
	c[7] = 0x20;    /* count 0x20000000: count*8 overflows 32 bits */
	T_CHECK_EQ(t, proto__decode_pages(c, 64, 0, &pg, &why), -EPROTO);
	free(b);
	free(blk);
}

static void t_pages_comp(struct t *t)
{
	struct proto_codec codec = {0};
	uint8_t *blk = calloc(16, 4096);
	for (int i = 0; i < 16 * 4096; i += 64)
		blk[i] = (uint8_t)i;                   /* compressible */
	uint64_t offs[16];
	for (int i = 0; i < 16; i++)
		offs[i] = (uint64_t)(15 - i) * 4096;
	size_t cap = proto__pages_record_size(16);
	uint8_t *b = malloc(cap), *out = malloc(16 * 4096);
	enum proto_comp kinds[3] = { PROTO_COMP_ZSTD, PROTO_COMP_LZ4, PROTO_COMP_ZLIB };
	const uint32_t flags[3] = { PROTO_F_COMPRESSED_ZSTD, PROTO_F_COMPRESSED_LZ4,
				    PROTO_F_COMPRESSED_ZLIB };
	for (int k = 0; k < 3; k++) {
		int level = kinds[k] == PROTO_COMP_LZ4 ? 0 : PROTO_LEVEL_DEFAULT;
		ssize_t n = proto__encode_pages_comp(&codec, kinds[k], level, b, cap, 0, 16, offs, blk);
		T_CHECK(t, n > 0 && (size_t)n < cap / 4);
		T_CHECK_EQ(t, proto__comp_saved(16, (size_t)n), 16 * 4096 - (uint64_t)n);
		struct proto_hdr h;
		struct proto_pages pg;
		const char *why = NULL;
		T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
		T_CHECK_EQ(t, h.flags, flags[k]);
		T_CHECK_EQ(t, proto__decode_pages(b + 16, h.length, h.flags, &pg, &why), 0);
		T_CHECK_EQ(t, pg.comp, kinds[k]);
		T_CHECK_EQ(t, pg.raw_len, 16 * 4096);
		T_CHECK_EQ(t, proto__decompress(&codec, pg.comp, pg.data, pg.data_len, out, pg.raw_len), 0);
		for (int i = 0; i < 16; i++)
			T_CHECK(t, memcmp(out + i * 4096, blk + offs[i], 4096) == 0);
		/* truncated blob, corrupted blob, wrong expected size */
		T_CHECK_EQ(t, proto__decompress(&codec, pg.comp, pg.data, pg.data_len - 1, out, pg.raw_len), -EPROTO);
		T_CHECK_EQ(t, proto__decompress(&codec, pg.comp, pg.data, pg.data_len, out, pg.raw_len - 4096), -EPROTO);
		uint8_t junk[64];
		memset(junk, 0xa5, sizeof(junk));
		T_CHECK_EQ(t, proto__decompress(&codec, pg.comp, junk, sizeof(junk), out, pg.raw_len), -EPROTO);
		T_CHECK_EQ(t, proto__decompress(NULL, pg.comp, pg.data, pg.data_len, out, pg.raw_len), 0);
	}
	/* incompressible data falls back to a plain record */
	uint8_t *rnd = malloc(16 * 4096);
	uint64_t x = 88172645463325252ull;
	for (int i = 0; i < 16 * 4096; i++) {
		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		rnd[i] = (uint8_t)x;
	}
	for (int k = 0; k < 3; k++) {
		int level = kinds[k] == PROTO_COMP_LZ4 ? 0 : PROTO_LEVEL_DEFAULT;
		ssize_t n = proto__encode_pages_comp(&codec, kinds[k], level, b, cap, 0, 16, offs, rnd);
		T_CHECK_EQ(t, n, (ssize_t)cap);
		T_CHECK_EQ(t, b[4], 0);
		T_CHECK_EQ(t, proto__comp_saved(16, (size_t)n), 0);   /* a plain record saves nothing */
	}
	/* one-shot API */
	ssize_t c = proto__compress(NULL, PROTO_COMP_LZ4, 0, blk, 4096, out, 4096);
	T_CHECK(t, c > 0);
	T_CHECK_EQ(t, proto__compress(NULL, PROTO_COMP_ZSTD, 1, rnd, 4096, out, 100), -ENOSPC);
	T_CHECK_EQ(t, proto__compress(NULL, PROTO_COMP_ZLIB, 1, rnd, 4096, out, 100), -ENOSPC);
	T_CHECK_EQ(t, proto__compress(NULL, 7, 0, blk, 4096, out, 4096), -EINVAL);
	proto_codec__free(&codec);
	free(rnd); free(b); free(out); free(blk);
}

/* Levels: the valid ranges, a level that changes on one codec, a higher
 * level that packs tighter, zlib's level 0 (stored) sent plain, and a
 * zlib blob with bytes after its end refused. */
static void t_comp_levels(struct t *t)
{
	T_CHECK(t, proto__comp_level_ok(PROTO_COMP_ZSTD, 0));
	T_CHECK(t, proto__comp_level_ok(PROTO_COMP_ZSTD, PROTO_ZSTD_LEVEL_MAX));
	T_CHECK(t, !proto__comp_level_ok(PROTO_COMP_ZSTD, PROTO_ZSTD_LEVEL_MAX + 1));
	T_CHECK(t, !proto__comp_level_ok(PROTO_COMP_ZSTD, -1));
	T_CHECK(t, proto__comp_level_ok(PROTO_COMP_ZLIB, PROTO_ZLIB_LEVEL_MAX));
	T_CHECK(t, !proto__comp_level_ok(PROTO_COMP_ZLIB, PROTO_ZLIB_LEVEL_MAX + 1));
	T_CHECK(t, !proto__comp_level_ok(PROTO_COMP_LZ4, 1));
	T_CHECK(t, !proto__comp_level_ok(PROTO_COMP_NONE, 0));
	enum { N = 16 };
	uint8_t *blk = malloc(N * 4096), *out = malloc(N * 4096);
	size_t cap = proto__pages_record_size(N);
	uint8_t *b = malloc(cap);
	uint64_t offs[N], x = 0x9e3779b97f4a7c15ull;
	for (int i = 0; i < N; i++)
		offs[i] = (uint64_t)i * 4096;
	static const char *const words[] = { "page ", "dirty ", "ring ", "vcpu ", "migrate ",
					     "throttle ", "converge ", "switchover ", "guest ",
					     "bitmap ", "stream ", "channel " };
	for (int i = 0; i < N * 4096;) {          /* text-like: compresses, not trivially */
		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		for (const char *w = words[x % 12]; *w && i < N * 4096; w++)
			blk[i++] = (uint8_t)*w;
	}
	struct proto_codec codec = {0};
	const enum proto_comp kinds[2] = { PROTO_COMP_ZLIB, PROTO_COMP_ZSTD };
	const int levels[2][3] = { { 1, 9, 1 }, { 1, 19, 1 } };
	for (int k = 0; k < 2; k++) {
		ssize_t len[3];
		for (int l = 0; l < 3; l++) {
			len[l] = proto__encode_pages_comp(&codec, kinds[k], levels[k][l], b, cap, 0, N,
							  offs, blk);
			struct proto_hdr h;
			struct proto_pages pg;
			const char *why = NULL;
			T_CHECK(t, len[l] > 0 && (size_t)len[l] < cap);
			T_CHECK_EQ(t, proto__decode_header(b, 16, &h), 0);
			T_CHECK_EQ(t, proto__decode_pages(b + 16, h.length, h.flags, &pg, &why), 0);
			T_CHECK_EQ(t, pg.comp, kinds[k]);
			T_CHECK_EQ(t, proto__decompress(&codec, pg.comp, pg.data, pg.data_len, out,
							pg.raw_len), 0);
			T_CHECK(t, memcmp(out, blk, N * 4096) == 0);
		}
		T_CHECK(t, len[1] < len[0]);     /* the higher level packs tighter */
		if (len[1] >= len[0])
			printf("# kind %d: %zd bytes at level %d, %zd at %d\n", kinds[k], len[0],
			       levels[k][0], len[1], levels[k][1]);
		T_CHECK_EQ(t, len[2], len[0]);   /* and the codec goes back to the first */
		T_CHECK_EQ(t, proto__encode_pages_comp(&codec, kinds[k], -1, b, cap, 0, N, offs, blk),
			   -EINVAL);
	}
	T_CHECK_EQ(t, proto__encode_pages_comp(&codec, PROTO_COMP_ZLIB, 0, b, cap, 0, N, offs, blk),
		   (ssize_t)cap);               /* stored never shrinks: sent plain */
	T_CHECK_EQ(t, b[4], 0);
	ssize_t c = proto__compress(&codec, PROTO_COMP_ZLIB, 1, blk, 4096, b, cap - 1);
	T_CHECK(t, c > 0);
	b[c] = 0;                                /* a byte after the stream's end */
	T_CHECK_EQ(t, proto__decompress(&codec, PROTO_COMP_ZLIB, b, (size_t)c + 1, out, 4096), -EPROTO);
	T_CHECK_EQ(t, proto__decompress(&codec, PROTO_COMP_ZLIB, b, (size_t)c, out, 4096), 0);
	T_CHECK_EQ(t, proto__decompress(NULL, PROTO_COMP_ZLIB, b, (size_t)c + 1, out, 4096), -EPROTO);
	proto_codec__free(&codec);
	free(b); free(out); free(blk);
}

static void t_small_records(struct t *t)
{
	uint8_t b[8192];
	struct proto_hdr h;
	const char *why;
	/* ZERO */
	uint64_t offs[2] = { 4096, 1ull << 40 };
	ssize_t n = proto__encode_zero(b, sizeof(b), 7, 2, offs);
	T_CHECK_EQ(t, n, 16 + 8 + 16);
	struct proto_pages pg;
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	T_CHECK_EQ(t, proto__decode_zero(b + 16, h.length, &pg, &why), 0);
	T_CHECK(t, pg.block == 7 && pg.count == 2 && proto__offset(&pg, 1) == 1ull << 40);
	T_CHECK_EQ(t, proto__decode_zero(b + 16, h.length + 1, &pg, &why), -EPROTO);
	T_CHECK_EQ(t, proto__decode_zero(b + 16, h.length - 8, &pg, &why), -EPROTO);
	/* STATE */
	n = proto__encode_state(b, sizeof(b), 0x10, 3, 1, "hello", 5);
	T_CHECK_EQ(t, n, 16 + 12 + 5);
	struct proto_state st;
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	T_CHECK_EQ(t, proto__decode_state(b + 16, h.length, &st, &why), 0);
	T_CHECK(t, st.id == 0x10 && st.version == 3 && st.instance == 1 && st.len == 5);
	T_CHECK(t, memcmp(st.data, "hello", 5) == 0);
	T_CHECK_EQ(t, proto__decode_state(b + 16, 11, &st, &why), -EPROTO);
	n = proto__encode_state(b, sizeof(b), 1, 1, 0, NULL, 0);
	T_CHECK_EQ(t, n, 28);
	/* SYNC, PING */
	uint64_t v;
	n = proto__encode_sync(b, sizeof(b), 42);
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	T_CHECK_EQ(t, proto__decode_sync(b + 16, h.length, &v, &why), 0);
	T_CHECK_EQ(t, v, 42);
	n = proto__encode_rp_ping(b, sizeof(b), 0xdeadbeefcafeull);
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	T_CHECK_EQ(t, h.type, PROTO_RP_PING);
	T_CHECK_EQ(t, proto__decode_rp_ping(b + 16, h.length, &v, &why), 0);
	T_CHECK(t, v == 0xdeadbeefcafeull);
	n = proto__encode_rp_ack(b, sizeof(b), 0x123456789ull);
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	T_CHECK(t, h.type == PROTO_RP_ACK && !strcmp(proto__type_name(h.type), "RP_ACK"));
	T_CHECK_EQ(t, proto__decode_rp_ack(b + 16, h.length, &v, &why), 0);
	T_CHECK(t, v == 0x123456789ull);
	T_CHECK_EQ(t, proto__decode_rp_ack(b + 16, 4, &v, &why), -EPROTO);
	h.length = 16;   /* an RP_ACK of another length is refused at its header */
	T_CHECK(t, proto__header_problem(&h) != NULL);
	/* post-copy: DISCARD (ZERO's layout), POSTCOPY and RP_RUNNING (empty), RP_REQ */
	uint64_t doffs[2] = { 0x3000, 0x9000 };
	n = proto__encode_discard(b, sizeof(b), 1, 2, doffs);
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	T_CHECK(t, h.type == PROTO_DISCARD && !strcmp(proto__type_name(h.type), "DISCARD"));
	T_CHECK_EQ(t, proto__decode_discard(b + 16, h.length, &pg, &why), 0);
	T_CHECK(t, pg.block == 1 && pg.count == 2 && proto__offset(&pg, 1) == 0x9000);
	T_CHECK_EQ(t, proto__decode_discard(b + 16, h.length + 8, &pg, &why), -EPROTO);
	T_CHECK_EQ(t, proto__encode_discard(b, sizeof(b), 0, 0, doffs), -EINVAL);
	n = proto__encode_empty(b, sizeof(b), PROTO_POSTCOPY);
	T_CHECK_EQ(t, n, 16);
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	T_CHECK_EQ(t, proto__encode_empty(b, sizeof(b), PROTO_PAGES), -EINVAL);
	n = proto__encode_empty(b, sizeof(b), PROTO_RP_RUNNING);
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	h.length = 1;
	T_CHECK(t, proto__header_problem(&h) != NULL);    /* empty records stay empty */
	uint32_t blk;
	n = proto__encode_rp_req(b, sizeof(b), 1, 0x7000);
	T_CHECK_EQ(t, n, 32);
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	T_CHECK_EQ(t, proto__decode_rp_req(b + 16, h.length, &blk, &v, &why), 0);
	T_CHECK(t, blk == 1 && v == 0x7000);
	b[16 + 4] = 1;                                  /* reserved word */
	T_CHECK_EQ(t, proto__decode_rp_req(b + 16, h.length, &blk, &v, &why), -EPROTO);
	h.length = 8;
	T_CHECK(t, proto__header_problem(&h) != NULL);
	/* END with and without hash */
	uint8_t hash[32], got[32];
	for (int i = 0; i < 32; i++)
		hash[i] = (uint8_t)i;
	bool has;
	n = proto__encode_end(b, sizeof(b), hash);
	T_CHECK_EQ(t, n, 48);
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	T_CHECK_EQ(t, proto__decode_end(b + 16, h.length, h.flags, got, &has, &why), 0);
	T_CHECK(t, has && memcmp(got, hash, 32) == 0);
	n = proto__encode_end(b, sizeof(b), NULL);
	T_CHECK_EQ(t, n, 16);
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	T_CHECK_EQ(t, proto__decode_end(b + 16, h.length, h.flags, got, &has, &why), 0);
	T_CHECK(t, !has);
	/* END with the page sum (background-snapshot); the flag alone is bad */
	n = proto__encode_end_sum(b, sizeof(b), hash);
	T_CHECK_EQ(t, n, 48);
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	T_CHECK_EQ(t, h.flags, PROTO_F_HAS_CHECKSUM | PROTO_F_PAGE_SUM);
	T_CHECK_EQ(t, proto__decode_end(b + 16, h.length, h.flags, got, &has, &why), 0);
	T_CHECK(t, has && memcmp(got, hash, 32) == 0);
	T_CHECK_EQ(t, proto__decode_end(b + 16, 0, PROTO_F_PAGE_SUM, got, &has, &why), -EPROTO);
	/* ERROR, RP_FAIL, RP_OK */
	struct proto_error e;
	n = proto__encode_error(b, sizeof(b), 5, "disk on fire");
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	T_CHECK_EQ(t, h.type, PROTO_ERROR);
	T_CHECK_EQ(t, proto__decode_error(b + 16, h.length, &e, &why), 0);
	T_CHECK(t, e.code == 5 && e.msg_len == 12 && memcmp(e.msg, "disk on fire", 12) == 0);
	n = proto__encode_rp_fail(b, sizeof(b), 74, "checksum mismatch");
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	T_CHECK_EQ(t, h.type, PROTO_RP_FAIL);
	T_CHECK_EQ(t, proto__decode_error(b + 16, h.length, &e, &why), 0);
	T_CHECK_EQ(t, e.code, 74);
	char longmsg[PROTO_MAX_MSG + 100];
	memset(longmsg, 'a', sizeof(longmsg) - 1);
	longmsg[sizeof(longmsg) - 1] = 0;
	n = proto__encode_error(b, sizeof(b), 1, longmsg);
	T_CHECK_EQ(t, n, 16 + 4 + PROTO_MAX_MSG);
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	n = proto__encode_rp_ok(b, sizeof(b));
	T_CHECK_EQ(t, n, 16);
	T_CHECK_EQ(t, proto__decode_header(b, n, &h), 0);
	T_CHECK_EQ(t, h.type, PROTO_RP_OK);
	T_CHECK_EQ(t, proto__encode_rp_ok(b, 15), -ENOSPC);
	T_CHECK_EQ(t, proto__encode_sync(b, 23, 1), -ENOSPC);
	T_CHECK(t, strcmp(proto__type_name(PROTO_ZERO), "ZERO") == 0);
}

/* Post-copy recovery: RESUME (START's payload) and RP_BITMAP. */
static void t_resume_records(struct t *t)
{
	static uint8_t b[PROTO_HDR_SIZE + 16 + 8 * PROTO_MAX_BITMAP_WORDS + 8];
	struct proto_hdr h;
	struct proto_start st = { .version = PROTO_VERSION, .page_size = PROTO_PAGE_SIZE,
				  .nr_blocks = 1, .blocks = { { 0, 1 << 20 } } }, got;
	const char *why = NULL;
	ssize_t n = proto__encode_resume(b, sizeof(b), &st);
	T_CHECK_EQ(t, proto__decode_header(b, (size_t)n, &h), 0);
	T_CHECK(t, h.type == PROTO_RESUME && !strcmp(proto__type_name(h.type), "RESUME"));
	T_CHECK_EQ(t, proto__decode_start(b + 16, h.length, 0, &got, &why), 0);
	T_CHECK(t, got.nr_blocks == 1 && got.blocks[0].size == 1 << 20);
	/* a bitmap of 200 bits in two records; bits past the end never set */
	struct bitmap src, dst;
	T_CHECK_EQ(t, bitmap__init(&src, 200), 0);
	T_CHECK_EQ(t, bitmap__init(&dst, 200), 0);
	bitmap__set(&src, 3);
	bitmap__set(&src, 130);
	bitmap__set(&src, 199);
	uint64_t next = 0;
	n = proto__encode_rp_bitmap(b, sizeof(b), &src, 0, 2);
	T_CHECK_EQ(t, n, 16 + 16 + 16);
	T_CHECK_EQ(t, proto__decode_header(b, (size_t)n, &h), 0);
	T_CHECK_EQ(t, proto__decode_rp_bitmap(b + 16, h.length, &dst, &next, &why), 0);
	T_CHECK(t, next == 2 && bitmap__test(&dst, 3) && !bitmap__test(&dst, 130));
	n = proto__encode_rp_bitmap(b, sizeof(b), &src, 3, 2);
	T_CHECK_EQ(t, n, -EINVAL);                      /* past the last word */
	n = proto__encode_rp_bitmap(b, sizeof(b), &src, 2, 2);
	T_CHECK_EQ(t, n, 16 + 16 + 16);
	b[16 + 16 + 8 + 1] = 0xff;                      /* bits past 200 set */
	T_CHECK_EQ(t, proto__decode_header(b, (size_t)n, &h), 0);
	T_CHECK_EQ(t, proto__decode_rp_bitmap(b + 16, h.length, &dst, &next, &why), 0);
	T_CHECK(t, next == 4 && bitmap__test(&dst, 130) && bitmap__test(&dst, 199));
	T_CHECK_EQ(t, bitmap__count(&dst), 3);
	/* refusals: another page count, words past the end, a ragged length */
	struct bitmap other;
	T_CHECK_EQ(t, bitmap__init(&other, 100), 0);
	T_CHECK_EQ(t, proto__decode_rp_bitmap(b + 16, h.length, &other, &next, &why), -EPROTO);
	T_CHECK(t, why && strstr(why, "page count"));
	b[16] = 3;                                      /* first word 3 of 4 */
	T_CHECK_EQ(t, proto__decode_rp_bitmap(b + 16, h.length, &dst, &next, &why), -EPROTO);
	T_CHECK_EQ(t, proto__decode_rp_bitmap(b + 16, 20, &dst, &next, &why), -EPROTO);
	h.length = 20;
	T_CHECK(t, proto__header_problem(&h) != NULL);
	h.length = 16 + 8ull * (PROTO_MAX_BITMAP_WORDS + 1);
	T_CHECK(t, proto__header_problem(&h) != NULL);
	bitmap__free(&src);
	bitmap__free(&dst);
	bitmap__free(&other);
}

/* The post-copy sum: order-free, page numbers matter, one word shows. */
static void t_page_sum(struct t *t)
{
	uint8_t *mem = page_block(4, 3);
	struct proto_ram ram = { .nr_blocks = 2, .blocks = {
		{ 0, 2 * PROTO_PAGE_SIZE, mem }, { 1 << 20, 2 * PROTO_PAGE_SIZE, mem + 2 * PROTO_PAGE_SIZE } } };
	uint8_t whole[PROTO_HASH_LEN], parts[PROTO_HASH_LEN];
	proto__ram_page_sum(&ram, whole);
	uint64_t acc[4] = { 0 };
	for (int p = 3; p >= 0; p--)
		proto__page_sum_add(acc, (uint64_t)p, mem + (size_t)p * PROTO_PAGE_SIZE);
	proto__page_sum_out(acc, parts);
	T_CHECK(t, memcmp(whole, parts, PROTO_HASH_LEN) == 0);
	memset(acc, 0, sizeof(acc));       /* two pages swapped */
	proto__page_sum_add(acc, 0, mem + PROTO_PAGE_SIZE);
	proto__page_sum_add(acc, 1, mem);
	proto__page_sum_add(acc, 2, mem + 2 * PROTO_PAGE_SIZE);
	proto__page_sum_add(acc, 3, mem + 3 * PROTO_PAGE_SIZE);
	proto__page_sum_out(acc, parts);
	T_CHECK(t, memcmp(whole, parts, PROTO_HASH_LEN) != 0);
	mem[3 * PROTO_PAGE_SIZE + 808] ^= 1;
	proto__ram_page_sum(&ram, parts);
	T_CHECK(t, memcmp(whole, parts, PROTO_HASH_LEN) != 0);
	free(mem);
	uint8_t b[PROTO_HDR_SIZE];
	struct proto_hdr h;
	T_CHECK_EQ(t, proto__encode_postcopy(b, sizeof(b), true), PROTO_HDR_SIZE);
	T_CHECK_EQ(t, proto__decode_header(b, sizeof(b), &h), 0);
	T_CHECK(t, h.type == PROTO_POSTCOPY && h.flags == PROTO_F_HAS_CHECKSUM);
}

static void t_hash(struct t *t)
{
	size_t len = 1 << 20;
	uint8_t *a = page_block(len / 4096, 9);
	uint8_t h1[32], h2[32], h3[32];
	proto__hash_buf(a, len, h1);
	proto__hash_buf(a, len, h2);
	T_CHECK(t, memcmp(h1, h2, 32) == 0);
	/* every single-byte change is detected (sampled) */
	for (size_t i = 0; i < len; i += 4099) {
		a[i] ^= 0x10;
		proto__hash_buf(a, len, h3);
		T_CHECK(t, memcmp(h1, h3, 32) != 0);
		a[i] ^= 0x10;
	}
	/* swapping two words is detected */
	uint64_t w0, w1;
	memcpy(&w0, a, 8); memcpy(&w1, a + 32, 8);
	memcpy(a, &w1, 8); memcpy(a + 32, &w0, 8);
	proto__hash_buf(a, len, h3);
	T_CHECK(t, memcmp(h1, h3, 32) != 0);
	memcpy(a, &w0, 8); memcpy(a + 32, &w1, 8);
	/* ram hash over two blocks == hash over concatenation (sizes % 32 == 0) */
	struct proto_ram ram = { .nr_blocks = 2 };
	ram.blocks[0] = (struct proto_ram_block){ 0, len / 2, a };
	ram.blocks[1] = (struct proto_ram_block){ 1ull << 32, len / 2, a + len / 2 };
	proto__ram_hash(&ram, h3);
	T_CHECK(t, memcmp(h1, h3, 32) == 0);
	/* zero buffers of different lengths differ; tails are handled */
	uint8_t z[100] = {0};
	proto__hash_buf(z, 64, h2);
	proto__hash_buf(z, 96, h3);
	T_CHECK(t, memcmp(h2, h3, 32) != 0);
	proto__hash_buf(z, 70, h2);
	proto__hash_buf(z, 71, h3);
	T_CHECK(t, memcmp(h2, h3, 32) != 0);
	free(a);
}

typedef void (*ram_hash_fn)(const struct proto_ram *, uint8_t *);
typedef void (*ram_hash_zero_fn)(const struct proto_ram *, const struct bitmap *, uint8_t *);

/* Pages marked in the bitmap hash as zero pages: the same hash as a copy
 * of RAM with those pages zeroed, across two blocks; no bitmap, an empty
 * one, or one shorter than RAM behave as documented.  For the whole-RAM
 * hash and for the post-copy sum alike. */
static void check_as_zero(struct t *t, ram_hash_fn hash,
			  ram_hash_zero_fn hash_as_zero)
{
	size_t pages = 64, len = pages * 4096;
	uint8_t *a = page_block(pages, 3), *z = page_block(pages, 3);
	struct bitmap bm;
	T_CHECK_EQ(t, bitmap__init(&bm, pages), 0);
	if (!a || !z || !bm.words)
		return;
	struct proto_ram ra = { .nr_blocks = 2 }, rz = { .nr_blocks = 2 };
	ra.blocks[0] = (struct proto_ram_block){ 0, len / 4, a };
	ra.blocks[1] = (struct proto_ram_block){ 1ull << 32, len - len / 4, a + len / 4 };
	rz.blocks[0] = (struct proto_ram_block){ 0, len / 4, z };
	rz.blocks[1] = (struct proto_ram_block){ 1ull << 32, len - len / 4, z + len / 4 };
	uint8_t h1[32], h2[32], h3[32];
	hash(&ra, h1);
	hash_as_zero(&ra, NULL, h2);
	T_CHECK(t, memcmp(h1, h2, 32) == 0);
	hash_as_zero(&ra, &bm, h2);
	T_CHECK(t, memcmp(h1, h2, 32) == 0);
	/* pages 0, 15..17 (across the block boundary at 16) and the last */
	size_t marked[] = { 0, 15, 16, 17, pages - 1 };
	for (size_t i = 0; i < sizeof(marked) / sizeof(marked[0]); i++) {
		bitmap__set(&bm, marked[i]);
		memset(z + marked[i] * 4096, 0, 4096);
	}
	hash_as_zero(&ra, &bm, h2);
	hash(&rz, h3);
	T_CHECK(t, memcmp(h2, h3, 32) == 0);
	T_CHECK(t, memcmp(h1, h2, 32) != 0);
	/* a marked page's content does not matter; an unmarked one's does */
	a[16 * 4096 + 5] ^= 1;
	hash_as_zero(&ra, &bm, h3);
	T_CHECK(t, memcmp(h2, h3, 32) == 0);
	a[18 * 4096 + 5] ^= 1;
	hash_as_zero(&ra, &bm, h3);
	T_CHECK(t, memcmp(h2, h3, 32) != 0);
	a[18 * 4096 + 5] ^= 1;
	/* a bitmap shorter than RAM: pages past it count as they are */
	struct bitmap shortbm = { bm.words, 16 };
	memcpy(z, a, len);
	memset(z, 0, 4096);
	memset(z + 15 * 4096, 0, 4096);
	hash_as_zero(&ra, &shortbm, h2);
	hash(&rz, h3);
	T_CHECK(t, memcmp(h2, h3, 32) == 0);
	bitmap__free(&bm);
	free(a);
	free(z);
}

static void t_hash_as_zero(struct t *t)
{
	check_as_zero(t, proto__ram_hash, proto__ram_hash_as_zero);
	check_as_zero(t, proto__ram_page_sum, proto__ram_page_sum_as_zero);
}

static void t_hash_speed(struct t *t)
{
	size_t len = 256u << 20;
	uint8_t *a = malloc(len);
	T_CHECK(t, a != NULL);
	if (!a)
		return;
	memset(a, 0x5a, len);
	uint8_t h[32];
	uint64_t t0 = time__now_ns();
	proto__hash_buf(a, len, h);
	uint64_t dt = time__now_ns() - t0;
	printf("# ram hash: %.2f GB/s\n", (double)len / (double)dt);
	free(a);
}

int main(void)
{
	struct t t = {0};
	T_RUN(&t, t_header);
	T_RUN(&t, t_start);
	T_RUN(&t, t_start_uuid);
	T_RUN(&t, t_pages);
	T_RUN(&t, t_pages_comp);
	T_RUN(&t, t_comp_levels);
	T_RUN(&t, t_small_records);
	T_RUN(&t, t_resume_records);
	T_RUN(&t, t_page_sum);
	T_RUN(&t, t_hash);
	T_RUN(&t, t_hash_as_zero);
	T_RUN(&t, t_hash_speed);
	printf("%d passed, %d failed\n", t.passed, t.failed);
	return T_DONE(&t);
}
