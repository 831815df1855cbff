/* Workloads stress, idle and fill-free (verify is in verify.c). */
#include "guest.h"

#define CHUNK 4096		/* pages between two looks at the clock */

struct gib_stats {
	u64 sum, n, max;	/* completed GiBs in this report period, in cycles */
};

static void stress_report(int cpu, struct gib_stats *st, u64 inprogress)
{
	u64 avg = st->n ? st->sum / st->n : inprogress;
	u64 max = st->n ? st->max : inprogress;
	u64 a = avg * 100 / tsc_khz, m = max * 100 / tsc_khz;

	kprintf("stress cpu=%d t_ms=%lu ms_per_gib=%lu.%02lu max_ms_per_gib=%lu.%02lu\n",
		cpu, now_ms(), a / 100, a % 100, m / 100, m % 100);
	st->sum = st->n = st->max = 0;
}

void stress_run(int cpu)
{
	const struct share *s = &shares[cpu];
	const u64 period = cfg.report_ms * tsc_khz;
	struct gib_stats st = { 0, 0, 0 };
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
				if (t >= next_report) {
					stress_report(cpu, &st, t - gib_start);
					if (cpu == 0)
						balloon_poll();
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

/* Heartbeats from cpu 0; the other CPUs halt. */
void idle_run(int cpu)
{
	if (cpu != 0)
		halt_cpu();
	const u64 period = cfg.report_ms * tsc_khz;
	u64 prev = rdtsc(), next = prev + period;
	for (;;) {
		u64 t = rdtsc();
		if (t >= next) {
			kprintf("heartbeat t_ms=%lu gap_ms=%lu\n", cycles_to_ms(t - tsc0), cycles_to_ms(t - prev));
			prev = t;
			next += period;
			if (next <= t)
				next = t + period;
		}
		if (t >= exit_at)
			poll_exit(cpu);
		balloon_poll();
		cpu_relax();
	}
}

/* cpu 0 allocates mb MiB page by page from the allocator, fills each page
 * with non-zero bytes (its first word links to the previous page), frees
 * them all and then sends heartbeats. */
void fill_free_run(int cpu)
{
	if (cpu != 0)
		halt_cpu();
	palloc_init();
	u64 want = cfg.mb * PAGES_PER_MIB, got = 0, chain = 0;
	for (; got < want; got++) {
		u64 pg = palloc_alloc();
		if (!pg)
			break;
		u64 *w = (u64 *)pg;
		w[0] = chain;
		for (int i = 1; i < 512; i++)
			w[i] = 0xa5a5a5a5a5a5a5a5ULL ^ pg ^ (u64)i;
		if (!chain)
			w[0] = 0xa5a5a5a5a5a5a5a5ULL;	/* keep the page non-zero */
		chain = pg;
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
	idle_run(cpu);
}
