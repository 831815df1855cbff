/* The kernel loader's pure parts: the bzImage setup header parser and its
 * layout plan, struct boot_params as written into guest RAM, the e820
 * map, and the loader end to end on files (bzImage and PVH ELF with an
 * initrd), all on RAM without KVM. */
#include <elf.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "x86/boot.h"

#define SETUP_SECTS 3
#define PM_SIZE (64u << 10)
#define IMG_LEN ((SETUP_SECTS + 1) * 512 + PM_SIZE)

static void put(uint8_t *p, uint64_t v, unsigned n)
{
	for (unsigned i = 0; i < n; i++, v >>= 8)
		p[i] = (uint8_t)v;
}

static uint64_t get(const uint8_t *p, unsigned n)
{
	uint64_t v = 0;
	for (unsigned i = n; i-- > 0;)
		v = (v << 8) | p[i];
	return v;
}

/* A bzImage as the boot protocol describes one: setup sectors, header
 * 2.15, a protected-mode part whose bytes count up. */
static uint8_t *make_bz(uint32_t init_size)
{
	uint8_t *img = calloc(1, IMG_LEN);
	img[0x1f1] = SETUP_SECTS;
	put(img + 0x1fe, 0xaa55, 2);
	img[0x200] = 0xeb;
	img[0x201] = 0x6a;                 /* header to 0x26c, as Linux 6.x */
	memcpy(img + 0x202, "HdrS", 4);
	put(img + 0x206, 0x020f, 2);
	img[0x211] = 0x01;                 /* LOADED_HIGH */
	put(img + 0x214, 0x100000, 4);
	put(img + 0x22c, 0x7fffffff, 4);   /* initrd_addr_max */
	put(img + 0x238, 2047, 4);         /* cmdline_size */
	put(img + 0x260, init_size, 4);
	for (uint32_t i = 0; i < PM_SIZE; i++)
		img[(SETUP_SECTS + 1) * 512 + i] = (uint8_t)(i * 7 + 1);
	return img;
}

static void t_bz_layout(struct t *t)
{
	struct ram ram;
	T_CHECK_EQ(t, ram__create(&ram, -1, 256ull << 20), 0);
	uint8_t *img = make_bz(32u << 20);
	struct boot_bz bz;
	char err[200] = "";
	T_CHECK(t, boot__is_bzimage(img, IMG_LEN));
	T_CHECK_EQ(t, boot__parse_bzimage(img, IMG_LEN, &ram, 5000000, 20, &bz, err, sizeof(err)), 0);
	T_CHECK_EQ(t, bz.version, 0x020f);
	T_CHECK_EQ(t, bz.setup_size, (SETUP_SECTS + 1) * 512);
	T_CHECK_EQ(t, bz.pm_size, PM_SIZE);
	T_CHECK_EQ(t, bz.hdr_end, 0x26c);
	T_CHECK_EQ(t, bz.kernel_end, 0x100000 + (32u << 20));   /* init_size > pm_size */
	/* the initrd at the top of RAM, page-aligned, above the kernel */
	T_CHECK_EQ(t, bz.initrd_gpa, ((256ull << 20) - 5000000) & ~0xfffull);
	T_CHECK(t, bz.initrd_gpa + 5000000 <= (256ull << 20) && bz.initrd_gpa >= bz.kernel_end);
	/* initrd_addr_max below the top of RAM caps it */
	put(img + 0x22c, (100u << 20) - 1, 4);
	T_CHECK_EQ(t, boot__parse_bzimage(img, IMG_LEN, &ram, 4096, 0, &bz, err, sizeof(err)), 0);
	T_CHECK_EQ(t, bz.initrd_gpa, (100u << 20) - 4096);
	free(img);
	ram__destroy(&ram);
}

