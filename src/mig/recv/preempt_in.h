/* postcopy-preempt, destination side (docs/protocol.md "Post-copy
 * preempt").
 *
 * The source announces the channel with PREEMPT on the main stream during
 * setup and connects it at once; the connection starts with its own
 * PREEMPT carrying the same session (and, under TLS, comes from the main
 * stream's client).  After the switch it carries the pages this side asked
 * for, which a thread of its own places with the post-copy hooks while the
 * main stream's thread places the background push; the source ends it
 * with an END without checksum before the main stream's END, and the main
 * stream's END waits for it (preempt_in__wait_end), so no page sent on it
 * is missing when the destination checks and finishes.
 *
 * A failure of the channel becomes the main stream's error, and its
 * reading is shut down: a broken link there (-ENOLINK) pauses post-copy
 * as a lost main link would, and before the switch fails the migration
 * with the main connection still able to carry RP_FAIL; anything else (a
 * bad record, a page it cannot place) fails it with -EPROTO.  A pause
 * closes it; the recovery's new link reopens it (preempt_in__rearm, then
 * add again once the resumed stream's PREEMPT comes).
 *
 * Threads: add, wait_end and close are the incoming thread's; cancel and
 * pages any thread's. */
#ifndef KMIG_MIG_PREEMPT_IN_H
#define KMIG_MIG_PREEMPT_IN_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/log.h"
#include "mig/recv/recv.h"
#include "mig/wire/stream.h"
#include "mig/wire/tls.h"

#define PREEMPT_HANDSHAKE_MS 10000   /* TLS and PREEMPT on the new connection */

struct preempt_in {
	struct mig_stream stream;    /* the listener accepts into it */
	struct mig_recv recv;
	struct mig_stream *main;     /* its read side is shut down on a failure here */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool open;                   /* under lock: stream holds a connection */
	bool active;                 /* the thread runs or ran on this connection */
	bool cancelled, closing;     /* under lock */
	bool ended, failed;          /* under lock: END came; the thread stopped on err */
	bool link;                   /* under lock, with failed: the connection broke */
	int err;
	char error[256];             /* under lock, with failed: what happened */
	pthread_t thread;
	atomic_ullong pages;         /* placed from this channel, all its connections */
	struct mig_recv_stats done;  /* the connections closed (pages, zero_pages,
				      * bytes, records, postcopy_pages) */
};

void preempt_in__init(struct preempt_in *p, struct mig_stream *main);
/* A connection was just accepted into p->stream: its TLS handshake (tls
 * not NULL), then PREEMPT with session within PREEMPT_HANDSHAKE_MS, and
 * under TLS the client peer (unless peer is ""); then the thread starts,
 * placing with ops' place_page and place_zero.  -EPROTO: the connection
 * is not this migration's (closed; the caller may take another);
 * PREEMPT_IN_CHANNEL: without TLS, it begins with a multifd channel's
 * CHANNEL record (left unread, the connection still in p->stream for the
 * caller to hold or close); other -errno: the channel cannot work; err
 * says why. */
#define PREEMPT_IN_CHANNEL 1
int preempt_in__add(struct preempt_in *p, const struct tls_config *tls, const char *peer,
		    const uint8_t session[PROTO_SESSION_LEN], uint32_t channels,
		    const struct proto_ram *ram, const struct mig_recv_ops *ops, char *err,
		    size_t errlen) KMIG_MUST_CHECK;
/* The main stream's END in post-copy: waits up to timeout_ms for the
 * channel's END.  0 also when there is no channel (never opened, or
 * closed at a pause); -EPROTO when it failed other than by its link;
 * else -errno (-ECONNRESET: its link broke; -ETIMEDOUT; -ECANCELED: a
 * pause or cancel), err set. */
int preempt_in__wait_end(struct preempt_in *p, int timeout_ms, char *err, size_t errlen)
	KMIG_MUST_CHECK;
/* After a pause closed it: ready for the recovery's connection (the
 * pause's cancel forgotten; a cancel from now on counts). */
void preempt_in__rearm(struct preempt_in *p);
/* Makes a blocked read or handshake return (cancel, migrate-pause). */
void preempt_in__cancel(struct preempt_in *p);
/* Stops the thread and closes the connection (a pause, the end); the
 * count of pages stays. */
void preempt_in__close(struct preempt_in *p);
void preempt_in__free(struct preempt_in *p);
/* What every connection of the channel brought, once closed: pages, zero
 * pages, bytes (records' headers and payloads). */
void preempt_in__totals(const struct preempt_in *p, uint64_t *pages, uint64_t *zero,
			uint64_t *bytes);

#endif
