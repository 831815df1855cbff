/* Workloads stress, idle and fill-free (verify is in verify.c). */
#include "guest.h"

static int refill_on;		/* fill-free with refill_ms: idle_run refills */
static u64 refill_sweep;	/* pages over which the refills' position moves */
static void refill_step(u64 g);

#define CHUNK 64		/* pages between two looks at the clock: 256 KiB, so a
				 * heavily throttled vCPU still reports on time */

struct gib_stats {
	u64 sum, n, max;	/* completed GiBs in this report period, in cycles */
	u64 total;		/* pages written since the start: the work done, so a
				 * reader can tell how much time the guest lost */
};

static void stress_report(int cpu, struct gib_stats *st, u64 inprogress)
{
	u64 avg = st->n ? st->sum / st->n : inprogress;
	u64 max = st->n ? st->max : inprogress;
	u64 a = avg * 100 / tsc_khz, m = max * 100 / tsc_khz;

	kprintf("stress cpu=%d t_ms=%lu ms_per_gib=%lu.%02lu max_ms_per_gib=%lu.%02lu pages=%lu\n",
		cpu, now_ms(), a / 100, a % 100, m / 100, m % 100, st->total);
	st->sum = st->n = st->max = 0;
}

void stress_run(int cpu)
{
	const struct share *s = &shares[cpu];
	const u64 period = cfg.report_ms * tsc_khz;
	struct gib_stats st = { 0, 0, 0, 0 };
	u8 val = 1;
	u64 pages = 0, gib_start = rdtsc(), next_report = gib_start + period;

	if (!s->npages)
		halt_cpu();
	for (;;) {
		for (int k = 0; k < s->nseg; k++) {
			for (u64 off = 0; off < s->seg[k].npages; off += CHUNK) {
				u64 n = s->seg[k].npages - off;
				if (n > CHUNK)
					n = CHUNK;
				volatile u8 *p = (volatile u8 *)(s->seg[k].base + off * PAGE_SIZE);
				for (u64 i = 0; i < n; i++)
					p[i * PAGE_SIZE] = val;
				pages += n;
				st.total += n;
				u64 t = rdtsc();
				if (pages >= PAGES_PER_GIB) {
					u64 c = (t - gib_start) * PAGES_PER_GIB / pages;
					st.sum += c;
					st.n++;
					if (c > st.max)
						st.max = c;
					pages = 0;
					gib_start = t;
				}
				if (cpu == 0)
					drivers_poll();	/* every 256 KiB of writes */
				if (t >= next_report) {
					stress_report(cpu, &st, t - gib_start);
					if (cpu == 0) {
						net_report();
						balloon_poll();
					}
					next_report += period;
					if (next_report <= t)
						next_report = t + period;
				}
				if (g_stop || t >= exit_at)
					poll_exit(cpu);
			}
		}
		val = (u8)(val == 255 ? 1 : val + 1);
	}
}

/* touch=N, on cpu 0 before its workload: a byte written to every free
 * page, so the host maps all of the guest's memory (with huge pages where
 * it can).  touch=1 writes a zero: the pages stay zero (a migration sends
 * them as zero pages); touch=2 writes a one: they hold data, as memory in
 * use does, and must be sent.  The pages stay free.  At most the first 64
 * extents of the allocator (it rarely has more than a few). */
void touch_free(void)
{
	static struct range ext[64];
	const u8 val = cfg.touch >= 2;
	u64 t0 = rdtsc(), pages = 0;

	palloc_init();
	int total = palloc_extents(ext, 64);
	for (int i = 0; i < total && i < 64; i++)
		for (u64 a = ext[i].base; a < ext[i].end; a += PAGE_SIZE, pages++)
			*(volatile u8 *)a = val;
	kprintf("touch done pages=%lu extents=%d ms=%lu\n", pages, total,
		cycles_to_ms(rdtsc() - t0));
}

/* Heartbeats from cpu 0; the other CPUs halt. */
void idle_run(int cpu)
{
	if (cpu != 0)
		halt_cpu();
	const u64 period = cfg.report_ms * tsc_khz;
	const u64 rperiod = cfg.refill_ms * tsc_khz;
	u64 prev = rdtsc(), next = prev + period, next_refill = prev + rperiod, gen = 0;
	for (;;) {
		u64 t = rdtsc();
		if (refill_on && t >= next_refill) {
			gen = gen >= 0xffffffffULL ? 1 : gen + 1;
			refill_step(gen);
			t = rdtsc();
			next_refill += rperiod;
			if (next_refill <= t)
				next_refill = t + rperiod;
		}
		if (t >= next) {
			kprintf("heartbeat t_ms=%lu gap_ms=%lu\n", cycles_to_ms(t - tsc0), cycles_to_ms(t - prev));
			net_report();
			prev = t;
			next += period;
			if (next <= t)
				next = t + period;
		}
		if (t >= exit_at)
			poll_exit(cpu);
		balloon_poll();
		drivers_poll();
		cpu_relax();
	}
}

