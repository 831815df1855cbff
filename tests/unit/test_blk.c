/* The virtio-blk device model, driven by a fake driver over fake guest
 * RAM, its backend a real image file in a temporary directory: requests
 * land at the right offsets and in the right buffers, flush, discard and
 * write-zeroes (holes seen with SEEK_HOLE), GET_ID, every refusal, every
 * guest write reported, the drain, the state section (hostile ones too),
 * the option parser and the OFD image locks with their hand-over, the
 * error policy (werror/rerror) on a tmpfs of 1 MiB that fills up (ENOSPC;
 * the test mounts it: it needs root), a file cut short under the device
 * (a read error) and a file size limit (EFBIG).  No KVM. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <string.h>
#include <unistd.h>

#include "base/timeutil.h"
#include "ctl/blk_opts.h"
#include "dev/blk.h"
#include "dev/blkfile.h"
#include "dev/pci.h"
#include "blk_drv.h"

/* ---------------- tests ---------------- */

static void t_config(struct t *t)
{
	struct drv d;
	struct dopts o = { .wb = true, .discard = true };
	T_CHECK_EQ(t, drv_init(&d, "cfg.img", &o, true), 0);
	uint64_t f = vdrv__offered(&d.v);
	uint64_t want = 1ull << BLK_F_SIZE_MAX | 1ull << BLK_F_SEG_MAX | 1ull << BLK_F_BLK_SIZE |
			1ull << BLK_F_FLUSH | 1ull << BLK_F_DISCARD | 1ull << BLK_F_WRITE_ZEROES |
			1ull << BLK_F_TOPOLOGY | 1ull << VIRTIO_F_VERSION_1;
	T_CHECK_EQ(t, f, want);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_DEVCFG + 0, 8), IMG_SIZE / 512);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_DEVCFG + 20, 4), 512);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_DEVCFG + 12, 4), BLK_SEG_MAX);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_DEVCFG + 32, 1), 1);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_DEVCFG + 40, 4), BLK_MAX_SEGS);
	T_CHECK(t, drv_start(&d) & VIRTIO_STATUS_DRIVER_OK);
	drv_fini(&d);
	/* read-only, no write cache, no discard */
	struct dopts r = { .ro = true };
	T_CHECK_EQ(t, drv_init(&d, "cfg.img", &r, false), 0);
	f = vdrv__offered(&d.v);
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
	uint8_t *w = vdrv__host(&d.v, DATA);
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
	vdrv__marks_reset(&d.v);
	uint16_t k = d.nreq++, head;
	put_hdr(&d, k, BLK_T_IN, 24);
	memset(vdrv__host(&d.v, DATA + 0x10000), 0, 8192);
	struct vdrv_seg s[4] = { { hdr_gpa(k), 16, false }, { DATA + 0x10000, 1000, true },
			    { DATA + 0x20000, 8192 - 1000, true }, { st_gpa(k), 1, true } };
	head = vdrv__add_chain(&d.v, 0, s, 4);
	vdrv__kick(&d.v, 0);
	T_CHECK(t, wait_used(&d, d.v.avail_idx[0]));
	T_CHECK_EQ(t, *vdrv__host(&d.v, st_gpa(k)), BLK_S_OK);
	T_CHECK(t, !memcmp(vdrv__host(&d.v, DATA + 0x10000), w, 1000));
	T_CHECK(t, !memcmp(vdrv__host(&d.v, DATA + 0x20000), w + 1000, 8192 - 1000));
	T_CHECK_EQ(t, vdrv__used_len_of(&d.v, 0, head), 8192 + 1);
	/* every byte the device wrote was reported */
	T_CHECK(t, vdrv__marked(&d.v, DATA + 0x10000, 1000));
	T_CHECK(t, vdrv__marked(&d.v, DATA + 0x20000, 8192 - 1000));
	T_CHECK(t, vdrv__marked(&d.v, st_gpa(k), 1));
	T_CHECK(t, vdrv__marked(&d.v, vdrv__used_gpa(&d.v, 0) + 2, 2));
	T_CHECK(t, vdrv__marked(&d.v, vdrv__used_gpa(&d.v, 0) + 4 +
				8u * ((d.v.avail_idx[0] - 1) % d.v.qsize), 8));
	T_CHECK(t, d.v.irq_level);
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
	memset(vdrv__host(&d.v, DATA), 0x77, 4096);
	T_CHECK_EQ(t, do_req(&d, BLK_T_OUT, 0, DATA, 4096, false), BLK_S_OK);
	T_CHECK_EQ(t, do_req(&d, BLK_T_FLUSH, 0, 0, 0, false), BLK_S_OK);
	blkfile__get_stats(d.f, &fs1);
	T_CHECK_EQ(t, fs1.flushes, fs0.flushes + 1);
	/* discard 1 MiB at 1 MiB: a hole */
	uint8_t *seg = vdrv__host(&d.v, DATA + 0x1000);
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
	memset(vdrv__host(&d.v, DATA + 0x2000), 0, 33 * 16);
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
	memset(vdrv__host(&d.v, DATA), 0xaa, 64);
	vdrv__marks_reset(&d.v);
	uint16_t head;
	uint16_t k = req(&d, BLK_T_GET_ID, 0, DATA, 64, true, &head);
	vdrv__kick(&d.v, 0);
	T_CHECK(t, wait_used(&d, d.v.avail_idx[0]));
	T_CHECK_EQ(t, *vdrv__host(&d.v, st_gpa(k)), BLK_S_OK);
	uint8_t want[20] = "kmig-disk-1";
	T_CHECK(t, !memcmp(vdrv__host(&d.v, DATA), want, 20));
	T_CHECK_EQ(t, vdrv__host(&d.v, DATA)[20], 0xaa);
	T_CHECK(t, vdrv__marked(&d.v, DATA, 20));
	T_CHECK_EQ(t, vdrv__used_len_of(&d.v, 0, head), 21);
	/* a buffer of 8 bytes gets the first 8 */
	memset(vdrv__host(&d.v, DATA), 0xaa, 64);
	T_CHECK_EQ(t, do_req(&d, BLK_T_GET_ID, 0, DATA, 8, true), BLK_S_OK);
	T_CHECK(t, !memcmp(vdrv__host(&d.v, DATA), want, 8) && vdrv__host(&d.v, DATA)[8] == 0xaa);
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
	memset(vdrv__host(&d.v, DATA), 0x11, 4096);
	T_CHECK_EQ(t, do_req(&d, BLK_T_OUT, 0, DATA, 4096, false), BLK_S_IOERR);
	uint8_t f[4096];
	file_read(&d, 0, f, sizeof(f));
	T_CHECK_EQ(t, f[0], 0x40);
	/* not negotiated (not offered on a read-only image): UNSUPP */
	memset(vdrv__host(&d.v, DATA + 0x1000), 0, 16);
	T_CHECK_EQ(t, do_req(&d, BLK_T_WRITE_ZEROES, 0, DATA + 0x1000, 16, false), BLK_S_UNSUPP);
	T_CHECK_EQ(t, do_req(&d, BLK_T_DISCARD, 0, DATA + 0x1000, 16, false), BLK_S_UNSUPP);
	/* reads and flushes work */
	T_CHECK_EQ(t, do_req(&d, BLK_T_IN, 8, DATA, 4096, true), BLK_S_OK);
	T_CHECK_EQ(t, vdrv__host(&d.v, DATA)[0], 0x41);
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
	struct vdrv_seg s1[3] = { { hdr_gpa(k), 8, false }, { DATA, 4096, true },
				  { st_gpa(k), 1, true } };
	vdrv__add_chain(&d.v, 0, s1, 3);
	vdrv__kick(&d.v, 0);
	T_CHECK(t, wait_used(&d, d.v.avail_idx[0]));
	T_CHECK_EQ(t, *vdrv__host(&d.v, st_gpa(k)), BLK_S_IOERR);
	/* no writable byte: nowhere for a status, returned with 0 */
	k = d.nreq++;
	put_hdr(&d, k, BLK_T_OUT, 0);
	struct vdrv_seg s2[2] = { { hdr_gpa(k), 16, false }, { DATA, 4096, false } };
	uint16_t head = vdrv__add_chain(&d.v, 0, s2, 2);
	vdrv__kick(&d.v, 0);
	T_CHECK(t, wait_used(&d, d.v.avail_idx[0]));
	T_CHECK_EQ(t, vdrv__used_len_of(&d.v, 0, head), 0);
	/* the header split over two descriptors is fine */
	k = d.nreq++;
	put_hdr(&d, k, BLK_T_IN, 8);
	struct vdrv_seg s3[4] = { { hdr_gpa(k), 5, false }, { hdr_gpa(k) + 5, 11, false },
			     { DATA, 4096, true }, { st_gpa(k), 1, true } };
	vdrv__add_chain(&d.v, 0, s3, 4);
	vdrv__kick(&d.v, 0);
	T_CHECK(t, wait_used(&d, d.v.avail_idx[0]));
	T_CHECK_EQ(t, *vdrv__host(&d.v, st_gpa(k)), BLK_S_OK);
	struct blk_stats st;
	blk__get_stats(d.b, &st);
	T_CHECK_EQ(t, st.unsupported, 2);
	T_CHECK_EQ(t, st.no_status, 1);
	T_CHECK(t, st.bad_requests >= 9);
	T_CHECK(t, !(vdrv__status(&d.v) & VIRTIO_STATUS_NEEDS_RESET));
	/* a descriptor outside RAM is ring corruption: the device needs a reset */
	k = d.nreq++;
	put_hdr(&d, k, BLK_T_IN, 0);
	struct vdrv_seg s4[3] = { { hdr_gpa(k), 16, false }, { RAM_SIZE - 100, 4096, true },
			     { st_gpa(k), 1, true } };
	vdrv__add_chain(&d.v, 0, s4, 3);
	vdrv__kick(&d.v, 0);
	T_CHECK(t, vdrv__status(&d.v) & VIRTIO_STATUS_NEEDS_RESET);
	drv_fini(&d);
}

