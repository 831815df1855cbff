/* Dirty-rate estimators and unit conversions. */
#include <errno.h>
#include <stdint.h>

#include "harness.h"
#include "mem/dirtyrate.h"

static void t_init_errors(struct t *t)
{
	struct dirtyrate e;

	T_CHECK_EQ(t, dirtyrate__init(&e, 0, 1000, 0), -EINVAL);
	T_CHECK_EQ(t, dirtyrate__init(&e, 2, 0, 0), -EINVAL);
	T_CHECK_EQ(t, dirtyrate__init(&e, 2, 1000, 0), 0);
	T_CHECK_EQ(t, dirtyrate__add(&e, 2, 1), -EINVAL);
	T_CHECK_EQ(t, dirtyrate__add(&e, 1, 1), 0);
	T_CHECK_EQ(t, dirtyrate__vcpu_rate(&e, 2), 0);
	T_CHECK_EQ(t, dirtyrate__rate(&e), 0);
	dirtyrate__free(&e);
	dirtyrate__free(&e);   /* twice is harmless */
}

/* One period per row: pages added for vCPU 0 and 1, the tick time, and the
 * expected rates after it (per vCPU, total, peak). */
static void t_period_table(struct t *t)
{
	static const struct {
		uint64_t add0, add1, now;
		int closed;
		uint64_t r0, r1, total, peak;
	} rows[] = {
		{ 1000, 0, 500, 0, 0, 0, 0, 0 },            /* too early */
		{ 0, 0, 999, 0, 0, 0, 0, 0 },
		{ 0, 2000, 1000, 1, 1000, 2000, 3000, 3000 }, /* 1000 + 2000 in 1 s */
		{ 500, 500, 2000, 1, 500, 500, 1000, 3000 },
		{ 0, 0, 3000, 1, 0, 0, 0, 3000 },
		{ 9000, 0, 6000, 1, 3000, 0, 3000, 3000 },   /* late tick: 3 s average */
		{ 4001, 0, 7000, 1, 4001, 0, 4001, 4001 },   /* new peak */
		{ 7, 3, 7000, 0, 4001, 0, 4001, 4001 },      /* same ms: nothing closes */
		{ 0, 0, 8500, 1, 4, 2, 6, 4001 },            /* 7 and 3 over 1.5 s */
	};
	struct dirtyrate e;

	T_CHECK_EQ(t, dirtyrate__init(&e, 2, 1000, 0), 0);
	for (unsigned i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		T_CHECK_EQ(t, dirtyrate__add(&e, 0, rows[i].add0), 0);
		T_CHECK_EQ(t, dirtyrate__add(&e, 1, rows[i].add1), 0);
		T_CHECK_EQ(t, dirtyrate__tick(&e, rows[i].now), rows[i].closed);
		T_CHECK_EQ(t, dirtyrate__vcpu_rate(&e, 0), rows[i].r0);
		T_CHECK_EQ(t, dirtyrate__vcpu_rate(&e, 1), rows[i].r1);
		T_CHECK_EQ(t, dirtyrate__rate(&e), rows[i].total);
		T_CHECK_EQ(t, dirtyrate__peak(&e), rows[i].peak);
		if (t->failed_checks) {
			printf("#   at row %u\n", i);
			break;
		}
	}
	T_CHECK_EQ(t, e.periods, 6);
	dirtyrate__free(&e);
}

