/* Constants shared by the guest's assembly, C and linker script. */
#ifndef KMIG_GUEST_LAYOUT_H
#define KMIG_GUEST_LAYOUT_H

#define IMAGE_BASE      0x100000      /* the ELF is linked and loaded at 1 MiB */
#define MAX_CPUS        16
#define R0_STACK_SIZE   4096          /* per-CPU ring-0 stack (also the TSS RSP0) */
#define U_STACK_SIZE    32768         /* per-CPU ring-3 stack */
#define TSS_STRIDE      128           /* bytes between per-CPU TSSs */

/* GDT selectors */
#define SEL_KCODE64     0x08
#define SEL_KDATA       0x10
#define SEL_UDATA       0x18          /* used with RPL 3: 0x1b */
#define SEL_UCODE64     0x20          /* used with RPL 3: 0x23 */
#define SEL_KCODE32     0x28
#define SEL_TSS0        0x30          /* cpu i: SEL_TSS0 + 16 * i */
#define GDT_ENTRIES     (6 + 2 * MAX_CPUS)
#define GDT_LIMIT       (GDT_ENTRIES * 8 - 1)
#define IDT_VECTORS     32
#define IDT_LIMIT       (IDT_VECTORS * 16 - 1)

/* AP start: the real-mode trampoline is copied here (SIPI vector 0x08) */
#define TRAMP_ADDR      0x8000
#define SIPI_VECTOR     (TRAMP_ADDR >> 12)

/* Trap ABI: ring 3 executes ud2 with rax = KMIG_MAGIC, rdi = function */
#define KMIG_MAGIC      0x6b6d6967
#define TRAP_WRITE      1   /* rsi = ptr, rdx = len: bytes to COM1 */
#define TRAP_OUT32      2   /* rsi = port, rdx = value: 32-bit out */
#define TRAP_POWEROFF   3   /* outb 0 to port 0xf4, then cli; hlt forever */
#define TRAP_HALT       4   /* cli; hlt forever */
#define TRAP_MMIO_W32   5   /* rsi = guest-physical addr, rdx = 32-bit value */
#define TRAP_OUT8       6   /* rsi = port, rdx = value: 8-bit out */
#define TRAP_IN8        7   /* rsi = port: returns the byte in rax */
#define TRAP_WRMSR      8   /* rsi = msr, rdx = 64-bit value */
#define TRAP_CRASH_TRIPLE 9 /* load an empty IDT and raise #UD: triple fault */
#define TRAP_CRASH_EMUL 10  /* popcnt from CRASH_EMUL_GPA: an emulation failure on any KVM */
#define TRAP_IN32       11  /* rsi = port: 32-bit in, result in rax (PCI conf1 data) */
#define TRAP_MMIO_R8    12  /* rsi = guest-physical addr: returns the value in rax */
#define TRAP_MMIO_R16   13
#define TRAP_MMIO_R32   14
#define TRAP_MMIO_R64   15
#define TRAP_MMIO_W8    16  /* rsi = guest-physical addr, rdx = value */
#define TRAP_MMIO_W16   17
#define TRAP_MMIO_W64   18  /* (the 32-bit write is TRAP_MMIO_W32) */
#define TRAP_MAX        18

/* crash=emul reads here: the start of the MMIO hole below 4 GiB, mapped by
 * the guest's page tables (uncached), backed by no memory under kmig (RAM
 * above 3 GiB continues at 4 GiB) nor under QEMU's pc machine, and below
 * the window the balloon driver assigns BARs in (0xe0000000..). */
#define CRASH_EMUL_GPA  0xc0000000

#define COM1_PORT       0x3f8
#define POWEROFF_PORT   0xf4

#endif
