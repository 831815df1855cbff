/* Kernel loading, as QEMU's -kernel/-initrd/-append do, for two formats:
 *
 *  - a PVH ELF (an ELF with the XEN_ELFNOTE_PHYS32_ENTRY note: the test
 *    guest, Linux's vmlinux): segments loaded where the ELF says, struct
 *    hvm_start_info (version 1) with the command line, an e820-style
 *    memory map and the initrd as module 0; entry with %ebx = start info;
 *  - a bzImage (Linux's vmlinuz; x86 boot protocol 2.10 or later): the
 *    protected-mode kernel loaded at BOOT_KERNEL_LOAD, struct boot_params
 *    (the "zero page") with the image's setup header, the command line,
 *    the e820 map and the initrd; the 32-bit entry (code32_start) with
 *    %esi = boot_params.
 *
 * Both enter in 32-bit flat protected mode with paging off (vcpu.h).
 * The initrd goes at the top of the RAM below 3 GiB (below the kernel's
 * initrd_addr_max for a bzImage), page-aligned.
 *
 * Low memory used by the loader (the guest may reuse it after boot):
 *   BOOT_START_INFO  hvm_start_info and the memory map right after it
 *                    (PVH), or struct boot_params (bzImage): one page
 *   BOOT_CMDLINE     the NUL-terminated command line (< BOOT_CMDLINE_MAX) */
#ifndef KMIG_X86_BOOT_H
#define KMIG_X86_BOOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"
#include "mem/ram.h"

#define BOOT_START_INFO 0x6000ull
#define BOOT_PARAMS BOOT_START_INFO
#define BOOT_CMDLINE 0x7000ull
#define BOOT_CMDLINE_MAX 4096
#define BOOT_KERNEL_LOAD 0x100000ull  /* bzImage protected-mode kernel */
#define BOOT_BZ_MIN_VERSION 0x020au   /* boot protocol 2.10: init_size */

enum boot_kind { BOOT_PVH, BOOT_BZIMAGE };

struct boot_info {
	enum boot_kind kind;
	uint32_t entry;      /* 32-bit entry point */
	uint32_t ebx, esi;   /* PVH: %ebx = hvm_start_info; bzImage: %esi = boot_params */
	uint64_t image_end;  /* highest byte the kernel occupies + 1 */
	uint64_t initrd_gpa, initrd_size; /* 0, 0 without an initrd */
};

/* What boot__parse_bzimage read from a bzImage's setup header and where
 * it places the kernel and the initrd. */
struct boot_bz {
	uint16_t version;      /* boot protocol, e.g. 0x020f */
	uint32_t setup_size;   /* bytes before the protected-mode kernel */
	uint32_t hdr_end;      /* image offset where the setup header ends */
	uint64_t pm_size;      /* protected-mode kernel bytes in the image */
	uint64_t init_size;    /* memory the kernel needs from its load address */
	uint32_t cmdline_max;  /* longest command line it takes, NUL excluded */
	uint64_t initrd_limit; /* the initrd must end at or below this */
	uint64_t kernel_end;   /* BOOT_KERNEL_LOAD + max(pm_size, init_size) */
	uint64_t initrd_gpa;   /* where the initrd goes (0 without one) */
};

/* Loads the kernel at `kernel` (PVH ELF or bzImage, told apart by their
 * magic numbers) and, unless NULL, the initrd at `initrd`.  err gets a
 * one-line reason on failure.  Returns 0, -ENOENT (no file), -ENOEXEC
 * (neither format, or a bzImage older than boot protocol 2.10), -ERANGE
 * (something does not fit guest RAM or overlaps the boot area), -EINVAL
 * (a command line too long). */
int boot__load(struct ram *ram, const char *kernel, const char *initrd, const char *cmdline,
	       struct boot_info *out, char *err, size_t errlen) KMIG_MUST_CHECK;

/* Whether img looks like a bzImage ("HdrS" in its setup header). */
bool boot__is_bzimage(const uint8_t *img, size_t len);

/* Parses an ELF image in memory (pure; used by the loader and tests). */
int boot__parse_pvh(const uint8_t *img, size_t len, const struct ram *ram,
		    struct boot_info *out, char *err, size_t errlen) KMIG_MUST_CHECK;

/* Parses a bzImage in memory and plans its layout for an initrd of
 * initrd_size bytes (0: none) and a command line of cmdline_len bytes
 * (pure; used by the loader and tests).  Every size and offset read from
 * the image is checked against len and against guest RAM. */
int boot__parse_bzimage(const uint8_t *img, size_t len, const struct ram *ram,
			uint64_t initrd_size, size_t cmdline_len, struct boot_bz *out,
			char *err, size_t errlen) KMIG_MUST_CHECK;

/* Writes struct boot_params for a parsed bzImage at BOOT_PARAMS and the
 * command line at BOOT_CMDLINE (pure over guest RAM; tests read it back). */
void boot__write_boot_params(struct ram *ram, const uint8_t *img, const struct boot_bz *bz,
			     const char *cmdline, uint64_t initrd_size);

/* The e820 map kmig gives every guest: low 640 KiB, the legacy hole
 * reserved, each RAM block (block 0 from 1 MiB), the IOAPIC and LAPIC
 * pages reserved.  Fills at most max entries; returns how many. */
struct boot_e820 {
	uint64_t addr, size;
	uint32_t type;         /* BOOT_E820_RAM or BOOT_E820_RESERVED */
};
#define BOOT_E820_RAM 1
#define BOOT_E820_RESERVED 2
#define BOOT_E820_MAX (RAM_MAX_BLOCKS + 4)
unsigned boot__e820(const struct ram *ram, struct boot_e820 *map, unsigned max);

#endif
