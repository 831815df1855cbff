#include "ctl/kvopts.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* The next pair of *p into kv[KVOPTS_SPEC_MAX] (",," kept as one comma);
 * *p moves past it and its comma.  -EINVAL if it does not fit. */
static int kvopts__next(const char **p, char *kv)
{
	size_t n = 0;
	const char *s = *p;
	for (; *s && !(s[0] == ',' && s[1] != ','); s++) {
		if (s[0] == ',')
			s++;                    /* ",," */
		if (n + 1 >= KVOPTS_SPEC_MAX)
			return -EINVAL;
		kv[n++] = *s;
	}
	kv[n] = 0;
	*p = *s ? s + 1 : s;
	return 0;
}

int kvopts__split(const char *opt, const char *spec, kvopts_fn fn, void *ctx, char *err,
		  size_t errlen)
{
	char kv[KVOPTS_SPEC_MAX];
	const char *p = spec;
	while (*p) {
		if (kvopts__next(&p, kv)) {
			snprintf(err, errlen, "%s %.40s...: too long", opt, spec);
			return -EINVAL;
		}
		if (!kv[0] && !*p)
			continue;                   /* a trailing comma */
		if (!kv[0]) {
			snprintf(err, errlen, "%s %s: an empty property", opt, spec);
			return -EINVAL;
		}
		char *v = strchr(kv, '=');
		if (!v || v == kv) {
			snprintf(err, errlen, "%s %s: \"%s\" is not key=value", opt, spec, kv);
			return -EINVAL;
		}
		*v++ = 0;
		int rc = fn(ctx, kv, v, err, errlen);
		if (rc)
			return rc;
	}
	return 0;
}

const char *kvopts__after_driver(const char *spec, const char *driver)
{
	size_t n = strlen(driver);
	if (strncmp(spec, driver, n) || (spec[n] && spec[n] != ','))
		return NULL;
	return spec[n] ? spec + n + 1 : spec + n;
}

int kvopts__copy(char *dst, size_t cap, const char *opt, const char *key, const char *val,
		 char *err, size_t errlen)
{
	size_t n = strlen(val);
	if (!n || n >= cap) {
		snprintf(err, errlen, "%s: %s=%s: empty or longer than %zu bytes", opt, key, val,
			 cap - 1);
		return -EINVAL;
	}
	memcpy(dst, val, n + 1);
	return 0;
}

int kvopts__onoff(const char *opt, const char *key, const char *val, bool *out, char *err,
		  size_t errlen)
{
	if (strcmp(val, "on") && strcmp(val, "off")) {
		snprintf(err, errlen, "%s: %s=%s: expected on or off", opt, key, val);
		return -EINVAL;
	}
	*out = !strcmp(val, "on");
	return 0;
}
