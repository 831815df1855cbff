/* UTF-8 validity; see utf8.h. */
#include "base/utf8.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

size_t utf8__seq_len(const unsigned char *s, size_t n)
{
	unsigned c, len, min;
	unsigned long cp;

	if (n == 0)
		return 0;
	c = s[0];
	if (c < 0x80)
		return 1;
	if (c >= 0xc2 && c <= 0xdf)
		len = 2, min = 0x80, cp = c & 0x1f;
	else if (c >= 0xe0 && c <= 0xef)
		len = 3, min = 0x800, cp = c & 0x0f;
	else if (c >= 0xf0 && c <= 0xf4)
		len = 4, min = 0x10000, cp = c & 0x07;
	else
		return 0;       /* continuation byte, 0xc0/0xc1, 0xf5..0xff */
	if (n < len)
		return 0;
	for (unsigned i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3f);
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

bool utf8__valid(const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;
	for (size_t i = 0; i < n;) {
		size_t l = utf8__seq_len(p + i, n - i);
		if (!l)
			return false;
		i += l;
	}
	return true;
}

void utf8__sanitize(char *s)
{
	unsigned char *p = (unsigned char *)s;
	size_t n = strlen(s);
	for (size_t i = 0; i < n;) {
		size_t l = utf8__seq_len(p + i, n - i);
		bool c0 = l == 1 && (p[i] < 0x20 || p[i] == 0x7f);
		bool c1 = l == 2 && p[i] == 0xc2 && p[i + 1] < 0xa0;   /* U+0080..U+009F */
		if (!l || c0 || c1) {
			memset(p + i, '?', l ? l : 1);
			i += l ? l : 1;
			continue;
		}
		i += l;
	}
}

int utf8__err(char *err, size_t errlen, int ret, const char *fmt, ...)
{
	if (err && errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
		utf8__sanitize(err);
	}
	return ret;
}
