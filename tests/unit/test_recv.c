/* Unit tests of the receiver state machine on a fake two-block RAM. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "mig/wire/proto_le.h"
#include "mig/recv/recv.h"

#define B0_PAGES 16
#define B1_PAGES 8
#define PG PROTO_PAGE_SIZE

struct fake {
	struct proto_ram ram;
	uint8_t *mem;               /* both blocks, back to back */
	size_t len;
};

static void fake__init(struct fake *f, unsigned seed)
{
	f->len = (size_t)(B0_PAGES + B1_PAGES) * PG;
	f->mem = malloc(f->len);
	for (size_t i = 0; i < f->len; i++)
		f->mem[i] = (uint8_t)(seed + i * 31 + i / PG);
	f->ram.nr_blocks = 2;
	f->ram.blocks[0] = (struct proto_ram_block){ 0, (uint64_t)B0_PAGES * PG, f->mem };
	f->ram.blocks[1] = (struct proto_ram_block){ 1ull << 32, (uint64_t)B1_PAGES * PG,
						     f->mem + (size_t)B0_PAGES * PG };
}

struct hooks {
	int sections, written, zeroed, syncs;
	uint32_t last_id, last_instance;
	char last_data[32];
	int state_ret;
};

static int h_state(void *ctx, uint32_t id, uint32_t ver, uint32_t inst, const void *d, size_t n)
{
	struct hooks *h = ctx;
	(void)ver;
	h->sections++;
	h->last_id = id;
	h->last_instance = inst;
	memset(h->last_data, 0, sizeof(h->last_data));
	memcpy(h->last_data, d, n < sizeof(h->last_data) ? n : sizeof(h->last_data) - 1);
	return h->state_ret;
}
static void h_written(void *ctx, uint32_t b, uint64_t o) { (void)b; (void)o; ((struct hooks *)ctx)->written++; }
static int h_sync(void *ctx, uint64_t r) { (void)r; ((struct hooks *)ctx)->syncs++; return 0; }

/* Feeds one encoded record (header decoded without validation). */
static int feed(struct mig_recv *r, const uint8_t *rec, ssize_t n)
{
	struct proto_hdr h;
	if (n < (ssize_t)PROTO_HDR_SIZE)
		return -999;
	int bad = proto__decode_header(rec, (size_t)n, &h);   /* fed anyway */
	(void)bad;
	return mig_recv__feed_record(r, &h, rec + PROTO_HDR_SIZE);
}

/* A whole valid stream that turns dst into src, written into out[]. */
struct rec { uint8_t *buf; ssize_t len; };

static int build_stream(struct fake *src, struct rec *out)
{
	struct proto_codec codec = {0};
	struct proto_start st;
	size_t cap = proto__pages_record_size(8);
	int n = 0;
	for (int i = 0; i < 10; i++)
		out[i].buf = malloc(cap);
	proto_start__from_ram(&st, &src->ram);
	out[n].len = proto__encode_start(out[n].buf, cap, &st); n++;
	uint64_t o0[3] = { 0, 5 * PG, 15 * PG };
	out[n].len = proto__encode_pages(out[n].buf, cap, 0, 3, o0, src->ram.blocks[0].host); n++;
	/* make block 1 pages 0..3 compressible, send them with zstd and lz4 */
	for (size_t i = 0; i < 4 * PG; i++)
		src->ram.blocks[1].host[i] = (uint8_t)(i % 17 == 0);
	uint64_t o1[2] = { 0, PG }, o2[2] = { 2 * PG, 3 * PG };
	out[n].len = proto__encode_pages_comp(&codec, PROTO_COMP_ZSTD, 1, out[n].buf, cap, 1, 2, o1,
					      src->ram.blocks[1].host); n++;
	out[n].len = proto__encode_pages_comp(&codec, PROTO_COMP_LZ4, 0, out[n].buf, cap, 1, 2, o2,
					      src->ram.blocks[1].host); n++;
	/* zero pages: block 0 pages 1, 2 and block 1 page 7 */
	memset(src->ram.blocks[0].host + PG, 0, 2 * PG);
	memset(src->ram.blocks[1].host + 7 * PG, 0, PG);
	uint64_t z0[2] = { PG, 2 * PG }, z1[1] = { 7 * PG };
	out[n].len = proto__encode_zero(out[n].buf, cap, 0, 2, z0); n++;
	out[n].len = proto__encode_zero(out[n].buf, cap, 1, 1, z1); n++;
	out[n].len = proto__encode_sync(out[n].buf, cap, 3); n++;
	out[n].len = proto__encode_state(out[n].buf, cap, 0x20, 1, 0, "cpu0", 4); n++;
	out[n].len = proto__encode_state(out[n].buf, cap, 0x20, 1, 1, "cpu1", 4); n++;
	proto_codec__free(&codec);
	return n;
}

/* Copies to dst the pages the stream above does not carry, so that after
 * applying it dst must equal src everywhere. */
static void align_untouched(struct fake *dst, const struct fake *src)
{
	static const int b0_sent[] = { 0, 1, 2, 5, 15 }, b1_sent[] = { 0, 1, 2, 3, 7 };
	for (int p = 0; p < B0_PAGES; p++) {
		int sent = 0;
		for (int k = 0; k < 5; k++) sent |= b0_sent[k] == p;
		if (!sent) memcpy(dst->ram.blocks[0].host + p * PG, src->ram.blocks[0].host + p * PG, PG);
	}
	for (int p = 0; p < B1_PAGES; p++) {
		int sent = 0;
		for (int k = 0; k < 5; k++) sent |= b1_sent[k] == p;
		if (!sent) memcpy(dst->ram.blocks[1].host + p * PG, src->ram.blocks[1].host + p * PG, PG);
	}
}

static void t_valid_stream(struct t *t)
{
	struct fake src, dst;
	struct rec recs[10];
	struct hooks hk = {0};
	struct mig_recv_ops ops = { .on_state = h_state, .on_page_written = h_written,
				    .on_sync = h_sync, .ctx = &hk };
	struct mig_recv r;
	fake__init(&src, 1);
	fake__init(&dst, 77);
	int n = build_stream(&src, recs);
	align_untouched(&dst, &src);
	/* page 2 of block 0 is already zero on dst: its memset is skipped */
	memset(dst.ram.blocks[0].host + 2 * PG, 0, PG);
	T_CHECK(t, memcmp(src.mem, dst.mem, src.len) != 0);
	T_CHECK_EQ(t, mig_recv__init(&r, &dst.ram, &ops), 0);
	T_CHECK_EQ(t, mig_recv__state(&r), MIG_RECV_WAIT_START);
	for (int i = 0; i < n; i++) {
		T_CHECK(t, recs[i].len > 0);
		T_CHECK_EQ(t, feed(&r, recs[i].buf, recs[i].len), 0);
		if (i == 0)
			T_CHECK_EQ(t, mig_recv__state(&r), MIG_RECV_RAM);
	}
	uint8_t hash[32], end[64];
	proto__ram_hash(&src.ram, hash);
	T_CHECK_EQ(t, feed(&r, end, proto__encode_end(end, sizeof(end), hash)), 0);
	T_CHECK_EQ(t, mig_recv__state(&r), MIG_RECV_DONE);
	T_CHECK(t, mig_recv__checksum_present(&r) && mig_recv__checksum_ok(&r));
	T_CHECK(t, memcmp(src.mem, dst.mem, src.len) == 0);
	T_CHECK(t, strcmp(mig_recv__error(&r), "") == 0);
	const struct mig_recv_stats *s = mig_recv__stats(&r);
	T_CHECK_EQ(t, s->pages, 7);
	T_CHECK_EQ(t, s->zero_pages, 3);
	T_CHECK_EQ(t, s->zero_skipped, 1);
	T_CHECK_EQ(t, s->sections, 2);
	T_CHECK_EQ(t, s->syncs, 1);
	T_CHECK_EQ(t, s->last_round, 3);
	T_CHECK_EQ(t, s->records, n + 1);
	T_CHECK_EQ(t, hk.written, 10);
	T_CHECK_EQ(t, hk.sections, 2);
	T_CHECK_EQ(t, hk.syncs, 1);
	T_CHECK(t, hk.last_id == 0x20 && hk.last_instance == 1 && !strcmp(hk.last_data, "cpu1"));
	/* anything after END fails */
	T_CHECK_EQ(t, feed(&r, recs[6].buf, recs[6].len), -EPROTO);
	T_CHECK(t, strstr(mig_recv__error(&r), "after END") != NULL);
	mig_recv__free(&r);
	for (int i = 0; i < 10; i++)
		free(recs[i].buf);
	free(src.mem);
	free(dst.mem);
}

