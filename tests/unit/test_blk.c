/* The virtio-blk device model, driven by a fake driver over fake guest
 * RAM, its backend a real image file in a temporary directory: requests
 * land at the right offsets and in the right buffers, flush, discard and
 * write-zeroes (holes seen with SEEK_HOLE), GET_ID, every refusal, every
 * guest write reported, the drain, the state section (hostile ones too),
 * the option parser and the OFD image locks with their hand-over.  No KVM. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/timeutil.h"
#include "ctl/blk_opts.h"
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
};

static int drv_init(struct drv *d, const char *name, const struct dopts *o, bool create)
{
	memset(d, 0, sizeof(*d));
	pthread_mutex_init(&d->mlock, NULL);
	snprintf(d->path, sizeof(d->path), "%s/%s", tmpdir, name);
	if (create)
		mkimage(d->path, IMG_SIZE);
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

/* ---------------- tests ---------------- */

static void t_config(struct t *t)
{
	struct drv d;
	struct dopts o = { .wb = true, .discard = true };
	T_CHECK_EQ(t, drv_init(&d, "cfg.img", &o, true), 0);
	uint64_t f = offered(&d);
	uint64_t want = 1ull << BLK_F_SIZE_MAX | 1ull << BLK_F_SEG_MAX | 1ull << BLK_F_BLK_SIZE |
			1ull << BLK_F_FLUSH | 1ull << BLK_F_DISCARD | 1ull << BLK_F_WRITE_ZEROES |
			1ull << BLK_F_TOPOLOGY | 1ull << VIRTIO_F_VERSION_1;
	T_CHECK_EQ(t, f, want);
	T_CHECK_EQ(t, mr(&d, VIRTIO_PCI_DEVCFG + 0, 8), IMG_SIZE / 512);
	T_CHECK_EQ(t, mr(&d, VIRTIO_PCI_DEVCFG + 20, 4), 512);
	T_CHECK_EQ(t, mr(&d, VIRTIO_PCI_DEVCFG + 12, 4), BLK_SEG_MAX);
	T_CHECK_EQ(t, mr(&d, VIRTIO_PCI_DEVCFG + 32, 1), 1);
	T_CHECK_EQ(t, mr(&d, VIRTIO_PCI_DEVCFG + 40, 4), BLK_MAX_SEGS);
	T_CHECK(t, drv_start(&d) & VIRTIO_STATUS_DRIVER_OK);
	drv_fini(&d);
	/* read-only, no write cache, no discard */
	struct dopts r = { .ro = true };
	T_CHECK_EQ(t, drv_init(&d, "cfg.img", &r, false), 0);
	f = offered(&d);
	T_CHECK(t, f & 1ull << BLK_F_RO);
	T_CHECK(t, !(f & (1ull << BLK_F_FLUSH | 1ull << BLK_F_DISCARD | 1ull << BLK_F_WRITE_ZEROES)));
	drv_fini(&d);
}