static void t_drain(struct t *t)
{
	struct drv d;
	struct dopts o = { .wb = true };
	T_CHECK_EQ(t, drv_init(&d, "drain.img", &o, true), 0);
	drv_start(&d);
	memset(vdrv__host(&d.v, DATA), 0x5a, 1 << 20);
	for (unsigned i = 0; i < 32; i++)
		req(&d, BLK_T_OUT, 2048ull * (i % 4), DATA, 1 << 20, false, NULL);
	struct blkfile_stats fs0, fs1;
	blkfile__get_stats(d.f, &fs0);
	vdrv__kick(&d.v, 0);
	T_CHECK_EQ(t, blk__drain(d.b, 0), 0);
	/* every request returned, nothing in flight, the writes flushed */
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, 0), 32);
	struct blk_stats st;
	blk__get_stats(d.b, &st);
	T_CHECK_EQ(t, st.inflight, 0);
	T_CHECK_EQ(t, st.wr_ops, 32);
	blkfile__get_stats(d.f, &fs1);
	T_CHECK_EQ(t, fs1.flushes, fs0.flushes + 1);
	/* a reset with requests in flight waits for them; none is returned after */
	for (unsigned i = 0; i < 16; i++)      /* each into its own buffer */
		req(&d, BLK_T_IN, 0, DATA + 0x200000 + ((uint64_t)i << 20), 1 << 20, true, NULL);
	vdrv__kick(&d.v, 0);
	vdrv__write(&d.v, VIRTIO_PCI_STATUS, 0, 1);
	blk__get_stats(d.b, &st);
	T_CHECK_EQ(t, st.inflight, 0);
	drv_fini(&d);
}

