#include "dev/net.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "dev/net_impl.h"

#define NET_MAX_MERGE 64        /* chains one received frame may take */
#define NET_RX_BUDGET 256       /* frames per call before others get the lock */
#define NET_BACKLOG_MAX 4096    /* frames net__drop_backlog reads at most */
#define NET_ETH_MIN 14
#define NET_ETH_HLEN 14         /* what the MTU does not count */

/* Always passed on (the backend's own watch may have been turned on
 * from outside, by net__set_link). */
static void net__read_on(struct net *n, bool on)
{
	n->reading = on;
	if (n->be.wants_read)
		n->be.wants_read(n->be.ctx, on);
}

static uint16_t net__status(struct net *n)
{
	pthread_mutex_lock(&n->info_lock);
	uint16_t s = n->status;
	pthread_mutex_unlock(&n->info_lock);
	return s;
}

bool net__link(struct net *n)
{
	return net__status(n) & NET_S_LINK_UP;
}

/* ---------------- receive ---------------- */

static size_t net__room(const struct virtq_chain *c)
{
	size_t room = 0;
	for (unsigned i = c->nout; i < c->n; i++)
		room += c->bufs[i].len;
	return room;
}

/* Copies len bytes into the chain's writable buffers, reporting each
 * write; returns the bytes placed. */
static size_t net__fill(struct net *n, const struct virtq_chain *c, const uint8_t *src, size_t len)
{
	size_t done = 0;
	for (unsigned i = c->nout; i < c->n && done < len; i++) {
		const struct virtq_buf *b = &c->bufs[i];
		size_t k = len - done < b->len ? len - done : b->len;
		if (!k)
			continue;
		memcpy(b->host, src + done, k);
		if (n->mem.mark)
			n->mem.mark(n->mem.mark_ctx, b->gpa, k);
		done += k;
	}
	return done;
}

/* Whether the frame the tap gave may go to this driver: offloaded
 * checksums and segments only as negotiated (the tap may hold frames
 * from before a renegotiation), within the MTU it was told.  Clears a
 * DATA_VALID the driver did not ask for. */
static bool net__rx_hdr_ok(struct net *n)
{
	uint8_t *hdr = n->rx_frame;
	bool csum = virtio_pci__has(&n->vp, NET_F_GUEST_CSUM);
	if (!csum)
		hdr[0] &= (uint8_t)~2u;            /* DATA_VALID */
	if ((hdr[0] & 1) && !csum)
		return false;                      /* NEEDS_CSUM */
	switch (hdr[1]) {
	case 0:
		return !virtio_pci__has(&n->vp, NET_F_MTU) ||
		       n->rx_len - NET_HDR_LEN <= (size_t)n->mtu + NET_ETH_HLEN;
	case 1: return virtio_pci__has(&n->vp, NET_F_GUEST_TSO4);
	case 4: return virtio_pci__has(&n->vp, NET_F_GUEST_TSO6);
	default: return false;
	}
}

/* Puts the waiting frame into receive buffers.  1: delivered or dropped
 * (too long for any chains the ring could hold), 0: not enough buffers
 * posted yet (nothing taken), -EINVAL: the ring is malformed (device
 * failed).  A frame in several chains is published in one step. */
static int net__deliver(struct net *n)
{
	struct virtq *q = &n->vp.vqs[NET_VQ_RX];
	struct virtq_chain *cs = n->chains;
	bool mrg = virtio_pci__has(&n->vp, NET_F_MRG_RXBUF);
	unsigned limit = mrg ? (q->size < NET_MAX_MERGE ? q->size : NET_MAX_MERGE) : 1;
	const char *why = NULL;
	uint16_t k = 0;
	size_t room = 0, descs = 0;
	while (room < n->rx_len) {
		int rc = k < limit ? virtq__pop(q, &n->mem, &cs[k], &why) : 0;
		if (rc < 0) {
			virtq__unpop(q, k);
			virtio_pci__fail(&n->vp, why);
			return rc;
		}
		if (rc == 0) {
			virtq__unpop(q, k);
			if (k < limit && descs < q->size)
				return 0;          /* the driver may post more */
			NET_STAT_ADD(n, rx_too_long, 1);
			return 1;
		}
		room += net__room(&cs[k]);
		descs += cs[k].n;
		k++;
	}
	memcpy(n->rx_frame + 10, &k, 2);         /* num_buffers */
	size_t done = 0;
	for (uint16_t i = 0; i < k; i++) {
		size_t put = net__fill(n, &cs[i], n->rx_frame + done, n->rx_len - done);
		done += put;
		if (virtq__fill(q, &n->mem, i, cs[i].head, (uint32_t)put))
			return -EINVAL;            /* cannot be: popped just now */
	}
	virtq__flush(q, &n->mem, k);
	NET_STAT_ADD(n, rx_frames, 1);
	NET_STAT_ADD(n, rx_bytes, n->rx_len - NET_HDR_LEN);
	virtio_pci__queue_used(&n->vp, NET_VQ_RX);
	return 1;
}

