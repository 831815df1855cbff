/* The guest TSC across a migration.
 *
 * The source sends the highest of its vCPUs' TSCs together with the
 * CLOCK_REALTIME instant it was read at (STATE_VM_TSC, before any vCPU
 * section).  The destination
 * sets every vCPU's TSC to that value plus the wall-clock time since, so
 * the guest's clock goes on where it was and counts the switchover, as a
 * real clock would (the two hosts' wall clocks are assumed synchronised).
 *
 * Why not just KVM_SET_MSRS(IA32_TSC) with the saved value: KVM treats a
 * host-side TSC write that lands within one second of what it expects from
 * its last write (on a new VM: 0 at vCPU creation, plus the time since) as
 * an attempt to synchronise vCPUs, and keeps or extrapolates its own
 * offset instead of taking the value.  A destination created about when
 * the source was then gets the wrong TSC; on an unstable host TSC KVM even
 * adds the destination's age to it, so the guest's clock jumps forward by
 * that much.  So:
 *   - with KVM_VCPU_TSC_OFFSET (a vCPU attribute, Linux 5.16+), the offset
 *     is computed once and set on every vCPU: exact, and all vCPUs match;
 *   - otherwise the MSR is first written far away (2^62 beyond the target)
 *     so that the real write cannot fall in KVM's one-second window. */
#include <errno.h>
#include <linux/kvm.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>

#include "kvm/vcpu.h"
#include "kvm/vm.h"
#include "state/state_impl.h"

#define TSC_FAR (1ull << 62)
#define MAX_KHZ 100000000u           /* 100 GHz: anything above is corrupt */

static uint64_t realtime_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int msr_tsc_get(struct vcpu *v, uint64_t *tsc)
{
	struct { struct kvm_msrs m; struct kvm_msr_entry e; } one = {
		.m.nmsrs = 1, .e.index = STATE_MSR_TSC };
	if (ioctl(v->fd, KVM_GET_MSRS, &one) != 1)
		return -EIO;
	*tsc = one.e.data;
	return 0;
}

static int msr_tsc_set(struct vcpu *v, uint64_t tsc)
{
	struct { struct kvm_msrs m; struct kvm_msr_entry e; } one = {
		.m.nmsrs = 1, .e.index = STATE_MSR_TSC, .e.data = tsc };
	return ioctl(v->fd, KVM_SET_MSRS, &one) == 1 ? 0 : -EIO;
}

int state__save_tsc(struct vm *vm, state_put_fn put, void *ctx)
{
	struct state_tsc s = { .khz = vm->tsc_khz };
	/* the highest vCPU TSC: KVM may have let the vCPUs' TSCs drift apart
	 * (an unstable host TSC), and every vCPU goes on from this one value,
	 * so none may be ahead of it or its clock would go back; its instant
	 * is the middle of the two around its reading */
	for (unsigned i = 0; i < vm->nr_vcpus; i++) {
		uint64_t tsc, t0 = realtime_ns();
		int rc = msr_tsc_get(&vm->vcpus[i], &tsc);
		if (rc) {
			log_err("state save: cannot read vCPU %u's TSC", i);
			return rc;
		}
		uint64_t t1 = realtime_ns();
		if (i == 0 || tsc > s.tsc) {
			s.tsc = tsc;
			s.realtime_ns = t0 + (t1 - t0) / 2;
		}
	}
	return put(ctx, STATE_VM_TSC, STATE_VERSION, 0, &s, sizeof(s));
}

int state__load_tsc(struct vm *vm, const void *data, size_t len, char *why, size_t whylen)
{
	struct state_tsc s;
	if (len != sizeof(s)) {
		snprintf(why, whylen, "TSC section has %zu bytes, expected %zu", len, sizeof(s));
		return -EINVAL;
	}
	memcpy(&s, data, sizeof(s));
	if (!s.khz || s.khz > MAX_KHZ || s.reserved) {
		snprintf(why, whylen, "TSC section is malformed (%u kHz)", s.khz);
		return -EINVAL;
	}
	if (vm->tsc_khz && s.khz != vm->tsc_khz)
		log_warn("incoming: the guest TSC ran at %u kHz on the source and runs at %u kHz"
			 " here", s.khz, vm->tsc_khz);
	vm->tsc_in = (struct vm_tsc_in){ .valid = true, .tsc = s.tsc,
					 .realtime_ns = s.realtime_ns, .khz = s.khz };
	return 0;
}

