#include "base/units.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>

int units__parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	char *end;
	if (!s || !isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno == ERANGE)
		return -ERANGE;
	if (*end)
		return -EINVAL;
	if (v < min || v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

int units__parse_size(const char *s, uint64_t default_unit, uint64_t *out)
{
	char *end;
	if (!s || !isdigit((unsigned char)*s))
		return -EINVAL;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno == ERANGE)
		return -ERANGE;
	uint64_t unit = default_unit;
	switch (toupper((unsigned char)*end)) {
	case '\0': break;
	case 'B': unit = 1; break;
	case 'K': unit = KiB; break;
	case 'M': unit = MiB; break;
	case 'G': unit = GiB; break;
	case 'T': unit = 1024 * GiB; break;
	default: return -EINVAL;
	}
	if (*end) {
		end++;
		if (toupper((unsigned char)*end) == 'I' && end[-1] != 'B' &&
		    toupper((unsigned char)end[1]) == 'B')
			end += 2;
		else if (toupper((unsigned char)*end) == 'B' && end[-1] != 'B')
			end++;
		if (*end)
			return -EINVAL;
	}
	if (unit && v > UINT64_MAX / unit)
		return -ERANGE;
	*out = v * unit;
	return 0;
}