/* ---- rejections: each leaves RAM byte-for-byte unchanged ---- */

struct neg {
	struct fake f;
	uint8_t *snap;
	struct mig_recv r;
	struct hooks hk;
	uint8_t buf[2 * PROTO_HDR_SIZE + 16 * (8 + PG) + 64];
};

static void neg__setup(struct neg *x, bool started)
{
	memset(&x->hk, 0, sizeof(x->hk));
	fake__init(&x->f, 5);
	x->snap = malloc(x->f.len);
	memcpy(x->snap, x->f.mem, x->f.len);
	struct mig_recv_ops ops = { .on_state = h_state, .ctx = &x->hk };
	if (mig_recv__init(&x->r, &x->f.ram, &ops))
		abort();
	if (started) {
		struct proto_start st;
		proto_start__from_ram(&st, &x->f.ram);
		if (feed(&x->r, x->buf, proto__encode_start(x->buf, sizeof(x->buf), &st)))
			abort();
	}
}

/* Feeds buf[0..n), expects error `err` with `substr` in the message, RAM
 * unchanged, and the receiver stuck in FAILED. */
static void neg__expect(struct t *t, struct neg *x, ssize_t n, int err, const char *substr)
{
	int e = feed(&x->r, x->buf, n);
	T_CHECK_EQ(t, e, err);
	T_CHECK_EQ(t, mig_recv__state(&x->r), MIG_RECV_FAILED);
	T_CHECK(t, mig_recv__error(&x->r)[0] != 0);
	if (substr && !strstr(mig_recv__error(&x->r), substr)) {
		T_CHECK(t, !"message");
		printf("#   message '%s' lacks '%s'\n", mig_recv__error(&x->r), substr);
	}
	T_CHECK(t, memcmp(x->snap, x->f.mem, x->f.len) == 0);
	uint8_t sync[32];
	T_CHECK_EQ(t, feed(&x->r, sync, proto__encode_sync(sync, sizeof(sync), 1)), err);
}

static void neg__done(struct neg *x)
{
	mig_recv__free(&x->r);
	free(x->f.mem);
	free(x->snap);
}

static void t_reject_order(struct t *t)
{
	struct neg x;
	uint64_t o[1] = { 0 };
	neg__setup(&x, false);
	neg__expect(t, &x, proto__encode_pages(x.buf, sizeof(x.buf), 0, 1, o, x.f.mem), -EPROTO,
		    "before START");
	neg__done(&x);
	neg__setup(&x, false);
	neg__expect(t, &x, proto__encode_end(x.buf, sizeof(x.buf), NULL), -EPROTO, "before START");
	neg__done(&x);
	neg__setup(&x, true);
	struct proto_start st;
	proto_start__from_ram(&st, &x.f.ram);
	neg__expect(t, &x, proto__encode_start(x.buf, sizeof(x.buf), &st), -EPROTO, "second START");
	neg__done(&x);
	neg__setup(&x, true);
	neg__expect(t, &x, proto__encode_rp_ok(x.buf, sizeof(x.buf)), -EPROTO, "RP_OK");
	neg__done(&x);
	neg__setup(&x, true);
	neg__expect(t, &x, proto__encode_error(x.buf, sizeof(x.buf), 5, "bye\n"), -ECANCELED,
		    "source aborted the migration (code 5): bye?");
	neg__done(&x);
}

static const uint8_t SESSION[PROTO_SESSION_LEN] = "0123456789abcdef";
static int h_channels(void *ctx, uint32_t n, const uint8_t s[PROTO_SESSION_LEN])
{
	((struct hooks *)ctx)->syncs += memcmp(s, SESSION, PROTO_SESSION_LEN) ? -100 : (int)n;
	return 0;
}

/* multifd: CHANNEL records and the restricted receiver of an extra channel. */
static void t_channels(struct t *t)
{
	struct neg x;
	uint32_t idx, cnt;
	uint8_t ses[PROTO_SESSION_LEN];
	const char *why;
	uint8_t b[64];
	const size_t len = 8 + PROTO_SESSION_LEN;
	T_CHECK(t, proto__encode_channel(b, sizeof(b), 2, 4, SESSION) ==
		   (ssize_t)(PROTO_HDR_SIZE + len));
	T_CHECK_EQ(t, proto__decode_channel(b + PROTO_HDR_SIZE, len, &idx, &cnt, ses, &why), 0);
	T_CHECK(t, idx == 2 && cnt == 4 && !memcmp(ses, SESSION, PROTO_SESSION_LEN));
	T_CHECK(t, proto__encode_channel(b, sizeof(b), 5, 4, SESSION) > 0);
	T_CHECK_EQ(t, proto__decode_channel(b + PROTO_HDR_SIZE, len, &idx, &cnt, ses, &why), -EPROTO);
	T_CHECK(t, proto__encode_channel(b, sizeof(b), 0, PROTO_MAX_CHANNELS + 1, SESSION) > 0);
	T_CHECK_EQ(t, proto__decode_channel(b + PROTO_HDR_SIZE, len, &idx, &cnt, ses, &why), -EPROTO);
	/* version 1's CHANNEL, without the session, is refused */
	T_CHECK_EQ(t, proto__decode_channel(b + PROTO_HDR_SIZE, 8, &idx, &cnt, ses, &why), -EPROTO);
	struct proto_hdr h = { .type = PROTO_CHANNEL, .length = 8 };
	T_CHECK(t, proto__header_problem(&h) != NULL);
	/* main stream without an on_channels hook refuses CHANNEL */
	neg__setup(&x, true);
	neg__expect(t, &x, proto__encode_channel(x.buf, sizeof(x.buf), 0, 2, SESSION), -EPROTO,
		    "CHANNEL");
	neg__done(&x);
	/* main stream with the hook: CHANNEL{0, n} reaches it, session and
	 * all; CHANNEL{1, n} does not */
	neg__setup(&x, true);
	x.r.ops.on_channels = h_channels;
	T_CHECK_EQ(t, feed(&x.r, x.buf, proto__encode_channel(x.buf, sizeof(x.buf), 0, 3, SESSION)), 0);
	T_CHECK_EQ(t, x.hk.syncs, 3);
	neg__expect(t, &x, proto__encode_channel(x.buf, sizeof(x.buf), 1, 3, SESSION), -EPROTO,
		    "CHANNEL");
	neg__done(&x);
	/* an extra channel takes pages and SYNC without START, nothing else */
	neg__setup(&x, false);
	mig_recv__free(&x.r);
	struct mig_recv_ops ops = { .on_state = h_state, .on_sync = h_sync, .ctx = &x.hk };
	T_CHECK_EQ(t, mig_recv__init_channel(&x.r, &x.f.ram, &ops), 0);
	uint64_t o[1] = { PG };
	memset(x.snap + PG, 0, PG);
	T_CHECK_EQ(t, feed(&x.r, x.buf, proto__encode_zero(x.buf, sizeof(x.buf), 0, 1, o)), 0);
	T_CHECK_EQ(t, feed(&x.r, x.buf, proto__encode_sync(x.buf, sizeof(x.buf), 1)), 0);
	T_CHECK_EQ(t, x.hk.syncs, 1);
	neg__expect(t, &x, proto__encode_state(x.buf, sizeof(x.buf), 1, 1, 0, "x", 1), -EPROTO,
		    "multifd channel");
	neg__done(&x);
	neg__setup(&x, false);
	mig_recv__free(&x.r);
	T_CHECK_EQ(t, mig_recv__init_channel(&x.r, &x.f.ram, &ops), 0);
	struct proto_start st;
	proto_start__from_ram(&st, &x.f.ram);
	neg__expect(t, &x, proto__encode_start(x.buf, sizeof(x.buf), &st), -EPROTO, NULL);
	neg__done(&x);
}

