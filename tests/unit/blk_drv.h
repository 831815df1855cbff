/* The fake virtio-blk driver of the blk unit tests (test_blk.c): the
 * fake virtio-pci driver of vdrv.h (guest RAM, a PCI bus with the device,
 * one queue the test fills by hand) with the disk's requests on top, a
 * real image file in a temporary directory; for the error policy a
 * recorder of the device's error reports and a tmpfs of 1 MiB that the
 * writes fill (mounted here: root only).  No KVM. */
#ifndef KMIG_TESTS_BLK_DRV_H
#define KMIG_TESTS_BLK_DRV_H

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/timeutil.h"
#include "dev/blk.h"
#include "dev/blkfile.h"
#include "dev/pci.h"
#include "harness.h"
#include "vdrv.h"

#define RAM_SIZE (128ull << 20)
#define QBASE 0x100000ull     /* the one queue's rings (vdrv.h's layout) */
#define QSIZE 128
#define SLOT 5
#define BAR 0xe0008000ull
#define HDRS 0x200000ull      /* request headers, 16 bytes each */
#define STATS 0x300000ull     /* status bytes */
#define DATA 0x400000ull      /* data buffers */
#define IMG_SIZE (4ull << 20)

struct drv {
	struct vdrv v;            /* RAM, bus, queue 0, marks, the line */
	struct blkfile *f;
	struct blk *b;
	char path[160];
	uint16_t nreq;            /* requests made: their header and status slots */
};

static char tmpdir[64];

static void mkimage(const char *path, uint64_t size)
{
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	uint8_t buf[4096];
	for (uint64_t off = 0; fd >= 0 && off < size; off += sizeof(buf)) {
		memset(buf, (int)(0x40 + off / 4096 % 64), sizeof(buf));
		if (pwrite(fd, buf, sizeof(buf), (off_t)off) != (ssize_t)sizeof(buf))
			abort();
	}
	if (fd < 0 || ftruncate(fd, (off_t)size))
		abort();
	close(fd);
}

struct dopts {
	bool ro, wb, discard, inactive;
	uint32_t lbs;
	const char *serial;
	enum blk_on_error werror, rerror;
	void (*on_error)(void *ctx, const struct blk_io_error *e);
	void *error_ctx;
	const char *dir;          /* of the image; NULL: tmpdir */
	uint64_t size;            /* sparse image of this size (create); 0: IMG_SIZE, filled */
};

static int drv_init(struct drv *d, const char *name, const struct dopts *o, bool create)
{
	memset(d, 0, sizeof(*d));
	snprintf(d->path, sizeof(d->path), "%s/%s", o->dir ? o->dir : tmpdir, name);
	if (create && o->size) {
		int fd = open(d->path, O_RDWR | O_CREAT | O_TRUNC, 0600);
		if (fd < 0 || ftruncate(fd, (off_t)o->size))
			abort();
		close(fd);
	} else if (create) {
		mkimage(d->path, IMG_SIZE);
	}
	const struct vdrv_conf vc = { .ram_size = RAM_SIZE, .bar = BAR, .qbase = QBASE,
				      .qstride = VDRV_RING_BYTES, .nq = 1, .qsize = QSIZE,
				      .strict = true };
	if (vdrv__init(&d->v, &vc))
		abort();
	char err[256];
	struct blkfile_conf fc = { .path = d->path, .read_only = o->ro, .writethrough = !o->wb,
				   .discard_unmap = o->discard, .inactive = o->inactive };
	int rc = blkfile__open(&d->f, &fc, err, sizeof(err));
	if (rc)
		return rc;
	struct blk_conf c = {
		.ram = &d->v.ram, .mark = vdrv__mark, .mark_ctx = &d->v, .irq = vdrv__irq,
		.irq_ctx = &d->v, .irq_line = 5, .bar_gpa = BAR, .file = d->f,
		.logical_block_size = o->lbs ? o->lbs : 512, .writeback = o->wb, .discard = o->discard,
		.werror = o->werror, .rerror = o->rerror, .on_error = o->on_error,
		.error_ctx = o->error_ctx,
	};
	snprintf(c.serial, sizeof(c.serial), "%s", o->serial ? o->serial : "");
	if (blk__create(&d->b, &c) || vdrv__plug(&d->v, SLOT, blk__pci(d->b)))
		abort();
	return 0;
}

