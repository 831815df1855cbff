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

#define QBASE 0x100000ull
#define QSTRIDE 0x4000ull
#define QSIZE 64
#define WINDOW (BALLOON_NR_VQS * QSTRIDE + 0x10000)

struct drv {
	struct ram ram;
	struct pci_bus bus;
	struct balloon *b;
	uint16_t avail[BALLOON_NR_VQS], desc[BALLOON_NR_VQS];
};

static void mark(void *ctx, uint64_t gpa, uint64_t len)
{
	(void)ctx;
	if (!len || gpa >= RAM_MIN_SIZE || len > RAM_MIN_SIZE - gpa)
		abort();
}

static void mw(struct drv *d, uint64_t off, uint64_t v, unsigned len)
{
	pci__mmio(&d->bus, BALLOON_BAR_GPA + off, true, &v, len);
}

static void start(struct drv *d, uint64_t features)
{
	const uint8_t s = VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER;
	mw(d, VIRTIO_PCI_STATUS, s, 1);
	mw(d, VIRTIO_PCI_GFSELECT, 0, 4);
	mw(d, VIRTIO_PCI_GF, features & 0xffffffff, 4);
	mw(d, VIRTIO_PCI_GFSELECT, 1, 4);
	mw(d, VIRTIO_PCI_GF, features >> 32, 4);
	mw(d, VIRTIO_PCI_STATUS, s | VIRTIO_STATUS_FEATURES_OK, 1);
	for (unsigned q = 0; q < BALLOON_NR_VQS; q++) {
		uint64_t base = QBASE + q * QSTRIDE;
		mw(d, VIRTIO_PCI_Q_SELECT, q, 2);
		mw(d, VIRTIO_PCI_Q_SIZE, QSIZE, 2);
		mw(d, VIRTIO_PCI_Q_DESC, base, 8);
		mw(d, VIRTIO_PCI_Q_AVAIL, base + 0x1000, 8);
		mw(d, VIRTIO_PCI_Q_USED, base + 0x2000, 8);
		mw(d, VIRTIO_PCI_Q_ENABLE, 1, 2);
	}
	mw(d, VIRTIO_PCI_STATUS, s | VIRTIO_STATUS_FEATURES_OK | VIRTIO_STATUS_DRIVER_OK, 1);
}

static void buffer(struct drv *d, unsigned q, uint32_t gpa, uint32_t len, uint16_t flags,
		   uint16_t next)
{
	uint8_t *base = ram__gpa_to_host(&d->ram, QBASE + q * QSTRIDE, 0x3000);
	uint16_t i = d->desc[q]++ % QSIZE, slot = d->avail[q] % QSIZE;
	uint64_t addr = gpa;
	memcpy(base + i * 16, &addr, 8);
	memcpy(base + i * 16 + 8, &len, 4);
	memcpy(base + i * 16 + 12, &flags, 2);
	memcpy(base + i * 16 + 14, &next, 2);
	memcpy(base + 0x1000 + 4 + slot * 2, &i, 2);
	d->avail[q]++;
	memcpy(base + 0x1000 + 2, &d->avail[q], 2);
	mw(d, VIRTIO_PCI_NOTIFY + q * VIRTIO_PCI_NOTIFY_MULT, q, 2);
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
		if (ram__create(&d->ram, -1, RAM_MIN_SIZE))
			abort();
		pci__init(&d->bus);
		struct balloon_conf c = { .ram = &d->ram, .mark = mark, .irq_line = BALLOON_IRQ,
					  .bar_gpa = BALLOON_BAR_GPA, .no_free_page_hint = v & 1,
					  .no_reporting = v & 2 };
		if (balloon__create(&d->b, &c) ||
		    pci__add(&d->bus, BALLOON_PCI_SLOT, balloon__pci(d->b)))
			abort();
		/* the BAR where the firmware would put it, memory decoding on */
		uint32_t a = 0x80000000u | BALLOON_PCI_SLOT << 11 | 0x04, cmd = 0x6;
		pci__pio(&d->bus, PCI_CONF_ADDR, true, &a, 4);
		pci__pio(&d->bus, PCI_CONF_DATA, true, &cmd, 2);
		made[v] = true;
	}
	mw(d, VIRTIO_PCI_STATUS, 0, 1);                 /* reset */
	memset(ram__gpa_to_host(&d->ram, QBASE, WINDOW), 0, WINDOW);
	memset(d->avail, 0, sizeof(d->avail));
	memset(d->desc, 0, sizeof(d->desc));
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
		uint64_t a = 0, b = 0;
		uint8_t n;
		switch (op) {
		case 0:
			a = get(data, &off, size, 2) % (WINDOW - 256);
			n = (uint8_t)get(data, &off, size, 1);
			if (off + n > size)
				n = (uint8_t)(size - off < 256 ? size - off : 0);
			memcpy(ram__gpa_to_host(&d->ram, QBASE + a, 256), data + off, n);
			off += n;
			break;
		case 1:
			a = get(data, &off, size, 2) % VIRTIO_PCI_BAR_SIZE;
			n = (uint8_t)(1u << (get(data, &off, size, 1) & 3));
			mw(d, a, get(data, &off, size, 8), n);
			break;
		case 2:
			a = get(data, &off, size, 2) % VIRTIO_PCI_BAR_SIZE;
			n = (uint8_t)(1u << (get(data, &off, size, 1) & 3));
			pci__mmio(&d->bus, BALLOON_BAR_GPA + a, false, &b, n);
			break;
		case 3: {
			uint32_t addr = 0x80000000u | BALLOON_PCI_SLOT << 11 |
					(uint32_t)(get(data, &off, size, 1) & 0xfc);
			n = (uint8_t)(1u << (get(data, &off, size, 1) % 3));
			uint32_t v = (uint32_t)get(data, &off, size, 4);
			pci__pio(&d->bus, PCI_CONF_ADDR, true, &addr, 4);
			pci__pio(&d->bus, PCI_CONF_DATA, true, &v, n);
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
