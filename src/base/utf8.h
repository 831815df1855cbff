/* UTF-8 validity for text kmig builds from outside input.
 *
 * Error messages quote what a client, a peer or a guest sent, and are cut
 * to fixed buffers; either can leave bytes that are not UTF-8, and JSON
 * (jansson) refuses such strings, so a reply or event carrying them would
 * be lost.  utf8__sanitize makes any NUL-terminated string valid UTF-8 in
 * place: each byte that does not start a complete, shortest-form sequence
 * of a Unicode scalar value (no surrogates, nothing above U+10FFFF) becomes
 * '?'.  So does each control character (C0, DEL and C1: U+0080..U+009F,
 * two '?'), so a peer's text cannot move a terminal's cursor or forge a
 * line of kmig's log.  Other text is left as it is; the length never
 * changes.
 */
#ifndef KMIG_BASE_UTF8_H
#define KMIG_BASE_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* Length of the valid sequence starting at s (at most n bytes), 0 if the
 * bytes there are not one. */
size_t utf8__seq_len(const unsigned char *s, size_t n);
/* True when the n bytes at s are valid UTF-8. */
bool utf8__valid(const char *s, size_t n);
/* Replaces every byte that is not part of a valid sequence, and every
 * control character, by '?'. */
void utf8__sanitize(char *s);
/* printf-style message into err[0..errlen) (nothing if err is NULL or
 * errlen 0), made valid UTF-8; returns ret, for `return utf8__err(...)`. */
int utf8__err(char *err, size_t errlen, int ret, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

#endif
