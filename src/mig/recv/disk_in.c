#include "mig/recv/disk_in.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "dev/blkfile.h"
#include "mig/wire/proto_le.h"

void disk_in__init(struct disk_in *d, struct blkfile *file)
{
	memset(d, 0, sizeof(*d));
	d->file = file;
}

void disk_in__free(struct disk_in *d)
{
	free(d->buf);
	d->buf = NULL;
	if (d->want_sum)
		disksum__free(&d->sum);
	d->want_sum = false;
}

static int disk_in__info(struct disk_in *d, const struct proto_disk *r, char *why, size_t n)
{
	struct blkfile *f = d->file;
	if (d->started) {
		snprintf(why, n, "a second DISK INFO");
		return -EPROTO;
	}
	if (!f) {
		snprintf(why, n, "the source sends its disk (x-block-migration), but this VM has none");
		return -EINVAL;
	}
	const char *path = blkfile__path(f);
	if (blkfile__size(f) != r->length) {
		snprintf(why, n, "image %s holds %llu bytes, the source's disk %llu: they must be "
			 "equal", path, (unsigned long long)blkfile__size(f),
			 (unsigned long long)r->length);
		return -EINVAL;
	}
	if (blkfile__read_only(f)) {
		snprintf(why, n, "image %s is read-only here: the source's disk cannot be written "
			 "into it", path);
		return -EROFS;
	}
	char err[512];
	int rc = blkfile__activate(f, err, sizeof(err));
	if (rc) {
		snprintf(why, n, "%s: with x-block-migration each side needs an image of its own "
			 "(on shared storage, leave x-block-migration off)", err);
		return rc;
	}
	if (posix_memalign((void **)&d->buf, 4096, PROTO_DISK_MAX_DATA))
		return -ENOMEM;
	if (r->sum_follows) {       /* all zero once the image is cleared */
		if ((rc = disksum__init(&d->sum, r->length / PROTO_DISK_SECTOR, true)) != 0)
			return rc;
		d->want_sum = true;
	}
	if ((rc = blkfile__mark_incomplete(f)) != 0) {
		snprintf(why, n, "image %s: cannot create its marker %s%s: %s", path, path,
			 BLKFILE_INCOMPLETE_SUFFIX, strerror(-rc));
		return rc;
	}
	if ((rc = blkfile__zero_at(f, 0, r->length)) != 0) {
		snprintf(why, n, "image %s: cannot clear it: %s", path, strerror(-rc));
		return rc;
	}
	d->started = true;
	log_info("incoming migration: the disk comes in the stream into %s (%llu MiB)", path,
		 (unsigned long long)(r->length >> 20));
	return 0;
}

static int disk_in__check_sum(struct disk_in *d, const struct proto_disk *r, char *why,
			      size_t n)
{
	uint64_t theirs = le__get64(r->data);
	if (!d->want_sum || d->sum_ok || r->length != blkfile__size(d->file)) {
		snprintf(why, n, "DISK SUM not announced, twice, or for another size");
		return -EPROTO;
	}
	if (theirs != d->sum.sum) {
		snprintf(why, n, "the disk's checksum differs from the source's (blocks lost or "
			 "corrupted): image %s", blkfile__path(d->file));
		return -EBADMSG;
	}
	d->sum_ok = true;
	log_info("incoming migration: x-verify: the disk's checksum matches");
	return 0;
}

void disk_in__stats(const struct disk_in *d, uint64_t *total, uint64_t *transferred,
		    uint64_t *data_chunks, uint64_t *zero_chunks, uint64_t *data_bytes)
{
	*total = d->started ? blkfile__size(d->file) : 0;
	*transferred = d->wire_bytes;
	*data_chunks = d->data_chunks;
	*zero_chunks = d->zero_chunks;
	*data_bytes = d->data_bytes;
}

