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
 * for the ack, is answered ERR (or, without an ack byte, only counted).
 * Commands are read from the buffers as they lie, of any length. */
#include <string.h>

#include "dev/net_impl.h"

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

/* Reads a command from a chain's readable buffers in order, however the
 * driver split it, never past their end. */
struct ctrl_reader {
	const struct virtq_chain *c;
	unsigned buf;              /* current readable buffer */
	size_t off;                /* within it */
	size_t left;               /* bytes not yet read, all buffers */
};

static void ctrl_reader__init(struct ctrl_reader *r, const struct virtq_chain *c)
{
	*r = (struct ctrl_reader){ c, 0, 0, 0 };
	for (unsigned i = 0; i < c->nout; i++)
		r->left += c->bufs[i].len;
}

/* Copies (out non-NULL) or skips n bytes; false if fewer are left. */
static bool ctrl_reader__take(struct ctrl_reader *r, void *out, size_t n)
{
	if (n > r->left)
		return false;
	r->left -= n;
	while (n) {
		const struct virtq_buf *b = &r->c->bufs[r->buf];
		size_t k = b->len - r->off < n ? b->len - r->off : n;
		if (out) {
			memcpy(out, b->host + r->off, k);
			out = (uint8_t *)out + k;
		}
		r->off += k;
		n -= k;
		if (r->off == b->len) {
			r->buf++;
			r->off = 0;
		}
	}
	return true;
}

/* One table of TABLE_SET: u32 count, count MACs; more than NET_MAC_TABLE
 * are skipped and set the overflow.  Whether the command holds it. */
static bool net__table(struct ctrl_reader *r, uint8_t (*t)[6], unsigned *nt, bool *overflow)
{
	uint32_t count;
	if (!ctrl_reader__take(r, &count, 4) || count > r->left / 6)
		return false;
	*overflow = count > NET_MAC_TABLE;
	*nt = *overflow ? 0 : count;
	return ctrl_reader__take(r, *overflow ? NULL : t, 6ull * count);
}

static uint8_t net__mac_table(struct net *n, struct ctrl_reader *r)
{
	struct net_rx_filter f;
	pthread_mutex_lock(&n->info_lock);
	f = n->filter;
	pthread_mutex_unlock(&n->info_lock);
	if (!net__table(r, f.uni, &f.nuni, &f.uni_overflow) ||
	    !net__table(r, f.multi, &f.nmulti, &f.multi_overflow) || r->left)
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

/* Applies one command (lock held, info_lock not); r is after the class
 * and command bytes. */
static uint8_t net__ctrl_cmd(struct net *n, uint8_t cls, uint8_t cmd, struct ctrl_reader *r)
{
	uint8_t data[6];
	if (cls == CTRL_MAC && cmd == MAC_TABLE_SET && virtio_pci__has(&n->vp, NET_F_CTRL_RX))
		return net__mac_table(n, r);
	if (cls == CTRL_RX && virtio_pci__has(&n->vp, NET_F_CTRL_RX) && r->left == 1 &&
	    ctrl_reader__take(r, data, 1) && data[0] <= 1 && (cmd == RX_PROMISC || cmd == RX_ALLMULTI)) {
		pthread_mutex_lock(&n->info_lock);
		if (cmd == RX_PROMISC)
			n->filter.promisc = data[0];
		else
			n->filter.allmulti = data[0];
		pthread_mutex_unlock(&n->info_lock);
		return ACK_OK;
	}
	if (cls == CTRL_MAC && cmd == MAC_ADDR_SET && virtio_pci__has(&n->vp, NET_F_CTRL_MAC_ADDR) &&
	    r->left == 6 && ctrl_reader__take(r, data, 6) && !(data[0] & 1)) {
		pthread_mutex_lock(&n->info_lock);
		memcpy(n->filter.mac, data, 6);
		pthread_mutex_unlock(&n->info_lock);
		return ACK_OK;
	}
	if (cls == CTRL_ANNOUNCE && cmd == ANNOUNCE_ACK && r->left == 0 &&
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
	struct ctrl_reader r;
	uint8_t head[2];
	ctrl_reader__init(&r, c);
	uint8_t ack = ctrl_reader__take(&r, head, 2) ? net__ctrl_cmd(n, head[0], head[1], &r)
						     : ACK_ERR;
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
