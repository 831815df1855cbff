/* The Intel MultiProcessor Specification 1.4 table kmig gives a guest: how
 * a stock Linux (without ACPI) finds its CPUs and the I/O APIC.
 *
 * At MPTABLE_GPA (in the BIOS area, reserved in the e820 map): the 16-byte
 * floating pointer ("_MP_", pointing 16 bytes on), then the configuration
 * table ("PCMP"): one processor entry per vCPU (local APIC id = vCPU
 * index, vCPU 0 the bootstrap processor), bus 0 "ISA", the I/O APIC (id =
 * the vCPU count, at 0xfec00000), ISA IRQs 0-15 on the I/O APIC pins of
 * the same number (KVM's default routing: GSI n is pin n), ExtINT on
 * every local APIC's LINT0 and NMI on LINT1.  Every checksum makes its
 * structure sum to zero (mod 256).
 *
 * With PCI interrupt routes (a PCI bus exists): bus 0 is "PCI" (Linux
 * takes an MP bus id for the PCI bus number) and bus 1 "ISA"; each route
 * is an I/O interrupt entry from PCI bus 0, device slot, pin INTA..INTD,
 * to its I/O APIC pin, level-triggered and active high (as KVM's I/O APIC
 * treats every line: asserted is high), and that pin is left out of the
 * ISA entries.
 *
 * Pure memory: mptable__build writes into a buffer. */
#ifndef KMIG_X86_MPTABLE_H
#define KMIG_X86_MPTABLE_H

#include <stddef.h>
#include <stdint.h>

#include "base/log.h"

#define MPTABLE_GPA 0xf0000u
#define MPTABLE_MAX_CPUS 64u
#define MPTABLE_IOAPIC_GPA 0xfec00000u
#define MPTABLE_LAPIC_GPA 0xfee00000u
#define MPTABLE_ISA_IRQS 16u

#define MPTABLE_MAX_PCI_IRQS 8u

/* One PCI device's interrupt pin and the I/O APIC pin (GSI) it drives. */
struct mptable_pci_irq {
	uint8_t slot;   /* device number on bus 0, 0..31 */
	uint8_t pin;    /* 1..4: INTA..INTD */
	uint8_t gsi;    /* I/O APIC pin, 0..MPTABLE_ISA_IRQS-1 */
};

/* Bytes the table takes for ncpus vCPUs and npci PCI routes (valid ones:
 * distinct GSIs). */
size_t mptable__size(unsigned ncpus, unsigned npci);
/* Writes the floating pointer and table for ncpus (1..MPTABLE_MAX_CPUS)
 * and npci routes (0..MPTABLE_MAX_PCI_IRQS, distinct GSIs) into buf, to
 * be placed at guest-physical gpa; returns the size, or -EINVAL /
 * -ENOSPC. */
long mptable__build(uint8_t *buf, size_t cap, uint32_t gpa, unsigned ncpus,
		    const struct mptable_pci_irq *pci, unsigned npci) KMIG_MUST_CHECK;

#endif
