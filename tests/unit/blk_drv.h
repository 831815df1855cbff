/* The fake virtio-blk driver of the blk unit tests (test_blk.c): fake
 * guest RAM, a PCI bus with the device, a queue the test fills by hand,
 * a real image file in a temporary directory; for the error policy a
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

#define RAM_SIZE (128ull << 20)
#define QDESC 0x100000ull
#define QAVAIL 0x101000ull
#define QUSED 0x102000ull
#define QSIZE 128
#define SLOT 5
#define BAR 0xe0008000ull
#define HDRS 0x200000ull      /* request headers, 16 bytes each */
#define STATS 0x300000ull     /* status bytes */
#define DATA 0x400000ull      /* data buffers */
#define IMG_SIZE (4ull << 20)

struct mark_rec {
	uint64_t gpa, len;
};

struct drv {
	struct ram ram;
	struct pci_bus bus;
	struct blkfile *f;
	struct blk *b;
	char path[160];
	uint16_t avail_idx, next_desc, nreq;
	struct mark_rec marks[1024];
	unsigned nmarks;
	pthread_mutex_t mlock;
	int irq_level;
};

static char tmpdir[64];

static void mark(void *ctx, uint64_t gpa, uint64_t len)
{
	struct drv *d = ctx;
	pthread_mutex_lock(&d->mlock);
	if (d->nmarks < 1024)
		d->marks[d->nmarks++] = (struct mark_rec){ gpa, len };
	pthread_mutex_unlock(&d->mlock);
}

/* The marks come from the device's workers: read and reset under mlock
 * (a worker may still be reporting the used index of a request the test
 * already saw completed). */
static bool marked(struct drv *d, uint64_t gpa, uint64_t len)
{
	bool all = true;
	pthread_mutex_lock(&d->mlock);
	for (uint64_t a = gpa; a < gpa + len && all; a++) {
		bool in = false;
		for (unsigned i = 0; i < d->nmarks && !in; i++)
			in = a >= d->marks[i].gpa && a < d->marks[i].gpa + d->marks[i].len;
		all = in;
	}
	pthread_mutex_unlock(&d->mlock);
	return all;
}

static void marks_reset(struct drv *d)
{
	pthread_mutex_lock(&d->mlock);
	d->nmarks = 0;
	pthread_mutex_unlock(&d->mlock);
}

static void irq(void *ctx, bool level)
{
	((struct drv *)ctx)->irq_level = level;
}

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
	pthread_mutex_init(&d->mlock, NULL);
	snprintf(d->path, sizeof(d->path), "%s/%s", o->dir ? o->dir : tmpdir, name);
	if (create && o->size) {
		int fd = open(d->path, O_RDWR | O_CREAT | O_TRUNC, 0600);
		if (fd < 0 || ftruncate(fd, (off_t)o->size))
			abort();
		close(fd);
	} else if (create) {
		mkimage(d->path, IMG_SIZE);
	}
	if (ram__create(&d->ram, -1, RAM_SIZE))
		abort();
	pci__init(&d->bus);
	char err[256];
	struct blkfile_conf fc = { .path = d->path, .read_only = o->ro, .writethrough = !o->wb,
				   .discard_unmap = o->discard, .inactive = o->inactive };
	int rc = blkfile__open(&d->f, &fc, err, sizeof(err));
	if (rc)
		return rc;
	struct blk_conf c = {
		.ram = &d->ram, .mark = mark, .mark_ctx = d, .irq = irq, .irq_ctx = d,
		.irq_line = 5, .bar_gpa = BAR, .file = d->f,
		.logical_block_size = o->lbs ? o->lbs : 512, .writeback = o->wb, .discard = o->discard,
		.werror = o->werror, .rerror = o->rerror, .on_error = o->on_error,
		.error_ctx = o->error_ctx,
	};
	snprintf(c.serial, sizeof(c.serial), "%s", o->serial ? o->serial : "");
	if (blk__create(&d->b, &c) || pci__add(&d->bus, SLOT, blk__pci(d->b)))
		abort();
	return 0;
}

