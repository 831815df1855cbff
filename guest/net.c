/*
 * virtio-net driver of the test guest (cmdline net=1), all in ring 3 on
 * virtio.c's modern virtio-pci transport, polled from cpu 0's workload
 * loop (no interrupts; VRING_AVAIL_F_NO_INTERRUPT on every queue).
 *
 * It serves the network with a tiny IPv4 stack: ARP (answers requests for
 * its address, a gratuitous ARP when the link comes up and when the device
 * asks for an announcement), ICMP echo, and a UDP echo responder on
 * udp_port; with net_send=HZ it also sends numbered datagrams to
 * net_dst:net_dport, HZ a second.  Only the spec is relied on (virtio 1.x
 * section 5.1), so it runs the same on QEMU's virtio-net-pci and kmig's.
 *
 * Queues: receiveq1 (0), transmitq1 (1), controlq (2, with CTRL_VQ; MQ is
 * never accepted).  Every receive buffer holds a whole frame (12-byte
 * header + 1526 bytes), but with MRG_RXBUF num_buffers is still read and a
 * frame spread over several buffers is put together.  Transmit uses a
 * small pool of buffers, reclaimed from the used ring.  Whatever the device
 * hands back (used ids, lengths, num_buffers) is checked against what was
 * posted; a malformed value is counted (bad=) and its frame dropped.
 *
 * Memory: rings and buffers from the boot-time bump allocator (net_init()
 * runs before the page allocator takes the rest).
 */
#include "virtio.h"

#define VIRTIO_NET_DEVICE 0x1041

#define NF_MAC 5
#define NF_MRG_RXBUF 15
#define NF_STATUS 16
#define NF_CTRL_VQ 17
#define NF_GUEST_ANNOUNCE 21
#define BIT(n) (1ULL << (n))

/* device configuration */
#define NC_MAC 0
#define NC_STATUS 6
#define NS_LINK_UP 1
#define NS_ANNOUNCE 2

#define CTRL_ANNOUNCE 3
#define CTRL_ANNOUNCE_ACK 0

#define HDR_LEN 12			/* virtio_net_hdr with num_buffers (VERSION_1) */
#define FRAME_MAX 1526
#define BUF_LEN (HDR_LEN + FRAME_MAX)	/* what a receive buffer offers the device */
#define BUF_STRIDE 2048
#define RX_WANT 128
#define TX_WANT 128
#define RX_BUDGET 64			/* used receive buffers handled per poll */

#define MS(x) ((u64)(x) * tsc_khz)
#define CFG_POLL_MS 5			/* config generation read at most this often */
#define CFG_REFRESH_MS 100		/* full config read even without a new generation */
#define KICK_AGAIN_MS 20		/* re-notify transmit buffers that sit unused */
#define TX_WAIT_US 5000			/* wait this long for a transmit buffer before dropping */
#define RX_KICK_MS 1000			/* re-notify the receive queue when nothing came */
#define ARP_RETRY_MS 1000
#define CTRL_TIMEOUT_MS 3000

#define ETH_ARP 0x0806
#define ETH_IP 0x0800
#define IP_ICMP 1
#define IP_UDP 17

int net_on;

static struct vdev ndev = { .name = "net", .what = "virtio-net" };
static struct vq rxq, txq, ctrlq;
static u64 features;
static u8 mac[6];
static int link_up = -1;		/* -1: not known yet */

static u8 *rxbuf, *txbuf;		/* rxq.size / txq.size buffers of BUF_STRIDE bytes */
static u16 tx_free[QMAX];
static u32 ntx_free;

/* a frame spread over several receive buffers (MRG_RXBUF) */
static u8 asm_buf[BUF_LEN];
static u32 asm_len, asm_left;
static int asm_bad;

/* control queue */
static u8 ctrl_cmd[2] __attribute__((aligned(16)));
static volatile u8 ctrl_ack;
static int ctrl_pending;
static u64 ctrl_deadline;

/* sender (net_send) */
static u8 dst_mac[6];
static int dst_known;
static u64 next_arp, next_send, send_seq;

static u32 last_gen = ~0u;
static u64 next_cfg_poll, next_cfg_refresh, last_rx_kick;
static u16 ip_id;