/* ---- state ---- */

struct saved {
	uint8_t buf[4096];
	size_t len;
	uint32_t id, version;
};

static int put_state(void *ctx, uint32_t id, uint32_t version, uint32_t instance,
		     const void *data, size_t len)
{
	struct saved *s = ctx;
	(void)instance;
	if (len > sizeof(s->buf))
		return -ENOSPC;
	memcpy(s->buf, data, len);
	s->len = len;
	s->id = id;
	s->version = version;
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
	T_CHECK_EQ(t, s.version, BLK_STATE_VERSION_PLAIN);   /* nothing kept: the old layout */
	/* the destination: the same image, shared and inactive (the lock
	 * stays with the source until the hand-over) */
	struct dopts od = o;
	od.inactive = true;
	T_CHECK_EQ(t, drv_init(&b, "st.img", &od, false), 0);
	char why[256] = "";
	T_CHECK_EQ(t, blk__load(b.b, s.version, s.buf, s.len, why, sizeof(why)), 0);
	T_CHECK(t, vdrv__status(&b.v) & VIRTIO_STATUS_DRIVER_OK);
	/* hostile sections: refused with a reason, the device as it was */
	uint8_t st0 = vdrv__status(&b.v);
	uint8_t bad[4096];
	memcpy(bad, s.buf, s.len);
	bad[0] ^= 1;
	T_CHECK_EQ(t, blk__load(b.b, s.version, bad, s.len, why, sizeof(why)), -EINVAL);
	T_CHECK(t, strstr(why, "bad header"));
	T_CHECK_EQ(t, blk__load(b.b, s.version, s.buf, 7, why, sizeof(why)), -EINVAL);
	T_CHECK_EQ(t, blk__load(b.b, s.version, s.buf, s.len - 1, why, sizeof(why)), -EINVAL);
	memcpy(bad, s.buf, s.len);
	uint32_t huge = 0xffffff00u;
	memcpy(bad + 4, &huge, 4);
	T_CHECK_EQ(t, blk__load(b.b, s.version, bad, s.len, why, sizeof(why)), -EINVAL);
	memcpy(bad, s.buf, s.len);
	bad[s.len - 36 + 3] ^= 0x10;              /* the image size */
	T_CHECK_EQ(t, blk__load(b.b, s.version, bad, s.len, why, sizeof(why)), -EINVAL);
	T_CHECK(t, strstr(why, "same size"));
	memcpy(bad, s.buf, s.len);
	bad[s.len - 1] ^= 1;                      /* the serial */
	T_CHECK_EQ(t, blk__load(b.b, s.version, bad, s.len, why, sizeof(why)), -EINVAL);
	T_CHECK(t, strstr(why, "configured otherwise"));
	memcpy(bad, s.buf, s.len);
	bad[8 + 12] ^= 0xff;                      /* inside the transport */
	int rc = blk__load(b.b, s.version, bad, s.len, why, sizeof(why));
	T_CHECK(t, rc == 0 || rc == -EINVAL);
	if (rc)
		T_CHECK_EQ(t, vdrv__status(&b.v), st0);
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
	T_CHECK_EQ(t, blk__load(b.b, s.version, s.buf, s.len, why, sizeof(why)), -EINVAL);
	T_CHECK(t, strstr(why, "same size"));
	drv_fini(&b);
	/* the source takes its image back once the destination is gone */
	T_CHECK_EQ(t, blkfile__activate(a.f, err, sizeof(err)), 0);
	drv_fini(&a);
}

