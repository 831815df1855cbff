/* mem/memfile: guest RAM in a shared file, its locks and the hand-over
 * token; ram__create_shared and ram__discard over it.  Real files, real
 * open file description locks, no KVM. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "mem/memfile.h"
#include "mem/ram.h"

#define SIZE RAM_MIN_SIZE

static char dir[] = "/tmp/kmig-memfile-XXXXXX";
static char path[256];
static char err[512];

static void t_fresh_path(const char *name)
{
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	unlink(path);
}

static off_t t_size(void)
{
	struct stat st;
	return stat(path, &st) ? -1 : st.st_size;
}

static void t_boot_owns(struct t *t)
{
	struct memfile a, b, c;
	enum memfile_state st = 0;
	uint64_t tok = 0;
	t_fresh_path("boot");
	T_CHECK_EQ(t, memfile__open(&a, path, SIZE, true, err, sizeof(err)), 0);
	T_CHECK_EQ(t, t_size(), SIZE + MEMFILE_TRAILER);
	T_CHECK(t, a.owner && a.fresh);
	T_CHECK_EQ(t, memfile__read_trailer(&a, &st, &tok), 0);
	T_CHECK(t, st == MEMFILE_RUNNING && tok != 0);
	/* a second boot on the file is refused; a waiting destination is not */
	T_CHECK_EQ(t, memfile__open(&b, path, SIZE, true, err, sizeof(err)), -EAGAIN);
	T_CHECK(t, strstr(err, "in use by another VM") != NULL);
	T_CHECK_EQ(t, memfile__open(&c, path, SIZE, false, err, sizeof(err)), 0);
	T_CHECK(t, !c.owner);
	/* and while that one has it open, no boot either */
	memfile__close(&a);
	T_CHECK_EQ(t, memfile__open(&b, path, SIZE, true, err, sizeof(err)), -EAGAIN);
	memfile__close(&c);
	T_CHECK_EQ(t, memfile__open(&b, path, SIZE, true, err, sizeof(err)), 0);
	memfile__close(&b);
}

/* The source's RAM is the destination's: the same bytes through two maps. */
static void t_shared_mapping(struct t *t)
{
	struct memfile a, b;
	struct ram ra, rb;
	t_fresh_path("map");
	T_CHECK_EQ(t, memfile__open(&a, path, SIZE, true, err, sizeof(err)), 0);
	T_CHECK_EQ(t, memfile__open(&b, path, SIZE, false, err, sizeof(err)), 0);
	T_CHECK_EQ(t, ram__create_shared(&ra, -1, SIZE, a.fd), 0);
	T_CHECK_EQ(t, ram__create_shared(&rb, -1, SIZE, b.fd), 0);
	T_CHECK(t, ra.shared && rb.shared && ra.base != rb.base);
	T_CHECK_EQ(t, (uintptr_t)ra.base % (2u << 20), 0);
	memset(ram__page_host(&ra, 7), 0x5a, RAM_PAGE_SIZE);
	T_CHECK_EQ(t, ram__page_host(&rb, 7)[100], 0x5a);
	/* a discard punches the file: both see zeros, and so does a read */
	T_CHECK_EQ(t, ram__discard(&ra, ram__page_host(&ra, 7), RAM_PAGE_SIZE), 0);
	T_CHECK_EQ(t, ram__page_host(&rb, 7)[100], 0);
	uint8_t byte = 1;
	T_CHECK_EQ(t, pread(a.fd, &byte, 1, 7 * RAM_PAGE_SIZE + 100), 1);
	T_CHECK_EQ(t, byte, 0);
	/* the trailer is not guest RAM: writing RAM's last page leaves it */
	memset(ram__page_host(&ra, ra.npages - 1), 0xff, RAM_PAGE_SIZE);
	enum memfile_state st = 0;
	uint64_t tok = 0;
	T_CHECK_EQ(t, memfile__read_trailer(&a, &st, &tok), 0);
	ram__destroy(&ra);
	ram__destroy(&rb);
	memfile__close(&a);
	memfile__close(&b);
}