static struct {
	u64 rx, tx, echoed, arp, sent, drops, bad, ignored, icmp, announces;
} st;

static const u8 bcast[6] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };

/* ---------------- helpers ---------------- */

static inline u32 be16(const u8 *p) { return (u32)p[0] << 8 | p[1]; }
static inline u32 be32(const u8 *p) { return (u32)p[0] << 24 | (u32)p[1] << 16 | (u32)p[2] << 8 | p[3]; }
static inline void put16(u8 *p, u32 v) { p[0] = (u8)(v >> 8); p[1] = (u8)v; }
static inline void put32(u8 *p, u32 v) { put16(p, v >> 16); put16(p + 2, v); }

static u32 csum(const u8 *p, u32 n)
{
	u32 s = 0;
	for (; n > 1; p += 2, n -= 2)
		s += be16(p);
	if (n)
		s += (u32)p[0] << 8;
	while (s >> 16)
		s = (s & 0xffff) + (s >> 16);
	return ~s & 0xffff;
}

static void fmt_ip(char *b, u32 ip)
{
	char t[20];
	int n = 0;
	for (int i = 3; i >= 0; i--) {
		u32 v = (ip >> (8 * i)) & 0xff;
		char d[3];
		int k = 0;
		do {
			d[k++] = (char)('0' + v % 10);
			v /= 10;
		} while (v);
		while (k)
			t[n++] = d[--k];
		if (i)
			t[n++] = '.';
	}
	t[n] = 0;
	memcpy(b, t, (size_t)n + 1);
}

static void fmt_mac(char *b, const u8 *m)
{
	for (int i = 0; i < 6; i++) {
		b[3 * i] = "0123456789abcdef"[m[i] >> 4];
		b[3 * i + 1] = "0123456789abcdef"[m[i] & 15];
		b[3 * i + 2] = i < 5 ? ':' : 0;
	}
}

static void fail(const char *what)
{
	kprintf("net error %s; driver disabled\n", what);
	net_on = 0;
	vdev_set_failed(&ndev);
}

/* ---------------- transmit ---------------- */

static void tx_reclaim(void)
{
	u64 a, l;
	int r;
	while ((r = vq_get(&txq, &a, &l, 0)) != 0) {
		if (r < 0)
			continue;	/* counted in txq.bad */
		u64 i = (a - (u64)txbuf) / BUF_STRIDE;	/* a is the address we posted */
		if (i < txq.size && ntx_free < txq.size)
			tx_free[ntx_free++] = (u16)i;
	}
}

/* A transmit buffer with a zeroed header; returns the frame's start, 0 if
 * none is free (the frame is dropped). */
static u8 *tx_frame(void)
{
	if (!ntx_free) {
		/* a burst (say, the frames queued while the VM was paused): give
		 * the device a moment to send what it has */
		u64 end = rdtsc() + TX_WAIT_US * tsc_khz / 1000;
		vq_kick(&txq, 1);
		do {
			tx_reclaim();
			cpu_relax();
		} while (!ntx_free && rdtsc() < end);
	}
	if (!ntx_free) {
		st.drops++;
		return 0;
	}
	u8 *b = txbuf + (u64)tx_free[--ntx_free] * BUF_STRIDE;
	memset(b, 0, HDR_LEN);		/* flags 0, gso_type NONE, no checksum offload */
	return b + HDR_LEN;
}

static void tx_send(u8 *frame, u32 len)
{
	if (len < 60) {			/* Ethernet minimum, without FCS */
		memset(frame + len, 0, 60 - len);
		len = 60;
	}
	if (vq_add(&txq, (u64)(frame - HDR_LEN), HDR_LEN + len, 0)) {
		tx_free[ntx_free++] = (u16)((u64)(frame - HDR_LEN - txbuf) / BUF_STRIDE);
		st.drops++;
		return;
	}
	vq_kick(&txq, 0);
	st.tx++;
}

static u8 *eth_header(u8 *f, const u8 *dst, u32 type)
{
	memcpy(f, dst, 6);
	memcpy(f + 6, mac, 6);
	put16(f + 12, type);
	return f + 14;
}