/* ---- I/O errors: werror / rerror ---- */

static void t_error_action(struct t *t)
{
	static const struct { enum blk_on_error on; int error; enum blk_err_action want; } tab[] = {
		{ BLK_ON_ERR_ENOSPC, ENOSPC, BLK_ACT_STOP }, { BLK_ON_ERR_ENOSPC, EIO, BLK_ACT_REPORT },
		{ BLK_ON_ERR_ENOSPC, EFBIG, BLK_ACT_REPORT }, { BLK_ON_ERR_REPORT, ENOSPC, BLK_ACT_REPORT },
		{ BLK_ON_ERR_IGNORE, ENOSPC, BLK_ACT_IGNORE }, { BLK_ON_ERR_IGNORE, EIO, BLK_ACT_IGNORE },
		{ BLK_ON_ERR_STOP, EIO, BLK_ACT_STOP }, { BLK_ON_ERR_STOP, ENOSPC, BLK_ACT_STOP },
	};
	for (size_t i = 0; i < sizeof(tab) / sizeof(tab[0]); i++)
		T_CHECK_EQ(t, blk__error_action(tab[i].on, tab[i].error), tab[i].want);
	T_CHECK(t, !strcmp(blk_err_action__name(BLK_ACT_STOP), "stop"));
	T_CHECK(t, !strcmp(blk_on_error__name(BLK_ON_ERR_ENOSPC), "enospc"));
	T_CHECK(t, !strcmp(blk_io_status__name(BLK_IOS_NOSPACE), "nospace"));
}

