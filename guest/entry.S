/*
 * Ring-0 part of the kmig test guest: PVH entry, the switch to long mode,
 * per-CPU TSS/IDT load, the drop to ring 3, exception stubs and the trap
 * handler.  Under kvm_pvm every instruction here is emulated by the host
 * kernel, so this file is kept to a few dozen instructions per path.  The
 * page tables, GDT, IDT and TSSs are prebuilt static data (pagetables.S and
 * the linker script); nothing here loops over memory.
 *
 * Sections: .text.r0_32 (32-bit), .text.r0 (64-bit), .text.r0_16 (the AP
 * real-mode trampoline, copied to TRAMP_ADDR by ring 3).  guest/check_r0.sh
 * scans all three for instructions the emulator lacks.
 */
#include "layout.h"

#define CR0_PE   0x00000001
#define CR0_MP   0x00000002
#define CR0_ET   0x00000010
#define CR0_NE   0x00000020
#define CR0_PG   0x80000000
#define CR4_PAE  0x00000020
#define CR4_OSFXSR 0x00000200
#define CR4_OSXMMEXCPT 0x00000400
#define MSR_EFER 0xc0000080
#define EFER_LME 0x00000100

/* ---- PVH ELF note: XEN_ELFNOTE_PHYS32_ENTRY (18) ---- */
	.section .note.pvh, "a", @note
	.balign 4
	.long 4			/* namesz */
	.long 8			/* descsz */
	.long 18		/* XEN_ELFNOTE_PHYS32_ENTRY */
	.asciz "Xen"
	.balign 4
	.quad _start32

/* ---- 32-bit entry (PVH: protected mode, paging off, %ebx = start info) ---- */
	.section .text.r0_32, "ax"
	.code32
	.globl _start32
_start32:
	movl %ebx, pvh_start_info
	xorl %edi, %edi			/* cpu 0 */
	jmp enter_long

	.globl ap_entry32
ap_entry32:				/* from the trampoline, CS = SEL_KCODE32 */
	movl $SEL_KDATA, %eax
	movl %eax, %ds
	movl %eax, %es
	movl %eax, %ss
	movl ap_boot_cpu, %edi

enter_long:
	lgdt gdt_ptr
	movl $(CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT), %eax
	movl %eax, %cr4
	movl $pml4, %eax
	movl %eax, %cr3
	movl $MSR_EFER, %ecx
	movl $EFER_LME, %eax
	xorl %edx, %edx
	wrmsr
	movl $(CR0_PG | CR0_NE | CR0_ET | CR0_MP | CR0_PE), %eax
	movl %eax, %cr0
	ljmp $SEL_KCODE64, $long64

/* ---- 64-bit ring 0 ---- */
	.section .text.r0, "ax"
	.code64
long64:					/* %edi = cpu index */
	movl $SEL_KDATA, %eax
	movl %eax, %ds
	movl %eax, %es
	movl %eax, %ss
	movl %edi, %eax
	shll $12, %eax
	leaq r0_stacks + R0_STACK_SIZE(%rax), %rsp
	movl %edi, %eax
	shll $4, %eax
	addl $SEL_TSS0, %eax		/* SEL_TSS0 + 16 * cpu */
	ltr %ax
	lidt idt_ptr
	pushq $(SEL_UDATA | 3)
	movl %edi, %eax
	shll $15, %eax			/* U_STACK_SIZE == 1 << 15 */
	leaq u_stacks + U_STACK_SIZE(%rax), %rax
	pushq %rax
	pushq $2			/* RFLAGS: IF = 0, IOPL = 0 */
	pushq $(SEL_UCODE64 | 3)
	pushq $r3_entry
	iretq

/* Exception stubs, 16 bytes apart: the linker script builds the IDT gates
 * from isr_base + 16 * vector. */
	.balign 16
	.globl isr_base
isr_base:
	.set vec, 0
	.rept IDT_VECTORS
	.balign 16
	.if vec == 6
	jmp ud_entry
	.elseif (vec == 8) || (vec == 10) || (vec == 11) || (vec == 12) || (vec == 13) || (vec == 14) || (vec == 17) || (vec == 21) || (vec == 29) || (vec == 30)
	pushq $vec
	jmp fault_common
	.else
	pushq $0
	pushq $vec
	jmp fault_common
	.endif
	.set vec, vec + 1
	.endr

/* #UD: the trap from ring 3 (rax = magic, rdi = function, rsi, rdx = args).
 * Clobbers rax, rcx, rdx, rsi, rdi; returns past the ud2.  One compare of
 * the function number, then a jump through trap_table (in .rodata), so every
 * function costs the same few emulated instructions. */
ud_entry:
	cmpq $KMIG_MAGIC, %rax
	jne ud_fault
	cmpq $TRAP_MAX, %rdi
	ja ud_fault
	jmp *trap_table(, %rdi, 8)
t_write:
	movq %rdx, %rcx
	movl $COM1_PORT, %edx
	rep outsb
trap_done:
	addq $2, (%rsp)
	iretq
t_mmio_w32:
	movl %edx, (%rsi)
	jmp trap_done
t_out8:
	movl %edx, %eax
	movl %esi, %edx
	outb %al, %dx
	jmp trap_done
t_in8:
	movl %esi, %edx
	xorl %eax, %eax
	inb %dx, %al
	jmp trap_done
t_out32:
	movl %edx, %eax
	movl %esi, %edx
	outl %eax, %dx
	jmp trap_done
t_in32:
	movl %esi, %edx
	inl %dx, %eax			/* zero-extends into rax */
	jmp trap_done
t_wrmsr:
	movl %esi, %ecx
	movl %edx, %eax
	shrq $32, %rdx
	wrmsr
	jmp trap_done
