/* libFuzzer harness: the virtio-blk device model behind the virtio-pci
 * transport, driven by a fuzzed driver over fake guest RAM, its backend a
 * real 1 MiB image file in a temporary directory (no KVM).  Every input
 * starts from a device reset with the queue laid out at QBASE; then a list
 * of operations (first byte of each: the opcode):
 *   0 MEM   u16 window offset, u8 n, n bytes: guest RAM near the queue
 *           (request headers, discard segments, descriptors)
 *   1 MMIO  u16 BAR offset, u8 size, u64 value: a BAR write
 *   2 READ  u16 BAR offset, u8 size: a BAR read
 *   3 START u64 features: negotiate and enable the queue
 *   4 BUF   u32 gpa, u32 len, u16 flags, u16 next: one descriptor made
 *           available, then the queue notified
 *   5 DRAIN wait for every request in flight, flush
 *   6 SAVE  drain, save the state and load it back
 * Checks: every write the device reports lies inside guest RAM, the image
 * keeps its size, a drain leaves nothing in flight, and a state the
 * device saves loads back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dev/blk.h"
#include "dev/blkfile.h"
#include "dev/pci.h"
#include "dev/virtio_pci.h"
#include "mem/ram.h"
#include "state/state.h"
#include "vdrv.h"

#define QBASE 0x100000ull
#define QSIZE 64
#define WINDOW 0x20000
#define BAR 0xe0008000ull
#define IMG (1u << 20)

struct drv {
	struct vdrv v;            /* RAM, bus, the queue (vdrv.h) */
	struct blkfile *f;
	struct blk *b;
	char path[64];
};

static void mark(void *ctx, uint64_t gpa, uint64_t len)
{
	if (!vdrv__in_ram(ctx, gpa, len))
		abort();
}

/* Negotiates, enables the queue and sets DRIVER_OK whatever the device
 * says (no reset, the rings as the input left them). */
static void start(struct drv *d, uint64_t features)
{
	(void)vdrv__negotiate(&d->v, features);
	(void)vdrv__driver_ok(&d->v);
}

static void buffer(struct drv *d, uint32_t gpa, uint32_t len, uint16_t flags, uint16_t next)
{
	(void)vdrv__add_desc(&d->v, 0, &(struct vdrv_desc){ gpa, len, flags, next });
	(void)vdrv__kick(&d->v, 0);
}

static int put(void *ctx, uint32_t id, uint32_t ver, uint32_t inst, const void *data, size_t len)
{
	struct drv *d = ctx;
	char why[256];
	(void)id, (void)inst;
	void *copy = malloc(len);
	memcpy(copy, data, len);
	if (blk__load(d->b, ver, copy, len, why, sizeof(why))) {
		fprintf(stderr, "saved state does not load back: %s\n", why);
		abort();
	}
	free(copy);
	return 0;
}

static struct drv *setup(void)
{
	static struct drv dv;
	static bool made;
	struct drv *d = &dv;
	if (!made) {
		char err[256];
		log__set_level(LOG_ERROR);
		snprintf(d->path, sizeof(d->path), "/tmp/kmig-fuzz-blk-%d.img", (int)getpid());
		FILE *f = fopen(d->path, "w");
		if (!f || ftruncate(fileno(f), IMG) || fclose(f))
			abort();
		struct blkfile_conf fc = { .path = d->path, .discard_unmap = true };
		const struct vdrv_conf vc = { .ram_size = RAM_MIN_SIZE, .bar = BAR, .qbase = QBASE,
					      .qstride = VDRV_RING_BYTES, .nq = 1, .qsize = QSIZE };
		if (blkfile__open(&d->f, &fc, err, sizeof(err)) || vdrv__init(&d->v, &vc))
			abort();
		unlink(d->path);    /* gone with the process; the fd keeps it */
		struct blk_conf c = { .ram = &d->v.ram, .mark = mark, .mark_ctx = &d->v,
				      .irq_line = 5, .bar_gpa = BAR,
				      .file = d->f, .logical_block_size = 512, .writeback = true,
				      .discard = true, .serial = "fuzz" };
		if (blk__create(&d->b, &c) || vdrv__plug(&d->v, 5, blk__pci(d->b)))
			abort();
		vdrv__cfg_write(&d->v, 5, PCI_COMMAND, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER, 2);
		made = true;
	}
	(void)vdrv__write(&d->v, VIRTIO_PCI_STATUS, 0, 1);  /* reset: waits for requests in flight */
	vdrv__rings_reset(&d->v);
	memset(ram__gpa_to_host(&d->v.ram, QBASE, WINDOW), 0, WINDOW);
	return d;
}

static uint64_t get(const uint8_t *p, size_t *off, size_t size, unsigned n)
{
	uint64_t v = 0;
	if (*off + n <= size)
		memcpy(&v, p + *off, n);
	*off += n;
	return v;
}

static void check_drained(struct drv *d)
{
	struct blk_stats st;
	(void)blk__drain(d->b, 0);
	blk__get_stats(d->b, &st);
	if (st.inflight || blkfile__size(d->f) != IMG)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct drv *d = setup();
	size_t off = 0;
	while (off < size) {
		uint8_t op = data[off++] % 7;
		uint64_t a = 0;
		size_t n;
		switch (op) {
		case 0:
			a = get(data, &off, size, 2) % (WINDOW - 256);
			n = (uint8_t)get(data, &off, size, 1);
			if (off + n > size)
				n = size - off < 256 ? size - off : 0;
			memcpy(ram__gpa_to_host(&d->v.ram, QBASE + a, 256), data + off, n);
			off += n;
			break;
		case 1:
			a = get(data, &off, size, 2) % VIRTIO_PCI_BAR_SIZE;
			n = 1u << (get(data, &off, size, 1) & 3);
			(void)vdrv__write(&d->v, a, get(data, &off, size, 8), (unsigned)n);
			break;
		case 2:
			a = get(data, &off, size, 2) % VIRTIO_PCI_BAR_SIZE;
			n = 1u << (get(data, &off, size, 1) & 3);
			(void)vdrv__read(&d->v, a, (unsigned)n);
			break;
		case 3:
			start(d, get(data, &off, size, 8));
			break;
		case 4: {
			uint32_t gpa = (uint32_t)get(data, &off, size, 4);
			uint32_t len = (uint32_t)get(data, &off, size, 4);
			uint16_t fl = (uint16_t)get(data, &off, size, 2), nx = (uint16_t)get(data, &off, size, 2);
			buffer(d, gpa, len, fl, nx);
			break;
		}
		case 5:
			check_drained(d);
			break;
		default:
			check_drained(d);
			if (blk__save(d->b, put, d))
				abort();
			break;
		}
	}
	check_drained(d);
	return 0;
}