/* IPv4 header to dip; returns where the payload of plen bytes goes. */
static u8 *ip_header(u8 *ip, u32 dip, u32 proto, u32 plen)
{
	ip[0] = 0x45;
	ip[1] = 0;
	put16(ip + 2, 20 + plen);
	put16(ip + 4, ip_id++);
	put16(ip + 6, 0x4000);		/* don't fragment */
	ip[8] = 64;
	ip[9] = (u8)proto;
	put16(ip + 10, 0);
	put32(ip + 12, cfg.ip);
	put32(ip + 16, dip);
	put16(ip + 10, csum(ip, 20));
	return ip + 20;
}

static void send_udp(const u8 *dmac, u32 dip, u32 dport, const u8 *data, u32 n)
{
	if (n > FRAME_MAX - 14 - 4 - 20 - 8)
		n = FRAME_MAX - 14 - 4 - 20 - 8;
	u8 *f = tx_frame();
	if (!f)
		return;
	u8 *u = ip_header(eth_header(f, dmac, ETH_IP), dip, IP_UDP, 8 + n);
	put16(u, (u32)cfg.udp_port);
	put16(u + 2, dport);
	put16(u + 4, 8 + n);
	put16(u + 6, 0);		/* no UDP checksum */
	memcpy(u + 8, data, n);
	tx_send(f, 14 + 20 + 8 + n);
}

/* op 1 request, 2 reply; tha may be 0 (zeros) */
static void send_arp(u32 op, const u8 *eth_dst, const u8 *tha, u32 tpa)
{
	u8 *f = tx_frame();
	if (!f)
		return;
	u8 *a = eth_header(f, eth_dst, ETH_ARP);
	put16(a, 1);
	put16(a + 2, ETH_IP);
	a[4] = 6;
	a[5] = 4;
	put16(a + 6, op);
	memcpy(a + 8, mac, 6);
	put32(a + 14, cfg.ip);
	if (tha)
		memcpy(a + 18, tha, 6);
	else
		memset(a + 18, 0, 6);
	put32(a + 24, tpa);
	tx_send(f, 14 + 28);
}

static void garp(void)
{
	send_arp(1, bcast, 0, cfg.ip);
}

/* ---------------- receive ---------------- */

static void arp_in(const u8 *f, u32 len)
{
	const u8 *a = f + 14;
	if (len < 14 + 28 || be16(a) != 1 || be16(a + 2) != ETH_IP || a[4] != 6 || a[5] != 4) {
		st.drops++;
		return;
	}
	u32 op = be16(a + 6), spa = be32(a + 14), tpa = be32(a + 24);
	if (cfg.net_send && spa == cfg.net_dst && (op == 1 || op == 2) &&
	    (!dst_known || memcmp(dst_mac, a + 8, 6))) {
		char ib[16], mb[18];
		memcpy(dst_mac, a + 8, 6);
		dst_known = 1;
		fmt_ip(ib, spa);
		fmt_mac(mb, dst_mac);
		kprintf("net: arp dst=%s mac=%s t_ms=%lu\n", ib, mb, now_ms());
	}
	if (op == 1 && tpa == cfg.ip) {
		send_arp(2, a + 8, a + 8, spa);
		st.arp++;
	} else if (tpa != cfg.ip) {
		st.ignored++;
	}
}

static void icmp_in(const u8 *f, const u8 *ip, u32 ihl, u32 total)
{
	const u8 *ic = ip + ihl;
	u32 n = total - ihl;
	if (n < 8 || ic[0] != 8 || ic[1] != 0) {	/* echo requests only */
		st.ignored++;
		return;
	}
	if (csum(ic, n)) {
		st.drops++;
		return;
	}
	u8 *r = tx_frame();
	if (!r)
		return;
	u8 *p = ip_header(eth_header(r, f + 6, ETH_IP), be32(ip + 12), IP_ICMP, n);
	memcpy(p, ic, n);
	p[0] = 0;			/* echo reply */
	put16(p + 2, 0);
	put16(p + 2, csum(p, n));
	tx_send(r, 14 + 20 + n);
	st.icmp++;
}