t_mmio_r8:
	movzbl (%rsi), %eax
	jmp trap_done
t_mmio_r16:
	movzwl (%rsi), %eax
	jmp trap_done
t_mmio_r32:
	movl (%rsi), %eax
	jmp trap_done
t_mmio_r64:
	movq (%rsi), %rax
	jmp trap_done
t_mmio_w8:
	movb %dl, (%rsi)
	jmp trap_done
t_mmio_w16:
	movw %dx, (%rsi)
	jmp trap_done
t_mmio_w64:
	movq %rdx, (%rsi)
	jmp trap_done
t_poweroff:
	movl $POWEROFF_PORT, %edx
	xorl %eax, %eax
	outb %al, %dx
	jmp halt_forever
t_crash_triple:
	lidt empty_idt_ptr
	ud2
t_crash_emul:
	movl $CRASH_EMUL_GPA, %ecx	/* zero-extends into rcx */
	jmp r0_crash_emul
ud_fault:
	pushq $0
	pushq $6
fault_common:				/* stack: vec, err, rip, cs, rflags, rsp, ss */
	movq (%rsp), %rdi		/* vector */
	movq 16(%rsp), %rsi		/* rip */
	movq 8(%rsp), %rdx		/* error code */
	movq %cr2, %rcx
	movq %rsp, %r8
	subq $r0_stacks, %r8
	shrq $12, %r8			/* cpu = stack index */
	andq $-16, %rsp
	call r0_fault
halt_forever:
	cli
	hlt
	jmp halt_forever

/* The one place that deliberately executes what KVM cannot emulate
 * (crash=emul); check_r0.py exempts r0_crash_emul..r0_crash_emul_end.
 * popcnt reads CRASH_EMUL_GPA (%rcx), where no memory is: KVM must emulate
 * the access (kvm_pvm emulates every ring-0 instruction anyway) and its
 * emulator has no popcnt, so every KVM stops the VM with an emulation
 * failure here, rip at the popcnt.  The int3 is never reached. */
	.globl r0_crash_emul, r0_crash_emul_end
r0_crash_emul:
	popcnt (%rcx), %rax
	int3
r0_crash_emul_end:
	jmp halt_forever

/* ---- AP real-mode trampoline, copied to TRAMP_ADDR; SIPI starts it at
 * CS:IP = (TRAMP_ADDR >> 4):0 ---- */
	.section .text.r0_16, "ax"
	.code16
	.globl tramp_start, tramp_end
tramp_start:
	cli
	movw %cs, %ax
	movw %ax, %ds
	lgdtl tramp_gdtr_data - tramp_start
	movl %cr0, %eax
	orl $CR0_PE, %eax
	movl %eax, %cr0
	ljmpl $SEL_KCODE32, $ap_entry32
	.balign 8
tramp_gdtr_data:
	.word GDT_LIMIT
	.long gdt
tramp_end:

/* ---- ring-3 entry (ordinary code) ---- */
	.text
	.code64
	.globl r3_entry
r3_entry:				/* %rdi = cpu; rsp 16-byte aligned */
	call r3_main
	ud2

/* ---- trap dispatch table (indexed by function number, read by ring 0) ---- */
	.section .rodata
	.balign 8
trap_table:
	.quad ud_fault			/* 0: none */
	.quad t_write			/* 1  TRAP_WRITE */
	.quad t_out32			/* 2  TRAP_OUT32 */
	.quad t_poweroff		/* 3  TRAP_POWEROFF */
	.quad halt_forever		/* 4  TRAP_HALT */
	.quad t_mmio_w32		/* 5  TRAP_MMIO_W32 */
	.quad t_out8			/* 6  TRAP_OUT8 */
	.quad t_in8			/* 7  TRAP_IN8 */
	.quad t_wrmsr			/* 8  TRAP_WRMSR */
	.quad t_crash_triple		/* 9  TRAP_CRASH_TRIPLE */
	.quad t_crash_emul		/* 10 TRAP_CRASH_EMUL */
	.quad t_in32			/* 11 TRAP_IN32 */
	.quad t_mmio_r8			/* 12 TRAP_MMIO_R8 */
	.quad t_mmio_r16		/* 13 TRAP_MMIO_R16 */
	.quad t_mmio_r32		/* 14 TRAP_MMIO_R32 */
	.quad t_mmio_r64		/* 15 TRAP_MMIO_R64 */
	.quad t_mmio_w8			/* 16 TRAP_MMIO_W8 */
	.quad t_mmio_w16		/* 17 TRAP_MMIO_W16 */
	.quad t_mmio_w64		/* 18 TRAP_MMIO_W64 */
trap_table_end:
	.if (trap_table_end - trap_table) != 8 * (TRAP_MAX + 1)
	.error "trap_table does not match TRAP_MAX"
	.endif

/* ---- data ---- */
	.data
	.balign 8
	.globl pvh_start_info, ap_boot_cpu
pvh_start_info:	.long 0
ap_boot_cpu:	.long 0
empty_idt_ptr:	.word 0
		.quad 0

	.balign TSS_STRIDE
	.globl tss_array
tss_array:
	.set cpu, 0
	.rept MAX_CPUS
	.balign TSS_STRIDE
	.long 0
	.quad r0_stacks + (cpu + 1) * R0_STACK_SIZE	/* RSP0 */
	.fill 90, 1, 0
	.word 104					/* I/O map base: none */
	.set cpu, cpu + 1
	.endr

	.bss
	.balign 4096
	.globl r0_stacks, u_stacks
r0_stacks:	.skip R0_STACK_SIZE * MAX_CPUS
	.balign 4096
u_stacks:	.skip U_STACK_SIZE * MAX_CPUS
	.section .note.GNU-stack, "", @progbits