static void t_read_write(struct t *t)
{
	struct drv d;
	struct dopts o = { .wb = true };
	T_CHECK_EQ(t, drv_init(&d, "rw.img", &o, true), 0);
	drv_start(&d);
	uint8_t *w = host(&d, DATA);
	for (unsigned i = 0; i < 8192; i++)
		w[i] = (uint8_t)(i * 13 + 1);
	T_CHECK_EQ(t, do_req(&d, BLK_T_OUT, 24, DATA, 8192, false), BLK_S_OK);
	uint8_t f[8192];
	file_read(&d, 24 * 512, f, sizeof(f));
	T_CHECK(t, !memcmp(f, w, sizeof(f)));
	/* the bytes before and after are untouched */
	uint8_t edge[2];
	file_read(&d, 24 * 512 - 1, edge, 1);
	file_read(&d, 24 * 512 + 8192, edge + 1, 1);
	T_CHECK_EQ(t, edge[0], 0x40 + (24 * 512 - 1) / 4096);
	T_CHECK_EQ(t, edge[1], 0x40 + (24 * 512 + 8192) / 4096);
	/* read it back into another buffer, split over two descriptors */
	marks_reset(&d);
	uint16_t k = d.nreq++, head;
	put_hdr(&d, k, BLK_T_IN, 24);
	memset(host(&d, DATA + 0x10000), 0, 8192);
	struct seg s[4] = { { hdr_gpa(k), 16, false }, { DATA + 0x10000, 1000, true },
			    { DATA + 0x20000, 8192 - 1000, true }, { st_gpa(k), 1, true } };
	head = add_chain(&d, s, 4);
	kick(&d);
	T_CHECK(t, wait_used(&d, d.avail_idx));
	T_CHECK_EQ(t, *host(&d, st_gpa(k)), BLK_S_OK);
	T_CHECK(t, !memcmp(host(&d, DATA + 0x10000), w, 1000));
	T_CHECK(t, !memcmp(host(&d, DATA + 0x20000), w + 1000, 8192 - 1000));
	T_CHECK_EQ(t, used_len_of(&d, head), 8192 + 1);
	/* every byte the device wrote was reported */
	T_CHECK(t, marked(&d, DATA + 0x10000, 1000));
	T_CHECK(t, marked(&d, DATA + 0x20000, 8192 - 1000));
	T_CHECK(t, marked(&d, st_gpa(k), 1));
	T_CHECK(t, marked(&d, QUSED + 2, 2));
	T_CHECK(t, marked(&d, QUSED + 4 + 8u * ((d.avail_idx - 1) % QSIZE), 8));
	T_CHECK(t, d.irq_level);
	/* the last sector of the image */
	T_CHECK_EQ(t, do_req(&d, BLK_T_IN, IMG_SIZE / 512 - 1, DATA, 512, true), BLK_S_OK);
	struct blk_stats st;
	blk__get_stats(d.b, &st);
	T_CHECK_EQ(t, st.wr_ops, 1);
	T_CHECK_EQ(t, st.rd_ops, 2);
	T_CHECK_EQ(t, st.rd_bytes, 8192 + 512);
	T_CHECK_EQ(t, st.inflight, 0);
	drv_fini(&d);
}