/* werror=enospc on a full tmpfs: the failed writes are kept, unanswered,
 * the VM is told to stop; after the file system grows, the retry writes
 * them all. */
static void t_enospc_stop(struct t *t)
{
	struct drv d;
	struct errs x = { .lock = PTHREAD_MUTEX_INITIALIZER };
	struct dopts o = { .wb = true, .werror = BLK_ON_ERR_ENOSPC, .on_error = on_err,
			   .error_ctx = &x };
	if (full_disk(t, &d, &o, "full.img"))
		return;
	uint16_t k0;
	unsigned kept = fill(&d, &k0);
	bool like;
	T_CHECK(t, kept >= NFILL / 2);
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, 0), NFILL - kept);
	T_CHECK_EQ(t, errs_like(&x, true, BLK_ACT_STOP, ENOSPC, &like), kept);
	T_CHECK(t, like);
	T_CHECK_EQ(t, blk__io_status(d.b), BLK_IOS_NOSPACE);
	unsigned waiting = 0;
	for (unsigned i = 0; i < NFILL; i++)
		waiting += *vdrv__host(&d.v, st_gpa((uint16_t)(k0 + i))) == 0xee;
	T_CHECK_EQ(t, waiting, kept);        /* kept ones have no status yet */
	/* a drain does not wait for them */
	T_CHECK_EQ(t, blk__drain(d.b, 1000000000ull), 0);
	/* a notification before the VM runs again submits nothing */
	vdrv__kick(&d.v, 0);
	time__sleep_ns(20000000);
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, 0), NFILL - kept);
	/* the VM runs, still no room: they fail again, and are kept again */
	T_CHECK(t, blk__restart(d.b));
	vdrv__kick(&d.v, 0);
	struct blk_stats st = { 0 };
	for (int i = 0; i < 5000 && errs_like(&x, true, BLK_ACT_STOP, ENOSPC, &like) < 2 * kept; i++)
		time__sleep_ns(1000000);
	for (int i = 0; i < 5000 && (blk__get_stats(d.b, &st), st.inflight); i++)
		time__sleep_ns(1000000);
	T_CHECK_EQ(t, st.kept, kept);
	T_CHECK_EQ(t, errs_like(&x, true, BLK_ACT_STOP, ENOSPC, &like), 2 * kept);
	T_CHECK_EQ(t, blk__io_status(d.b), BLK_IOS_NOSPACE);
	/* room again; the VM runs: every write lands, nothing lost */
	T_CHECK_EQ(t, small_fs(16), 0);
	T_CHECK(t, blk__restart(d.b));
	T_CHECK_EQ(t, blk__io_status(d.b), BLK_IOS_OK);
	vdrv__kick(&d.v, 0);
	T_CHECK(t, wait_used(&d, NFILL));
	for (unsigned i = 0; i < NFILL; i++)
		T_CHECK_EQ(t, *vdrv__host(&d.v, st_gpa((uint16_t)(k0 + i))), BLK_S_OK);
	T_CHECK(t, filled(&d));
	blk__get_stats(d.b, &st);
	T_CHECK_EQ(t, st.kept, 0);
	T_CHECK_EQ(t, st.wr_ops, NFILL);
	T_CHECK(t, !blk__restart(d.b));
	drv_fini(&d);
	(void)umount2(small_dir, MNT_DETACH);
}

