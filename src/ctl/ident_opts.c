/* --uuid and --name (ctl/ident_opts.h). */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <uuid/uuid.h>

#include "base/utf8.h"
#include "ctl/ident_opts.h"

int ident_opts__uuid(struct vm_config *c, const char *arg, char *err, size_t errlen)
{
	uuid_t u;
	/* libuuid takes exactly the 36-character form, nothing around it */
	if (strlen(arg) != 36 || uuid_parse(arg, u))
		return utf8__err(err, errlen, -EINVAL, "--uuid %s: not a UUID (expected "
				 "8-4-4-4-12 hex digits, e.g. 5b3c2b5e-3f7a-4c1e-9d2a-0f6e8b1c4a7d)",
				 arg);
	memcpy(c->uuid, u, sizeof(c->uuid));
	c->has_uuid = true;
	return 0;
}

int ident_opts__name(struct vm_config *c, const char *arg, char *err, size_t errlen)
{
	const char *name = strncmp(arg, "guest=", 6) ? arg : arg + 6;
	size_t n = strlen(name);
	if (!n || strchr(name, ','))
		return utf8__err(err, errlen, -EINVAL, "--name %s: expected NAME or guest=NAME "
				 "(not empty, no comma)", arg);
	if (n >= sizeof(c->name))
		return utf8__err(err, errlen, -EINVAL, "--name: longer than %zu bytes",
				 sizeof(c->name) - 1);
	char copy[sizeof(c->name)];
	memcpy(copy, name, n + 1);
	utf8__sanitize(copy);
	if (memcmp(copy, name, n))
		return utf8__err(err, errlen, -EINVAL, "--name %s: not UTF-8 text, or has a "
				 "control character", arg);
	memcpy(c->name, name, n + 1);
	return 0;
}

void ident_opts__uuid_text(const uint8_t u[16], char out[37])
{
	uuid_unparse_lower(u, out);
}
