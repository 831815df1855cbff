/* Save and restore of everything a guest needs besides RAM: per vCPU
 * registers, special registers, XSAVE (or FPU), XCRs, debug registers,
 * MSRs (KVM's saveable list), LAPIC, MP state and pending events;
 * VM-wide PIC/IOAPIC, PIT and KVM clock; devices (serial); the guest TSC
 * with the wall-clock time it was read at, so the destination's TSC goes on
 * from where the source's was plus the time the switchover took.
 *
 * Each section is (id, version, instance, bytes); instance is the vCPU
 * index for vCPU sections, 0 otherwise.  Sections are produced in the order
 * they must be applied.  The VM must be paused around both calls; the
 * calls come from one thread (the migration thread). */
#ifndef KMIG_STATE_STATE_H
#define KMIG_STATE_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "base/log.h"

struct vm;

enum state_section {
	STATE_VCPU_SREGS = 1,
	STATE_VCPU_REGS = 2,
	STATE_VCPU_XSAVE = 3,
	STATE_VCPU_FPU = 4,
	STATE_VCPU_XCRS = 5,
	STATE_VCPU_MSRS = 6,
	STATE_VCPU_LAPIC = 7,
	STATE_VCPU_MP_STATE = 8,
	STATE_VCPU_EVENTS = 9,
	STATE_VCPU_DEBUGREGS = 10,
	STATE_VM_IRQCHIP = 20,
	STATE_VM_PIT = 21,
	STATE_VM_CLOCK = 22,
	STATE_VM_RUNSTATE = 23,     /* 1 byte: 1 the guest was running at switchover,
				     * 0 stopped, 2 never ran (prelaunch) */
	STATE_VM_TSC = 24,          /* the guest TSC and the wall clock at one instant */
	STATE_DEV_SERIAL = 30,
	STATE_DEV_VIRTIO = 31,
	STATE_DEV_RTC = 32,
	STATE_DEV_NET = 33,
	STATE_DEV_BLK = 34,
};
#define STATE_VERSION 1

typedef int (*state_put_fn)(void *ctx, uint32_t id, uint32_t version,
			    uint32_t instance, const void *data, size_t len);

/* Produces every section through put; stops at the first error. */
int state__save(struct vm *vm, state_put_fn put, void *ctx) KMIG_MUST_CHECK;
/* Applies one section; -EINVAL for an unknown id/version, a wrong size or
 * an instance out of range, -errno if KVM refuses it.  why gets a reason. */
int state__load(struct vm *vm, uint32_t id, uint32_t version, uint32_t instance,
		const void *data, size_t len, char *why, size_t whylen) KMIG_MUST_CHECK;
/* A section's slot: (id << 32 | instance), with FPU and XSAVE one slot
 * (a vCPU's FPU state comes as either, by what the source's KVM has). */
uint64_t state__slot(uint32_t id, uint32_t instance);
/* Fills slots[0..n) with the slot of every section state__save produces
 * for this VM and returns n, or -ENOSPC when more than cap. */
int state__expected_slots(struct vm *vm, uint64_t *slots, unsigned cap);
/* A section's name ("lapic", "virtio-balloon", ...; "unknown"). */
const char *state__name(uint32_t id);
/* Why a section that is not among the expected slots cannot be loaded. */
void state__why_unexpected(struct vm *vm, uint32_t id, uint32_t instance, char *why,
			   size_t whylen);

#endif
