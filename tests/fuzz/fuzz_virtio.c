/* libFuzzer harness: the virtio-pci transport, split virtqueues and the
 * balloon device model, driven by a fuzzed driver over fake guest RAM (no
 * KVM).  Every input starts from a device reset with the queues laid out
 * at QBASE; then a list of operations (first byte of each: the opcode):
 *   0 MEM   u16 window offset, u8 n, n bytes: guest RAM near the queues
 *   1 MMIO  u16 BAR offset, u8 size, u64 value: a BAR write
 *   2 READ  u16 BAR offset, u8 size: a BAR read
 *   3 CFG   u8 config offset, u8 size, u32 value: a PCI configuration write
 *   4 START u64 features: negotiate and enable every queue
 *   5 BUF   u8 queue, u32 gpa, u32 len, u16 flags, u16 next: one descriptor
 *           made available, then the queue notified
 *   6 HOST  u8 action, u32 value: target, hint start/stop/done, save+load
 *   7 PLUG  u8 variant: from here on a device (reset) that offers hinting
 *           and reporting (0), not hinting (1), not reporting (2), neither
 *           (3): the queue layout follows what is offered and negotiated
 * Every input starts on variant 0.  Checks: every page the device marks dirty lies inside guest RAM, and a
 * state the device saves loads back. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev/balloon.h"
#include "dev/pci.h"
#include "dev/virtio_pci.h"
#include "mem/ram.h"
#include "state/state.h"
#include "vdrv.h"

#define QBASE 0x100000ull
#define QSTRIDE 0x4000ull
#define QSIZE 64
#define WINDOW (BALLOON_NR_VQS * QSTRIDE + 0x10000)

struct drv {
	struct vdrv v;            /* RAM, bus, every queue (vdrv.h) */
	struct balloon *b;
};

static void mark(void *ctx, uint64_t gpa, uint64_t len)
{
	if (!vdrv__in_ram(ctx, gpa, len))
		abort();
}

/* Negotiates, enables every queue and sets DRIVER_OK whatever the device
 * says (no reset, the rings as the input left them). */
static void start(struct drv *d, uint64_t features)
{
	(void)vdrv__negotiate(&d->v, features);
	(void)vdrv__driver_ok(&d->v);
}

static void buffer(struct drv *d, unsigned q, uint32_t gpa, uint32_t len, uint16_t flags,
		   uint16_t next)
{
	(void)vdrv__add_desc(&d->v, q, &(struct vdrv_desc){ gpa, len, flags, next });
	(void)vdrv__kick(&d->v, q);
}

static int put(void *ctx, uint32_t id, uint32_t ver, uint32_t inst, const void *data, size_t len)
{
	struct drv *d = ctx;
	char why[256];
	(void)id, (void)ver, (void)inst;
	void *copy = malloc(len);
	memcpy(copy, data, len);
	if (balloon__load(d->b, copy, len, why, sizeof(why))) {
		fprintf(stderr, "saved state does not load back: %s\n", why);
		abort();        /* what the device saved must load back */
	}
	free(copy);
	return 0;
}

static void host(struct drv *d, uint8_t action, uint32_t v)
{
	switch (action % 5) {
	case 0: (void)balloon__set_target(d->b, (uint64_t)v << 12); break;
	case 1: (void)balloon__hint_start(d->b); break;
	case 2: balloon__hint_stop(d->b); break;
	case 3: balloon__hint_done(d->b); break;
	default: if (balloon__save(d->b, put, d)) abort(); break;
	}
}

#define VARIANTS 4

/* Device variant v (see PLUG), created on first use, reset. */
static struct drv *setup(unsigned v)
{
	static struct drv ds[VARIANTS];
	static bool made[VARIANTS];
	struct drv *d = &ds[v];
	if (!made[v]) {
		log__set_level(LOG_ERROR);  /* a broken driver is warned about per buffer */
		const struct vdrv_conf vc = { .ram_size = RAM_MIN_SIZE, .bar = BALLOON_BAR_GPA,
					      .qbase = QBASE, .qstride = QSTRIDE,
					      .nq = BALLOON_NR_VQS, .qsize = QSIZE };
		if (vdrv__init(&d->v, &vc))
			abort();
		struct balloon_conf c = { .ram = &d->v.ram, .mark = mark, .mark_ctx = &d->v,
					  .irq_line = BALLOON_IRQ, .bar_gpa = BALLOON_BAR_GPA,
					  .no_free_page_hint = v & 1, .no_reporting = v & 2 };
		if (balloon__create(&d->b, &c) ||
		    vdrv__plug(&d->v, BALLOON_PCI_SLOT, balloon__pci(d->b)))
			abort();
		/* the BAR where the firmware would put it, memory decoding on */
		vdrv__cfg_write(&d->v, BALLOON_PCI_SLOT, PCI_COMMAND,
				PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER, 2);
		made[v] = true;
	}
	(void)vdrv__write(&d->v, VIRTIO_PCI_STATUS, 0, 1);      /* reset */
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct drv *d = setup(0);
	size_t off = 0;
	while (off < size) {
		uint8_t op = data[off++] % 8;
		uint64_t a = 0;
		uint8_t n;
		switch (op) {
		case 0:
			a = get(data, &off, size, 2) % (WINDOW - 256);
			n = (uint8_t)get(data, &off, size, 1);
			if (off + n > size)
				n = (uint8_t)(size - off < 256 ? size - off : 0);
			memcpy(ram__gpa_to_host(&d->v.ram, QBASE + a, 256), data + off, n);
			off += n;
			break;
		case 1:
			a = get(data, &off, size, 2) % VIRTIO_PCI_BAR_SIZE;
			n = (uint8_t)(1u << (get(data, &off, size, 1) & 3));
			(void)vdrv__write(&d->v, a, get(data, &off, size, 8), n);
			break;
		case 2:
			a = get(data, &off, size, 2) % VIRTIO_PCI_BAR_SIZE;
			n = (uint8_t)(1u << (get(data, &off, size, 1) & 3));
			(void)vdrv__read(&d->v, a, n);
			break;
		case 3: {
			unsigned reg = (unsigned)get(data, &off, size, 1) & 0xfc;
			n = (uint8_t)(1u << (get(data, &off, size, 1) % 3));
			uint32_t v = (uint32_t)get(data, &off, size, 4);
			vdrv__cfg_write(&d->v, BALLOON_PCI_SLOT, reg, v, n);
			break;
		}
		case 4:
			start(d, get(data, &off, size, 8));
			break;
		case 5: {
			unsigned q = (unsigned)get(data, &off, size, 1) % BALLOON_NR_VQS;
			uint32_t gpa = (uint32_t)get(data, &off, size, 4);
			uint32_t len = (uint32_t)get(data, &off, size, 4);
			uint16_t fl = (uint16_t)get(data, &off, size, 2), nx = (uint16_t)get(data, &off, size, 2);
			buffer(d, q, gpa, len, fl, nx);
			break;
		}
		case 6:
			a = get(data, &off, size, 1);
			host(d, (uint8_t)a, (uint32_t)get(data, &off, size, 4));
			break;
		default:
			d = setup((unsigned)get(data, &off, size, 1) % VARIANTS);
			break;
		}
	}
	return 0;
}
