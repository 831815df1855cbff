/* Connections that spoke before their turn (the destination's side).
 *
 * A source opens its main stream, then its postcopy-preempt channel, then
 * its multifd channels, each once the one before has sent its first
 * record, and never waits for this side to take it.  On a network that
 * keeps no order between connections (a lost segment sent again, a relay)
 * a later one may speak first.  The destination takes the first
 * connection with bytes for the one it waits for; such a connection used
 * to be dropped as a stray, and the migration then failed for the want of
 * it.  Instead a plain connection that begins with PREEMPT or CHANNEL is
 * held here, that record unread, until its turn (docs/protocol.md,
 * "Connections that speak before their turn").  Under TLS the order
 * holds by itself: each channel's handshake needs this side to have
 * taken the connection before it.
 *
 * Threads: the incoming thread's only. */
#ifndef KMIG_MIG_EARLY_H
#define KMIG_MIG_EARLY_H

#include <stdbool.h>
#include <stdint.h>

#include "base/log.h"
#include "mig/wire/proto.h"
#include "mig/wire/stream.h"

#define MIG_EARLY_MAX (1 + PROTO_MAX_CHANNELS)  /* the preempt channel, the multifd ones */

struct mig_early {
	unsigned n;
	uint32_t type[MIG_EARLY_MAX];           /* the record each begins with */
	struct mig_stream stream[MIG_EARLY_MAX];  /* oldest first */
};

/* A zeroed struct mig_early is empty. */

/* Moves s, whose first record (unread) is of `type`, in: 0, or 1 when
 * MIG_EARLY_MAX were held already and the oldest was closed to make room
 * (as a listener pushes out its oldest silent connection: a peer that
 * fills the set cannot keep a source's connections out). */
int mig_early__hold(struct mig_early *e, struct mig_stream *s, uint32_t type) KMIG_MUST_CHECK;
/* Moves the oldest connection held of `type` into s (closed or never
 * opened): true, or false when none is held. */
bool mig_early__take(struct mig_early *e, uint32_t type, struct mig_stream *s);
/* Closes every connection still held; returns how many there were. */
unsigned mig_early__drop(struct mig_early *e);

#endif
