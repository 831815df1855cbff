/* STATE_DEV_NET for virtio-net: layout (little-endian)
 *   u32 magic "NET1", u32 transport length, transport (virtio_pci__save),
 *   u8 configured MAC[6], u8 current MAC[6], u16 status, u16 MTU,
 *   u8 flags (1 promiscuous, 2 all-multicast, 4 unicast overflow,
 *   8 multicast overflow), u8 unicast entries, u8 multicast entries, u8 0,
 *   the unicast then the multicast MACs, 6 bytes each.
 * A frame waiting for receive buffers is not carried (dropped and
 * counted, as frames still in the source's tap are). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "dev/net_impl.h"

#define NET_STATE_MAGIC 0x3154454eu /* "NET1" */
#define NET_STATE_FIXED 20
#define NET_STATE_MAX (8 + VIRTIO_PCI_STATE_MAX + NET_STATE_FIXED + 2 * NET_MAC_TABLE * 6)

enum { F_PROMISC = 1, F_ALLMULTI = 2, F_UNI_OVER = 4, F_MULTI_OVER = 8 };

static size_t net__put_info(struct net *n, uint8_t *p)
{
	const struct net_rx_filter *f = &n->filter;
	pthread_mutex_lock(&n->info_lock);
	memcpy(p, n->conf_mac, 6);
	memcpy(p + 6, f->mac, 6);
	memcpy(p + 12, &n->status, 2);
	memcpy(p + 14, &n->mtu, 2);
	p[16] = (uint8_t)((f->promisc ? F_PROMISC : 0) | (f->allmulti ? F_ALLMULTI : 0) |
			  (f->uni_overflow ? F_UNI_OVER : 0) | (f->multi_overflow ? F_MULTI_OVER : 0));
	p[17] = (uint8_t)f->nuni;
	p[18] = (uint8_t)f->nmulti;
	p[19] = 0;
	memcpy(p + 20, f->uni, 6ull * f->nuni);
	memcpy(p + 20 + 6ull * f->nuni, f->multi, 6ull * f->nmulti);
	size_t len = 20 + 6ull * (f->nuni + f->nmulti);
	pthread_mutex_unlock(&n->info_lock);
	return len;
}

int net__save(struct net *n, state_put_fn put, void *ctx)
{
	uint8_t buf[NET_STATE_MAX];
	pthread_mutex_lock(&n->vp.lock);
	if (n->rx_len)
		NET_STAT_ADD(n, rx_dropped_pending, 1);
	n->rx_len = 0;
	long tl = virtio_pci__save(&n->vp, buf + 8, VIRTIO_PCI_STATE_MAX);
	size_t pos = 0;
	if (tl >= 0) {
		uint32_t head[2] = { NET_STATE_MAGIC, (uint32_t)tl };
		memcpy(buf, head, 8);
		pos = 8 + (size_t)tl;
		pos += net__put_info(n, buf + pos);
	}
	pthread_mutex_unlock(&n->vp.lock);
	return tl < 0 ? (int)tl : put(ctx, STATE_DEV_NET, STATE_VERSION, 0, buf, pos);
}

/* Checks the fixed part and the tables at p (len bytes) into f. */
static int net__parse_info(struct net *n, const uint8_t *p, size_t len, struct net_rx_filter *f,
			   uint16_t *status, char *why, size_t whylen)
{
	uint16_t mtu;
	if (len < 20) {
		snprintf(why, whylen, "virtio-net state: truncated");
		return -EINVAL;
	}
	memcpy(&mtu, p + 14, 2);
	memcpy(status, p + 12, 2);
	memset(f, 0, sizeof(*f));
	memcpy(f->mac, p + 6, 6);
	f->nuni = p[17];
	f->nmulti = p[18];
	if (memcmp(p, n->conf_mac, 6) || mtu != n->mtu) {
		snprintf(why, whylen, "virtio-net state: the source's device has another %s",
			 mtu != n->mtu ? "MTU" : "MAC (mac=)");
		return -EINVAL;
	}
	if ((p[16] & ~0xfu) || f->nuni > NET_MAC_TABLE || f->nmulti > NET_MAC_TABLE ||
	    len != 20 + 6ull * (f->nuni + f->nmulti) || (*status & ~3u) || (f->mac[0] & 1)) {
		snprintf(why, whylen, "virtio-net state: bad receive filter or status");
		return -EINVAL;
	}
	f->promisc = p[16] & F_PROMISC;
	f->allmulti = p[16] & F_ALLMULTI;
	f->uni_overflow = p[16] & F_UNI_OVER;
	f->multi_overflow = p[16] & F_MULTI_OVER;
	memcpy(f->uni, p + 20, 6ull * f->nuni);
	memcpy(f->multi, p + 20 + 6ull * f->nuni, 6ull * f->nmulti);
	return 0;
}

int net__load(struct net *n, const void *data, size_t len, char *why, size_t whylen)
{
	const uint8_t *p = data;
	uint32_t head[2];
	struct net_rx_filter f;
	uint16_t status;
	if (len < 8 || (memcpy(head, p, 8), head[0] != NET_STATE_MAGIC) || head[1] > len - 8) {
		snprintf(why, whylen, "virtio-net state: bad header");
		return -EINVAL;
	}
	int rc = net__parse_info(n, p + 8 + head[1], len - 8 - head[1], &f, &status, why, whylen);
	if (rc)
		return rc;
	pthread_mutex_lock(&n->vp.lock);
	/* what DRIVER_OK derives is set again by the load (driver_ok) if the
	 * section has it, and stays reset otherwise */
	pthread_mutex_lock(&n->info_lock);
	n->guest_announce = false;
	pthread_mutex_unlock(&n->info_lock);
	if (n->be.offload && n->be.offload(n->be.ctx, 0))
		log_debug("virtio-net: the backend refused offloads 0");
	const char *vwhy = NULL;
	long tl = virtio_pci__load(&n->vp, p + 8, head[1], &vwhy);
	if (tl < 0 || (size_t)tl != head[1]) {
		snprintf(why, whylen, "virtio-net state: %s", vwhy ? vwhy : "transport length mismatch");
		rc = -EINVAL;
	} else {
		pthread_mutex_lock(&n->info_lock);
		n->filter = f;
		n->status = status;
		pthread_mutex_unlock(&n->info_lock);
	}
	n->rx_len = 0;
	/* frames are read again once the VM runs (the device's thread is
	 * held until then): no guest memory is touched here */
	bool rx = !rc && virtio_pci__running(&n->vp) && n->vp.vqs[NET_VQ_RX].ready;
	n->reading = rx;
	if (n->be.wants_read)
		n->be.wants_read(n->be.ctx, rx);
	pthread_mutex_unlock(&n->vp.lock);
	return rc;
}
