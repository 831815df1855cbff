/* QEMU-style option strings, "key=value,key=value", as kmig run's
 * --drive, --blockdev, --device, --netdev and --balloon take them.  A
 * comma inside a value is written ",," (QEMU's escape); a trailing comma
 * is ignored, any other empty pair refused.  Every error names the option (opt, e.g.
 * "--drive") and the spec or value it refuses, in err.  Pure string
 * work: no allocation, specs longer than KVOPTS_SPEC_MAX are refused. */
#ifndef KMIG_CTL_KVOPTS_H
#define KMIG_CTL_KVOPTS_H

#include <stdbool.h>
#include <stddef.h>

#include "base/log.h"

#define KVOPTS_SPEC_MAX 2048

/* One pair: 0, or -errno with err set. */
typedef int (*kvopts_fn)(void *ctx, const char *key, const char *val, char *err,
			 size_t errlen);

/* Each pair of spec through fn, in order; the first failing pair ends it
 * (its return value is returned).  A pair without '=' or with an empty
 * key is -EINVAL. */
int kvopts__split(const char *opt, const char *spec, kvopts_fn fn, void *ctx, char *err,
		  size_t errlen) KMIG_MUST_CHECK;
/* spec's part after a leading "DRIVER," (or "" for spec == DRIVER); NULL
 * if spec does not start with that driver name. */
const char *kvopts__after_driver(const char *spec, const char *driver);
/* val into dst[cap]: not empty and shorter than cap, else -EINVAL. */
int kvopts__copy(char *dst, size_t cap, const char *opt, const char *key, const char *val,
		 char *err, size_t errlen) KMIG_MUST_CHECK;
/* "on" or "off" into *out, else -EINVAL (*out untouched). */
int kvopts__onoff(const char *opt, const char *key, const char *val, bool *out, char *err,
		  size_t errlen) KMIG_MUST_CHECK;

#endif
