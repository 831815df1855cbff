/* The virtio-net device model, driven by a fake driver over fake guest
 * RAM, its backend one end of a SOCK_SEQPACKET socket pair (each message
 * one frame with its 12-byte header, as a tap's); the announcer; the
 * command-line parser of --netdev/--device.  No KVM. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/timeutil.h"
#include "ctl/net_opts.h"
#include "dev/announce.h"
#include "dev/net.h"
#include "dev/pci.h"
#include "harness.h"
#include "vdrv.h"

#define RAM_SIZE (128ull << 20)
#define QBASE 0x100000ull
#define QSTRIDE 0x10000ull
#define QSIZE 64
#define SLOT 4
#define BAR 0xe0004000ull
#define BUFS 0x400000ull      /* receive/transmit buffers from here */

struct drv {
	struct vdrv v;            /* RAM, bus, the three queues, marks, the line */
	struct net *n;
	int sv[2];                /* [0] the device's backend, [1] the "network" */
	uint16_t idx_seen[64];    /* the receive used index each time it was reported */
	unsigned nidx;
	bool reading;
	unsigned offload;
};

/* vdrv__mark, and the receive used index each time its write is reported. */
static void mark(void *ctx, uint64_t gpa, uint64_t len)
{
	struct drv *d = ctx;
	vdrv__mark(&d->v, gpa, len);
	if (gpa == vdrv__used_gpa(&d->v, NET_VQ_RX) + 2 && d->nidx < 64)
		d->idx_seen[d->nidx++] = (uint16_t)vdrv__used_idx(&d->v, NET_VQ_RX);
}

static void wants_read(void *ctx, bool on)
{
	((struct drv *)ctx)->reading = on;
}

static int offload(void *ctx, unsigned flags)
{
	((struct drv *)ctx)->offload = flags;
	return 0;
}

static const uint8_t MAC[6] = { 0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc };

static void drv_init_mac(struct drv *d, const uint8_t *mac, uint16_t mtu)
{
	memset(d, 0, sizeof(*d));
	const struct vdrv_conf vc = { .ram_size = RAM_SIZE, .bar = BAR, .qbase = QBASE,
				      .qstride = QSTRIDE, .nq = NET_NR_VQS, .qsize = QSIZE,
				      .strict = true };
	if (vdrv__init(&d->v, &vc) || socketpair(AF_UNIX, SOCK_SEQPACKET, 0, d->sv))
		abort();
	fcntl(d->sv[0], F_SETFL, O_NONBLOCK);
	fcntl(d->sv[1], F_SETFL, O_NONBLOCK);
	struct net_conf c = {
		.ram = &d->v.ram, .mark = mark, .mark_ctx = d, .irq = vdrv__irq, .irq_ctx = &d->v,
		.irq_line = 11, .bar_gpa = BAR, .mtu = mtu,
		.offloads = NET_OFFLOAD_CSUM | NET_OFFLOAD_TSO4 | NET_OFFLOAD_TSO6,
		.backend = { d->sv[0], offload, wants_read, d },
	};
	memcpy(c.mac, mac, 6);
	if (net__create(&d->n, &c) || vdrv__plug(&d->v, SLOT, net__pci(d->n)))
		abort();
}

static void drv_init(struct drv *d)
{
	drv_init_mac(d, MAC, 1500);
}

static void drv_fini(struct drv *d)
{
	net__destroy(d->n);
	vdrv__fini(&d->v);
	close(d->sv[0]);
	close(d->sv[1]);
}

/* Negotiates features (VERSION_1 added), enables every queue: the status
 * after. */
static uint8_t drv_start(struct drv *d, uint64_t features)
{
	(void)vdrv__start(&d->v, features | 1ull << VIRTIO_F_VERSION_1);
	return vdrv__status(&d->v);
}

/* A frame to dst from src, len bytes after the 12-byte header (payload
 * bytes numbered). */
static size_t mkframe(uint8_t *out, const uint8_t *dst, size_t len)
{
	static const uint8_t src[6] = { 0x02, 0, 0, 0, 0, 9 };
	memset(out, 0, NET_HDR_LEN);
	memcpy(out + NET_HDR_LEN, dst, 6);
	memcpy(out + NET_HDR_LEN + 6, src, 6);
	out[NET_HDR_LEN + 12] = 0x08;
	out[NET_HDR_LEN + 13] = 0x00;
	for (size_t i = 14; i < len; i++)
		out[NET_HDR_LEN + i] = (uint8_t)(i * 7);
	return NET_HDR_LEN + len;
}

static ssize_t net_recv(struct drv *d, uint8_t *buf, size_t cap)
{
	return recv(d->sv[1], buf, cap, MSG_DONTWAIT);
}