static void t_reject_header(struct t *t)
{
	struct neg x;
	uint64_t o[1] = { 0 };
	neg__setup(&x, true);
	T_CHECK_EQ(t, proto__encode_header(x.buf, 16, 0x42, 0, 0), 0);
	neg__expect(t, &x, 16, -EPROTO, "unknown record type");
	neg__done(&x);
	neg__setup(&x, true);
	ssize_t n = proto__encode_pages(x.buf, sizeof(x.buf), 0, 1, o, x.f.mem);
	x.buf[4] = 0x20;                        /* unknown flag bit */
	neg__expect(t, &x, n, -EPROTO, "flag");
	neg__done(&x);
	neg__setup(&x, true);
	n = proto__encode_zero(x.buf, sizeof(x.buf), 0, 1, o);
	x.buf[4] = PROTO_F_COMPRESSED_ZSTD;     /* flag not valid for ZERO */
	neg__expect(t, &x, n, -EPROTO, "flag");
	neg__done(&x);
	neg__setup(&x, true);
	T_CHECK_EQ(t, proto__encode_header(x.buf, 16, PROTO_PAGES, 0, PROTO_MAX_PAYLOAD + 1ull), 0);
	neg__expect(t, &x, 16, -EPROTO, "16 MiB");
	neg__done(&x);
}

static void t_reject_start(struct t *t)
{
	struct neg x;
	struct proto_start st;
	static const struct { int off; uint8_t val; int err; const char *msg; } cases[] = {
		{ 16 + 0, 'k', -EPROTO, "magic" },
		{ 16 + 8, 1, -EPROTO, "version" },          /* version 1 */
		{ 16 + 13, 0x20, -EPROTO, "page size" },     /* 8192 */
		{ 16 + 16, 3, -EPROTO, "block count" },
		{ 16 + 20 + 16 + 8, 0x20, -EINVAL, "layout" }, /* block 1 size */
		{ 16 + 20 + 0, 0x10, -EINVAL, "layout" },      /* block 0 gpa */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		neg__setup(&x, false);
		proto_start__from_ram(&st, &x.f.ram);
		ssize_t n = proto__encode_start(x.buf, sizeof(x.buf), &st);
		x.buf[cases[i].off] = cases[i].val;
		neg__expect(t, &x, n, cases[i].err, cases[i].msg);
		neg__done(&x);
	}
	/* fewer blocks than ours */
	neg__setup(&x, false);
	proto_start__from_ram(&st, &x.f.ram);
	st.nr_blocks = 1;
	neg__expect(t, &x, proto__encode_start(x.buf, sizeof(x.buf), &st), -EINVAL, "1 RAM blocks");
	neg__done(&x);
}

static void t_reject_bounds(struct t *t)
{
	struct neg x;
	static const char *msgs[] = { "out of range", "not page-aligned", "beyond block",
				      "beyond block", "beyond block", "not page-aligned" };
	uint64_t bad[][3] = {   /* block, offset of the last of 3 pages */
		{ 2, 0 }, { 0, 100 }, { 0, 16 * PG }, { 1, 8 * PG },
		{ 1, UINT64_MAX & ~(uint64_t)(PG - 1) }, { 0, UINT64_MAX },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		for (int zero = 0; zero < 2; zero++) {
			neg__setup(&x, true);
			uint64_t o[3] = { 0, PG, bad[i][1] };
			ssize_t n;
			/* block_host: encode from a scratch region, the bad
			 * offset is patched in afterwards */
			uint64_t ok[3] = { 0, PG, 2 * PG };
			if (zero)
				n = proto__encode_zero(x.buf, sizeof(x.buf), (uint32_t)bad[i][0], 3, o);
			else {
				n = proto__encode_pages(x.buf, sizeof(x.buf), (uint32_t)bad[i][0], 3, ok,
							x.snap);
				le__put64(x.buf + 16 + 8 + 16, bad[i][1]);
			}
			neg__expect(t, &x, n, -EINVAL, msgs[i]);
			neg__done(&x);
		}
	}
}

static void t_reject_payload(struct t *t)
{
	struct neg x;
	uint64_t o[2] = { 0, PG };
	/* data one byte short / one byte long */
	for (int d = -1; d <= 1; d += 2) {
		neg__setup(&x, true);
		ssize_t n = proto__encode_pages(x.buf, sizeof(x.buf), 0, 2, o, x.snap);
		le__put64(x.buf + 8, (uint64_t)(n - 16 + d));
		neg__expect(t, &x, n + d, -EPROTO, "count * page size");
		neg__done(&x);
	}
	/* count 0, count beyond the payload */
	neg__setup(&x, true);
	ssize_t n = proto__encode_zero(x.buf, sizeof(x.buf), 0, 2, o);
	le__put32(x.buf + 20, 0);
	neg__expect(t, &x, n, -EPROTO, "count 0");
	neg__done(&x);
	neg__setup(&x, true);
	n = proto__encode_zero(x.buf, sizeof(x.buf), 0, 2, o);
	le__put32(x.buf + 20, 3);
	neg__expect(t, &x, n, -EPROTO, "exceed the payload");
	neg__done(&x);
	neg__setup(&x, true);
	n = proto__encode_pages(x.buf, sizeof(x.buf), 0, 2, o, x.snap);
	le__put32(x.buf + 20, 0x40000000);      /* count * 8 overflows u32 */
	neg__expect(t, &x, n, -EPROTO, NULL);
	neg__done(&x);
	/* STATE too short, SYNC wrong size */
	neg__setup(&x, true);
	T_CHECK_EQ(t, proto__encode_header(x.buf, 16, PROTO_STATE, 0, 8), 0);
	neg__expect(t, &x, 24, -EPROTO, "too short");
	neg__done(&x);
	neg__setup(&x, true);
	T_CHECK_EQ(t, proto__encode_header(x.buf, 16, PROTO_SYNC, 0, 9), 0);
	neg__expect(t, &x, 25, -EPROTO, "length");
	neg__done(&x);
}

