#include "state/state.h"

#include <errno.h>
#include <linux/kvm.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include "dev/balloon.h"
#include "dev/blk.h"
#include "dev/net.h"
#include "kvm/vcpu.h"
#include "kvm/vm.h"
#include "state/state_impl.h"

static int state__put_ioctl(int fd, unsigned long req, void *buf, size_t len,
			    state_put_fn put, void *ctx, uint32_t id, uint32_t inst)
{
	memset(buf, 0, len);
	if (ioctl(fd, req, buf) < 0) {
		int e = errno;
		log_err("state save: section %u instance %u: %s", id, inst, strerror(e));
		return -e;
	}
	return put(ctx, id, STATE_VERSION, inst, buf, len);
}

static int state__save_vcpu(struct vm *vm, struct vcpu *v, state_put_fn put, void *ctx)
{
	union {
		struct kvm_sregs sregs;
		struct kvm_regs regs;
		struct kvm_fpu fpu;
		struct kvm_xcrs xcrs;
		struct kvm_lapic_state lapic;
		struct kvm_mp_state mp;
		struct kvm_vcpu_events ev;
		struct kvm_debugregs dbg;
	} u;
	unsigned i = v->index;
	int fd = v->fd;
	int rc = state__put_ioctl(fd, KVM_GET_SREGS, &u, sizeof(u.sregs), put, ctx, STATE_VCPU_SREGS, i);
	if (!rc)
		rc = state__put_ioctl(fd, KVM_GET_REGS, &u, sizeof(u.regs), put, ctx, STATE_VCPU_REGS, i);
	if (!rc)
		rc = state__save_xsave(vm, v, put, ctx);
	if (!rc && state__has(vm, KVM_CAP_XCRS))
		rc = state__put_ioctl(fd, KVM_GET_XCRS, &u, sizeof(u.xcrs), put, ctx, STATE_VCPU_XCRS, i);
	if (!rc)
		rc = state__save_msrs(vm, v, put, ctx);
	if (!rc)
		rc = state__put_ioctl(fd, KVM_GET_LAPIC, &u, sizeof(u.lapic), put, ctx, STATE_VCPU_LAPIC, i);
	if (!rc)
		rc = state__put_ioctl(fd, KVM_GET_MP_STATE, &u, sizeof(u.mp), put, ctx, STATE_VCPU_MP_STATE, i);
	if (!rc)
		rc = state__put_ioctl(fd, KVM_GET_VCPU_EVENTS, &u, sizeof(u.ev), put, ctx, STATE_VCPU_EVENTS, i);
	if (!rc && state__has(vm, KVM_CAP_DEBUGREGS))
		rc = state__put_ioctl(fd, KVM_GET_DEBUGREGS, &u, sizeof(u.dbg), put, ctx, STATE_VCPU_DEBUGREGS, i);
	return rc;
}

static int state__save_vm(struct vm *vm, state_put_fn put, void *ctx)
{
	struct kvm_irqchip chips[3];
	for (unsigned i = 0; i < 3; i++) {
		memset(&chips[i], 0, sizeof(chips[i]));
		chips[i].chip_id = i;
		if (ioctl(vm->vm_fd, KVM_GET_IRQCHIP, &chips[i]) < 0)
			return -errno;
	}
	int rc = put(ctx, STATE_VM_IRQCHIP, STATE_VERSION, 0, chips, sizeof(chips));
	struct kvm_pit_state2 pit;
	if (!rc)
		rc = state__put_ioctl(vm->vm_fd, KVM_GET_PIT2, &pit, sizeof(pit), put, ctx, STATE_VM_PIT, 0);
	uint8_t ser[SERIAL_STATE_SIZE];
	serial__save(&vm->serial, ser);
	if (!rc)
		rc = put(ctx, STATE_DEV_SERIAL, STATE_VERSION, 0, ser, sizeof(ser));
	uint8_t rtc[RTC_STATE_SIZE];
	rtc__save(&vm->rtc, rtc);
	if (!rc)
		rc = put(ctx, STATE_DEV_RTC, STATE_VERSION, 0, rtc, sizeof(rtc));
	if (!rc && vm->balloon)
		rc = balloon__save(vm->balloon, put, ctx);
	if (!rc && vm->net)
		rc = net__save(vm->net, put, ctx);
	if (!rc && vm->blk)
		rc = blk__save(vm->blk, put, ctx);
	return rc;
}

int state__save(struct vm *vm, state_put_fn put, void *ctx)
{
	/* first: the destination needs it before the vCPUs' MSRs */
	int rc = state__save_tsc(vm, put, ctx);
	if (!rc)
		rc = state__save_vm(vm, put, ctx);
	for (unsigned i = 0; !rc && i < vm->nr_vcpus; i++)
		rc = state__save_vcpu(vm, &vm->vcpus[i], put, ctx);
	if (!rc)
		rc = state__save_clock(vm, put, ctx);
	/* 1 running, 0 stopped, 2 prelaunch: never run (design.md) */
	uint8_t running = vm->run_after_migration ? 1 : vm->never_ran ? 2 : 0;
	if (!rc)
		rc = put(ctx, STATE_VM_RUNSTATE, STATE_VERSION, 0, &running, 1);
	return rc;
}