static void t_config(struct t *t)
{
	struct drv d;
	drv_init(&d);
	vdrv__write(&d.v, VIRTIO_PCI_DFSELECT, 0, 4);
	uint32_t f = (uint32_t)vdrv__read(&d.v, VIRTIO_PCI_DF, 4);
	uint32_t want = 1u << NET_F_MAC | 1u << NET_F_STATUS | 1u << NET_F_MRG_RXBUF |
			1u << NET_F_CTRL_VQ | 1u << NET_F_CTRL_RX | 1u << NET_F_GUEST_ANNOUNCE |
			1u << NET_F_CTRL_MAC_ADDR | 1u << NET_F_MTU | 1u << NET_F_CSUM |
			1u << NET_F_GUEST_CSUM | 1u << NET_F_HOST_TSO4 | 1u << NET_F_GUEST_TSO4;
	T_CHECK_EQ(t, f & want, want);
	for (unsigned i = 0; i < 6; i++)
		T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_DEVCFG + i, 1), MAC[i]);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_DEVCFG + 6, 2), NET_S_LINK_UP);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_DEVCFG + 8, 2), 1);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_DEVCFG + 10, 2), 1500);
	/* the driver cannot write the MAC through the configuration */
	vdrv__write(&d.v, VIRTIO_PCI_DEVCFG, 0x11, 1);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_DEVCFG, 1), MAC[0]);
	/* the guest's offloads reach the backend at DRIVER_OK, and go at reset */
	T_CHECK_EQ(t, drv_start(&d, 1ull << NET_F_GUEST_CSUM | 1ull << NET_F_GUEST_TSO4), 0x0f);
	T_CHECK_EQ(t, d.offload, NET_OFFLOAD_CSUM | NET_OFFLOAD_TSO4);
	vdrv__write(&d.v, VIRTIO_PCI_STATUS, 0, 1);
	T_CHECK_EQ(t, d.offload, 0);
	drv_fini(&d);
}

static void t_tx(struct t *t)
{
	struct drv d;
	drv_init(&d);
	T_CHECK_EQ(t, drv_start(&d, 1ull << NET_F_MAC), 0x0f);
	uint8_t f[2048], got[2048];
	size_t len = mkframe(f, MAC, 300);
	/* header and frame split across three buffers, oddly */
	memcpy(vdrv__host(&d.v, BUFS), f, 5);
	memcpy(vdrv__host(&d.v, BUFS + 0x1000), f + 5, 100);
	memcpy(vdrv__host(&d.v, BUFS + 0x2000), f + 105, len - 105);
	struct vdrv_seg s[3] = { { BUFS, 5, false }, { BUFS + 0x1000, 100, false },
			    { BUFS + 0x2000, (uint32_t)(len - 105), false } };
	vdrv__add_chain(&d.v, NET_VQ_TX, s, 3);
	vdrv__kick(&d.v, NET_VQ_TX);
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, NET_VQ_TX), 1);
	T_CHECK_EQ(t, net_recv(&d, got, sizeof(got)), (ssize_t)len);
	T_CHECK(t, !memcmp(got, f, len));
	/* a GSO request the driver did not negotiate, a writable buffer, a
	 * runt: each dropped, counted, its chain returned */
	f[1] = 1;
	memcpy(vdrv__host(&d.v, BUFS), f, len);
	struct vdrv_seg one = { BUFS, (uint32_t)len, false };
	vdrv__add_chain(&d.v, NET_VQ_TX, &one, 1);
	memcpy(vdrv__host(&d.v, BUFS + 0x5000), f, len);
	vdrv__host(&d.v, BUFS + 0x5000)[1] = 0;           /* a good header: the writable buffer alone is wrong */
	struct vdrv_seg wr[2] = { { BUFS + 0x5000, (uint32_t)len, false },
				  { BUFS + 0x3000, 64, true } };
	vdrv__add_chain(&d.v, NET_VQ_TX, wr, 2);
	struct vdrv_seg runt = { BUFS, 20, false };
	vdrv__add_chain(&d.v, NET_VQ_TX, &runt, 1);
	vdrv__kick(&d.v, NET_VQ_TX);
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, NET_VQ_TX), 4);
	T_CHECK(t, net_recv(&d, got, sizeof(got)) < 0);
	struct net_stats st;
	net__get_stats(d.n, &st);
	T_CHECK_EQ(t, st.tx_frames, 1);
	T_CHECK_EQ(t, st.tx_errors, 3);
	T_CHECK(t, !(vdrv__status(&d.v) & VIRTIO_STATUS_NEEDS_RESET));
	drv_fini(&d);
}

/* Posts one receive buffer of len bytes at gpa. */
static void post_rx(struct drv *d, uint64_t gpa, uint32_t len)
{
	struct vdrv_seg s = { gpa, len, true };
	vdrv__add_chain(&d->v, NET_VQ_RX, &s, 1);
}

