/* QEMU's options that name a VM, as kmig run takes them:
 *   --uuid UUID            (QEMU's -uuid; 36 characters, 8-4-4-4-12 hex)
 *   --name NAME | --name guest=NAME   (QEMU's -name)
 * They fill the vm_config's has_uuid/uuid and name.  QMP's query-uuid and
 * query-name report them; the capability validate-uuid sends the UUID in
 * the migration stream's START, and a destination with another UUID
 * refuses the stream (docs/usage.md, "A destination started paused").
 * A name must be valid UTF-8 without control characters, at most
 * VM_NAME_MAX - 1 bytes.  Every error names the option (and the value, but
 * for a name too long to quote). */
#ifndef KMIG_CTL_IDENT_OPTS_H
#define KMIG_CTL_IDENT_OPTS_H

#include <stddef.h>
#include <stdint.h>

#include "base/log.h"
#include "kvm/vm.h"

int ident_opts__uuid(struct vm_config *c, const char *arg, char *err,
		     size_t errlen) KMIG_MUST_CHECK;
int ident_opts__name(struct vm_config *c, const char *arg, char *err,
		     size_t errlen) KMIG_MUST_CHECK;
/* UUID text (lower case, 36 characters and NUL) of u. */
void ident_opts__uuid_text(const uint8_t u[16], char out[37]);

#endif
