/* What the VM's devices plug into, shared by vm_balloon, vm_net and
 * vm_blk: the hook that marks guest memory a device wrote dirty for a
 * migration, the INTx line to the in-kernel irqchip, and the ioeventfds
 * following a virtio-pci notification region the guest moved.  Each may
 * be called from any thread (device workers, the ioevent thread). */
#ifndef KMIG_KVM_VM_DEV_H
#define KMIG_KVM_VM_DEV_H

#include <stdbool.h>
#include <stdint.h>

struct ioevent;
struct vm;

/* A device's mark hook (ctx: the vm): [gpa, gpa + len) dirty while the
 * VM's dirty tracking runs, unless a test build's KMIG_FAULT turned
 * device marks off. */
void vm_dev__mark(void *vm, uint64_t gpa, uint64_t len);
/* KVM_IRQ_LINE irq to level; a failure is logged with the device's name. */
void vm_dev__irq(struct vm *vm, unsigned irq, bool level, const char *name);
/* ev's ioeventfds moved to the notification region at gpa; if they
 * cannot be, notifications exit to kmig (logged, not an error). */
void vm_dev__map_notify(struct ioevent *ev, uint64_t gpa, const char *name);

#endif
