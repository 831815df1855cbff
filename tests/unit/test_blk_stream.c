/* The disk in the migration stream (x-block-migration) without KVM: the
 * DISK record, the source's chunk tracking over a real image and its
 * backend's workers, and the destination's writing into its own image
 * (size check, lock, marker, holes made zero). */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dev/blkfile.h"
#include "harness.h"
#include "mig/recv/disk_in.h"
#include "mig/send/disk_out.h"
#include "mig/wire/proto.h"
#include "mig/wire/proto_le.h"

#define MIB (1u << 20)
#define IMG (4 * MIB)

static char tmpdir[64];

static void t_record(struct t *t)
{
	uint8_t buf[PROTO_HDR_SIZE + PROTO_DISK_HDR + 4096];
	struct proto_hdr h;
	struct proto_disk d;
	const char *why = NULL;
	ssize_t n = proto__encode_disk_head(buf, sizeof(buf), PROTO_DISK_DATA, 8192, 4096);
	T_CHECK_EQ(t, n, PROTO_HDR_SIZE + PROTO_DISK_HDR);
	memset(buf + n, 0xab, 4096);
	T_CHECK_EQ(t, proto__decode_header(buf, sizeof(buf), &h), 0);
	T_CHECK(t, h.type == PROTO_DISK && h.length == PROTO_DISK_HDR + 4096);
	T_CHECK_EQ(t, proto__decode_disk(buf + PROTO_HDR_SIZE, h.length, 0, &d, &why), 0);
	T_CHECK(t, d.kind == PROTO_DISK_DATA && d.offset == 8192 && d.length == 4096 &&
		d.data == buf + n && d.data[4095] == 0xab);
	/* INFO and ZERO carry no data */
	n = proto__encode_disk_head(buf, sizeof(buf), PROTO_DISK_ZERO, 0, 1u << 30);
	T_CHECK_EQ(t, proto__decode_disk(buf + PROTO_HDR_SIZE, PROTO_DISK_HDR, 0, &d, &why), 0);
	T_CHECK(t, d.kind == PROTO_DISK_ZERO && d.length == 1u << 30 && !d.data);
	/* refused by the encoder */
	T_CHECK_EQ(t, proto__encode_disk_head(buf, sizeof(buf), PROTO_DISK_DATA, 100, 512), -EINVAL);
	T_CHECK_EQ(t, proto__encode_disk_head(buf, sizeof(buf), PROTO_DISK_DATA, 0, 2 * MIB),
		   -EINVAL);
	T_CHECK_EQ(t, proto__encode_disk_head(buf, sizeof(buf), PROTO_DISK_INFO, 0, 512), -EINVAL);
	T_CHECK_EQ(t, proto__encode_disk_info(buf, 20, 512, false), -ENOSPC);
	/* INFO with the checksum flag; SUM's 8 bytes */
	n = proto__encode_disk_info(buf, sizeof(buf), 1u << 20, true);
	T_CHECK_EQ(t, proto__decode_header(buf, sizeof(buf), &h), 0);
	T_CHECK_EQ(t, proto__decode_disk(buf + PROTO_HDR_SIZE, h.length, h.flags, &d, &why), 0);
	T_CHECK(t, d.kind == PROTO_DISK_INFO && d.sum_follows && d.length == 1u << 20);
	n = proto__encode_disk_head(buf, sizeof(buf), PROTO_DISK_SUM, 0, 1u << 20);
	T_CHECK_EQ(t, proto__decode_header(buf, sizeof(buf), &h), 0);
	T_CHECK_EQ(t, h.length, PROTO_DISK_HDR + PROTO_DISK_SUM_LEN);
	T_CHECK_EQ(t, proto__decode_disk(buf + PROTO_HDR_SIZE, h.length, 0, &d, &why), 0);
	T_CHECK(t, d.kind == PROTO_DISK_SUM && d.data == buf + n);
	T_CHECK_EQ(t, proto__decode_disk(buf + PROTO_HDR_SIZE, h.length, PROTO_F_HAS_CHECKSUM, &d,
					 &why), -EPROTO);
	/* refused by the decoder: kind, drive, alignment, data length, wrap */
	uint8_t *p = buf + PROTO_HDR_SIZE;
	n = proto__encode_disk_head(buf, sizeof(buf), PROTO_DISK_ZERO, 512, 512);
	p[0] = 3;
	T_CHECK_EQ(t, proto__decode_disk(p, PROTO_DISK_HDR, 0, &d, &why), -EPROTO);
	p[0] = PROTO_DISK_ZERO;
	p[4] = 1;
	T_CHECK_EQ(t, proto__decode_disk(p, PROTO_DISK_HDR, 0, &d, &why), -EPROTO);
	p[4] = 0;
	p[8] = 1;       /* offset 513 */
	T_CHECK_EQ(t, proto__decode_disk(p, PROTO_DISK_HDR, 0, &d, &why), -EPROTO);
	p[8] = 0;
	T_CHECK_EQ(t, proto__decode_disk(p, PROTO_DISK_HDR + 512, 0, &d, &why), -EPROTO);
	T_CHECK_EQ(t, proto__decode_disk(p, PROTO_DISK_HDR - 1, 0, &d, &why), -EPROTO);
	memset(p + 8, 0xff, 8);
	p[8] = 0;       /* offset near 2^64, a multiple of 512 */
	T_CHECK_EQ(t, proto__decode_disk(p, PROTO_DISK_HDR, 0, &d, &why), -EPROTO);
	/* the header's limits */
	h = (struct proto_hdr){ PROTO_DISK, 0, PROTO_DISK_HDR + PROTO_DISK_MAX_DATA + 1 };
	T_CHECK(t, proto__header_problem(&h) != NULL);
	h.length = PROTO_DISK_HDR - 1;
	T_CHECK(t, proto__header_problem(&h) != NULL);
}

