#include "mig/send/disk_out.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dev/blkfile.h"
#include "mig/wire/proto.h"

#define SECTOR PROTO_DISK_SECTOR

static void disk_out__on_write(void *ctx, uint64_t off, uint64_t len, enum blkfile_change what,
			       const struct iovec *iov, unsigned niov)
{
	struct disk_out *d = ctx;
	if (!len || off >= d->size)
		return;
	uint64_t last = (off + len - 1) / DISK_OUT_CHUNK;
	uint64_t end = off + len < d->size ? off + len : d->size;
	if (d->sum_on) {
		pthread_mutex_lock(&d->lock);
		for (uint64_t c = off / DISK_OUT_CHUNK; c <= last && c < d->nchunks; c++)
			d->gen[c]++;
		uint64_t first = off / SECTOR, n = (len + off % SECTOR + SECTOR - 1) / SECTOR;
		if (what == BLKFILE_CHANGED_UNKNOWN || off % SECTOR || len % SECTOR)
			disksum__forget(&d->sum, first, n);
		else
			disksum__set(&d->sum, first, n, what == BLKFILE_CHANGED_DATA ? iov : NULL, niov);
		pthread_mutex_unlock(&d->lock);
	}
	/* one atomic OR per word of the map, not per block: a discard of a
	 * large range costs its words, on the backend's worker */
	uint64_t first = off / DISK_OUT_BLOCK;
	bitmap__set_range(&d->dirty, first, (end - 1) / DISK_OUT_BLOCK - first + 1);
}

/* The digests of [from, to), a hole, unless a write told them first. */
static void disk_out__hole(struct disk_out *d, uint64_t from, uint64_t to)
{
	if (!d->sum_on || from >= to)
		return;
	pthread_mutex_lock(&d->lock);
	for (uint64_t i = from / SECTOR; i < to / SECTOR; i++)
		if (!bitmap__test(&d->sum.known, i))
			disksum__set(&d->sum, i, 1, NULL, 0);
	pthread_mutex_unlock(&d->lock);
}

/* todo: every chunk that may hold data; with the digests, the holes are
 * zero. */
static int disk_out__scan(struct disk_out *d)
{
	uint64_t off = 0, start, end;
	int rc;
	while ((rc = blkfile__next_data(d->file, off, &start, &end)) == 0) {
		uint64_t first = start / DISK_OUT_BLOCK;
		uint64_t last = (end - 1) / DISK_OUT_BLOCK;
		bitmap__set_range(&d->todo, first, last - first + 1);
		disk_out__hole(d, off, start / SECTOR * SECTOR);
		off = end;
	}
	if (rc == -ENXIO)
		disk_out__hole(d, off, d->size);
	return rc == -ENXIO ? 0 : rc;
}

int disk_out__start(struct disk_out *d, struct blkfile *f, bool sum)
{
	memset(d, 0, sizeof(*d));
	pthread_mutex_init(&d->lock, NULL);
	d->file = f;
	d->size = blkfile__size(f);
	d->nchunks = (d->size + DISK_OUT_CHUNK - 1) / DISK_OUT_CHUNK;
	d->nblocks = (d->size + DISK_OUT_BLOCK - 1) / DISK_OUT_BLOCK;
	int rc = bitmap__init(&d->dirty, d->nblocks);
	if (!rc)
		rc = bitmap__init(&d->todo, d->nblocks);
	if (!rc && sum) {
		d->sum_on = true;
		rc = disksum__init(&d->sum, d->size / SECTOR, false);
		d->gen = rc ? NULL : calloc(d->nchunks ? d->nchunks : 1, sizeof(*d->gen));
		rc = rc ? rc : d->gen ? 0 : -ENOMEM;
	}
	if (!rc && posix_memalign((void **)&d->buf, 4096, DISK_OUT_CHUNK))
		rc = -ENOMEM;
	if (rc) {
		disk_out__stop(d);
		return rc;
	}
	/* the hook before the scan: a hole written meanwhile is not missed */
	blkfile__set_write_hook(f, disk_out__on_write, d);
	d->hooked = true;
	rc = disk_out__scan(d);
	if (rc)
		disk_out__stop(d);
	return rc;
}

void disk_out__stop(struct disk_out *d)
{
	if (d->hooked)
		blkfile__set_write_hook(d->file, NULL, NULL);
	d->hooked = false;
	bitmap__free(&d->dirty);
	bitmap__free(&d->todo);
	free(d->buf);
	d->buf = NULL;
	if (d->sum_on)
		disksum__free(&d->sum);
	free(d->gen);
	d->gen = NULL;
	d->sum_on = false;
}

