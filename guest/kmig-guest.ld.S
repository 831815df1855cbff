/* Linker script of the kmig test guest (run through cpp).  The GDT (with one
 * TSS descriptor per CPU) and the IDT are computed here as static data, so
 * ring 0 loads them and never writes a descriptor. */
#include "layout.h"

#define TSS_BASE(i) (ABSOLUTE(tss_array) + (i) * TSS_STRIDE)
#define TSS_DESC(i) \
	QUAD(0x67 | ((TSS_BASE(i) & 0xffffff) << 16) | (0x89 << 40) | \
	     (((TSS_BASE(i) >> 24) & 0xff) << 56)) \
	QUAD(TSS_BASE(i) >> 32)
#define ISR(v) (ABSOLUTE(isr_base) + (v) * 16)
#define GATE(v) \
	QUAD((ISR(v) & 0xffff) | (SEL_KCODE64 << 16) | (0x8e << 40) | \
	     (((ISR(v) >> 16) & 0xffff) << 48)) \
	QUAD(ISR(v) >> 32)

OUTPUT_FORMAT("elf64-x86-64")
OUTPUT_ARCH(i386:x86-64)
ENTRY(_start32)

PHDRS
{
	image PT_LOAD FLAGS(7);
	note PT_NOTE FLAGS(4);
}

SECTIONS
{
	. = IMAGE_BASE;
	__image_start = .;
	.note.pvh : { KEEP(*(.note.pvh)) } :image :note
	.text.r0_32 : { *(.text.r0_32) } :image
	.text.r0 : { *(.text.r0) *r0_fault.o(.text .text.*) }
	.text.r0_16 : { *(.text.r0_16) }
	.text : { *(.text .text.*) }
	.rodata : { *(.rodata .rodata.*) }
	.data : { *(.data .data.*) }
	.tables ALIGN(64) : {
		gdt = .;
		QUAD(0)
		QUAD(0x00af9a000000ffff)	/* 0x08 kernel code, 64-bit */
		QUAD(0x00cf92000000ffff)	/* 0x10 kernel data */
		QUAD(0x00cff2000000ffff)	/* 0x18 user data */
		QUAD(0x00affa000000ffff)	/* 0x20 user code, 64-bit */
		QUAD(0x00cf9a000000ffff)	/* 0x28 kernel code, 32-bit (AP start) */
		TSS_DESC(0) TSS_DESC(1) TSS_DESC(2) TSS_DESC(3)
		TSS_DESC(4) TSS_DESC(5) TSS_DESC(6) TSS_DESC(7)
		TSS_DESC(8) TSS_DESC(9) TSS_DESC(10) TSS_DESC(11)
		TSS_DESC(12) TSS_DESC(13) TSS_DESC(14) TSS_DESC(15)
		gdt_end = .;
		. = ALIGN(16);
		idt = .;
		GATE(0) GATE(1) GATE(2) GATE(3) GATE(4) GATE(5) GATE(6) GATE(7)
		GATE(8) GATE(9) GATE(10) GATE(11) GATE(12) GATE(13) GATE(14) GATE(15)
		GATE(16) GATE(17) GATE(18) GATE(19) GATE(20) GATE(21) GATE(22) GATE(23)
		GATE(24) GATE(25) GATE(26) GATE(27) GATE(28) GATE(29) GATE(30) GATE(31)
		idt_end = .;
		. = ALIGN(8);
		gdt_ptr = .;
		SHORT(GDT_LIMIT) QUAD(gdt)
		. = ALIGN(8);
		idt_ptr = .;
		SHORT(IDT_LIMIT) QUAD(idt)
	}
	.pagetables ALIGN(4096) : { *(.pagetables) }
	.bss ALIGN(4096) : { *(.bss .bss.*) *(COMMON) }
	. = ALIGN(4096);
	__image_end = .;
	/DISCARD/ : { *(.comment) *(.eh_frame) *(.note.GNU-stack) *(.note.gnu.property) }
}
ASSERT(gdt_end - gdt == GDT_LIMIT + 1, "GDT size does not match layout.h")
ASSERT(idt_end - idt == IDT_LIMIT + 1, "IDT size does not match layout.h")
ASSERT(__image_end <= 0x200000 + 0x200000, "image too large")