static struct blkfile *open_img(struct t *t, const char *name, uint64_t size, bool inactive)
{
	char path[128], err[256];
	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	int fd = open(path, O_RDWR | O_CREAT, 0600);
	T_CHECK(t, fd >= 0 && ftruncate(fd, (off_t)size) == 0);
	close(fd);
	struct blkfile_conf c = { .path = path, .inactive = inactive };
	struct blkfile *f = NULL;
	T_CHECK_EQ(t, blkfile__open(&f, &c, err, sizeof(err)), 0);
	return f;
}

static uint8_t *abuf(size_t len, int fill)
{
	void *p = NULL;
	if (posix_memalign(&p, 4096, len))
		abort();
	memset(p, fill, len);
	return p;
}

struct waiter {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int done, res;
};

/* A guest write through the backend's workers, waited for. */
struct wreq {
	struct blkfile_req io;      /* first */
	struct waiter *w;
};

static void wreq_done(struct blkfile_req *r, int res)
{
	struct wreq *q = (struct wreq *)r;
	pthread_mutex_lock(&q->w->lock);
	q->w->done = 1;
	q->w->res = res;
	pthread_cond_signal(&q->w->cond);
	pthread_mutex_unlock(&q->w->lock);
}

static int guest_write(struct blkfile *f, uint64_t off, void *buf, size_t len)
{
	struct waiter w = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 };
	struct iovec iov = { buf, len };
	struct wreq q = { .io = { .op = BLKFILE_WRITE, .off = off, .iov = &iov, .niov = 1,
				  .done = wreq_done }, .w = &w };
	int rc = blkfile__submit(f, &q.io);
	if (rc)
		return rc;
	pthread_mutex_lock(&w.lock);
	while (!w.done)
		pthread_cond_wait(&w.cond, &w.lock);
	pthread_mutex_unlock(&w.lock);
	return w.res;
}

/* The source: the bulk pass takes the blocks with data, not the holes;
 * a guest write through the workers marks its blocks; take reads runs of
 * blocks inside one chunk and tells zero runs. */
