/* virtio-net (virtio 1.x section 5.1) on the virtio-pci transport, one
 * queue pair and a control queue, its frames going to and from a backend
 * fd: a tap device (dev/tap.h) or, in unit tests, a datagram socket.
 * Every frame on the backend starts with the 12-byte virtio-net header.
 *
 * Queues: 0 receive, 1 transmit, 2 control (when CTRL_VQ is negotiated).
 * Features offered: VERSION_1, MAC, STATUS, MTU (when conf.mtu is set),
 * MRG_RXBUF, CTRL_VQ, CTRL_RX, CTRL_MAC_ADDR, GUEST_ANNOUNCE, and, when
 * conf.offloads says the backend takes them, CSUM, HOST_TSO4/6 and
 * GUEST_CSUM, GUEST_TSO4/6 (the backend's offloads follow the negotiated
 * GUEST_* set at DRIVER_OK and after a state load).
 * Configuration (12 bytes): mac[6], status (LINK_UP 1, ANNOUNCE 2),
 * max_virtqueue_pairs (1), mtu.
 *
 * Transmit: each chain is a 12-byte header then the frame, readable
 * buffers only; the header is checked (no GSO or checksum request the
 * driver did not negotiate) and the frame written to the backend in one
 * write.  Bad chains and frames the backend refuses are dropped and
 * counted; the chain is returned either way.
 *
 * Receive: a frame read from the backend passes the receive filter
 * (promiscuous, all-multicast, the MAC tables of CTRL_RX/CTRL_MAC_ADDR;
 * promiscuous until the driver sets a mode, as after a reset), then goes
 * into the writable buffers of one chain, or of several with MRG_RXBUF
 * (num_buffers in the first header).  When the driver has posted too
 * little, the frame waits and the backend is not read until the receive
 * queue is notified; a frame too long for any chain the driver could post
 * (no MRG_RXBUF, small buffers) is dropped and counted.  Every byte the
 * device writes into guest memory is reported through virtio_mem.mark.
 *
 * Threads and locks: queue work runs with the device lock (vp.lock) held,
 * on whichever thread notified (the device's ioevent thread, or a vCPU).
 * The link state, the receive filter's copy for QMP and the counters are
 * behind the leaf lock `info_lock` or atomics, never held while guest
 * memory is touched: QMP calls (set_link, query-rx-filter, the counters)
 * and the announcer never take vp.lock, so a device thread waiting for a
 * page a post-copy destination lacks cannot block them. */
#ifndef KMIG_DEV_NET_H
#define KMIG_DEV_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"
#include "dev/virtio_pci.h"
#include "state/state.h"

#define VIRTIO_ID_NET 1
#define NET_F_CSUM 0
#define NET_F_GUEST_CSUM 1
#define NET_F_MTU 3
#define NET_F_MAC 5
#define NET_F_GUEST_TSO4 7
#define NET_F_GUEST_TSO6 8
#define NET_F_HOST_TSO4 11
#define NET_F_HOST_TSO6 12
#define NET_F_MRG_RXBUF 15
#define NET_F_STATUS 16
#define NET_F_CTRL_VQ 17
#define NET_F_CTRL_RX 18
#define NET_F_GUEST_ANNOUNCE 21
#define NET_F_CTRL_MAC_ADDR 23

#define NET_S_LINK_UP 1
#define NET_S_ANNOUNCE 2

#define NET_HDR_LEN 12               /* virtio_net_hdr_v1, before every frame */
#define NET_CFG_SIZE 12
#define NET_QUEUE_SIZE 256
#define NET_NR_VQS 3
#define NET_VQ_RX 0
#define NET_VQ_TX 1
#define NET_VQ_CTRL 2
#define NET_FRAME_MAX 65550          /* a GSO frame's largest, as tap allows */
#define NET_MAC_TABLE 64             /* entries per table before overflow */
#define NET_MTU_MIN 68

/* TUN_F_* as the backend's offload call takes them */
#define NET_OFFLOAD_CSUM 0x01
#define NET_OFFLOAD_TSO4 0x02
#define NET_OFFLOAD_TSO6 0x04

struct net_stats {
	uint64_t rx_frames, rx_bytes;
	uint64_t rx_filtered;        /* dropped by the receive filter */
	uint64_t rx_too_long;        /* no chains the ring could hold fit it, or cut */
	uint64_t rx_bad_offload;     /* offloads or size the driver did not negotiate */
	uint64_t rx_link_down;       /* read while the link was down */
	uint64_t rx_dropped_pending; /* waiting for buffers at a reset or a save */
	uint64_t tx_frames, tx_bytes;
	uint64_t tx_errors;          /* bad chains, bad headers, refused by the backend */
	uint64_t tx_link_down;       /* sent while the link was down: dropped */
	uint64_t ctrl_cmds, ctrl_errors;
	uint64_t announces;          /* RARP frames sent by net__announce_once */
};

/* The receive filter as QMP's query-rx-filter shows it. */
struct net_rx_filter {
	uint8_t mac[6];
	bool promisc, allmulti;
	unsigned nuni, nmulti;
	bool uni_overflow, multi_overflow;
	uint8_t uni[NET_MAC_TABLE][6], multi[NET_MAC_TABLE][6];
};

/* The backend: frames in and out with a 12-byte header; offload takes
 * NET_OFFLOAD_* (may be NULL: none); wants_read turns reading of the fd
 * on or off (the device's thread polls it only while on). */
struct net_backend {
	int fd;
	int (*offload)(void *ctx, unsigned flags);
	void (*wants_read)(void *ctx, bool on);
	void *ctx;
};

struct net_conf {
	struct ram *ram;
	void (*mark)(void *ctx, uint64_t gpa, uint64_t len); /* dirty__mark; may be NULL */
	void *mark_ctx;
	virtio_irq_fn irq;
	void *irq_ctx;
	uint8_t irq_line;
	uint64_t bar_gpa;
	uint8_t mac[6];
	uint16_t mtu;                /* 0: MTU not offered */
	unsigned offloads;           /* NET_OFFLOAD_* the backend takes */
	struct net_backend backend;
};

struct net;

int net__create(struct net **out, const struct net_conf *conf) KMIG_MUST_CHECK;
void net__destroy(struct net *n);
struct pci_dev *net__pci(struct net *n);
struct virtio_pci *net__transport(struct net *n);

/* Device thread (or any): the backend fd is readable.  Takes vp.lock. */
void net__backend_readable(struct net *n);

/* Never take vp.lock (see above).  QMP set_link: the link goes up or
 * down, the guest sees it in the status field and a config interrupt. */
void net__set_link(struct net *n, bool up);
bool net__link(struct net *n);
void net__get_stats(struct net *n, struct net_stats *out);
void net__get_filter(struct net *n, struct net_rx_filter *out);
/* One announcement round: a RARP frame from the guest's MAC on the
 * backend and, with GUEST_ANNOUNCE negotiated, ANNOUNCE in the status
 * field and a config interrupt (the driver sends its own gratuitous
 * ARP and acknowledges on the control queue). */
void net__announce_once(struct net *n);
/* Frames the backend holds now, read and dropped (the source after a
 * completed migration: they went nowhere).  Takes vp.lock. */
uint64_t net__drop_backlog(struct net *n);

/* STATE_DEV_NET (instance 0): transport, configuration, link, the
 * receive filter.  VM paused (no queue work running). */
int net__save(struct net *n, state_put_fn put, void *ctx) KMIG_MUST_CHECK;
int net__load(struct net *n, const void *data, size_t len, char *why, size_t whylen) KMIG_MUST_CHECK;

#endif
