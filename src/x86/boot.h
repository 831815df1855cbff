/* PVH boot: loads an ELF kernel with the XEN_ELFNOTE_PHYS32_ENTRY note
 * into guest RAM and writes struct hvm_start_info (version 1) with the
 * command line and an e820-style memory map, as QEMU's -kernel does.
 *
 * Low memory used by the loader (the guest may reuse it after boot):
 *   BOOT_START_INFO  hvm_start_info, then the memory map right after it
 *   BOOT_CMDLINE     the NUL-terminated command line (< BOOT_CMDLINE_MAX) */
#ifndef KMIG_X86_BOOT_H
#define KMIG_X86_BOOT_H

#include <stddef.h>
#include <stdint.h>

#include "base/log.h"
#include "mem/ram.h"

#define BOOT_START_INFO 0x6000ull
#define BOOT_CMDLINE 0x7000ull
#define BOOT_CMDLINE_MAX 4096

struct boot_info {
	uint32_t entry;      /* 32-bit PVH entry point */
	uint64_t start_info; /* gpa of hvm_start_info, for %ebx */
	uint64_t image_end;  /* highest byte loaded + 1 */
};

/* Loads the PVH ELF at path.  err gets a one-line reason on failure.
 * Returns 0, -ENOENT (no file), -ENOEXEC (not an ELF or no PVH note),
 * -ERANGE (a segment outside RAM or overlapping the boot area), -EINVAL. */
int boot__load_pvh(struct ram *ram, const char *path, const char *cmdline,
		   struct boot_info *out, char *err, size_t errlen) KMIG_MUST_CHECK;

/* Parses an ELF image in memory (pure; used by the loader and tests). */
int boot__parse_pvh(const uint8_t *img, size_t len, const struct ram *ram,
		    struct boot_info *out, char *err, size_t errlen) KMIG_MUST_CHECK;

#endif