/* The fill: a pattern a compressor shrinks many times over, or with
 * fill_random words no compressor shrinks (a 64-bit mix of page and word:
 * still checkable, as the pattern is) */
static inline u64 fill_word(u64 pg, u64 i)
{
	if (!cfg.fill_random)
		return 0xa5a5a5a5a5a5a5a5ULL ^ pg ^ i;
	u64 z = (pg << 9 | i) + 0x9e3779b97f4a7c15ULL;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return (z ^ (z >> 31)) | 1;	/* never zero: a zero page is not sent */
}

/* Words 1..511 of a page fill-free filled (word 0 links the chain). */
int fill_free_intact(u64 pg, u64 *word, u64 *got)
{
	const volatile u64 *w = (const volatile u64 *)pg;
	for (u64 i = 1; i < 512; i++) {
		if (w[i] != fill_word(pg, i)) {
			*word = i;
			*got = w[i];
			return 0;
		}
	}
	return 1;
}

/* cpu 0 allocates mb MiB (with fill_check: all free memory) page by page
 * from the allocator, fills each page with non-zero bytes (its first word
 * links to the previous page), frees them all and then sends heartbeats. */
void fill_free_run(int cpu)
{
	if (cpu != 0)
		halt_cpu();
	palloc_init();
	/* fill_check needs every free page filled */
	u64 want = cfg.fill_check ? ~0ULL : cfg.mb * PAGES_PER_MIB, got = 0, chain = 0;
	for (; got < want; got++) {
		u64 pg = palloc_alloc();
		if (!pg)
			break;
		u64 *w = (u64 *)pg;
		w[0] = chain;
		for (int i = 1; i < 512; i++)
			w[i] = fill_word(pg, (u64)i);
		if (!chain)
			w[0] = 0xa5a5a5a5a5a5a5a5ULL;	/* keep the page non-zero */
		chain = pg;
		if ((got & 63) == 0)
			drivers_poll();
		if ((got & 4095) == 0)
			poll_exit(cpu);
	}
	while (chain) {
		u64 prev = *(u64 *)chain;
		palloc_free(chain);
		chain = prev == 0xa5a5a5a5a5a5a5a5ULL ? 0 : prev;
	}
	struct range ext[4];
	int n = palloc_extents(ext, 4);
	kprintf("fill-free done mb=%lu free_pages=%lu extents=%d\n", got / PAGES_PER_MIB,
		palloc_free_pages(), n);
	refill_on = cfg.refill_ms && cfg.refill_mb;
	u64 held = (cfg.refill_keep + 1) * cfg.refill_mb * PAGES_PER_MIB;
	refill_sweep = palloc_free_pages() > held ? palloc_free_pages() - held : 0;
	idle_run(cpu);
}

/*
 * fill-free's refills (refill_ms=N): every N ms generation g takes
 * refill_mb MiB from the allocator and writes every 8-byte word at
 * guest-physical address a as a ^ key(g); then every generation still
 * held (the last refill_keep ones before g) is re-read word by word, and
 * the oldest, g - refill_keep, is reported and freed.  The allocator hands
 * out its lowest free memory, so each generation first takes (and gives
 * back afterwards, unwritten) a spacer of (g mod (S / refill_mb + 1)) *
 * refill_mb, S = the free memory after fill-free minus refill_keep + 1
 * generations (less if less is free now): the generations sweep all free memory, and after a
 * migration's free page hints they reuse memory the balloon driver hinted
 * and got back.  A hinted page that a migration failed to resend after the
 * guest reused it shows up on the destination as "refill BAD".
 */
#define REFILL_RANGES 512
#define REFILL_KEEP_MAX 8
#define REFILL_MAX_BAD 8

struct refill_gen {
	u64 g;			/* 0: nothing held */
	u64 pages, hinted, bad;
	int n;
	struct range r[REFILL_RANGES];
};
static struct refill_gen rgen[REFILL_KEEP_MAX + 1];
static struct range spacer[REFILL_RANGES];

static inline u64 refill_key(u64 g)
{
	u64 z = g * 0x9e3779b97f4a7c15ULL;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return (z ^ (z >> 31)) | (1ULL << 63);	/* never 0: a zero page is always bad */
}

