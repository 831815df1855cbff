/* Applying state sections on the destination. */
#include <errno.h>
#include <linux/kvm.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>

#include "dev/balloon.h"
#include "dev/blk.h"
#include "dev/net.h"
#include "kvm/vcpu.h"
#include "kvm/vm.h"
#include "state/state_impl.h"

struct state_vcpu_op {
	uint32_t id;
	unsigned long req;
	size_t len;                  /* 0: variable (checked by the loader) */
	const char *name;
};

static const struct state_vcpu_op state_vcpu_ops[] = {
	{ STATE_VCPU_SREGS, KVM_SET_SREGS, sizeof(struct kvm_sregs), "sregs" },
	{ STATE_VCPU_REGS, KVM_SET_REGS, sizeof(struct kvm_regs), "regs" },
	{ STATE_VCPU_FPU, KVM_SET_FPU, sizeof(struct kvm_fpu), "fpu" },
	{ STATE_VCPU_XSAVE, KVM_SET_XSAVE, 0, "xsave" },
	{ STATE_VCPU_XCRS, KVM_SET_XCRS, sizeof(struct kvm_xcrs), "xcrs" },
	{ STATE_VCPU_LAPIC, KVM_SET_LAPIC, sizeof(struct kvm_lapic_state), "lapic" },
	{ STATE_VCPU_MP_STATE, KVM_SET_MP_STATE, sizeof(struct kvm_mp_state), "mp_state" },
	{ STATE_VCPU_EVENTS, KVM_SET_VCPU_EVENTS, sizeof(struct kvm_vcpu_events), "events" },
	{ STATE_VCPU_DEBUGREGS, KVM_SET_DEBUGREGS, sizeof(struct kvm_debugregs), "debugregs" },
};

static int state__load_vcpu(struct vm *vm, uint32_t id, uint32_t inst, const void *data,
			    size_t len, char *why, size_t whylen)
{
	if (inst >= vm->nr_vcpus) {
		snprintf(why, whylen, "state section %u for vCPU %u, but this VM has %u",
			 id, inst, vm->nr_vcpus);
		return -EINVAL;
	}
	struct vcpu *v = &vm->vcpus[inst];
	if (id == STATE_VCPU_MSRS)
		return state__load_msrs(vm, v, data, len, why, whylen);
	for (unsigned i = 0; i < sizeof(state_vcpu_ops) / sizeof(state_vcpu_ops[0]); i++) {
		const struct state_vcpu_op *op = &state_vcpu_ops[i];
		if (op->id != id)
			continue;
		size_t want = op->len;
		if (!want) { /* xsave: at least the legacy size, at most 64 KiB */
			want = len >= sizeof(struct kvm_xsave) && len <= 65536 ? len : 0;
		}
		if (len != want) {
			snprintf(why, whylen, "vCPU %u %s state has %zu bytes, expected %zu",
				 inst, op->name, len, op->len);
			return -EINVAL;
		}
		uint8_t buf[65536] __attribute__((aligned(64)));
		memset(buf, 0, sizeof(buf)); /* KVM may read more than a short section */
		memcpy(buf, data, len); /* the stream buffer may be unaligned */
		if (ioctl(v->fd, op->req, buf) < 0) {
			int e = errno;
			snprintf(why, whylen, "vCPU %u: KVM refused %s state: %s", inst, op->name, strerror(e));
			return -e;
		}
		return id == STATE_VCPU_LAPIC ? state__rearm_tsc_deadline(v, why, whylen) : 0;
	}
	snprintf(why, whylen, "unknown state section %u", id);
	return -EINVAL;
}