static void t_disk_out(struct t *t)
{
	const uint64_t B = DISK_OUT_BLOCK, CB = DISK_OUT_CHUNK_BLOCKS;
	/* one chunk and a half and one sector past IMG: a short last block */
	struct blkfile *f = open_img(t, "out.img", IMG + 3 * DISK_OUT_CHUNK / 2 + 512, false);
	uint8_t *data = abuf(DISK_OUT_CHUNK, 0x5a);
	T_CHECK_EQ(t, blkfile__write_at(f, data, 4096, 2 * DISK_OUT_CHUNK + 4096), 0);
	T_CHECK_EQ(t, blkfile__flush(f), 0);
	struct disk_out d;
	T_CHECK_EQ(t, disk_out__start(&d, f, false), 0);
	T_CHECK_EQ(t, d.nchunks, IMG / DISK_OUT_CHUNK + 2);
	T_CHECK_EQ(t, d.nblocks, (IMG + 3 * DISK_OUT_CHUNK / 2) / B + 1);
	/* the one block with data (a file system that cannot tell: all) */
	size_t first = bitmap__next_set(&d.todo, 0);
	T_CHECK(t, first == 2 * CB + 1 || bitmap__count(&d.todo) == d.nblocks);
	T_CHECK(t, bitmap__test(&d.todo, 2 * CB + 1));
	T_CHECK_EQ(t, disk_out__dirty_bytes(&d), 0);
	/* a guest write of 1 KiB over two blocks (and chunks 5 and 6) */
	T_CHECK_EQ(t, guest_write(f, 6 * DISK_OUT_CHUNK - 512, data, 1024), 0);
	T_CHECK_EQ(t, disk_out__dirty_bytes(&d), 2 * B);
	uint64_t todo0 = bitmap__count(&d.todo);
	uint64_t n = disk_out__collect(&d);
	T_CHECK_EQ(t, n, bitmap__count(&d.todo) - todo0);
	T_CHECK(t, bitmap__test(&d.todo, 6 * CB - 1) && bitmap__test(&d.todo, 6 * CB));
	T_CHECK_EQ(t, disk_out__dirty_bytes(&d), 0);
	T_CHECK_EQ(t, d.dirtied, 2);
	/* runs: blocks that follow one another, cut at a chunk's end */
	bitmap__clear_all(&d.todo);
	bitmap__set_range(&d.todo, 2 * CB, 4);
	bitmap__set(&d.todo, 2 * CB + 8);
	bitmap__set_range(&d.todo, 3 * CB - 1, 2);
	uint64_t c = 0, off, len;
	bool zero = true;
	T_CHECK_EQ(t, disk_out__take(&d, &c, &off, &len, &zero), 0);
	T_CHECK(t, c == 2 * CB + 4 && off == 2 * DISK_OUT_CHUNK && len == 4 * B && !zero);
	T_CHECK(t, d.buf[4096] == 0x5a && d.buf[0] == 0 && !bitmap__test(&d.todo, 2 * CB));
	T_CHECK_EQ(t, disk_out__take(&d, &c, &off, &len, &zero), 0);
	T_CHECK(t, c == 2 * CB + 9 && off == (2 * CB + 8) * B && len == B && zero);
	T_CHECK_EQ(t, disk_out__take(&d, &c, &off, &len, &zero), 0);
	T_CHECK(t, c == 3 * CB && off == (3 * CB - 1) * B && len == B);
	T_CHECK_EQ(t, disk_out__take(&d, &c, &off, &len, &zero), 0);
	T_CHECK(t, c == 3 * CB + 1 && off == 3 * DISK_OUT_CHUNK && len == B);
	/* a write to a block just taken sets it again */
	T_CHECK_EQ(t, guest_write(f, 2 * DISK_OUT_CHUNK, data, 512), 0);
	disk_out__collect(&d);
	T_CHECK(t, bitmap__test(&d.todo, 2 * CB));
	/* the short last block, of zeros */
	c = d.nblocks - 1;
	bitmap__set(&d.todo, c);
	T_CHECK_EQ(t, disk_out__take(&d, &c, &off, &len, &zero), 0);
	T_CHECK(t, len == 512 && zero && c == d.nblocks);
	T_CHECK_EQ(t, disk_out__take(&d, &c, &off, &len, &zero), -ENOENT);
	T_CHECK(t, disk_out__pending(&d) == B);
	/* unhooked: writes are no longer reported */
	disk_out__stop(&d);
	T_CHECK_EQ(t, guest_write(f, 0, data, 512), 0);
	free(data);
	blkfile__close(f);
}