static void drv_fini(struct drv *d)
{
	blk__destroy(d->b);
	blkfile__close(d->f);
	vdrv__fini(&d->v);
}

/* Accepts everything offered, enables the queue: the status after. */
static uint8_t drv_start(struct drv *d)
{
	d->nreq = 0;
	(void)vdrv__start(&d->v, vdrv__offered(&d->v));
	return vdrv__status(&d->v);
}

/* Waits (5 s at most) until n chains in all were returned. */
static bool wait_used(struct drv *d, uint16_t n)
{
	return vdrv__wait_used(&d->v, 0, n, 5000) == 0;
}

static uint64_t hdr_gpa(uint16_t k) { return HDRS + 16ull * k; }
static uint64_t st_gpa(uint16_t k) { return STATS + k; }

static void put_hdr(struct drv *d, uint16_t k, uint32_t type, uint64_t sector)
{
	uint8_t *h = vdrv__host(&d->v, hdr_gpa(k));
	memset(h, 0, 16);
	memcpy(h, &type, 4);
	memcpy(h + 8, &sector, 8);
	*vdrv__host(&d->v, st_gpa(k)) = 0xee;
}

/* One request: header, optional data buffer, status; returns the request
 * number (its header and status slots); *head its chain. */
static uint16_t req(struct drv *d, uint32_t type, uint64_t sector, uint64_t data, uint32_t len,
		    bool data_w, uint16_t *head)
{
	uint16_t k = d->nreq++;
	put_hdr(d, k, type, sector);
	struct vdrv_seg s[3] = { { hdr_gpa(k), 16, false } };
	unsigned n = 1;
	if (len)
		s[n++] = (struct vdrv_seg){ data, len, data_w };
	s[n++] = (struct vdrv_seg){ st_gpa(k), 1, true };
	uint16_t h = vdrv__add_chain(&d->v, 0, s, n);
	if (head)
		*head = h;
	return k;
}

/* One request, kicked and waited for: its status byte. */
static uint8_t do_req(struct drv *d, uint32_t type, uint64_t sector, uint64_t data, uint32_t len,
		      bool data_w)
{
	uint16_t k = req(d, type, sector, data, len, data_w, NULL);
	vdrv__kick(&d->v, 0);
	if (!wait_used(d, d->v.avail_idx[0]))
		return 0xfe;
	return *vdrv__host(&d->v, st_gpa(k));
}

static void file_read(struct drv *d, uint64_t off, void *buf, size_t len)
{
	int fd = open(d->path, O_RDONLY);
	if (fd < 0 || pread(fd, buf, len, (off_t)off) != (ssize_t)len)
		abort();
	close(fd);
}

/* ---- the error policy: events, a file system that fills up ---- */

struct errs {
	pthread_mutex_t lock;
	struct blk_io_error e[64];
	unsigned n;
};

static void on_err(void *ctx, const struct blk_io_error *e)
{
	struct errs *x = ctx;
	pthread_mutex_lock(&x->lock);
	if (x->n < 64)
		x->e[x->n] = *e;
	x->n++;
	pthread_mutex_unlock(&x->lock);
}

/* Events so far; *all_like: each is (write, action, error). */
static unsigned errs_like(struct errs *x, bool write, enum blk_err_action a, int error,
			  bool *all_like)
{
	pthread_mutex_lock(&x->lock);
	unsigned n = x->n;
	*all_like = n > 0;
	for (unsigned i = 0; i < n && i < 64; i++)
		*all_like &= x->e[i].write == write && x->e[i].action == a && x->e[i].error == error;
	pthread_mutex_unlock(&x->lock);
	return n;
}

