/* mem/ram_wp: a snapshot of guest RAM taken while another thread writes
 * it (through read(2): a write of the kernel's, as KVM's for a vCPU).
 * RAM without KVM (vm_fd -1), a quarter of its pages never touched
 * (nothing mapped: the protection must hold for them too); a writer
 * thread rewrites random pages while this thread, as the background
 * snapshot's sender does, takes the write faults first and copies pages
 * in order, each before its release.  Every page copied must hold what it
 * held when protection began, and every write must land afterwards. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "base/bitmap.h"
#include "mem/ram_wp.h"

#define WRITES 20000
#define CHUNK 64

static unsigned long long rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void)
{
	return t_xorshift(&rng);
}

static void stamp(uint8_t *page, uint64_t p, uint8_t gen)
{
	memset(page, (int)(uint8_t)(p * 7 + gen), RAM_PAGE_SIZE);
	uint64_t tag = p << 8 | gen;
	memcpy(page, &tag, 8);
	memcpy(page + RAM_PAGE_SIZE - 8, &tag, 8);
}

static bool stamped(const uint8_t *page, uint64_t p, uint8_t gen)
{
	uint8_t want[RAM_PAGE_SIZE];
	stamp(want, p, gen);
	return !memcmp(page, want, RAM_PAGE_SIZE);
}

static bool is_zero(const uint8_t *page)
{
	for (unsigned i = 0; i < RAM_PAGE_SIZE; i++)
		if (page[i])
			return false;
	return true;
}

/* Every fourth 2 MiB range is never written before the snapshot (so no
 * transparent huge page maps it either), nor are the last 3 pages of
 * every other 64 KiB (mapped only where a huge page came). */
static bool untouched(uint64_t p)
{
	return (p / 512) % 4 == 3 || p % 16 >= 13;
}

struct writer {
	struct ram *ram;
	uint64_t *pages;            /* the pages written, in order */
	atomic_uint done;           /* writes made */
	int pipe[2];
};

/* Each page written by the kernel, as KVM writes for a vCPU: read(2) from
 * a pipe into guest RAM, the raw system call (no sanitizer's interceptor:
 * ThreadSanitizer cannot see the kernel hold the write until the page's
 * release, so it would take the kernel's ordering for a race). */
static void *writer__run(void *arg)
{
	struct writer *w = arg;
	uint8_t buf[RAM_PAGE_SIZE];
	for (unsigned i = 0; i < WRITES; i++) {
		stamp(buf, w->pages[i], 2);
		if (write(w->pipe[1], buf, sizeof(buf)) != (ssize_t)sizeof(buf) ||
		    syscall(SYS_read, w->pipe[0], ram__page_host(w->ram, w->pages[i]),
			    RAM_PAGE_SIZE) != RAM_PAGE_SIZE)
			break;
		atomic_store(&w->done, i + 1);
	}
	return NULL;
}

struct snap {
	struct ram_wp wp;
	struct ram *ram;
	struct bitmap copied;
	uint64_t wrong;             /* pages copied that did not hold the old data */
	uint64_t fault_copies;      /* pages copied because a write waited */
};

static void snap__copy(struct snap *s, uint64_t p)
{
	if (bitmap__test(&s->copied, p))
		return;
	bitmap__set(&s->copied, p);
	const uint8_t *h = ram__page_host(s->ram, p);
	if (untouched(p) ? !is_zero(h) : !stamped(h, p, 1))
		s->wrong++;
}

static int snap__faults(struct snap *s)
{
	uint64_t p;
	int rc;
	while ((rc = ram_wp__fault(&s->wp, &p)) == 1) {
		if (!bitmap__test(&s->copied, p))
			s->fault_copies++;
		snap__copy(s, p);
		rc = ram_wp__release(&s->wp, p, 1);
		if (rc)
			return rc;
	}
	return rc;
}

/* Guest RAM anonymous, or (shared) a file on tmpfs mapped shared, as a
 * memory-backend-file's (mem/memfile.h). */
static void ram_for_test(struct t *t, struct ram *ram, bool shared)
{
	if (!shared) {
		T_CHECK_EQ(t, ram__create(ram, -1, RAM_MIN_SIZE), 0);
		return;
	}
	char path[] = "/dev/shm/kmig-test-wp-XXXXXX";
	int fd = mkstemp(path);
	T_CHECK(t, fd >= 0 && ftruncate(fd, RAM_MIN_SIZE) == 0);
	unlink(path);
	T_CHECK_EQ(t, ram__create_shared(ram, -1, RAM_MIN_SIZE, fd), 0);
	close(fd);      /* the mapping holds the file */
}