static void drv_fini(struct drv *d)
{
	blk__destroy(d->b);
	blkfile__close(d->f);
	pci__destroy(&d->bus);
	ram__destroy(&d->ram);
}

static uint64_t mr(struct drv *d, uint64_t off, unsigned len)
{
	uint64_t v = 0;
	if (!pci__mmio(&d->bus, BAR + off, false, &v, len))
		return ~0ull;
	return v;
}

static void mw(struct drv *d, uint64_t off, uint64_t v, unsigned len)
{
	if (!pci__mmio(&d->bus, BAR + off, true, &v, len))
		abort();
}

static uint8_t *host(struct drv *d, uint64_t gpa)
{
	return ram__gpa_to_host(&d->ram, gpa, 1);
}

static uint8_t dev_status(struct drv *d)
{
	return (uint8_t)mr(d, VIRTIO_PCI_COMMON + VIRTIO_PCI_STATUS, 1);
}

static uint64_t offered(struct drv *d)
{
	mw(d, VIRTIO_PCI_DFSELECT, 0, 4);
	uint64_t f = mr(d, VIRTIO_PCI_DF, 4);
	mw(d, VIRTIO_PCI_DFSELECT, 1, 4);
	return f | mr(d, VIRTIO_PCI_DF, 4) << 32;
}

/* Accepts everything offered, enables the queue. */
static uint8_t drv_start(struct drv *d)
{
	uint64_t features = offered(d);
	mw(d, VIRTIO_PCI_STATUS, 0, 1);
	mw(d, VIRTIO_PCI_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER, 1);
	mw(d, VIRTIO_PCI_GFSELECT, 0, 4);
	mw(d, VIRTIO_PCI_GF, features & 0xffffffff, 4);
	mw(d, VIRTIO_PCI_GFSELECT, 1, 4);
	mw(d, VIRTIO_PCI_GF, features >> 32, 4);
	mw(d, VIRTIO_PCI_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER |
	   VIRTIO_STATUS_FEATURES_OK, 1);
	d->avail_idx = d->next_desc = d->nreq = 0;
	memset(host(d, QDESC), 0, 0x3000);
	mw(d, VIRTIO_PCI_Q_SELECT, 0, 2);
	mw(d, VIRTIO_PCI_Q_SIZE, QSIZE, 2);
	mw(d, VIRTIO_PCI_Q_DESC, QDESC, 8);
	mw(d, VIRTIO_PCI_Q_AVAIL, QAVAIL, 8);
	mw(d, VIRTIO_PCI_Q_USED, QUSED, 8);
	mw(d, VIRTIO_PCI_Q_ENABLE, 1, 2);
	mw(d, VIRTIO_PCI_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER |
	   VIRTIO_STATUS_FEATURES_OK | VIRTIO_STATUS_DRIVER_OK, 1);
	return dev_status(d);
}

struct seg {
	uint64_t gpa;
	uint32_t len;
	bool w;
};

static uint16_t add_chain(struct drv *d, const struct seg *s, unsigned n)
{
	uint16_t head = d->next_desc;
	for (unsigned i = 0; i < n; i++) {
		uint16_t idx = (uint16_t)((head + i) % QSIZE);
		uint8_t *p = host(d, QDESC + 16u * idx);
		uint16_t flags = (uint16_t)((s[i].w ? VIRTQ_DESC_F_WRITE : 0) |
					    (i + 1 < n ? VIRTQ_DESC_F_NEXT : 0));
		uint16_t next = (uint16_t)((idx + 1) % QSIZE);
		memcpy(p, &s[i].gpa, 8);
		memcpy(p + 8, &s[i].len, 4);
		memcpy(p + 12, &flags, 2);
		memcpy(p + 14, &next, 2);
	}
	d->next_desc = (uint16_t)((head + n) % QSIZE);
	uint16_t slot = d->avail_idx % QSIZE;
	memcpy(host(d, QAVAIL + 4 + 2u * slot), &head, 2);
	d->avail_idx++;
	__atomic_store_n((uint16_t *)host(d, QAVAIL + 2), d->avail_idx, __ATOMIC_RELEASE);
	return head;
}

