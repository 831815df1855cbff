/* QMP commands that pass descriptors, as QEMU names them: `getfd
 * {"fdname"}` keeps the descriptor the client sent with SCM_RIGHTS (on
 * the command's own bytes or before them) under fdname, replacing one of
 * that name; `closefd {"fdname"}` closes it.  A migration's URI `fd:NAME`
 * (migrate, migrate-incoming) takes it from there.  Errors as QEMU's: "No
 * file descriptor supplied via SCM_RIGHTS", "File descriptor named 'x'
 * not found", "Parameter 'fdname' expects a name not starting with a
 * digit". */
#ifndef KMIG_CTL_FD_CMDS_H
#define KMIG_CTL_FD_CMDS_H

#include "base/log.h"

struct control;

/* Registers the commands (loop thread, at start-up). */
int control__register_fds(struct control *c) KMIG_MUST_CHECK;

#endif