static void t_flush_discard_zeroes(struct t *t)
{
	struct drv d;
	struct dopts o = { .wb = true, .discard = true };
	T_CHECK_EQ(t, drv_init(&d, "dz.img", &o, true), 0);
	drv_start(&d);
	struct blkfile_stats fs0, fs1;
	blkfile__get_stats(d.f, &fs0);
	memset(host(&d, DATA), 0x77, 4096);
	T_CHECK_EQ(t, do_req(&d, BLK_T_OUT, 0, DATA, 4096, false), BLK_S_OK);
	T_CHECK_EQ(t, do_req(&d, BLK_T_FLUSH, 0, 0, 0, false), BLK_S_OK);
	blkfile__get_stats(d.f, &fs1);
	T_CHECK_EQ(t, fs1.flushes, fs0.flushes + 1);
	/* discard 1 MiB at 1 MiB: a hole */
	uint8_t *seg = host(&d, DATA + 0x1000);
	uint64_t sector = 2048;
	uint32_t num = 2048, flags = 0;
	memcpy(seg, &sector, 8);
	memcpy(seg + 8, &num, 4);
	memcpy(seg + 12, &flags, 4);
	T_CHECK_EQ(t, do_req(&d, BLK_T_DISCARD, 0, DATA + 0x1000, 16, false), BLK_S_OK);
	int fd = open(d.path, O_RDONLY);
	off_t hole = lseek(fd, 1 << 20, SEEK_HOLE);
	T_CHECK_EQ(t, hole, 1 << 20);
	T_CHECK_EQ(t, lseek(fd, 1 << 20, SEEK_DATA), 2 << 20);
	/* write zeroes (no unmap) on 8 KiB at 3 MiB: reads zero */
	sector = 6144, num = 16, flags = 0;
	memcpy(seg, &sector, 8);
	memcpy(seg + 8, &num, 4);
	memcpy(seg + 12, &flags, 4);
	T_CHECK_EQ(t, do_req(&d, BLK_T_WRITE_ZEROES, 0, DATA + 0x1000, 16, false), BLK_S_OK);
	uint8_t z[8192], zero[8192] = { 0 };
	file_read(&d, 3 << 20, z, sizeof(z));
	T_CHECK(t, !memcmp(z, zero, sizeof(z)));
	/* with unmap allowed: a hole too */
	sector = 4096, num = 2048, flags = 1;
	memcpy(seg, &sector, 8);
	memcpy(seg + 8, &num, 4);
	memcpy(seg + 12, &flags, 4);
	T_CHECK_EQ(t, do_req(&d, BLK_T_WRITE_ZEROES, 0, DATA + 0x1000, 16, false), BLK_S_OK);
	T_CHECK_EQ(t, lseek(fd, 2 << 20, SEEK_HOLE), 2 << 20);
	close(fd);
	/* discard with the unmap flag, or any flag: UNSUPP; a range past the end: IOERR */
	flags = 1;
	memcpy(seg + 12, &flags, 4);
	T_CHECK_EQ(t, do_req(&d, BLK_T_DISCARD, 0, DATA + 0x1000, 16, false), BLK_S_UNSUPP);
	sector = IMG_SIZE / 512 - 1, num = 2, flags = 0;
	memcpy(seg, &sector, 8);
	memcpy(seg + 8, &num, 4);
	memcpy(seg + 12, &flags, 4);
	T_CHECK_EQ(t, do_req(&d, BLK_T_DISCARD, 0, DATA + 0x1000, 16, false), BLK_S_IOERR);
	/* 33 segments, or a length not a multiple of 16: IOERR */
	memset(host(&d, DATA + 0x2000), 0, 33 * 16);
	T_CHECK_EQ(t, do_req(&d, BLK_T_DISCARD, 0, DATA + 0x2000, 33 * 16, false), BLK_S_IOERR);
	T_CHECK_EQ(t, do_req(&d, BLK_T_DISCARD, 0, DATA + 0x2000, 20, false), BLK_S_IOERR);
	drv_fini(&d);
}

static void t_get_id(struct t *t)
{
	struct drv d;
	struct dopts o = { .wb = true, .serial = "kmig-disk-1" };
	T_CHECK_EQ(t, drv_init(&d, "id.img", &o, true), 0);
	drv_start(&d);
	memset(host(&d, DATA), 0xaa, 64);
	marks_reset(&d);
	uint16_t head;
	uint16_t k = req(&d, BLK_T_GET_ID, 0, DATA, 64, true, &head);
	kick(&d);
	T_CHECK(t, wait_used(&d, d.avail_idx));
	T_CHECK_EQ(t, *host(&d, st_gpa(k)), BLK_S_OK);
	uint8_t want[20] = "kmig-disk-1";
	T_CHECK(t, !memcmp(host(&d, DATA), want, 20));
	T_CHECK_EQ(t, host(&d, DATA)[20], 0xaa);
	T_CHECK(t, marked(&d, DATA, 20));
	T_CHECK_EQ(t, used_len_of(&d, head), 21);
	/* a buffer of 8 bytes gets the first 8 */
	memset(host(&d, DATA), 0xaa, 64);
	T_CHECK_EQ(t, do_req(&d, BLK_T_GET_ID, 0, DATA, 8, true), BLK_S_OK);
	T_CHECK(t, !memcmp(host(&d, DATA), want, 8) && host(&d, DATA)[8] == 0xaa);
	/* no buffer at all: IOERR */
	T_CHECK_EQ(t, do_req(&d, BLK_T_GET_ID, 0, 0, 0, true), BLK_S_IOERR);
	drv_fini(&d);
}

