/* QEMU's command-line options for a network device, as kmig run takes
 * them:
 *   --netdev tap,id=ID,ifname=NAME[,script=no][,downscript=no][,vhost=off]
 *   --device virtio-net-pci,netdev=ID[,id=DEVID][,mac=MAC][,mtu=N][,csum=on|off]
 * kmig runs no ifup scripts (script= and downscript= must be "no" when
 * given: the tap is set up beforehand) and has no vhost-net.  One net
 * device; its MAC defaults to QEMU's first, 52:54:00:12:34:56.  Every
 * error names the option and the value it refuses. */
#ifndef KMIG_CTL_NET_OPTS_H
#define KMIG_CTL_NET_OPTS_H

#include <stdbool.h>
#include <stddef.h>

#include "base/log.h"
#include "kvm/vm.h"

struct net_opts {
	bool have_netdev, have_device;
	char netdev_id[32], ifname[16];
	char device_netdev[32];
	struct vm_net_config dev;    /* device_id, mac, mtu, no_offloads */
};

void net_opts__init(struct net_opts *o);
int net_opts__netdev(struct net_opts *o, const char *spec, char *err, size_t errlen) KMIG_MUST_CHECK;
int net_opts__device(struct net_opts *o, const char *spec, char *err, size_t errlen) KMIG_MUST_CHECK;
/* Checks the pair (a device needs its netdev and a netdev its device)
 * and fills the VM's configuration; *on false when neither was given. */
int net_opts__finish(const struct net_opts *o, struct vm_net_config *out, bool *on, char *err,
		     size_t errlen) KMIG_MUST_CHECK;
/* "aa:bb:cc:dd:ee:ff": 0, or -EINVAL. */
int net_opts__parse_mac(const char *s, uint8_t mac[6]) KMIG_MUST_CHECK;

#endif