static void t_hand_over(struct t *t)
{
	struct memfile a, b;
	uint64_t token = 0, tok = 0;
	enum memfile_state st = 0;
	t_fresh_path("hand");
	T_CHECK_EQ(t, memfile__open(&a, path, SIZE, true, err, sizeof(err)), 0);
	T_CHECK_EQ(t, memfile__open(&b, path, SIZE, false, err, sizeof(err)), 0);
	/* before the hand-over the source owns it */
	T_CHECK_EQ(t, memfile__take_over(&b, 1, err, sizeof(err)), -EAGAIN);
	T_CHECK_EQ(t, memfile__hand_over(&a, &token), 0);
	T_CHECK(t, token != 0 && !a.owner);
	T_CHECK_EQ(t, memfile__read_trailer(&a, &st, &tok), 0);
	T_CHECK(t, st == MEMFILE_HANDED_OVER && tok == token);
	/* another token (another migration's, a second restore) is refused */
	T_CHECK_EQ(t, memfile__take_over(&b, token + 1, err, sizeof(err)), -ESTALE);
	T_CHECK(t, strstr(err, "handed over by another migration") != NULL);
	T_CHECK(t, !b.owner);
	T_CHECK_EQ(t, memfile__take_over(&b, token, err, sizeof(err)), 0);
	T_CHECK(t, b.owner);
	T_CHECK_EQ(t, memfile__read_trailer(&b, &st, &tok), 0);
	T_CHECK(t, st == MEMFILE_RUNNING && tok != token);
	/* the source cannot take it back now, nor once the destination quit */
	T_CHECK_EQ(t, memfile__take_back(&a, err, sizeof(err)), -EAGAIN);
	memfile__close(&b);
	T_CHECK_EQ(t, memfile__take_back(&a, err, sizeof(err)), -ESTALE);
	T_CHECK(t, strstr(err, "a VM has run the guest in it since") != NULL);
	/* the same token twice: the second take-over is refused */
	T_CHECK_EQ(t, memfile__open(&b, path, SIZE, false, err, sizeof(err)), 0);
	T_CHECK_EQ(t, memfile__take_over(&b, token, err, sizeof(err)), -ESTALE);
	memfile__close(&a);
	memfile__close(&b);
}

/* A hand-over nobody took: the source takes its RAM back (and a state
 * file saved with that token is void from then on). */
static void t_take_back(struct t *t)
{
	struct memfile a, b;
	uint64_t token = 0, tok = 0;
	enum memfile_state st = 0;
	t_fresh_path("back");
	T_CHECK_EQ(t, memfile__open(&a, path, SIZE, true, err, sizeof(err)), 0);
	T_CHECK_EQ(t, memfile__take_back(&a, err, sizeof(err)), 0);   /* never handed */
	T_CHECK_EQ(t, memfile__hand_over(&a, &token), 0);
	T_CHECK_EQ(t, memfile__take_back(&a, err, sizeof(err)), 0);
	T_CHECK(t, a.owner);
	T_CHECK_EQ(t, memfile__read_trailer(&a, &st, &tok), 0);
	T_CHECK(t, st == MEMFILE_RUNNING && tok != token);
	T_CHECK_EQ(t, memfile__open(&b, path, SIZE, false, err, sizeof(err)), 0);
	T_CHECK_EQ(t, memfile__take_over(&b, token, err, sizeof(err)), -EAGAIN);
	memfile__close(&a);
	T_CHECK_EQ(t, memfile__take_over(&b, token, err, sizeof(err)), -ESTALE);
	memfile__close(&b);
	/* RAM handed over and not taken (a state-only save's): a boot does
	 * not empty it; the restore still finds it */
	T_CHECK_EQ(t, memfile__open(&a, path, SIZE, true, err, sizeof(err)), 0);
	T_CHECK_EQ(t, memfile__hand_over(&a, &token), 0);
	memfile__close(&a);
	T_CHECK_EQ(t, memfile__open(&a, path, SIZE, true, err, sizeof(err)), -EBUSY);
	T_CHECK(t, strstr(err, "handed over and not taken") != NULL);
	T_CHECK_EQ(t, memfile__open(&b, path, SIZE, false, err, sizeof(err)), 0);
	T_CHECK_EQ(t, memfile__take_over(&b, token, err, sizeof(err)), 0);
	memfile__close(&b);
}

/* A destination receiving pages owns the file and starts from zeros; not
 * while a source runs on it. */