static void t_reject_compressed(struct t *t)
{
	struct neg x;
	struct proto_codec c = {0};
	uint64_t o[2] = { 0, PG };
	uint8_t *zeros = calloc(4, PG);
	const uint32_t flag[] = { [PROTO_COMP_ZSTD] = PROTO_F_COMPRESSED_ZSTD,
				  [PROTO_COMP_LZ4] = PROTO_F_COMPRESSED_LZ4,
				  [PROTO_COMP_ZLIB] = PROTO_F_COMPRESSED_ZLIB };
	for (int kind = PROTO_COMP_ZSTD; kind <= PROTO_COMP_ZLIB; kind++) {
		int level = kind == PROTO_COMP_LZ4 ? 0 : 1;
		/* corrupt blob */
		neg__setup(&x, true);
		ssize_t n = proto__encode_pages_comp(&c, kind, level, x.buf, sizeof(x.buf), 0, 2, o,
						     zeros);
		T_CHECK(t, n > 0 && n < 200);
		memset(x.buf + 16 + 8 + 16 + 4, 0xee, (size_t)n - 44);
		neg__expect(t, &x, n, -EPROTO, "decompress");
		neg__done(&x);
		/* blob of 1 page while count says 2: raw length mismatch */
		neg__setup(&x, true);
		n = proto__encode_pages_comp(&c, kind, level, x.buf, sizeof(x.buf), 0, 2, o, zeros);
		le__put32(x.buf + 40, PG);
		neg__expect(t, &x, n, -EPROTO, "raw length");
		neg__done(&x);
		/* valid 1-page blob with count 2 and raw length patched to 2 pages */
		neg__setup(&x, true);
		uint8_t one[256];
		n = proto__encode_pages_comp(&c, kind, level, one, sizeof(one), 0, 1, o, zeros);
		T_CHECK(t, n > 0);
		size_t blob = (size_t)n - 16 - 16 - 4;
		ssize_t h = proto__encode_pages_head(x.buf, sizeof(x.buf),
			flag[kind], 0, 2, o, 4 + blob);
		le__put32(x.buf + h, 2 * PG);
		memcpy(x.buf + h + 4, one + 16 + 16 + 4, blob);
		neg__expect(t, &x, h + 4 + (ssize_t)blob, -EPROTO, "decompress");
		neg__done(&x);
	}
	proto_codec__free(&c);
	free(zeros);
}

static void t_reject_hooks_and_checksum(struct t *t)
{
	struct neg x;
	neg__setup(&x, true);
	x.hk.state_ret = -ERANGE;
	neg__expect(t, &x, proto__encode_state(x.buf, sizeof(x.buf), 7, 1, 0, "x", 1), -ERANGE,
		    "section 0x7");
	neg__done(&x);
	/* no state handler */
	neg__setup(&x, true);
	x.r.ops.on_state = NULL;
	neg__expect(t, &x, proto__encode_state(x.buf, sizeof(x.buf), 7, 1, 0, "x", 1), -ENOTSUP,
		    "no state handler");
	neg__done(&x);
	/* wrong checksum */
	neg__setup(&x, true);
	uint8_t hash[32];
	proto__ram_hash(&x.f.ram, hash);
	hash[31] ^= 1;
	neg__expect(t, &x, proto__encode_end(x.buf, sizeof(x.buf), hash), -EBADMSG, "checksum");
	T_CHECK(t, mig_recv__checksum_present(&x.r) && !mig_recv__checksum_ok(&x.r));
	neg__done(&x);
	/* END with the page sum: right, then one bit off */
	neg__setup(&x, true);
	proto__ram_page_sum(&x.f.ram, hash);
	T_CHECK_EQ(t, feed(&x.r, x.buf, proto__encode_end_sum(x.buf, sizeof(x.buf), hash)), 0);
	T_CHECK(t, mig_recv__checksum_present(&x.r) && mig_recv__checksum_ok(&x.r));
	neg__done(&x);
	neg__setup(&x, true);
	hash[0] ^= 1;
	neg__expect(t, &x, proto__encode_end_sum(x.buf, sizeof(x.buf), hash), -EBADMSG, "checksum");
	neg__done(&x);
	/* END without checksum: done, but not "ok" */
	neg__setup(&x, true);
	T_CHECK_EQ(t, feed(&x.r, x.buf, proto__encode_end(x.buf, sizeof(x.buf), NULL)), 0);
	T_CHECK_EQ(t, mig_recv__state(&x.r), MIG_RECV_DONE);
	T_CHECK(t, !mig_recv__checksum_present(&x.r) && !mig_recv__checksum_ok(&x.r));
	neg__done(&x);
	/* init rejects a bad RAM description */
	struct mig_recv r;
	struct proto_ram ram = { .nr_blocks = 1 };
	ram.blocks[0] = (struct proto_ram_block){ 0, 100, x.buf };
	T_CHECK_EQ(t, mig_recv__init(&r, &ram, NULL), -EINVAL);
	ram.nr_blocks = 0;
	T_CHECK_EQ(t, mig_recv__init(&r, &ram, NULL), -EINVAL);
}

/* ---- over a stream ---- */

struct writer {
	int fd;
	struct rec *recs;
	int n;
	size_t cut;                 /* > 0: write only this many bytes in total */
};

static void *writer_thread(void *arg)
{
	struct writer *w = arg;
	struct mig_stream s;
	if (mig_stream__init(&s, w->fd))
		return NULL;
	size_t total = 0;
	for (int i = 0; i < w->n; i++) {
		size_t len = (size_t)w->recs[i].len;
		if (w->cut && total + len > w->cut)
			len = w->cut - total;
		if (mig_stream__write(&s, w->recs[i].buf, len))
			break;
		total += len;
		if (w->cut && total == w->cut)
			break;
	}
	if (!mig_stream__flush(&s) && !w->cut) {
		struct proto_hdr h;   /* wait for the reply */
		uint8_t buf[PROTO_HDR_SIZE + 4 + PROTO_MAX_MSG];
		if (!mig_stream__get_record(&s, &h, buf, sizeof(buf)))
			w->n = (int)h.type;
	}
	mig_stream__close(&s);
	return NULL;
}