#define SMALL_SIZE "size=1M"
#define NFILL 8                      /* writes of FILL bytes: twice the small tmpfs */
#define FILL (256u << 10)

static char small_dir[96];

/* A tmpfs of 1 MiB at tmpdir/small (empty, or regrown to MiB when > 0). */
static int small_fs(unsigned mib)
{
	char opt[32];
	snprintf(small_dir, sizeof(small_dir), "%s/small", tmpdir);
	if (!mib) {
		(void)umount2(small_dir, MNT_DETACH);
		if (mkdir(small_dir, 0700) && errno != EEXIST)
			return -errno;
		return mount("kmig-test", small_dir, "tmpfs", 0, SMALL_SIZE) ? -errno : 0;
	}
	snprintf(opt, sizeof(opt), "size=%uM", mib);
	return mount("kmig-test", small_dir, "tmpfs", MS_REMOUNT, opt) ? -errno : 0;
}

/* A device over a sparse 4 MiB image on a fresh small tmpfs, started:
 * 0, or the failure (checked: not root, the mount is refused). */
static int full_disk(struct t *t, struct drv *d, struct dopts *o, const char *name)
{
	int rc = small_fs(0);
	T_CHECK_EQ(t, rc, 0);
	if (rc)
		return rc;
	o->dir = small_dir;
	o->size = 4u << 20;
	rc = drv_init(d, name, o, true);
	T_CHECK_EQ(t, rc, 0);
	if (!rc)
		drv_start(d);
	return rc;
}

/* NFILL writes of FILL bytes, each its own data (request k at byte
 * k * FILL), kicked; waits until each was answered or kept.  The count
 * kept. */
static unsigned fill(struct drv *d, uint16_t *k0)
{
	*k0 = d->nreq;
	for (unsigned i = 0; i < NFILL; i++) {
		memset(vdrv__host(&d->v, DATA + (uint64_t)i * FILL), 0x61 + (int)i, FILL);
		req(d, BLK_T_OUT, (uint64_t)i * FILL / 512, DATA + (uint64_t)i * FILL, FILL, false,
		    NULL);
	}
	vdrv__kick(&d->v, 0);
	struct blk_stats st = { 0 };
	for (int i = 0; i < 5000; i++) {
		blk__get_stats(d->b, &st);
		if (vdrv__used_idx(&d->v, 0) + st.kept == d->v.avail_idx[0] && !st.inflight)
			break;
		time__sleep_ns(1000000);
	}
	return (unsigned)st.kept;
}

/* Whether the image holds every request of fill() (none lost). */
static bool filled(struct drv *d)
{
	static uint8_t buf[FILL];
	bool ok = true;
	for (unsigned i = 0; i < NFILL && ok; i++) {
		file_read(d, (uint64_t)i * FILL, buf, FILL);
		ok = !memcmp(buf, vdrv__host(&d->v, DATA + (uint64_t)i * FILL), FILL);
	}
	return ok;
}

/* The guest RAM the device and the fake driver use, a to b (what a
 * migration's pages carry). */
static void copy_ram(struct drv *a, struct drv *b)
{
	static const uint64_t r[][2] = { { QBASE, VDRV_RING_BYTES }, { HDRS, 0x1000 },
					 { STATS, 0x1000 }, { DATA, (uint64_t)NFILL * FILL } };
	for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++)
		memcpy(ram__gpa_to_host(&b->v.ram, r[i][0], r[i][1]),
		       ram__gpa_to_host(&a->v.ram, r[i][0], r[i][1]), r[i][1]);
	b->v.avail_idx[0] = a->v.avail_idx[0], b->v.next_desc[0] = a->v.next_desc[0];
	b->nreq = a->nreq;
}

#endif