static void t_rx(struct t *t)
{
	struct drv d;
	drv_init(&d);
	T_CHECK_EQ(t, drv_start(&d, 1ull << NET_F_MAC), 0x0f);
	T_CHECK(t, !d.reading);           /* no buffers yet: the backend is not read */
	post_rx(&d, BUFS, 2048);
	vdrv__kick(&d.v, NET_VQ_RX);
	T_CHECK(t, d.reading);
	uint8_t f[2048];
	size_t len = mkframe(f, MAC, 600);
	T_CHECK_EQ(t, send(d.sv[1], f, len, 0), (ssize_t)len);
	vdrv__marks_reset(&d.v);
	net__backend_readable(d.n);
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, NET_VQ_RX), 1);
	T_CHECK_EQ(t, vdrv__used_len(&d.v, NET_VQ_RX, 0), len);
	uint16_t nbuf;
	memcpy(&nbuf, vdrv__host(&d.v, BUFS + 10), 2);
	T_CHECK_EQ(t, nbuf, 1);
	T_CHECK(t, !memcmp(vdrv__host(&d.v, BUFS + NET_HDR_LEN), f + NET_HDR_LEN,
			   len - NET_HDR_LEN));
	/* every byte written reported, the used ring's entry and index too */
	T_CHECK(t, vdrv__marked(&d.v, BUFS, len));
	T_CHECK(t, vdrv__marked(&d.v, vdrv__used_gpa(&d.v, NET_VQ_RX) + 2, 2));
	T_CHECK(t, vdrv__marked(&d.v, vdrv__used_gpa(&d.v, NET_VQ_RX) + 4, 8));
	T_CHECK_EQ(t, d.v.irq_level, 1);
	/* out of buffers: the frame waits, the backend is not read; a new
	 * buffer and a kick deliver it */
	T_CHECK_EQ(t, send(d.sv[1], f, len, 0), (ssize_t)len);
	net__backend_readable(d.n);
	T_CHECK(t, !d.reading);
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, NET_VQ_RX), 1);
	post_rx(&d, BUFS + 0x1000, 2048);
	vdrv__kick(&d.v, NET_VQ_RX);
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, NET_VQ_RX), 2);
	T_CHECK(t, !d.reading);                   /* none left again */
	/* too long for the only chain (no MRG_RXBUF): dropped, the chain kept */
	post_rx(&d, BUFS + 0x2000, 100);
	vdrv__kick(&d.v, NET_VQ_RX);
	T_CHECK_EQ(t, send(d.sv[1], f, len, 0), (ssize_t)len);
	net__backend_readable(d.n);
	size_t small = mkframe(f, MAC, 60);
	T_CHECK_EQ(t, send(d.sv[1], f, small, 0), (ssize_t)small);
	net__backend_readable(d.n);
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, NET_VQ_RX), 3);
	T_CHECK_EQ(t, vdrv__used_len(&d.v, NET_VQ_RX, 2), small);
	struct net_stats st;
	net__get_stats(d.n, &st);
	T_CHECK_EQ(t, st.rx_frames, 3);
	T_CHECK_EQ(t, st.rx_too_long, 1);
	drv_fini(&d);
}

static void t_rx_merge(struct t *t)
{
	struct drv d;
	drv_init(&d);
	T_CHECK_EQ(t, drv_start(&d, 1ull << NET_F_MAC | 1ull << NET_F_MRG_RXBUF), 0x0f);
	post_rx(&d, BUFS, 100);
	post_rx(&d, BUFS + 0x1000, 100);
	vdrv__kick(&d.v, NET_VQ_RX);
	uint8_t f[2048];
	size_t len = mkframe(f, MAC, 250);        /* 262 bytes: three buffers */
	T_CHECK_EQ(t, send(d.sv[1], f, len, 0), (ssize_t)len);
	net__backend_readable(d.n);
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, NET_VQ_RX), 0);   /* two are not enough: it waits */
	post_rx(&d, BUFS + 0x2000, 100);
	vdrv__marks_reset(&d.v);
	d.nidx = 0;
	vdrv__kick(&d.v, NET_VQ_RX);
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, NET_VQ_RX), 3);
	/* the driver sees the three buffers used at once, never one or two */
	T_CHECK_EQ(t, d.nidx, 1);
	T_CHECK_EQ(t, d.idx_seen[0], 3);
	T_CHECK(t, vdrv__marked(&d.v, BUFS, 100) && vdrv__marked(&d.v, BUFS + 0x1000, 100) &&
		   vdrv__marked(&d.v, BUFS + 0x2000, len - 200));
	T_CHECK(t, vdrv__marked(&d.v, vdrv__used_gpa(&d.v, NET_VQ_RX) + 4, 24));
	uint16_t nbuf;
	memcpy(&nbuf, vdrv__host(&d.v, BUFS + 10), 2);
	T_CHECK_EQ(t, nbuf, 3);
	T_CHECK_EQ(t, vdrv__used_len(&d.v, NET_VQ_RX, 0), 100);
	T_CHECK_EQ(t, vdrv__used_len(&d.v, NET_VQ_RX, 2), len - 200);
	T_CHECK(t, !memcmp(vdrv__host(&d.v, BUFS + 0x1000), f + 100, 100));
	T_CHECK(t, !memcmp(vdrv__host(&d.v, BUFS + 0x2000), f + 200, len - 200));
	drv_fini(&d);
	/* a ring too small for the frame whatever the driver posts: the frame
	 * is dropped, not waited for, and the next one comes through */
	drv_init(&d);
	d.v.qsize = 16;
	T_CHECK_EQ(t, drv_start(&d, 1ull << NET_F_MAC | 1ull << NET_F_MRG_RXBUF), 0x0f);
	for (unsigned i = 0; i < 16; i++)
		post_rx(&d, BUFS + 0x1000ull * i, 100);
	vdrv__kick(&d.v, NET_VQ_RX);
	len = mkframe(f, MAC, 2000);
	T_CHECK_EQ(t, send(d.sv[1], f, len, 0), (ssize_t)len);
	net__backend_readable(d.n);
	size_t small = mkframe(f, MAC, 60);
	T_CHECK_EQ(t, send(d.sv[1], f, small, 0), (ssize_t)small);
	net__backend_readable(d.n);
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, NET_VQ_RX), 1);
	T_CHECK_EQ(t, vdrv__used_len(&d.v, NET_VQ_RX, 0), small);
	struct net_stats st;
	net__get_stats(d.n, &st);
	T_CHECK_EQ(t, st.rx_too_long, 1);
	drv_fini(&d);
}