static void run_stream(struct t *t, const struct fake *src, struct rec *recs, int n,
		       size_t cut, int want_err)
{
	struct fake dst;
	fake__init(&dst, 77);
	align_untouched(&dst, src);
	int sv[2];
	T_CHECK_EQ(t, socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	struct writer w = { sv[0], recs, n, cut };
	struct mig_stream s;
	struct mig_recv r;
	struct hooks hk = {0};
	struct mig_recv_ops ops = { .on_state = h_state, .ctx = &hk };
	T_CHECK_EQ(t, mig_stream__init(&s, sv[1]), 0);
	T_CHECK_EQ(t, mig_recv__init(&r, &dst.ram, &ops), 0);
	uint8_t *snap = malloc(dst.len);
	memcpy(snap, dst.mem, dst.len);
	pthread_t th;
	pthread_create(&th, NULL, writer_thread, &w);
	T_CHECK_EQ(t, mig_recv__run(&r, &s), want_err);
	int reply = mig_recv__reply(&r, &s);
	pthread_join(th, NULL);
	if (!want_err) {
		T_CHECK_EQ(t, reply, 0);
		T_CHECK_EQ(t, w.n, PROTO_RP_OK);
		T_CHECK(t, mig_recv__checksum_ok(&r));
		T_CHECK(t, memcmp(src->mem, dst.mem, dst.len) == 0);
		T_CHECK_EQ(t, mig_stream__bytes_in(&s), mig_recv__stats(&r)->bytes);
		T_CHECK_EQ(t, hk.sections, 2);
	} else {
		T_CHECK_EQ(t, mig_recv__state(&r), MIG_RECV_FAILED);
		T_CHECK(t, strstr(mig_recv__error(&r), "closed") != NULL);
		T_CHECK(t, memcmp(snap, dst.mem, dst.len) == 0);   /* partial record: nothing written */
	}
	mig_recv__free(&r);
	mig_stream__close(&s);
	free(snap);
	free(dst.mem);
}

static void t_stream(struct t *t)
{
	struct fake src;
	struct rec recs[11];
	fake__init(&src, 1);
	int n = build_stream(&src, recs);
	uint8_t hash[32];
	proto__ram_hash(&src.ram, hash);
	recs[n].len = proto__encode_end(recs[n].buf, 64, hash);
	n++;
	run_stream(t, &src, recs, n, 0, 0);
	/* connection lost inside the first PAGES record: in its header, right
	 * after the header, and in the middle of its payload */
	size_t start_len = (size_t)recs[0].len;
	run_stream(t, &src, recs, n, start_len + 10, -ECONNRESET);
	run_stream(t, &src, recs, n, start_len + 16, -ECONNRESET);
	run_stream(t, &src, recs, n, start_len + 16 + 100, -ECONNRESET);
	run_stream(t, &src, recs, n, start_len, -ECONNRESET);
	for (int i = 0; i < 10; i++)
		free(recs[i].buf);
	free(src.mem);
}

/* Random byte flips in valid records: every outcome is either accepted or
 * a clean failure with a message (run under ASan to catch stray writes). */
static void t_fuzz(struct t *t)
{
	struct fake src, dst;
	struct rec recs[10];
	struct mig_recv r;
	struct hooks hk = {0};
	struct mig_recv_ops ops = { .on_state = h_state, .ctx = &hk };
	fake__init(&src, 1);
	fake__init(&dst, 2);
	int n = build_stream(&src, recs);
	size_t cap = proto__pages_record_size(8);
	uint8_t *buf = malloc(cap);
	uint64_t x = 0x2545F4914F6CDD1Dull;
	int accepted = 0, rejected = 0;
	for (int it = 0; it < 20000; it++) {
		if (mig_recv__init(&r, &dst.ram, &ops))
			break;
		if (feed(&r, recs[0].buf, recs[0].len))
			T_CHECK(t, !"START");
		int k = 1 + it % (n - 1);
		memcpy(buf, recs[k].buf, (size_t)recs[k].len);
		for (int f = 0; f < 1 + it % 3; f++) {
			x ^= x << 13; x ^= x >> 7; x ^= x << 17;
			size_t span = recs[k].len < 96 ? (size_t)recs[k].len : 96;
			buf[(x >> 8) % span] ^= (uint8_t)(1u << (x % 8));
		}
		int e = feed(&r, buf, recs[k].len);
		if (e == 0) {
			accepted++;
		} else {
			rejected++;
			T_CHECK_EQ(t, mig_recv__state(&r), MIG_RECV_FAILED);
			T_CHECK(t, mig_recv__error(&r)[0] != 0);
		}
		mig_recv__free(&r);
	}
	printf("# fuzz: %d accepted, %d rejected\n", accepted, rejected);
	T_CHECK(t, rejected > 1000);
	free(buf);
	for (int i = 0; i < 10; i++)
		free(recs[i].buf);
	free(src.mem);
	free(dst.mem);
}

/* post-copy: DISCARD, POSTCOPY, pages placed by hooks afterwards */
struct pc_hooks {
	int discards, postcopy, placed, zeroes, place_ret;
	uint64_t last_off;
};
static int pc_discard(void *c, uint32_t b, uint64_t o) { (void)b; ((struct pc_hooks *)c)->discards++; ((struct pc_hooks *)c)->last_off = o; return 0; }
static int pc_run(void *c) { ((struct pc_hooks *)c)->postcopy++; return 0; }
static int pc_place(void *c, uint32_t b, uint64_t o, const void *d)
{
	struct pc_hooks *h = c;
	(void)b;
	(void)d;
	h->placed++;
	h->last_off = o;
	return h->place_ret;
}
static int pc_zero(void *c, uint32_t b, uint64_t o) { (void)b; (void)o; ((struct pc_hooks *)c)->zeroes++; return 0; }

static void pc__setup(struct mig_recv *r, struct fake *f, struct pc_hooks *h, bool hooks)
{
	fake__init(f, 9);
	memset(h, 0, sizeof(*h));
	struct mig_recv_ops ops = { .on_state = NULL, .ctx = h };
	if (hooks) {
		ops.on_discard = pc_discard;
		ops.on_postcopy = pc_run;
		ops.place_page = pc_place;
		ops.place_zero = pc_zero;
	}
	if (mig_recv__init(r, &f->ram, &ops))
		abort();
	uint8_t buf[256];
	struct proto_start st;
	proto_start__from_ram(&st, &f->ram);
	if (feed(r, buf, proto__encode_start(buf, sizeof(buf), &st)))
		abort();
}

static void t_postcopy(struct t *t)
{
	struct mig_recv r;
	struct fake f, src;
	struct pc_hooks h;
	static uint8_t buf[PROTO_HDR_SIZE + 16 + 2 * (8 + PG)];
	uint64_t o[2] = { 2 * PG, 7 * PG };
	fake__init(&src, 1);
	pc__setup(&r, &f, &h, true);
	uint8_t *snap = malloc(f.len);
	memcpy(snap, f.mem, f.len);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_discard(buf, sizeof(buf), 1, 2, o)), 0);
	T_CHECK(t, h.discards == 2 && h.last_off == 7 * PG);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_empty(buf, sizeof(buf), PROTO_POSTCOPY)), 0);
	T_CHECK_EQ(t, h.postcopy, 1);
	T_CHECK_EQ(t, mig_recv__state(&r), MIG_RECV_POSTCOPY);
	/* pages now go to the hooks, not into RAM */
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_pages(buf, sizeof(buf), 0, 2, o, src.mem)), 0);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_zero(buf, sizeof(buf), 1, 1, o)), 0);
	T_CHECK(t, h.placed == 2 && h.zeroes == 1 && mig_recv__stats(&r)->postcopy_pages == 3);
	T_CHECK(t, memcmp(snap, f.mem, f.len) == 0);
	/* state, sync, discard, a second POSTCOPY, an END checksum: refused */
	struct mig_recv r2;
	struct fake f2;
	struct pc_hooks h2;
	uint8_t hash[PROTO_HASH_LEN] = { 0 };
	for (int k = 0; k < 5; k++) {
		pc__setup(&r2, &f2, &h2, true);
		T_CHECK_EQ(t, feed(&r2, buf, proto__encode_empty(buf, sizeof(buf), PROTO_POSTCOPY)), 0);
		ssize_t n = k == 0 ? proto__encode_state(buf, sizeof(buf), 1, 1, 0, "x", 1) : k == 1 ? proto__encode_sync(buf, sizeof(buf), 3) :
			    k == 2 ? proto__encode_discard(buf, sizeof(buf), 0, 1, o) :
			    k == 3 ? proto__encode_empty(buf, sizeof(buf), PROTO_POSTCOPY) :
			    proto__encode_end(buf, sizeof(buf), hash);
		T_CHECK_EQ(t, feed(&r2, buf, n), -EPROTO);
		T_CHECK(t, strstr(mig_recv__error(&r2), k == 4 ? "checksum" : "during post-copy"));
		mig_recv__free(&r2);
		free(f2.mem);
	}
	/* END ends it */
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_end(buf, sizeof(buf), NULL)), 0);
	T_CHECK_EQ(t, mig_recv__state(&r), MIG_RECV_DONE);
	mig_recv__free(&r);
	free(f.mem);
	/* a placing hook that fails fails the stream, naming the page */
	pc__setup(&r, &f, &h, true);
	h.place_ret = -EIO;
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_empty(buf, sizeof(buf), PROTO_POSTCOPY)), 0);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_pages(buf, sizeof(buf), 0, 1, o, src.mem)), -EIO);
	T_CHECK(t, strstr(mig_recv__error(&r), "offset 0x2000") != NULL);
	mig_recv__free(&r);
	free(f.mem);
	/* without the hooks (capability off here) DISCARD and POSTCOPY are refused */
	for (int k = 0; k < 2; k++) {
		pc__setup(&r, &f, &h, false);
		ssize_t n = k ? proto__encode_empty(buf, sizeof(buf), PROTO_POSTCOPY)
			      : proto__encode_discard(buf, sizeof(buf), 0, 1, o);
		T_CHECK_EQ(t, feed(&r, buf, n), -EPROTO);
		T_CHECK(t, strstr(mig_recv__error(&r), "postcopy-ram") != NULL);
		mig_recv__free(&r);
		free(f.mem);
	}
	/* a DISCARD offset outside RAM is refused before any hook runs */
	pc__setup(&r, &f, &h, true);
	uint64_t far[1] = { (uint64_t)B1_PAGES * PG };
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_discard(buf, sizeof(buf), 1, 1, far)), -EINVAL);
	T_CHECK_EQ(t, h.discards, 0);
	mig_recv__free(&r);
	free(f.mem);
	free(src.mem);
	free(snap);
}

