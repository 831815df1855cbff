/* Which compression each migration link uses (mig/comp.h): the main
 * stream follows x-compression alone; a multifd channel follows QEMU's
 * multifd-compression unless that is none; the level is the algorithm's. */
#include <errno.h>
#include <string.h>

#include "harness.h"
#include "mig/comp.h"

static void t_defaults(struct t *t)
{
	struct mig_comp_params p;
	memset(&p, 0xa5, sizeof(p));
	mig_comp_params__init(&p);
	T_CHECK_EQ(t, mig_comp__stream(&p).kind, PROTO_COMP_NONE);
	T_CHECK_EQ(t, mig_comp__channel(&p).kind, PROTO_COMP_NONE);
	T_CHECK_EQ(t, p.zstd_level, 1);          /* QEMU's defaults */
	T_CHECK_EQ(t, p.zlib_level, 1);
}

static void t_choice(struct t *t)
{
	struct mig_comp_params p;
	mig_comp_params__init(&p);
	p.zstd_level = 7;
	p.zlib_level = 4;
	/* multifd-compression alone: the channels only, as in QEMU */
	p.multifd = PROTO_COMP_ZLIB;
	T_CHECK_EQ(t, mig_comp__stream(&p).kind, PROTO_COMP_NONE);
	T_CHECK_EQ(t, mig_comp__channel(&p).kind, PROTO_COMP_ZLIB);
	T_CHECK_EQ(t, mig_comp__channel(&p).level, 4);
	/* x-compression alone: every link */
	p.multifd = PROTO_COMP_NONE;
	p.stream = PROTO_COMP_ZSTD;
	T_CHECK_EQ(t, mig_comp__stream(&p).kind, PROTO_COMP_ZSTD);
	T_CHECK_EQ(t, mig_comp__stream(&p).level, 7);
	T_CHECK_EQ(t, mig_comp__channel(&p).kind, PROTO_COMP_ZSTD);
	/* both: the channels take multifd-compression */
	p.stream = PROTO_COMP_LZ4;
	p.multifd = PROTO_COMP_ZSTD;
	T_CHECK_EQ(t, mig_comp__stream(&p).kind, PROTO_COMP_LZ4);
	T_CHECK_EQ(t, mig_comp__stream(&p).level, 0);   /* lz4 has no level */
	T_CHECK_EQ(t, mig_comp__channel(&p).kind, PROTO_COMP_ZSTD);
	T_CHECK_EQ(t, mig_comp__channel(&p).level, 7);
	struct mig_comp c = mig_comp__channel(&p);
	T_CHECK(t, proto__comp_level_ok(c.kind, c.level));
}

static void t_names(struct t *t)
{
	enum proto_comp k = PROTO_COMP_NONE;
	const char *const names[] = { "none", "zstd", "lz4", "zlib" };
	for (unsigned i = 0; i < 4; i++) {
		T_CHECK_EQ(t, mig_comp__parse(names[i], false, &k), 0);
		T_CHECK_EQ(t, k, i);
		T_CHECK(t, !strcmp(mig_comp__name(k), names[i]));
	}
	k = PROTO_COMP_ZSTD;
	T_CHECK_EQ(t, mig_comp__parse("lz4", true, &k), -EINVAL);   /* not QEMU's */
	T_CHECK_EQ(t, k, PROTO_COMP_ZSTD);                           /* left as it was */
	T_CHECK_EQ(t, mig_comp__parse("zlib", true, &k), 0);
	T_CHECK_EQ(t, k, PROTO_COMP_ZLIB);
	T_CHECK_EQ(t, mig_comp__parse("gzip", false, &k), -EINVAL);
	T_CHECK_EQ(t, mig_comp__parse("", false, &k), -EINVAL);
	T_CHECK_EQ(t, mig_comp__parse("ZSTD", false, &k), -EINVAL);
	T_CHECK(t, !strcmp(mig_comp__name((enum proto_comp)9), "unknown"));
}

int main(void)
{
	struct t t = {0};
	T_RUN(&t, t_defaults);
	T_RUN(&t, t_choice);
	T_RUN(&t, t_names);
	return T_DONE(&t);
}
