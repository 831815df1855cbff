/* xbzrle: the delta codec, the XBZRLE record, the source's cache, and a
 * receiver applying records to RAM (mig/wire/xbzrle.h,
 * mig/send/xbzrle_cache.h, mig/recv/recv.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "mig/recv/recv.h"
#include "mig/send/xbzrle_cache.h"
#include "mig/wire/xbzrle.h"

#define PG PROTO_PAGE_SIZE
#define NPAGES 8

static unsigned long long rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
	return t_xorshift(&rng_state);
}

/* cur = old with about `changes` bytes rewritten at random places. */
static void mutate(const uint8_t *old, uint8_t *cur, unsigned changes)
{
	memcpy(cur, old, PG);
	for (unsigned i = 0; i < changes; i++)
		cur[rnd() % PG] = (uint8_t)rnd();
}

static void t_roundtrip(struct t *t)
{
	uint8_t old[PG], cur[PG], out[PG], page[PG];
	static const unsigned changes[] = { 1, 2, 5, 40, 300, 1000 };
	for (unsigned k = 0; k < sizeof(changes) / sizeof(changes[0]); k++) {
		for (int rep = 0; rep < 200; rep++) {
			for (unsigned i = 0; i < PG; i++)
				old[i] = (uint8_t)(rep & 1 ? rnd() : i / 64);
			mutate(old, cur, changes[k]);
			ssize_t n = xbzrle__encode(old, cur, out, XBZRLE_MAX_DELTA);
			if (!memcmp(old, cur, PG)) {
				T_CHECK_EQ(t, n, 0);
				continue;
			}
			if (n == -ENOSPC) {     /* too many changes: with room, not shorter */
				static uint8_t big[3 * PG];
				ssize_t m = xbzrle__encode(old, cur, big, sizeof(big));
				T_CHECK(t, m >= (ssize_t)XBZRLE_MAX_DELTA);
				continue;
			}
			const char *why = NULL;
			T_CHECK(t, n > 0);
			T_CHECK_EQ(t, xbzrle__check(out, (size_t)n, &why), 0);
			memcpy(page, old, PG);
			xbzrle__apply(out, (size_t)n, page);
			T_CHECK(t, !memcmp(page, cur, PG));
		}
	}
}

static void t_sizes(struct t *t)
{
	uint8_t old[PG], cur[PG], out[PG];
	memset(old, 7, PG);
	memcpy(cur, old, PG);
	T_CHECK_EQ(t, xbzrle__encode(old, cur, out, XBZRLE_MAX_DELTA), 0);   /* unchanged */
	cur[100] = 8;           /* one byte: skip 100, n 1, the byte */
	T_CHECK_EQ(t, xbzrle__encode(old, cur, out, XBZRLE_MAX_DELTA), 3);
	cur[4095] = 9;          /* and the last: skip 3994 takes two bytes */
	T_CHECK_EQ(t, xbzrle__encode(old, cur, out, XBZRLE_MAX_DELTA), 3 + 2 + 1 + 1);
	cur[102] = 1;           /* one unchanged byte between: the same run */
	T_CHECK_EQ(t, xbzrle__encode(old, cur, out, XBZRLE_MAX_DELTA), 5 + 2 + 1 + 1);
	for (unsigned i = 0; i < PG; i++)   /* every byte: longer than a page allows */
		cur[i] = (uint8_t)~old[i];
	T_CHECK_EQ(t, xbzrle__encode(old, cur, out, XBZRLE_MAX_DELTA), -ENOSPC);
	T_CHECK_EQ(t, xbzrle__encode(old, cur, out, 2), -ENOSPC);
}

static void t_check_rejects(struct t *t)
{
	const char *why = NULL;
	static const struct { uint8_t b[8]; size_t len; } bad[] = {
		{ { 0 }, 0 },                         /* empty */
		{ { 0, 0 }, 2 },                      /* a run of no bytes */
		{ { 0, 2, 1 }, 3 },                   /* bytes past its end */
		{ { 0x80 }, 1 },                      /* truncated number */
		{ { 0x80, 0x80, 0x01, 1, 5 }, 5 },    /* a number of three bytes */
		{ { 0x81, 0x20, 1, 5 }, 4 },          /* skip 4097 > a page */
		{ { 0xff, 0x1f, 2, 1, 2 }, 5 },       /* skip 4095 + 2 bytes: past the page */
		{ { 0, 1, 5, 0, 1, 6 }, 6 },          /* a second run without a skip */
	};
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		why = NULL;
		T_CHECK_EQ(t, xbzrle__check(bad[i].b, bad[i].len, &why), -EPROTO);
		T_CHECK(t, why != NULL);
	}
	static const uint8_t good[] = { 0, 1, 5, 3, 2, 6, 7, 0xf9, 0x1f, 1, 9 };
	T_CHECK_EQ(t, xbzrle__check(good, sizeof(good), &why), 0);   /* ends at byte 4095 */
	uint8_t page[PG] = { 0 };
	xbzrle__apply(good, sizeof(good), page);
	T_CHECK(t, page[0] == 5 && page[4] == 6 && page[5] == 7 && page[PG - 1] == 9);
	T_CHECK(t, page[1] == 0 && page[6] == 0);
}