static void udp_in(const u8 *f, const u8 *ip, u32 ihl, u32 total)
{
	const u8 *u = ip + ihl;
	u32 ulen = total - ihl >= 8 ? be16(u + 4) : 0;
	if (ulen < 8 || ulen > total - ihl) {
		st.drops++;
		return;
	}
	if (be16(u + 2) != cfg.udp_port) {
		st.ignored++;
		return;
	}
	/* the same payload back to the sender's MAC, address and port */
	send_udp(f + 6, be32(ip + 12), be16(u), u + 8, ulen - 8);
	st.echoed++;
}

static void ip_in(const u8 *f, u32 len)
{
	const u8 *ip = f + 14;
	u32 n = len - 14;
	if (n < 20 || (ip[0] >> 4) != 4) {
		st.drops++;
		return;
	}
	u32 ihl = (ip[0] & 15) * 4u, total = be16(ip + 2);
	if (ihl < 20 || total < ihl || total > n || csum(ip, ihl)) {
		st.drops++;
		return;
	}
	if (be32(ip + 16) != cfg.ip || (be16(ip + 6) & 0x3fff)) {	/* not ours, or a fragment */
		st.ignored++;
		return;
	}
	if (ip[9] == IP_UDP)
		udp_in(f, ip, ihl, total);
	else if (ip[9] == IP_ICMP)
		icmp_in(f, ip, ihl, total);
	else
		st.ignored++;
}

static void frame_in(const u8 *f, u32 len)
{
	st.rx++;
	if (len < 14) {
		st.drops++;
		return;
	}
	if (memcmp(f, mac, 6) && memcmp(f, bcast, 6)) {
		st.ignored++;		/* another host's, or multicast */
		return;
	}
	u32 type = be16(f + 12);
	if (type == ETH_ARP)
		arp_in(f, len);
	else if (type == ETH_IP)
		ip_in(f, len);
	else
		st.ignored++;
}

/* One used receive buffer holding wl bytes (header included, unchecked). */
static void rx_piece(const u8 *b, u32 wl)
{
	if (asm_left) {			/* a later buffer of a frame */
		asm_left--;
		if (wl > BUF_LEN || asm_len + wl > BUF_LEN) {
			st.bad++;
			asm_bad = 1;
		} else if (!asm_bad) {
			memcpy(asm_buf + asm_len, b, wl);
			asm_len += wl;
		}
		if (!asm_left && !asm_bad)
			frame_in(asm_buf + HDR_LEN, asm_len - HDR_LEN);
		else if (!asm_left)
			st.drops++;
		return;
	}
	if (wl < HDR_LEN || wl > BUF_LEN) {
		st.bad++;
		st.drops++;
		return;
	}
	u32 nbuf = (features & BIT(NF_MRG_RXBUF)) ? b[10] | (u32)b[11] << 8 : 1;
	if (nbuf == 1) {
		frame_in(b + HDR_LEN, wl - HDR_LEN);
		return;
	}
	if (!nbuf || nbuf > rxq.size) {
		st.bad++;
		st.drops++;
		return;
	}
	memcpy(asm_buf, b, wl);
	asm_len = wl;
	asm_left = nbuf - 1;
	asm_bad = 0;
}

static void rx_poll(u64 t)
{
	int reposted = 0;
	for (int k = 0; k < RX_BUDGET; k++) {
		u64 a, l;
		u32 wl;
		int r = vq_get(&rxq, &a, &l, &wl);
		if (!r)
			break;
		if (r < 0)
			continue;		/* counted in rxq.bad; nothing of ours to repost */
		rx_piece((const u8 *)a, wl);
		vq_add(&rxq, a, l, 1);		/* the same buffer, back to the device */
		reposted++;
	}
	if (reposted) {
		vq_kick(&rxq, 0);
		last_rx_kick = t;
	} else if (t - last_rx_kick > MS(RX_KICK_MS)) {
		vq_kick(&rxq, 1);		/* cheap insurance against a lost notification */
		last_rx_kick = t;
	}
}

/* ---------------- configuration, link, announcements ---------------- */

static void show_link(void)
{
	char ib[16], mb[18];
	fmt_ip(ib, cfg.ip);
	fmt_mac(mb, mac);
	kprintf("net: mac=%s ip=%s link=%s features=0x%lx\n", mb, ib, link_up ? "up" : "down", features);
}

