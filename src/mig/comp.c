/* The compression of each migration link; see comp.h. */
#include "mig/comp.h"

#include <errno.h>
#include <string.h>

static const char *const comp_names[] = {
	[PROTO_COMP_NONE] = "none", [PROTO_COMP_ZSTD] = "zstd",
	[PROTO_COMP_LZ4] = "lz4", [PROTO_COMP_ZLIB] = "zlib",
};
#define COMP_KINDS (sizeof(comp_names) / sizeof(comp_names[0]))

void mig_comp_params__init(struct mig_comp_params *p)
{
	p->stream = PROTO_COMP_NONE;
	p->multifd = PROTO_COMP_NONE;
	p->zstd_level = PROTO_LEVEL_DEFAULT;
	p->zlib_level = PROTO_LEVEL_DEFAULT;
}

static struct mig_comp mig_comp__of(const struct mig_comp_params *p, enum proto_comp kind)
{
	int level = kind == PROTO_COMP_ZSTD ? p->zstd_level :
		    kind == PROTO_COMP_ZLIB ? p->zlib_level : 0;
	return (struct mig_comp){ kind, level };
}

struct mig_comp mig_comp__stream(const struct mig_comp_params *p)
{
	return mig_comp__of(p, p->stream);
}

struct mig_comp mig_comp__channel(const struct mig_comp_params *p)
{
	return mig_comp__of(p, p->multifd != PROTO_COMP_NONE ? p->multifd : p->stream);
}

const char *mig_comp__name(enum proto_comp kind)
{
	return (unsigned)kind < COMP_KINDS ? comp_names[kind] : "unknown";
}

int mig_comp__parse(const char *name, bool multifd_only, enum proto_comp *kind)
{
	for (unsigned k = 0; k < COMP_KINDS; k++) {
		if (strcmp(name, comp_names[k]))
			continue;
		if (multifd_only && k == PROTO_COMP_LZ4)
			return -EINVAL;
		*kind = (enum proto_comp)k;
		return 0;
	}
	return -EINVAL;
}
