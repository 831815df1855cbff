/* libFuzzer harness: the virtio-net device model behind the virtio-pci
 * transport, driven by a fuzzed driver over fake guest RAM and a fuzzed
 * network on a socket pair standing for the tap (no KVM).  Every input
 * starts from a device reset with the queues laid out at QBASE; then a
 * list of operations (first byte of each: the opcode):
 *   0 MEM   u16 window offset, u8 n, n bytes: guest RAM near the queues
 *   1 MMIO  u16 BAR offset, u8 size, u64 value: a BAR write
 *   2 READ  u16 BAR offset, u8 size: a BAR read
 *   3 START u64 features: negotiate and enable every queue
 *   4 BUF   u8 queue, u32 gpa, u32 len, u16 flags, u16 next: one
 *           descriptor made available, then the queue notified
 *   5 FRAME u16 n, n bytes: a frame (with its 12-byte header) arrives
 *           from the network and the device is told the tap is readable
 *   6 HOST  u8 action, u32 value: link down/up, an announcement, a
 *           save and load back, drop the tap's backlog
 * Checks: every write the device reports lies inside guest RAM, and a
 * state the device saves loads back. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "dev/net.h"
#include "dev/pci.h"
#include "dev/virtio_pci.h"
#include "mem/ram.h"
#include "state/state.h"
#include "vdrv.h"

#define QBASE 0x100000ull
#define QSTRIDE 0x4000ull
#define QSIZE 64
#define WINDOW (NET_NR_VQS * QSTRIDE + 0x10000)
#define BAR 0xe0004000ull

struct drv {
	struct vdrv v;            /* RAM, bus, the three queues (vdrv.h) */
	struct net *n;
	int sv[2];
};

static void mark(void *ctx, uint64_t gpa, uint64_t len)
{
	if (!vdrv__in_ram(ctx, gpa, len))
		abort();
}

/* The backend's hooks: the watch and offload paths run too. */
static void wants_read(void *ctx, bool on)
{
	(void)ctx, (void)on;
}

static int offload(void *ctx, unsigned flags)
{
	(void)ctx;
	return flags & ~(unsigned)(NET_OFFLOAD_CSUM | NET_OFFLOAD_TSO4 | NET_OFFLOAD_TSO6) ? -22 : 0;
}

/* Negotiates, enables every queue and sets DRIVER_OK whatever the
 * device says (no reset, the rings as the input left them). */
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
	if (net__load(d->n, copy, len, why, sizeof(why))) {
		fprintf(stderr, "saved state does not load back: %s\n", why);
		abort();        /* what the device saved must load back */
	}
	free(copy);
	return 0;
}

static void drain_network(struct drv *d)
{
	uint8_t buf[NET_HDR_LEN + NET_FRAME_MAX];
	while (recv(d->sv[1], buf, sizeof(buf), MSG_DONTWAIT) > 0)
		;
}

static void host(struct drv *d, uint8_t action)
{
	switch (action % 5) {
	case 0: net__set_link(d->n, false); break;
	case 1: net__set_link(d->n, true); break;
	case 2: net__announce_once(d->n); break;
	case 3: if (net__save(d->n, put, d)) abort(); break;
	default: (void)net__drop_backlog(d->n); break;
	}
	drain_network(d);
}

static struct drv *setup(void)
{
	static struct drv dv;
	static bool made;
	struct drv *d = &dv;
	if (!made) {
		log__set_level(LOG_ERROR);  /* a broken driver is warned about per buffer */
		const struct vdrv_conf vc = { .ram_size = RAM_MIN_SIZE, .bar = BAR, .qbase = QBASE,
					      .qstride = QSTRIDE, .nq = NET_NR_VQS, .qsize = QSIZE };
		if (vdrv__init(&d->v, &vc) || socketpair(AF_UNIX, SOCK_SEQPACKET, 0, d->sv))
			abort();
		fcntl(d->sv[0], F_SETFL, O_NONBLOCK);
		fcntl(d->sv[1], F_SETFL, O_NONBLOCK);
		struct net_conf c = { .ram = &d->v.ram, .mark = mark, .mark_ctx = &d->v,
				      .irq_line = 11, .bar_gpa = BAR,
				      .mac = { 0x52, 0x54, 0, 0x12, 0x34, 0x56 }, .mtu = 1500,
				      .offloads = NET_OFFLOAD_CSUM | NET_OFFLOAD_TSO4 | NET_OFFLOAD_TSO6,
				      .backend = { d->sv[0], offload, wants_read, NULL } };
		if (net__create(&d->n, &c) || vdrv__plug(&d->v, 4, net__pci(d->n)))
			abort();
		vdrv__cfg_write(&d->v, 4, PCI_COMMAND, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER, 2);
		made = true;
	}
	(void)vdrv__write(&d->v, VIRTIO_PCI_STATUS, 0, 1);      /* reset */
	(void)net__drop_backlog(d->n);
	drain_network(d);
	vdrv__rings_reset(&d->v);
	memset(ram__gpa_to_host(&d->v.ram, QBASE, WINDOW), 0, WINDOW);
	net__set_link(d->n, true);
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
			unsigned q = (unsigned)get(data, &off, size, 1) % NET_NR_VQS;
			uint32_t gpa = (uint32_t)get(data, &off, size, 4);
			uint32_t len = (uint32_t)get(data, &off, size, 4);
			uint16_t fl = (uint16_t)get(data, &off, size, 2), nx = (uint16_t)get(data, &off, size, 2);
			buffer(d, q, gpa, len, fl, nx);
			drain_network(d);
			break;
		}
		case 5:
			n = (size_t)get(data, &off, size, 2);
			if (off + n > size)
				n = off < size ? size - off : 0;
			if (n && send(d->sv[1], data + off, n, MSG_DONTWAIT) < 0)
				break;
			off += n;
			net__backend_readable(d->n);
			break;
		default:
			host(d, (uint8_t)get(data, &off, size, 1));
			(void)get(data, &off, size, 4);
			break;
		}
	}
	return 0;
}
