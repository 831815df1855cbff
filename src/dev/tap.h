/* A tap device as virtio-net's backend (Linux's /dev/net/tun).
 *
 * tap__open attaches to the tap interface `ifname` (creating it when it
 * does not exist and the process may) with IFF_TAP | IFF_NO_PI |
 * IFF_VNET_HDR, a virtio-net header of NET_HDR_LEN (12, dev/net.h) bytes before every
 * frame in both directions (TUNSETVNETHDRSZ), the fd non-blocking.  An
 * interface that exists but cannot take the header, or is attached to
 * another process already (a busy tap: EBUSY), is refused with a reason.
 *
 * Offloads: tap__offload sets which offloads the tap may hand us (the
 * guest's negotiated GUEST_* features: TUN_F_CSUM, TUN_F_TSO4, ...);
 * tap__probe tells whether the kernel takes a set (used at start-up to
 * decide which offload features the device offers).
 *
 * No thread and no lock: the device calls these from its own thread;
 * tap__write is also safe from another thread (one write is one frame). */
#ifndef KMIG_DEV_TAP_H
#define KMIG_DEV_TAP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/uio.h>

#include "base/log.h"

#define TAP_NAME_MAX 16

struct tap {
	int fd;
	char name[TAP_NAME_MAX];
};

int tap__open(struct tap *t, const char *ifname, char *err, size_t errlen) KMIG_MUST_CHECK;
void tap__close(struct tap *t);
/* TUN_F_* flags; 0/-errno. */
int tap__offload(struct tap *t, unsigned flags) KMIG_MUST_CHECK;
bool tap__probe(struct tap *t, unsigned flags);

#endif
