/* KVM test: dirty tracking is lossless.  "Every page written between two
 * syncs is reported by the next one."
 *
 * Each case boots the test guest in-process (workload verify or stress),
 * starts tracking, takes a shadow copy of all guest RAM and then runs
 * thousands of rounds of {sleep 0-2 ms, dirty__sync, copy every reported
 * page into the shadow} while the guest keeps writing, exactly what a
 * pre-copy migration does.  Every few rounds the low part of RAM (where
 * the guest writes) is compared page by page with the shadow: a page that
 * differs but was not reported must be reported by the next kicked sync,
 * else it is counted lost.  At the end the vCPUs are paused, a last sync
 * is copied and the shadow must equal guest RAM byte for byte.
 *
 * Also: dirty__mark (deterministic, and racing with syncs from another
 * thread) and stop/start of logging.  Runs from the repository root. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "harness.h"
#include "base/bitmap.h"
#include "base/timeutil.h"
#include "kvm/vcpu.h"
#include "kvm/vm.h"
#include "mem/dirty.h"
#include "mem/ram.h"

#define GUEST_ELF "build/guest/kmig-guest.elf"
#define MEM_SIZE (256ull << 20)
#define PG RAM_PAGE_SIZE
#define SCAN_SLACK_MB 8          /* scanned beyond the workload: image, stack, tables */
#define MARK_GPA (128ull << 20)  /* VMM-written region, never touched by the guest */
#define MARK_PAGES 4096ull

/* ---------------------------------------------------------------- guest */

struct guest {
	struct vm vm;
	FILE *console;
	bool created;
	unsigned cpus_up;            /* from the guest's "ready cpus=N" line */
};

static const unsigned smp_cpus = 2;

static int guest__read_console(struct guest *g, char *buf, size_t len)
{
	fflush(g->console);
	ssize_t n = pread(fileno(g->console), buf, len - 1, 0);
	if (n < 0)
		return -errno;
	buf[n] = 0;
	return (int)n;
}

static bool guest__console_has(struct guest *g, const char *what)
{
	static char buf[1 << 20];
	return guest__read_console(g, buf, sizeof(buf)) > 0 && strstr(buf, what);
}

static int guest__wait_ready(struct guest *g, unsigned timeout_ms)
{
	static char buf[1 << 16];
	uint64_t end = time__now_ms() + timeout_ms;
	while (time__now_ms() < end) {
		if (guest__read_console(g, buf, sizeof(buf)) > 0) {
			const char *r = strstr(buf, "kmig-guest ready cpus=");
			if (r) {
				g->cpus_up = (unsigned)atoi(r + strlen("kmig-guest ready cpus="));
				return 0;
			}
		}
		time__sleep_ns(20 * 1000000ull);
	}
	return -ETIMEDOUT;
}

static int guest__boot(struct guest *g, const char *cmdline, unsigned cpus,
		       uint32_t ring, bool fixed, uint64_t chunk_pages, char *err, size_t errlen)
{
	memset(g, 0, sizeof(*g));
	g->console = tmpfile();
	if (!g->console) {
		snprintf(err, errlen, "tmpfile: %s", strerror(errno));
		return -errno;
	}
	struct vm_config cfg = { .kernel = GUEST_ELF, .cmdline = cmdline, .mem_size = MEM_SIZE,
				 .cpus = cpus, .console_fd = fileno(g->console),
				 .dirty_ring = ring, .reaper_fixed = fixed,
				 .clear_chunk_pages = chunk_pages };
	int rc = vm__create(&g->vm, &cfg, err, errlen);
	g->created = true;
	if (!rc)
		rc = vm__start(&g->vm, VM_STATUS_RUNNING);
	if (rc && !err[0])
		snprintf(err, errlen, "vm__start: %s", strerror(-rc));
	if (!rc && (rc = guest__wait_ready(g, cpus > 1 ? 9000 : 4000)))
		snprintf(err, errlen, "no ready line from the guest");
	return rc;
}

static void guest__destroy(struct guest *g)
{
	if (g->created)
		vm__destroy(&g->vm);
	if (g->console)
		fclose(g->console);
	g->created = false;
	g->console = NULL;
}

static uint64_t guest__ring_full_exits(struct guest *g)
{
	struct dirty_stats st;
	dirty__get_stats(g->vm.dirty, &st);
	return st.ring_full_exits;
}

/* ---------------------------------------------------------------- probe */

