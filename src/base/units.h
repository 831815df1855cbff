/* Parsing of sizes and numbers from the command line and the control socket. */
#ifndef KMIG_BASE_UNITS_H
#define KMIG_BASE_UNITS_H

#include <stdint.h>

#include "base/log.h"

#define KiB (1024ull)
#define MiB (1024ull * KiB)
#define GiB (1024ull * MiB)

/* Parses "512M", "1G", "1073741824", "2g", "64k" (suffixes K M G T, powers of
 * 1024; a bare number is bytes unless default_unit says otherwise).
 * Returns 0, -EINVAL on syntax errors, -ERANGE on overflow. */
int units__parse_size(const char *s, uint64_t default_unit, uint64_t *out) KMIG_MUST_CHECK;
/* Parses a whole unsigned decimal number within [min, max]. */
int units__parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out) KMIG_MUST_CHECK;

#endif