static void t_bz_refusals(struct t *t)
{
	struct ram ram;
	T_CHECK_EQ(t, ram__create(&ram, -1, 128ull << 20), 0);
	uint8_t *img = make_bz(1u << 20);
	struct boot_bz bz;
	char err[200];
	/* each refusal says why */
#define REFUSED(len, rd, cl, want) do { err[0] = 0; \
	T_CHECK_EQ(t, boot__parse_bzimage(img, len, &ram, rd, cl, &bz, err, sizeof(err)), want); \
	T_CHECK(t, err[0] != 0); } while (0)
	REFUSED(0x250, 0, 0, -ENOEXEC);                 /* header cut short */
	REFUSED(IMG_LEN, 0, 2048, -EINVAL);             /* command line > cmdline_size */
	REFUSED(IMG_LEN, 200u << 20, 0, -ERANGE);       /* initrd larger than RAM */
	REFUSED(IMG_LEN, (127u << 20), 0, -ERANGE);     /* initrd over the kernel */
	put(img + 0x260, 200u << 20, 4);
	REFUSED(IMG_LEN, 0, 0, -ERANGE);                /* kernel needs more than RAM */
	put(img + 0x260, 1u << 20, 4);
	img[0x1f1] = 200;                               /* setup longer than the file */
	REFUSED(IMG_LEN, 0, 0, -ENOEXEC);
	img[0x1f1] = SETUP_SECTS;
	img[0x211] = 0;                                 /* a zImage */
	REFUSED(IMG_LEN, 0, 0, -ENOEXEC);
	img[0x211] = 1;
	put(img + 0x206, 0x0209, 2);                    /* protocol 2.09 */
	REFUSED(IMG_LEN, 0, 0, -ENOEXEC);
	put(img + 0x206, 0x020f, 2);
	put(img + 0x1fe, 0, 2);                         /* no boot flag */
	REFUSED(IMG_LEN, 0, 0, -ENOEXEC);
	put(img + 0x1fe, 0xaa55, 2);
	T_CHECK_EQ(t, boot__parse_bzimage(img, IMG_LEN, &ram, 0, 0, &bz, err, sizeof(err)), 0);
#undef REFUSED
	free(img);
	ram__destroy(&ram);
}

static void t_boot_params(struct t *t)
{
	struct ram ram;
	T_CHECK_EQ(t, ram__create(&ram, -1, 4ull << 30), 0);   /* two blocks */
	uint8_t *img = make_bz(8u << 20);
	img[0x26b] = 0x5a;                                      /* last header byte */
	struct boot_bz bz;
	char err[200];
	T_CHECK_EQ(t, boot__parse_bzimage(img, IMG_LEN, &ram, 8192, 12, &bz, err, sizeof(err)), 0);
	boot__write_boot_params(&ram, img, &bz, "console=ttyS0", 8192);
	const uint8_t *bp = ram__gpa_to_host(&ram, BOOT_PARAMS, 4096);
	T_CHECK(t, !memcmp(bp + 0x202, "HdrS", 4));
	T_CHECK_EQ(t, get(bp + 0x206, 2), 0x020f);
	T_CHECK_EQ(t, bp[0x26b], 0x5a);                         /* header copied to its end */
	T_CHECK_EQ(t, bp[0x210], 0xff);                         /* type_of_loader */
	T_CHECK_EQ(t, get(bp + 0x214, 4), BOOT_KERNEL_LOAD);
	T_CHECK_EQ(t, get(bp + 0x228, 4), BOOT_CMDLINE);
	T_CHECK_EQ(t, get(bp + 0x218, 4), bz.initrd_gpa);
	T_CHECK_EQ(t, get(bp + 0x21c, 4), 8192);
	T_CHECK(t, bz.initrd_gpa + 8192 <= 3ull << 30);         /* below the PCI hole */
	T_CHECK(t, !strcmp(ram__gpa_to_host(&ram, BOOT_CMDLINE, 16), "console=ttyS0"));
	/* e820: low RAM, legacy hole, both blocks, IOAPIC, LAPIC */
	T_CHECK_EQ(t, bp[0x1e8], 6);
	const uint8_t *e = bp + 0x2d0;
	T_CHECK(t, get(e, 8) == 0 && get(e + 8, 8) == 0x9fc00 && get(e + 16, 4) == 1);
	T_CHECK(t, get(e + 20, 8) == 0x9fc00 && get(e + 36, 4) == 2);
	T_CHECK(t, get(e + 40, 8) == 0x100000 && get(e + 48, 8) == (3ull << 30) - 0x100000 &&
		   get(e + 56, 4) == 1);
	T_CHECK(t, get(e + 60, 8) == 4ull << 30 && get(e + 68, 8) == 1ull << 30 && get(e + 76, 4) == 1);
	T_CHECK(t, get(e + 80, 8) == 0xfec00000 && get(e + 100, 8) == 0xfee00000);
	/* nothing past the header from the image: the rest is zero */
	T_CHECK_EQ(t, bp[0x26c], 0);
	free(img);
	ram__destroy(&ram);
}

static int write_file(char *path, const void *data, size_t len)
{
	int fd = mkstemp(path);
	if (fd < 0)
		return -1;
	int ok = write(fd, data, len) == (ssize_t)len;
	close(fd);
	return ok ? 0 : -1;
}