/* One step over a stream of the given bytes, then EOF. */
static int step_over(struct mig_recv *r, const void *bytes, size_t n)
{
	int p[2];
	struct mig_stream s;
	if (pipe(p) || (n && write(p[1], bytes, n) != (ssize_t)n))
		abort();
	close(p[1]);
	if (mig_stream__init(&s, p[0]))
		abort();
	int rc = mig_recv__step(r, &s);
	mig_stream__close(&s);
	return rc;
}

/* A broken stream in POSTCOPY can be resumed; anything else cannot. */
static void t_postcopy_resume(struct t *t)
{
	struct mig_recv r;
	struct fake f, src;
	struct pc_hooks h;
	static uint8_t buf[PROTO_HDR_SIZE + 16 + 2 * (8 + PG)];
	uint64_t o[2] = { 2 * PG, 7 * PG };
	fake__init(&src, 1);
	/* before POSTCOPY a broken stream is a plain failure */
	pc__setup(&r, &f, &h, true);
	T_CHECK_EQ(t, step_over(&r, NULL, 0), -ECONNRESET);
	T_CHECK(t, !mig_recv__link_lost(&r));
	T_CHECK_EQ(t, mig_recv__resume(&r), -EINVAL);
	mig_recv__free(&r);
	free(f.mem);
	/* in POSTCOPY: EOF mid-record, resumed, pages go on to the hooks */
	pc__setup(&r, &f, &h, true);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_empty(buf, sizeof(buf), PROTO_POSTCOPY)), 0);
	ssize_t n = proto__encode_pages(buf, sizeof(buf), 0, 2, o, src.mem);
	T_CHECK_EQ(t, step_over(&r, buf, (size_t)n / 2), -ECONNRESET);
	T_CHECK(t, mig_recv__link_lost(&r) && strstr(mig_recv__error(&r), "stream"));
	T_CHECK_EQ(t, mig_recv__resume(&r), 0);
	T_CHECK(t, mig_recv__state(&r) == MIG_RECV_POSTCOPY && !mig_recv__error(&r)[0]);
	T_CHECK_EQ(t, step_over(&r, buf, (size_t)n), 0);
	T_CHECK_EQ(t, h.placed, 2);
	/* bad framing (the bytes, not the link) or a bad record: not resumable */
	uint8_t junk[PROTO_HDR_SIZE] = { 0xff, 0xff, 0xff, 0x7f };
	T_CHECK_EQ(t, step_over(&r, junk, sizeof(junk)), -EPROTO);
	T_CHECK(t, !mig_recv__link_lost(&r));
	T_CHECK_EQ(t, mig_recv__resume(&r), -EINVAL);
	mig_recv__free(&r);
	free(f.mem);
	pc__setup(&r, &f, &h, true);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_empty(buf, sizeof(buf), PROTO_POSTCOPY)), 0);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_sync(buf, sizeof(buf), 1)), -EPROTO);
	T_CHECK_EQ(t, mig_recv__resume(&r), -EINVAL);
	mig_recv__free(&r);
	free(f.mem);
	free(src.mem);
}

static int pc_check_ret;
static int pc_check(void *c, const uint8_t *hash) { (void)c; (void)hash; return pc_check_ret; }

/* POSTCOPY's checksum flag, and END's post-copy checksum through the hook. */
static void t_postcopy_checksum(struct t *t)
{
	struct mig_recv r;
	struct fake f;
	struct pc_hooks h;
	uint8_t buf[PROTO_HDR_SIZE + PROTO_HASH_LEN], hash[PROTO_HASH_LEN] = { 1 };
	for (int k = 0; k < 5; k++) {
		pc__setup(&r, &f, &h, true);
		if (k)          /* k == 0: no hook to check with */
			r.ops.postcopy_check = pc_check;
		pc_check_ret = k == 2 ? -EBADMSG : 0;
		int rc = feed(&r, buf, proto__encode_postcopy(buf, sizeof(buf), k != 4));
		if (k == 0) {
			T_CHECK(t, rc == -EPROTO && strstr(mig_recv__error(&r), "cannot check"));
		} else {
			T_CHECK_EQ(t, rc, 0);
			/* k 3: END without the announced checksum; k 4: one not announced */
			rc = feed(&r, buf, proto__encode_end(buf, sizeof(buf), k == 3 ? NULL : hash));
			T_CHECK_EQ(t, rc, k == 1 ? 0 : k == 2 ? -EBADMSG : -EPROTO);
			T_CHECK(t, k != 1 || (mig_recv__checksum_present(&r) && mig_recv__checksum_ok(&r)));
		}
		mig_recv__free(&r);
		free(f.mem);
	}
}

static int pc_preempt(void *c, const uint8_t s[PROTO_SESSION_LEN], uint32_t channels)
{
	((struct pc_hooks *)c)->discards += memcmp(s, SESSION, PROTO_SESSION_LEN) ? -100 :
					    1 + (int)channels;
	return 0;
}
static int pc_end_hook(void *c) { return ((struct pc_hooks *)c)->place_ret; }

/* postcopy-preempt: PREEMPT on the main stream, the channel's receiver,
 * and the main stream's END waiting on it (on_postcopy_end). */
