/* bzImage loading: the Linux x86 boot protocol's 32-bit entry (boot.h).
 * Offsets below are those of the setup header inside the image and of
 * struct boot_params, which share one layout from 0x1f1 on. */
#include "x86/boot.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define BZ_SETUP_SECTS   0x1f1  /* u8: 512-byte sectors of setup; 0 = 4 */
#define BZ_BOOT_FLAG     0x1fe  /* u16: 0xaa55 */
#define BZ_JUMP_LEN      0x201  /* u8: the setup header ends at 0x202 + this */
#define BZ_HEADER        0x202  /* "HdrS" */
#define BZ_VERSION       0x206  /* u16 */
#define BZ_TYPE_OF_LOADER 0x210 /* u8 */
#define BZ_LOADFLAGS     0x211  /* u8: bit 0 LOADED_HIGH */
#define BZ_CODE32_START  0x214  /* u32 */
#define BZ_RAMDISK_IMAGE 0x218  /* u32 */
#define BZ_RAMDISK_SIZE  0x21c  /* u32 */
#define BZ_CMD_LINE_PTR  0x228  /* u32 */
#define BZ_INITRD_MAX    0x22c  /* u32: highest initrd byte address */
#define BZ_CMDLINE_SIZE  0x238  /* u32: longest command line, NUL excluded */
#define BZ_INIT_SIZE     0x260  /* u32 */
#define BZ_HDR_LIMIT     0x290  /* end of the setup header in boot_params */
#define BP_E820_ENTRIES  0x1e8  /* u8 */
#define BP_E820_TABLE    0x2d0  /* 128 x { u64 addr, u64 size, u32 type } */
#define BP_SIZE          0x1000
#define LOADED_HIGH      0x01
#define LOADER_UNDEFINED 0xff   /* type_of_loader of a boot loader with no ID */

static uint32_t le(const uint8_t *p, unsigned n)
{
	uint32_t v = 0;
	for (unsigned i = n; i-- > 0;)
		v = (v << 8) | p[i];
	return v;
}

static void put_le(uint8_t *p, uint64_t v, unsigned n)
{
	for (unsigned i = 0; i < n; i++, v >>= 8)
		p[i] = (uint8_t)v;
}

bool boot__is_bzimage(const uint8_t *img, size_t len)
{
	return len >= BZ_HEADER + 4 && !memcmp(img + BZ_HEADER, "HdrS", 4);
}

static int bz__header(const uint8_t *img, size_t len, struct boot_bz *out, char *err, size_t errlen)
{
	if (!boot__is_bzimage(img, len) || le(img + BZ_BOOT_FLAG, 2) != 0xaa55) {
		snprintf(err, errlen, "not a bzImage (no boot flag or HdrS header)");
		return -ENOEXEC;
	}
	if (len < BZ_INIT_SIZE + 4) {
		snprintf(err, errlen, "bzImage of %zu bytes is too short for its setup header", len);
		return -ENOEXEC;
	}
	out->version = (uint16_t)le(img + BZ_VERSION, 2);
	if (out->version < BOOT_BZ_MIN_VERSION) {
		snprintf(err, errlen, "bzImage boot protocol %u.%02u is older than 2.10",
			 out->version >> 8, out->version & 0xff);
		return -ENOEXEC;
	}
	if (!(img[BZ_LOADFLAGS] & LOADED_HIGH)) {
		snprintf(err, errlen, "bzImage is not loaded high (a zImage)");
		return -ENOEXEC;
	}
	unsigned sects = img[BZ_SETUP_SECTS] ? img[BZ_SETUP_SECTS] : 4;
	out->setup_size = (sects + 1) * 512;
	out->hdr_end = BZ_HEADER + img[BZ_JUMP_LEN];
	if (out->hdr_end > BZ_HDR_LIMIT)
		out->hdr_end = BZ_HDR_LIMIT;
	if (out->setup_size >= len || out->hdr_end > out->setup_size) {
		snprintf(err, errlen, "bzImage setup (%u bytes) leaves no kernel in a %zu-byte file",
			 out->setup_size, len);
		return -ENOEXEC;
	}
	out->pm_size = len - out->setup_size;
	out->init_size = le(img + BZ_INIT_SIZE, 4);
	out->cmdline_max = le(img + BZ_CMDLINE_SIZE, 4);
	out->initrd_limit = (uint64_t)le(img + BZ_INITRD_MAX, 4) + 1;
	return 0;
}

