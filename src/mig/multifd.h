/* Parallel migration channels (multifd).  The main stream carries START,
 * CHANNEL{0, n}, SYNC, STATE and END; n extra connections (each opened
 * with CHANNEL{i, n}) carry the page records.
 *
 * Source: one worker thread per channel takes batches of page offsets
 * from its queue, reads the pages (after the sync that reported them),
 * compresses them if asked, and writes the records.  At the end of every
 * pass the migration thread queues SYNC(round) on every channel and writes
 * it on the main stream.
 *
 * Destination: one thread per channel applies its records; on SYNC(r) it
 * waits at a barrier until every channel and the main stream have reached
 * round r, so a page sent again in a later round on another channel can
 * never be overwritten by older data. */
#ifndef KMIG_MIG_MULTIFD_H
#define KMIG_MIG_MULTIFD_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/log.h"
#include "mig/comp.h"
#include "mig/wire/proto.h"
#include "mig/recv/recv.h"
#include "mig/threads.h"
#include "mig/wire/stream.h"
#include "mig/wire/tls.h"

#define MULTIFD_QUEUE 8              /* batches queued per channel */
#define MULTIFD_BATCH 4096           /* offsets per batch (zero batches) */

struct multifd_job {
	uint32_t type;               /* PROTO_PAGES, PROTO_ZERO or PROTO_SYNC */
	uint32_t block, count;
	uint64_t round;
	uint64_t offsets[MULTIFD_BATCH];
};

struct multifd_send_chan {
	struct multifd_send *mf;
	unsigned index;              /* 1..n */
	struct mig_stream stream;
	_Atomic uint64_t comp_saved; /* page bytes less record bytes of the compressed PAGES written */
	bool open;
	pthread_t thread;
	bool thread_running;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct multifd_job *jobs;    /* ring of MULTIFD_QUEUE */
	unsigned head, tail;         /* under lock */
	bool stop;
	uint8_t *rec;                /* record buffer */
	struct proto_codec codec;
};

struct multifd_send {
	_Atomic unsigned n;          /* channels fully open */
	unsigned next;               /* round-robin */
	struct mig_comp comp;
	const struct proto_ram *ram;
	atomic_int err;              /* first worker error */
	char why[256];               /* its channel's message, once why_set */
	atomic_bool why_set;
	atomic_bool stop;            /* shutdown: connects in progress give up */
	const struct tls_config *tls; /* each channel's TLS, NULL = plain */
	uint8_t session[PROTO_SESSION_LEN]; /* in every channel's CHANNEL record */
	struct mig_threads *threads; /* optional, set before open (close clears it): each
				      * worker lists itself there while it runs */
	bool zero_copy;              /* set before open (close clears it): the pages of
				      * uncompressed PAGES records go with MSG_ZEROCOPY
				      * (capability zero-copy-send; plain TCP only) */
	_Atomic uint64_t zc_missed;  /* SYNCs after which a channel's kernel had copied
				      * some of its zero-copy sends after all */
	struct multifd_send_chan chan[PROTO_MAX_CHANNELS];
};

/* Connects n channels to uri (each with a TLS handshake when tls is not
 * NULL, each CHANNEL record with session, as the main stream's announced)
 * and starts their workers.  mf must be zeroed (as
 * multifd_send__close leaves it); ram and tls must outlive the channels.
 * err gets a reason on failure; multifd_send__close cleans up either way. */
int multifd_send__open(struct multifd_send *mf, unsigned n, const char *uri,
		       const struct proto_ram *ram, struct mig_comp comp, uint64_t rate,
		       const struct tls_config *tls, const uint8_t session[PROTO_SESSION_LEN],
		       char *err, size_t errlen) KMIG_MUST_CHECK;
/* Queues a batch (blocks while the chosen channel's queue is full). */
int multifd_send__queue(struct multifd_send *mf, uint32_t type, uint32_t block,
			uint32_t count, const uint64_t *offsets) KMIG_MUST_CHECK;
/* Queues SYNC(round) on every channel. */
int multifd_send__sync(struct multifd_send *mf, uint64_t round) KMIG_MUST_CHECK;
/* Waits until every queue is empty and flushed. */
int multifd_send__drain(struct multifd_send *mf) KMIG_MUST_CHECK;
void multifd_send__set_rate(struct multifd_send *mf, uint64_t rate);
/* Bytes the channels' sockets hold unsent (mig_stream__outq summed; a
 * worker's batch still in its buffer is not counted: drain first). */