/* Sends one control command; returns the ack byte (0xee: none written). */
static uint8_t ctrl(struct drv *d, uint8_t cls, uint8_t cmd, const void *data, uint32_t len)
{
	uint8_t *p = vdrv__host(&d->v, BUFS + 0x8000);
	p[0] = cls;
	p[1] = cmd;
	if (len)
		memcpy(p + 2, data, len);
	*vdrv__host(&d->v, BUFS + 0x9000) = 0xee;
	struct vdrv_seg s[2] = { { BUFS + 0x8000, 2 + len, false }, { BUFS + 0x9000, 1, true } };
	vdrv__add_chain(&d->v, NET_VQ_CTRL, s, 2);
	vdrv__kick(&d->v, NET_VQ_CTRL);
	return *vdrv__host(&d->v, BUFS + 0x9000);
}

static bool delivered(struct drv *d, const uint8_t *dst)
{
	uint8_t f[256];
	uint16_t before = vdrv__used_idx(&d->v, NET_VQ_RX);
	post_rx(d, BUFS, 2048);
	vdrv__kick(&d->v, NET_VQ_RX);
	size_t len = mkframe(f, dst, 60);
	if (send(d->sv[1], f, len, 0) != (ssize_t)len)
		return false;
	net__backend_readable(d->n);
	return vdrv__used_idx(&d->v, NET_VQ_RX) != before;
}

static void t_filter(struct t *t)
{
	static const uint8_t other[6] = { 0x02, 1, 2, 3, 4, 5 }, mcast[6] = { 0x01, 0, 0x5e, 0, 0, 1 };
	static const uint8_t bcast[6] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };
	struct drv d;
	drv_init(&d);
	uint64_t feat = 1ull << NET_F_MAC | 1ull << NET_F_CTRL_VQ | 1ull << NET_F_CTRL_RX |
			1ull << NET_F_CTRL_MAC_ADDR;
	T_CHECK_EQ(t, drv_start(&d, feat), 0x0f);
	T_CHECK(t, delivered(&d, other));          /* promiscuous until the driver says */
	uint8_t off = 0, on = 1;
	T_CHECK_EQ(t, ctrl(&d, 0, 0, &off, 1), 0);
	T_CHECK(t, !delivered(&d, other));
	T_CHECK(t, delivered(&d, MAC));
	T_CHECK(t, delivered(&d, bcast));
	T_CHECK(t, !delivered(&d, mcast));
	T_CHECK_EQ(t, ctrl(&d, 0, 1, &on, 1), 0);  /* all-multicast */
	T_CHECK(t, delivered(&d, mcast));
	T_CHECK_EQ(t, ctrl(&d, 0, 1, &off, 1), 0);
	/* tables: one unicast, one multicast */
	uint8_t tab[4 + 6 + 4 + 6];
	uint32_t one = 1;
	memcpy(tab, &one, 4);
	memcpy(tab + 4, other, 6);
	memcpy(tab + 10, &one, 4);
	memcpy(tab + 14, mcast, 6);
	T_CHECK_EQ(t, ctrl(&d, 1, 0, tab, sizeof(tab)), 0);
	T_CHECK(t, delivered(&d, other));
	T_CHECK(t, delivered(&d, mcast));
	/* a table whose count runs past the command, a mode without its
	 * byte, a bad class, a multicast MAC as the address: ERR, nothing
	 * changed */
	uint32_t lie = 1000;
	memcpy(tab, &lie, 4);
	T_CHECK_EQ(t, ctrl(&d, 1, 0, tab, sizeof(tab)), 1);
	T_CHECK_EQ(t, ctrl(&d, 0, 0, &on, 0), 1);
	T_CHECK_EQ(t, ctrl(&d, 9, 0, &on, 1), 1);
	T_CHECK_EQ(t, ctrl(&d, 1, 1, mcast, 6), 1);
	T_CHECK(t, delivered(&d, other));
	/* 200 multicast entries, the command split over three buffers: the
	 * multicast class overflows (all pass), accepted */
	uint8_t *big = vdrv__host(&d.v, BUFS + 0xa000);
	uint32_t zero = 0, many = 200;
	big[0] = 1, big[1] = 0;
	memcpy(big + 2, &zero, 4);
	memcpy(big + 6, &many, 4);
	for (unsigned i = 0; i < 200; i++)
		memcpy(big + 10 + 6 * i, mcast, 6);
	*vdrv__host(&d.v, BUFS + 0x9000) = 0xee;
	struct vdrv_seg sp[4] = { { BUFS + 0xa000, 3, false }, { BUFS + 0xa003, 500, false },
			     { BUFS + 0xa000 + 503, 10 + 1200 - 503, false },
			     { BUFS + 0x9000, 1, true } };
	vdrv__add_chain(&d.v, NET_VQ_CTRL, sp, 4);
	vdrv__kick(&d.v, NET_VQ_CTRL);
	T_CHECK_EQ(t, *vdrv__host(&d.v, BUFS + 0x9000), 0);
	struct net_rx_filter of;
	net__get_filter(d.n, &of);
	T_CHECK(t, of.multi_overflow && !of.nmulti && !of.nuni && !of.uni_overflow);
	static const uint8_t mcast2[6] = { 0x01, 0, 0x5e, 0, 0, 7 };
	T_CHECK(t, delivered(&d, mcast2));
	T_CHECK(t, !delivered(&d, other));        /* the unicast table is empty now */
	T_CHECK_EQ(t, ctrl(&d, 1, 0, tab, sizeof(tab)), 1);   /* tab still lies: ERR */
	memcpy(tab, &one, 4);
	T_CHECK_EQ(t, ctrl(&d, 1, 0, tab, sizeof(tab)), 0);
	T_CHECK_EQ(t, ctrl(&d, 1, 1, other, 6), 0);      /* the MAC changes */
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_DEVCFG + 5, 1), other[5]);
	struct net_rx_filter f;
	net__get_filter(d.n, &f);
	T_CHECK(t, !memcmp(f.mac, other, 6) && !f.promisc && f.nuni == 1 && f.nmulti == 1);
	/* a reset gives back the configured MAC and promiscuous mode */
	vdrv__write(&d.v, VIRTIO_PCI_STATUS, 0, 1);
	net__get_filter(d.n, &f);
	T_CHECK(t, !memcmp(f.mac, MAC, 6) && f.promisc && !f.nuni);
	drv_fini(&d);
}