/* Hostile version-2 sections: each refused with a reason. */
static void kept_hostile(struct t *t, struct drv *b, const struct saved *sv)
{
	uint8_t bad[4096];
	char why[256];
	size_t n = sv->len;
	uint16_t big = 300;
	/* one head short of the count; the other version's layout */
	T_CHECK_EQ(t, blk__load(b->b, BLK_STATE_VERSION_KEPT, sv->buf, n - 2, why, sizeof(why)),
		   -EINVAL);
	T_CHECK(t, strstr(why, "malformed kept requests"));
	T_CHECK_EQ(t, blk__load(b->b, BLK_STATE_VERSION_PLAIN, sv->buf, n, why, sizeof(why)),
		   -EINVAL);
	T_CHECK_EQ(t, blk__load(b->b, 3, sv->buf, n, why, sizeof(why)), -EINVAL);
	/* a head out of range, a head twice */
	memcpy(bad, sv->buf, n);
	memcpy(bad + n - 2, &big, 2);
	T_CHECK_EQ(t, blk__load(b->b, BLK_STATE_VERSION_KEPT, bad, n, why, sizeof(why)), -EINVAL);
	T_CHECK(t, strstr(why, "out of range or twice"));
	memcpy(bad + n - 2, sv->buf + n - 4, 2);
	T_CHECK_EQ(t, blk__load(b->b, BLK_STATE_VERSION_KEPT, bad, n, why, sizeof(why)), -EINVAL);
	T_CHECK(t, strstr(why, "out of range or twice"));
	T_CHECK_EQ(t, blk__kept(b->b), 0);
}

/* The kept writes migrate: the destination (the same image, shared)
 * keeps them, and once the file system has room and the guest runs
 * there, every write lands. */
static void t_enospc_migrate(struct t *t)
{
	struct drv a, b;
	struct errs x = { .lock = PTHREAD_MUTEX_INITIALIZER };
	struct dopts o = { .wb = true, .werror = BLK_ON_ERR_ENOSPC, .on_error = on_err,
			   .error_ctx = &x };
	if (full_disk(t, &a, &o, "mig.img"))
		return;
	uint16_t k0;
	unsigned kept = fill(&a, &k0);
	T_CHECK(t, kept >= NFILL / 2);
	struct saved sv = { 0 };
	T_CHECK_EQ(t, blk__save(a.b, put_state, &sv), 0);
	T_CHECK_EQ(t, sv.version, BLK_STATE_VERSION_KEPT);
	struct dopts od = o;
	od.inactive = true;
	T_CHECK_EQ(t, drv_init(&b, "mig.img", &od, false), 0);
	copy_ram(&a, &b);
	kept_hostile(t, &b, &sv);
	char why[256] = "";
	T_CHECK_EQ(t, blk__load(b.b, sv.version, sv.buf, sv.len, why, sizeof(why)), 0);
	T_CHECK_EQ(t, blk__kept(b.b), kept);
	T_CHECK_EQ(t, blk__io_status(b.b), BLK_IOS_NOSPACE);
	/* the hand-over; room again; the guest runs on the destination */
	T_CHECK_EQ(t, blkfile__inactivate(a.f), 0);
	T_CHECK_EQ(t, blkfile__activate(b.f, why, sizeof(why)), 0);
	T_CHECK_EQ(t, small_fs(16), 0);
	T_CHECK(t, blk__restart(b.b));
	vdrv__kick(&b.v, 0);
	T_CHECK(t, wait_used(&b, NFILL));
	for (unsigned i = 0; i < NFILL; i++)
		T_CHECK_EQ(t, *vdrv__host(&b.v, st_gpa((uint16_t)(k0 + i))), BLK_S_OK);
	T_CHECK(t, filled(&b));
	T_CHECK_EQ(t, blk__kept(b.b), 0);
	drv_fini(&b);
	drv_fini(&a);
	(void)umount2(small_dir, MNT_DETACH);
}