/* The backend failed (the tap is gone): no more reading, said once. */
static void net__backend_dead(struct net *n, const char *why)
{
	if (!n->be_dead)
		log_warn("virtio-net: the backend failed (%s): frames for the guest stop", why);
	n->be_dead = true;
}

/* Reads the next frame into rx_frame: 1 read, 0 none there (or the
 * backend failed).  A frame longer than the buffer is dropped, never
 * delivered cut. */
static int net__read_frame(struct net *n)
{
	for (;;) {
		if (n->be_dead)
			return 0;
		ssize_t r = read(n->be.fd, n->rx_frame, NET_HDR_LEN + NET_FRAME_MAX + 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && errno == EAGAIN)
			return 0;
		if (r <= 0) {
			net__backend_dead(n, r ? strerror(errno) : "end of file");
			return 0;
		}
		if ((size_t)r < NET_HDR_LEN + NET_ETH_MIN || (size_t)r > NET_HDR_LEN + NET_FRAME_MAX) {
			NET_STAT_ADD(n, rx_too_long, (size_t)r > NET_HDR_LEN + NET_FRAME_MAX);
			continue;          /* a runt, or cut by the read */
		}
		n->rx_len = (size_t)r;
		return 1;
	}
}

/* Lock held: while the link is down, what the tap holds is read and
 * dropped (a frame from before must not arrive once it is up). */
static bool net__drain_link_down(struct net *n, unsigned *budget)
{
	if (net__link(n))
		return false;
	if (n->rx_len)
		NET_STAT_ADD(n, rx_link_down, 1);
	n->rx_len = 0;
	while (*budget && net__read_frame(n)) {
		(*budget)--;
		NET_STAT_ADD(n, rx_link_down, 1);
		n->rx_len = 0;
	}
	return true;
}

/* Lock held: frames from the backend into the receive queue until it
 * has no more frames, no more buffers, or the budget is spent. */
static void net__rx(struct net *n)
{
	unsigned budget = NET_RX_BUDGET;
	if (n->be_dead || !virtio_pci__running(&n->vp) || !n->vp.vqs[NET_VQ_RX].ready) {
		net__read_on(n, false);
		return;
	}
	if (net__drain_link_down(n, &budget)) {
		net__read_on(n, !n->be_dead);
		return;
	}
	for (; budget; budget--) {
		if (!n->rx_len && !virtq__has_avail(&n->vp.vqs[NET_VQ_RX])) {
			net__read_on(n, false);   /* frames wait in the backend */
			return;
		}
		if (!n->rx_len) {
			if (!net__read_frame(n)) {
				net__read_on(n, !n->be_dead);
				return;
			}
			if (!net__filter_pass(n, n->rx_frame + NET_HDR_LEN, n->rx_len - NET_HDR_LEN)) {
				NET_STAT_ADD(n, rx_filtered, 1);
				n->rx_len = 0;
				continue;
			}
			if (!net__rx_hdr_ok(n)) {
				NET_STAT_ADD(n, rx_bad_offload, 1);
				n->rx_len = 0;
				continue;
			}
		}
		int rc = net__deliver(n);
		if (rc <= 0) {
			net__read_on(n, false);   /* until the driver posts buffers */
			return;
		}
		n->rx_len = 0;
	}
	net__read_on(n, true);
}

void net__backend_readable(struct net *n)
{
	pthread_mutex_lock(&n->vp.lock);
	net__rx(n);
	pthread_mutex_unlock(&n->vp.lock);
}

/* ---------------- transmit ---------------- */

/* Whether the driver may send this header: checksum and GSO requests
 * only as negotiated, no ECN, no UFO. */
