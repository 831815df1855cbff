#include "x86/boot.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define XEN_ELFNOTE_PHYS32_ENTRY 18
#define HVM_START_MAGIC 0x336ec578u

struct hvm_start_info {
	uint32_t magic, version, flags, nr_modules;
	uint64_t modlist_paddr, cmdline_paddr, rsdp_paddr, memmap_paddr;
	uint32_t memmap_entries, reserved;
};

struct hvm_memmap_entry {
	uint64_t addr, size;
	uint32_t type, reserved;
};

#define E820_RAM 1
#define E820_RESERVED 2
#define BOOT_AREA_END 0x8000ull

static int boot__segment_ok(const Elf64_Phdr *ph, size_t len, const struct ram *ram)
{
	if (ph->p_filesz > ph->p_memsz || ph->p_offset > len || ph->p_filesz > len - ph->p_offset)
		return -EINVAL;
	if (!ram__gpa_to_host(ram, ph->p_paddr, ph->p_memsz ? ph->p_memsz : 1))
		return -ERANGE;
	if (ph->p_paddr < BOOT_AREA_END && ph->p_paddr + ph->p_memsz > BOOT_START_INFO)
		return -ERANGE;
	return 0;
}

/* Walks one PT_NOTE segment; returns 1 and sets *entry if the PVH note is there. */
static int boot__find_note(const uint8_t *p, size_t n, uint32_t *entry)
{
	size_t off = 0;
	while (n - off >= sizeof(Elf64_Nhdr)) {
		const Elf64_Nhdr *nh = (const void *)(p + off);
		size_t name = (nh->n_namesz + 3) & ~3u, desc = (nh->n_descsz + 3) & ~3u;
		size_t body = sizeof(*nh) + name;
		if (name > n || desc > n || body > n - off || desc > n - off - body)
			return 0;
		if (nh->n_type == XEN_ELFNOTE_PHYS32_ENTRY && nh->n_namesz == 4 &&
		    !memcmp(p + off + sizeof(*nh), "Xen", 4) && nh->n_descsz >= 4) {
			memcpy(entry, p + off + body, 4);
			return 1;
		}
		off += body + desc;
	}
	return 0;
}

int boot__parse_pvh(const uint8_t *img, size_t len, const struct ram *ram,
		    struct boot_info *out, char *err, size_t errlen)
{
	const Elf64_Ehdr *eh = (const void *)img;
	if (len < sizeof(*eh) || memcmp(eh->e_ident, ELFMAG, SELFMAG)) {
		snprintf(err, errlen, "not an ELF file");
		return -ENOEXEC;
	}
	if (eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_machine != EM_X86_64 ||
	    eh->e_phentsize != sizeof(Elf64_Phdr) || eh->e_phoff > len ||
	    (uint64_t)eh->e_phnum * sizeof(Elf64_Phdr) > len - eh->e_phoff) {
		snprintf(err, errlen, "not a well-formed x86-64 ELF64 file");
		return -ENOEXEC;
	}
	const Elf64_Phdr *ph = (const void *)(img + eh->e_phoff);
	int found = 0;
	memset(out, 0, sizeof(*out));
	for (unsigned i = 0; i < eh->e_phnum; i++)
		if (ph[i].p_type == PT_NOTE && ph[i].p_offset <= len &&
		    ph[i].p_filesz <= len - ph[i].p_offset)
			found |= boot__find_note(img + ph[i].p_offset, ph[i].p_filesz, &out->entry);
	if (!found) {
		snprintf(err, errlen, "no PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY): not a PVH kernel");
		return -ENOEXEC;
	}
	for (unsigned i = 0; i < eh->e_phnum; i++) {
		if (ph[i].p_type != PT_LOAD)
			continue;
		int rc = boot__segment_ok(&ph[i], len, ram);
		if (rc) {
			snprintf(err, errlen, "ELF segment %u at 0x%llx+0x%llx %s", i,
				 (unsigned long long)ph[i].p_paddr,
				 (unsigned long long)ph[i].p_memsz,
				 rc == -ERANGE ? "does not fit guest RAM" : "is malformed");
			return rc;
		}
		if (ph[i].p_paddr + ph[i].p_memsz > out->image_end)
			out->image_end = ph[i].p_paddr + ph[i].p_memsz;
	}
	return 0;
}

