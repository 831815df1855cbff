#include "dev/blkfile.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dev/blkfile_impl.h"

#define BF_ADD(f, field) __atomic_fetch_add(&(f)->stats.field, 1, __ATOMIC_RELAXED)

/* ---------------- locks ---------------- */

static int blkfile__setlk(int fd, short type, off_t byte)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1 };
	return fcntl(fd, F_OFD_SETLK, &fl) ? -errno : 0;
}

int blkfile__activate(struct blkfile *f, char *err, size_t errlen)
{
	if (__atomic_load_n(&f->active, __ATOMIC_ACQUIRE))
		return 0;
	int rc = blkfile__setlk(f->fd, f->read_only ? F_RDLCK : F_WRLCK, BLKFILE_LOCK_PERM);
	if (rc == -EAGAIN || rc == -EACCES) {
		snprintf(err, errlen, "image %s is in use by another process (locked)", f->path);
		return -EAGAIN;
	}
	if (rc) {
		snprintf(err, errlen, "image %s: cannot lock it: %s", f->path, strerror(-rc));
		return rc;
	}
	/* whatever this host cached of the image predates the other's writes */
	if (!f->direct)
		(void)posix_fadvise(f->fd, 0, 0, POSIX_FADV_DONTNEED);
	__atomic_store_n(&f->active, true, __ATOMIC_RELEASE);
	return 0;
}

int blkfile__inactivate(struct blkfile *f)
{
	if (!__atomic_load_n(&f->active, __ATOMIC_ACQUIRE))
		return 0;
	int rc = blkfile__flush(f);
	if (rc)
		return rc;
	__atomic_store_n(&f->active, false, __ATOMIC_RELEASE);
	return blkfile__setlk(f->fd, F_UNLCK, BLKFILE_LOCK_PERM);
}

bool blkfile__active(const struct blkfile *f)
{
	return __atomic_load_n(&f->active, __ATOMIC_ACQUIRE);
}

const char *blkfile__lock_name(const struct blkfile *f)
{
	if (!blkfile__active(f))
		return "none";
	return f->read_only ? "shared" : "write";
}

/* ---------------- I/O ---------------- */

int blkfile__flush(struct blkfile *f)
{
	if (f->read_only || !__atomic_exchange_n(&f->dirty, false, __ATOMIC_ACQ_REL))
		return 0;
	BF_ADD(f, flushes);
	if (fdatasync(f->fd) == 0)
		return 0;
	int rc = -errno;
	__atomic_store_n(&f->dirty, true, __ATOMIC_RELEASE);
	return rc;
}

static bool blkfile__aligned(const struct blkfile *f, const struct iovec *iov, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (((uintptr_t)iov[i].iov_base | iov[i].iov_len) & (f->mem_align - 1))
			return false;
	return true;
}