/* The source's TSC extrapolated to the wall-clock instant now_ns. */
static uint64_t tsc_at(const struct vm_tsc_in *t, uint64_t now_ns)
{
	uint64_t el = now_ns > t->realtime_ns ? now_ns - t->realtime_ns : 0;
	return t->tsc + (el / 1000000u) * t->khz + (el % 1000000u) * t->khz / 1000000u;
}

/* 0 and the vCPU's TSC offset set, or -ENOTSUP when KVM lacks the attribute. */
static int tsc_by_offset(struct vm *vm, struct vcpu *v)
{
	int64_t off = 0;
	struct kvm_device_attr a = { .group = KVM_VCPU_TSC_CTRL, .attr = KVM_VCPU_TSC_OFFSET,
				     .addr = (uint64_t)(uintptr_t)&off };
	if (ioctl(v->fd, KVM_HAS_DEVICE_ATTR, &a) < 0)
		return -ENOTSUP;
	struct vm_tsc_in *t = &vm->tsc_in;
	if (!t->offset_known) {
		uint64_t cur, t0 = realtime_ns();
		if (ioctl(v->fd, KVM_GET_DEVICE_ATTR, &a) < 0 || msr_tsc_get(v, &cur))
			return -errno ? -errno : -EIO;
		uint64_t t1 = realtime_ns();
		uint64_t want = tsc_at(t, t0 + (t1 - t0) / 2);
		t->offset = off + (int64_t)(want - cur);
		t->offset_known = true;
		log_info("incoming: guest TSC goes on from the source's, %.1f ms later",
			 (double)(want - t->tsc) / t->khz);
	}
	off = t->offset;
	return ioctl(v->fd, KVM_SET_DEVICE_ATTR, &a) < 0 ? -errno : 0;
}

int state__restore_tsc(struct vm *vm, struct vcpu *v, char *why, size_t whylen)
{
	int rc = tsc_by_offset(vm, v);
	if (rc != -ENOTSUP) {
		if (rc)
			snprintf(why, whylen, "vCPU %u: KVM refused the TSC offset: %s", v->index,
				 strerror(-rc));
		return rc;
	}
	uint64_t want = tsc_at(&vm->tsc_in, realtime_ns());
	rc = msr_tsc_set(v, want + TSC_FAR);
	if (!rc)
		rc = msr_tsc_set(v, tsc_at(&vm->tsc_in, realtime_ns()));
	if (rc)
		snprintf(why, whylen, "vCPU %u: KVM refused the TSC", v->index);
	else if (v->index == 0)
		log_info("incoming: guest TSC goes on from the source's, %.1f ms later",
			 (double)(want - vm->tsc_in.tsc) / vm->tsc_in.khz);
	return rc;
}

/* KVM's own instant when it gives one (KVM_CLOCK_REALTIME: the same
 * CLOCK_REALTIME base), else the middle of ours around the reading. */
int state__save_clock(struct vm *vm, state_put_fn put, void *ctx)
{
	struct kvm_clock_data clk;
	memset(&clk, 0, sizeof(clk));
	uint64_t t0 = realtime_ns();
	if (ioctl(vm->vm_fd, KVM_GET_CLOCK, &clk) < 0) {
		int e = errno;
		log_err("state save: kvm-clock: %s", strerror(e));
		return -e;
	}
	uint64_t t1 = realtime_ns();
	if (!(clk.flags & KVM_CLOCK_REALTIME))
		clk.realtime = t0 + (t1 - t0) / 2;
	clk.flags = KVM_CLOCK_REALTIME;
	clk.host_tsc = 0;
	return put(ctx, STATE_VM_CLOCK, STATE_VERSION, 0, &clk, sizeof(clk));
}

int state__load_clock(struct vm *vm, void *buf, char *why, size_t whylen)
{
	struct kvm_clock_data *clk = buf;
	uint64_t now = realtime_ns();
	/* a section without an instant (flags 0) is taken as it is */
	if ((clk->flags & KVM_CLOCK_REALTIME) && clk->realtime && now > clk->realtime)
		clk->clock += now - clk->realtime;
	clk->flags = 0;
	clk->realtime = clk->host_tsc = 0;
	if (ioctl(vm->vm_fd, KVM_SET_CLOCK, clk) < 0) {
		int e = errno;
		snprintf(why, whylen, "KVM refused clock state: %s", strerror(e));
		return -EINVAL;
	}
	return 0;
}