static bool net__tx_hdr_ok(struct net *n, const uint8_t *hdr)
{
	uint8_t flags = hdr[0], gso = hdr[1];
	if ((flags & ~1u) || ((flags & 1) && !virtio_pci__has(&n->vp, NET_F_CSUM)))
		return false;
	if (gso && !(flags & 1))
		return false;              /* segmentation needs the checksum offload */
	switch (gso) {
	case 0: return true;
	case 1: return virtio_pci__has(&n->vp, NET_F_HOST_TSO4);
	case 4: return virtio_pci__has(&n->vp, NET_F_HOST_TSO6);
	default: return false;
	}
}

/* One transmit chain: header and frame, readable buffers only. */
static uint32_t net__tx_chain(struct net *n, const struct virtq_chain *c)
{
	struct iovec iov[VIRTQ_MAX_CHAIN + 1];
	uint8_t hdr[NET_HDR_LEN];
	size_t total = 0, got = 0;
	unsigned niov = 1;
	for (unsigned i = 0; i < c->nout; i++)
		total += c->bufs[i].len;
	if (c->nin || total < NET_HDR_LEN + NET_ETH_MIN || total > NET_HDR_LEN + NET_FRAME_MAX) {
		NET_STAT_ADD(n, tx_errors, 1);
		return 0;
	}
	for (unsigned i = 0; i < c->nout; i++) {
		const struct virtq_buf *b = &c->bufs[i];
		size_t skip = got < NET_HDR_LEN ? NET_HDR_LEN - got : 0;
		skip = skip < b->len ? skip : b->len;
		memcpy(hdr + got, b->host, skip);
		got += skip;
		if (b->len > skip)
			iov[niov++] = (struct iovec){ b->host + skip, b->len - skip };
	}
	if (!net__tx_hdr_ok(n, hdr)) {
		NET_STAT_ADD(n, tx_errors, 1);
		return 0;
	}
	if (!net__link(n)) {
		NET_STAT_ADD(n, tx_link_down, 1);
		return 0;
	}
	iov[0] = (struct iovec){ hdr, NET_HDR_LEN };
	ssize_t w = writev(n->be.fd, iov, (int)niov);
	if (w != (ssize_t)total) {
		NET_STAT_ADD(n, tx_errors, 1);
		return 0;
	}
	NET_STAT_ADD(n, tx_frames, 1);
	NET_STAT_ADD(n, tx_bytes, total - NET_HDR_LEN);
	return 0;
}

/* Pops every available chain of queue qi, hands it to fn and returns it
 * with the length fn wrote (lock held). */
static void net__drain(struct net *n, unsigned qi,
		       uint32_t (*fn)(struct net *, const struct virtq_chain *))
{
	struct virtq *q = &n->vp.vqs[qi];
	struct virtq_chain *c = &n->chains[0];
	const char *why = NULL;
	bool used = false;
	int rc;
	while ((rc = virtq__pop(q, &n->mem, c, &why)) == 1) {
		uint32_t len = fn(n, c);
		if (virtq__push(q, &n->mem, c->head, len))
			break;
		used = true;
	}
	if (rc < 0)
		virtio_pci__fail(&n->vp, why);
	if (used)
		virtio_pci__queue_used(&n->vp, qi);
}

/* ---------------- transport callbacks ---------------- */

static void net__notify(void *ctx, unsigned q)
{
	struct net *n = ctx;
	if (q == NET_VQ_RX)
		net__rx(n);
	else if (q == NET_VQ_TX)
		net__drain(n, q, net__tx_chain);
	else if (q == NET_VQ_CTRL && virtio_pci__has(&n->vp, NET_F_CTRL_VQ))
		net__drain(n, q, net__ctrl_chain);
}

static void net__cfg_read(void *ctx, uint32_t off, uint8_t *data, unsigned len)
{
	struct net *n = ctx;
	uint8_t img[NET_CFG_SIZE];
	uint16_t pairs = 1;
	pthread_mutex_lock(&n->info_lock);
	memcpy(img, n->filter.mac, 6);
	memcpy(img + 6, &n->status, 2);
	pthread_mutex_unlock(&n->info_lock);
	memcpy(img + 8, &pairs, 2);
	memcpy(img + 10, &n->mtu, 2);
	memcpy(data, img + off, len);
}

/* The MAC is changed through the control queue (CTRL_MAC_ADDR); the
 * configuration space is read-only to a modern driver. */
