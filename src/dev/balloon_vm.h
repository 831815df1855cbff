/* The balloon as part of a VM: vm->pci (bus 0 with the host bridge) and
 * vm->balloon in slot BALLOON_PCI_SLOT, BAR at BALLOON_BAR_GPA, INTA on
 * GSI BALLOON_IRQ.  attach runs in vm__create after the dirty tracker
 * exists; detach after the vCPU threads are gone (NULL-safe). */
#ifndef KMIG_DEV_BALLOON_VM_H
#define KMIG_DEV_BALLOON_VM_H

#include <stddef.h>

#include "base/log.h"

struct vm;

int balloon_vm__attach(struct vm *vm, char *err, size_t errlen) KMIG_MUST_CHECK;
void balloon_vm__detach(struct vm *vm);

#endif