static void t_preempt(struct t *t)
{
	struct mig_recv r;
	struct fake f, src;
	struct pc_hooks h;
	static uint8_t buf[PROTO_HDR_SIZE + 16 + 2 * (8 + PG)];
	uint64_t o[2] = { 2 * PG, 7 * PG };
	uint8_t ses[PROTO_SESSION_LEN];
	uint32_t chans = 99;
	const char *why = NULL;
	fake__init(&src, 1);
	/* the record: the session and the multifd channels that follow */
	T_CHECK(t, proto__encode_preempt(buf, sizeof(buf), SESSION, 3) ==
		   (ssize_t)(PROTO_HDR_SIZE + PROTO_PREEMPT_LEN));
	T_CHECK_EQ(t, proto__decode_preempt(buf + PROTO_HDR_SIZE, PROTO_PREEMPT_LEN, ses, &chans,
					    &why), 0);
	T_CHECK(t, proto__same_session(ses, SESSION) && chans == 3);
	ses[15] ^= 1;
	T_CHECK(t, !proto__same_session(ses, SESSION));
	T_CHECK_EQ(t, proto__decode_preempt(buf + PROTO_HDR_SIZE, PROTO_SESSION_LEN, ses, &chans,
					    &why), -EPROTO);
	T_CHECK(t, proto__encode_preempt(buf, sizeof(buf), SESSION, PROTO_MAX_CHANNELS + 1) > 0);
	T_CHECK_EQ(t, proto__decode_preempt(buf + PROTO_HDR_SIZE, PROTO_PREEMPT_LEN, ses, &chans,
					    &why), -EPROTO);
	struct proto_hdr hd = { .type = PROTO_PREEMPT, .length = PROTO_SESSION_LEN };
	T_CHECK(t, proto__header_problem(&hd) != NULL);
	hd.length = PROTO_PREEMPT_LEN;
	T_CHECK(t, proto__header_problem(&hd) == NULL);
	/* the main stream: without the hook (capability off here) refused,
	 * naming the capability; with it the session reaches the hook */
	pc__setup(&r, &f, &h, true);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_preempt(buf, sizeof(buf), SESSION, 0)), -EPROTO);
	T_CHECK(t, strstr(mig_recv__error(&r), "capability postcopy-preempt") != NULL);
	mig_recv__free(&r);
	free(f.mem);
	pc__setup(&r, &f, &h, true);
	r.ops.on_preempt = pc_preempt;
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_preempt(buf, sizeof(buf), SESSION, 2)), 0);
	T_CHECK_EQ(t, h.discards, 3);
	/* not once the guest runs here */
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_empty(buf, sizeof(buf), PROTO_POSTCOPY)), 0);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_preempt(buf, sizeof(buf), SESSION, 0)), -EPROTO);
	mig_recv__free(&r);
	free(f.mem);
	/* END in post-copy waits on the hook: a failure other than -EPROTO is
	 * a lost link (the migration pauses), -EPROTO is not */
	for (int k = 0; k < 3; k++) {
		pc__setup(&r, &f, &h, true);
		r.ops.on_postcopy_end = pc_end_hook;
		h.place_ret = k == 0 ? 0 : k == 1 ? -ETIMEDOUT : -EPROTO;
		T_CHECK_EQ(t, feed(&r, buf, proto__encode_empty(buf, sizeof(buf), PROTO_POSTCOPY)), 0);
		int rc = feed(&r, buf, proto__encode_end(buf, sizeof(buf), NULL));
		T_CHECK_EQ(t, rc, h.place_ret);
		T_CHECK(t, k == 0 ? mig_recv__state(&r) == MIG_RECV_DONE :
			   mig_recv__link_lost(&r) == (k == 1));
		if (k == 1)
			T_CHECK_EQ(t, mig_recv__resume(&r), 0);
		mig_recv__free(&r);
		free(f.mem);
	}
	/* a resumed post-copy of a migration that had the channel: one
	 * PREEMPT, with no multifd channels, reopens it; not a second, not
	 * one naming channels, not without the expectation */
	for (int k = 0; k < 3; k++) {
		pc__setup(&r, &f, &h, true);
		r.ops.on_preempt = pc_preempt;
		r.ops.on_postcopy_end = pc_end_hook;
		h.place_ret = -ETIMEDOUT;       /* END finds the channel's link lost */
		T_CHECK_EQ(t, feed(&r, buf, proto__encode_empty(buf, sizeof(buf), PROTO_POSTCOPY)), 0);
		T_CHECK_EQ(t, feed(&r, buf, proto__encode_end(buf, sizeof(buf), NULL)), -ETIMEDOUT);
		T_CHECK_EQ(t, mig_recv__resume(&r), 0);
		if (k != 2)
			mig_recv__expect_preempt(&r);
		h.discards = 0;
		int rc = feed(&r, buf, proto__encode_preempt(buf, sizeof(buf), SESSION, k == 1 ? 2 : 0));
		T_CHECK_EQ(t, rc, k == 0 ? 0 : -EPROTO);
		T_CHECK_EQ(t, h.discards, k == 0 ? 1 : 0);
		if (k == 0)     /* once only */
			T_CHECK_EQ(t, feed(&r, buf, proto__encode_preempt(buf, sizeof(buf), SESSION, 0)),
				   -EPROTO);
		T_CHECK(t, k != 1 || strstr(mig_recv__error(&r), "names multifd channels"));
		mig_recv__free(&r);
		free(f.mem);
	}
	/* the channel: pages and zeros placed at once, no START; an END
	 * without checksum ends it; nothing else is taken */
	fake__init(&f, 9);
	memset(&h, 0, sizeof(h));
	struct mig_recv_ops ops = { .place_page = pc_place, .place_zero = pc_zero, .ctx = &h };
	struct mig_recv_ops half = { .place_page = pc_place, .ctx = &h };
	T_CHECK_EQ(t, mig_recv__init_preempt(&r, &f.ram, &half), -EINVAL);
	T_CHECK_EQ(t, mig_recv__init_preempt(&r, &f.ram, &ops), 0);
	uint8_t *snap = malloc(f.len);
	memcpy(snap, f.mem, f.len);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_pages(buf, sizeof(buf), 0, 2, o, src.mem)), 0);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_zero(buf, sizeof(buf), 1, 1, o)), 0);
	T_CHECK(t, h.placed == 2 && h.zeroes == 1 && mig_recv__stats(&r)->postcopy_pages == 3);
	T_CHECK(t, memcmp(snap, f.mem, f.len) == 0);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_end(buf, sizeof(buf), NULL)), 0);
	T_CHECK_EQ(t, mig_recv__state(&r), MIG_RECV_DONE);
	mig_recv__free(&r);
	uint8_t hash[PROTO_HASH_LEN] = { 0 };
	struct proto_start st;
	proto_start__from_ram(&st, &f.ram);
	for (int k = 0; k < 6; k++) {
		T_CHECK_EQ(t, mig_recv__init_preempt(&r, &f.ram, &ops), 0);
		ssize_t n = k == 0 ? proto__encode_start(buf, sizeof(buf), &st) :
			    k == 1 ? proto__encode_sync(buf, sizeof(buf), 1) :
			    k == 2 ? proto__encode_state(buf, sizeof(buf), 1, 1, 0, "x", 1) :
			    k == 3 ? proto__encode_discard(buf, sizeof(buf), 0, 1, o) :
			    k == 4 ? proto__encode_preempt(buf, sizeof(buf), SESSION, 0) :
			    proto__encode_end(buf, sizeof(buf), hash);
		T_CHECK_EQ(t, feed(&r, buf, n), -EPROTO);
		T_CHECK(t, k == 0 || strstr(mig_recv__error(&r), "preempt") != NULL);
		mig_recv__free(&r);
	}
	/* bounds as on the main stream: an offset outside RAM places nothing */
	T_CHECK_EQ(t, mig_recv__init_preempt(&r, &f.ram, &ops), 0);
	uint64_t far[1] = { (uint64_t)B1_PAGES * PG };
	h.placed = 0;
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_pages(buf, sizeof(buf), 1, 1, far, src.mem)),
		   -EINVAL);
	T_CHECK_EQ(t, h.placed, 0);
	mig_recv__free(&r);
	free(snap);
	free(f.mem);
	free(src.mem);
}

/* ---- x-ignore-shared: START's RAM_SHARED, SHARED before END ---- */

/* the receiver's ctx: h_state takes it for its struct hooks */
struct sh_hooks { struct hooks base; int starts; bool shared; uint64_t token; int start_ret; };
static int sh_start(void *c, const struct proto_start *st)
{
	struct sh_hooks *h = c;
	h->starts++;
	h->shared = st->ram_shared;
	return h->start_ret;
}
static int sh_token(void *c, uint64_t tok) { ((struct sh_hooks *)c)->token = tok; return 0; }

static void sh__setup(struct mig_recv *r, struct fake *f, struct sh_hooks *h, bool hooks)
{
	memset(h, 0, sizeof(*h));
	fake__init(f, 9);
	struct mig_recv_ops ops = { .on_state = h_state, .ctx = h };
	if (hooks) {
		ops.on_start = sh_start;
		ops.on_shared = sh_token;
	}
	if (mig_recv__init(r, &f->ram, &ops))
		abort();
}