static void t_read_only(struct t *t)
{
	struct drv d;
	struct dopts o = { .ro = true, .discard = true };
	T_CHECK_EQ(t, drv_init(&d, "ro.img", &o, true), 0);
	drv_start(&d);
	memset(host(&d, DATA), 0x11, 4096);
	T_CHECK_EQ(t, do_req(&d, BLK_T_OUT, 0, DATA, 4096, false), BLK_S_IOERR);
	uint8_t f[4096];
	file_read(&d, 0, f, sizeof(f));
	T_CHECK_EQ(t, f[0], 0x40);
	/* not negotiated (not offered on a read-only image): UNSUPP */
	memset(host(&d, DATA + 0x1000), 0, 16);
	T_CHECK_EQ(t, do_req(&d, BLK_T_WRITE_ZEROES, 0, DATA + 0x1000, 16, false), BLK_S_UNSUPP);
	T_CHECK_EQ(t, do_req(&d, BLK_T_DISCARD, 0, DATA + 0x1000, 16, false), BLK_S_UNSUPP);
	/* reads and flushes work */
	T_CHECK_EQ(t, do_req(&d, BLK_T_IN, 8, DATA, 4096, true), BLK_S_OK);
	T_CHECK_EQ(t, host(&d, DATA)[0], 0x41);
	T_CHECK_EQ(t, do_req(&d, BLK_T_FLUSH, 0, 0, 0, false), BLK_S_OK);
	drv_fini(&d);
}

static void t_bad_requests(struct t *t)
{
	struct drv d;
	struct dopts o = { .wb = true, .lbs = 4096 };
	T_CHECK_EQ(t, drv_init(&d, "bad.img", &o, true), 0);
	drv_start(&d);
	uint64_t cap = IMG_SIZE / 512;
	T_CHECK_EQ(t, do_req(&d, BLK_T_IN, cap, DATA, 4096, true), BLK_S_IOERR);
	T_CHECK_EQ(t, do_req(&d, BLK_T_IN, cap - 8, DATA, 8192, true), BLK_S_IOERR);
	T_CHECK_EQ(t, do_req(&d, BLK_T_IN, ~0ull - 7, DATA, 4096, true), BLK_S_IOERR);
	T_CHECK_EQ(t, do_req(&d, BLK_T_OUT, 1ull << 60, DATA, 4096, false), BLK_S_IOERR);
	T_CHECK_EQ(t, do_req(&d, BLK_T_IN, 1, DATA, 4096, true), BLK_S_IOERR);   /* misaligned */
	T_CHECK_EQ(t, do_req(&d, BLK_T_IN, 0, DATA, 512, true), BLK_S_IOERR);    /* short */
	T_CHECK_EQ(t, do_req(&d, BLK_T_OUT, 0, DATA, 4096, true), BLK_S_IOERR);  /* wrong side */
	T_CHECK_EQ(t, do_req(&d, BLK_T_IN, 0, DATA, 4096, false), BLK_S_IOERR);  /* wrong side */
	T_CHECK_EQ(t, do_req(&d, 99, 0, DATA, 4096, true), BLK_S_UNSUPP);
	T_CHECK_EQ(t, do_req(&d, 0x10000, 0, 0, 0, true), BLK_S_UNSUPP);
	T_CHECK_EQ(t, do_req(&d, BLK_T_OUT, 0, DATA, BLK_REQ_MAX + 4096, false), BLK_S_IOERR);
	/* header too short */
	uint16_t k = d.nreq++;
	put_hdr(&d, k, BLK_T_IN, 0);
	struct seg s1[3] = { { hdr_gpa(k), 8, false }, { DATA, 4096, true }, { st_gpa(k), 1, true } };
	add_chain(&d, s1, 3);
	kick(&d);
	T_CHECK(t, wait_used(&d, d.avail_idx));
	T_CHECK_EQ(t, *host(&d, st_gpa(k)), BLK_S_IOERR);
	/* no writable byte: nowhere for a status, returned with 0 */
	k = d.nreq++;
	put_hdr(&d, k, BLK_T_OUT, 0);
	struct seg s2[2] = { { hdr_gpa(k), 16, false }, { DATA, 4096, false } };
	uint16_t head = add_chain(&d, s2, 2);
	kick(&d);
	T_CHECK(t, wait_used(&d, d.avail_idx));
	T_CHECK_EQ(t, used_len_of(&d, head), 0);
	/* the header split over two descriptors is fine */
	k = d.nreq++;
	put_hdr(&d, k, BLK_T_IN, 8);
	struct seg s3[4] = { { hdr_gpa(k), 5, false }, { hdr_gpa(k) + 5, 11, false },
			     { DATA, 4096, true }, { st_gpa(k), 1, true } };
	add_chain(&d, s3, 4);
	kick(&d);
	T_CHECK(t, wait_used(&d, d.avail_idx));
	T_CHECK_EQ(t, *host(&d, st_gpa(k)), BLK_S_OK);
	struct blk_stats st;
	blk__get_stats(d.b, &st);
	T_CHECK_EQ(t, st.unsupported, 2);
	T_CHECK_EQ(t, st.no_status, 1);
	T_CHECK(t, st.bad_requests >= 9);
	T_CHECK(t, !(dev_status(&d) & VIRTIO_STATUS_NEEDS_RESET));
	/* a descriptor outside RAM is ring corruption: the device needs a reset */
	k = d.nreq++;
	put_hdr(&d, k, BLK_T_IN, 0);
	struct seg s4[3] = { { hdr_gpa(k), 16, false }, { RAM_SIZE - 100, 4096, true },
			     { st_gpa(k), 1, true } };
	add_chain(&d, s4, 3);
	kick(&d);
	T_CHECK(t, dev_status(&d) & VIRTIO_STATUS_NEEDS_RESET);
	drv_fini(&d);
}

