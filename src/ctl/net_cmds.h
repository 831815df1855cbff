/* QMP commands of the network device, as QEMU names them:
 *   set_link {"name", "up"}: name is the netdev's id or the NIC's (the
 *     device's id=, or "virtio-net-pci.0"); the guest sees the link
 *     change (status field and a config interrupt);
 *   query-rx-filter [{"name"}]: the receive filter the driver set, QEMU's
 *     fields, plus "x-counters" (kmig's frame counters of the device);
 *   announce-self {"initial", "max", "rounds", "step"[, "interfaces"]}:
 *     announce the guest's MAC now (RARP and, with GUEST_ANNOUNCE, the
 *     guest's own); with interfaces, only if it names this NIC (or its
 *     netdev).  "id" is accepted: kmig has one announcement timer.
 * Without a net device, set_link and query-rx-filter name nothing (QEMU's
 * errors) and announce-self does nothing.  None of them takes the
 * device lock (dev/net.h). */
#ifndef KMIG_CTL_NET_CMDS_H
#define KMIG_CTL_NET_CMDS_H

#include "base/log.h"

struct control;

int control__register_net(struct control *c) KMIG_MUST_CHECK;

#endif
