/* Byte buffers and the splitter that cuts client input into JSON texts. */
#include "ctl/qmp_internal.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int qmp_buf__append(struct qmp_buf *b, const void *p, size_t n)
{
	if (n == 0)
		return 0;
	if (n > SIZE_MAX / 2 - b->len)
		return -ENOMEM;
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		while (cap < b->len + n)
			cap *= 2;
		char *d = realloc(b->data, cap);
		if (!d)
			return -ENOMEM;
		b->data = d;
		b->cap = cap;
	}
	memcpy(b->data + b->len, p, n);
	b->len += n;
	return 0;
}

size_t qmp_buf__compact(struct qmp_buf *b)
{
	size_t moved = b->head;
	if (moved == 0)
		return 0;
	memmove(b->data, b->data + moved, b->len - moved);
	b->len -= moved;
	b->head = 0;
	return moved;
}

void qmp_buf__free(struct qmp_buf *b)
{
	free(b->data);
	memset(b, 0, sizeof(*b));
}

int qmp_split__feed(struct qmp_splitter *s, const void *p, size_t n)
{
	size_t moved = qmp_buf__compact(&s->in);
	s->scan -= moved;
	if (s->in_value)
		s->start -= moved;
	return qmp_buf__append(&s->in, p, n);
}

static void qmp_split__reset(struct qmp_splitter *s)
{
	s->in_value = s->bare = s->in_str = s->esc = false;
	s->depth = 0;
}

static bool qmp_split__is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* Discards bytes through the next newline.  True once it was found. */
static bool qmp_split__skip(struct qmp_splitter *s)
{
	const char *d = s->in.data;
	while (s->scan < s->in.len) {
		if (d[s->scan++] == '\n') {
			s->skip_line = false;
			s->in.head = s->scan;
			return true;
		}
	}
	s->in.head = s->scan;
	return false;
}

/* Error in the current text: drop it and the rest of its line. */
static enum qmp_split_result qmp_split__fail(struct qmp_splitter *s,
					     const char **text,
					     const char *msg)
{
	qmp_split__reset(s);
	s->in.head = s->scan;
	s->skip_line = true;
	*text = msg;
	return QMP_SPLIT_ERROR;
}

/* Looks at one byte inside a bracketed text.  Returns 1 when the text is
 * complete, -1 when nested too deep, 0 otherwise. */
static int qmp_split__container_byte(struct qmp_splitter *s, char c)
{
	if (s->in_str) {
		if (s->esc)
			s->esc = false;
		else if (c == '\\')
			s->esc = true;
		else if (c == '"')
			s->in_str = false;
		return 0;
	}
	switch (c) {
	case '"':
		s->in_str = true;
		return 0;
	case '{':
	case '[':
		return ++s->depth > QMP_MAX_NESTING ? -1 : 0;
	case '}':
	case ']':
		return --s->depth == 0 ? 1 : 0;
	default:
		return 0;
	}
}

static enum qmp_split_result qmp_split__emit(struct qmp_splitter *s,
					     const char **text, size_t *len,
					     size_t end, size_t next)
{
	*text = s->in.data + s->start;
	*len = end - s->start;
	s->scan = next;
	s->in.head = next;
	qmp_split__reset(s);
	return QMP_SPLIT_TEXT;
}

enum qmp_split_result qmp_split__next(struct qmp_splitter *s,
				      const char **text, size_t *len)
{
	const char *d = s->in.data;

	if (s->skip_line && !qmp_split__skip(s))
		return QMP_SPLIT_MORE;
	while (s->scan < s->in.len) {
		size_t i = s->scan++;
		char c = d[i];
		if (!s->in_value) {
			if (qmp_split__is_space(c)) {
				s->in.head = s->scan;
				continue;
			}
			s->in_value = true;
			s->start = i;
			s->bare = !(c == '{' || c == '[');
			s->depth = s->bare ? 0 : 1;
			continue;
		}
		if (s->bare) {
			if (c == '\n')
				return qmp_split__emit(s, text, len, i, i + 1);
			continue;
		}
		int r = qmp_split__container_byte(s, c);
		if (r > 0)
			return qmp_split__emit(s, text, len, i + 1, i + 1);
		if (r < 0)
			return qmp_split__fail(s, text,
					       "JSON parse error, nesting too deep");
	}
	if (s->in_value && s->in.len - s->start > QMP_MAX_INPUT)
		return qmp_split__fail(s, text,
				       "JSON parse error, input too large");
	return QMP_SPLIT_MORE;
}

void qmp_split__free(struct qmp_splitter *s)
{
	qmp_buf__free(&s->in);
	memset(s, 0, sizeof(*s));
}
