/* The source's xbzrle path (send_xbzrle.c) against the receiver, over a
 * real socketpair: round after round of writes to a small RAM (bytes
 * changed here and there, pages rewritten whole, zeroed, left alone),
 * every page sent each round through sender__xbzrle_page with a cache of
 * fewer slots than pages (so copies are evicted and come back as misses);
 * after each round the destination's RAM must equal the source's. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "mig/recv/recv.h"
#include "mig/send/send_impl.h"

#define PG PROTO_PAGE_SIZE
#define NPAGES 24
#define ROUNDS 40

static unsigned long long rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void)
{
	return t_xorshift(&rng);
}

static int no_state(void *c, uint32_t id, uint32_t v, uint32_t i, const void *d, size_t n)
{
	(void)c; (void)id; (void)v; (void)i; (void)d; (void)n;
	return 0;
}

/* One round of the guest's writes to page p of mem. */
static void scribble(uint8_t *p)
{
	switch (rnd() % 6) {
	case 0:         /* a counter, xbzrle's best case */
		p[rnd() % 8]++;
		break;
	case 1:         /* a few scattered bytes */
		for (int i = 0; i < 5; i++)
			p[rnd() % PG] = (uint8_t)rnd();
		break;
	case 2:         /* rewritten whole: the delta overflows */
		for (unsigned i = 0; i < PG; i++)
			p[i] = (uint8_t)rnd();
		break;
	case 3:         /* zeroed */
		memset(p, 0, PG);
		break;
	case 4:         /* a run in the middle */
		memset(p + 1000 + rnd() % 1000, (int)(rnd() | 1), 300);
		break;
	default:        /* left alone */
		break;
	}
}

struct fixture {
	struct sender s;
	struct migration m;         /* its lock and parameters (resize) */
	struct ram ram;             /* its page count */
	struct mig_stream out, in;
	struct mig_recv r;
	struct proto_ram dram;
	uint8_t *src, *dst;
};

