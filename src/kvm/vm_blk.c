#include "kvm/vm_blk.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dev/blk.h"
#include "dev/blkfile.h"
#include "dev/pci.h"
#include "kvm/ioevent.h"
#include "kvm/vm.h"
#include "kvm/vm_dev.h"

static void vm_blk__irq(void *ctx, bool level)
{
	vm_dev__irq(ctx, BLK_IRQ, level, "virtio-blk");
}

static void vm_blk__notified(void *ctx, unsigned q)
{
	struct vm *vm = ctx;
	virtio_pci__notify(blk__transport(vm->blk), q);
}

static void vm_blk__notify_map(void *ctx, uint64_t gpa)
{
	struct vm *vm = ctx;
	vm_dev__map_notify(vm->blk_notify, gpa, "virtio-blk");
}

/* On a disk worker: to whoever drives the VM (BLOCK_IO_ERROR, the stop). */
static void vm_blk__on_error(void *ctx, const struct blk_io_error *e)
{
	struct vm *vm = ctx;
	if (vm->on_io_error)
		vm->on_io_error(vm->event_ctx, e);
}

static int vm_blk__open(struct vm *vm, char *err, size_t errlen)
{
	const struct vm_blk_config *bc = &vm->cfg.blkc;
	struct blkfile_conf fc = {
		.path = bc->path, .read_only = bc->read_only, .direct = bc->direct,
		.writethrough = !bc->writeback, .discard_unmap = bc->discard,
		.inactive = vm->cfg.incoming,
	};
	if (!vm->cfg.incoming && blkfile__marked_incomplete(bc->path)) {
		snprintf(err, errlen, "image %s holds a migration that did not complete (its "
			 "marker %s%s is there): start it with --incoming to receive the disk "
			 "again, or remove the marker to use the image as it is", bc->path,
			 bc->path, BLKFILE_INCOMPLETE_SUFFIX);
		return -EINVAL;
	}
	int rc = blkfile__open(&vm->blkfile, &fc, err, errlen);
	if (rc)
		return rc;
	uint32_t align = blkfile__offset_align(vm->blkfile);
	uint32_t lbs = bc->lbs ? bc->lbs : 512;
	if (blkfile__size(vm->blkfile) % lbs || (bc->direct && align > lbs)) {
		snprintf(err, errlen, "image %s: %s", bc->path, blkfile__size(vm->blkfile) % lbs ?
			 "its size is not a multiple of logical_block_size" :
			 "O_DIRECT here needs requests aligned to more than logical_block_size "
			 "(give logical_block_size=4096, or leave cache.direct off)");
		return -EINVAL;
	}
	return 0;
}

int vm_blk__attach(struct vm *vm, char *err, size_t errlen)
{
	const struct vm_blk_config *bc = &vm->cfg.blkc;
	vm->blk_notify = calloc(1, sizeof(*vm->blk_notify));
	if (!vm->blk_notify)
		return -ENOMEM;
	int rc = ioevent__init(vm->blk_notify, vm->vm_fd, 1, 2, vm_blk__notified, vm);
	if (rc) {
		snprintf(err, errlen, "virtio-blk: cannot create its eventfd: %s", strerror(-rc));
		return rc;
	}
	rc = vm_blk__open(vm, err, errlen);
	if (rc)
		return rc;
	struct blk_conf c = {
		.ram = &vm->ram, .mark = vm_dev__mark, .mark_ctx = vm, .irq = vm_blk__irq,
		.irq_ctx = vm, .irq_line = BLK_IRQ, .bar_gpa = BLK_BAR_GPA, .file = vm->blkfile,
		.logical_block_size = bc->lbs ? bc->lbs : 512, .writeback = bc->writeback,
		.discard = bc->discard, .werror = (enum blk_on_error)bc->werror,
		.rerror = (enum blk_on_error)bc->rerror, .on_error = vm_blk__on_error, .error_ctx = vm,
	};
	memcpy(c.serial, bc->serial, sizeof(c.serial));
	rc = blk__create(&vm->blk, &c);
	if (!rc)
		rc = pci__add(vm->pci, BLK_PCI_SLOT, blk__pci(vm->blk));
	if (rc) {
		snprintf(err, errlen, "cannot create the virtio-blk device: %s", strerror(-rc));
		return rc;
	}
	virtio_pci__set_notify_map(blk__transport(vm->blk), vm_blk__notify_map, vm);
	return 0;
}

void vm_blk__detach(struct vm *vm)
{
	if (vm->blk_notify) {
		ioevent__destroy(vm->blk_notify);
		free(vm->blk_notify);
		vm->blk_notify = NULL;
	}
	blk__destroy(vm->blk);        /* waits for requests in flight */
	vm->blk = NULL;
	blkfile__close(vm->blkfile);
	vm->blkfile = NULL;
}

int vm_blk__drain(struct vm *vm, uint64_t wait_ns)
{
	return vm->blk ? blk__drain(vm->blk, wait_ns) : 0;
}

int vm_blk__activate(struct vm *vm, char *err, size_t errlen)
{
	return vm->blkfile ? blkfile__activate(vm->blkfile, err, errlen) : 0;
}

bool vm_blk__active(struct vm *vm)
{
	return !vm->blkfile || blkfile__active(vm->blkfile);
}

int vm_blk__inactivate(struct vm *vm)
{
	if (!vm->blkfile)
		return 0;
	int rc = vm_blk__drain(vm, 0);
	return rc ? rc : blkfile__inactivate(vm->blkfile);
}

void vm_blk__restart(struct vm *vm)
{
	if (vm->blk && blk__restart(vm->blk))
		ioevent__signal(vm->blk_notify, 0);
}

unsigned vm_blk__kept(struct vm *vm)
{
	return vm->blk ? blk__kept(vm->blk) : 0;
}