static void net__cfg_write(void *ctx, uint32_t off, const uint8_t *data, unsigned len)
{
	(void)ctx, (void)off, (void)data, (void)len;
}

static void net__set_offloads(struct net *n, unsigned flags)
{
	if (n->be.offload && n->be.offload(n->be.ctx, flags))
		log_debug("virtio-net: the backend refused offloads %#x", flags);
}

static void net__driver_ok(void *ctx)
{
	struct net *n = ctx;
	unsigned off = 0;
	if (virtio_pci__has(&n->vp, NET_F_GUEST_CSUM))
		off |= NET_OFFLOAD_CSUM;
	if (virtio_pci__has(&n->vp, NET_F_GUEST_TSO4))
		off |= NET_OFFLOAD_TSO4;
	if (virtio_pci__has(&n->vp, NET_F_GUEST_TSO6))
		off |= NET_OFFLOAD_TSO6;
	if (!(off & NET_OFFLOAD_CSUM))
		off = 0;                   /* TSO without the checksum: the tap takes neither */
	net__set_offloads(n, off & n->offloads);
	pthread_mutex_lock(&n->info_lock);
	n->guest_announce = virtio_pci__has(&n->vp, NET_F_GUEST_ANNOUNCE) &&
			    virtio_pci__has(&n->vp, NET_F_CTRL_VQ);
	pthread_mutex_unlock(&n->info_lock);
}

static void net__reset(void *ctx)
{
	struct net *n = ctx;
	if (n->rx_len)
		NET_STAT_ADD(n, rx_dropped_pending, 1);
	n->rx_len = 0;
	net__read_on(n, false);
	net__set_offloads(n, 0);
	net__filter_reset(n);
	pthread_mutex_lock(&n->info_lock);
	n->status &= (uint16_t)~NET_S_ANNOUNCE;
	n->guest_announce = false;
	pthread_mutex_unlock(&n->info_lock);
}

static const struct virtio_ops net__ops = {
	net__cfg_read, net__cfg_write, net__notify, net__reset, net__driver_ok,
};

/* ---------------- life cycle ---------------- */

static uint64_t net__features(const struct net_conf *conf)
{
	uint64_t f = 1ull << NET_F_MAC | 1ull << NET_F_STATUS | 1ull << NET_F_MRG_RXBUF |
		     1ull << NET_F_CTRL_VQ | 1ull << NET_F_CTRL_RX | 1ull << NET_F_CTRL_MAC_ADDR |
		     1ull << NET_F_GUEST_ANNOUNCE;
	if (conf->mtu)
		f |= 1ull << NET_F_MTU;
	unsigned all = NET_OFFLOAD_CSUM | NET_OFFLOAD_TSO4 | NET_OFFLOAD_TSO6;
	if ((conf->offloads & all) == all)
		f |= 1ull << NET_F_CSUM | 1ull << NET_F_HOST_TSO4 | 1ull << NET_F_HOST_TSO6 |
		     1ull << NET_F_GUEST_CSUM | 1ull << NET_F_GUEST_TSO4 | 1ull << NET_F_GUEST_TSO6;
	return f;
}

int net__create(struct net **out, const struct net_conf *conf)
{
	if (conf->backend.fd < 0 || (conf->mtu && conf->mtu < NET_MTU_MIN) || (conf->mac[0] & 1))
		return -EINVAL;
	struct net *n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	n->rx_frame = malloc(NET_HDR_LEN + NET_FRAME_MAX + 1);
	n->chains = calloc(NET_MAX_MERGE, sizeof(*n->chains));
	n->mem = (struct virtio_mem){ conf->ram, conf->mark, conf->mark_ctx };
	n->be = conf->backend;
	memcpy(n->conf_mac, conf->mac, 6);
	n->mtu = conf->mtu;
	n->offloads = conf->offloads;
	n->status = NET_S_LINK_UP;
	pthread_mutex_init(&n->info_lock, NULL);
	net__filter_reset(n);
	struct virtio_pci_conf vc = {
		.virtio_id = VIRTIO_ID_NET, .class_code = 0x020000, .features = net__features(conf),
		.nqueues = NET_NR_VQS, .queue_max = NET_QUEUE_SIZE, .cfg_size = NET_CFG_SIZE,
		.irq_line = conf->irq_line, .bar_gpa = conf->bar_gpa,
	};
	int rc = n->rx_frame && n->chains ? 0 : -ENOMEM;
	if (!rc)
		rc = virtio_pci__init(&n->vp, &vc, &net__ops, n, &n->mem, conf->irq, conf->irq_ctx);
	if (rc) {
		free(n->rx_frame);
		free(n->chains);
		pthread_mutex_destroy(&n->info_lock);
		free(n);
		return rc;
	}
	*out = n;
	return 0;
}

