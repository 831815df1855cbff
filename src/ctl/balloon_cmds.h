/* QMP commands of the balloon, as QEMU names them: `balloon {"value":
 * bytes}` (the guest's desired memory size) and `query-balloon` ->
 * {"actual": bytes}; event BALLOON_CHANGE {"actual"} when the driver
 * reports a new size.  Without --balloon both commands fail with
 * DeviceNotActive, as in QEMU. */
#ifndef KMIG_CTL_BALLOON_CMDS_H
#define KMIG_CTL_BALLOON_CMDS_H

#include "base/log.h"

struct control;

/* Registers the commands (loop thread, at start-up). */
int control__register_balloon(struct control *c) KMIG_MUST_CHECK;

#endif
