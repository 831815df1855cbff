/* libFuzzer harness: what a destination sends the source on the return
 * path.  Byte 0 picks the reader (bit 0):
 *   0  post-copy's return-path thread (postcopy_src) reading the rest of
 *      the input as its stream (a memfd): RP_REQ, RP_ACK, RP_RUNNING,
 *      RP_OK, RP_FAIL and anything else; every page it records as wanted must lie
 *      in the fake two-block RAM, and it must end with an outcome (the
 *      input's end reads as a closed connection);
 *   1  a post-copy resume's RP_BITMAP records, decoded one after the other
 *      into a bitmap of the VM's page count, as the source does; no bit
 *      past the page count may be set, and a decoded record must leave the
 *      next word inside the bitmap. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/bitmap.h"
#include "mem/ram.h"
#include "mig/postcopy.h"
#include "mig/wire/proto.h"
#include "mig/wire/stream.h"

#define B_PAGES 512u           /* each block: 2 MiB */
#define RP_NBITS 1000u         /* the resume bitmap: not a multiple of 64 */

static void fake_ram(struct ram *r)
{
	memset(r, 0, sizeof(*r));
	r->vm_fd = -1;
	r->nr_blocks = 2;
	r->npages = 2 * B_PAGES;
	r->size = r->npages * RAM_PAGE_SIZE;
	r->blocks[0] = (struct ram_block){ .gpa = 0, .size = B_PAGES * RAM_PAGE_SIZE };
	r->blocks[1] = (struct ram_block){ .gpa = 1ull << 32, .size = B_PAGES * RAM_PAGE_SIZE,
					   .first_page = B_PAGES };
}

/* no bit set at or past nbits */
static void check_tail(const struct bitmap *b)
{
	size_t words = (b->nbits + 63) / 64;
	if (b->nbits % 64 && b->words[words - 1] >> (b->nbits % 64))
		abort();
	if (bitmap__count(b) > b->nbits)
		abort();
}

static void reader(const uint8_t *data, size_t size)
{
	struct ram ram;
	fake_ram(&ram);
	int fd = memfd_create("rp", 0);
	if (fd < 0 || (size && write(fd, data, size) != (ssize_t)size) || lseek(fd, 0, SEEK_SET))
		abort();
	struct mig_stream s;
	if (mig_stream__init(&s, fd))
		abort();
	struct postcopy_src q;
	if (postcopy_src__init(&q, &s, &ram) || postcopy_src__start(&q))
		abort();
	/* the reader ends at the input's end at the latest (a closed link) */
	while (!atomic_load(&q.outcome))
		postcopy_src__wait(&q, 100);
	check_tail(&q.wanted);
	if (atomic_load(&q.requests) < bitmap__count(&q.wanted) ||
	    memchr(q.error, 0, sizeof(q.error)) == NULL)
		abort();
	postcopy_src__free(&q);
	mig_stream__close(&s);
}

static void resume_bitmap(const uint8_t *data, size_t size)
{
	struct bitmap have;
	if (bitmap__init(&have, RP_NBITS))
		abort();
	size_t pos = 0, words = (RP_NBITS + 63) / 64;
	while (pos + PROTO_HDR_SIZE <= size) {
		struct proto_hdr h;
		const char *why = NULL;
		(void)proto__decode_header(data + pos, size - pos, &h);
		pos += PROTO_HDR_SIZE;
		size_t n = h.length < size - pos ? (size_t)h.length : size - pos;
		uint64_t next = UINT64_MAX;
		if (!proto__decode_rp_bitmap(data + pos, n, &have, &next, &why)) {
			if (next > words)
				abort();
		} else if (!why) {
			abort();    /* a refusal says why */
		}
		check_tail(&have);
		pos += n;
	}
	bitmap__free(&have);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	if (data[0] & 1)
		resume_bitmap(data + 1, size - 1);
	else
		reader(data + 1, size - 1);
	return 0;
}