uint64_t disk_out__collect(struct disk_out *d)
{
	uint64_t n = 0;
	for (size_t i = 0; i < BITMAP_WORDS(d->nblocks); i++) {
		uint64_t w = __atomic_exchange_n(&d->dirty.words[i], 0, __ATOMIC_ACQ_REL);
		n += (uint64_t)__builtin_popcountll(w & ~d->todo.words[i]);
		d->todo.words[i] |= w;
		d->dirtied += (uint64_t)__builtin_popcountll(w);
	}
	return n;
}

static uint64_t disk_out__bytes(const struct disk_out *d, uint64_t blocks)
{
	uint64_t b = blocks * DISK_OUT_BLOCK;
	return b < d->size ? b : d->size;
}

uint64_t disk_out__pending(const struct disk_out *d)
{
	uint64_t n = 0;
	for (size_t i = 0; i < BITMAP_WORDS(d->nblocks); i++)
		n += (uint64_t)__builtin_popcountll(
			__atomic_load_n(&d->dirty.words[i], __ATOMIC_RELAXED) | d->todo.words[i]);
	return disk_out__bytes(d, n);
}

uint64_t disk_out__dirty_bytes(const struct disk_out *d)
{
	return disk_out__bytes(d, bitmap__count(&d->dirty));
}

static bool disk_out__is_zero(const uint8_t *p, uint64_t len)
{
	const uint64_t *w = (const uint64_t *)p;
	for (uint64_t i = 0; i < len / 8; i++)
		if (w[i])
			return false;
	return true;
}

/* The blocks of todo from b on that follow one another inside b's chunk,
 * cleared: how many. */
static uint64_t disk_out__run(struct disk_out *d, uint64_t b)
{
	uint64_t end = (b / DISK_OUT_CHUNK_BLOCKS + 1) * DISK_OUT_CHUNK_BLOCKS, n = 0;
	end = end < d->nblocks ? end : d->nblocks;
	while (b + n < end && bitmap__test(&d->todo, b + n))
		bitmap__clear_bit(&d->todo, b + n++);
	return n;
}

int disk_out__take(struct disk_out *d, uint64_t *block, uint64_t *off, uint64_t *len,
		   bool *zero)
{
	size_t b = bitmap__next_set(&d->todo, *block);
	if (b >= d->nblocks)
		return -ENOENT;
	uint64_t n = disk_out__run(d, b), c = b / DISK_OUT_CHUNK_BLOCKS;
	*block = b + n;
	*off = (uint64_t)b * DISK_OUT_BLOCK;
	*len = d->size - *off < n * DISK_OUT_BLOCK ? d->size - *off : n * DISK_OUT_BLOCK;
	uint32_t g0 = 0;
	if (d->sum_on) {
		pthread_mutex_lock(&d->lock);
		g0 = d->gen[c];
		pthread_mutex_unlock(&d->lock);
	}
	int rc = blkfile__read_at(d->file, d->buf, (size_t)*len, *off);
	if (rc) {
		bitmap__set_range(&d->todo, b, n);   /* not sent: still to send */
		return rc;
	}
	*zero = disk_out__is_zero(d->buf, *len);
	if (d->sum_on) {                    /* what no write has told yet */
		pthread_mutex_lock(&d->lock);
		if (d->gen[c] == g0)
			disksum__learn(&d->sum, *off / SECTOR, *len / SECTOR, d->buf);
		pthread_mutex_unlock(&d->lock);
	}
	return 0;
}

/* Whether every sector of [first, first + n) has its digest (lock held
 * or the hook quiet: the guest stopped). */
static bool disk_out__known(const struct disk_out *d, uint64_t first, uint64_t n)
{
	for (uint64_t i = first; i < first + n; i++)
		if (!bitmap__test(&d->sum.known, i))
			return false;
	return true;
}

int disk_out__sum(struct disk_out *d, uint64_t *sum)
{
	pthread_mutex_lock(&d->lock);
	uint64_t unknown = disksum__unknown(&d->sum);
	pthread_mutex_unlock(&d->lock);
	for (uint64_t c = 0; unknown && c < d->nchunks; c++) {
		uint64_t off = c * DISK_OUT_CHUNK, first = off / SECTOR;
		uint64_t len = d->size - off < DISK_OUT_CHUNK ? d->size - off : DISK_OUT_CHUNK;
		if (disk_out__known(d, first, len / SECTOR))
			continue;
		int rc = blkfile__read_at(d->file, d->buf, (size_t)len, off);
		if (rc)
			return rc;
		pthread_mutex_lock(&d->lock);
		disksum__learn(&d->sum, first, len / SECTOR, d->buf);
		unknown = disksum__unknown(&d->sum);
		pthread_mutex_unlock(&d->lock);
	}
	pthread_mutex_lock(&d->lock);
	*sum = d->sum.sum;
	pthread_mutex_unlock(&d->lock);
	return 0;
}