static void refill_write(u64 base, u64 end, u64 key, u64 skip)
{
	for (u64 a = base; a < end; a += PAGE_SIZE) {
		if (a == skip)
			continue;
		u64 *w = (u64 *)a;
		for (u64 j = 0; j < 512; j++)
			w[j] = (a + 8 * j) ^ key;
		if (((a - base) & ((4ULL << 20) - 1)) == 0)
			balloon_poll();
		if (((a - base) & ((256ULL << 10) - 1)) == 0)
			drivers_poll();
	}
}

/* Re-reads every word of generation o's pages; counts bad and hinted pages. */
static void refill_check(struct refill_gen *o)
{
	const u64 key = refill_key(o->g);
	o->hinted = 0;
	for (int k = 0; k < o->n; k++) {
		for (u64 a = o->r[k].base; a < o->r[k].end; a += PAGE_SIZE) {
			const volatile u64 *w = (const volatile u64 *)a;
			if (palloc_was_hinted(a))
				o->hinted++;
			for (u64 j = 0; j < 512; j++) {
				u64 v = w[j], e = (a + 8 * j) ^ key;
				if (v == e)
					continue;
				if (o->bad++ < REFILL_MAX_BAD)
					kprintf("refill BAD page=0x%lx gen=%lu word=%lu got=0x%lx want=0x%lx hinted=%d\n",
						a, o->g, j, v, e, palloc_was_hinted(a));
				break;
			}
			if (((a - o->r[k].base) & ((4ULL << 20) - 1)) == 0)
				balloon_poll();
			if (((a - o->r[k].base) & ((256ULL << 10) - 1)) == 0)
				drivers_poll();
		}
	}
}

static void refill_step(u64 g)
{
	const u64 keep = cfg.refill_keep < 1 ? 1 : cfg.refill_keep > REFILL_KEEP_MAX ?
			 REFILL_KEEP_MAX : cfg.refill_keep;
	struct refill_gen *cur = &rgen[g % (keep + 1)];
	const u64 want = cfg.refill_mb * PAGES_PER_MIB, key = refill_key(g);

	/* the spacer */
	u64 space = (g % (refill_sweep / want + 1)) * want, nfree = palloc_free_pages();
	if (space + want > nfree)	/* e.g. while the balloon driver holds memory */
		space = nfree > want ? nfree - want : 0;
	int nsp = 0;
	while (space && nsp < REFILL_RANGES) {
		u64 len, b = palloc_alloc_block(space * PAGE_SIZE, &len);
		if (!b)
			break;
		spacer[nsp].base = b;
		spacer[nsp++].end = b + len;
		space -= len / PAGE_SIZE;
	}

	/* a new generation in fresh allocations (its slot was freed last step) */
	cur->g = g;
	cur->pages = cur->bad = 0;
	cur->n = 0;
	while (cur->pages < want && cur->n < REFILL_RANGES) {
		u64 len, b = palloc_alloc_block((want - cur->pages) * PAGE_SIZE, &len);
		if (!b)
			break;		/* empty (e.g. the balloon driver holds all for hints) */
		u64 skip = 0;
		if (g == cfg.corrupt_refill && cur->n == 0) {
			skip = b + ((len / 2) & ~(PAGE_SIZE - 1));
			kprintf("refill corrupt page=0x%lx gen=%lu\n", skip, g);
		}
		cur->r[cur->n].base = b;
		cur->r[cur->n].end = b + len;
		cur->n++;
		cur->pages += len / PAGE_SIZE;
		refill_write(b, b + len, key, skip);
	}
	__asm__ volatile("" ::: "memory");
	while (nsp--)
		palloc_free_range(spacer[nsp].base, spacer[nsp].end - spacer[nsp].base);

	/* every older generation still held must be intact */
	u64 checked = 0;
	for (u64 i = 1; i <= keep && i < g; i++) {
		struct refill_gen *o = &rgen[(g - i) % (keep + 1)];
		if (o->g != g - i)
			continue;
		refill_check(o);
		checked += o->pages;
	}
	if (g <= keep)
		return;
	/* the oldest one is done */
	struct refill_gen *o = &rgen[(g - keep) % (keep + 1)];
	if (o->g != g - keep)
		return;
	if (o->bad)
		kprintf("refill bad_pages=%lu gen=%lu pages=%lu\n", o->bad, o->g, o->pages);
	else
		kprintf("refill ok gen=%lu mb=%lu hinted_mb=%lu checked_mb=%lu wrote_gen=%lu wrote_mb=%lu t_ms=%lu\n",
			o->g, o->pages / PAGES_PER_MIB, o->hinted / PAGES_PER_MIB,
			checked / PAGES_PER_MIB, g, cur->pages / PAGES_PER_MIB, now_ms());
	for (int k = 0; k < o->n; k++)
		palloc_free_range(o->r[k].base, o->r[k].end - o->r[k].base);
	o->g = 0;
	o->n = 0;
	o->pages = 0;
}