static void t_drain(struct t *t)
{
	struct drv d;
	struct dopts o = { .wb = true };
	T_CHECK_EQ(t, drv_init(&d, "drain.img", &o, true), 0);
	drv_start(&d);
	memset(host(&d, DATA), 0x5a, 1 << 20);
	for (unsigned i = 0; i < 32; i++)
		req(&d, BLK_T_OUT, 2048ull * (i % 4), DATA, 1 << 20, false, NULL);
	struct blkfile_stats fs0, fs1;
	blkfile__get_stats(d.f, &fs0);
	kick(&d);
	T_CHECK_EQ(t, blk__drain(d.b, 0), 0);
	/* every request returned, nothing in flight, the writes flushed */
	T_CHECK_EQ(t, used_idx(&d), 32);
	struct blk_stats st;
	blk__get_stats(d.b, &st);
	T_CHECK_EQ(t, st.inflight, 0);
	T_CHECK_EQ(t, st.wr_ops, 32);
	blkfile__get_stats(d.f, &fs1);
	T_CHECK_EQ(t, fs1.flushes, fs0.flushes + 1);
	/* a reset with requests in flight waits for them; none is returned after */
	for (unsigned i = 0; i < 16; i++)      /* each into its own buffer */
		req(&d, BLK_T_IN, 0, DATA + 0x200000 + ((uint64_t)i << 20), 1 << 20, true, NULL);
	kick(&d);
	mw(&d, VIRTIO_PCI_STATUS, 0, 1);
	blk__get_stats(d.b, &st);
	T_CHECK_EQ(t, st.inflight, 0);
	drv_fini(&d);
}

/* ---- state ---- */

struct saved {
	uint8_t buf[4096];
	size_t len;
	uint32_t id;
};

static int put_state(void *ctx, uint32_t id, uint32_t version, uint32_t instance,
		     const void *data, size_t len)
{
	struct saved *s = ctx;
	(void)version, (void)instance;
	if (len > sizeof(s->buf))
		return -ENOSPC;
	memcpy(s->buf, data, len);
	s->len = len;
	s->id = id;
	return 0;
}