static bool marker(const char *name)
{
	char p[160];
	snprintf(p, sizeof(p), "%s/%s", tmpdir, name);
	return blkfile__marked_incomplete(p);
}

static bool reads(struct blkfile *f, uint64_t off, int byte)
{
	uint8_t *b = abuf(4096, 0x11);
	bool ok = blkfile__read_at(f, b, 4096, off) == 0;
	for (unsigned i = 0; ok && i < 4096; i++)
		ok = b[i] == byte;
	free(b);
	return ok;
}

/* The destination: INFO checks the size and takes the write lock before
 * it writes anything, then marks and clears the image; records outside
 * the image are refused; complete flushes and unmarks. */
static void t_disk_in(struct t *t)
{
	char why[512];
	struct disk_in d;
	struct proto_disk info = { .kind = PROTO_DISK_INFO, .length = IMG };
	uint8_t *junk = abuf(4096, 0x77), *data = abuf(8192, 0x3c);
	/* no disk here */
	disk_in__init(&d, NULL);
	T_CHECK_EQ(t, disk_in__record(&d, &info, why, sizeof(why)), -EINVAL);
	disk_in__free(&d);
	/* another size */
	struct blkfile *small = open_img(t, "small.img", IMG / 2, true);
	disk_in__init(&d, small);
	T_CHECK_EQ(t, disk_in__record(&d, &info, why, sizeof(why)), -EINVAL);
	T_CHECK(t, strstr(why, "must be equal") && !marker("small.img"));
	disk_in__free(&d);
	blkfile__close(small);
	/* the image another process (here: another open) writes */
	struct blkfile *src = open_img(t, "in.img", IMG, false);
	T_CHECK_EQ(t, blkfile__write_at(src, junk, 4096, MIB), 0);
	struct blkfile *dst = open_img(t, "in.img", IMG, true);
	disk_in__init(&d, dst);
	T_CHECK(t, disk_in__record(&d, &info, why, sizeof(why)) < 0);
	T_CHECK(t, strstr(why, "in use by another process") && !marker("in.img"));
	T_CHECK(t, reads(src, MIB, 0x77));         /* nothing written */
	disk_in__free(&d);
	blkfile__close(dst);
	blkfile__close(src);
	/* its own image, with junk in it */
	dst = open_img(t, "in.img", IMG, true);
	disk_in__init(&d, dst);
	struct proto_disk rec = { .kind = PROTO_DISK_DATA, .offset = 4096, .length = 8192,
				  .data = data };
	T_CHECK_EQ(t, disk_in__record(&d, &rec, why, sizeof(why)), -EPROTO);  /* before INFO */
	T_CHECK_EQ(t, disk_in__record(&d, &info, why, sizeof(why)), 0);
	T_CHECK(t, marker("in.img") && reads(dst, MIB, 0));
	T_CHECK_EQ(t, disk_in__record(&d, &info, why, sizeof(why)), -EPROTO); /* twice */
	T_CHECK_EQ(t, disk_in__record(&d, &rec, why, sizeof(why)), 0);
	T_CHECK(t, reads(dst, 4096, 0x3c) && reads(dst, 8192, 0x3c) && reads(dst, 0, 0));
	rec.offset = IMG - 4096;                    /* past the end */
	T_CHECK_EQ(t, disk_in__record(&d, &rec, why, sizeof(why)), -EINVAL);
	struct proto_disk z = { .kind = PROTO_DISK_ZERO, .offset = 4096, .length = 4096 };
	T_CHECK_EQ(t, disk_in__record(&d, &z, why, sizeof(why)), 0);
	T_CHECK(t, reads(dst, 4096, 0) && reads(dst, 8192, 0x3c));
	z.offset = IMG;
	T_CHECK_EQ(t, disk_in__record(&d, &z, why, sizeof(why)), -EINVAL);
	T_CHECK(t, d.data_bytes == 8192 && d.zero_bytes == 4096 && d.records == 2);
	T_CHECK_EQ(t, disk_in__complete(&d, why, sizeof(why)), 0);
	T_CHECK(t, !marker("in.img"));
	disk_in__free(&d);
	blkfile__close(dst);
	free(junk);
	free(data);
}

/* One pass of the source into the destination: every run in todo as
 * DATA or ZERO records (skip: the offset of the run left out, or -1). */