static void t_link_announce(struct t *t)
{
	struct drv d;
	drv_init(&d);
	uint64_t feat = 1ull << NET_F_MAC | 1ull << NET_F_STATUS | 1ull << NET_F_CTRL_VQ |
			1ull << NET_F_GUEST_ANNOUNCE;
	T_CHECK_EQ(t, drv_start(&d, feat), 0x0f);
	(void)vdrv__read(&d.v, VIRTIO_PCI_ISR, 1);
	net__set_link(d.n, false);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_DEVCFG + 6, 2), 0);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_ISR, 1) & VIRTIO_ISR_CONFIG, VIRTIO_ISR_CONFIG);
	uint8_t f[256], got[256];
	size_t len = mkframe(f, MAC, 60);
	memcpy(vdrv__host(&d.v, BUFS + 0x4000), f, len);
	struct vdrv_seg s = { BUFS + 0x4000, (uint32_t)len, false };
	vdrv__add_chain(&d.v, NET_VQ_TX, &s, 1);
	vdrv__kick(&d.v, NET_VQ_TX);
	T_CHECK(t, net_recv(&d, got, sizeof(got)) < 0);
	T_CHECK(t, !delivered(&d, MAC));
	struct net_stats st;
	net__get_stats(d.n, &st);
	T_CHECK_EQ(t, st.tx_link_down, 1);
	T_CHECK_EQ(t, st.rx_link_down, 1);
	net__set_link(d.n, true);
	T_CHECK(t, delivered(&d, MAC));
	/* one announcement: a RARP from the MAC, and the guest asked to
	 * announce itself; its ACK clears the request */
	net__announce_once(d.n);
	T_CHECK_EQ(t, net_recv(&d, got, sizeof(got)), NET_HDR_LEN + 60);
	T_CHECK(t, got[NET_HDR_LEN + 12] == 0x80 && got[NET_HDR_LEN + 13] == 0x35);
	T_CHECK(t, !memcmp(got + NET_HDR_LEN + 6, MAC, 6) && got[NET_HDR_LEN] == 0xff);
	T_CHECK_EQ(t, got[NET_HDR_LEN + 21], 3);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_DEVCFG + 6, 2), NET_S_LINK_UP | NET_S_ANNOUNCE);
	T_CHECK_EQ(t, ctrl(&d, 3, 0, NULL, 0), 0);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_DEVCFG + 6, 2), NET_S_LINK_UP);
	drv_fini(&d);
}

struct saved {
	uint8_t buf[16384];
	size_t len;
	uint32_t id;
};