/* The image is written through the page cache, and the kernel would
 * write it back only after 30 s or past its dirty limits: without help the
 * flush at the switchover wrote the whole disk, hundreds of milliseconds of
 * downtime for 1 GiB.  Every DISK_IN_WRITEBACK bytes of data the kernel is
 * told to start on what came (not waited for), so the flush finds only the
 * last of it. */
#define DISK_IN_WRITEBACK (8ull << 20)

static void disk_in__writeback(struct disk_in *d, uint64_t len)
{
	d->wb_bytes += len;
	if (d->wb_bytes < DISK_IN_WRITEBACK)
		return;
	int rc = blkfile__writeback(d->file);
	if (rc)
		log_debug("incoming migration: image write-back not started: %s", strerror(-rc));
	d->wb_bytes = 0;
}

int disk_in__record(struct disk_in *d, const struct proto_disk *r, char *why, size_t whylen)
{
	/* as the source counts it: header, the record's fields, its data */
	d->wire_bytes += PROTO_HDR_SIZE + PROTO_DISK_HDR +
			 (r->kind == PROTO_DISK_DATA ? r->length : r->kind == PROTO_DISK_SUM ? PROTO_DISK_SUM_LEN : 0);
	if (r->kind == PROTO_DISK_INFO)
		return disk_in__info(d, r, why, whylen);
	if (!d->started) {
		snprintf(why, whylen, "DISK data before its INFO");
		return -EPROTO;
	}
	if (r->kind == PROTO_DISK_SUM)
		return disk_in__check_sum(d, r, why, whylen);
	if (d->sum_ok) {
		snprintf(why, whylen, "DISK data after its SUM");
		return -EPROTO;
	}
	uint64_t size = blkfile__size(d->file);
	if (r->offset > size || r->length > size - r->offset) {
		snprintf(why, whylen, "DISK range 0x%llx+0x%llx lies outside the image (%llu bytes)",
			 (unsigned long long)r->offset, (unsigned long long)r->length,
			 (unsigned long long)size);
		return -EINVAL;
	}
	int rc;
	uint64_t first = r->offset / PROTO_DISK_SECTOR, nsec = r->length / PROTO_DISK_SECTOR;
	if (r->kind == PROTO_DISK_DATA) {
		memcpy(d->buf, r->data, r->length);
		rc = blkfile__write_at(d->file, d->buf, r->length, r->offset);
		d->data_bytes += rc ? 0 : r->length;
		d->data_chunks += rc ? 0 : 1;
		if (!rc)
			disk_in__writeback(d, r->length);
		struct iovec one = { d->buf, (size_t)r->length };
		if (!rc && d->want_sum)
			disksum__set(&d->sum, first, nsec, &one, 1);
	} else {
		rc = blkfile__zero_at(d->file, r->offset, r->length);
		d->zero_bytes += rc ? 0 : r->length;
		d->zero_chunks += rc ? 0 : 1;
		if (!rc && d->want_sum)
			disksum__set(&d->sum, first, nsec, NULL, 0);
	}
	if (rc)
		snprintf(why, whylen, "image %s: writing 0x%llx+0x%llx failed: %s",
			 blkfile__path(d->file), (unsigned long long)r->offset,
			 (unsigned long long)r->length, strerror(-rc));
	d->records += rc ? 0 : 1;
	return rc;
}

int disk_in__complete(struct disk_in *d, char *why, size_t whylen)
{
	if (!d->started)
		return 0;
	if (d->want_sum && !d->sum_ok) {
		snprintf(why, whylen, "the source announced the disk's checksum but sent none");
		return -EPROTO;
	}
	int rc = blkfile__flush(d->file);
	if (!rc)
		rc = blkfile__unmark_incomplete(d->file);
	if (rc)
		snprintf(why, whylen, "image %s: %s", blkfile__path(d->file), strerror(-rc));
	else
		log_info("incoming migration: disk complete: %llu MiB written, %llu MiB zero",
			 (unsigned long long)(d->data_bytes >> 20),
			 (unsigned long long)(d->zero_bytes >> 20));
	return rc;
}
