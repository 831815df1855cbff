/* libFuzzer harness: the migration record decoder and the receiver state
 * machine (main stream, multifd channel, postcopy-preempt channel) on a
 * fake two-block RAM.  Input: byte 0 picks the receiver (bit 0: main
 * stream or multifd channel; bit 1: post-copy hooks, which check each page
 * they are handed lies in RAM; bit 2: the preempt channel's receiver
 * instead, with those hooks; bit 3: the main stream's postcopy-preempt
 * hooks, PREEMPT and the wait at END; bit 4: x-ignore-shared's hooks,
 * START's RAM_SHARED and SHARED), then
 * records back to back, each header taken as it comes (the receiver must
 * refuse a bad one) with its payload cut to what the input holds. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mig/wire/proto.h"
#include "mig/recv/recv.h"

#define B0_PAGES 16
#define B1_PAGES 8

static uint8_t mem[(B0_PAGES + B1_PAGES) * PROTO_PAGE_SIZE];

static int on_state(void *ctx, uint32_t id, uint32_t ver, uint32_t inst, const void *d, size_t n)
{
	(void)ctx, (void)ver, (void)inst;
	/* read the data, so a wrong length shows under ASan */
	uint8_t sum = 0;
	for (size_t i = 0; i < n; i++)
		sum += ((const uint8_t *)d)[i];
	return id == 0xdead || (sum == 0x5a && n == 3) ? -22 : 0;
}

static int on_sync(void *ctx, uint64_t round) { (void)ctx; return round == 7777 ? -5 : 0; }
static int on_channels(void *ctx, uint32_t count, const uint8_t session[PROTO_SESSION_LEN])
{
	(void)ctx;
	return count > 4 || session[0] == 0xff ? -71 : 0;
}

static void in_ram(uint32_t block, uint64_t off)
{
	uint64_t pages = block ? B1_PAGES : B0_PAGES;
	if (block > 1 || off % PROTO_PAGE_SIZE || off / PROTO_PAGE_SIZE >= pages)
		abort();
}
static int on_discard(void *c, uint32_t b, uint64_t o) { (void)c; in_ram(b, o); return 0; }
static int on_postcopy(void *c) { (void)c; return 0; }
static int place_page(void *c, uint32_t b, uint64_t o, const void *d)
{
	(void)c;
	in_ram(b, o);
	volatile uint8_t x = ((const uint8_t *)d)[PROTO_PAGE_SIZE - 1]; /* the page is readable */
	(void)x;
	return 0;
}
static int place_zero(void *c, uint32_t b, uint64_t o) { (void)c; in_ram(b, o); return 0; }
static int on_preempt(void *c, const uint8_t session[PROTO_SESSION_LEN], uint32_t channels)
{
	(void)c;
	if (channels > PROTO_MAX_CHANNELS)
		abort();        /* the decoder lets no more through */
	return session[0] == 0xfe ? -71 : 0;
}
static int on_postcopy_end(void *c) { (void)c; return 0; }
static int on_start(void *c, const struct proto_start *st)
{
	(void)c;
	return st->has_uuid && st->uuid[0] == 0xfe ? -22 : 0;
}
static int on_shared(void *c, uint64_t token)
{
	(void)c;
	if (!token)
		abort();        /* the decoder lets no 0 through */
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct proto_ram ram = { .nr_blocks = 2 };
	ram.blocks[0] = (struct proto_ram_block){ 0, (uint64_t)B0_PAGES * PROTO_PAGE_SIZE, mem };
	ram.blocks[1] = (struct proto_ram_block){ 1ull << 32, (uint64_t)B1_PAGES * PROTO_PAGE_SIZE,
						  mem + (size_t)B0_PAGES * PROTO_PAGE_SIZE };
	struct mig_recv_ops ops = { .on_state = on_state, .on_sync = on_sync,
				    .on_channels = on_channels };
	struct mig_recv r;
	if (size < 1)
		return 0;
	if (data[0] & 6) {
		ops.on_discard = on_discard;
		ops.on_postcopy = on_postcopy;
		ops.place_page = place_page;
		ops.place_zero = place_zero;
	}
	if (data[0] & 8) {
		ops.on_preempt = on_preempt;
		ops.on_postcopy_end = on_postcopy_end;
	}
	if (data[0] & 16) {
		ops.on_start = on_start;
		ops.on_shared = on_shared;
	}
	int rc = data[0] & 4 ? mig_recv__init_preempt(&r, &ram, &ops) :
		 data[0] & 1 ? mig_recv__init_channel(&r, &ram, &ops) : mig_recv__init(&r, &ram, &ops);
	if (rc)
		abort();
	size_t pos = 1;
	while (pos + PROTO_HDR_SIZE <= size) {
		struct proto_hdr h;
		(void)proto__decode_header(data + pos, size - pos, &h);
		pos += PROTO_HDR_SIZE;
		size_t avail = size - pos;
		/* the payload the header claims, or what is left (a short record) */
		size_t n = h.length < avail ? (size_t)h.length : avail;
		uint8_t *payload = malloc(n ? n : 1);
		memcpy(payload, data + pos, n);
		h.length = n;
		rc = mig_recv__feed_record(&r, &h, payload);
		free(payload);
		pos += n;
		if (rc)
			break;
	}
	mig_recv__free(&r);
	return 0;
}