/* The shadow of guest RAM and what the rounds found. */
struct probe {
	struct vm *vm;
	uint8_t *shadow;             /* VM-wide page i at shadow + i * PG */
	struct bitmap bm;            /* reported by the current sync */
	struct bitmap ever;          /* reported at least once */
	struct bitmap pending;       /* differed and unreported at the last scan */
	uint64_t scan_pages;         /* scans cover pages [0, scan_pages) */
	uint64_t rounds, nokick, reported, scans;
	uint64_t scan_reported, scan_changed; /* on scan rounds, inside the scan range */
	uint64_t late;               /* unreported at a scan and at the next kicked one */
	uint64_t first_late, mismatches, first_bad;
	uint64_t sync_ns_max, sync_ns_sum;
	/* deferred clear: syncs leave pages unprotected, and each chunk is
	 * re-protected before its first reported page is copied (as the
	 * migration's pass does); clear_late does it 3 ms after the copies
	 * instead (the negative control: writes in between are lost);
	 * pause_in_window pauses the guest at the end of that window, so
	 * what it wrote there is never written again */
	bool deferred, clear_late, pause_in_window;
	uint64_t chunk_pages;
	int clear_rc;
};

static int probe__init(struct probe *p, struct vm *vm, uint64_t scan_pages)
{
	memset(p, 0, sizeof(*p));
	p->vm = vm;
	p->scan_pages = scan_pages < vm->ram.npages ? scan_pages : vm->ram.npages;
	p->shadow = malloc(vm->ram.size);
	if (!p->shadow)
		return -ENOMEM;
	int rc = bitmap__init(&p->bm, vm->ram.npages);
	if (!rc)
		rc = bitmap__init(&p->ever, vm->ram.npages);
	if (!rc)
		rc = bitmap__init(&p->pending, vm->ram.npages);
	if (rc)
		return rc;
	for (uint64_t i = 0; i < vm->ram.npages; i++)
		memcpy(p->shadow + i * PG, ram__page_host(&vm->ram, i), PG);
	return 0;
}

static void probe__free(struct probe *p)
{
	free(p->shadow);
	bitmap__free(&p->bm);
	bitmap__free(&p->ever);
	bitmap__free(&p->pending);
	p->shadow = NULL;
}

static bool probe__differs(const struct probe *p, uint64_t i)
{
	return memcmp(p->shadow + i * PG, ram__page_host(&p->vm->ram, i), PG) != 0;
}

/* Compares the scan range with the shadow before the reported pages are
 * copied.  A page still pending from the previous scan was unreported by
 * every sync since, the last of them kicked: lost. */
static void probe__scan(struct probe *p)
{
	p->scans++;
	for (uint64_t i = 0; i < p->scan_pages; i++) {
		bool rep = bitmap__test(&p->bm, i);
		p->scan_reported += rep;
		if (!probe__differs(p, i)) {
			bitmap__clear_bit(&p->pending, i);
			continue;
		}
		p->scan_changed++;
		if (rep)
			continue;
		if (!bitmap__test_and_set(&p->pending, i) && !p->late++)
			p->first_late = i;
	}
}

static void probe__copy_reported(struct probe *p)
{
	for (uint64_t i = bitmap__next_set(&p->bm, 0); i < p->bm.nbits;
	     i = bitmap__next_set(&p->bm, i + 1)) {
		if (p->deferred && !p->clear_late && !p->clear_rc)
			p->clear_rc = dirty__clear_before_read(p->vm->dirty, i);
		memcpy(p->shadow + i * PG, ram__page_host(&p->vm->ram, i), PG);
		bitmap__set(&p->ever, i);
		bitmap__clear_bit(&p->pending, i);
		p->reported++;
	}
	if (p->deferred && p->clear_late) {
		/* a writer's window between the copies and the clear: long
		 * enough at the end for the guest to come round its 2 MiB
		 * again, even under emulation */
		time__sleep_ns(p->pause_in_window ? 100000000 : 3000000);
		if (p->pause_in_window) {
			vm__pause_vcpus(p->vm);
			p->pause_in_window = false;
		}
		for (uint64_t i = bitmap__next_set(&p->bm, 0); i < p->bm.nbits && !p->clear_rc;
		     i = bitmap__next_set(&p->bm, i + 1))
			p->clear_rc = dirty__clear_before_read(p->vm->dirty, i);
	}
	bitmap__clear_all(&p->bm);
}