static void boot__copy_segments(const uint8_t *img, struct ram *ram)
{
	const Elf64_Ehdr *eh = (const void *)img;
	const Elf64_Phdr *ph = (const void *)(img + eh->e_phoff);
	for (unsigned i = 0; i < eh->e_phnum; i++) {
		if (ph[i].p_type != PT_LOAD || !ph[i].p_memsz)
			continue;
		uint8_t *dst = ram__gpa_to_host(ram, ph[i].p_paddr, ph[i].p_memsz);
		memcpy(dst, img + ph[i].p_offset, ph[i].p_filesz);
		memset(dst + ph[i].p_filesz, 0, ph[i].p_memsz - ph[i].p_filesz);
	}
}

static void boot__write_start_info(struct ram *ram, const char *cmdline, struct boot_info *out)
{
	struct hvm_start_info *si = ram__gpa_to_host(ram, BOOT_START_INFO, 0x1000);
	struct hvm_memmap_entry *mm = (void *)(si + 1);
	unsigned n = 0;
	mm[n++] = (struct hvm_memmap_entry){ 0, 0x9fc00, E820_RAM, 0 };
	mm[n++] = (struct hvm_memmap_entry){ 0x9fc00, 0x100000 - 0x9fc00, E820_RESERVED, 0 };
	for (unsigned i = 0; i < ram->nr_blocks; i++) {
		uint64_t base = ram->blocks[i].gpa, size = ram->blocks[i].size;
		if (base == 0) {
			base = 0x100000;
			size -= 0x100000;
		}
		mm[n++] = (struct hvm_memmap_entry){ base, size, E820_RAM, 0 };
	}
	mm[n++] = (struct hvm_memmap_entry){ 0xfec00000, 0x1000, E820_RESERVED, 0 };
	mm[n++] = (struct hvm_memmap_entry){ 0xfee00000, 0x1000, E820_RESERVED, 0 };
	char *cl = ram__gpa_to_host(ram, BOOT_CMDLINE, BOOT_CMDLINE_MAX);
	snprintf(cl, BOOT_CMDLINE_MAX, "%s", cmdline ? cmdline : "");
	*si = (struct hvm_start_info){
		.magic = HVM_START_MAGIC, .version = 1,
		.cmdline_paddr = BOOT_CMDLINE,
		.memmap_paddr = BOOT_START_INFO + sizeof(*si),
		.memmap_entries = n,
	};
	out->start_info = BOOT_START_INFO;
}

int boot__load_pvh(struct ram *ram, const char *path, const char *cmdline,
		   struct boot_info *out, char *err, size_t errlen)
{
	if (cmdline && strlen(cmdline) >= BOOT_CMDLINE_MAX) {
		snprintf(err, errlen, "command line longer than %d bytes", BOOT_CMDLINE_MAX - 1);
		return -EINVAL;
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		snprintf(err, errlen, "cannot open kernel %s: %s", path, strerror(e));
		return -e;
	}
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
		close(fd);
		snprintf(err, errlen, "kernel %s is not a regular non-empty file", path);
		return -ENOEXEC;
	}
	uint8_t *img = mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (img == MAP_FAILED) {
		int e = errno;
		snprintf(err, errlen, "cannot map kernel %s: %s", path, strerror(e));
		return -e;
	}
	char why[200];
	int rc = boot__parse_pvh(img, st.st_size, ram, out, why, sizeof(why));
	if (rc) {
		snprintf(err, errlen, "kernel %s: %s", path, why);
	} else {
		boot__copy_segments(img, ram);
		boot__write_start_info(ram, cmdline, out);
	}
	munmap(img, st.st_size);
	return rc;
}