/* The device asks for an announcement: a gratuitous ARP, then
 * VIRTIO_NET_CTRL_ANNOUNCE_ACK on the control queue. */
static void announce(u64 t)
{
	struct vseg s[2] = { { (u64)ctrl_cmd, 2, 0 }, { (u64)&ctrl_ack, 1, 1 } };
	garp();
	ctrl_cmd[0] = CTRL_ANNOUNCE;
	ctrl_cmd[1] = CTRL_ANNOUNCE_ACK;
	ctrl_ack = 0xff;
	if (vq_add_chain(&ctrlq, s, 2))
		return;
	vq_kick(&ctrlq, 0);
	ctrl_pending = 1;
	ctrl_deadline = t + MS(CTRL_TIMEOUT_MS);
}

static void ctrl_poll(u64 t)
{
	u64 a, l;
	int r = vq_get(&ctrlq, &a, &l, 0);
	if (r > 0) {
		ctrl_pending = 0;
		st.announces++;
		kprintf("net: announce ack=%u t_ms=%lu\n", (u32)ctrl_ack, now_ms());
		next_cfg_poll = t;	/* the device has cleared ANNOUNCE: see it at once */
	} else if (t > ctrl_deadline) {
		/* the buffer stays the device's: the queue is not used again */
		kprintf("net: announce ack=none t_ms=%lu\n", now_ms());
		ctrl_pending = -1;
	}
}

static void read_config(u64 t)
{
	u32 gen = mr8(ndev.common + C_GEN);
	if (gen == last_gen && t < next_cfg_refresh)
		return;
	u32 status = NS_LINK_UP;
	if (features & BIT(NF_STATUS)) {
		for (int tries = 0; tries < 10; tries++) {
			status = mr16(ndev.devcfg + NC_STATUS);
			u32 g2 = mr8(ndev.common + C_GEN);
			if (g2 == gen)
				break;
			gen = g2;
		}
	}
	last_gen = gen;
	next_cfg_refresh = t + MS(CFG_REFRESH_MS);
	if (mr8(ndev.common + C_STATUS) & S_NEEDS_RESET) {
		fail("device needs reset");
		return;
	}
	int up = status & NS_LINK_UP;
	if (up != link_up) {
		link_up = up;
		show_link();
		if (up) {
			garp();
			next_arp = t;
		}
	}
	if ((status & NS_ANNOUNCE) && (features & BIT(NF_GUEST_ANNOUNCE)) && !ctrl_pending)
		announce(t);
}

/* ---------------- sender (net_send) ---------------- */

static void send_step(u64 t)
{
	if (!dst_known) {
		if (t >= next_arp) {
			send_arp(1, bcast, 0, cfg.net_dst);
			next_arp = t + MS(ARP_RETRY_MS);
			next_send = t;
		}
		return;
	}
	if (t < next_send)
		return;
	u8 d[24];
	u64 seq = ++send_seq, us = (t - tsc0) * 1000 / tsc_khz;
	for (int i = 0; i < 8; i++) {
		d[i] = (u8)(seq >> (56 - 8 * i));
		d[8 + i] = (u8)(us >> (56 - 8 * i));
	}
	memcpy(d + 16, "kmig-net", 8);
	send_udp(dst_mac, cfg.net_dst, (u32)cfg.net_dport, d, sizeof(d));
	st.sent++;
	next_send += tsc_khz * 1000 / cfg.net_send;
	if (next_send <= t)		/* late (a pause): no burst to catch up */
		next_send = t + tsc_khz * 1000 / cfg.net_send;
}

/* ---------------- init, poll, report ---------------- */

