/* vCPU state that needs more than one ioctl: XSAVE/FPU and MSRs. */
#include <errno.h>
#include <linux/kvm.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include "kvm/vcpu.h"
#include "kvm/vm.h"
#include "state/state_impl.h"

bool state__has(struct vm *vm, int cap)
{
	return ioctl(vm->vm_fd, KVM_CHECK_EXTENSION, cap) > 0;
}

int state__save_xsave(struct vm *vm, struct vcpu *v, state_put_fn put, void *ctx)
{
	int size = ioctl(vm->vm_fd, KVM_CHECK_EXTENSION, KVM_CAP_XSAVE2);
	if (size < (int)sizeof(struct kvm_xsave))
		size = sizeof(struct kvm_xsave);
	if (!state__has(vm, KVM_CAP_XSAVE)) {
		struct kvm_fpu fpu;
		if (ioctl(v->fd, KVM_GET_FPU, &fpu) < 0)
			return -errno;
		return put(ctx, STATE_VCPU_FPU, STATE_VERSION, v->index, &fpu, sizeof(fpu));
	}
	void *buf = calloc(1, size);
	if (!buf)
		return -ENOMEM;
	unsigned long req = size > (int)sizeof(struct kvm_xsave) ? KVM_GET_XSAVE2 : KVM_GET_XSAVE;
	int rc = ioctl(v->fd, req, buf) < 0 ? -errno : 0;
	if (!rc)
		rc = put(ctx, STATE_VCPU_XSAVE, STATE_VERSION, v->index, buf, size);
	free(buf);
	return rc;
}

/* The MSRs KVM lists as saveable and that this vCPU can read. */
static int state__msr_list(struct vm *vm, struct vcpu *v, struct kvm_msrs *out)
{
	struct { struct kvm_msr_list l; uint32_t idx[1024]; } list = { .l.nmsrs = 1024 };
	if (ioctl(vm->kvm_fd, KVM_GET_MSR_INDEX_LIST, &list) < 0)
		return -errno;
	out->nmsrs = 0;
	for (uint32_t i = 0; i < list.l.nmsrs && out->nmsrs < STATE_MAX_MSRS; i++) {
		struct { struct kvm_msrs m; struct kvm_msr_entry e; } one = {
			.m.nmsrs = 1, .e.index = list.l.indices[i] };
		if (ioctl(v->fd, KVM_GET_MSRS, &one) == 1)
			out->entries[out->nmsrs++] = one.e;
	}
	return 0;
}

int state__save_msrs(struct vm *vm, struct vcpu *v, state_put_fn put, void *ctx)
{
	size_t sz = sizeof(struct kvm_msrs) + STATE_MAX_MSRS * sizeof(struct kvm_msr_entry);
	struct kvm_msrs *m = calloc(1, sz);
	if (!m)
		return -ENOMEM;
	int rc = state__msr_list(vm, v, m);
	if (!rc) {
		size_t len = m->nmsrs * sizeof(struct kvm_msr_entry);
		rc = put(ctx, STATE_VCPU_MSRS, STATE_VERSION, v->index, m->entries, len);
	}
	free(m);
	return rc;
}

/* Whether MSR index is left out of the load: MSR_IA32_TSC when the TSC
 * section sets it; kvm-clock's wall clock MSRs always, since KVM writes
 * the wall clock into guest RAM on each write of one, also from the host:
 * restored, they would change a page the source sent as it was (the guest
 * reads the wall clock at boot only, writing the MSR itself then). */
static bool state__msr_skipped(uint32_t index, bool tsc)
{
	return (tsc && index == STATE_MSR_TSC) || index == STATE_MSR_KVM_WALL_CLOCK ||
	       index == STATE_MSR_KVM_WALL_CLOCK_NEW;
}

/* Drops the MSRs state__msr_skipped names from m; returns the count left. */
static uint32_t state__msrs_to_load(struct kvm_msrs *m, bool tsc)
{
	uint32_t k = 0;
	for (uint32_t i = 0; i < m->nmsrs; i++)
		if (!state__msr_skipped(m->entries[i].index, tsc))
			m->entries[k++] = m->entries[i];
	return k;
}

int state__load_msrs(struct vm *vm, struct vcpu *v, const void *data, size_t len,
		     char *why, size_t whylen)
{
	if (len % sizeof(struct kvm_msr_entry) || len / sizeof(struct kvm_msr_entry) > STATE_MAX_MSRS) {
		snprintf(why, whylen, "MSR section of %zu bytes is malformed", len);
		return -EINVAL;
	}
	uint32_t n = len / sizeof(struct kvm_msr_entry);
	struct kvm_msrs *m = calloc(1, sizeof(*m) + len);
	if (!m)
		return -ENOMEM;
	m->nmsrs = n;
	memcpy(m->entries, data, len);
	if (vm->tsc_in.valid) {
		/* the TSC first: the TSC deadline among the rest is relative to it */
		int rc = state__restore_tsc(vm, v, why, whylen);
		if (rc) {
			free(m);
			return rc;
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		if (m->entries[i].index == STATE_MSR_TSC_DEADLINE) {
			v->tsc_deadline_in = m->entries[i].data;
			v->tsc_deadline_in_set = true;
		}
	}
	m->nmsrs = n = state__msrs_to_load(m, vm->tsc_in.valid);
	int done = n ? ioctl(v->fd, KVM_SET_MSRS, m) : 0;
	/* Set the rest one by one so one refused MSR does not drop the others. */
	for (uint32_t i = done < 0 ? 0 : (uint32_t)done; i < n; i++) {
		struct { struct kvm_msrs m; struct kvm_msr_entry e; } one = {
			.m.nmsrs = 1, .e = m->entries[i] };
		if (ioctl(v->fd, KVM_SET_MSRS, &one) != 1)
			log_warn("vcpu%u: MSR 0x%x not restored", v->index, m->entries[i].index);
	}
	free(m);
	return 0;
}

int state__rearm_tsc_deadline(struct vcpu *v, char *why, size_t whylen)
{
	if (!v->tsc_deadline_in_set)
		return 0;
	struct { struct kvm_msrs m; struct kvm_msr_entry e; } one = {
		.m.nmsrs = 1, .e.index = STATE_MSR_TSC_DEADLINE, .e.data = v->tsc_deadline_in };
	if (ioctl(v->fd, KVM_SET_MSRS, &one) != 1) {
		snprintf(why, whylen, "vCPU %u: KVM refused the TSC deadline", v->index);
		return -EIO;
	}
	return 0;
}