static ssize_t sh__start(uint8_t *buf, size_t cap, const struct fake *f, bool shared)
{
	struct proto_start st;
	proto_start__from_ram(&st, &f->ram);
	st.ram_shared = shared;
	return proto__encode_start(buf, cap, &st);
}

static void t_shared(struct t *t)
{
	struct mig_recv r;
	struct fake f;
	struct sh_hooks h;
	uint8_t buf[2 * PROTO_HDR_SIZE + 2 * (8 + PG) + 64];
	uint64_t o[1] = { 0 };
	struct proto_hdr hd;
	/* the whole stream: START(shared), STATE, SHARED, END */
	sh__setup(&r, &f, &h, true);
	ssize_t n = sh__start(buf, sizeof(buf), &f, true);
	T_CHECK(t, n > 0 && !proto__decode_header(buf, (size_t)n, &hd) &&
		   hd.flags == PROTO_F_RAM_SHARED);
	T_CHECK_EQ(t, feed(&r, buf, n), 0);
	T_CHECK(t, h.starts == 1 && h.shared);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_state(buf, sizeof(buf), 1, 1, 0, "cpu", 3)), 0);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_shared(buf, sizeof(buf), 0x1234)), 0);
	T_CHECK_EQ(t, h.token, 0x1234);
	T_CHECK_EQ(t, mig_recv__shared_token(&r), 0x1234);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_end(buf, sizeof(buf), NULL)), 0);
	T_CHECK_EQ(t, mig_recv__state(&r), MIG_RECV_DONE);
	mig_recv__free(&r);
	free(f.mem);
	/* an ordinary START reaches the hook too, unshared */
	sh__setup(&r, &f, &h, true);
	T_CHECK_EQ(t, feed(&r, buf, sh__start(buf, sizeof(buf), &f, false)), 0);
	T_CHECK(t, h.starts == 1 && !h.shared);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_shared(buf, sizeof(buf), 7)), -EPROTO);
	T_CHECK(t, strstr(mig_recv__error(&r), "START did not say") != NULL);
	mig_recv__free(&r);
	free(f.mem);
	/* no page may be written into a RAM handed over: RAM unchanged */
	sh__setup(&r, &f, &h, true);
	uint8_t *snap = malloc(f.len);
	memcpy(snap, f.mem, f.len);
	T_CHECK_EQ(t, feed(&r, buf, sh__start(buf, sizeof(buf), &f, true)), 0);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_pages(buf, sizeof(buf), 0, 1, o, snap + PG)),
		   -EPROTO);
	T_CHECK(t, strstr(mig_recv__error(&r), "handed over in a shared file") != NULL);
	T_CHECK(t, memcmp(snap, f.mem, f.len) == 0);
	mig_recv__free(&r);
	free(f.mem);
	sh__setup(&r, &f, &h, true);
	T_CHECK_EQ(t, feed(&r, buf, sh__start(buf, sizeof(buf), &f, true)), 0);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_zero(buf, sizeof(buf), 0, 1, o)), -EPROTO);
	T_CHECK(t, memcmp(snap, f.mem, f.len) == 0);
	mig_recv__free(&r);
	free(f.mem);
	sh__setup(&r, &f, &h, true);
	T_CHECK_EQ(t, feed(&r, buf, sh__start(buf, sizeof(buf), &f, true)), 0);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_sync(buf, sizeof(buf), 1)), -EPROTO);
	mig_recv__free(&r);
	free(f.mem);
	/* SHARED before the state: the order is free, END closes */
	sh__setup(&r, &f, &h, true);
	T_CHECK_EQ(t, feed(&r, buf, sh__start(buf, sizeof(buf), &f, true)), 0);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_shared(buf, sizeof(buf), 9)), 0);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_state(buf, sizeof(buf), 1, 1, 0, "cpu", 3)), 0);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_end(buf, sizeof(buf), NULL)), 0);
	T_CHECK_EQ(t, mig_recv__state(&r), MIG_RECV_DONE);
	mig_recv__free(&r);
	free(f.mem);
	/* END before the hand-over; a second SHARED */
	sh__setup(&r, &f, &h, true);
	T_CHECK_EQ(t, feed(&r, buf, sh__start(buf, sizeof(buf), &f, true)), 0);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_end(buf, sizeof(buf), NULL)), -EPROTO);
	T_CHECK(t, strstr(mig_recv__error(&r), "before the RAM's hand-over") != NULL);
	mig_recv__free(&r);
	free(f.mem);
	sh__setup(&r, &f, &h, true);
	T_CHECK_EQ(t, feed(&r, buf, sh__start(buf, sizeof(buf), &f, true)), 0);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_shared(buf, sizeof(buf), 5)), 0);
	T_CHECK_EQ(t, feed(&r, buf, proto__encode_shared(buf, sizeof(buf), 5)), -EPROTO);
	mig_recv__free(&r);
	free(f.mem);
	/* a side with no hooks refuses a shared START; a hook's refusal stands */
	sh__setup(&r, &f, &h, false);
	T_CHECK_EQ(t, feed(&r, buf, sh__start(buf, sizeof(buf), &f, true)), -EPROTO);
	T_CHECK(t, strstr(mig_recv__error(&r), "this side takes none") != NULL);
	mig_recv__free(&r);
	free(f.mem);
	sh__setup(&r, &f, &h, true);
	h.start_ret = -EBUSY;
	T_CHECK_EQ(t, feed(&r, buf, sh__start(buf, sizeof(buf), &f, false)), -EBUSY);
	T_CHECK_EQ(t, mig_recv__state(&r), MIG_RECV_FAILED);
	mig_recv__free(&r);
	free(f.mem);
	free(snap);
	/* token 0 and a RESUME with the flag are malformed */
	T_CHECK_EQ(t, proto__encode_shared(buf, sizeof(buf), 0), -EINVAL);
	uint8_t zero_tok[PROTO_HDR_SIZE + 8] = { 0 };
	T_CHECK_EQ(t, proto__encode_header(zero_tok, sizeof(zero_tok), PROTO_SHARED, 0, 8), 0);
	sh__setup(&r, &f, &h, true);
	T_CHECK_EQ(t, feed(&r, buf, sh__start(buf, sizeof(buf), &f, true)), 0);
	T_CHECK_EQ(t, feed(&r, zero_tok, sizeof(zero_tok)), -EPROTO);
	mig_recv__free(&r);
	free(f.mem);
	hd = (struct proto_hdr){ .type = PROTO_RESUME, .flags = PROTO_F_RAM_SHARED, .length = 36 };
	T_CHECK(t, proto__header_problem(&hd) != NULL);
}

int main(void)
{
	struct t t = {0};
	T_RUN(&t, t_valid_stream);
	T_RUN(&t, t_reject_order);
	T_RUN(&t, t_reject_header);
	T_RUN(&t, t_channels);
	T_RUN(&t, t_reject_start);
	T_RUN(&t, t_reject_bounds);
	T_RUN(&t, t_reject_payload);
	T_RUN(&t, t_reject_compressed);
	T_RUN(&t, t_reject_hooks_and_checksum);
	T_RUN(&t, t_stream);
	T_RUN(&t, t_postcopy);
	T_RUN(&t, t_postcopy_resume);
	T_RUN(&t, t_postcopy_checksum);
	T_RUN(&t, t_preempt);
	T_RUN(&t, t_shared);
	T_RUN(&t, t_fuzz);
	printf("%d passed, %d failed\n", t.passed, t.failed);
	return T_DONE(&t);
}