static void t_state(struct t *t)
{
	struct drv a, b;
	struct dopts o = { .wb = true, .serial = "S1" };
	T_CHECK_EQ(t, drv_init(&a, "st.img", &o, true), 0);
	drv_start(&a);
	T_CHECK_EQ(t, do_req(&a, BLK_T_IN, 0, DATA, 4096, true), BLK_S_OK);
	struct saved s = { 0 };
	T_CHECK_EQ(t, blk__save(a.b, put_state, &s), 0);
	T_CHECK_EQ(t, s.id, STATE_DEV_BLK);
	/* the destination: the same image, shared and inactive (the lock
	 * stays with the source until the hand-over) */
	struct dopts od = o;
	od.inactive = true;
	T_CHECK_EQ(t, drv_init(&b, "st.img", &od, false), 0);
	char why[256] = "";
	T_CHECK_EQ(t, blk__load(b.b, s.buf, s.len, why, sizeof(why)), 0);
	T_CHECK(t, dev_status(&b) & VIRTIO_STATUS_DRIVER_OK);
	/* hostile sections: refused with a reason, the device as it was */
	uint8_t st0 = dev_status(&b);
	uint8_t bad[4096];
	memcpy(bad, s.buf, s.len);
	bad[0] ^= 1;
	T_CHECK_EQ(t, blk__load(b.b, bad, s.len, why, sizeof(why)), -EINVAL);
	T_CHECK(t, strstr(why, "bad header"));
	T_CHECK_EQ(t, blk__load(b.b, s.buf, 7, why, sizeof(why)), -EINVAL);
	T_CHECK_EQ(t, blk__load(b.b, s.buf, s.len - 1, why, sizeof(why)), -EINVAL);
	memcpy(bad, s.buf, s.len);
	uint32_t huge = 0xffffff00u;
	memcpy(bad + 4, &huge, 4);
	T_CHECK_EQ(t, blk__load(b.b, bad, s.len, why, sizeof(why)), -EINVAL);
	memcpy(bad, s.buf, s.len);
	bad[s.len - 36 + 3] ^= 0x10;              /* the image size */
	T_CHECK_EQ(t, blk__load(b.b, bad, s.len, why, sizeof(why)), -EINVAL);
	T_CHECK(t, strstr(why, "same size"));
	memcpy(bad, s.buf, s.len);
	bad[s.len - 1] ^= 1;                      /* the serial */
	T_CHECK_EQ(t, blk__load(b.b, bad, s.len, why, sizeof(why)), -EINVAL);
	T_CHECK(t, strstr(why, "configured otherwise"));
	memcpy(bad, s.buf, s.len);
	bad[8 + 12] ^= 0xff;                      /* inside the transport */
	int rc = blk__load(b.b, bad, s.len, why, sizeof(why));
	T_CHECK(t, rc == 0 || rc == -EINVAL);
	if (rc)
		T_CHECK_EQ(t, dev_status(&b), st0);
	/* the hand-over: the destination cannot activate while the source writes */
	char err[256];
	T_CHECK_EQ(t, blkfile__activate(b.f, err, sizeof(err)), -EAGAIN);
	T_CHECK_EQ(t, blkfile__inactivate(a.f), 0);
	T_CHECK_EQ(t, blkfile__activate(b.f, err, sizeof(err)), 0);
	T_CHECK_EQ(t, blkfile__activate(a.f, err, sizeof(err)), -EAGAIN);
	T_CHECK(t, strstr(err, "in use by another process (locked)"));
	drv_fini(&b);
	/* another size is refused */
	T_CHECK_EQ(t, drv_init(&b, "st2.img", &od, false), -ENOENT);
	mkimage(b.path, IMG_SIZE * 2);
	T_CHECK_EQ(t, drv_init(&b, "st2.img", &od, false), 0);
	T_CHECK_EQ(t, blk__load(b.b, s.buf, s.len, why, sizeof(why)), -EINVAL);
	T_CHECK(t, strstr(why, "same size"));
	drv_fini(&b);
	/* the source takes its image back once the destination is gone */
	T_CHECK_EQ(t, blkfile__activate(a.f, err, sizeof(err)), 0);
	drv_fini(&a);
}

/* ---- locks ---- */