static int put(void *ctx, uint32_t id, uint32_t version, uint32_t instance, const void *data,
	       size_t len)
{
	struct saved *s = ctx;
	if (version != STATE_VERSION || instance || len > sizeof(s->buf))
		return -EINVAL;
	memcpy(s->buf, data, len);
	s->len = len;
	s->id = id;
	return 0;
}

static void t_state(struct t *t)
{
	static const uint8_t other[6] = { 0x02, 1, 2, 3, 4, 5 };
	struct drv a, b, c;
	drv_init(&a);
	drv_init(&b);
	drv_init_mac(&c, other, 1500);
	uint64_t feat = 1ull << NET_F_MAC | 1ull << NET_F_CTRL_VQ | 1ull << NET_F_CTRL_RX |
			1ull << NET_F_MRG_RXBUF | 1ull << NET_F_GUEST_CSUM;
	T_CHECK_EQ(t, drv_start(&a, feat), 0x0f);
	uint8_t off = 0;
	T_CHECK_EQ(t, ctrl(&a, 0, 0, &off, 1), 0);
	post_rx(&a, BUFS, 2048);
	vdrv__kick(&a.v, NET_VQ_RX);
	net__set_link(a.n, false);
	struct saved *sv = calloc(1, sizeof(*sv));
	T_CHECK_EQ(t, net__save(a.n, put, sv), 0);
	T_CHECK_EQ(t, sv->id, STATE_DEV_NET);
	memcpy(vdrv__host(&b.v, QBASE), vdrv__host(&a.v, QBASE), NET_NR_VQS * QSTRIDE);
	char why[160] = "";
	T_CHECK_EQ(t, net__load(b.n, sv->buf, sv->len, why, sizeof(why)), 0);
	struct net_rx_filter f;
	net__get_filter(b.n, &f);
	T_CHECK(t, !f.promisc);
	T_CHECK(t, !net__link(b.n));
	T_CHECK_EQ(t, b.offload, NET_OFFLOAD_CSUM);  /* the tap's offloads follow the guest's */
	T_CHECK(t, b.reading);
	/* the destination goes on from the source's queue position */
	net__set_link(b.n, true);
	b.v.next_desc[NET_VQ_RX] = 1;
	b.v.avail_idx[NET_VQ_RX] = 1;
	uint8_t fr[256];
	size_t len = mkframe(fr, MAC, 60);
	T_CHECK_EQ(t, send(b.sv[1], fr, len, 0), (ssize_t)len);
	net__backend_readable(b.n);
	T_CHECK_EQ(t, vdrv__used_idx(&b.v, NET_VQ_RX), 1);
	/* another MAC on the destination's command line: refused */
	T_CHECK_EQ(t, net__load(c.n, sv->buf, sv->len, why, sizeof(why)), -EINVAL);
	T_CHECK(t, strstr(why, "MAC") != NULL);
	/* hostile sections: truncated anywhere, table counts that lie */
	for (size_t cut = 0; cut < sv->len; cut++)
		T_CHECK(t, net__load(b.n, sv->buf, cut, why, sizeof(why)) < 0);
	uint8_t *bad = malloc(sv->len + 6);
	memcpy(bad, sv->buf, sv->len);
	uint32_t tl;
	memcpy(&tl, bad + 4, 4);
	bad[8 + tl + 17] = 200;                     /* 200 unicast entries */
	T_CHECK(t, net__load(b.n, bad, sv->len, why, sizeof(why)) < 0);
	bad[8 + tl + 17] = 1;                       /* one entry, not there */
	T_CHECK(t, net__load(b.n, bad, sv->len, why, sizeof(why)) < 0);
	/* a transport that does not fit: refused, the filter and link kept */
	memcpy(bad, sv->buf, sv->len);
	uint64_t far = 1ull << 40;                  /* queue 0's descriptors outside RAM */
	memcpy(bad + 8 + 22 + PCI_CFG_SIZE + 4 + 10, &far, 8);
	T_CHECK(t, net__load(b.n, bad, sv->len, why, sizeof(why)) < 0);
	free(bad);
	net__get_filter(b.n, &f);
	T_CHECK(t, !f.promisc && net__link(b.n));
	/* a frame read from the tap, waiting for more buffers at the save
	 * (one of 100 bytes posted): not carried, counted */
	post_rx(&b, BUFS + 0x1000, 100);
	len = mkframe(fr, MAC, 200);
	T_CHECK_EQ(t, send(b.sv[1], fr, len, 0), (ssize_t)len);
	net__backend_readable(b.n);
	T_CHECK_EQ(t, vdrv__used_idx(&b.v, NET_VQ_RX), 1);
	T_CHECK_EQ(t, net__save(b.n, put, sv), 0);
	struct net_stats st;
	net__get_stats(b.n, &st);
	T_CHECK_EQ(t, st.rx_dropped_pending, 1);
	free(sv);
	drv_fini(&a);
	drv_fini(&b);
	drv_fini(&c);
}

/* The tap's end of things: its offloads must match the driver's, a link
 * that is down drops what comes, a tap that is gone stops the reading. */
