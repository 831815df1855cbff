/* libFuzzer harness: the balloon's migration state loader (virtio-pci
 * transport, configuration, ballooned ranges or bitmap) on fake guest RAM.
 * Input "P" + n x (u32 offset, u8 byte): those bytes overwritten in a valid
 * state the harness saved from a working device (so the fuzzer starts deep
 * in the format); any other input is loaded as it is.  A state that loads
 * is saved again and must load back. */
#include <stdlib.h>
#include <string.h>

#include "dev/balloon.h"
#include "dev/pci.h"
#include "mem/ram.h"
#include "state/state.h"

static void mark(void *ctx, uint64_t gpa, uint64_t len) { (void)ctx, (void)gpa, (void)len; }
static void irq(void *ctx, bool level) { (void)ctx, (void)level; }

struct saved { uint8_t *buf; size_t len; };

static int put(void *ctx, uint32_t id, uint32_t ver, uint32_t inst, const void *data, size_t len)
{
	struct saved *s = ctx;
	(void)id, (void)ver, (void)inst;
	s->buf = malloc(len);
	memcpy(s->buf, data, len);
	s->len = len;
	return 0;
}

static struct balloon *device(struct ram *ram)
{
	struct balloon *b;
	struct balloon_conf c = { .ram = ram, .mark = mark, .irq = irq,
				  .irq_line = BALLOON_IRQ, .bar_gpa = BALLOON_BAR_GPA };
	if (balloon__create(&b, &c))
		abort();
	return b;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct ram ram;
	static struct balloon *b;
	static struct saved base;
	if (!b) {
		if (ram__create(&ram, -1, 128u << 20))
			abort();
		b = device(&ram);
		if (balloon__save(b, put, &base))
			abort();
	}
	char why[256];
	uint8_t *in = NULL;
	size_t len = size;
	if (size >= 1 && data[0] == 'P') {
		in = malloc(base.len);
		memcpy(in, base.buf, base.len);
		for (size_t i = 1; i + 5 <= size; i += 5) {
			uint32_t off;
			memcpy(&off, data + i, 4);
			in[off % base.len] = data[i + 4];
		}
		len = base.len;
	}
	if (balloon__load(b, in ? in : data, len, why, sizeof(why)) == 0) {
		struct saved s = { 0 };
		if (balloon__save(b, put, &s) || balloon__load(b, s.buf, s.len, why, sizeof(why)))
			abort();
		free(s.buf);
	}
	free(in);
	return 0;
}