static void t_locks(struct t *t)
{
	char path[160], err[256];
	snprintf(path, sizeof(path), "%s/lock.img", tmpdir);
	mkimage(path, IMG_SIZE);
	struct blkfile *w, *w2, *r1, *r2, *in;
	struct blkfile_conf cw = { .path = path }, cr = { .path = path, .read_only = true },
			    ci = { .path = path, .inactive = true };
	T_CHECK_EQ(t, blkfile__open(&w, &cw, err, sizeof(err)), 0);
	T_CHECK_EQ(t, blkfile__open(&w2, &cw, err, sizeof(err)), -EAGAIN);
	T_CHECK(t, strstr(err, "is in use by another process (locked)"));
	T_CHECK(t, strstr(err, path));
	T_CHECK_EQ(t, blkfile__open(&r1, &cr, err, sizeof(err)), -EAGAIN);
	T_CHECK_EQ(t, blkfile__open(&in, &ci, err, sizeof(err)), 0);   /* inactive coexists */
	T_CHECK(t, !strcmp(blkfile__lock_name(w), "write"));
	T_CHECK(t, !strcmp(blkfile__lock_name(in), "none"));
	/* an inactive opener may do no I/O */
	struct blkfile_req rq = { .op = BLKFILE_FLUSH };
	T_CHECK_EQ(t, blkfile__submit(in, &rq), -EPERM);
	blkfile__close(in);
	blkfile__close(w);
	/* readers share */
	T_CHECK_EQ(t, blkfile__open(&r1, &cr, err, sizeof(err)), 0);
	T_CHECK_EQ(t, blkfile__open(&r2, &cr, err, sizeof(err)), 0);
	T_CHECK(t, !strcmp(blkfile__lock_name(r1), "shared"));
	T_CHECK_EQ(t, blkfile__open(&w, &cw, err, sizeof(err)), -EAGAIN);
	rq.op = BLKFILE_WRITE;
	T_CHECK_EQ(t, blkfile__submit(r1, &rq), -EROFS);
	blkfile__close(r1);
	blkfile__close(r2);
	/* and once all are gone a writer gets it */
	T_CHECK_EQ(t, blkfile__open(&w, &cw, err, sizeof(err)), 0);
	blkfile__close(w);
	/* bad images */
	char p2[160];
	snprintf(p2, sizeof(p2), "%s/odd.img", tmpdir);
	mkimage(p2, 4096);
	if (truncate(p2, 1000))
		abort();
	struct blkfile_conf co = { .path = p2 };
	T_CHECK_EQ(t, blkfile__open(&w, &co, err, sizeof(err)), -EINVAL);
	T_CHECK(t, strstr(err, "multiple of 512"));
	snprintf(p2, sizeof(p2), "%s/missing.img", tmpdir);
	T_CHECK_EQ(t, blkfile__open(&w, &co, err, sizeof(err)), -ENOENT);
	T_CHECK(t, strstr(err, "missing.img"));
}

/* ---- options ---- */