/* report, ignore, and a driver reset dropping what stop kept. */
static void t_enospc_other(struct t *t)
{
	static const enum blk_on_error pol[] = { BLK_ON_ERR_REPORT, BLK_ON_ERR_IGNORE,
						 BLK_ON_ERR_STOP };
	for (size_t p = 0; p < 3; p++) {
		struct drv d;
		struct errs x = { .lock = PTHREAD_MUTEX_INITIALIZER };
		struct dopts o = { .wb = true, .werror = pol[p], .on_error = on_err, .error_ctx = &x };
		if (full_disk(t, &d, &o, "full.img"))
			return;
		uint16_t k0;
		unsigned kept = fill(&d, &k0), ioerr = 0, okst = 0;
		for (unsigned i = 0; i < NFILL; i++) {
			uint8_t s = *vdrv__host(&d.v, st_gpa((uint16_t)(k0 + i)));
			ioerr += s == BLK_S_IOERR;
			okst += s == BLK_S_OK;
		}
		bool like;
		unsigned n = errs_like(&x, true, blk__error_action(pol[p], ENOSPC), ENOSPC, &like);
		T_CHECK(t, like && n >= NFILL / 2);
		T_CHECK_EQ(t, kept, pol[p] == BLK_ON_ERR_STOP ? n : 0);
		T_CHECK_EQ(t, ioerr, pol[p] == BLK_ON_ERR_REPORT ? n : 0);
		T_CHECK_EQ(t, okst, pol[p] == BLK_ON_ERR_IGNORE ? NFILL : NFILL - n);
		T_CHECK_EQ(t, blk__io_status(d.b), pol[p] == BLK_ON_ERR_STOP ? BLK_IOS_NOSPACE :
			   BLK_IOS_OK);
		if (pol[p] == BLK_ON_ERR_STOP) {     /* a reset drops the kept ones */
			vdrv__write(&d.v, VIRTIO_PCI_STATUS, 0, 1);
			struct blk_stats st;
			blk__get_stats(d.b, &st);
			T_CHECK_EQ(t, st.kept, 0);
			T_CHECK(t, !blk__restart(d.b));
		}
		drv_fini(&d);
	}
	(void)umount2(small_dir, MNT_DETACH);
}

/* A read past the end of a file cut short under the device (-EIO) goes
 * by rerror; a write past RLIMIT_FSIZE (EFBIG) is no ENOSPC. */