static void t_take_peak(struct t *t)
{
	struct dirtyrate e;

	T_CHECK_EQ(t, dirtyrate__init(&e, 1, 100, 1000), 0);
	T_CHECK_EQ(t, dirtyrate__take_peak(&e), 0);
	T_CHECK_EQ(t, dirtyrate__add(&e, 0, 50), 0);
	T_CHECK(t, dirtyrate__tick(&e, 1100));          /* 500 pages/s */
	T_CHECK_EQ(t, dirtyrate__add(&e, 0, 20), 0);
	T_CHECK(t, dirtyrate__tick(&e, 1200));          /* 200 pages/s */
	T_CHECK_EQ(t, dirtyrate__rate(&e), 200);
	T_CHECK_EQ(t, dirtyrate__take_peak(&e), 500);
	/* Restarts from the current rate, not from 0. */
	T_CHECK_EQ(t, dirtyrate__peak(&e), 200);
	T_CHECK_EQ(t, dirtyrate__add(&e, 0, 30), 0);
	T_CHECK(t, dirtyrate__tick(&e, 1300));
	T_CHECK_EQ(t, dirtyrate__take_peak(&e), 300);
	T_CHECK_EQ(t, dirtyrate__take_peak(&e), 300);
	T_CHECK(t, dirtyrate__tick(&e, 1400));          /* idle period */
	T_CHECK_EQ(t, dirtyrate__take_peak(&e), 300);
	T_CHECK_EQ(t, dirtyrate__take_peak(&e), 0);
	dirtyrate__free(&e);
}

static void t_clock_and_reset(struct t *t)
{
	struct dirtyrate e;

	T_CHECK_EQ(t, dirtyrate__init(&e, 1, 1000, 5000), 0);
	T_CHECK_EQ(t, dirtyrate__add(&e, 0, 100), 0);
	/* Time before the period start: restart there, keep the counts. */
	T_CHECK(t, !dirtyrate__tick(&e, 4000));
	T_CHECK(t, !dirtyrate__tick(&e, 4999));
	T_CHECK(t, dirtyrate__tick(&e, 5000));
	T_CHECK_EQ(t, dirtyrate__rate(&e), 100);
	dirtyrate__reset(&e, 9000);
	T_CHECK_EQ(t, dirtyrate__rate(&e), 0);
	T_CHECK_EQ(t, dirtyrate__peak(&e), 0);
	T_CHECK_EQ(t, dirtyrate__vcpu_rate(&e, 0), 0);
	T_CHECK(t, !dirtyrate__tick(&e, 9999));
	T_CHECK(t, dirtyrate__tick(&e, 10000));
	T_CHECK_EQ(t, dirtyrate__rate(&e), 0);
	dirtyrate__free(&e);
}

static void t_saturation(struct t *t)
{
	struct dirtyrate e;

	T_CHECK_EQ(t, dirtyrate__init(&e, 3, 1, 0), 0);
	T_CHECK_EQ(t, dirtyrate__add(&e, 0, UINT64_MAX - 1), 0);
	T_CHECK_EQ(t, dirtyrate__add(&e, 0, 5), 0);
	T_CHECK_EQ(t, e.pages[0], UINT64_MAX);
	T_CHECK_EQ(t, dirtyrate__add(&e, 1, UINT64_MAX), 0);
	T_CHECK(t, dirtyrate__tick(&e, 1));
	T_CHECK(t, dirtyrate__vcpu_rate(&e, 0) == UINT64_MAX);
	T_CHECK(t, dirtyrate__rate(&e) == UINT64_MAX);
	T_CHECK(t, dirtyrate__peak(&e) == UINT64_MAX);
	/* A huge gap between ticks. */
	T_CHECK_EQ(t, dirtyrate__add(&e, 2, 7), 0);
	T_CHECK(t, dirtyrate__tick(&e, UINT64_MAX));
	T_CHECK_EQ(t, dirtyrate__rate(&e), 0);
	dirtyrate__free(&e);
}