static int probe__sync(struct probe *p, bool kick, bool scan)
{
	uint64_t t0 = time__now_ns();
	int64_t n = dirty__sync(p->vm->dirty, &p->bm, (kick ? DIRTY_SYNC_KICK : 0) |
				(p->deferred ? DIRTY_SYNC_DEFER_CLEAR : 0));
	uint64_t dt = time__now_ns() - t0;
	if (n < 0)
		return (int)n;
	p->rounds++;
	p->nokick += !kick;
	p->sync_ns_sum += dt;
	if (dt > p->sync_ns_max)
		p->sync_ns_max = dt;
	if (scan)
		probe__scan(p);
	probe__copy_reported(p);
	return 0;
}

/* Pauses the guest, copies the last sync and compares all of RAM.  The
 * negative control pauses it at the end of a late clear's window instead,
 * so the writes it lost there cannot be hidden by later ones. */
static int probe__final(struct probe *p)
{
	int rc = 0;
	if (p->clear_late) {
		time__sleep_ns(20000000);
		p->pause_in_window = true;
		rc = probe__sync(p, true, false);
	} else {
		vm__pause_vcpus(p->vm);
	}
	if (!rc)
		rc = probe__sync(p, false, false);
	p->first_bad = UINT64_MAX;
	for (uint64_t i = 0; i < p->vm->ram.npages && !rc; i++) {
		if (!probe__differs(p, i))
			continue;
		if (!p->mismatches++)
			p->first_bad = i;
	}
	vm__resume_vcpus(p->vm);
	return rc;
}

/* ---------------------------------------------------------------- rounds */

struct plan {
	unsigned rounds;
	unsigned max_sleep_us;
	unsigned scan_every;         /* scan rounds are always kicked */
	unsigned nokick_every;       /* 0: always kick */
};

static const struct plan PLAN_DEFAULT = { 2000, 2000, 16, 5 };

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng__next(void)
{
	uint64_t x = rng_state;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return rng_state = x;
}

static int rounds__run(struct probe *p, const struct plan *pl)
{
	for (unsigned r = 1; r <= pl->rounds; r++) {
		uint64_t us = rng__next() % (pl->max_sleep_us + 1);
		if (us)
			time__sleep_ns(us * 1000);
		bool scan = pl->scan_every && r % pl->scan_every == 0;
		bool kick = scan || !pl->nokick_every || r % pl->nokick_every != 0;
		int rc = probe__sync(p, kick, scan);
		if (rc)
			return rc;
	}
	return 0;
}

static void probe__print(const struct probe *p, const char *name, struct guest *g)
{
	printf("# %s: rounds=%" PRIu64 " (unkicked %" PRIu64 ") reported=%" PRIu64
	       " scans=%" PRIu64 " scan_reported=%" PRIu64 " scan_changed=%" PRIu64
	       " late=%" PRIu64 " mismatches=%" PRIu64 " sync_avg_us=%" PRIu64
	       " sync_max_us=%" PRIu64 " ring_full_exits=%" PRIu64 "\n",
	       name, p->rounds, p->nokick, p->reported, p->scans, p->scan_reported,
	       p->scan_changed, p->late, p->mismatches,
	       p->rounds ? p->sync_ns_sum / p->rounds / 1000 : 0, p->sync_ns_max / 1000,
	       guest__ring_full_exits(g));
}

/* The lossless checks every case makes. */
static void probe__check(struct t *t, const struct probe *p, const char *name)
{
	T_CHECK(t, p->reported > 0);
	T_CHECK(t, p->scan_changed > 0);
	T_CHECK_EQ(t, p->late, 0);
	T_CHECK_EQ(t, p->mismatches, 0);
	T_CHECK(t, p->scan_reported <= 3 * p->scan_changed + 64 * p->scans);
	if (p->late)
		printf("#   %s: page %" PRIu64 " (gpa 0x%" PRIx64 ") differed at a scan and was"
		       " not reported by the next kicked sync\n", name, p->first_late,
		       ram__page_gpa(&p->vm->ram, p->first_late));
	if (p->mismatches)
		printf("#   %s: %" PRIu64 " pages differ at the end; first page %" PRIu64
		       " (gpa 0x%" PRIx64 "), %s reported\n", name, p->mismatches, p->first_bad,
		       ram__page_gpa(&p->vm->ram, p->first_bad),
		       bitmap__test(&p->ever, p->first_bad) ? "was" : "never");
}

/* ---------------------------------------------------------------- cases */

struct tcase {
	const char *name;
	const char *workload;        /* "verify" or "stress" */
	unsigned mb;
	uint32_t ring;               /* 0: bitmap */
	bool fixed;
	bool smp;                    /* try smp_cpus vCPUs */
	bool expect_ring_full;
	unsigned rounds;             /* 0: PLAN_DEFAULT's */
	bool deferred, clear_late;   /* struct probe's */
	uint64_t chunk_pages;        /* deferred-clear chunk; 0: the default */
};