static void t_read_error(struct t *t)
{
	struct drv d;
	struct errs x = { .lock = PTHREAD_MUTEX_INITIALIZER };
	struct dopts o = { .wb = true, .rerror = BLK_ON_ERR_STOP, .werror = BLK_ON_ERR_ENOSPC,
			   .on_error = on_err, .error_ctx = &x };
	T_CHECK_EQ(t, drv_init(&d, "short.img", &o, true), 0);
	drv_start(&d);
	T_CHECK_EQ(t, truncate(d.path, 1 << 20), 0);
	uint16_t k = req(&d, BLK_T_IN, (2u << 20) / 512, DATA, 4096, true, NULL);
	vdrv__kick(&d.v, 0);
	struct blk_stats st = { 0 };
	for (int i = 0; i < 5000 && !st.kept; i++, time__sleep_ns(1000000))
		blk__get_stats(d.b, &st);
	bool like;
	T_CHECK_EQ(t, st.kept, 1);
	T_CHECK_EQ(t, errs_like(&x, false, BLK_ACT_STOP, EIO, &like), 1);
	T_CHECK(t, like);
	T_CHECK_EQ(t, blk__io_status(d.b), BLK_IOS_FAILED);
	T_CHECK_EQ(t, truncate(d.path, IMG_SIZE), 0);
	T_CHECK(t, blk__restart(d.b));
	vdrv__kick(&d.v, 0);
	T_CHECK(t, wait_used(&d, 1));
	T_CHECK_EQ(t, *vdrv__host(&d.v, st_gpa(k)), BLK_S_OK);
	/* EFBIG: werror=enospc reports it */
	struct rlimit old, lim;
	void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
	T_CHECK_EQ(t, getrlimit(RLIMIT_FSIZE, &old), 0);
	lim = (struct rlimit){ 1 << 20, old.rlim_max };   /* the soft limit only */
	T_CHECK_EQ(t, setrlimit(RLIMIT_FSIZE, &lim), 0);
	T_CHECK_EQ(t, do_req(&d, BLK_T_OUT, (2u << 20) / 512, DATA, 4096, false), BLK_S_IOERR);
	T_CHECK_EQ(t, setrlimit(RLIMIT_FSIZE, &old), 0);
	signal(SIGXFSZ, prev);
	pthread_mutex_lock(&x.lock);
	T_CHECK(t, x.n == 2 && x.e[1].write && x.e[1].action == BLK_ACT_REPORT &&
		x.e[1].error == EFBIG);
	pthread_mutex_unlock(&x.lock);
	T_CHECK_EQ(t, blk__io_status(d.b), BLK_IOS_OK);
	drv_fini(&d);
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
	/* werror / rerror: QEMU's defaults; the device's win; auto is the drive's */
	T_CHECK(t, c.werror == BLK_ON_ERR_ENOSPC && c.rerror == BLK_ON_ERR_REPORT);
	blk_opts__init(&o);
	T_CHECK_EQ(t, blk_opts__drive(&o, "file=/i.img,id=hd,werror=stop,rerror=ignore", err,
				      sizeof(err)), 0);
	T_CHECK_EQ(t, blk_opts__device(&o, "virtio-blk-pci,drive=hd,werror=report,rerror=auto", err,
				       sizeof(err)), 0);
	T_CHECK_EQ(t, blk_opts__finish(&o, &c, &on, err, sizeof(err)), 0);
	T_CHECK(t, c.werror == BLK_ON_ERR_REPORT && c.rerror == BLK_ON_ERR_IGNORE);
	blk_opts__init(&o);
	T_CHECK_EQ(t, blk_opts__blockdev(&o, "driver=file,filename=/a,node-name=n", err,
					 sizeof(err)), 0);
	T_CHECK_EQ(t, blk_opts__device(&o, "virtio-blk-pci,drive=n,werror=ignore,rerror=stop", err,
				       sizeof(err)), 0);
	T_CHECK_EQ(t, blk_opts__finish(&o, &c, &on, err, sizeof(err)), 0);
	T_CHECK(t, c.werror == BLK_ON_ERR_IGNORE && c.rerror == BLK_ON_ERR_STOP);
	blk_opts__init(&o);
	T_CHECK_EQ(t, blk_opts__drive(&o, "file=/a,id=x,rerror=enospc", err, sizeof(err)), -EINVAL);
	T_CHECK(t, strstr(err, "rerror=enospc: invalid read error action"));
	blk_opts__init(&o);
	T_CHECK_EQ(t, blk_opts__drive(&o, "file=/a,id=x,werror=auto", err, sizeof(err)), -EINVAL);
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
		"virtio-blk-pci,drive=x,write-cache=maybe", "virtio-blk-pci,drive=x,werror=halt",
		"virtio-blk-pci,drive=x,rerror=enospc", "virtio-blk-pci,drive=x,werror=",
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
	T_RUN(&t, t_error_action);
	T_RUN(&t, t_enospc_stop);
	T_RUN(&t, t_enospc_migrate);
	T_RUN(&t, t_enospc_other);
	T_RUN(&t, t_read_error);
	T_RUN(&t, t_locks);
	T_RUN(&t, t_opts);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
	if (system(cmd))
		printf("# could not remove %s\n", tmpdir);
	printf("%d passed, %d failed\n", t.passed, t.failed);
	return T_DONE(&t);
}
