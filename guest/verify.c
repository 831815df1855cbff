/*
 * Workload verify: pages whose content can be checked at any moment, from
 * inside (against an expectation table) and from outside (each 8-byte word
 * certifies itself).  Word j of the page at guest-physical address A,
 * written in generation g (1 .. 2^24-1), is
 *     (g << 40) | (mix64(A ^ (j << 3) ^ (g * 0x9e3779b97f4a7c15)) & (2^40 - 1))
 * with mix64 the splitmix64 finalizer; generation 0 means never written
 * (the word is 0).  Words are written in ascending j.  See docs/guest.md.
 */
#include "guest.h"

#define GEN_MAX 0xffffffu
#define LOW40 0xffffffffffULL
#define MAX_BAD_PER_ROUND 8

static inline u64 mix64(u64 z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static inline u64 word_value(u64 addr, u64 j, u64 g)
{
	if (!g)
		return 0;
	return (g << 40) | (mix64(addr ^ (j << 3) ^ (g * 0x9e3779b97f4a7c15ULL)) & LOW40);
}

static void write_page(u64 addr, u64 g)
{
	volatile u64 *w = (volatile u64 *)addr;
	for (u64 j = 0; j < 512; j++)
		w[j] = word_value(addr, j, g);
}

/* Returns the first bad word index or -1. */
static int check_page(u64 addr, u64 g, u64 *got, u64 *want)
{
	const volatile u64 *w = (const volatile u64 *)addr;
	for (u64 j = 0; j < 512; j++) {
		u64 v = w[j], e = word_value(addr, j, g);
		if (v != e) {
			*got = v;
			*want = e;
			return (int)j;
		}
	}
	return -1;
}

int verify_prepare(void)
{
	for (u64 i = 0; i < ncpus; i++) {
		struct share *s = &shares[i];
		u64 pages = (s->npages * 4 + PAGE_SIZE - 1) / PAGE_SIZE;
		s->gen = take_contig(pages ? pages : 1);
		if (!s->gen)
			return -1;
		memset(s->gen, 0, pages * PAGE_SIZE);
	}
	return 0;
}

/* Every 64 pages: the largest time between two such points since the
 * last report (what the guest saw of a pause, e.g. a migration's
 * switchover), the largest step back of this CPU's TSC (never, on a
 * correct VMM), the balloon driver on cpu 0 (every BALLOON_POLL_MS, so it
 * answers a free page hint request while a long round runs), the network
 * driver on cpu 0 (every point), and the exit check. */
#define BALLOON_POLL_MS 10
struct progress {
	u64 last, max_gap, max_back, next_poll;
};

static void progress_point(int cpu, struct progress *pr)
{
	u64 t = rdtsc();
	if (t < pr->last) {
		if (pr->last - t > pr->max_back)
			pr->max_back = pr->last - t;
	} else if (t - pr->last > pr->max_gap) {
		pr->max_gap = t - pr->last;
	}
	pr->last = t;
	if (cpu == 0)
		drivers_poll();		/* reads memory only unless there is work */
	if (cpu == 0 && t >= pr->next_poll) {
		balloon_poll();
		pr->next_poll = t + BALLOON_POLL_MS * tsc_khz;
	}
	if (g_stop || t >= exit_at)
		poll_exit(cpu);
}

void verify_run(int cpu)
{
	struct share *s = &shares[cpu];
	const u64 period = cfg.report_ms * tsc_khz;
	u64 next_report = rdtsc() + period, checked = 0;
	struct progress pr = { rdtsc(), 0, 0, 0 };

	if (!s->npages)
		halt_cpu();
	for (u64 round = 1;; round++) {
		/* rewrite pages i with (i + round) % 3 != 0, each checked first:
		 * a page that went wrong is reported before it is overwritten */
		u64 i = 0;
		int bad = 0;
		for (int k = 0; k < s->nseg; k++) {
			for (u64 p = 0; p < s->seg[k].npages; p++, i++) {
				if ((i + round) % 3 == 0)
					continue;
				u64 a = s->seg[k].base + p * PAGE_SIZE, got, want;
				int j = cfg.verify_precheck ? check_page(a, s->gen[i], &got, &want) : -1;
				if (j >= 0 && bad++ < MAX_BAD_PER_ROUND)
					kprintf("verify BAD page=0x%lx cpu=%d round=%lu word=%d got=0x%lx want=0x%lx\n",
						a, cpu, round, j, got, want);
				u64 g = s->gen[i] >= GEN_MAX ? 1 : s->gen[i] + 1;
				write_page(a, g);
				s->gen[i] = (u32)g;
				if ((i & 63) == 0)
					progress_point(cpu, &pr);
			}
		}
		if (cpu == 0 && round == cfg.corrupt_round) {
			u64 a = s->seg[0].base;
			kprintf("verify corrupt page=0x%lx cpu=%d round=%lu\n", a, cpu, round);
			((volatile u8 *)a)[7 * 8 + 3] ^= 0x5a;
		}
		/* re-read every page against the expectation */
		i = 0;
		for (int k = 0; k < s->nseg; k++) {
			for (u64 p = 0; p < s->seg[k].npages; p++, i++) {
				u64 a = s->seg[k].base + p * PAGE_SIZE, got, want;
				int j = check_page(a, s->gen[i], &got, &want);
				if (j >= 0 && bad++ < MAX_BAD_PER_ROUND)
					kprintf("verify BAD page=0x%lx cpu=%d round=%lu word=%d got=0x%lx want=0x%lx\n",
						a, cpu, round, j, got, want);
				if ((i & 63) == 0)
					progress_point(cpu, &pr);
			}
		}
		checked += s->npages;
		u64 t = rdtsc();
		if (!bad && t >= next_report) {
			kprintf("verify ok round=%lu cpu=%d pages=%lu max_gap_ms=%lu tsc_back_us=%lu\n",
				round, cpu, checked, cycles_to_ms(pr.max_gap),
				pr.max_back * 1000 / tsc_khz);
			if (cpu == 0)
				net_report();
			pr.max_gap = pr.max_back = 0;
			checked = 0;
			next_report += period;
			if (next_report <= t)
				next_report = t + period;
		}
		if (bad > MAX_BAD_PER_ROUND)
			kprintf("verify bad_pages=%d cpu=%d round=%lu (first %d shown)\n",
				bad, cpu, round, MAX_BAD_PER_ROUND);
		poll_exit(cpu);
	}
}