static bool kvm_missing(const char *name)
{
	if (access("/dev/kvm", F_OK) == 0)
		return false;
	/* tests/run.sh runs this inside scripts/kvm-vm where /dev/kvm is missing */
	printf("not ok %s: no /dev/kvm\n", name);
	return true;
}

/* Under emulation (scripts/kvm-vm sets KMIG_TEST_EMULATED=1) every round
 * costs several times more: a fifth of the rounds, never fewer than 100.  What each
 * round checks is the same. */
static bool emulated(void)
{
	const char *e = getenv("KMIG_TEST_EMULATED");
	return e && !strcmp(e, "1");
}

static unsigned scaled(unsigned rounds)
{
	if (!emulated() || rounds <= 100)
		return rounds;
	return rounds / 5 > 100 ? rounds / 5 : 100;
}

/* A case that asked for SMP and got fewer vCPUs fails: it would prove less
 * than it claims. */
static int check_smp(struct t *t, struct guest *g, unsigned asked)
{
	if (asked < 2)
		return 0;
	printf("# SMP: ready cpus=%u of %u\n", g->cpus_up, asked);
	T_CHECK_EQ(t, g->cpus_up, asked);
	return g->cpus_up == asked ? 0 : -1;
}

static int tcase__boot(struct t *t, const struct tcase *c, struct guest *g, unsigned cpus)
{
	char cmd[160], err[256] = "";
	/* verify_precheck=0: the verify guest writes at its full pace, which
	 * the small-ring cases need to fill their rings */
	snprintf(cmd, sizeof(cmd), "workload=%s mb=%u cpus=%u report_ms=500 verify_precheck=0",
		 c->workload, c->mb, cpus);
	int rc = guest__boot(g, cmd, cpus, c->ring, c->fixed, c->chunk_pages, err, sizeof(err));
	if (rc) {
		printf("#   %s: %s\n", c->name, err);
		T_CHECK_EQ(t, rc, 0);
	}
	return rc;
}

/* Deferred clear: the first sync after start reports every page
 * (KVM_DIRTY_LOG_INITIALLY_SET) and protects none of them; the pages are
 * protected chunk by chunk as they are copied. */
static int deferred__first_sync(struct t *t, struct probe *p)
{
	struct dirty_stats st;
	int64_t n = dirty__sync(p->vm->dirty, &p->bm, DIRTY_SYNC_DEFER_CLEAR);
	if (n < 0)
		return (int)n;
	dirty__get_stats(p->vm->dirty, &st);
	printf("#   first deferred sync: reported=%" PRId64 " pending=%" PRIu64
	       " cleared=%" PRIu64 " clear_calls=%" PRIu64 "\n", n, st.pending_pages,
	       st.cleared_pages, st.clear_calls);
	T_CHECK_EQ(t, st.clear_calls, 0);
	T_CHECK_EQ(t, st.cleared_pages, 0);
	T_CHECK(t, st.pending_pages > 0 && st.pending_pages == (uint64_t)n);
	/* one chunk read: only its pages are protected */
	uint64_t first = bitmap__next_set(&p->bm, 0);
	int rc = first < p->bm.nbits ? dirty__clear_before_read(p->vm->dirty, first) : -ENOENT;
	T_CHECK_EQ(t, rc, 0);
	dirty__get_stats(p->vm->dirty, &st);
	T_CHECK_EQ(t, st.clear_calls, 1);
	T_CHECK(t, st.cleared_pages > 0 && st.cleared_pages <= p->chunk_pages &&
		   st.pending_pages + st.cleared_pages == (uint64_t)n);
	probe__copy_reported(p);
	dirty__get_stats(p->vm->dirty, &st);
	printf("#   after copying them: cleared=%" PRIu64 " in %" PRIu64 " calls, pending=%" PRIu64 "\n",
	       st.cleared_pages, st.clear_calls, st.pending_pages);
	if (!p->clear_late)
		T_CHECK(t, st.pending_pages == 0 && st.cleared_pages == (uint64_t)n);
	return rc;
}