static bool delivered_raw(struct drv *d, const uint8_t *f, size_t len);

static void t_backend(struct t *t)
{
	struct drv d;
	drv_init(&d);
	T_CHECK_EQ(t, drv_start(&d, 1ull << NET_F_MAC | 1ull << NET_F_STATUS), 0x0f);
	uint8_t f[256];
	size_t len = mkframe(f, MAC, 60);
	f[0] = 1;                                   /* NEEDS_CSUM, not negotiated */
	T_CHECK(t, !delivered_raw(&d, f, len));
	f[0] = 0, f[1] = 1;                         /* TCPv4 segments, not negotiated */
	T_CHECK(t, !delivered_raw(&d, f, len));
	f[1] = 0, f[0] = 2;                         /* DATA_VALID: cleared */
	T_CHECK(t, delivered_raw(&d, f, len));
	struct net_stats st;
	net__get_stats(d.n, &st);
	T_CHECK_EQ(t, st.rx_bad_offload, 2);
	f[0] = 0;
	/* link down: the tap is read (buffers or not) and what comes dropped */
	d.reading = false;
	net__set_link(d.n, false);
	T_CHECK(t, d.reading);
	T_CHECK_EQ(t, send(d.sv[1], f, len, 0), (ssize_t)len);
	net__backend_readable(d.n);
	net__set_link(d.n, true);
	uint16_t before = vdrv__used_idx(&d.v, NET_VQ_RX);
	post_rx(&d, BUFS, 2048);
	vdrv__kick(&d.v, NET_VQ_RX);
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, NET_VQ_RX), before);   /* the old frame is gone */
	net__get_stats(d.n, &st);
	T_CHECK_EQ(t, st.rx_link_down, 1);
	/* the tap goes away: reading stops, nothing loops */
	close(d.sv[1]);
	d.sv[1] = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	net__backend_readable(d.n);
	T_CHECK(t, !d.reading);
	net__backend_readable(d.n);
	T_CHECK(t, !d.reading);
	drv_fini(&d);
}

/* Sends a frame as the tap would and says whether it reached a buffer. */
static bool delivered_raw(struct drv *d, const uint8_t *f, size_t len)
{
	uint16_t before = vdrv__used_idx(&d->v, NET_VQ_RX);
	post_rx(d, BUFS, 2048);
	vdrv__kick(&d->v, NET_VQ_RX);
	if (send(d->sv[1], f, len, 0) != (ssize_t)len)
		return false;
	net__backend_readable(d->n);
	bool got = vdrv__used_idx(&d->v, NET_VQ_RX) != before;
	if (got && (vdrv__host(&d->v, BUFS)[0] & 2))
		return false;                       /* DATA_VALID passed on unasked */
	return got;
}

static void t_malformed(struct t *t)
{
	struct drv d;
	drv_init(&d);
	T_CHECK_EQ(t, drv_start(&d, 1ull << NET_F_MAC), 0x0f);
	struct vdrv_seg s = { RAM_SIZE - 16, 4096, true };   /* past the end of RAM */
	vdrv__add_chain(&d.v, NET_VQ_RX, &s, 1);
	vdrv__kick(&d.v, NET_VQ_RX);
	uint8_t f[256];
	size_t len = mkframe(f, MAC, 60);
	T_CHECK_EQ(t, send(d.sv[1], f, len, 0), (ssize_t)len);
	net__backend_readable(d.n);                 /* the bad buffer is found in use */
	T_CHECK(t, vdrv__status(&d.v) & VIRTIO_STATUS_NEEDS_RESET);
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, NET_VQ_RX), 0);
	T_CHECK(t, !d.reading);                     /* a broken device reads nothing */
	/* a reset and a good ring work again */
	T_CHECK_EQ(t, drv_start(&d, 1ull << NET_F_MAC), 0x0f);
	T_CHECK(t, delivered(&d, MAC));
	drv_fini(&d);
}

static void count_round(void *ctx)
{
	__atomic_fetch_add((int *)ctx, 1, __ATOMIC_RELAXED);
}

static void t_announce_schedule(struct t *t)
{
	struct announce_params p = ANNOUNCE_DEFAULTS;
	T_CHECK_EQ(t, announce__check(&p), 0);
	uint64_t at = 0, want[5] = { 0, 50, 200, 450, 800 };
	for (unsigned k = 0; k < 5; k++) {
		at += announce__gap_ms(&p, k);
		T_CHECK_EQ(t, at, want[k]);
	}
	struct announce_params bad = { 100, 50, 5, 100 };
	T_CHECK_EQ(t, announce__check(&bad), -EINVAL);
	bad = (struct announce_params){ 1, 1, 0, 1 };
	T_CHECK_EQ(t, announce__check(&bad), -EINVAL);
	/* three rounds run, and a restart runs its own rounds */
	int rounds = 0;
	struct announcer a;
	T_CHECK_EQ(t, announcer__init(&a, count_round, &rounds), 0);
	struct announce_params quick = { 1, 1, 3, 1 };
	T_CHECK_EQ(t, announcer__start(&a, &quick), 0);
	uint64_t end = time__now_ms() + 10000;
	while (announcer__rounds(&a) < 3 && time__now_ms() < end)
		usleep(1000);
	T_CHECK_EQ(t, announcer__rounds(&a), 3);
	quick.rounds = 2;
	T_CHECK_EQ(t, announcer__start(&a, &quick), 0);
	while (announcer__rounds(&a) < 5 && time__now_ms() < end)
		usleep(1000);
	T_CHECK_EQ(t, announcer__rounds(&a), 5);
	announcer__destroy(&a);
	T_CHECK_EQ(t, __atomic_load_n(&rounds, __ATOMIC_RELAXED), 5);
}