static int setup_queues(void)
{
	int nq = (int)mr16(ndev.common + C_NUM_QUEUES);
	if (nq < ((features & BIT(NF_CTRL_VQ)) ? 3 : 2)) {
		fail("device has fewer queues than its features need");
		return -1;
	}
	if (vq_setup(&ndev, &rxq, 0, RX_WANT) || vq_setup(&ndev, &txq, 1, TX_WANT))
		return -1;
	if ((features & BIT(NF_CTRL_VQ)) && vq_setup(&ndev, &ctrlq, 2, 4))
		return -1;
	rxq.lenient = txq.lenient = ctrlq.lenient = 1;
	rxbuf = take_contig(rxq.size * BUF_STRIDE / PAGE_SIZE);
	txbuf = take_contig(txq.size * BUF_STRIDE / PAGE_SIZE);
	if (!rxbuf || !txbuf) {
		fail("no memory for the buffers");
		return -1;
	}
	for (u32 i = 0; i < rxq.size; i++)
		vq_add(&rxq, (u64)(rxbuf + (u64)i * BUF_STRIDE), BUF_LEN, 1);
	for (u32 i = 0; i < txq.size; i++)
		tx_free[ntx_free++] = (u16)i;
	return 0;
}

static void bind(void)
{
	rxq.idx = txq.idx = ctrlq.idx = -1;
	if (vdev_bind(&ndev, VIRTIO_NET_DEVICE))
		return;
	u64 want = BIT(F_VERSION_1) | BIT(NF_MRG_RXBUF) | BIT(NF_CTRL_VQ);
	if (ndev.devcfg_len >= 6)
		want |= BIT(NF_MAC);
	if (ndev.devcfg_len >= 8)
		want |= BIT(NF_STATUS);
	features = ndev.offered & want;
	/* announcements need the control queue and the status field */
	if ((features & BIT(NF_CTRL_VQ)) && (features & BIT(NF_STATUS)))
		features |= ndev.offered & BIT(NF_GUEST_ANNOUNCE);
	if (vdev_set_features(&ndev, features)) {
		fail("device refused the features");
		return;
	}
	if (setup_queues())
		goto qfail;
	static const u8 fixed[6] = { 0x02, 0x6b, 0x6d, 0x69, 0x67, 0x00 };	/* locally administered */
	for (int i = 0; i < 6; i++)
		mac[i] = (features & BIT(NF_MAC)) ? (u8)mr8(ndev.devcfg + NC_MAC + i) : fixed[i];
	vdev_set_status(&ndev, S_DRIVER_OK);
	if (mr8(ndev.common + C_STATUS) & S_NEEDS_RESET) {
		fail("device needs reset after DRIVER_OK");
		return;
	}
	vq_kick(&rxq, 1);
	net_on = 1;
	kprintf("net bound dev=%02x:%02x.%x id=1af4:%04x features=0x%lx offered=0x%lx rxq=%u txq=%u\n",
		0, ndev.devfn >> 3, ndev.devfn & 7, ndev.pci_id, features, ndev.offered, rxq.size,
		txq.size);
	u64 t = rdtsc();
	last_rx_kick = t;
	read_config(t);			/* the link line, and the first gratuitous ARP */
	next_cfg_poll = t + MS(CFG_POLL_MS);
	return;
qfail:
	net_on = 0;
	vdev_set_failed(&ndev);
}

void net_init(void)
{
	bind();
}

void net_poll(void)
{
	if (!net_on)
		return;
	u64 t = rdtsc();
	if (t >= next_cfg_poll) {
		read_config(t);
		next_cfg_poll = t + MS(CFG_POLL_MS);
		if (!net_on)
			return;
	}
	rx_poll(t);
	if (txq.used && (u16)(txq.used[0] >> 16) != txq.last_used)
		tx_reclaim();
	if (ctrl_pending > 0)
		ctrl_poll(t);
	if (cfg.net_send && link_up > 0)
		send_step(t);
	if (vq_outstanding(&txq) && t - txq.last_progress > MS(KICK_AGAIN_MS)) {
		vq_kick(&txq, 1);
		txq.last_progress = t;
	}
}

void net_report(void)
{
	if (!net_on)
		return;
	kprintf("net rx=%lu tx=%lu echoed=%lu arp=%lu sent=%lu drops=%lu bad=%lu ignored=%lu icmp=%lu announces=%lu t_ms=%lu\n",
		st.rx, st.tx, st.echoed, st.arp, st.sent, st.drops,
		st.bad + rxq.bad + txq.bad + ctrlq.bad, st.ignored, st.icmp, st.announces, now_ms());
}
