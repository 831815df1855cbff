/* The image backend's side of a migration that carries the image
 * (x-block-migration): the write hook, synchronous I/O and the
 * incomplete-image marker.  dev/blkfile.h has the contract. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <linux/falloc.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dev/blkfile_impl.h"

void blkfile__set_write_hook(struct blkfile *f, blkfile_write_fn fn, void *ctx)
{
	pthread_mutex_lock(&f->lock);
	f->on_write = fn;
	f->on_write_ctx = ctx;
	pthread_mutex_unlock(&f->lock);
}

static bool blkfile__range_ok(const struct blkfile *f, const void *buf, size_t len, uint64_t off)
{
	uint64_t a = f->off_align;
	return len && off <= f->size && len <= f->size - off && !(off % a) && !(len % a) &&
	       !((uintptr_t)buf % f->mem_align);
}

int blkfile__read_at(struct blkfile *f, void *buf, size_t len, uint64_t off)
{
	if (!blkfile__range_ok(f, buf, len, off))
		return -EINVAL;
	struct iovec one = { buf, len };
	return blkfile__rw_loop(f, false, &one, 1, off);
}

int blkfile__write_at(struct blkfile *f, const void *buf, size_t len, uint64_t off)
{
	if (!blkfile__range_ok(f, buf, len, off))
		return -EINVAL;
	if (f->read_only)
		return -EROFS;
	__atomic_store_n(&f->dirty, true, __ATOMIC_RELEASE);
	struct iovec one = { (void *)buf, len };
	return blkfile__rw_loop(f, true, &one, 1, off);
}

int blkfile__writeback(struct blkfile *f)
{
	return sync_file_range(f->fd, 0, 0, SYNC_FILE_RANGE_WRITE) ? -errno : 0;
}

int blkfile__zero_at(struct blkfile *f, uint64_t off, uint64_t len)
{
	if (!len || off > f->size || len > f->size - off || off % f->off_align ||
	    len % f->off_align)
		return -EINVAL;
	if (f->read_only)
		return -EROFS;
	__atomic_store_n(&f->dirty, true, __ATOMIC_RELEASE);
	if (!fallocate(f->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len) ||
	    !fallocate(f->fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len))
		return 0;
	return blkfile__write_zeroes(f, off, len);
}

int blkfile__next_data(struct blkfile *f, uint64_t off, uint64_t *start, uint64_t *end)
{
	if (off >= f->size)
		return -ENXIO;
	off_t d = lseek(f->fd, (off_t)off, SEEK_DATA);
	if (d < 0 && errno == ENXIO)
		return -ENXIO;
	if (d < 0) {                        /* cannot tell: all of it may be data */
		*start = off;
		*end = f->size;
		return 0;
	}
	off_t h = lseek(f->fd, d, SEEK_HOLE);
	*start = (uint64_t)d < f->size ? (uint64_t)d : f->size;
	*end = h < 0 || (uint64_t)h > f->size ? f->size : (uint64_t)h;
	return *start < *end ? 0 : -ENXIO;
}

static int blkfile__marker_path(const char *path, char *out, size_t cap)
{
	int n = snprintf(out, cap, "%s%s", path, BLKFILE_INCOMPLETE_SUFFIX);
	return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

/* fsync of the directory that holds path: a marker made or removed
 * survives a crash of the host. */
static void blkfile__sync_dir(const char *path)
{
	char copy[4096 + sizeof(BLKFILE_INCOMPLETE_SUFFIX)];
	snprintf(copy, sizeof(copy), "%s", path);
	int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		(void)fsync(fd);
		close(fd);
	}
}

int blkfile__mark_incomplete(struct blkfile *f)
{
	char p[4096 + sizeof(BLKFILE_INCOMPLETE_SUFFIX)];
	int rc = blkfile__marker_path(f->path, p, sizeof(p));
	if (rc)
		return rc;
	int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0)
		return -errno;
	static const char text[] = "kmig: this image's incoming migration (x-block-migration) "
				   "did not complete; its contents are not the guest's\n";
	rc = write(fd, text, sizeof(text) - 1) == (ssize_t)sizeof(text) - 1 ? 0 : -EIO;
	if (!rc && fsync(fd))
		rc = -errno;
	close(fd);
	blkfile__sync_dir(p);
	return rc;
}

int blkfile__unmark_incomplete(struct blkfile *f)
{
	char p[4096 + sizeof(BLKFILE_INCOMPLETE_SUFFIX)];
	int rc = blkfile__marker_path(f->path, p, sizeof(p));
	if (rc)
		return rc;
	if (unlink(p) && errno != ENOENT)
		return -errno;
	blkfile__sync_dir(p);
	return 0;
}

bool blkfile__marked_incomplete(const char *path)
{
	char p[4096 + sizeof(BLKFILE_INCOMPLETE_SUFFIX)];
	struct stat st;
	return !blkfile__marker_path(path, p, sizeof(p)) && stat(p, &st) == 0;
}