static void t_cache(struct t *t)
{
	struct xbzrle_cache c;
	T_CHECK(t, !xbzrle_cache__size_ok(0) && !xbzrle_cache__size_ok(2048));
	T_CHECK(t, !xbzrle_cache__size_ok(3 * PG) && xbzrle_cache__size_ok(64ull << 20));
	T_CHECK_EQ(t, xbzrle_cache__init(&c, 3 * PG, 10), -EINVAL);
	T_CHECK_EQ(t, xbzrle_cache__init(&c, 64ull << 20, 5), 0);
	T_CHECK_EQ(t, c.slots, 8);          /* no more than RAM needs */
	xbzrle_cache__free(&c);
	T_CHECK_EQ(t, xbzrle_cache__init(&c, 4 * PG, 100), 0);
	T_CHECK_EQ(t, c.slots, 4);
	T_CHECK(t, xbzrle_cache__find(&c, 0) == NULL);     /* empty slots hold no page 0 */
	memset(xbzrle_cache__claim(&c, 1), 0x11, PG);
	uint8_t *p = xbzrle_cache__find(&c, 1);
	T_CHECK(t, p && p[0] == 0x11 && p[PG - 1] == 0x11);
	T_CHECK(t, xbzrle_cache__find(&c, 5) == NULL);     /* same slot, other page */
	memset(xbzrle_cache__claim(&c, 5), 0x55, PG);
	T_CHECK(t, xbzrle_cache__find(&c, 1) == NULL);     /* replaced */
	T_CHECK(t, xbzrle_cache__find(&c, 5)[7] == 0x55);
	xbzrle_cache__free(&c);
	T_CHECK_EQ(t, c.slots, 0);
}

/* A record of entries (offset, len, data) built by hand. */
struct builder {
	uint8_t buf[XBZRLE_RECORD_HEAD + 4 * (XBZRLE_ENTRY_HEAD + PG)];
	size_t len;
	uint32_t count;
};

static void b_add(struct builder *b, uint64_t off, const uint8_t *data, uint16_t len)
{
	uint8_t *e = b->buf + XBZRLE_RECORD_HEAD + b->len;
	proto__put_xbzrle_entry(e, off, len);
	if (len)
		memcpy(e + XBZRLE_ENTRY_HEAD, data, len);
	b->len += XBZRLE_ENTRY_HEAD + len;
	b->count++;
}

static ssize_t b_done(struct builder *b, uint32_t block)
{
	ssize_t h = proto__encode_xbzrle_head(b->buf, sizeof(b->buf), block, b->count, b->len);
	return h < 0 ? h : h + (ssize_t)b->len;
}

struct rx {
	struct proto_ram ram;
	uint8_t *mem, *snap;
	struct mig_recv r;
	int written;
};

static int rx_state(void *c, uint32_t id, uint32_t v, uint32_t i, const void *d, size_t n)
{
	(void)c; (void)id; (void)v; (void)i; (void)d; (void)n;
	return 0;
}
static void rx_written(void *c, uint32_t b, uint64_t o)
{
	(void)b; (void)o;
	((struct rx *)c)->written++;
}

static void rx__setup(struct rx *x)
{
	memset(x, 0, sizeof(*x));
	x->mem = malloc(NPAGES * PG);
	x->snap = malloc(NPAGES * PG);
	for (unsigned i = 0; i < NPAGES * PG; i++)
		x->mem[i] = (uint8_t)(i * 7 + i / PG);
	x->ram.nr_blocks = 1;
	x->ram.blocks[0] = (struct proto_ram_block){ 0, NPAGES * PG, x->mem };
	struct mig_recv_ops ops = { .on_state = rx_state, .on_page_written = rx_written, .ctx = x };
	uint8_t buf[256];
	struct proto_start st;
	proto_start__from_ram(&st, &x->ram);
	struct proto_hdr h;
	ssize_t n = proto__encode_start(buf, sizeof(buf), &st);
	if (mig_recv__init(&x->r, &x->ram, &ops) || n < 0 ||
	    proto__decode_header(buf, (size_t)n, &h) ||
	    mig_recv__feed_record(&x->r, &h, buf + PROTO_HDR_SIZE))
		abort();
	memcpy(x->snap, x->mem, NPAGES * PG);
}

static int rx__feed(struct rx *x, const uint8_t *rec, ssize_t n)
{
	struct proto_hdr h;
	if (n < (ssize_t)PROTO_HDR_SIZE || proto__decode_header(rec, (size_t)n, &h))
		return -999;
	return mig_recv__feed_record(&x->r, &h, rec + PROTO_HDR_SIZE);
}

static void rx__done(struct rx *x)
{
	mig_recv__free(&x->r);
	free(x->mem);
	free(x->snap);
}