static int pass(struct disk_out *o, struct disk_in *in, long skip)
{
	char why[256];
	uint64_t c = 0, off, len;
	bool zero;
	int rc;
	disk_out__collect(o);
	while ((rc = disk_out__take(o, &c, &off, &len, &zero)) == 0) {
		struct proto_disk r = { .kind = zero ? PROTO_DISK_ZERO : PROTO_DISK_DATA,
					.offset = off, .length = len, .data = zero ? NULL : o->buf };
		if ((long)off != skip && (rc = disk_in__record(in, &r, why, sizeof(why))) != 0)
			return rc;
	}
	return rc == -ENOENT ? 0 : rc;
}

/* The sum end to end, in one process: a source image with data, holes
 * and guest writes between passes (data, write-zeroes) against a
 * destination image of junk: SUM matches; a chunk written after the bulk
 * pass and left out of the last pass makes it differ (-EBADMSG). */
static void t_disk_sum(struct t *t)
{
	for (int control = 0; control < 2; control++) {
		char why[256];
		struct blkfile *f = open_img(t, control ? "s1.img" : "s0.img", IMG, false);
		struct blkfile *g = open_img(t, control ? "d1.img" : "d0.img", IMG, true);
		uint8_t *data = abuf(3 * DISK_OUT_CHUNK, 0);
		for (unsigned i = 0; i < 3 * DISK_OUT_CHUNK; i++)
			data[i] = (uint8_t)(i * 7 + i / 512);
		T_CHECK_EQ(t, blkfile__write_at(f, data, 3 * DISK_OUT_CHUNK, MIB), 0);
		T_CHECK_EQ(t, blkfile__write_at(g, data, DISK_OUT_CHUNK, 0), 0);   /* junk */
		struct disk_out o;
		struct disk_in in;
		T_CHECK_EQ(t, disk_out__start(&o, f, true), 0);
		disk_in__init(&in, g);
		struct proto_disk info = { .kind = PROTO_DISK_INFO, .length = IMG,
					   .sum_follows = true };
		T_CHECK_EQ(t, disk_in__record(&in, &info, why, sizeof(why)), 0);
		T_CHECK_EQ(t, pass(&o, &in, -1), 0);                /* the bulk pass */
		/* the guest writes across two chunks, then into a hole */
		T_CHECK_EQ(t, guest_write(f, MIB + DISK_OUT_CHUNK - 1024, data + 5, 2048), 0);
		T_CHECK_EQ(t, guest_write(f, 3 * MIB, data, 4096), 0);
		T_CHECK_EQ(t, pass(&o, &in, control ? (long)(3 * MIB) : -1), 0);
		uint64_t sum = 0;
		T_CHECK_EQ(t, disk_out__sum(&o, &sum), 0);
		uint8_t le[8];
		le__put64(le, sum);
		struct proto_disk r = { .kind = PROTO_DISK_SUM, .length = IMG, .data = le };
		int rc = disk_in__record(&in, &r, why, sizeof(why));
		T_CHECK_EQ(t, rc, control ? -EBADMSG : 0);
		T_CHECK_EQ(t, disk_in__complete(&in, why, sizeof(why)), control ? -EPROTO : 0);
		if (!control) {       /* the images are the same */
			uint8_t *a = abuf(IMG, 1), *b = abuf(IMG, 2);
			T_CHECK_EQ(t, blkfile__read_at(f, a, IMG, 0), 0);
			T_CHECK_EQ(t, blkfile__read_at(g, b, IMG, 0), 0);
			T_CHECK(t, memcmp(a, b, IMG) == 0);
			free(a);
			free(b);
		}
		disk_out__stop(&o);
		disk_in__free(&in);
		free(data);
		blkfile__close(f);
		blkfile__close(g);
	}
}

int main(void)
{
	struct t t = { 0 };
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kmig-bst-XXXXXX");
	if (!mkdtemp(tmpdir))
		return 1;
	T_RUN(&t, t_record);
	T_RUN(&t, t_disk_out);
	T_RUN(&t, t_disk_in);
	T_RUN(&t, t_disk_sum);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
	if (system(cmd))
		return 1;
	return T_DONE(&t);
}
