/* Plugs a virtio-net device on a tap into a VM (kmig run --netdev tap,...
 * --device virtio-net-pci,...): PCI slot NET_PCI_SLOT, INTA on GSI
 * NET_IRQ (in the MP table), the BAR at NET_BAR_GPA; device writes into
 * guest RAM go to the dirty tracker; queue notifications through
 * ioeventfds to a thread of the device's own, which also reads the tap
 * (no vhost-net: every frame passes through kmig).  That thread is held
 * with the vCPUs at every pause, so no frame reaches guest memory while
 * the VM is stopped (before the final dirty sync of a migration). */
#ifndef KMIG_KVM_VM_NET_H
#define KMIG_KVM_VM_NET_H

#include <stddef.h>

#include "base/log.h"

#define NET_PCI_SLOT 4
#define NET_IRQ 11
#define NET_BAR_GPA 0xe0004000ull

struct vm;

struct announce_params;

int vm_net__attach(struct vm *vm, char *err, size_t errlen) KMIG_MUST_CHECK;
void vm_net__detach(struct vm *vm);
/* Starts (or restarts) the self-announcements of the guest's MAC:
 * RARP frames on the tap and, with GUEST_ANNOUNCE, the guest's own.
 * -ENODEV without a net device, -EINVAL for bad parameters. */
int vm_net__announce(struct vm *vm, const struct announce_params *p) KMIG_MUST_CHECK;

#endif
