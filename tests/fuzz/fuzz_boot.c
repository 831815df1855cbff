/* libFuzzer harness: the kernel loader's ELF/PVH parser on arbitrary
 * images.  An image it accepts must have every PT_LOAD segment inside
 * guest RAM and clear of the boot area, and its entry note read. */
#include <elf.h>
#include <stdlib.h>
#include <string.h>

#include "x86/boot.h"

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
	char err[256];
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