static void tcase__run(struct t *t, const struct tcase *c)
{
	struct guest g;
	struct probe p = { 0 };
	unsigned cpus = c->smp ? smp_cpus : 1;
	if (tcase__boot(t, c, &g, cpus))
		goto out;
	if (check_smp(t, &g, cpus))
		goto out;
	int rc = dirty__start(g.vm.dirty);
	T_CHECK_EQ(t, rc, 0);
	if (!rc)
		rc = probe__init(&p, &g.vm, ((uint64_t)c->mb + SCAN_SLACK_MB) << 8);
	p.deferred = c->deferred;
	p.clear_late = c->clear_late;
	p.chunk_pages = c->chunk_pages ? c->chunk_pages : DIRTY_CLEAR_CHUNK_PAGES;
	if (!rc && c->deferred)
		rc = deferred__first_sync(t, &p);
	struct plan pl = PLAN_DEFAULT;
	if (c->rounds)
		pl.rounds = c->rounds;
	pl.rounds = scaled(pl.rounds);
	if (!rc)
		rc = rounds__run(&p, &pl);
	if (!rc)
		rc = probe__final(&p);
	T_CHECK_EQ(t, rc, 0);
	probe__print(&p, c->name, &g);
	T_CHECK_EQ(t, p.clear_rc, 0);
	if (!rc && !c->clear_late)
		probe__check(t, &p, c->name);
	if (!rc && c->clear_late) {
		/* the negative control: the same checks see the loss */
		printf("#   %s (negative control): late=%" PRIu64 " mismatches=%" PRIu64 "\n",
		       c->name, p.late, p.mismatches);
		T_CHECK(t, p.late + p.mismatches > 0);
	}
	if (c->expect_ring_full)
		T_CHECK(t, guest__ring_full_exits(&g) > 0);
	T_CHECK(t, !guest__console_has(&g, "verify BAD"));
	T_CHECK_EQ(t, dirty__stop(g.vm.dirty), 0);
out:
	probe__free(&p);
	guest__destroy(&g);
}

/* Smallest ring KVM accepts, probed on a scratch VM. */
static uint32_t smallest_ring(void)
{
	int kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (kvm < 0)
		return 0;
	uint32_t found = 0;
	for (uint32_t n = 256; n <= 65536 && !found; n *= 2) {
		int fd = ioctl(kvm, KVM_CREATE_VM, 0);
		bool acq;
		if (fd >= 0 && dirty__enable_ring_cap(fd, n, &acq) == 0)
			found = n;
		if (fd >= 0)
			close(fd);
	}
	close(kvm);
	return found;
}

static void t_bitmap_verify(struct t *t)
{
	static const struct tcase c = { .name = "bitmap_verify", .workload = "verify", .mb = 16 };
	tcase__run(t, &c);
}

static void t_ring4096_adaptive_verify(struct t *t)
{
	static const struct tcase c = { .name = "ring4096_adaptive_verify", .workload = "verify",
					.mb = 16, .ring = 4096 };
	tcase__run(t, &c);
}

static void t_ring4096_fixed_verify(struct t *t)
{
	static const struct tcase c = { .name = "ring4096_fixed_verify", .workload = "verify",
					.mb = 16, .ring = 4096, .fixed = true };
	tcase__run(t, &c);
}

/* The smallest ring fills between syncs: the ring-full path is exercised. */
static void ring_small__run(struct t *t, const char *name, bool smp, unsigned rounds)
{
	struct tcase c = { .name = name, .workload = "verify", .mb = 16, .ring = smallest_ring(),
			   .smp = smp, .expect_ring_full = true, .rounds = rounds };
	T_CHECK(t, c.ring > 0);
	if (!c.ring)
		return;
	printf("# smallest dirty ring KVM accepts: %u entries\n", c.ring);
	tcase__run(t, &c);
}

static void t_ring_small_verify(struct t *t)
{
	ring_small__run(t, "ring_small_verify", false, 0);
}

/* Kicking two busy vCPUs on two host cores costs milliseconds: fewer rounds. */
static void t_ring_small_smp_verify(struct t *t)
{
	ring_small__run(t, "ring_small_smp_verify", true, 500);
}

static void t_bitmap_stress_smp(struct t *t)
{
	static const struct tcase c = { .name = "bitmap_stress_smp", .workload = "stress",
					.mb = 64, .smp = true };
	tcase__run(t, &c);
}

static void t_ring4096_stress(struct t *t)
{
	static const struct tcase c = { .name = "ring4096_stress", .workload = "stress",
					.mb = 64, .ring = 4096 };
	tcase__run(t, &c);
}

/* Deferred clear with 4 MiB chunks (64 of them in the 256 MiB guest). */
static void t_bitmap_deferred_verify(struct t *t)
{
	static const struct tcase c = { .name = "bitmap_deferred_verify", .workload = "verify",
					.mb = 16, .deferred = true, .chunk_pages = 1024 };
	tcase__run(t, &c);
}