static int state__load_vm(struct vm *vm, uint32_t id, const void *data, size_t len,
			  char *why, size_t whylen)
{
	uint8_t buf[4096] __attribute__((aligned(16)));
	const char *what = NULL;
	size_t want = id == STATE_VM_IRQCHIP ? 3 * sizeof(struct kvm_irqchip) :
		      id == STATE_VM_PIT ? sizeof(struct kvm_pit_state2) :
		      id == STATE_VM_CLOCK ? sizeof(struct kvm_clock_data) :
		      id == STATE_DEV_RTC ? RTC_STATE_SIZE : SERIAL_STATE_SIZE;
	if (len != want || len > sizeof(buf)) {
		snprintf(why, whylen, "state section %u has %zu bytes, expected %zu", id, len, want);
		return -EINVAL;
	}
	memcpy(buf, data, len);
	if (id == STATE_DEV_SERIAL)
		return serial__load(&vm->serial, buf, len) ? (snprintf(why, whylen, "bad serial state"), -EINVAL) : 0;
	if (id == STATE_DEV_RTC)
		return rtc__load(&vm->rtc, buf, len) ? (snprintf(why, whylen, "bad RTC state"), -EINVAL) : 0;
	if (id == STATE_VM_IRQCHIP) {
		struct kvm_irqchip *c = (void *)buf;
		for (unsigned i = 0; i < 3 && !what; i++)
			if (c[i].chip_id != i || ioctl(vm->vm_fd, KVM_SET_IRQCHIP, &c[i]) < 0)
				what = "irqchip";
	} else if (id == STATE_VM_PIT) {
		if (ioctl(vm->vm_fd, KVM_SET_PIT2, buf) < 0)
			what = "PIT";
	} else {
		return state__load_clock(vm, buf, why, whylen);
	}
	if (what) {
		int e = errno;
		snprintf(why, whylen, "KVM refused %s state: %s", what, strerror(e));
		return -EINVAL;
	}
	return 0;
}

int state__load(struct vm *vm, uint32_t id, uint32_t version, uint32_t instance,
		const void *data, size_t len, char *why, size_t whylen)
{
	/* virtio-blk's section has a version 2 (requests kept after an I/O error) */
	bool blk_version = id == STATE_DEV_BLK && version == BLK_STATE_VERSION_KEPT;
	if (version != STATE_VERSION && !blk_version) {
		snprintf(why, whylen, "state section %u has version %u, this kmig knows %u",
			 id, version, STATE_VERSION);
		return -EINVAL;
	}
	if (id == STATE_VM_RUNSTATE) {
		if (instance || len != 1 || *(const uint8_t *)data > 2) {
			snprintf(why, whylen, "malformed run-state section");
			return -EINVAL;
		}
		vm->run_after_migration = *(const uint8_t *)data == 1;
		vm->never_ran = *(const uint8_t *)data == 2;
		return 0;
	}
	if (id == STATE_VM_TSC) {
		if (instance) {
			snprintf(why, whylen, "TSC section with instance %u", instance);
			return -EINVAL;
		}
		return state__load_tsc(vm, data, len, why, whylen);
	}
	if (id == STATE_DEV_VIRTIO) {
		if (!vm->balloon || instance) {
			snprintf(why, whylen, "virtio-balloon state, but this VM has no --balloon");
			return -EINVAL;
		}
		return balloon__load(vm->balloon, data, len, why, whylen);
	}
	if (id == STATE_DEV_NET) {
		if (!vm->net || instance) {
			snprintf(why, whylen, "virtio-net state, but this VM has no virtio-net-pci device");
			return -EINVAL;
		}
		return net__load(vm->net, data, len, why, whylen);
	}
	if (id == STATE_DEV_BLK) {
		if (!vm->blk || instance) {
			snprintf(why, whylen, "virtio-blk state, but this VM has no virtio-blk-pci device");
			return -EINVAL;
		}
		return blk__load(vm->blk, version, data, len, why, whylen);
	}
	bool vm_wide = (id >= STATE_VM_IRQCHIP && id <= STATE_VM_CLOCK) || id == STATE_DEV_SERIAL ||
		       id == STATE_DEV_RTC;
	if (vm_wide) {
		if (instance != 0) {
			snprintf(why, whylen, "state section %u with instance %u", id, instance);
			return -EINVAL;
		}
		return state__load_vm(vm, id, data, len, why, whylen);
	}
	return state__load_vcpu(vm, id, instance, data, len, why, whylen);
}
