/* The balloon as part of a VM: vm->pci (bus 0 with the host bridge) and
 * vm->balloon in slot BALLOON_PCI_SLOT, BAR at BALLOON_BAR_GPA, INTA on
 * GSI BALLOON_IRQ.  attach runs in vm__create after the dirty tracker
 * exists; detach after the vCPU threads are gone (NULL-safe). */
#ifndef KMIG_KVM_VM_BALLOON_H
#define KMIG_KVM_VM_BALLOON_H

#include <stddef.h>

#include "base/log.h"

struct vm;

int vm_balloon__attach(struct vm *vm, char *err, size_t errlen) KMIG_MUST_CHECK;
void vm_balloon__detach(struct vm *vm);

#endif
