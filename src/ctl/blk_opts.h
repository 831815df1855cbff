/* QEMU's command-line options for a disk, as kmig run takes them:
 *   --blockdev driver=file,filename=PATH,node-name=ID[,cache.direct=on|off]
 *              [,read-only=on|off][,discard=unmap|ignore]
 *   --drive file=PATH,format=raw,if=none,id=ID[,readonly=on|off]
 *           [,cache=writeback|none|writethrough|directsync][,discard=unmap|ignore]
 *           [,werror=enospc|report|ignore|stop][,rerror=report|ignore|stop]
 *   --device virtio-blk-pci,drive=ID[,id=DEVID][,serial=S][,write-cache=on|off]
 *            [,logical_block_size=N][,discard=unmap|ignore]
 *            [,werror=auto|enospc|report|ignore|stop][,rerror=auto|report|ignore|stop]
 * A comma inside a value is written twice (",,"), as QEMU has it.  Raw
 * images only (format=raw), one disk.  --drive's cache= maps as QEMU's:
 * none is cache.direct=on, writethrough is write-cache=off, directsync
 * both.  werror/rerror (dev/blk.h): the device's win over the drive's
 * (auto, --device only: the drive's); defaults enospc and report, as
 * QEMU's; rerror=enospc is refused, as QEMU's --drive refuses it.  Every
 * error names the option and the value it refuses; the image
 * itself is opened and checked later, by the VM (kvm/vm_blk.h). */
#ifndef KMIG_CTL_BLK_OPTS_H
#define KMIG_CTL_BLK_OPTS_H

#include <stdbool.h>
#include <stddef.h>

#include "base/log.h"
#include "kvm/vm.h"

struct blk_opts {
	bool have_drive, have_device;
	int drive_werror, drive_rerror;   /* enum blk_on_error; -1: not given */
	int device_werror, device_rerror; /* -1: not given (or auto) */
	char drive_opt[12];          /* "--blockdev" or "--drive" */
	char device_drive[32];       /* --device ...,drive= */
	int write_cache;             /* -1: not given */
	int discard;                 /* -1: not given */
	struct vm_blk_config dev;
};

void blk_opts__init(struct blk_opts *o);
int blk_opts__blockdev(struct blk_opts *o, const char *spec, char *err, size_t errlen) KMIG_MUST_CHECK;
int blk_opts__drive(struct blk_opts *o, const char *spec, char *err, size_t errlen) KMIG_MUST_CHECK;
/* spec starts with "virtio-blk-pci". */
int blk_opts__device(struct blk_opts *o, const char *spec, char *err, size_t errlen) KMIG_MUST_CHECK;
/* Whether a --device spec is for this module. */
bool blk_opts__is_device(const char *spec);
/* Checks the pair and fills the VM's configuration; *on false when
 * neither was given. */
int blk_opts__finish(const struct blk_opts *o, struct vm_blk_config *out, bool *on, char *err,
		     size_t errlen) KMIG_MUST_CHECK;

#endif