void net__destroy(struct net *n)
{
	if (!n)
		return;
	virtio_pci__destroy(&n->vp);
	pthread_mutex_destroy(&n->info_lock);
	free(n->rx_frame);
	free(n->chains);
	free(n);
}

struct pci_dev *net__pci(struct net *n)
{
	return &n->vp.pci;
}

struct virtio_pci *net__transport(struct net *n)
{
	return &n->vp;
}

/* ---------------- without the device lock ---------------- */

void net__set_link(struct net *n, bool up)
{
	pthread_mutex_lock(&n->info_lock);
	uint16_t old = n->status;
	if (up)
		n->status |= NET_S_LINK_UP;
	else
		n->status &= (uint16_t)~NET_S_LINK_UP;
	bool changed = n->status != old;
	pthread_mutex_unlock(&n->info_lock);
	if (changed)
		virtio_pci__config_changed(&n->vp);
	/* down: the device's thread reads and drops what comes meanwhile,
	 * buffers posted or not (net__rx) */
	if (changed && !up && n->be.wants_read)
		n->be.wants_read(n->be.ctx, true);
}

_Static_assert(sizeof(struct net_stats) % sizeof(uint64_t) == 0,
	       "net_stats is read as an array of u64 counters");

void net__get_stats(struct net *n, struct net_stats *out)
{
	const uint64_t *src = (const uint64_t *)&n->stats;
	uint64_t *dst = (uint64_t *)out;
	for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); i++)
		dst[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
}

void net__get_filter(struct net *n, struct net_rx_filter *out)
{
	pthread_mutex_lock(&n->info_lock);
	*out = n->filter;
	pthread_mutex_unlock(&n->info_lock);
}

/* A RARP request (ethertype 0x8035, opcode 3) from mac to everyone,
 * padded to the 60-byte minimum, behind a zero virtio-net header. */
static void net__rarp(const uint8_t mac[6], uint8_t out[NET_HDR_LEN + 60])
{
	static const uint8_t arp_fixed[8] = { 0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x03 };
	uint8_t *f = out + NET_HDR_LEN;
	memset(out, 0, NET_HDR_LEN + 60);
	memset(f, 0xff, 6);
	memcpy(f + 6, mac, 6);
	f[12] = 0x80, f[13] = 0x35;
	memcpy(f + 14, arp_fixed, 8);
	memcpy(f + 22, mac, 6);        /* sender hardware address; sender IP 0 */
	memcpy(f + 32, mac, 6);        /* target hardware address; target IP 0 */
}

void net__announce_once(struct net *n)
{
	uint8_t frame[NET_HDR_LEN + 60];
	pthread_mutex_lock(&n->info_lock);
	net__rarp(n->filter.mac, frame);
	bool up = n->status & NET_S_LINK_UP;
	bool guest = n->guest_announce && up;
	if (guest)
		n->status |= NET_S_ANNOUNCE;
	pthread_mutex_unlock(&n->info_lock);
	if (!up)
		return;                    /* nothing goes out on a link that is down */
	if (write(n->be.fd, frame, sizeof(frame)) == (ssize_t)sizeof(frame))
		NET_STAT_ADD(n, announces, 1);
	else
		log_debug("virtio-net: a RARP announcement did not go out");
	if (guest)
		virtio_pci__config_changed(&n->vp);
}

uint64_t net__drop_backlog(struct net *n)
{
	pthread_mutex_lock(&n->vp.lock);
	uint64_t dropped = n->rx_len ? 1 : 0;
	n->rx_len = 0;
	/* bounded: a flood into the tap cannot hold the caller for ever */
	while (dropped < NET_BACKLOG_MAX && net__read_frame(n)) {
		dropped++;
		n->rx_len = 0;
	}
	pthread_mutex_unlock(&n->vp.lock);
	NET_STAT_ADD(n, rx_dropped_pending, dropped);
	return dropped;
}