static void t_bitmap_deferred_stress_smp(struct t *t)
{
	static const struct tcase c = { .name = "bitmap_deferred_stress_smp", .workload = "stress",
					.mb = 64, .smp = true, .deferred = true, .chunk_pages = 1024 };
	tcase__run(t, &c);
}

/* Negative control: each chunk re-protected 3 ms after its pages were
 * copied: the guest's writes in between are never reported.  The last
 * window ends with the guest paused, so the loss is seen every time. */
static void t_bitmap_deferred_clear_late(struct t *t)
{
	static const struct tcase c = { .name = "bitmap_deferred_clear_late", .workload = "verify",
					.mb = 2, .deferred = true, .clear_late = true,
					.chunk_pages = 1024, .rounds = 500 };
	tcase__run(t, &c);
}

/* ---------------------------------------------------------------- dirty__mark */

static bool bitmap_equal(const struct bitmap *a, const struct bitmap *b)
{
	return a->nbits == b->nbits &&
	       !memcmp(a->words, b->words, BITMAP_WORDS(a->nbits) * sizeof(uint64_t));
}

/* With the guest paused, the next sync reports exactly the marked pages. */
static void mark__exact(struct t *t, struct guest *g)
{
	struct bitmap got, want;
	struct ram *r = &g->vm.ram;
	if (bitmap__init(&got, r->npages) || bitmap__init(&want, r->npages)) {
		T_CHECK(t, false);
		goto out;
	}
	vm__pause_vcpus(&g->vm);
	T_CHECK(t, dirty__sync(g->vm.dirty, &got, 0) >= 0);   /* drain */
	bitmap__clear_all(&got);
	uint64_t base = MARK_GPA >> RAM_PAGE_SHIFT;
	dirty__mark(g->vm.dirty, MARK_GPA + 100, 1);               /* one byte */
	dirty__mark(g->vm.dirty, MARK_GPA + 3 * PG - 1, 2);        /* straddles 2|3 */
	dirty__mark(g->vm.dirty, MARK_GPA + 10 * PG, 5 * PG);      /* 10..14 */
	dirty__mark(g->vm.dirty, MARK_GPA + 40 * PG, 0);           /* nothing */
	dirty__mark(g->vm.dirty, MEM_SIZE - 10, 100);              /* clipped at the end */
	bitmap__set(&want, base);
	bitmap__set_range(&want, base + 2, 2);
	bitmap__set_range(&want, base + 10, 5);
	bitmap__set(&want, r->npages - 1);
	int64_t n = dirty__sync(g->vm.dirty, &got, 0);
	T_CHECK_EQ(t, n, 9);
	T_CHECK(t, bitmap_equal(&got, &want));
	bitmap__clear_all(&got);
	T_CHECK_EQ(t, dirty__sync(g->vm.dirty, &got, 0), 0);  /* consumed */
	vm__resume_vcpus(&g->vm);
out:
	bitmap__free(&got);
	bitmap__free(&want);
}

/* A VMM thread writes pages of the mark region and marks them while the
 * main thread syncs: mark number i writes i into page i % MARK_PAGES. */
struct marker {
	struct guest *g;
	atomic_ullong done;          /* marks 1..done completed (write, then mark) */
	atomic_bool stop;
	pthread_t thread;
};

static void *marker__main(void *arg)
{
	struct marker *m = arg;
	struct ram *r = &m->g->vm.ram;
	for (uint64_t i = 1; !atomic_load_explicit(&m->stop, memory_order_relaxed); i++) {
		uint64_t gpa = MARK_GPA + (i % MARK_PAGES) * PG;
		uint64_t *w = ram__gpa_to_host(r, gpa, PG);
		__atomic_store_n(w, i, __ATOMIC_RELAXED);
		dirty__mark(m->g->vm.dirty, gpa, PG);
		atomic_store_explicit(&m->done, i, memory_order_release);
	}
	return NULL;
}

/* Every mark completed before a sync started is in the shadow after it:
 * page q must hold at least the last mark j <= done with j % MARK_PAGES == q. */
static uint64_t mark__lost_since(struct probe *p, uint64_t done)
{
	uint64_t lost = 0;
	for (uint64_t q = 0; q < MARK_PAGES; q++) {
		uint64_t back = (done % MARK_PAGES + MARK_PAGES - q) % MARK_PAGES;
		if (back >= done)
			continue;       /* page q not marked yet */
		uint64_t want = done - back, have;
		memcpy(&have, p->shadow + ((MARK_GPA >> RAM_PAGE_SHIFT) + q) * PG, sizeof(have));
		lost += have < want;
	}
	return lost;
}

