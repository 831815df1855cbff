/*
 * memcheck: kmig's memory workload for a Linux guest's userspace.
 *
 * Each thread owns an equal share of an anonymous mapping and rewrites its
 * pages over and over, one generation after another.  Every page certifies
 * itself: it holds its own index, its generation and a pattern derived from
 * both, so a page that a migration lost, duplicated or left stale is found
 * by reading the page alone.
 *
 *   memcheck [--mode verify|stress|fill-free] [--mib N] [--threads N]
 *            [--report-ms N] [--seconds N] [--corrupt PAGE]
 *
 *   verify     check each page before rewriting it (the default)
 *   stress     rewrite one word and the header of each page, no check
 *   fill-free  fill N MiB, check it, free it and exit (free memory that is
 *              not zero: what free page hinting is for; /init's
 *              kmig.then=wait keeps the guest up afterwards)
 *
 * Console lines (docs/guest.md, "Linux guest"), one per report interval:
 *   memcheck mode=M thr=T gen=G pages=P bad=B t_ms=MS max_step_ms=S back=K
 * gen is the lowest generation every thread has completed, bad the pages
 * found wrong so far (the first few are named on "memcheck BAD" lines),
 * max_step_ms the longest step of CLOCK_MONOTONIC between two readings
 * (one per 64 pages: a clock that jumps shows here), back the times it
 * went backwards.  With --seconds the run ends (verify: after a last
 * check of every page):
 *   memcheck done bad=B
 * and the exit status is 0 when no page was bad.  --corrupt PAGE flips a
 * word of thread 0's page PAGE once its first generation is written: the
 * negative control that shows a damaged page is found.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096u
#define WORDS (PAGE / 8u)
#define MAGIC 0x6b6d6967636b7067ull /* "kmigckpg" */
#define MAX_THREADS 64
#define MAX_NAMED_BAD 8

enum mode { MODE_VERIFY, MODE_STRESS, MODE_FILL_FREE };

struct run;

struct worker {
	pthread_t tid;
	struct run *run;
	uint64_t *base;		/* first word of this thread's share */
	size_t pages;
	unsigned index;
	_Atomic uint64_t gen;	/* generations completed */
	size_t cut;		/* pages of generation gen + 1 written when stopped */
	_Atomic uint64_t bad;
	_Atomic uint64_t max_step_ns;
	_Atomic uint64_t back;
	enum mode mode;
};