static void t_opts(struct t *t)
{
	struct blk_opts o;
	struct vm_blk_config c;
	char err[512];
	bool on;
	blk_opts__init(&o);
	T_CHECK_EQ(t, blk_opts__finish(&o, &c, &on, err, sizeof(err)), 0);
	T_CHECK(t, !on);
	T_CHECK_EQ(t, blk_opts__blockdev(&o, "driver=file,filename=/x/a,,b.img,node-name=d0,"
					 "cache.direct=on,read-only=on", err, sizeof(err)), 0);
	T_CHECK(t, blk_opts__is_device("virtio-blk-pci,drive=d0"));
	T_CHECK(t, !blk_opts__is_device("virtio-blk-pcix,drive=d0"));
	T_CHECK_EQ(t, blk_opts__device(&o, "virtio-blk-pci,drive=d0,serial=SN1,write-cache=off,"
				       "logical_block_size=4096,discard=unmap", err, sizeof(err)), 0);
	T_CHECK_EQ(t, blk_opts__finish(&o, &c, &on, err, sizeof(err)), 0);
	T_CHECK(t, on && c.read_only && c.direct && !c.writeback && c.discard && c.lbs == 4096);
	T_CHECK(t, !strcmp(c.path, "/x/a,b.img") && !strcmp(c.serial, "SN1") && !c.legacy_drive);
	/* --drive */
	blk_opts__init(&o);
	T_CHECK_EQ(t, blk_opts__drive(&o, "file=/i.img,format=raw,if=none,id=hd,cache=none", err,
				      sizeof(err)), 0);
	T_CHECK_EQ(t, blk_opts__device(&o, "virtio-blk-pci,drive=hd", err, sizeof(err)), 0);
	T_CHECK_EQ(t, blk_opts__finish(&o, &c, &on, err, sizeof(err)), 0);
	T_CHECK(t, c.direct && c.writeback && !c.read_only && c.lbs == 512 && c.legacy_drive);
	/* refusals */
	static const char *const bad_bd[] = {
		"driver=qcow2,filename=/a,node-name=x", "driver=file,filename=/a",
		"driver=file,node-name=x", "driver=file,filename=/a,node-name=x,cache.direct=yes",
		"driver=file,filename=/a,node-name=x,aio=native", "driver=file,filename=/a,node-name",
		"driver=file,filename=/a,node-name=x,discard=on",
	};
	for (size_t i = 0; i < sizeof(bad_bd) / sizeof(bad_bd[0]); i++) {
		blk_opts__init(&o);
		err[0] = 0;
		T_CHECK_EQ(t, blk_opts__blockdev(&o, bad_bd[i], err, sizeof(err)), -EINVAL);
		T_CHECK(t, err[0]);
	}
	static const char *const bad_dev[] = {
		"virtio-blk-pci", "virtio-blk-pci,drive=x,serial=123456789012345678901",
		"virtio-blk-pci,drive=x,logical_block_size=1000",
		"virtio-blk-pci,drive=x,logical_block_size=256", "virtio-blk-pci,drive=x,foo=1",
		"virtio-blk-pci,drive=x,write-cache=maybe",
	};
	for (size_t i = 0; i < sizeof(bad_dev) / sizeof(bad_dev[0]); i++) {
		blk_opts__init(&o);
		T_CHECK_EQ(t, blk_opts__device(&o, bad_dev[i], err, sizeof(err)), -EINVAL);
	}
	blk_opts__init(&o);
	T_CHECK_EQ(t, blk_opts__drive(&o, "file=/a,format=qcow2,if=none,id=x", err, sizeof(err)),
		   -EINVAL);
	T_CHECK(t, strstr(err, "format=raw"));
	/* pairs that do not match, one disk only */
	blk_opts__init(&o);
	T_CHECK_EQ(t, blk_opts__drive(&o, "file=/a,id=x", err, sizeof(err)), 0);
	T_CHECK_EQ(t, blk_opts__drive(&o, "file=/b,id=y", err, sizeof(err)), -EINVAL);
	T_CHECK_EQ(t, blk_opts__finish(&o, &c, &on, err, sizeof(err)), -EINVAL);
	T_CHECK(t, strstr(err, "no --device"));
	T_CHECK_EQ(t, blk_opts__device(&o, "virtio-blk-pci,drive=z", err, sizeof(err)), 0);
	T_CHECK_EQ(t, blk_opts__finish(&o, &c, &on, err, sizeof(err)), -EINVAL);
	T_CHECK(t, strstr(err, "names no"));
	T_CHECK(t, !on);
}

int main(void)
{
	struct t t = { 0 };
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kmig-blk-XXXXXX");
	if (!mkdtemp(tmpdir))
		return 2;
	T_RUN(&t, t_config);
	T_RUN(&t, t_read_write);
	T_RUN(&t, t_flush_discard_zeroes);
	T_RUN(&t, t_get_id);
	T_RUN(&t, t_read_only);
	T_RUN(&t, t_bad_requests);
	T_RUN(&t, t_drain);
	T_RUN(&t, t_state);
	T_RUN(&t, t_locks);
	T_RUN(&t, t_opts);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
	if (system(cmd))
		printf("# could not remove %s\n", tmpdir);
	printf("%d passed, %d failed\n", t.passed, t.failed);
	return T_DONE(&t);
}
