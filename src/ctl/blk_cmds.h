/* QMP commands of the disk, as QEMU names them:
 *   query-block: a list (empty without a disk) of QEMU's BlockInfo:
 *     device (the --drive id, "" with --blockdev), qdev (the device's
 *     id=, or "virtio-blk-pci.0"), locked (false: no tray), removable
 *     (false), io-status ("ok", or "failed" / "nospace" from a failure
 *     with action stop until the VM runs again), inserted {file, node-name, ro, drv "raw",
 *     encrypted, detect_zeroes "off", cache {writeback, direct, no-flush},
 *     image {filename, format "raw", virtual-size}, the throttling fields
 *     at 0, write_threshold 0}; kmig adds x-image-lock ("write", "shared"
 *     or "none": the OFD lock it holds now, dev/blkfile.h), x-active and
 *     x-counters (the device's request counters).
 * It never takes the device lock (dev/blk.h): the counters are atomics and
 * the configuration does not change.
 *
 * The event BLOCK_IO_ERROR {device, node-name, operation "read"/"write",
 * action "report"/"ignore"/"stop", nospace, reason (strerror)} for each
 * request the image failed (werror/rerror, dev/blk.h), with or without a
 * QMP socket; for action stop the control loop then stops a running VM
 * into io-error (STOP), as QEMU does. */
#ifndef KMIG_CTL_BLK_CMDS_H
#define KMIG_CTL_BLK_CMDS_H

#include "base/log.h"

struct control;

struct blk_io_error;

int control__register_blk(struct control *c) KMIG_MUST_CHECK;
/* vm->on_io_error (ctx: the control): any thread. */
void control__on_io_error(void *ctx, const struct blk_io_error *e);

#endif
