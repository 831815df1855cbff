/* Named descriptors: what QMP `getfd` keeps under a name until `closefd`
 * or a migration's `fd:NAME` URI takes it.
 *
 * Pure bookkeeping, no I/O but close(2).  The table is zero-initialised
 * (all slots free) and used by the QMP loop thread only.  Names are 1 to
 * FD_NAMES_NAME_MAX - 1 bytes of printable ASCII and, as QEMU requires, do
 * not begin with a digit (a number in fd:N means an inherited
 * descriptor). */
#ifndef KMIG_CTL_FDNAMES_H
#define KMIG_CTL_FDNAMES_H

#include <stdbool.h>

#include "base/log.h"

#define FD_NAMES_MAX      16
#define FD_NAMES_NAME_MAX 64            /* with the NUL: as MIG_FD_NAME_MAX */

struct fd_names {
	struct {
		bool used;
		int fd;
		char name[FD_NAMES_NAME_MAX];
	} slot[FD_NAMES_MAX];
};

/* 0 if name is acceptable, else -EINVAL with why (a static string). */
int fd_names__check(const char *name, const char **why) KMIG_MUST_CHECK;
/* Keeps fd under name (the table owns it from now on); a descriptor kept
 * under the same name before is closed.  -EINVAL (bad name) or -ENOSPC
 * (table full): fd is not taken, the caller still owns it. */
int fd_names__put(struct fd_names *t, const char *name, int fd) KMIG_MUST_CHECK;
/* Hands the descriptor kept under name to the caller and forgets it:
 * the fd, or -ENOENT. */
int fd_names__take(struct fd_names *t, const char *name);
/* Closes and forgets it: 0 or -ENOENT. */
int fd_names__close(struct fd_names *t, const char *name);
/* Closes every descriptor kept. */
void fd_names__destroy(struct fd_names *t);

#endif
