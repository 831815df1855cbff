/* Plugs a virtio-blk device on an image into a VM (kmig run --blockdev
 * ... --device virtio-blk-pci,...): PCI slot BLK_PCI_SLOT, INTA on GSI
 * BLK_IRQ (level-triggered, in the MP table), the BAR at BLK_BAR_GPA;
 * device writes into guest RAM go to the dirty tracker; queue
 * notifications through an ioeventfd to a thread of the device's own,
 * which takes requests off the ring and hands them to the image's workers
 * (dev/blkfile.h).  That thread is held with the vCPUs at every pause,
 * and the pause then drains the device (vm_blk__drain): every request
 * taken completes and what was written is flushed, so nothing reaches
 * guest memory or the image while the VM is stopped (before the final
 * dirty sync of a migration).
 *
 * I/O errors (werror/rerror): each failure goes to vm->on_io_error;
 * for action stop that stops the VM (status io-error), and the last
 * resume lets the device retry what it kept (vm_blk__restart).
 *
 * A VM started with --incoming opens its image inactive (shared lock, no
 * I/O) and takes the write lock in vm_blk__activate when the guest
 * becomes its own; a source gives it up in vm_blk__inactivate at the
 * switchover, and takes it back if the migration fails. */
#ifndef KMIG_KVM_VM_BLK_H
#define KMIG_KVM_VM_BLK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"

#define BLK_PCI_SLOT 5
#define BLK_IRQ 5
#define BLK_BAR_GPA 0xe0008000ull

struct vm;

int vm_blk__attach(struct vm *vm, char *err, size_t errlen) KMIG_MUST_CHECK;
void vm_blk__detach(struct vm *vm);
/* The pause path, after the device's thread is held: waits for requests
 * in flight (for ever with wait_ns 0) and flushes.  0 without a disk. */
int vm_blk__drain(struct vm *vm, uint64_t wait_ns) KMIG_MUST_CHECK;
/* Hand-over of the image lock (dev/blkfile.h); 0 without a disk. */
int vm_blk__activate(struct vm *vm, char *err, size_t errlen) KMIG_MUST_CHECK;
int vm_blk__inactivate(struct vm *vm) KMIG_MUST_CHECK;
/* Whether this VM holds its image (true without a disk). */
bool vm_blk__active(struct vm *vm);
/* The VM runs again (its last pause level went): the disk retries the
 * requests it kept after an I/O error with action stop, in order, on its
 * notification thread.  No-op without a disk or such requests. */
void vm_blk__restart(struct vm *vm);
/* How many such requests the disk keeps (0 without a disk).  They
 * migrate in its state section: a destination loaded with some stays in
 * io-error until cont, unless the source was running. */
unsigned vm_blk__kept(struct vm *vm);

#endif
