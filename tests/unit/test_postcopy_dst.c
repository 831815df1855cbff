/* The post-copy destination's preparation of guest RAM, with a real
 * userfaultfd over fake guest RAM (no KVM): a page that is present but
 * was never received (khugepaged may fill one with zeros while it
 * collapses a huge page, before RAM is registered) is dropped at the
 * start, so the guest faults on it and its copy, when it comes, is
 * placed instead of refused. */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/bitmap.h"
#include "mem/ram.h"
#include "mig/postcopy.h"
#include "mig/wire/proto.h"
#include "harness.h"

#define RAM_SIZE (128ull << 20)

static bool resident(const struct ram *ram, uint64_t page)
{
	unsigned char v = 0;
	uint8_t *h = ram__gpa_to_host(ram, ram__page_gpa(ram, page), RAM_PAGE_SIZE);
	return !mincore(h, RAM_PAGE_SIZE, &v) && (v & 1);
}

static void t_present_not_received(struct t *t)
{
	struct ram ram;
	struct bitmap valid;
	struct postcopy_dst d;
	char err[256] = "";
	if (ram__create(&ram, -1, RAM_SIZE) || bitmap__init(&valid, ram.npages)) {
		T_CHECK(t, 0);
		return;
	}
	/* pages 0..511 received in pre-copy; 300 discarded at the switch */
	for (uint64_t p = 0; p < 512; p++) {
		memset(ram__gpa_to_host(&ram, p * RAM_PAGE_SIZE, RAM_PAGE_SIZE), 0x5a, RAM_PAGE_SIZE);
		bitmap__set(&valid, p);
	}
	T_CHECK_EQ(t, postcopy_dst__init(&d, &ram, NULL, &valid), 0);
	T_CHECK_EQ(t, postcopy_dst__discard(&d, 300), 0);
	/* what a collapse leaves: the discarded page and a page never sent
	 * (700) present again, as zeros, before the registration */
	memset(ram__gpa_to_host(&ram, 300 * RAM_PAGE_SIZE, RAM_PAGE_SIZE), 0, RAM_PAGE_SIZE);
	memset(ram__gpa_to_host(&ram, 700 * RAM_PAGE_SIZE, RAM_PAGE_SIZE), 0, RAM_PAGE_SIZE);
	int rc = postcopy_dst__start(&d, err, sizeof(err));
	T_CHECK_EQ(t, rc, 0);
	if (rc) {
		printf("#   %s\n", err);
		postcopy_dst__free(&d);
		return;
	}
	T_CHECK(t, !resident(&ram, 300) && !resident(&ram, 700));
	T_CHECK(t, resident(&ram, 299) && resident(&ram, 301));     /* received ones stay */
	static uint8_t page[RAM_PAGE_SIZE];
	memset(page, 0x77, sizeof(page));
	T_CHECK_EQ(t, postcopy_dst__place(&d, 300, page), 0);
	T_CHECK_EQ(t, postcopy_dst__place(&d, 700, page), 0);
	T_CHECK_EQ(t, ((uint8_t *)ram__gpa_to_host(&ram, 300 * RAM_PAGE_SIZE, 1))[17], 0x77);
	T_CHECK_EQ(t, ((uint8_t *)ram__gpa_to_host(&ram, 299 * RAM_PAGE_SIZE, 1))[17], 0x5a);
	postcopy_dst__finish(&d);
	postcopy_dst__free(&d);
	bitmap__free(&valid);
	ram__destroy(&ram);
}

/* postcopy-preempt: the main stream's thread and the channel's place
 * pages at once.  Every page is placed by both, one ascending, one
 * descending: the second copy of each is taken as already there (never a
 * spurious "present but never received"), and the post-copy sum counts
 * each page once, whichever thread won. */
#define TWO_FIRST 1024u
#define TWO_PAGES 8192u

struct placer {
	struct postcopy_dst *d;
	bool down;
	int bad;            /* non-zero returns */
};

static void two__fill(uint8_t *buf, uint64_t page)
{
	for (unsigned i = 0; i < RAM_PAGE_SIZE / 8; i++)
		memcpy(buf + 8 * i, &(uint64_t){ page * 0x9e3779b97f4a7c15ull + i }, 8);
}

static void *two__placer(void *arg)
{
	struct placer *pl = arg;
	static _Thread_local uint8_t buf[RAM_PAGE_SIZE];
	for (unsigned k = 0; k < TWO_PAGES; k++) {
		uint64_t page = TWO_FIRST + (pl->down ? TWO_PAGES - 1 - k : k);
		two__fill(buf, page);
		if (postcopy_dst__place(pl->d, page, buf))
			pl->bad++;
	}
	return NULL;
}

static void t_two_placers(struct t *t)
{
	struct ram ram;
	struct bitmap valid;
	struct postcopy_dst d;
	char err[256] = "";
	if (ram__create(&ram, -1, RAM_SIZE) || bitmap__init(&valid, ram.npages)) {
		T_CHECK(t, 0);
		return;
	}
	T_CHECK_EQ(t, postcopy_dst__init(&d, &ram, NULL, &valid), 0);
	d.verify = true;
	int rc = postcopy_dst__start(&d, err, sizeof(err));
	T_CHECK_EQ(t, rc, 0);
	if (rc) {
		printf("#   %s\n", err);
		postcopy_dst__free(&d);
		return;
	}
	struct placer a = { &d, false, 0 }, b = { &d, true, 0 };
	pthread_t ta, tb;
	pthread_create(&ta, NULL, two__placer, &a);
	pthread_create(&tb, NULL, two__placer, &b);
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	printf("# %u pages placed by two threads at once: %d and %d refused\n", TWO_PAGES,
	       a.bad, b.bad);
	T_CHECK(t, a.bad == 0 && b.bad == 0);
	T_CHECK_EQ(t, bitmap__count(&valid), TWO_PAGES);
	T_CHECK_EQ(t, atomic_load(&d.placed), TWO_PAGES);
	/* the sum the source would send: these pages as placed, the rest zero */
	static uint8_t page[RAM_PAGE_SIZE], zero[RAM_PAGE_SIZE];
	uint64_t acc[4] = { 0 };
	uint8_t hash[PROTO_HASH_LEN];
	for (uint64_t p = 0; p < ram.npages; p++) {
		bool ours = p >= TWO_FIRST && p < TWO_FIRST + TWO_PAGES;
		if (ours)
			two__fill(page, p);
		proto__page_sum_add(acc, p, ours ? page : zero);
	}
	proto__page_sum_out(acc, hash);
	T_CHECK_EQ(t, postcopy_dst__check(&d, hash), 0);
	two__fill(page, TWO_FIRST + 77);
	T_CHECK(t, !memcmp(ram__gpa_to_host(&ram, (TWO_FIRST + 77) * RAM_PAGE_SIZE, RAM_PAGE_SIZE),
			   page, RAM_PAGE_SIZE));
	postcopy_dst__finish(&d);
	postcopy_dst__free(&d);
	bitmap__free(&valid);
	ram__destroy(&ram);
}

int main(void)
{
	struct t t = { 0 };
	T_RUN(&t, t_present_not_received);
	T_RUN(&t, t_two_placers);
	return T_DONE(&t);
}