size_t multifd_send__unsent(struct multifd_send *mf);
uint64_t multifd_send__bytes(struct multifd_send *mf);
/* QEMU's dirty-sync-missed-zero-copy: per channel and SYNC, how often the
 * kernel copied zero-copy sends after all (0 without zero_copy). */
uint64_t multifd_send__zc_missed(struct multifd_send *mf);
/* The first worker error's message ("multifd channel N: ..."), or "". */
const char *multifd_send__why(struct multifd_send *mf);
/* What compression saved on the channels: for each PAGES record written,
 * its pages' 4096 bytes each less the record's size when that is less. */
uint64_t multifd_send__comp_saved(struct multifd_send *mf);
/* Makes blocked workers return (cancel); safe from any thread. */
void multifd_send__shutdown(struct multifd_send *mf);
/* Stops the workers and closes the channels. */
void multifd_send__close(struct multifd_send *mf);

struct multifd_recv_chan {
	struct multifd_recv *mf;
	unsigned index;              /* 1..n, from its CHANNEL record */
	struct mig_stream stream;
	struct mig_recv recv;
	pthread_t thread;
	bool thread_running;
};

struct multifd_recv {
	unsigned n;
	const struct proto_ram *ram;
	struct mig_recv_ops ops;     /* page hooks shared by every channel */
	struct mig_stream *main;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint64_t arrived[PROTO_MAX_CHANNELS + 1]; /* per stream: rounds reached */
	uint64_t released;           /* rounds every stream has passed */
	unsigned accepted;           /* connections taken so far */
	struct mig_stream *pending;  /* under lock: accepted, handshake not read yet */
	const struct tls_config *tls; /* each channel's TLS, NULL = plain */
	uint8_t session[PROTO_SESSION_LEN]; /* the main stream's CHANNEL{0, n}'s */
	char peer[256];              /* with TLS: the main stream's client, "" = any */
	bool failed, done;
	bool closed;                 /* multifd_recv__finish ran (the main thread's) */
	char error[256];
	struct multifd_recv_chan chan[PROTO_MAX_CHANNELS];
};

/* main: the main stream, whose reading stops if a channel fails. */
void multifd_recv__init(struct multifd_recv *mf, const struct proto_ram *ram,
			const struct mig_recv_ops *ops, struct mig_stream *main);
/* The stream to accept the next channel connection into (NULL when all
 * PROTO_MAX_CHANNELS are taken). */
struct mig_stream *multifd_recv__next_stream(struct multifd_recv *mf);
/* Takes the connection just accepted into next_stream: reads its CHANNEL
 * record (within MULTIFD_HANDSHAKE_MS, and cancellable), which must carry
 * mf->session (and, with TLS and mf->peer set, come from that client),
 * and starts its thread.  err gets a reason on failure: -EPROTO when the connection is
 * not a channel of this migration (closed; the caller may wait for
 * another), -ECANCELED after multifd_recv__cancel, else -errno. */
#define MULTIFD_HANDSHAKE_MS 10000
int multifd_recv__add(struct multifd_recv *mf, unsigned expected, char *err,
		      size_t errlen) KMIG_MUST_CHECK;
/* The main stream reached SYNC(round): waits until every channel has.
 * 0, or -EPROTO if a channel failed. */
int multifd_recv__main_sync(struct multifd_recv *mf, uint64_t round) KMIG_MUST_CHECK;
/* From any thread: fails the channels ("cancelled"), wakes a barrier and
 * unblocks every read, the handshake's too. */
void multifd_recv__cancel(struct multifd_recv *mf);
/* Ends the channels (after END, or on failure) and joins their threads,
 * those waiting at a SYNC barrier the main stream never reached too;
 * returns -EPROTO if a channel failed (reason in mf->error). */
int multifd_recv__finish(struct multifd_recv *mf) KMIG_MUST_CHECK;
/* Page counters summed over the channels. */
void multifd_recv__stats(struct multifd_recv *mf, uint64_t *pages, uint64_t *zero,
			 uint64_t *bytes);

#endif