int boot__parse_bzimage(const uint8_t *img, size_t len, const struct ram *ram,
			uint64_t initrd_size, size_t cmdline_len, struct boot_bz *out,
			char *err, size_t errlen)
{
	memset(out, 0, sizeof(*out));
	int rc = bz__header(img, len, out, err, errlen);
	if (rc)
		return rc;
	if (cmdline_len > out->cmdline_max || cmdline_len >= BOOT_CMDLINE_MAX) {
		snprintf(err, errlen, "command line of %zu bytes is longer than the kernel takes (%u)",
			 cmdline_len, out->cmdline_max);
		return -EINVAL;
	}
	uint64_t need = out->pm_size > out->init_size ? out->pm_size : out->init_size;
	out->kernel_end = BOOT_KERNEL_LOAD + need;
	if (ram->nr_blocks < 1 || ram->blocks[0].gpa != 0 || need > ram->blocks[0].size ||
	    out->kernel_end > ram->blocks[0].size) {
		snprintf(err, errlen, "bzImage needs %llu bytes from 1 MiB: more than low RAM",
			 (unsigned long long)need);
		return -ERANGE;
	}
	if (!initrd_size)
		return 0;
	uint64_t top = ram->blocks[0].size < out->initrd_limit ? ram->blocks[0].size
							       : out->initrd_limit;
	uint64_t lo = (out->kernel_end + 0xfff) & ~0xfffull;
	if (initrd_size > top || ((top - initrd_size) & ~0xfffull) < lo ||
	    initrd_size > UINT32_MAX) {
		snprintf(err, errlen, "initrd of %llu bytes does not fit between the kernel "
			 "(to 0x%llx) and 0x%llx", (unsigned long long)initrd_size,
			 (unsigned long long)out->kernel_end, (unsigned long long)top);
		return -ERANGE;
	}
	out->initrd_gpa = (top - initrd_size) & ~0xfffull;
	return 0;
}

void boot__write_boot_params(struct ram *ram, const uint8_t *img, const struct boot_bz *bz,
			     const char *cmdline, uint64_t initrd_size)
{
	uint8_t *bp = ram__gpa_to_host(ram, BOOT_PARAMS, BP_SIZE);
	memset(bp, 0, BP_SIZE);
	memcpy(bp + BZ_SETUP_SECTS, img + BZ_SETUP_SECTS, bz->hdr_end - BZ_SETUP_SECTS);
	bp[BZ_TYPE_OF_LOADER] = LOADER_UNDEFINED;
	put_le(bp + BZ_CODE32_START, BOOT_KERNEL_LOAD, 4);
	put_le(bp + BZ_CMD_LINE_PTR, BOOT_CMDLINE, 4);
	put_le(bp + BZ_RAMDISK_IMAGE, initrd_size ? bz->initrd_gpa : 0, 4);
	put_le(bp + BZ_RAMDISK_SIZE, initrd_size, 4);
	struct boot_e820 map[BOOT_E820_MAX];
	unsigned n = boot__e820(ram, map, BOOT_E820_MAX);
	for (unsigned i = 0; i < n; i++) {
		uint8_t *e = bp + BP_E820_TABLE + i * 20;
		put_le(e, map[i].addr, 8);
		put_le(e + 8, map[i].size, 8);
		put_le(e + 16, map[i].type, 4);
	}
	bp[BP_E820_ENTRIES] = (uint8_t)n;
	char *cl = ram__gpa_to_host(ram, BOOT_CMDLINE, BOOT_CMDLINE_MAX);
	snprintf(cl, BOOT_CMDLINE_MAX, "%s", cmdline ? cmdline : "");
}
