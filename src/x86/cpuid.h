/* CPUID for the guest: what KVM supports (KVM_GET_SUPPORTED_CPUID), with
 * a topology of N single-thread cores in one package, the hypervisor
 * leaves (0x40000000 "KVMKVMKVM", 0x40000010 TSC and bus frequency in kHz)
 * and the TSC leaf 0x15 where the base leaf range allows. */
#ifndef KMIG_X86_CPUID_H
#define KMIG_X86_CPUID_H

#include <linux/kvm.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/log.h"

/* Reads the supported CPUID table; *out is malloc'd (caller frees). */
int cpuid__supported(int kvm_fd, struct kvm_cpuid2 **out) KMIG_MUST_CHECK;
/* What the guest's CPUID says beyond the supported table. */
struct cpuid_opts {
	uint32_t tsc_khz;        /* the TSC frequency (0: unknown, no leaf 0x15) */
	/* CPUID.1:ECX[31] set, without which Linux does not look at the
	 * hypervisor leaves (kvm-clock); off by default (kmig run --kvmclock) */
	bool hypervisor;
	/* CPUID.1:ECX[24]: the local APIC's TSC-deadline timer mode, which
	 * KVM_GET_SUPPORTED_CPUID never reports; set where the in-kernel irqchip
	 * has it (KVM_CAP_TSC_DEADLINE_TIMER), cleared otherwise */
	bool tsc_deadline;
};

/* Returns a malloc'd copy of base adjusted for vCPU index of ncpus, or NULL. */
struct kvm_cpuid2 *cpuid__for_vcpu(const struct kvm_cpuid2 *base, unsigned index,
				   unsigned ncpus, const struct cpuid_opts *opts);

#endif