static void t_opts(struct t *t)
{
	struct net_opts o;
	struct vm_net_config c;
	bool on = true;
	char err[256];
	net_opts__init(&o);
	T_CHECK_EQ(t, net_opts__finish(&o, &c, &on, err, sizeof(err)), 0);
	T_CHECK(t, !on);
	T_CHECK_EQ(t, net_opts__netdev(&o, "tap,id=n0,ifname=tap0,script=no,downscript=no", err,
				       sizeof(err)), 0);
	T_CHECK_EQ(t, net_opts__finish(&o, &c, &on, err, sizeof(err)), -EINVAL);  /* no device */
	T_CHECK_EQ(t, net_opts__device(&o, "virtio-net-pci,netdev=n0,mac=52:54:00:AB:cd:01,mtu=9000",
				       err, sizeof(err)), 0);
	T_CHECK_EQ(t, net_opts__finish(&o, &c, &on, err, sizeof(err)), 0);
	T_CHECK(t, on && !strcmp(c.ifname, "tap0") && !strcmp(c.netdev_id, "n0") && c.mtu == 9000);
	T_CHECK(t, c.mac[3] == 0xab && c.mac[4] == 0xcd && c.mac[5] == 1);
	static const char *const bad_netdev[] = {
		"user,id=n0", "tap,id=n0", "tap,ifname=t0", "tap,id=n0,ifname=t0,script=/etc/up",
		"tap,id=n0,ifname=t0,vhost=on", "tap,id=n0,ifname=averyveryverylongname",
		"tap,id=n0,ifname=t0,junk", "tap,id=,ifname=t0",
	};
	for (size_t i = 0; i < sizeof(bad_netdev) / sizeof(bad_netdev[0]); i++) {
		net_opts__init(&o);
		err[0] = 0;
		T_CHECK_EQ(t, net_opts__netdev(&o, bad_netdev[i], err, sizeof(err)), -EINVAL);
		T_CHECK(t, strstr(err, "--netdev") != NULL);
	}
	static const char *const bad_device[] = {
		"e1000,netdev=n0", "virtio-net-pci", "virtio-net-pci,netdev=n0,mac=01:00:00:00:00:01",
		"virtio-net-pci,netdev=n0,mac=52:54:00:12:34", "virtio-net-pci,netdev=n0,mac=52-54-00-12-34-56",
		"virtio-net-pci,netdev=n0,mac=52:54:00:12:34:5g", "virtio-net-pci,netdev=n0,mtu=67",
		"virtio-net-pci,netdev=n0,mtu=70000", "virtio-net-pci,netdev=n0,mtu=1500x",
		"virtio-net-pci,netdev=n0,csum=maybe", "virtio-net-pci,netdev=n0,queues=4",
	};
	for (size_t i = 0; i < sizeof(bad_device) / sizeof(bad_device[0]); i++) {
		net_opts__init(&o);
		err[0] = 0;
		T_CHECK_EQ(t, net_opts__device(&o, bad_device[i], err, sizeof(err)), -EINVAL);
		T_CHECK(t, strstr(err, "--device") != NULL);
	}
	/* a device naming another netdev; two devices */
	net_opts__init(&o);
	T_CHECK_EQ(t, net_opts__netdev(&o, "tap,id=n0,ifname=t0", err, sizeof(err)), 0);
	T_CHECK_EQ(t, net_opts__device(&o, "virtio-net-pci,netdev=n1", err, sizeof(err)), 0);
	T_CHECK_EQ(t, net_opts__finish(&o, &c, &on, err, sizeof(err)), -EINVAL);
	T_CHECK(t, strstr(err, "n1") != NULL);
	T_CHECK_EQ(t, net_opts__device(&o, "virtio-net-pci,netdev=n0", err, sizeof(err)), -EINVAL);
}

int main(void)
{
	struct t t = { 0 };
	T_RUN(&t, t_config);
	T_RUN(&t, t_tx);
	T_RUN(&t, t_rx);
	T_RUN(&t, t_rx_merge);
	T_RUN(&t, t_filter);
	T_RUN(&t, t_link_announce);
	T_RUN(&t, t_state);
	T_RUN(&t, t_backend);
	T_RUN(&t, t_malformed);
	T_RUN(&t, t_announce_schedule);
	T_RUN(&t, t_opts);
	return T_DONE(&t);
}