static int fixture__init(struct fixture *f, uint64_t cache_bytes)
{
	int sv[2];
	memset(f, 0, sizeof(*f));
	f->src = calloc(NPAGES, PG);
	f->dst = calloc(NPAGES, PG);
	if (!f->src || !f->dst || socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		return -1;
	int big = 4 << 20;
	setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	if (mig_stream__init(&f->out, sv[0]) || mig_stream__init(&f->in, sv[1]))
		return -1;
	f->dram.nr_blocks = 1;
	f->dram.blocks[0] = (struct proto_ram_block){ 0, NPAGES * PG, f->dst };
	struct mig_recv_ops ops = { .on_state = no_state };
	if (mig_recv__init(&f->r, &f->dram, &ops))
		return -1;
	struct proto_start st;
	proto_start__from_ram(&st, &f->dram);
	uint8_t buf[256];
	ssize_t n = proto__encode_start(buf, sizeof(buf), &st);
	if (n < 0 || mig_stream__write(&f->out, buf, (size_t)n) || mig_stream__flush(&f->out) ||
	    mig_recv__step(&f->r, &f->in))
		return -1;
	struct sender *s = &f->s;
	pthread_mutex_init(&f->m.lock, NULL);
	f->m.params.xbzrle_cache_size = cache_bytes;
	f->ram.npages = NPAGES;
	s->m = &f->m;
	s->ram = &f->ram;
	s->xb.cache_size = cache_bytes;
	s->stream = &f->out;
	s->zero_detect = true;
	s->bulk_done = true;
	s->xb.snap = malloc(PG);
	s->xb.rec = malloc(PROTO_HDR_SIZE + 8 + (size_t)SENDER_BATCH_PAGES * (10 + PG));
	if (!s->xb.snap || !s->xb.rec || xbzrle_cache__init(&s->xb.cache, cache_bytes, NPAGES))
		return -1;
	s->xb.on = true;
	return 0;
}

static void fixture__free(struct fixture *f)
{
	sender__xbzrle_free(&f->s);
	mig_recv__free(&f->r);
	mig_stream__close(&f->out);
	mig_stream__close(&f->in);
	free(f->src);
	free(f->dst);
}

/* Every page out, a SYNC after them, and the destination reads up to it. */
static int round_trip(struct fixture *f, uint64_t k)
{
	for (uint64_t p = 0; p < NPAGES; p++)
		if (sender__xbzrle_page(&f->s, 0, p * PG, p, f->src + p * PG))
			return -1;
	uint8_t buf[32];
	ssize_t n = proto__encode_sync(buf, sizeof(buf), k + 1);
	if (sender__xbzrle_flush(&f->s) || n < 0 || mig_stream__write(&f->out, buf, (size_t)n) ||
	    mig_stream__flush(&f->out))
		return -1;
	while (mig_recv__stats(&f->r)->syncs < k + 1)
		if (mig_recv__step(&f->r, &f->in))
			return -1;
	return 0;
}

/* resize_at: the round before which xbzrle-cache-size becomes resize_to
 * (sender__xbzrle_resize, as a pass starts); -1: never. */
static void run(struct t *t, uint64_t cache_bytes, int resize_at, uint64_t resize_to)
{
	struct fixture f;
	if (fixture__init(&f, cache_bytes)) {
		T_CHECK(t, !"fixture");
		return;
	}
	/* the first round as the bulk pass leaves it: the destination holds
	 * every page, the cache none (it starts empty after the bulk pass) */
	for (unsigned i = 0; i < NPAGES * PG; i++)
		f.src[i] = (uint8_t)(i / 7);
	memcpy(f.dst, f.src, NPAGES * PG);
	for (int k = 0; k < ROUNDS; k++) {
		if (k == resize_at) {
			uint64_t misses = f.s.xb.misses;
			f.m.params.xbzrle_cache_size = resize_to;
			sender__xbzrle_resize(&f.s);
			uint64_t slots = resize_to / PG < 32 ? resize_to / PG : 32;
			T_CHECK_EQ(t, f.s.xb.cache.slots, slots);  /* as RAM needs, at most */
			T_CHECK_EQ(t, f.s.xb.cache_size, resize_to);
			sender__xbzrle_resize(&f.s);        /* unchanged: kept */
			T_CHECK_EQ(t, f.s.xb.cache.slots, slots);
			if (round_trip(&f, (uint64_t)k)) {
				T_CHECK(t, !"round trip");
				break;
			}
			/* emptied: every page not zero went whole (a miss) */
			T_CHECK(t, f.s.xb.misses > misses);
			T_CHECK(t, !memcmp(f.src, f.dst, NPAGES * PG));
			continue;
		}
		if (round_trip(&f, (uint64_t)k)) {
			T_CHECK(t, !"round trip");
			printf("#   round %d: %s\n", k, mig_recv__error(&f.r));
			break;
		}
		if (memcmp(f.src, f.dst, NPAGES * PG)) {
			T_CHECK(t, !"destination differs");
			printf("#   round %d\n", k);
			break;
		}
		for (uint64_t p = 0; p < NPAGES; p++)
			scribble(f.src + p * PG);
	}
	const struct sender_xbzrle *x = &f.s.xb;
	printf("#   cache %llu slots: %llu deltas, %llu misses, %llu overflows, %llu unchanged\n",
	       (unsigned long long)x->cache.slots, (unsigned long long)x->pages,
	       (unsigned long long)x->misses, (unsigned long long)x->overflows,
	       (unsigned long long)x->unchanged);
	T_CHECK(t, x->pages > 0 && x->misses > 0 && x->overflows > 0 && x->unchanged > 0);
	T_CHECK(t, f.s.zero_pages > 0);
	T_CHECK_EQ(t, mig_recv__stats(&f.r)->xbzrle_pages, x->pages);
	fixture__free(&f);
	pthread_mutex_destroy(&f.m.lock);
}

static void t_small_cache(struct t *t)
{
	run(t, 8 * PG, -1, 0);  /* 8 slots for 24 pages: evictions every round */
}

static void t_whole_cache(struct t *t)
{
	run(t, 64 << 20, -1, 0); /* capped at 32 slots: every page keeps its copy */
}

/* xbzrle-cache-size changed mid-migration: the next pass starts from an
 * empty cache of the new size, and the destination stays exact. */
static void t_resize(struct t *t)
{
	run(t, 64 << 20, 10, 16 * PG);
	run(t, 8 * PG, 10, 64 << 20);
}

int main(void)
{
	struct t t = {0};
	T_RUN(&t, t_small_cache);
	T_RUN(&t, t_whole_cache);
	T_RUN(&t, t_resize);
	printf("%d passed, %d failed\n", t.passed, t.failed);
	return T_DONE(&t);
}