static void t_receive(struct t *t)
{
	struct rx x;
	struct builder b = { .len = 0 };
	rx__setup(&x);
	uint8_t want1[PG], whole[PG], delta[PG];
	mutate(x.mem + PG, want1, 9);
	ssize_t d = xbzrle__encode(x.mem + PG, want1, delta, XBZRLE_MAX_DELTA);
	T_CHECK(t, d > 0);
	for (unsigned i = 0; i < PG; i++)
		whole[i] = (uint8_t)rnd();
	b_add(&b, 1 * PG, delta, (uint16_t)d);
	b_add(&b, 3 * PG, whole, PG);
	b_add(&b, 5 * PG, NULL, 0);
	T_CHECK_EQ(t, rx__feed(&x, b.buf, b_done(&b, 0)), 0);
	T_CHECK(t, !memcmp(x.mem + PG, want1, PG));
	T_CHECK(t, !memcmp(x.mem + 3 * PG, whole, PG));
	static const uint8_t zero[PG];
	T_CHECK(t, !memcmp(x.mem + 5 * PG, zero, PG));
	T_CHECK(t, !memcmp(x.mem, x.snap, PG) && !memcmp(x.mem + 7 * PG, x.snap + 7 * PG, PG));
	T_CHECK_EQ(t, x.written, 3);
	const struct mig_recv_stats *st = mig_recv__stats(&x.r);
	T_CHECK_EQ(t, st->xbzrle_pages, 1);
	T_CHECK_EQ(t, st->pages, 1);
	T_CHECK_EQ(t, st->zero_pages, 1);
	rx__done(&x);
}

/* A record that fails leaves RAM as it was, the receiver failed. */
static void rej(struct t *t, struct builder *b, uint32_t block, int err, const char *what)
{
	struct rx x;
	rx__setup(&x);
	int e = rx__feed(&x, b->buf, b_done(b, block));
	T_CHECK_EQ(t, e, err);
	T_CHECK(t, !memcmp(x.mem, x.snap, NPAGES * PG));
	T_CHECK_EQ(t, mig_recv__state(&x.r), MIG_RECV_FAILED);
	if (!strstr(mig_recv__error(&x.r), what)) {
		T_CHECK(t, !"message");
		printf("#   message '%s' lacks '%s'\n", mig_recv__error(&x.r), what);
	}
	rx__done(&x);
}

static void t_receive_rejects(struct t *t)
{
	static const uint8_t one[3] = { 0, 1, 0xaa }, bad[3] = { 0, 5, 0xaa };
	uint8_t whole[PG] = { 1 };
	struct builder b = { .len = 0 };
	/* a good entry first, then one past RAM: nothing is applied */
	b_add(&b, 0, one, 3);
	b_add(&b, NPAGES * PG, one, 3);
	rej(t, &b, 0, -EINVAL, "offset");
	b = (struct builder){ .len = 0 };
	b_add(&b, 0, whole, PG);
	b_add(&b, 100, one, 3);                     /* not page-aligned */
	rej(t, &b, 0, -EINVAL, "offset");
	b = (struct builder){ .len = 0 };
	b_add(&b, 0, one, 3);
	rej(t, &b, 1, -EINVAL, "block 1");           /* one block only */
	b = (struct builder){ .len = 0 };
	b_add(&b, 0, one, 3);
	b_add(&b, PG, bad, 3);                      /* a run past the delta */
	rej(t, &b, 0, -EPROTO, "XBZRLE delta");
	b = (struct builder){ .len = 0 };
	b_add(&b, 0, one, 3);
	b.count = 2;                                /* says two, holds one */
	rej(t, &b, 0, -EPROTO, "ends inside an entry");
	b = (struct builder){ .len = 0 };
	b_add(&b, 0, one, 3);
	b.len += 1;                                 /* a stray byte after it */
	rej(t, &b, 0, -EPROTO, "after its last entry");
	b = (struct builder){ .len = 0 };
	b_add(&b, 0, whole, PG);
	proto__put_xbzrle_entry(b.buf + XBZRLE_RECORD_HEAD, 0, PG + 1);  /* longer than left */
	rej(t, &b, 0, -EPROTO, "past the record's end");
	b = (struct builder){ .len = 0 };
	T_CHECK_EQ(t, b_done(&b, 0), -EINVAL);      /* no entries: not encoded */
	T_CHECK_EQ(t, proto__encode_xbzrle_head(b.buf, XBZRLE_RECORD_HEAD + 3, 0, 1, 4), -ENOSPC);
}

int main(void)
{
	struct t t = {0};
	T_RUN(&t, t_roundtrip);
	T_RUN(&t, t_sizes);
	T_RUN(&t, t_check_rejects);
	T_RUN(&t, t_cache);
	T_RUN(&t, t_receive);
	T_RUN(&t, t_receive_rejects);
	printf("%d passed, %d failed\n", t.passed, t.failed);
	return T_DONE(&t);
}
