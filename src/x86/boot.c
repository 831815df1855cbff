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

struct hvm_modlist_entry {
	uint64_t paddr, size, cmdline_paddr, reserved;
};

#define BOOT_AREA_END (BOOT_CMDLINE + BOOT_CMDLINE_MAX)

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

unsigned boot__e820(const struct ram *ram, struct boot_e820 *map, unsigned max)
{
	struct boot_e820 all[BOOT_E820_MAX];
	unsigned n = 0;
	all[n++] = (struct boot_e820){ 0, 0x9fc00, BOOT_E820_RAM };
	all[n++] = (struct boot_e820){ 0x9fc00, 0x100000 - 0x9fc00, BOOT_E820_RESERVED };
	for (unsigned i = 0; i < ram->nr_blocks && i < RAM_MAX_BLOCKS; i++) {
		uint64_t base = ram->blocks[i].gpa, size = ram->blocks[i].size;
		if (base == 0) {
			base = 0x100000;
			size -= 0x100000;
		}
		all[n++] = (struct boot_e820){ base, size, BOOT_E820_RAM };
	}
	all[n++] = (struct boot_e820){ 0xfec00000, 0x1000, BOOT_E820_RESERVED };
	all[n++] = (struct boot_e820){ 0xfee00000, 0x1000, BOOT_E820_RESERVED };
	if (n > max)
		n = max;
	memcpy(map, all, n * sizeof(*map));
	return n;
}

/* The initrd's place for a PVH kernel: the top of block 0, page-aligned,
 * above the kernel; 0 if it does not fit. */
static uint64_t boot__pvh_initrd_gpa(const struct ram *ram, uint64_t image_end, uint64_t size)
{
	uint64_t top = ram->blocks[0].gpa + ram->blocks[0].size;
	uint64_t lo = (image_end + 0xfff) & ~0xfffull;
	if (lo < BOOT_AREA_END)
		lo = BOOT_AREA_END;
	if (!size || size > top || ((top - size) & ~0xfffull) < lo)
		return 0;
	return (top - size) & ~0xfffull;
}

static void boot__write_start_info(struct ram *ram, const char *cmdline, struct boot_info *out)
{
	struct hvm_start_info *si = ram__gpa_to_host(ram, BOOT_START_INFO, 0x1000);
	struct hvm_memmap_entry *mm = (void *)(si + 1);
	struct boot_e820 map[BOOT_E820_MAX];
	unsigned n = boot__e820(ram, map, BOOT_E820_MAX);
	for (unsigned i = 0; i < n; i++)
		mm[i] = (struct hvm_memmap_entry){ map[i].addr, map[i].size, map[i].type, 0 };
	char *cl = ram__gpa_to_host(ram, BOOT_CMDLINE, BOOT_CMDLINE_MAX);
	snprintf(cl, BOOT_CMDLINE_MAX, "%s", cmdline ? cmdline : "");
	*si = (struct hvm_start_info){
		.magic = HVM_START_MAGIC, .version = 1,
		.cmdline_paddr = BOOT_CMDLINE,
		.memmap_paddr = BOOT_START_INFO + sizeof(*si),
		.memmap_entries = n,
	};
	if (out->initrd_size) {
		/* module 0 after the memory map: Linux takes it as its initrd */
		struct hvm_modlist_entry *mod = (void *)(mm + n);
		*mod = (struct hvm_modlist_entry){ out->initrd_gpa, out->initrd_size, 0, 0 };
		si->nr_modules = 1;
		si->modlist_paddr = BOOT_START_INFO + sizeof(*si) + n * sizeof(*mm);
	}
	out->kind = BOOT_PVH;
	out->ebx = (uint32_t)BOOT_START_INFO;
}

/* A read-only map of a whole regular file; *len its size. */
static uint8_t *boot__map_file(const char *what, const char *path, size_t *len,
			       char *err, size_t errlen, int *rc)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		*rc = -errno;
		snprintf(err, errlen, "cannot open %s %s: %s", what, path, strerror(-*rc));
		return NULL;
	}
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
		close(fd);
		*rc = -ENOEXEC;
		snprintf(err, errlen, "%s %s is not a regular non-empty file", what, path);
		return NULL;
	}
	uint8_t *p = mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		*rc = -errno;
		snprintf(err, errlen, "cannot map %s %s: %s", what, path, strerror(-*rc));
		return NULL;
	}
	*len = st.st_size;
	*rc = 0;
	return p;
}

static int boot__load_image(struct ram *ram, const uint8_t *img, size_t len, const uint8_t *rd,
			    size_t rd_len, const char *cmdline, struct boot_info *out,
			    char *why, size_t whylen)
{
	size_t cl = cmdline ? strlen(cmdline) : 0;
	if (boot__is_bzimage(img, len)) {
		struct boot_bz bz;
		int rc = boot__parse_bzimage(img, len, ram, rd_len, cl, &bz, why, whylen);
		if (rc)
			return rc;
		memcpy(ram__gpa_to_host(ram, BOOT_KERNEL_LOAD, bz.pm_size), img + bz.setup_size,
		       bz.pm_size);
		if (rd_len)
			memcpy(ram__gpa_to_host(ram, bz.initrd_gpa, rd_len), rd, rd_len);
		boot__write_boot_params(ram, img, &bz, cmdline, rd_len);
		*out = (struct boot_info){ .kind = BOOT_BZIMAGE, .entry = (uint32_t)BOOT_KERNEL_LOAD,
			.esi = (uint32_t)BOOT_PARAMS, .image_end = bz.kernel_end,
			.initrd_gpa = bz.initrd_gpa, .initrd_size = rd_len };
		return 0;
	}
	int rc = boot__parse_pvh(img, len, ram, out, why, whylen);
	if (rc)
		return rc;
	if (rd_len) {
		out->initrd_gpa = boot__pvh_initrd_gpa(ram, out->image_end, rd_len);
		if (!out->initrd_gpa) {
			snprintf(why, whylen, "initrd of %zu bytes does not fit guest RAM above the kernel",
				 rd_len);
			return -ERANGE;
		}
		out->initrd_size = rd_len;
		memcpy(ram__gpa_to_host(ram, out->initrd_gpa, rd_len), rd, rd_len);
	}
	boot__copy_segments(img, ram);
	boot__write_start_info(ram, cmdline, out);
	return 0;
}

int boot__load(struct ram *ram, const char *kernel, const char *initrd, const char *cmdline,
	       struct boot_info *out, char *err, size_t errlen)
{
	if (cmdline && strlen(cmdline) >= BOOT_CMDLINE_MAX) {
		snprintf(err, errlen, "command line longer than %d bytes", BOOT_CMDLINE_MAX - 1);
		return -EINVAL;
	}
	int rc;
	size_t len = 0, rd_len = 0;
	uint8_t *img = boot__map_file("kernel", kernel, &len, err, errlen, &rc);
	if (!img)
		return rc;
	uint8_t *rd = NULL;
	if (initrd && !(rd = boot__map_file("initrd", initrd, &rd_len, err, errlen, &rc))) {
		munmap(img, len);
		return rc;
	}
	char why[200] = "";
	rc = boot__load_image(ram, img, len, rd, rd_len, cmdline, out, why, sizeof(why));
	if (rc)
		snprintf(err, errlen, "kernel %s: %s", kernel, why);
	if (rd)
		munmap(rd, rd_len);
	munmap(img, len);
	return rc;
}
