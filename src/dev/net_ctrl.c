/* virtio-net's control queue and receive filter.
 *
 * A control chain: readable class (u8), command (u8), data; then one
 * writable byte, the ack (0 OK, 1 ERR).  Commands:
 *   class 0 (RX, with CTRL_RX): 0 PROMISC, 1 ALLMULTI, data one byte 0/1;
 *   class 1 (MAC): 0 TABLE_SET (with CTRL_RX): u32 n + n unicast MACs,
 *     u32 m + m multicast MACs, nothing more; more than NET_MAC_TABLE
 *     entries in a table lets that whole class through (overflow);
 *     1 ADDR_SET (with CTRL_MAC_ADDR): 6 bytes, a unicast MAC;
 *   class 3 (ANNOUNCE, with GUEST_ANNOUNCE): 0 ACK clears ANNOUNCE.
 * Anything else, a short or long command, or a chain without a place
 * for the ack, is answered ERR (or, without an ack byte, only counted). */
#include <string.h>

#include "dev/net_impl.h"

#define CTRL_CMD_MAX (2 + 2 * (4 + NET_MAC_TABLE * 6) + 64)
enum { CTRL_RX = 0, CTRL_MAC = 1, CTRL_ANNOUNCE = 3 };
enum { RX_PROMISC = 0, RX_ALLMULTI = 1, MAC_TABLE_SET = 0, MAC_ADDR_SET = 1, ANNOUNCE_ACK = 0 };
#define ACK_OK 0
#define ACK_ERR 1

void net__filter_reset(struct net *n)
{
	pthread_mutex_lock(&n->info_lock);
	memset(&n->filter, 0, sizeof(n->filter));
	memcpy(n->filter.mac, n->conf_mac, 6);
	n->filter.promisc = true;       /* until the driver sets a mode */
	pthread_mutex_unlock(&n->info_lock);
}

static bool net__in_table(const uint8_t (*t)[6], unsigned nt, const uint8_t *mac)
{
	for (unsigned i = 0; i < nt; i++)
		if (!memcmp(t[i], mac, 6))
			return true;
	return false;
}

bool net__filter_pass(struct net *n, const uint8_t *frame, size_t len)
{
	static const uint8_t bcast[6] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };
	if (len < 6)
		return false;
	const struct net_rx_filter *f = &n->filter;
	bool pass;
	pthread_mutex_lock(&n->info_lock);
	if (f->promisc || !memcmp(frame, bcast, 6))
		pass = true;
	else if (frame[0] & 1)
		pass = f->allmulti || f->multi_overflow || net__in_table(f->multi, f->nmulti, frame);
	else
		pass = !memcmp(frame, f->mac, 6) || f->uni_overflow ||
		       net__in_table(f->uni, f->nuni, frame);
	pthread_mutex_unlock(&n->info_lock);
	return pass;
}

/* One table of TABLE_SET at *pos: u32 count, count MACs.  Whether it fits
 * the command; stores it (or the overflow) in the filter copy t. */
static bool net__table(const uint8_t *cmd, size_t len, size_t *pos, uint8_t (*t)[6],
		       unsigned *nt, bool *overflow)
{
	uint32_t count;
	if (len - *pos < 4)
		return false;
	memcpy(&count, cmd + *pos, 4);
	*pos += 4;
	if (count > (len - *pos) / 6)
		return false;
	*overflow = count > NET_MAC_TABLE;
	*nt = *overflow ? 0 : count;
	if (!*overflow)
		memcpy(t, cmd + *pos, 6ull * count);
	*pos += 6ull * count;
	return true;
}

static uint8_t net__mac_table(struct net *n, const uint8_t *data, size_t len)
{
	struct net_rx_filter f;
	pthread_mutex_lock(&n->info_lock);
	f = n->filter;
	pthread_mutex_unlock(&n->info_lock);
	size_t pos = 0;
	if (!net__table(data, len, &pos, f.uni, &f.nuni, &f.uni_overflow) ||
	    !net__table(data, len, &pos, f.multi, &f.nmulti, &f.multi_overflow) || pos != len)
		return ACK_ERR;
	pthread_mutex_lock(&n->info_lock);
	memcpy(n->filter.uni, f.uni, sizeof(f.uni));
	memcpy(n->filter.multi, f.multi, sizeof(f.multi));
	n->filter.nuni = f.nuni;
	n->filter.nmulti = f.nmulti;
	n->filter.uni_overflow = f.uni_overflow;
	n->filter.multi_overflow = f.multi_overflow;
	pthread_mutex_unlock(&n->info_lock);
	return ACK_OK;
}

/* Applies one command (lock held, info_lock not). */
static uint8_t net__ctrl_cmd(struct net *n, uint8_t cls, uint8_t cmd, const uint8_t *data, size_t len)
{
	if (cls == CTRL_RX && virtio_pci__has(&n->vp, NET_F_CTRL_RX) && len == 1 &&
	    data[0] <= 1 && (cmd == RX_PROMISC || cmd == RX_ALLMULTI)) {
		pthread_mutex_lock(&n->info_lock);
		if (cmd == RX_PROMISC)
			n->filter.promisc = data[0];
		else
			n->filter.allmulti = data[0];
		pthread_mutex_unlock(&n->info_lock);
		return ACK_OK;
	}
	if (cls == CTRL_MAC && cmd == MAC_TABLE_SET && virtio_pci__has(&n->vp, NET_F_CTRL_RX))
		return net__mac_table(n, data, len);
	if (cls == CTRL_MAC && cmd == MAC_ADDR_SET && virtio_pci__has(&n->vp, NET_F_CTRL_MAC_ADDR) &&
	    len == 6 && !(data[0] & 1)) {
		pthread_mutex_lock(&n->info_lock);
		memcpy(n->filter.mac, data, 6);
		pthread_mutex_unlock(&n->info_lock);
		return ACK_OK;
	}
	if (cls == CTRL_ANNOUNCE && cmd == ANNOUNCE_ACK && len == 0 &&
	    virtio_pci__has(&n->vp, NET_F_GUEST_ANNOUNCE)) {
		pthread_mutex_lock(&n->info_lock);
		n->status &= (uint16_t)~NET_S_ANNOUNCE;
		pthread_mutex_unlock(&n->info_lock);
		return ACK_OK;
	}
	return ACK_ERR;
}

uint32_t net__ctrl_chain(struct net *n, const struct virtq_chain *c)
{
	uint8_t cmd[CTRL_CMD_MAX];
	size_t len = 0;
	bool fits = true;
	for (unsigned i = 0; i < c->nout; i++) {
		const struct virtq_buf *b = &c->bufs[i];
		if (b->len > sizeof(cmd) - len) {
			fits = false;
			break;
		}
		memcpy(cmd + len, b->host, b->len);
		len += b->len;
	}
	uint8_t ack = fits && len >= 2 ? net__ctrl_cmd(n, cmd[0], cmd[1], cmd + 2, len - 2) : ACK_ERR;
	NET_STAT_ADD(n, ctrl_cmds, 1);
	if (ack != ACK_OK)
		NET_STAT_ADD(n, ctrl_errors, 1);
	const struct virtq_buf *a = c->nin ? &c->bufs[c->nout] : NULL;
	if (!a || !a->len)
		return 0;
	a->host[0] = ack;
	if (n->mem.mark)
		n->mem.mark(n->mem.mark_ctx, a->gpa, 1);
	return 1;
}