static void t_claim(struct t *t)
{
	struct memfile a, b;
	struct ram rb;
	t_fresh_path("claim");
	T_CHECK_EQ(t, memfile__open(&a, path, SIZE, true, err, sizeof(err)), 0);
	T_CHECK_EQ(t, memfile__open(&b, path, SIZE, false, err, sizeof(err)), 0);
	T_CHECK_EQ(t, ram__create_shared(&rb, -1, SIZE, b.fd), 0);
	memset(ram__page_host(&rb, 3), 0x77, RAM_PAGE_SIZE);   /* the source's data */
	T_CHECK_EQ(t, memfile__claim(&b, err, sizeof(err)), -EAGAIN);
	T_CHECK(t, strstr(err, "needs x-ignore-shared") != NULL);
	T_CHECK_EQ(t, ram__page_host(&rb, 3)[9], 0x77);   /* untouched */
	memfile__close(&a);
	T_CHECK_EQ(t, memfile__claim(&b, err, sizeof(err)), 0);
	T_CHECK(t, b.owner && b.fresh);
	T_CHECK_EQ(t, ram__page_host(&rb, 3)[9], 0);
	T_CHECK_EQ(t, memfile__claim(&b, err, sizeof(err)), 0);   /* idempotent */
	ram__destroy(&rb);
	memfile__close(&b);
	/* nor while a source that handed its RAM over still has it open (a
	 * state-only save's source in postmigrate), nor after it quit: the
	 * RAM waits for the save's restore */
	uint64_t token;
	t_fresh_path("claim2");
	T_CHECK_EQ(t, memfile__open(&a, path, SIZE, true, err, sizeof(err)), 0);
	T_CHECK_EQ(t, memfile__hand_over(&a, &token), 0);
	T_CHECK_EQ(t, memfile__open(&b, path, SIZE, false, err, sizeof(err)), 0);
	T_CHECK_EQ(t, memfile__claim(&b, err, sizeof(err)), -EAGAIN);
	memfile__close(&a);
	T_CHECK_EQ(t, memfile__claim(&b, err, sizeof(err)), -EBUSY);
	T_CHECK(t, strstr(err, "handed over and not taken") != NULL);
	T_CHECK(t, !memfile__owner(&b));
	/* the restore still finds it */
	T_CHECK_EQ(t, memfile__take_over(&b, token, err, sizeof(err)), 0);
	/* and a destination whose guest did not run gives it back */
	T_CHECK_EQ(t, memfile__give_back(&b, token), 0);
	T_CHECK(t, !memfile__owner(&b));
	T_CHECK_EQ(t, memfile__take_over(&b, token, err, sizeof(err)), 0);
	memfile__close(&b);
}

static void t_bad_files(struct t *t)
{
	struct memfile f;
	t_fresh_path("odd");
	int fd = open(path, O_CREAT | O_WRONLY, 0600);
	T_CHECK(t, fd >= 0 && write(fd, "x", 1) == 1);
	close(fd);
	T_CHECK_EQ(t, memfile__open(&f, path, SIZE, false, err, sizeof(err)), -EINVAL);
	T_CHECK(t, strstr(err, "holds 1 bytes") != NULL);
	/* a boot takes any file and empties it */
	T_CHECK_EQ(t, memfile__open(&f, path, SIZE, true, err, sizeof(err)), 0);
	T_CHECK_EQ(t, t_size(), SIZE + MEMFILE_TRAILER);
	uint8_t first = 1;
	T_CHECK_EQ(t, pread(f.fd, &first, 1, 0), 1);
	T_CHECK_EQ(t, first, 0);
	memfile__close(&f);
	/* a new file is sized for a destination (and holds no hand-over) */
	t_fresh_path("new");
	T_CHECK_EQ(t, memfile__open(&f, path, SIZE, false, err, sizeof(err)), 0);
	T_CHECK_EQ(t, t_size(), SIZE + MEMFILE_TRAILER);
	T_CHECK_EQ(t, memfile__take_over(&f, 42, err, sizeof(err)), -ESTALE);
	T_CHECK(t, strstr(err, "no kmig trailer") != NULL);
	memfile__close(&f);
	/* a trailer whose magic is damaged holds no hand-over either */
	struct memfile a;
	uint64_t token;
	t_fresh_path("magic");
	T_CHECK_EQ(t, memfile__open(&a, path, SIZE, true, err, sizeof(err)), 0);
	T_CHECK_EQ(t, memfile__hand_over(&a, &token), 0);
	T_CHECK_EQ(t, pwrite(a.fd, "X", 1, SIZE), 1);
	T_CHECK_EQ(t, memfile__take_back(&a, err, sizeof(err)), -ESTALE);
	memfile__close(&a);
	T_CHECK_EQ(t, memfile__open(&f, dir, SIZE, false, err, sizeof(err)), -EISDIR);
}

int main(void)
{
	struct t t = { 0 };
	if (!mkdtemp(dir))
		return 1;
	T_RUN(&t, t_boot_owns);
	T_RUN(&t, t_shared_mapping);
	T_RUN(&t, t_hand_over);
	T_RUN(&t, t_take_back);
	T_RUN(&t, t_claim);
	T_RUN(&t, t_bad_files);
	const char *names[] = { "boot", "map", "hand", "back", "claim", "claim2", "odd", "new",
				"magic" };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		t_fresh_path(names[i]);
	}
	rmdir(dir);
	return T_DONE(&t);
}
