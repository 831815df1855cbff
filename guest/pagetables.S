/*
 * Prebuilt identity map of the first 64 GiB of physical memory, all pages
 * user-accessible and writable, so ring 0 never builds tables:
 *   pml4[0] -> pdpt; pdpt[0..63] -> pd (64 pages of 512 2 MiB entries);
 *   3..4 GiB (MMIO hole, LAPIC/IOAPIC) is mapped uncached.  Page 0 stays
 *   mapped: QEMU's PVH option ROM puts the memory map there.
 */
#include "layout.h"

#define PTE_P   0x001
#define PTE_RW  0x002
#define PTE_US  0x004
#define PTE_PWT 0x008
#define PTE_PCD 0x010
#define PTE_PS  0x080
#define PTE_RAM (PTE_P | PTE_RW | PTE_US)

	.section .pagetables, "aw"
	.balign 4096
	.globl pml4
pml4:
	.quad pdpt + PTE_RAM
	.fill 511, 8, 0
pdpt:
	.set i, 0
	.rept 64
	.quad pd + i * 4096 + PTE_RAM
	.set i, i + 1
	.endr
	.fill 512 - 64, 8, 0
pd:
	.set i, 0
	.rept 64 * 512
	.if (i >= 1536) && (i < 2048)
	.quad (i << 21) + PTE_RAM + PTE_PS + PTE_PCD + PTE_PWT
	.else
	.quad (i << 21) + PTE_RAM + PTE_PS
	.endif
	.set i, i + 1
	.endr
/* crash=emul's popcnt reads CRASH_EMUL_GPA through this map */
	.if (CRASH_EMUL_GPA < (1536 << 21)) || (CRASH_EMUL_GPA >= (2048 << 21))
	.error "CRASH_EMUL_GPA is not in the mapped MMIO hole (3..4 GiB)"
	.endif
	.section .note.GNU-stack, "", @progbits
