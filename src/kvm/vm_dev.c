#include "kvm/vm_dev.h"

#include <errno.h>
#include <string.h>
#include <sys/ioctl.h>

#include "dev/virtio_pci.h"
#include "kvm/ioevent.h"
#include "kvm/vm.h"
#include "mem/dirty.h"

void vm_dev__mark(void *ctx, uint64_t gpa, uint64_t len)
{
	struct vm *vm = ctx;
	if (vm->dirty && !atomic_load(&vm->device_marks_off))
		dirty__mark(vm->dirty, gpa, len);
}

void vm_dev__irq(struct vm *vm, unsigned irq, bool level, const char *name)
{
	struct kvm_irq_level l = { .irq = irq, .level = level };
	if (ioctl(vm->vm_fd, KVM_IRQ_LINE, &l) < 0)
		log_debug("%s: KVM_IRQ_LINE %d: %s", name, level, strerror(errno));
}

void vm_dev__map_notify(struct ioevent *ev, uint64_t gpa, const char *name)
{
	int rc = ioevent__map(ev, gpa, VIRTIO_PCI_NOTIFY_MULT);
	if (rc)
		log_warn("%s: no ioeventfds at %#llx (%s): notifications exit to kmig", name,
			 (unsigned long long)gpa, strerror(-rc));
}
