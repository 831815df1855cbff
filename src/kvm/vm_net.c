#include "kvm/vm_net.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev/announce.h"
#include "dev/net.h"
#include "dev/pci.h"
#include "dev/tap.h"
#include "kvm/ioevent.h"
#include "kvm/vm.h"
#include "kvm/vm_dev.h"

static void vm_net__irq(void *ctx, bool level)
{
	vm_dev__irq(ctx, NET_IRQ, level, "virtio-net");
}

static void vm_net__notified(void *ctx, unsigned q)
{
	struct vm *vm = ctx;
	virtio_pci__notify(net__transport(vm->net), q);
}

static void vm_net__readable(void *ctx)
{
	struct vm *vm = ctx;
	net__backend_readable(vm->net);
}

static void vm_net__wants_read(void *ctx, bool on)
{
	struct vm *vm = ctx;
	ioevent__watch_on(vm->net_notify, on);
}

static int vm_net__offload(void *ctx, unsigned flags)
{
	struct vm *vm = ctx;
	return tap__offload(vm->tap, flags);
}

static void vm_net__notify_map(void *ctx, uint64_t gpa)
{
	struct vm *vm = ctx;
	vm_dev__map_notify(vm->net_notify, gpa, "virtio-net");
}

static void vm_net__announce_round(void *ctx)
{
	struct vm *vm = ctx;
	net__announce_once(vm->net);
}

static unsigned vm_net__offloads(struct vm *vm)
{
	unsigned all = NET_OFFLOAD_CSUM | NET_OFFLOAD_TSO4 | NET_OFFLOAD_TSO6;
	if (vm->cfg.netc.no_offloads || !tap__probe(vm->tap, all))
		return 0;
	return all;
}

int vm_net__attach(struct vm *vm, char *err, size_t errlen)
{
	vm->tap = calloc(1, sizeof(*vm->tap));
	vm->net_notify = calloc(1, sizeof(*vm->net_notify));
	if (!vm->tap || !vm->net_notify)
		return -ENOMEM;
	vm->tap->fd = -1;
	int rc = ioevent__init(vm->net_notify, vm->vm_fd, NET_NR_VQS, 2, vm_net__notified, vm);
	if (rc) {
		snprintf(err, errlen, "virtio-net: cannot create its eventfds: %s", strerror(-rc));
		return rc;
	}
	rc = tap__open(vm->tap, vm->cfg.netc.ifname, err, errlen);
	if (rc)
		return rc;
	ioevent__watch(vm->net_notify, vm->tap->fd, vm_net__readable);
	struct net_conf c = {
		.ram = &vm->ram, .mark = vm_dev__mark, .mark_ctx = vm, .irq = vm_net__irq,
		.irq_ctx = vm, .irq_line = NET_IRQ, .bar_gpa = NET_BAR_GPA, .mtu = vm->cfg.netc.mtu,
		.offloads = vm_net__offloads(vm),
		.backend = { vm->tap->fd, vm_net__offload, vm_net__wants_read, vm },
	};
	memcpy(c.mac, vm->cfg.netc.mac, 6);
	rc = net__create(&vm->net, &c);
	if (!rc)
		rc = pci__add(vm->pci, NET_PCI_SLOT, net__pci(vm->net));
	if (rc) {
		snprintf(err, errlen, "cannot create the virtio-net device: %s", strerror(-rc));
		return rc;
	}
	virtio_pci__set_notify_map(net__transport(vm->net), vm_net__notify_map, vm);
	vm->announce = calloc(1, sizeof(*vm->announce));
	if (!vm->announce)
		return -ENOMEM;
	return announcer__init(vm->announce, vm_net__announce_round, vm);
}

int vm_net__announce(struct vm *vm, const struct announce_params *p)
{
	if (!vm->announce)
		return -ENODEV;
	return announcer__start(vm->announce, p);
}

void vm_net__detach(struct vm *vm)
{
	if (vm->announce) {
		announcer__destroy(vm->announce);
		free(vm->announce);
		vm->announce = NULL;
	}
	if (vm->net_notify) {
		ioevent__destroy(vm->net_notify);
		free(vm->net_notify);
		vm->net_notify = NULL;
	}
	net__destroy(vm->net);
	vm->net = NULL;
	if (vm->tap) {
		tap__close(vm->tap);
		free(vm->tap);
		vm->tap = NULL;
	}
}