static void t_from_sync_table(struct t *t)
{
	static const struct { uint64_t pages, ms, want; } rows[] = {
		{ 0, 1000, 0 },
		{ 1000, 0, 0 },            /* no interval: no measurement */
		{ 1000, 1000, 1000 },
		{ 1, 3, 333 },
		{ 131072, 1000, 131072 },  /* 512 MiB/s of 4 KiB pages */
		{ 5, 2000, 2 },
		{ UINT64_MAX, 1, UINT64_MAX },
		{ UINT64_MAX, 1000, UINT64_MAX },
		{ UINT64_MAX / 1000, 1000, UINT64_MAX / 1000 },
	};

	for (unsigned i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		T_CHECK(t, dirtyrate__from_sync(rows[i].pages, rows[i].ms) == rows[i].want);
}

static void t_conversions(struct t *t)
{
	static const struct { uint64_t pages, page_size, mbps; } to_mb[] = {
		{ 256, 4096, 1 },
		{ 255, 4096, 0 },          /* truncates, as QEMU */
		{ 131072, 4096, 512 },
		{ 1, 2097152, 2 },         /* 2 MiB pages */
		{ 100, 0, 0 },
		{ UINT64_MAX, 4096, UINT64_MAX / 256 },
		{ UINT64_MAX, UINT64_MAX, UINT64_MAX },
	};
	static const struct { uint64_t mbps, page_size, pages; } to_pages[] = {
		{ 1, 4096, 256 },
		{ 100, 4096, 25600 },
		{ 0, 4096, 0 },
		{ 1, 0, 0 },
		{ 3, 2097152, 1 },
		{ UINT64_MAX, 4096, UINT64_MAX },
	};

	for (unsigned i = 0; i < sizeof(to_mb) / sizeof(to_mb[0]); i++)
		T_CHECK(t, dirtyrate__pages_to_mbps(to_mb[i].pages, to_mb[i].page_size) ==
			   to_mb[i].mbps);
	for (unsigned i = 0; i < sizeof(to_pages) / sizeof(to_pages[0]); i++)
		T_CHECK(t, dirtyrate__mbps_to_pages(to_pages[i].mbps, to_pages[i].page_size) ==
			   to_pages[i].pages);
	T_CHECK_EQ(t, DIRTYRATE_MB, 1048576);
	T_CHECK_EQ(t, dirtyrate__pages_to_bytes(25600, 4096), 104857600);
	T_CHECK(t, dirtyrate__pages_to_bytes(UINT64_MAX, 2) == UINT64_MAX);
	T_CHECK_EQ(t, dirtyrate__bytes_to_mbps(104857600), 100);
	T_CHECK_EQ(t, dirtyrate__bytes_to_mbps(1048575), 0);
	/* Round trip through MB/s loses at most one MiB's worth of pages. */
	T_CHECK_EQ(t, dirtyrate__mbps_to_pages(dirtyrate__pages_to_mbps(50000, 4096), 4096),
		   49920);
}

/* QEMU: whole MiB of the dirtied pages first, then per second. */
static void t_qemu_mbps(struct t *t)
{
	static const struct { uint64_t pages, page_size, ms, want; } rows[] = {
		{ 256, 4096, 1000, 1 },
		{ 511, 4096, 1000, 1 },     /* 1.99 MiB -> 1 */
		{ 511, 4096, 500, 2 },      /* 1 MiB in 0.5 s */
		{ 25600, 4096, 1000, 100 },
		{ 25600, 4096, 3000, 33 },
		{ 25600, 4096, 0, 0 },
		{ 255, 4096, 1, 0 },        /* under 1 MiB counts as 0, however fast */
	};

	for (unsigned i = 0; i < sizeof(rows) / sizeof(rows[0]); i++)
		T_CHECK_EQ(t, dirtyrate__qemu_mbps(rows[i].pages, rows[i].page_size, rows[i].ms),
			   rows[i].want);
}

int main(void)
{
	struct t t = {0};

	T_RUN(&t, t_init_errors);
	T_RUN(&t, t_period_table);
	T_RUN(&t, t_take_peak);
	T_RUN(&t, t_clock_and_reset);
	T_RUN(&t, t_saturation);
	T_RUN(&t, t_from_sync_table);
	T_RUN(&t, t_conversions);
	T_RUN(&t, t_qemu_mbps);
	return T_DONE(&t);
}
