/* Which compression each migration link uses, from the parameters that
 * name it.
 *
 * Two parameters choose an algorithm, as in QEMU plus one of kmig's:
 *   x-compression        PAGES records on every link (main stream and
 *                        multifd channels): none, zstd, lz4 or zlib;
 *   multifd-compression  QEMU's: PAGES records on the multifd channels
 *                        only: none, zlib or zstd.  Without the multifd
 *                        capability it changes nothing, as in QEMU.
 * A channel uses multifd-compression unless it is none, else
 * x-compression.  The level is the algorithm's: multifd-zstd-level
 * (0..20) for zstd, multifd-zlib-level (0..9) for zlib, whichever
 * parameter chose the algorithm; lz4 has none.  Pure logic, no I/O. */
#ifndef KMIG_MIG_COMP_H
#define KMIG_MIG_COMP_H

#include <stdbool.h>

#include "mig/wire/proto.h"

struct mig_comp {
	enum proto_comp kind;
	int level;              /* proto__comp_level_ok(kind, level) */
};

struct mig_comp_params {
	enum proto_comp stream;         /* x-compression */
	enum proto_comp multifd;        /* multifd-compression: NONE, ZLIB or ZSTD */
	int zstd_level, zlib_level;     /* multifd-zstd-level, multifd-zlib-level */
};

/* QEMU's defaults: no compression, both levels 1. */
void mig_comp_params__init(struct mig_comp_params *p);
/* The main stream's compression. */
struct mig_comp mig_comp__stream(const struct mig_comp_params *p);
/* A multifd channel's compression. */
struct mig_comp mig_comp__channel(const struct mig_comp_params *p);

/* Name of a kind: "none", "zstd", "lz4", "zlib". */
const char *mig_comp__name(enum proto_comp kind);
/* Parses a name into *kind; multifd_only refuses lz4 (QEMU's
 * MultiFDCompression has none, zlib and zstd).  0 or -EINVAL. */
int mig_comp__parse(const char *name, bool multifd_only, enum proto_comp *kind);

#endif
