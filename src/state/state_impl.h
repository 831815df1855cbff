/* Internals of the state module. */
#ifndef KMIG_STATE_STATE_IMPL_H
#define KMIG_STATE_STATE_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "state/state.h"

struct vcpu;

#define STATE_MAX_MSRS 256

bool state__has(struct vm *vm, int cap);
int state__save_xsave(struct vm *vm, struct vcpu *v, state_put_fn put, void *ctx);
int state__save_msrs(struct vm *vm, struct vcpu *v, state_put_fn put, void *ctx);
int state__load_msrs(struct vm *vm, struct vcpu *v, const void *data, size_t len,
		     char *why, size_t whylen);

/* state_tsc.c: the STATE_VM_TSC section (struct state_tsc). */
#define STATE_MSR_TSC 0x10
#define STATE_MSR_KVM_WALL_CLOCK 0x11
#define STATE_MSR_KVM_WALL_CLOCK_NEW 0x4b564d00
/* IA32_TSC_DEADLINE: KVM drops a write unless the local APIC's timer is
 * already in TSC-deadline mode, so the loader writes it again after the
 * vCPU's LAPIC section (state__rearm_tsc_deadline) */
#define STATE_MSR_TSC_DEADLINE 0x6e0
struct state_tsc {
	uint64_t tsc;                /* guest TSC of vCPU 0 ... */
	uint64_t realtime_ns;        /* ... read at this CLOCK_REALTIME instant */
	uint32_t khz;                /* guest TSC frequency */
	uint32_t reserved;           /* 0 */
};
int state__save_tsc(struct vm *vm, state_put_fn put, void *ctx);
int state__load_tsc(struct vm *vm, const void *data, size_t len, char *why, size_t whylen);
/* Sets vCPU v's TSC to the value the source's sample gives for now. */
int state__restore_tsc(struct vm *vm, struct vcpu *v, char *why, size_t whylen);
/* Writes the TSC deadline the vCPU's MSR section carried (if any) again,
 * after its LAPIC section: a deadline armed on the source fires here. */
int state__rearm_tsc_deadline(struct vcpu *v, char *why, size_t whylen);
/* kvm-clock (STATE_VM_CLOCK): saved with the CLOCK_REALTIME instant of
 * its reading; loaded plus the wall-clock time since, as the TSC is, so
 * the two keep pace with each other across the switchover (a guest's
 * clocksource watchdog compares them).  Load: 0 or -EINVAL, why set. */
int state__save_clock(struct vm *vm, state_put_fn put, void *ctx);
int state__load_clock(struct vm *vm, void *buf, char *why, size_t whylen);

#endif