static void mark__race(struct t *t, struct guest *g)
{
	struct probe p;
	struct marker m = { .g = g };
	int rc = probe__init(&p, &g->vm, 0);
	T_CHECK_EQ(t, rc, 0);
	if (rc || pthread_create(&m.thread, NULL, marker__main, &m)) {
		probe__free(&p);
		T_CHECK(t, false);
		return;
	}
	uint64_t lost = 0, rounds = scaled(3000), marks, last = 0;
	for (uint64_t r = 0; r < rounds && !rc; r++) {
		/* the marker must get ahead between syncs; on a loaded machine
		 * (two cores under emulation) it can starve: give it up to 100 ms */
		for (int w = 0; w < 1000 && atomic_load(&m.done) < last + 2; w++)
			time__sleep_ns(100000);
		uint64_t done = atomic_load_explicit(&m.done, memory_order_acquire);
		last = done;
		rc = probe__sync(&p, r % 2, false);
		lost += mark__lost_since(&p, done);
		if (r % 8 == 7)
			time__sleep_ns(rng__next() % 1000000);
	}
	atomic_store(&m.stop, true);
	pthread_join(m.thread, NULL);
	marks = atomic_load(&m.done);
	if (!rc)
		rc = probe__final(&p);
	T_CHECK_EQ(t, rc, 0);
	printf("# mark_race: %" PRIu64 " syncs, %" PRIu64 " marks, %" PRIu64
	       " marks missing after the sync that followed them, %" PRIu64 " pages differ at the end\n",
	       p.rounds, marks, lost, p.mismatches);
	T_CHECK(t, marks > rounds);
	T_CHECK_EQ(t, lost, 0);
	T_CHECK_EQ(t, p.mismatches, 0);
	probe__free(&p);
}

static void t_mark(struct t *t)
{
	static const struct tcase c = { .name = "mark", .workload = "verify", .mb = 16 };
	struct guest g;
	if (tcase__boot(t, &c, &g, 1))
		goto out;
	T_CHECK_EQ(t, dirty__start(g.vm.dirty), 0);
	mark__exact(t, &g);
	mark__race(t, &g);
	T_CHECK_EQ(t, dirty__stop(g.vm.dirty), 0);
out:
	guest__destroy(&g);
}

/* ---------------------------------------------------------------- start / stop */

/* KVM keeps a dirty bitmap for a slot only while it logs. */
static int slot_log_errno(struct guest *g)
{
	static uint64_t buf[BITMAP_WORDS(MEM_SIZE / PG)];
	struct kvm_dirty_log log = { .slot = g->vm.ram.blocks[0].slot, .dirty_bitmap = buf };
	return ioctl(g->vm.vm_fd, KVM_GET_DIRTY_LOG, &log) < 0 ? errno : 0;
}

static void start_stop__cycle(struct t *t, struct guest *g, bool bitmap, unsigned cycle)
{
	struct plan pl = { 400, 2000, 16, 5 };
	struct probe p = { 0 };
	pl.rounds = scaled(pl.rounds);
	T_CHECK_EQ(t, dirty__start(g->vm.dirty), 0);
	T_CHECK(t, g->vm.ram.logging && dirty__active(g->vm.dirty));
	if (bitmap)
		T_CHECK_EQ(t, slot_log_errno(g), 0);
	int rc = probe__init(&p, &g->vm, (16ull + SCAN_SLACK_MB) << 8);
	if (!rc)
		rc = rounds__run(&p, &pl);
	if (!rc)
		rc = probe__final(&p);
	T_CHECK_EQ(t, rc, 0);
	char name[64];
	snprintf(name, sizeof(name), "%s_start_stop_cycle%u", bitmap ? "bitmap" : "ring", cycle);
	probe__print(&p, name, g);
	if (!rc)
		probe__check(t, &p, name);
	T_CHECK_EQ(t, dirty__stop(g->vm.dirty), 0);
	T_CHECK(t, !g->vm.ram.logging && !dirty__active(g->vm.dirty));
	if (bitmap)
		T_CHECK_EQ(t, slot_log_errno(g), ENOENT);
	bitmap__clear_all(&p.bm);
	T_CHECK_EQ(t, dirty__sync(g->vm.dirty, &p.bm, DIRTY_SYNC_KICK), -EINVAL);
	T_CHECK_EQ(t, dirty__stop(g->vm.dirty), 0);               /* idempotent */
	probe__free(&p);
}

