/* Per-vCPU CPUID (src/x86/cpuid.c) from a made-up supported table: the
 * hypervisor bit follows --kvmclock (set or cleared whatever the table
 * says), the hypervisor leaves carry KVM's signature, only kvm-clock's
 * paravirtual feature bits and the TSC frequency; the topology gives each
 * vCPU its APIC id and the count of all. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "x86/cpuid.h"

static struct kvm_cpuid2 *table(void)
{
	struct kvm_cpuid2 *c = calloc(1, sizeof(*c) + 8 * sizeof(c->entries[0]));
	if (!c)
		abort();
	c->nent = 3;
	c->entries[0] = (struct kvm_cpuid_entry2){ .function = 0, .eax = 0xd };
	c->entries[1] = (struct kvm_cpuid_entry2){ .function = 1, .ecx = 1u << 31 | 1u << 0 };
	c->entries[2] = (struct kvm_cpuid_entry2){ .function = 0x40000001, .eax = 0x01ffffff,
						   .edx = 0xff };
	return c;
}

static const struct kvm_cpuid_entry2 *find(const struct kvm_cpuid2 *c, uint32_t fn)
{
	for (uint32_t i = 0; i < c->nent; i++)
		if (c->entries[i].function == fn && c->entries[i].index == 0)
			return &c->entries[i];
	return NULL;
}

static void t_hypervisor_bit(struct t *t)
{
	struct kvm_cpuid2 *base = table();
	for (int on = 0; on < 2; on++) {
		struct cpuid_opts o = { .tsc_khz = 2400000, .hypervisor = on };
		struct kvm_cpuid2 *c = cpuid__for_vcpu(base, 1, 2, &o);
		T_CHECK(t, c != NULL);
		if (!c)
			continue;
		const struct kvm_cpuid_entry2 *e = find(c, 1);
		T_CHECK(t, e && !!(e->ecx & 1u << 31) == on);
		T_CHECK(t, e && (e->ecx & 1u));          /* the rest as it was */
		T_CHECK(t, e && e->ebx >> 24 == 1 && (e->ebx >> 16 & 0xff) == 2);
		e = find(c, 0x40000000);
		T_CHECK(t, e && e->eax == 0x40000010 && !memcmp(&e->ebx, "KVMK", 4) &&
			   !memcmp(&e->ecx, "VMKV", 4) && !memcmp(&e->edx, "M\0\0\0", 4));
		e = find(c, 0x40000001);
		T_CHECK(t, e && e->eax == (1u << 0 | 1u << 1 | 1u << 3 | 1u << 24) && e->edx == 0);
		e = find(c, 0x40000010);
		T_CHECK(t, e && e->eax == 2400000);
		free(c);
	}
	free(base);
}

/* TSC-deadline (CPUID.1:ECX[24]) follows the option whatever the table
 * says: KVM_GET_SUPPORTED_CPUID leaves it out though the irqchip has it */
static void t_tsc_deadline_bit(struct t *t)
{
	struct kvm_cpuid2 *base = table();
	base->entries[1].ecx |= 1u << 24;     /* a table that claims it */
	for (int on = 0; on < 2; on++) {
		for (int hv = 0; hv < 2; hv++) {
			struct cpuid_opts o = { .tsc_khz = 1000000, .hypervisor = hv,
						.tsc_deadline = on };
			struct kvm_cpuid2 *c = cpuid__for_vcpu(base, 0, 1, &o);
			T_CHECK(t, c != NULL);
			if (!c)
				continue;
			const struct kvm_cpuid_entry2 *e = find(c, 1);
			T_CHECK(t, e && !!(e->ecx & 1u << 24) == on);
			T_CHECK(t, e && !!(e->ecx & 1u << 31) == hv);
			T_CHECK(t, e && (e->ecx & 1u));
			free(c);
		}
	}
	free(base);
}

int main(void)
{
	struct t t = {0};

	T_RUN(&t, t_hypervisor_bit);
	T_RUN(&t, t_tsc_deadline_bit);
	return T_DONE(&t);
}