uint64_t state__slot(uint32_t id, uint32_t instance)
{
	if (id == STATE_VCPU_FPU)
		id = STATE_VCPU_XSAVE;
	return (uint64_t)id << 32 | instance;
}

static int state__put_slot(uint64_t *slots, unsigned *n, unsigned cap, uint32_t id,
			   uint32_t instance)
{
	if (*n >= cap)
		return -ENOSPC;
	slots[(*n)++] = state__slot(id, instance);
	return 0;
}

int state__expected_slots(struct vm *vm, uint64_t *slots, unsigned cap)
{
	static const uint32_t vm_ids[] = { STATE_VM_TSC, STATE_VM_IRQCHIP, STATE_VM_PIT,
					   STATE_DEV_SERIAL, STATE_DEV_RTC, STATE_VM_CLOCK,
					   STATE_VM_RUNSTATE };
	static const uint32_t vcpu_ids[] = { STATE_VCPU_SREGS, STATE_VCPU_REGS, STATE_VCPU_XSAVE,
					     STATE_VCPU_MSRS, STATE_VCPU_LAPIC, STATE_VCPU_MP_STATE,
					     STATE_VCPU_EVENTS, STATE_VCPU_XCRS,
					     STATE_VCPU_DEBUGREGS };
	unsigned n = 0;
	int rc = 0;
	for (unsigned k = 0; !rc && k < sizeof(vm_ids) / sizeof(vm_ids[0]); k++)
		rc = state__put_slot(slots, &n, cap, vm_ids[k], 0);
	if (!rc && vm->balloon)
		rc = state__put_slot(slots, &n, cap, STATE_DEV_VIRTIO, 0);
	if (!rc && vm->net)
		rc = state__put_slot(slots, &n, cap, STATE_DEV_NET, 0);
	if (!rc && vm->blk)
		rc = state__put_slot(slots, &n, cap, STATE_DEV_BLK, 0);
	for (unsigned i = 0; !rc && i < vm->nr_vcpus; i++) {
		for (unsigned k = 0; !rc && k < sizeof(vcpu_ids) / sizeof(vcpu_ids[0]); k++) {
			uint32_t id = vcpu_ids[k];
			if ((id == STATE_VCPU_XCRS && !state__has(vm, KVM_CAP_XCRS)) ||
			    (id == STATE_VCPU_DEBUGREGS && !state__has(vm, KVM_CAP_DEBUGREGS)))
				continue;
			rc = state__put_slot(slots, &n, cap, id, i);
		}
	}
	return rc ? rc : (int)n;
}

const char *state__name(uint32_t id)
{
	static const struct { uint32_t id; const char *name; } names[] = {
		{ STATE_VCPU_SREGS, "sregs" }, { STATE_VCPU_REGS, "regs" },
		{ STATE_VCPU_XSAVE, "xsave" }, { STATE_VCPU_FPU, "fpu" },
		{ STATE_VCPU_XCRS, "xcrs" }, { STATE_VCPU_MSRS, "msrs" },
		{ STATE_VCPU_LAPIC, "lapic" }, { STATE_VCPU_MP_STATE, "mp_state" },
		{ STATE_VCPU_EVENTS, "events" }, { STATE_VCPU_DEBUGREGS, "debugregs" },
		{ STATE_VM_IRQCHIP, "irqchip" }, { STATE_VM_PIT, "pit" },
		{ STATE_VM_CLOCK, "clock" }, { STATE_VM_RUNSTATE, "runstate" },
		{ STATE_VM_TSC, "tsc" }, { STATE_DEV_SERIAL, "serial" },
		{ STATE_DEV_VIRTIO, "virtio-balloon" }, { STATE_DEV_RTC, "rtc" },
		{ STATE_DEV_NET, "virtio-net" }, { STATE_DEV_BLK, "virtio-blk" },
	};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (names[i].id == id)
			return names[i].name;
	return "unknown";
}

void state__why_unexpected(struct vm *vm, uint32_t id, uint32_t instance, char *why,
			   size_t whylen)
{
	if (id >= STATE_VCPU_SREGS && id <= STATE_VCPU_DEBUGREGS && instance >= vm->nr_vcpus)
		snprintf(why, whylen, "state section %s (%u) for vCPU %u, but this VM has %u",
			 state__name(id), id, instance, vm->nr_vcpus);
	else if (id == STATE_DEV_VIRTIO && !vm->balloon)
		snprintf(why, whylen, "virtio-balloon state, but this VM has no --balloon");
	else if (id == STATE_DEV_NET && !vm->net)
		snprintf(why, whylen, "virtio-net state, but this VM has no virtio-net-pci device");
	else if (id == STATE_DEV_BLK && !vm->blk)
		snprintf(why, whylen, "virtio-blk state, but this VM has no virtio-blk-pci device");
	else
		snprintf(why, whylen, "unexpected state section %s (%u) instance %u",
			 state__name(id), id, instance);
}
