/* Plugs the PCI bus and the balloon into a VM (kmig run --balloon):
 * device writes into guest RAM go to the dirty tracker, INTA to the
 * in-kernel irqchip with KVM_IRQ_LINE, queue notifications through
 * ioeventfds (unless ioeventfd=off) to the ioevent thread. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev/balloon.h"
#include "dev/virtio_pci.h"
#include "kvm/ioevent.h"
#include "kvm/vm_balloon.h"
#include "kvm/vm.h"
#include "kvm/vm_dev.h"

static void vm_balloon__irq(void *ctx, bool level)
{
	vm_dev__irq(ctx, BALLOON_IRQ, level, "balloon");
}

static void vm_balloon__notified(void *ctx, unsigned q)
{
	struct vm *vm = ctx;
	virtio_pci__notify(balloon__transport(vm->balloon), q);
}

/* The notification region moved: the ioeventfds follow it. */
static void vm_balloon__notify_map(void *ctx, uint64_t gpa)
{
	struct vm *vm = ctx;
	vm_dev__map_notify(vm->notify, gpa, "balloon");
}

/* Linux's and kmig's drivers write the queue index as 16 bits. */
static int vm_balloon__ioeventfds(struct vm *vm)
{
	vm->notify = calloc(1, sizeof(*vm->notify));
	if (!vm->notify)
		return -ENOMEM;
	int rc = ioevent__init(vm->notify, vm->vm_fd, BALLOON_NR_VQS, 2, vm_balloon__notified, vm);
	if (rc)
		return rc;
	virtio_pci__set_notify_map(balloon__transport(vm->balloon), vm_balloon__notify_map, vm);
	return 0;
}

int vm_balloon__attach(struct vm *vm, char *err, size_t errlen)
{
	struct balloon_conf c = {
		.ram = &vm->ram, .mark = vm_dev__mark, .mark_ctx = vm,
		.irq = vm_balloon__irq, .irq_ctx = vm, .irq_line = BALLOON_IRQ,
		.bar_gpa = BALLOON_BAR_GPA, .no_free_page_hint = vm->cfg.balloon_no_hint,
		.no_reporting = vm->cfg.balloon_no_reporting,
	};
	int rc = balloon__create(&vm->balloon, &c);
	if (!rc)
		rc = pci__add(vm->pci, BALLOON_PCI_SLOT, balloon__pci(vm->balloon));
	if (!rc && !vm->cfg.balloon_no_ioeventfd)
		rc = vm_balloon__ioeventfds(vm);
	if (rc)
		snprintf(err, errlen, "cannot create the virtio-balloon device: %s", strerror(-rc));
	return rc;
}

void vm_balloon__detach(struct vm *vm)
{
	if (vm->notify) {
		ioevent__destroy(vm->notify);
		free(vm->notify);
		vm->notify = NULL;
	}
	balloon__destroy(vm->balloon);
	vm->balloon = NULL;
}
