/* libFuzzer harness: the kernel loader's parsers on arbitrary images.
 * An ELF/PVH image it accepts must have every PT_LOAD segment inside
 * guest RAM and clear of the boot area, and its entry note read.  A
 * bzImage it accepts (the initrd size and command line length come from
 * the input's last bytes) must have its kernel, setup header and initrd
 * inside the file and inside low RAM, the initrd above the kernel, and
 * boot_params must then be written without a stray access. */
#include <elf.h>
#include <stdlib.h>
#include <string.h>

#include "x86/boot.h"

static void fuzz_bzimage(struct ram *ram, const uint8_t *img, size_t size)
{
	uint64_t rd = 0;
	size_t cl = 0;
	if (size >= 8) {
		memcpy(&rd, img + size - 8, 4);
		cl = img[size - 4] | (size_t)img[size - 3] << 8;
	}
	static char cmdline[BOOT_CMDLINE_MAX + 1];
	memset(cmdline, 'x', cl < BOOT_CMDLINE_MAX ? cl : BOOT_CMDLINE_MAX);
	cmdline[cl < BOOT_CMDLINE_MAX ? cl : BOOT_CMDLINE_MAX] = 0;
	struct boot_bz bz;
	char err[256] = "";
	if (boot__parse_bzimage(img, size, ram, rd, cl, &bz, err, sizeof(err))) {
		if (!err[0])
			abort();        /* a refusal always says why */
		return;
	}
	uint64_t low = ram->blocks[0].size;
	if (bz.setup_size >= size || bz.hdr_end > bz.setup_size || bz.pm_size != size - bz.setup_size ||
	    bz.kernel_end > low || bz.kernel_end < BOOT_KERNEL_LOAD + bz.pm_size ||
	    cl >= BOOT_CMDLINE_MAX || (rd && (bz.initrd_gpa < bz.kernel_end ||
					    bz.initrd_gpa + rd > low || bz.initrd_gpa % 4096)))
		abort();
	memcpy(ram__gpa_to_host(ram, BOOT_KERNEL_LOAD, bz.pm_size), img + bz.setup_size, bz.pm_size);
	boot__write_boot_params(ram, img, &bz, cmdline, rd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct ram ram;
	static int ready;
	if (!ready) {
		if (ram__create(&ram, -1, RAM_MIN_SIZE))
			abort();
		ready = 1;
	}
	/* an aligned copy, as the loader's mmap of a file is */
	uint8_t *img = malloc(size ? size : 1);
	memcpy(img, data, size);
	struct boot_info bi;
	char err[256] = "";
	if (boot__is_bzimage(img, size)) {
		fuzz_bzimage(&ram, img, size);
		free(img);
		return 0;
	}
	if (boot__parse_pvh(img, size, &ram, &bi, err, sizeof(err)) == 0) {
		const Elf64_Ehdr *eh = (const void *)img;
		const Elf64_Phdr *ph = (const void *)(img + eh->e_phoff);
		for (unsigned i = 0; i < eh->e_phnum; i++) {
			if (ph[i].p_type != PT_LOAD || !ph[i].p_memsz)
				continue;
			uint8_t *dst = ram__gpa_to_host(&ram, ph[i].p_paddr, ph[i].p_memsz);
			if (!dst || ph[i].p_filesz > ph[i].p_memsz ||
			    ph[i].p_offset + ph[i].p_filesz > size ||
			    ph[i].p_paddr + ph[i].p_memsz > bi.image_end)
				abort();
			memcpy(dst, img + ph[i].p_offset, ph[i].p_filesz);
		}
	} else if (!err[0]) {
		abort();        /* a refusal always says why */
	}
	free(img);
	return 0;
}