/* preadv/pwritev until every byte moved; a short transfer is -EIO. */
int blkfile__rw_loop(struct blkfile *f, bool wr, struct iovec *iov, unsigned n, uint64_t off)
{
	while (n) {
		ssize_t r = wr ? pwritev(f->fd, iov, (int)n, (off_t)off)
			       : preadv(f->fd, iov, (int)n, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return r < 0 ? -errno : -EIO;
		off += (uint64_t)r;
		while (n && (size_t)r >= iov->iov_len) {
			r -= (ssize_t)iov->iov_len;
			iov++, n--;
		}
		if (n) {
			iov->iov_base = (uint8_t *)iov->iov_base + r;
			iov->iov_len -= (size_t)r;
		}
	}
	return 0;
}

/* O_DIRECT with guest buffers it cannot take: through an aligned copy. */
static int blkfile__bounce(struct blkfile *f, bool wr, const struct iovec *iov, unsigned n,
			   uint64_t off)
{
	size_t len = 0, pos = 0;
	for (unsigned i = 0; i < n; i++)
		len += iov[i].iov_len;
	void *buf;
	if (posix_memalign(&buf, f->mem_align, len ? len : 1))
		return -ENOMEM;
	for (unsigned i = 0; wr && i < n; pos += iov[i].iov_len, i++)
		memcpy((uint8_t *)buf + pos, iov[i].iov_base, iov[i].iov_len);
	struct iovec one = { buf, len };
	int rc = blkfile__rw_loop(f, wr, &one, 1, off);
	pos = 0;
	for (unsigned i = 0; !rc && !wr && i < n; pos += iov[i].iov_len, i++)
		memcpy(iov[i].iov_base, (uint8_t *)buf + pos, iov[i].iov_len);
	free(buf);
	return rc;
}

static int blkfile__rw(struct blkfile *f, struct blkfile_req *r)
{
	bool wr = r->op == BLKFILE_WRITE;
	if (f->direct && !blkfile__aligned(f, r->iov, r->niov))
		return blkfile__bounce(f, wr, r->iov, r->niov, r->off);
	struct iovec iov[r->niov ? r->niov : 1];
	memcpy(iov, r->iov, sizeof(struct iovec) * r->niov);
	return blkfile__rw_loop(f, wr, iov, r->niov, r->off);
}

int blkfile__write_zeroes(struct blkfile *f, uint64_t off, uint64_t len)
{
	while (len) {
		size_t k = len < BLKFILE_ZERO_CHUNK ? (size_t)len : BLKFILE_ZERO_CHUNK;
		struct iovec one = { f->zeros, k };
		int rc = blkfile__rw_loop(f, true, &one, 1, off);
		if (rc)
			return rc;
		off += k, len -= k;
	}
	return 0;
}

static int blkfile__range(struct blkfile *f, enum blkfile_op op, const struct blkfile_range *g)
{
	int mode;
	if (op == BLKFILE_DISCARD) {
		if (!f->discard_unmap)
			return 0;                      /* discard=ignore */
		mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
	} else {
		mode = g->unmap && f->discard_unmap ? FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
						    : FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE;
	}
	if (fallocate(f->fd, mode, (off_t)g->off, (off_t)g->len) == 0)
		return 0;
	int rc = -errno;
	if (rc != -EOPNOTSUPP && rc != -ENOTTY && rc != -ENODEV)
		return rc;
	if (op == BLKFILE_DISCARD)
		return 0;                              /* advisory: nothing to undo */
	if (mode & FALLOC_FL_PUNCH_HOLE &&
	    !fallocate(f->fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, (off_t)g->off, (off_t)g->len))
		return 0;
	return blkfile__write_zeroes(f, g->off, g->len);
}

static int blkfile__run(struct blkfile *f, struct blkfile_req *r)
{
	int rc = 0;
	switch (r->op) {
	case BLKFILE_READ:
		return blkfile__rw(f, r);
	case BLKFILE_WRITE:
		__atomic_store_n(&f->dirty, true, __ATOMIC_RELEASE);
		rc = blkfile__rw(f, r);
		break;
	case BLKFILE_FLUSH:
		return blkfile__flush(f);
	case BLKFILE_DISCARD:
	case BLKFILE_ZERO:
		__atomic_store_n(&f->dirty, true, __ATOMIC_RELEASE);
		for (unsigned i = 0; !rc && i < r->nranges && i < BLKFILE_MAX_RANGES; i++)
			rc = blkfile__range(f, r->op, &r->ranges[i]);
		break;
	}
	if (!rc && f->writethrough)
		rc = blkfile__flush(f);
	return rc;
}

/* f->lock held: the ranges r may have changed (rc: its result; a failed
 * request may have changed part) go to the write hook. */
static void blkfile__report_write(struct blkfile *f, const struct blkfile_req *r, int rc)
{
	if (r->op == BLKFILE_WRITE) {
		uint64_t len = 0;
		for (unsigned i = 0; i < r->niov; i++)
			len += r->iov[i].iov_len;
		if (rc)
			f->on_write(f->on_write_ctx, r->off, len, BLKFILE_CHANGED_UNKNOWN, NULL, 0);
		else
			f->on_write(f->on_write_ctx, r->off, len, BLKFILE_CHANGED_DATA, r->iov, r->niov);
		return;
	}
	if (r->op == BLKFILE_DISCARD && !f->discard_unmap)
		return;                                 /* discard=ignore: nothing changed */
	/* a discard may have been ignored by the file system */
	enum blkfile_change what = rc || r->op == BLKFILE_DISCARD ? BLKFILE_CHANGED_UNKNOWN
								   : BLKFILE_CHANGED_ZERO;
	for (unsigned i = 0; i < r->nranges && i < BLKFILE_MAX_RANGES; i++)
		f->on_write(f->on_write_ctx, r->ranges[i].off, r->ranges[i].len, what, NULL, 0);
}

static void *blkfile__worker(void *arg)
{
	struct blkfile *f = arg;
	pthread_mutex_lock(&f->lock);
	for (;;) {
		while (!f->head && !f->stopping)
			pthread_cond_wait(&f->cond, &f->lock);
		if (!f->head)
			break;
		struct blkfile_req *r = f->head;
		f->head = r->next;
		if (!f->head)
			f->tail = NULL;
		pthread_mutex_unlock(&f->lock);
		int rc = blkfile__run(f, r);
		if (rc)
			BF_ADD(f, errors);
		pthread_mutex_lock(&f->lock);
		/* before done: a drain that saw the request complete sees its mark */
		if (f->on_write && r->op != BLKFILE_READ && r->op != BLKFILE_FLUSH)
			blkfile__report_write(f, r, rc);
		pthread_mutex_unlock(&f->lock);
		r->done(r, rc);
		pthread_mutex_lock(&f->lock);
	}
	pthread_mutex_unlock(&f->lock);
	return NULL;
}

int blkfile__submit(struct blkfile *f, struct blkfile_req *r)
{
	if (!blkfile__active(f))
		return -EPERM;
	if (f->read_only && r->op != BLKFILE_READ && r->op != BLKFILE_FLUSH)
		return -EROFS;
	r->next = NULL;
	pthread_mutex_lock(&f->lock);
	if (f->tail)
		f->tail->next = r;
	else
		f->head = r;
	f->tail = r;
	pthread_cond_signal(&f->cond);
	pthread_mutex_unlock(&f->lock);
	return 0;
}

/* ---------------- life cycle ---------------- */

/* Size, type and O_DIRECT alignment of the open image. */
static int blkfile__probe(struct blkfile *f, char *err, size_t errlen)
{
	struct stat st;
	if (fstat(f->fd, &st)) {
		snprintf(err, errlen, "image %s: %s", f->path, strerror(errno));
		return -errno;
	}
	if (S_ISREG(st.st_mode)) {
		f->size = (uint64_t)st.st_size;
	} else if (!S_ISBLK(st.st_mode) || ioctl(f->fd, BLKGETSIZE64, &f->size)) {
		snprintf(err, errlen, "image %s: not a regular file or block device", f->path);
		return -EINVAL;
	}
	if (!f->size || f->size % 512) {
		snprintf(err, errlen, "image %s: its size (%llu bytes) is not a non-zero multiple of "
			 "512", f->path, (unsigned long long)f->size);
		return -EINVAL;
	}
	f->mem_align = f->off_align = 1;
	if (f->direct) {
		f->mem_align = f->off_align = BLKFILE_DEFAULT_ALIGN;
#ifdef STATX_DIOALIGN
		struct statx sx;
		if (!statx(f->fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) &&
		    (sx.stx_mask & STATX_DIOALIGN) && sx.stx_dio_mem_align && sx.stx_dio_offset_align) {
			f->mem_align = sx.stx_dio_mem_align;
			f->off_align = sx.stx_dio_offset_align;
		}
#endif
	}
	return 0;
}

static int blkfile__start(struct blkfile *f, unsigned n)
{
	if (!n)
		n = BLKFILE_WORKERS;
	if (n > BLKFILE_MAX_WORKERS)
		n = BLKFILE_MAX_WORKERS;
	for (; f->nworkers < n; f->nworkers++) {
		int rc = pthread_create(&f->workers[f->nworkers], NULL, blkfile__worker, f);
		if (rc)
			return -rc;
	}
	return 0;
}

static int blkfile__open_fd(struct blkfile *f, const struct blkfile_conf *c, char *err,
			    size_t errlen)
{
	int flags = (c->read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC | (c->direct ? O_DIRECT : 0);
	f->fd = open(c->path, flags);
	if (f->fd >= 0)
		return 0;
	int e = errno;
	if (e == EINVAL && c->direct)
		snprintf(err, errlen, "image %s: its file system does not take O_DIRECT "
			 "(cache.direct=on)", c->path);
	else if (e == EROFS || (e == EACCES && !c->read_only))
		snprintf(err, errlen, "image %s: %s (read-only=on opens it read-only)", c->path,
			 strerror(e));
	else
		snprintf(err, errlen, "image %s: %s", c->path, strerror(e));
	return -e;
}

int blkfile__open(struct blkfile **out, const struct blkfile_conf *c, char *err, size_t errlen)
{
	*out = NULL;
	struct blkfile *f = calloc(1, sizeof(*f));
	if (!f || posix_memalign((void **)&f->zeros, BLKFILE_DEFAULT_ALIGN, BLKFILE_ZERO_CHUNK)) {
		free(f);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	memset(f->zeros, 0, BLKFILE_ZERO_CHUNK);
	snprintf(f->path, sizeof(f->path), "%s", c->path);
	f->read_only = c->read_only;
	f->direct = c->direct;
	f->writethrough = c->writethrough;
	f->discard_unmap = c->discard_unmap;
	pthread_mutex_init(&f->lock, NULL);
	pthread_cond_init(&f->cond, NULL);
	int rc = blkfile__open_fd(f, c, err, errlen);
	if (!rc)
		rc = blkfile__probe(f, err, errlen);
	if (!rc && (rc = blkfile__setlk(f->fd, F_RDLCK, BLKFILE_LOCK_USER)))
		snprintf(err, errlen, "image %s: cannot lock it: %s", f->path, strerror(-rc));
	if (!rc && !c->inactive)
		rc = blkfile__activate(f, err, errlen);
	if (!rc && (rc = blkfile__start(f, c->workers)))
		snprintf(err, errlen, "image %s: cannot start its I/O threads: %s", f->path,
			 strerror(-rc));
	if (rc) {
		blkfile__close(f);
		return rc;
	}
	*out = f;
	return 0;
}

void blkfile__close(struct blkfile *f)
{
	if (!f)
		return;
	pthread_mutex_lock(&f->lock);
	f->stopping = true;
	pthread_cond_broadcast(&f->cond);
	pthread_mutex_unlock(&f->lock);
	for (unsigned i = 0; i < f->nworkers; i++)
		pthread_join(f->workers[i], NULL);
	if (f->fd >= 0) {
		if (blkfile__flush(f))
			log_warn("image %s: the last flush failed", f->path);
		close(f->fd);             /* the locks go with it */
	}
	pthread_mutex_destroy(&f->lock);
	pthread_cond_destroy(&f->cond);
	free(f->zeros);
	free(f);
}

uint64_t blkfile__size(const struct blkfile *f) { return f->size; }
bool blkfile__read_only(const struct blkfile *f) { return f->read_only; }
const char *blkfile__path(const struct blkfile *f) { return f->path; }
uint32_t blkfile__offset_align(const struct blkfile *f) { return f->off_align; }

void blkfile__get_stats(struct blkfile *f, struct blkfile_stats *out)
{
	out->flushes = __atomic_load_n(&f->stats.flushes, __ATOMIC_RELAXED);
	out->errors = __atomic_load_n(&f->stats.errors, __ATOMIC_RELAXED);
}