struct run {
	enum mode mode;
	size_t mib;
	unsigned threads;
	unsigned report_ms;
	unsigned seconds;
	_Atomic long corrupt;	/* page of thread 0 for its worker to damage, or -1 */
	_Atomic int stop;
	_Atomic unsigned named_bad;
	struct worker w[MAX_THREADS];
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The pattern's word i of page `page` in generation `gen` (splitmix64). */
static uint64_t pattern(uint64_t page, uint64_t gen, unsigned i)
{
	uint64_t z = page * 0x9e3779b97f4a7c15ull + gen * 0xbf58476d1ce4e5b9ull + i;

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Words 0..2: magic, page, generation; the rest the pattern. */
static void page__write(uint64_t *p, uint64_t page, uint64_t gen)
{
	p[0] = MAGIC;
	p[1] = page;
	p[2] = gen;
	for (unsigned i = 3; i < WORDS; i++)
		p[i] = pattern(page, gen, i);
}

/* Stress keeps the header and rewrites one word per generation. */
static void page__touch(uint64_t *p, uint64_t page, uint64_t gen)
{
	p[0] = MAGIC;
	p[1] = page;
	p[2] = gen;
	p[3 + gen % (WORDS - 3)] = pattern(page, gen, 0);
}

/* 0 when p is page `page` of generation `gen` (gen 0: never written, zero). */
static int page__check(const uint64_t *p, uint64_t page, uint64_t gen)
{
	if (gen == 0) {
		for (unsigned i = 0; i < WORDS; i++)
			if (p[i])
				return -1;
		return 0;
	}
	if (p[0] != MAGIC || p[1] != page || p[2] != gen)
		return -1;
	for (unsigned i = 3; i < WORDS; i++)
		if (p[i] != pattern(page, gen, i))
			return -1;
	return 0;
}

static void note_bad(struct run *r, struct worker *w, size_t i, uint64_t gen)
{
	const uint64_t *p = w->base + i * WORDS;

	atomic_fetch_add(&w->bad, 1);
	if (atomic_fetch_add(&r->named_bad, 1) < MAX_NAMED_BAD)
		printf("memcheck BAD thr=%u page=%zu want_gen=%llu magic=%llx page_word=%llu gen_word=%llu\n",
		       w->index, i, (unsigned long long)gen, (unsigned long long)p[0],
		       (unsigned long long)p[1], (unsigned long long)p[2]);
}

static void step_clock(struct worker *w, uint64_t *last)
{
	uint64_t t = now_ns();

	if (t < *last)
		atomic_fetch_add(&w->back, 1);
	else if (t - *last > atomic_load(&w->max_step_ns))
		atomic_store(&w->max_step_ns, t - *last);
	*last = t;
}

/* The negative control: thread 0 damages one page it has written, between
 * two of its own passes, so no rewrite of its own hides the damage. */
static void corrupt_once(struct run *r, struct worker *w)
{
	long page = atomic_load(&r->corrupt);

	if (w->index != 0 || page < 0 || atomic_load(&w->gen) < 1)
		return;
	atomic_store(&r->corrupt, -1);
	if ((size_t)page >= w->pages)
		return;
	w->base[(size_t)page * WORDS + 7] ^= 1;
	printf("memcheck corrupted thr=0 page=%ld\n", page);
}

static void *worker__main(void *arg)
{
	struct worker *w = arg;
	struct run *r = w->run;
	uint64_t last = now_ns();

	while (!atomic_load(&r->stop)) {
		uint64_t gen = atomic_load(&w->gen);
		size_t i;

		corrupt_once(r, w);
		for (i = 0; i < w->pages && !atomic_load(&r->stop); i++) {
			uint64_t *p = w->base + i * WORDS;
			uint64_t page = (uint64_t)w->index << 40 | i;

			if (w->mode == MODE_VERIFY) {
				if (page__check(p, page, gen))
					note_bad(r, w, i, gen);
				page__write(p, page, gen + 1);
			} else {
				page__touch(p, page, gen + 1);
			}
			if ((i & 63) == 0)
				step_clock(w, &last);
		}
		if (i == w->pages)
			atomic_store(&w->gen, gen + 1);
		else
			w->cut = i;
	}
	return NULL;
}

/* A last check of every page of every thread (verify mode). */
static void check_all(struct run *r)
{
	for (unsigned t = 0; t < r->threads; t++) {
		struct worker *w = &r->w[t];
		uint64_t gen = atomic_load(&w->gen);

		/* a generation cut short: pages before the cut hold gen + 1
		 * (joined: the worker's cut is visible here) */
		for (size_t i = 0; i < w->pages; i++) {
			uint64_t page = (uint64_t)t << 40 | i;
			uint64_t want = i < w->cut ? gen + 1 : gen;

			if (page__check(w->base + i * WORDS, page, want))
				note_bad(r, w, i, want);
		}
	}
}

static void report(struct run *r, uint64_t t0)
{
	uint64_t gen = UINT64_MAX, bad = 0, step = 0, back = 0;

	for (unsigned t = 0; t < r->threads; t++) {
		struct worker *w = &r->w[t];
		uint64_t g = atomic_load(&w->gen), s = atomic_load(&w->max_step_ns);

		gen = g < gen ? g : gen;
		bad += atomic_load(&w->bad);
		back += atomic_load(&w->back);
		step = s > step ? s : step;
	}
	printf("memcheck mode=%s thr=%u gen=%llu pages=%zu bad=%llu t_ms=%llu max_step_ms=%llu back=%llu\n",
	       r->mode == MODE_VERIFY ? "verify" : r->mode == MODE_STRESS ? "stress" : "fill-free",
	       r->threads, (unsigned long long)gen, r->w[0].pages * r->threads,
	       (unsigned long long)bad, (unsigned long long)((now_ns() - t0) / 1000000),
	       (unsigned long long)(step / 1000000), (unsigned long long)back);
	fflush(stdout);
}

static uint64_t total_bad(struct run *r)
{
	uint64_t bad = 0;

	for (unsigned t = 0; t < r->threads; t++)
		bad += atomic_load(&r->w[t].bad);
	return bad;
}

/* Fills mib MiB with generation-1 pages, checks them and gives them back. */
static int fill_free(struct run *r)
{
	size_t pages = r->mib * 256;
	uint64_t *m = mmap(NULL, pages * PAGE, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	size_t bad = 0;

	if (m == MAP_FAILED) {
		printf("memcheck error: mmap %zu MiB: %s\n", r->mib, strerror(errno));
		return 1;
	}
	for (size_t i = 0; i < pages; i++)
		page__write(m + i * WORDS, i, 1);
	for (size_t i = 0; i < pages; i++)
		bad += page__check(m + i * WORDS, i, 1) != 0;
	munmap(m, pages * PAGE);
	printf("memcheck filled-and-freed mib=%zu bad=%zu\n", r->mib, bad);
	fflush(stdout);
	return bad != 0;
}

static int parse_args(struct run *r, int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		char *end = NULL;
		unsigned long n = v ? strtoul(v, &end, 10) : 0;

		if (!strcmp(a, "--mode") && v) {
			if (!strcmp(v, "verify"))
				r->mode = MODE_VERIFY;
			else if (!strcmp(v, "stress"))
				r->mode = MODE_STRESS;
			else if (!strcmp(v, "fill-free"))
				r->mode = MODE_FILL_FREE;
			else
				return -EINVAL;
		} else if (v && end && *end == '\0' && end != v) {
			if (!strcmp(a, "--mib") && n > 0 && n <= (1ul << 20))
				r->mib = n;
			else if (!strcmp(a, "--threads") && n > 0 && n <= MAX_THREADS)
				r->threads = (unsigned)n;
			else if (!strcmp(a, "--report-ms") && n > 0 && n <= 60000)
				r->report_ms = (unsigned)n;
			else if (!strcmp(a, "--seconds") && n <= 86400)
				r->seconds = (unsigned)n;
			else if (!strcmp(a, "--corrupt") && n < (1ul << 28))
				r->corrupt = (long)n;
			else
				return -EINVAL;
		} else {
			return -EINVAL;
		}
		i++;
	}
	return 0;
}

static int start_workers(struct run *r)
{
	size_t per = r->mib * 256 / r->threads;
	uint64_t *m = mmap(NULL, per * r->threads * PAGE, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);

	if (m == MAP_FAILED || per == 0) {
		printf("memcheck error: mmap %zu MiB: %s\n", r->mib, strerror(errno));
		return -ENOMEM;
	}
	for (unsigned t = 0; t < r->threads; t++) {
		struct worker *w = &r->w[t];

		w->base = m + (size_t)t * per * WORDS;
		w->pages = per;
		w->index = t;
		w->run = r;
		w->mode = r->mode;
		if (pthread_create(&w->tid, NULL, worker__main, w)) {
			printf("memcheck error: pthread_create\n");
			return -EAGAIN;
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	static struct run r = { .mode = MODE_VERIFY, .mib = 64, .threads = 1, .report_ms = 500,
				.corrupt = -1 };
	uint64_t t0 = now_ns();

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (parse_args(&r, argc, argv)) {
		fprintf(stderr, "usage: memcheck [--mode verify|stress|fill-free] [--mib N] "
				"[--threads N] [--report-ms N] [--seconds N] [--corrupt PAGE]\n");
		return 2;
	}
	if (r.mode == MODE_FILL_FREE)
		return fill_free(&r);
	if (start_workers(&r))
		return 1;
	printf("memcheck running mode=%s mib=%zu threads=%u\n",
	       r.mode == MODE_VERIFY ? "verify" : "stress", r.mib, r.threads);
	while (!r.seconds || now_ns() - t0 < (uint64_t)r.seconds * 1000000000ull) {
		usleep(r.report_ms * 1000u);
		report(&r, t0);
	}
	atomic_store(&r.stop, 1);
	for (unsigned t = 0; t < r.threads; t++)
		pthread_join(r.w[t].tid, NULL);
	if (r.mode == MODE_VERIFY)
		check_all(&r);
	report(&r, t0);
	printf("memcheck done bad=%llu\n", (unsigned long long)total_bad(&r));
	return total_bad(&r) != 0;
}