static void start_stop__run(struct t *t, uint32_t ring)
{
	struct tcase c = { .name = "start_stop", .workload = "verify", .mb = 16, .ring = ring };
	struct guest g;
	if (tcase__boot(t, &c, &g, 1))
		goto out;
	if (!ring)
		T_CHECK_EQ(t, slot_log_errno(&g), ENOENT);
	for (unsigned i = 1; i <= 2; i++)
		start_stop__cycle(t, &g, !ring, i);
out:
	guest__destroy(&g);
}

static void t_bitmap_start_stop(struct t *t)
{
	start_stop__run(t, 0);
}

static void t_ring_start_stop(struct t *t)
{
	start_stop__run(t, 4096);
}

/* ---------------------------------------------------------------- rate restart */

/* Syncs every 20 ms until a ring rate period has closed with a rate, at
 * most 20 s: true if one did. */
static bool rate__wait_period(struct guest *g, struct bitmap *bm)
{
	for (unsigned i = 0; i < 1000; i++) {
		struct dirty_stats st;
		time__sleep_ns(20 * 1000000ull);
		if (dirty__sync(g->vm.dirty, bm, 0) < 0)
			return false;
		dirty__get_stats(g->vm.dirty, &st);
		if (st.rate_pages)
			return true;
	}
	return false;
}

/* The migration restarts the ring's rate after each throttle change, so
 * that a peak measured at the old speed is never read as one at the new
 * (the computed policy once asked for 93 % from an unthrottled peak):
 * right after dirty__rate_restart the peak is 0 (unknown), where without
 * it the reader gets the peak of before (the control, read first); a
 * period closed afterwards is reported again. */
static void t_ring_rate_restart(struct t *t)
{
	static const struct tcase c = { .name = "rate_restart", .workload = "stress",
					.mb = 16, .ring = 4096 };
	struct guest g;
	struct bitmap bm = { 0 };
	if (tcase__boot(t, &c, &g, 1))
		goto out;
	T_CHECK_EQ(t, bitmap__init(&bm, g.vm.ram.npages), 0);
	T_CHECK_EQ(t, dirty__start(g.vm.dirty), 0);
	T_CHECK(t, rate__wait_period(&g, &bm));
	uint64_t before = dirty__take_peak(g.vm.dirty);
	T_CHECK(t, before > 0);                         /* the control */
	dirty__rate_restart(g.vm.dirty);
	uint64_t after = dirty__take_peak(g.vm.dirty);
	struct dirty_stats st;
	dirty__get_stats(g.vm.dirty, &st);
	printf("# rate_restart: peak %" PRIu64 " pages/s before, %" PRIu64 " right after\n",
	       before, after);
	T_CHECK_EQ(t, after, 0);
	T_CHECK_EQ(t, st.rate_pages, 0);
	T_CHECK(t, rate__wait_period(&g, &bm));
	T_CHECK(t, dirty__take_peak(g.vm.dirty) > 0);
	T_CHECK_EQ(t, dirty__stop(g.vm.dirty), 0);
out:
	bitmap__free(&bm);
	guest__destroy(&g);
}

/* argv[1], if given, runs only the cases whose name contains it. */
#define RUN_CASE(t, fn, filter) do { \
	if (!(filter) || strstr(#fn, (filter))) \
		T_RUN(t, fn); \
} while (0)

int main(int argc, char **argv)
{
	struct t t = { 0 };
	const char *f = argc > 1 ? argv[1] : NULL;
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (kvm_missing("test_kvm_dirty"))
		return 1;
	if (access(GUEST_ELF, R_OK)) {
		printf("not ok test_kvm_dirty: %s missing (make guest)\n", GUEST_ELF);
		return 1;
	}
	uint64_t t0 = time__now_ms();
	RUN_CASE(&t, t_bitmap_verify, f);
	RUN_CASE(&t, t_ring4096_adaptive_verify, f);
	RUN_CASE(&t, t_ring4096_fixed_verify, f);
	RUN_CASE(&t, t_ring_small_verify, f);
	RUN_CASE(&t, t_ring_small_smp_verify, f);
	RUN_CASE(&t, t_bitmap_stress_smp, f);
	RUN_CASE(&t, t_ring4096_stress, f);
	RUN_CASE(&t, t_bitmap_deferred_verify, f);
	RUN_CASE(&t, t_bitmap_deferred_stress_smp, f);
	RUN_CASE(&t, t_bitmap_deferred_clear_late, f);
	RUN_CASE(&t, t_mark, f);
	RUN_CASE(&t, t_bitmap_start_stop, f);
	RUN_CASE(&t, t_ring_start_stop, f);
	RUN_CASE(&t, t_ring_rate_restart, f);
	printf("# test_kvm_dirty: %" PRIu64 " ms\n", time__now_ms() - t0);
	return T_DONE(&t);
}
