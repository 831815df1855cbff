/* Plugs the PCI bus and the balloon into a VM (kmig run --balloon):
 * device writes into guest RAM go to the dirty tracker, INTA to the
 * in-kernel irqchip with KVM_IRQ_LINE. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include "dev/balloon.h"
#include "kvm/vm_balloon.h"
#include "kvm/vm.h"
#include "mem/dirty.h"

static void vm_balloon__mark(void *ctx, uint64_t gpa, uint64_t len)
{
	struct vm *vm = ctx;
	if (vm->dirty)
		dirty__mark(vm->dirty, gpa, len);
}

static void vm_balloon__irq(void *ctx, bool level)
{
	struct vm *vm = ctx;
	struct kvm_irq_level l = { .irq = BALLOON_IRQ, .level = level };
	if (ioctl(vm->vm_fd, KVM_IRQ_LINE, &l) < 0)
		log_debug("balloon: KVM_IRQ_LINE %d: %s", level, strerror(errno));
}

int vm_balloon__attach(struct vm *vm, char *err, size_t errlen)
{
	vm->pci = calloc(1, sizeof(*vm->pci));
	if (!vm->pci)
		return -ENOMEM;
	pci__init(vm->pci);
	struct balloon_conf c = {
		.ram = &vm->ram, .mark = vm_balloon__mark, .mark_ctx = vm,
		.irq = vm_balloon__irq, .irq_ctx = vm, .irq_line = BALLOON_IRQ,
		.bar_gpa = BALLOON_BAR_GPA, .no_free_page_hint = vm->cfg.balloon_no_hint,
		.no_reporting = vm->cfg.balloon_no_reporting,
	};
	int rc = balloon__create(&vm->balloon, &c);
	if (!rc)
		rc = pci__add(vm->pci, BALLOON_PCI_SLOT, balloon__pci(vm->balloon));
	if (rc)
		snprintf(err, errlen, "cannot create the virtio-balloon device: %s", strerror(-rc));
	return rc;
}

void vm_balloon__detach(struct vm *vm)
{
	balloon__destroy(vm->balloon);
	vm->balloon = NULL;
	if (vm->pci) {
		pci__destroy(vm->pci);
		free(vm->pci);
		vm->pci = NULL;
	}
}
