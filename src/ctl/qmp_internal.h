/* Internals of the QMP server shared by src/ctl/qmp*.c and its unit test.
 * Nothing here is thread-safe; everything runs on the loop thread. */
#ifndef KMIG_CTL_QMP_INTERNAL_H
#define KMIG_CTL_QMP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>

#include "ctl/qmp.h"

/* A growable byte buffer; bytes before `head` are consumed. */
struct qmp_buf {
	char *data;
	size_t head, len, cap;
};

KMIG_MUST_CHECK int qmp_buf__append(struct qmp_buf *b, const void *p, size_t n);
/* Drops consumed bytes, moving the rest to the front; returns how many
 * bytes moved down (to adjust offsets into the buffer). */
size_t qmp_buf__compact(struct qmp_buf *b);
static inline size_t qmp_buf__pending(const struct qmp_buf *b)
{
	return b->len - b->head;
}
void qmp_buf__free(struct qmp_buf *b);

/* Cuts an input byte stream into single JSON texts without parsing them:
 * a text starting with '{' or '[' ends at its matching bracket (strings and
 * escapes are skipped), so requests need no newline and several may share a
 * read; anything else at top level (garbage, scalars) runs to the end of the
 * line.  A text over QMP_MAX_INPUT bytes or QMP_MAX_NESTING deep is an error,
 * after which input is discarded up to the next newline. */
struct qmp_splitter {
	struct qmp_buf in;
	size_t scan;            /* next byte to look at */
	size_t start;           /* first byte of the current text */
	int depth;
	bool in_value, bare, in_str, esc, skip_line;
};

enum qmp_split_result {
	QMP_SPLIT_MORE,         /* need more bytes */
	QMP_SPLIT_TEXT,         /* *text and *len hold one text */
	QMP_SPLIT_ERROR,        /* *text is an error message (static) */
};

/* Appends bytes; invalidates texts returned before.  0 or -ENOMEM. */
KMIG_MUST_CHECK int qmp_split__feed(struct qmp_splitter *s, const void *p,
				    size_t n);
/* Returns the next text or error; call until QMP_SPLIT_MORE after a feed.
 * A returned text stays valid until the next qmp_split__feed(). */
enum qmp_split_result qmp_split__next(struct qmp_splitter *s,
				      const char **text, size_t *len);
void qmp_split__free(struct qmp_splitter *s);

/* Command table and request handling (qmp_dispatch.c). */
struct qmp_command {
	char name[QMP_MAX_NAME];
	qmp_handler fn;
	void *ctx;
};

struct qmp_dispatch {
	struct qmp_command *cmds;
	size_t n, cap;
	json_t *version;        /* the query-version reply */
};

/* Sets up the table with query-commands and query-version. */
KMIG_MUST_CHECK int qmp_dispatch__init(struct qmp_dispatch *d,
				       const struct qmp_version *v);
void qmp_dispatch__fini(struct qmp_dispatch *d);
KMIG_MUST_CHECK int qmp_dispatch__register(struct qmp_dispatch *d,
					   const char *name, qmp_handler fn,
					   void *ctx);
/* The greeting object (new reference, NULL on ENOMEM). */
json_t *qmp_dispatch__greeting(const struct qmp_dispatch *d);
/* Handles one request text of a client whose negotiation state is
 * *negotiated (updated by qmp_capabilities).  Returns the reply object (new
 * reference; NULL only on ENOMEM). */
json_t *qmp_dispatch__text(struct qmp_dispatch *d, const char *text,
			   size_t len, bool *negotiated);
/* {"error": {"class": C, "desc": D}} plus "id" if ID is not NULL. */
json_t *qmp_dispatch__error_reply(const struct qmp_error *err, json_t *id);

#endif