static void kick(struct drv *d)
{
	mw(d, VIRTIO_PCI_NOTIFY, 0, 2);
}

static uint16_t used_idx(struct drv *d)
{
	return __atomic_load_n((uint16_t *)host(d, QUSED + 2), __ATOMIC_ACQUIRE);
}

/* Waits (5 s at most) until n chains in all were returned. */
static bool wait_used(struct drv *d, uint16_t n)
{
	for (int i = 0; i < 5000 && used_idx(d) != n; i++)
		time__sleep_ns(1000000);
	return used_idx(d) == n;
}

static uint32_t used_len_of(struct drv *d, uint16_t head)
{
	uint16_t n = used_idx(d);
	for (uint16_t i = 0; i < n; i++) {
		uint32_t e[2];
		memcpy(e, host(d, QUSED + 4 + 8u * (i % QSIZE)), 8);
		if (e[0] == head)
			return e[1];
	}
	return ~0u;
}

static uint64_t hdr_gpa(uint16_t k) { return HDRS + 16ull * k; }
static uint64_t st_gpa(uint16_t k) { return STATS + k; }

static void put_hdr(struct drv *d, uint16_t k, uint32_t type, uint64_t sector)
{
	uint8_t *h = host(d, hdr_gpa(k));
	memset(h, 0, 16);
	memcpy(h, &type, 4);
	memcpy(h + 8, &sector, 8);
	*host(d, st_gpa(k)) = 0xee;
}

/* One request: header, optional data buffer, status; returns the request
 * number (its header and status slots); *head its chain. */
static uint16_t req(struct drv *d, uint32_t type, uint64_t sector, uint64_t data, uint32_t len,
		    bool data_w, uint16_t *head)
{
	uint16_t k = d->nreq++;
	put_hdr(d, k, type, sector);
	struct seg s[3] = { { hdr_gpa(k), 16, false } };
	unsigned n = 1;
	if (len)
		s[n++] = (struct seg){ data, len, data_w };
	s[n++] = (struct seg){ st_gpa(k), 1, true };
	uint16_t h = add_chain(d, s, n);
	if (head)
		*head = h;
	return k;
}

/* One request, kicked and waited for: its status byte. */
static uint8_t do_req(struct drv *d, uint32_t type, uint64_t sector, uint64_t data, uint32_t len,
		      bool data_w)
{
	uint16_t k = req(d, type, sector, data, len, data_w, NULL);
	kick(d);
	if (!wait_used(d, d->avail_idx))
		return 0xfe;
	return *host(d, st_gpa(k));
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
		memset(host(d, DATA + (uint64_t)i * FILL), 0x61 + (int)i, FILL);
		req(d, BLK_T_OUT, (uint64_t)i * FILL / 512, DATA + (uint64_t)i * FILL, FILL, false,
		    NULL);
	}
	kick(d);
	struct blk_stats st = { 0 };
	for (int i = 0; i < 5000; i++) {
		blk__get_stats(d->b, &st);
		if (used_idx(d) + st.kept == d->avail_idx && !st.inflight)
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
		ok = !memcmp(buf, host(d, DATA + (uint64_t)i * FILL), FILL);
	}
	return ok;
}

/* The guest RAM the device and the fake driver use, a to b (what a
 * migration's pages carry). */
static void copy_ram(struct drv *a, struct drv *b)
{
	static const uint64_t r[][2] = { { QDESC, 0x3000 }, { HDRS, 0x1000 }, { STATS, 0x1000 },
					 { DATA, (uint64_t)NFILL * FILL } };
	for (size_t i = 0; i < sizeof(r) / sizeof(r[0]); i++)
		memcpy(ram__gpa_to_host(&b->ram, r[i][0], r[i][1]),
		       ram__gpa_to_host(&a->ram, r[i][0], r[i][1]), r[i][1]);
	b->avail_idx = a->avail_idx, b->next_desc = a->next_desc, b->nreq = a->nreq;
}

#endif
