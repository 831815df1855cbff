/* Post-copy blocktime (src/mig/recv/blocktime.c): per-vCPU waits, the
 * time every vCPU waited at once, faults of other threads, a page placed
 * before its fault was noted, waits still going. */
#include <errno.h>
#include <stdint.h>

#include "harness.h"
#include "mig/recv/blocktime.h"

#define MS 1000000ull

static void t_one_vcpu(struct t *t)
{
	struct blocktime b;
	uint64_t v[1];
	T_CHECK(t, blocktime__init(&b, (int[]){ 100 }, 1) == 0);
	T_CHECK_EQ(t, blocktime__fault(&b, 100, 7, 10 * MS), 0);
	blocktime__placed(&b, 8, 12 * MS);             /* another page: still waiting */
	blocktime__placed(&b, 7, 15 * MS);
	T_CHECK_EQ(t, blocktime__fault(&b, 100, 9, 20 * MS), 0);
	blocktime__placed(&b, 9, 23 * MS);
	T_CHECK_EQ(t, blocktime__read(&b, 50 * MS, v), 8);  /* one vCPU: all = its own */
	T_CHECK_EQ(t, v[0], 8);
	blocktime__free(&b);
}

/* vCPU 0 waits 10..30, vCPU 1 waits 20..40: both at once 20..30. */
static void t_two_vcpus_overlap(struct t *t)
{
	struct blocktime b;
	uint64_t v[2];
	T_CHECK(t, blocktime__init(&b, (int[]){ 100, 101 }, 2) == 0);
	T_CHECK_EQ(t, blocktime__fault(&b, 100, 1, 10 * MS), 0);
	T_CHECK_EQ(t, blocktime__fault(&b, 101, 2, 20 * MS), 1);
	blocktime__placed(&b, 1, 30 * MS);
	blocktime__placed(&b, 2, 40 * MS);
	T_CHECK_EQ(t, blocktime__read(&b, 99 * MS, v), 10);
	T_CHECK_EQ(t, v[0], 20);
	T_CHECK_EQ(t, v[1], 20);
	/* both on the same page: one placement frees both */
	T_CHECK_EQ(t, blocktime__fault(&b, 101, 5, 100 * MS), 1);
	T_CHECK_EQ(t, blocktime__fault(&b, 100, 5, 104 * MS), 0);
	blocktime__placed(&b, 5, 110 * MS);
	T_CHECK_EQ(t, blocktime__read(&b, 200 * MS, v), 16);
	T_CHECK_EQ(t, v[0], 26);
	T_CHECK_EQ(t, v[1], 30);
	blocktime__free(&b);
}

static void t_others_and_ongoing(struct t *t)
{
	struct blocktime b;
	uint64_t v[2];
	T_CHECK(t, blocktime__init(&b, (int[]){ 100, 101 }, 2) == 0);
	T_CHECK_EQ(t, blocktime__fault(&b, 555, 1, 0), -1);  /* not a vCPU */
	T_CHECK_EQ(t, blocktime__fault(&b, 100, 1, 10 * MS), 0);
	T_CHECK_EQ(t, blocktime__read(&b, 25 * MS, v), 0);   /* vCPU 1 runs */
	T_CHECK_EQ(t, v[0], 15);                             /* still waiting */
	T_CHECK_EQ(t, v[1], 0);
	T_CHECK_EQ(t, blocktime__fault(&b, 101, 3, 30 * MS), 1);
	T_CHECK_EQ(t, blocktime__read(&b, 37 * MS, v), 7);   /* both, so far */
	/* the fault thread notes a fault whose page came meanwhile: placed
	 * again right after, the wait ends at once */
	blocktime__placed(&b, 3, 40 * MS);
	blocktime__placed(&b, 3, 41 * MS);
	T_CHECK_EQ(t, blocktime__read(&b, 50 * MS, v), 10);
	T_CHECK_EQ(t, v[0], 40);
	T_CHECK_EQ(t, v[1], 10);
	blocktime__free(&b);
}

/* A placement timed before the fault it ends (both read their clocks
 * before the lock) counts as no wait, never as a wrapped one; a second
 * fault of a waiting vCPU moves its wait to the new page. */
static void t_clock_order_and_refault(struct t *t)
{
	struct blocktime b;
	uint64_t v[1];
	T_CHECK(t, blocktime__init(&b, (int[]){ 100 }, 1) == 0);
	T_CHECK_EQ(t, blocktime__fault(&b, 100, 4, 20 * MS), 0);
	blocktime__placed(&b, 4, 19 * MS);
	T_CHECK_EQ(t, blocktime__read(&b, 18 * MS, v), 0);
	T_CHECK_EQ(t, v[0], 0);
	T_CHECK_EQ(t, blocktime__fault(&b, 100, 1, 30 * MS), 0);
	T_CHECK_EQ(t, blocktime__fault(&b, 100, 2, 31 * MS), 0);
	blocktime__placed(&b, 1, 35 * MS);                   /* no longer its page */
	T_CHECK_EQ(t, blocktime__read(&b, 36 * MS, v), 6);
	blocktime__placed(&b, 2, 40 * MS);
	T_CHECK_EQ(t, blocktime__read(&b, 90 * MS, v), 10);
	T_CHECK_EQ(t, v[0], 10);
	blocktime__free(&b);
}

static void t_limits(struct t *t)
{
	struct blocktime b;
	int tids[BLOCKTIME_MAX_VCPUS + 1] = { 0 };
	T_CHECK_EQ(t, blocktime__init(&b, tids, 0), -EINVAL);
	T_CHECK_EQ(t, blocktime__init(&b, tids, BLOCKTIME_MAX_VCPUS + 1), -EINVAL);
	T_CHECK(t, blocktime__init(&b, tids, BLOCKTIME_MAX_VCPUS) == 0);
	blocktime__free(&b);
}

int main(void)
{
	struct t t = {0};

	T_RUN(&t, t_one_vcpu);
	T_RUN(&t, t_two_vcpus_overlap);
	T_RUN(&t, t_others_and_ongoing);
	T_RUN(&t, t_clock_order_and_refault);
	T_RUN(&t, t_limits);
	return T_DONE(&t);
}