static void snapshot_while_written(struct t *t, unsigned flags, bool shared)
{
	struct ram ram;
	ram_for_test(t, &ram, shared);
	for (uint64_t p = 0; p < ram.npages; p++)
		if (!untouched(p))
			stamp(ram__page_host(&ram, p), p, 1);
	struct writer w = { .ram = &ram, .pages = malloc(WRITES * sizeof(uint64_t)) };
	T_CHECK(t, w.pages != NULL);
	T_CHECK_EQ(t, pipe(w.pipe), 0);
	for (unsigned i = 0; i < WRITES; i++)
		w.pages[i] = rnd() % ram.npages;
	struct snap s = { .ram = &ram };
	T_CHECK_EQ(t, bitmap__init(&s.copied, ram.npages), 0);
	char err[256] = "";
	int rc = ram_wp__start(&s.wp, &ram, flags, err, sizeof(err));
	if (rc)
		printf("#   ram_wp__start: %s\n", err);
	T_CHECK_EQ(t, rc, 0);
	pthread_t th;
	T_CHECK_EQ(t, pthread_create(&th, NULL, writer__run, &w), 0);
	/* the writer's first write waits before the copying begins */
	struct pollfd pfd = { .fd = ram_wp__fd(&s.wp), .events = POLLIN };
	T_CHECK_EQ(t, poll(&pfd, 1, 10000), 1);
	for (uint64_t next = 0; !rc && next < ram.npages; next += CHUNK) {
		rc = snap__faults(&s);
		for (uint64_t p = next; p < next + CHUNK; p++)
			snap__copy(&s, p);
		if (!rc)
			rc = ram_wp__release(&s.wp, next, CHUNK);
	}
	T_CHECK_EQ(t, rc, 0);
	T_CHECK_EQ(t, snap__faults(&s), 0);
	pthread_join(th, NULL);
	T_CHECK_EQ(t, s.wrong, 0);
	T_CHECK_EQ(t, bitmap__count(&s.copied), ram.npages);
	T_CHECK(t, s.fault_copies >= 1);
	T_CHECK(t, s.wp.faults >= 1);
	printf("#   %llu write faults, %llu pages copied ahead of the scan for them; %s\n",
	       (unsigned long long)s.wp.faults, (unsigned long long)s.fault_copies,
	       s.wp.populated ? "unmapped pages were mapped for reading first" : shared ?
	       "shared memory: the kernel protected unmapped pages itself" :
	       "the kernel protected unmapped pages itself (UFFD_FEATURE_WP_UNPOPULATED)");
	/* every write landed: the last write of each page is there */
	T_CHECK_EQ(t, atomic_load(&w.done), WRITES);
	for (unsigned i = 0; i < WRITES; i++)
		T_CHECK(t, stamped(ram__page_host(&ram, w.pages[i]), w.pages[i], 2));
	ram_wp__stop(&s.wp);
	T_CHECK_EQ(t, ram_wp__fd(&s.wp), -1);
	bitmap__free(&s.copied);
	close(w.pipe[0]);
	close(w.pipe[1]);
	free(w.pages);
	ram__destroy(&ram);
}

static void t_snapshot_while_written(struct t *t)
{
	snapshot_while_written(t, 0, false);
}

/* Guest RAM in a memory file on tmpfs: shared memory, whose unmapped
 * pages the kernel protects itself (UFFD_FEATURE_WP_HUGETLBFS_SHMEM). */
static void t_snapshot_shared(struct t *t)
{
	snapshot_while_written(t, 0, true);
}

/* As a kernel before 6.4 must: every page mapped for reading first. */
static void t_snapshot_populated(struct t *t)
{
	snapshot_while_written(t, RAM_WP_POPULATE, false);
}

/* A stop (a cancelled snapshot) wakes a writer that waits on a page. */
static void t_stop_wakes(struct t *t)
{
	struct ram ram;
	T_CHECK_EQ(t, ram__create(&ram, -1, RAM_MIN_SIZE), 0);
	struct writer w = { .ram = &ram, .pages = calloc(WRITES, sizeof(uint64_t)) };
	T_CHECK_EQ(t, pipe(w.pipe), 0);
	for (unsigned i = 0; i < WRITES; i++)
		w.pages[i] = i % 3 ? 5 : ram.npages - 1;
	struct ram_wp wp;
	char err[256] = "";
	T_CHECK_EQ(t, ram_wp__start(&wp, &ram, 0, err, sizeof(err)), 0);
	pthread_t th;
	T_CHECK_EQ(t, pthread_create(&th, NULL, writer__run, &w), 0);
	struct pollfd pfd = { .fd = ram_wp__fd(&wp), .events = POLLIN };
	T_CHECK_EQ(t, poll(&pfd, 1, 10000), 1);
	T_CHECK_EQ(t, atomic_load(&w.done), 0);       /* it waits */
	T_CHECK_EQ(t, ram_wp__release(&wp, ram.npages, 1), -EINVAL);
	T_CHECK_EQ(t, ram_wp__release(&wp, 0, ram.npages + 1), -EINVAL);
	ram_wp__stop(&wp);
	pthread_join(th, NULL);
	T_CHECK_EQ(t, atomic_load(&w.done), WRITES);
	T_CHECK(t, stamped(ram__page_host(&ram, 5), 5, 2));
	ram_wp__stop(&wp);                            /* twice: harmless */
	close(w.pipe[0]);
	close(w.pipe[1]);
	free(w.pages);
	ram__destroy(&ram);
}

int main(void)
{
	struct t t = {0};
	T_RUN(&t, t_snapshot_while_written);
	T_RUN(&t, t_snapshot_populated);
	T_RUN(&t, t_snapshot_shared);
	T_RUN(&t, t_stop_wakes);
	printf("%d passed, %d failed\n", t.passed, t.failed);
	return T_DONE(&t);
}
