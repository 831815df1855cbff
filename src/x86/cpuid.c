#include "x86/cpuid.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#define CPUID_MAX_ENTRIES 256

int cpuid__supported(int kvm_fd, struct kvm_cpuid2 **out)
{
	size_t sz = sizeof(struct kvm_cpuid2) + CPUID_MAX_ENTRIES * sizeof(struct kvm_cpuid_entry2);
	struct kvm_cpuid2 *c = calloc(1, sz);
	if (!c)
		return -ENOMEM;
	c->nent = CPUID_MAX_ENTRIES;
	if (ioctl(kvm_fd, KVM_GET_SUPPORTED_CPUID, c) < 0) {
		int e = errno;
		free(c);
		return -e;
	}
	*out = c;
	return 0;
}

static struct kvm_cpuid_entry2 *cpuid__find(struct kvm_cpuid2 *c, uint32_t fn, uint32_t idx)
{
	for (uint32_t i = 0; i < c->nent; i++)
		if (c->entries[i].function == fn && c->entries[i].index == idx)
			return &c->entries[i];
	return NULL;
}

static struct kvm_cpuid_entry2 *cpuid__get(struct kvm_cpuid2 *c, uint32_t fn, uint32_t idx)
{
	struct kvm_cpuid_entry2 *e = cpuid__find(c, fn, idx);
	if (e || c->nent >= CPUID_MAX_ENTRIES)
		return e;
	e = &c->entries[c->nent++];
	memset(e, 0, sizeof(*e));
	e->function = fn;
	e->index = idx;
	return e;
}

static void cpuid__topology(struct kvm_cpuid2 *c, unsigned index, unsigned ncpus)
{
	unsigned shift = 0;
	while ((1u << shift) < ncpus)
		shift++;
	for (uint32_t i = 0; i < c->nent; i++) {
		struct kvm_cpuid_entry2 *e = &c->entries[i];
		switch (e->function) {
		case 1:
			e->ebx = (e->ebx & 0x0000ffff) | (index << 24) | ((ncpus & 0xff) << 16);
			e->edx |= 1u << 28; /* HTT: the count in EBX[23:16] is valid */
			break;
		case 4:
			e->eax &= 0x3ff;
			e->eax |= ((1u << shift) - 1) << 26;
			break;
		case 0xb:
		case 0x1f:
			e->edx = index;
			if (e->index == 0) {
				e->eax = 0;
				e->ebx = 1;
				e->ecx = (1u << 8) | 0;
			} else if (e->index == 1) {
				e->eax = shift;
				e->ebx = ncpus;
				e->ecx = (2u << 8) | 1;
			} else {
				e->eax = e->ebx = 0;
				e->ecx = e->index;
			}
			break;
		default:
			break;
		}
	}
}

static void cpuid__timing(struct kvm_cpuid2 *c, uint32_t tsc_khz)
{
	struct kvm_cpuid_entry2 *e = cpuid__get(c, 0x40000000, 0);
	if (e) {
		e->eax = 0x40000010;
		memcpy(&e->ebx, "KVMK", 4);
		memcpy(&e->ecx, "VMKV", 4);
		memcpy(&e->edx, "M\0\0\0", 4);
	}
	/* of KVM's paravirtual features only the clock: kvm-clock
	 * (CLOCKSOURCE, CLOCKSOURCE2, its stable bit) and no port-0x80 delay.
	 * The others change how vCPUs wait and signal each other (PV_UNHALT:
	 * a spinlock waiter halts with interrupts off until a hypercall wakes
	 * it, which the control loop would take for a guest that has ended;
	 * with them Linux's SMP bring-up stalled here) and carry state kmig
	 * does not migrate (steal time, async page faults, PV EOI). */
	e = cpuid__find(c, 0x40000001, 0);
	if (e) {
		e->eax &= 1u << 0 | 1u << 1 | 1u << 3 | 1u << 24;
		e->edx = 0;
	}
	e = cpuid__get(c, 0x40000010, 0);
	if (e) {
		e->eax = tsc_khz;
		e->ebx = 1000000; /* the in-kernel LAPIC timer ticks at 1 GHz */
		e->ecx = e->edx = 0;
	}
	struct kvm_cpuid_entry2 *base = cpuid__find(c, 0, 0);
	if (base && base->eax >= 0x15 && tsc_khz) {
		e = cpuid__get(c, 0x15, 0);
		if (e) {
			e->eax = 1;
			e->ebx = 1;
			e->ecx = tsc_khz * 1000u;
			e->edx = 0;
		}
	}
}

static void cpuid__bit(uint32_t *reg, unsigned bit, bool on)
{
	if (on)
		*reg |= 1u << bit;
	else
		*reg &= ~(1u << bit);
}

struct kvm_cpuid2 *cpuid__for_vcpu(const struct kvm_cpuid2 *base, unsigned index,
				   unsigned ncpus, const struct cpuid_opts *opts)
{
	size_t sz = sizeof(struct kvm_cpuid2) + CPUID_MAX_ENTRIES * sizeof(struct kvm_cpuid_entry2);
	struct kvm_cpuid2 *c = calloc(1, sz);
	if (!c)
		return NULL;
	memcpy(c, base, sizeof(*base) + base->nent * sizeof(base->entries[0]));
	cpuid__topology(c, index, ncpus);
	cpuid__timing(c, opts->tsc_khz);
	struct kvm_cpuid_entry2 *e = cpuid__find(c, 1, 0);
	if (e) {
		cpuid__bit(&e->ecx, 31, opts->hypervisor);
		cpuid__bit(&e->ecx, 24, opts->tsc_deadline);
	}
	return c;
}
