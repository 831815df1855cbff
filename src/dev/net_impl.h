/* Internals of the virtio-net device (net.c, net_ctrl.c, net_state.c).
 * Fields below vp are under vp.lock unless noted. */
#ifndef KMIG_DEV_NET_IMPL_H
#define KMIG_DEV_NET_IMPL_H

#include <pthread.h>

#include "dev/net.h"

struct net {
	struct virtio_pci vp;          /* vp.lock is the device lock */
	struct virtio_mem mem;
	struct net_backend be;
	uint8_t conf_mac[6];           /* the MAC given at creation (a reset's) */
	uint16_t mtu;
	unsigned offloads;             /* NET_OFFLOAD_* the backend takes */
	/* a frame read from the backend that waits for receive buffers */
	uint8_t *rx_frame;             /* NET_HDR_LEN + NET_FRAME_MAX bytes */
	size_t rx_len;                 /* 0: none waiting */
	bool reading;                  /* the backend is polled */
	bool be_dead;                  /* its reads fail (the tap is gone) */
	struct virtq_chain *chains;    /* NET_MAX_MERGE chains of one frame */
	/* under info_lock: a leaf, never held while guest memory is touched */
	pthread_mutex_t info_lock;
	struct net_rx_filter filter;   /* mac is the device's current MAC */
	uint16_t status;               /* NET_S_* */
	bool guest_announce;           /* GUEST_ANNOUNCE negotiated and DRIVER_OK */
	struct net_stats stats;        /* atomics: NET_STAT_ADD */
};

#define NET_STAT_ADD(n, f, v) __atomic_fetch_add(&(n)->stats.f, (v), __ATOMIC_RELAXED)

/* net_ctrl.c: one control chain (lock held; returns the bytes written
 * into it); the filter's reset state;
 * whether a frame passes the filter (info_lock not held). */
uint32_t net__ctrl_chain(struct net *n, const struct virtq_chain *c);
void net__filter_reset(struct net *n);
bool net__filter_pass(struct net *n, const uint8_t *frame, size_t len);

#endif