/* A minimal PVH ELF: one PT_LOAD at 1 MiB and the entry note. */
static size_t make_pvh(uint8_t *buf)
{
	memset(buf, 0, 4096);
	Elf64_Ehdr *eh = (void *)buf;
	memcpy(eh->e_ident, ELFMAG, SELFMAG);
	eh->e_ident[EI_CLASS] = ELFCLASS64;
	eh->e_machine = EM_X86_64;
	eh->e_phoff = sizeof(*eh);
	eh->e_phentsize = sizeof(Elf64_Phdr);
	eh->e_phnum = 2;
	Elf64_Phdr *ph = (void *)(buf + eh->e_phoff);
	ph[0] = (Elf64_Phdr){ .p_type = PT_LOAD, .p_offset = 1024, .p_paddr = 0x100000,
			      .p_filesz = 16, .p_memsz = 0x2000 };
	uint8_t *note = buf + 512;
	put(note, 4, 4);                 /* namesz */
	put(note + 4, 4, 4);             /* descsz */
	put(note + 8, 18, 4);            /* XEN_ELFNOTE_PHYS32_ENTRY */
	memcpy(note + 12, "Xen", 4);
	put(note + 16, 0x100000, 4);
	ph[1] = (Elf64_Phdr){ .p_type = PT_NOTE, .p_offset = 512, .p_filesz = 20 };
	return 2048;
}

static void t_load_files(struct t *t)
{
	struct ram ram;
	T_CHECK_EQ(t, ram__create(&ram, -1, 128ull << 20), 0);
	char kpath[] = "/tmp/kmig-test-kernel-XXXXXX", rpath[] = "/tmp/kmig-test-initrd-XXXXXX";
	static uint8_t rd[10000];
	for (size_t i = 0; i < sizeof(rd); i++)
		rd[i] = (uint8_t)(i * 13 + 5);
	T_CHECK_EQ(t, write_file(rpath, rd, sizeof(rd)), 0);
	uint8_t *img = make_bz(4u << 20);
	T_CHECK_EQ(t, write_file(kpath, img, IMG_LEN), 0);
	struct boot_info bi;
	char err[300] = "";
	T_CHECK_EQ(t, boot__load(&ram, kpath, rpath, "quiet", &bi, err, sizeof(err)), 0);
	T_CHECK_EQ(t, bi.kind, BOOT_BZIMAGE);
	T_CHECK(t, bi.entry == BOOT_KERNEL_LOAD && bi.esi == BOOT_PARAMS && bi.ebx == 0);
	T_CHECK(t, !memcmp(ram__gpa_to_host(&ram, BOOT_KERNEL_LOAD, PM_SIZE),
			   img + (SETUP_SECTS + 1) * 512, PM_SIZE));
	T_CHECK(t, bi.initrd_size == sizeof(rd) &&
		   !memcmp(ram__gpa_to_host(&ram, bi.initrd_gpa, sizeof(rd)), rd, sizeof(rd)));
	unlink(kpath);
	/* a PVH ELF: the initrd is module 0 of hvm_start_info */
	static uint8_t elf[4096];
	size_t elen = make_pvh(elf);
	char epath[] = "/tmp/kmig-test-pvh-XXXXXX";
	T_CHECK_EQ(t, write_file(epath, elf, elen), 0);
	T_CHECK_EQ(t, boot__load(&ram, epath, rpath, "", &bi, err, sizeof(err)), 0);
	T_CHECK(t, bi.kind == BOOT_PVH && bi.ebx == BOOT_START_INFO && bi.entry == 0x100000);
	const uint8_t *si = ram__gpa_to_host(&ram, BOOT_START_INFO, 4096);
	T_CHECK_EQ(t, get(si + 12, 4), 1);                       /* nr_modules */
	const uint8_t *mod = ram__gpa_to_host(&ram, get(si + 16, 8), 32);
	T_CHECK(t, mod && get(mod, 8) == bi.initrd_gpa && get(mod + 8, 8) == sizeof(rd));
	T_CHECK(t, bi.initrd_gpa >= 0x102000 && bi.initrd_gpa % 4096 == 0);
	T_CHECK(t, !memcmp(ram__gpa_to_host(&ram, bi.initrd_gpa, sizeof(rd)), rd, sizeof(rd)));
	/* a missing initrd is an error that names it */
	err[0] = 0;
	T_CHECK_EQ(t, boot__load(&ram, epath, "/nonexistent/initrd", "", &bi, err, sizeof(err)),
		   -ENOENT);
	T_CHECK(t, strstr(err, "initrd") != NULL);
	unlink(epath);
	unlink(rpath);
	free(img);
	ram__destroy(&ram);
}

int main(void)
{
	struct t t = { 0 };
	T_RUN(&t, t_bz_layout);
	T_RUN(&t, t_bz_refusals);
	T_RUN(&t, t_boot_params);
	T_RUN(&t, t_load_files);
	return T_DONE(&t);
}
