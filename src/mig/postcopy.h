/* Post-copy (capability postcopy-ram; docs/protocol.md "Post-copy").
 *
 * Destination (struct postcopy_dst): pages whose copy here is stale are
 * discarded (MADV_DONTNEED) before the guest runs; at POSTCOPY every RAM
 * block is registered with userfaultfd in missing mode and a fault thread
 * answers each fault: a page received earlier as zero is mapped at once
 * (UFFDIO_ZEROPAGE), any other is asked for on the return path (RP_REQ,
 * once per page).  The receiving thread places each page that arrives with
 * UFFDIO_COPY, which wakes the vCPUs waiting for it.  No page is ever
 * filled silently: until every page the source holds has arrived, a
 * missing page waits for the source.
 *
 * Source (struct postcopy_src): a return-path thread reads RP_REQ,
 * RP_ACK, RP_RUNNING and the final RP_OK/RP_FAIL while the migration
 * thread writes; requested pages are marked in `wanted` for the migration
 * thread to send ahead of its background push, which RP_ACK paces.
 *
 * Threads: postcopy_dst__discard, the place and start calls and finish run on the incoming
 * thread; the fault thread is internal.  postcopy_src's reader is
 * internal; the other calls are the migration thread's. */
#ifndef KMIG_MIG_POSTCOPY_H
#define KMIG_MIG_POSTCOPY_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/bitmap.h"
#include "base/log.h"
#include "mig/recv/blocktime.h"
#include "mig/wire/stream.h"

struct ram;

/* Request latency histogram: bucket b holds latencies in
 * [2^(b/4), 2^((b+1)/4)) µs (quarter powers of two: a value read back
 * is within 19 % of the truth); the last bucket takes everything above. */
#define PC_LAT_BUCKETS 128

struct postcopy_dst {
	struct ram *ram;
	struct mig_stream *stream;   /* return path: RP_REQ, RP_RUNNING */
	pthread_mutex_t wlock;       /* one writer at a time on stream; guards paused */
	bool paused;                 /* the link is down: requests wait in `requested` */
	pthread_mutex_t place_lock;  /* one placement at a time: the main stream's and the
				      * preempt channel's (valid, sum, EEXIST's meaning) */
	struct bitmap *valid;        /* pages whose content here is current (incoming's) */
	struct bitmap requested;     /* RP_REQ sent */
	int uffd, stop_fd;           /* -1 when not open */
	pthread_t thread;
	bool thread_started;
	uint64_t run_start, run_len; /* pending discard run (VM-wide pages) */
	_Atomic uint64_t *req_ns;    /* per page: when RP_REQ went (0: not asked) */
	atomic_ullong lat_hist[PC_LAT_BUCKETS]; /* request to placement, see below */
	atomic_ullong faults, requests, zero_mapped, placed;
	atomic_int error;            /* first -errno of the fault thread (named in the failure) */
	bool verify;                 /* sum pages for END's checksum (set before start) */
	struct blocktime *bt;        /* postcopy-blocktime, or NULL (set before start) */
	uint64_t sum[4];             /* proto__page_sum_add of the pages as they came */
	uint64_t acked;              /* the stream position last sent in RP_ACK */
};

/* valid: the incoming side's bitmap of pages it holds (kept up to date
 * here from now on). */
int postcopy_dst__init(struct postcopy_dst *d, struct ram *ram, struct mig_stream *s,
		       struct bitmap *valid) KMIG_MUST_CHECK;
/* The page's copy is stale: it becomes missing (batched; flushed by start). */
int postcopy_dst__discard(struct postcopy_dst *d, uint64_t page) KMIG_MUST_CHECK;
/* Registers RAM with userfaultfd and starts the fault thread (with
 * verify, first sums every page held: the guest has not run here yet).
 * err gets a reason on failure (-ENOSYS: no userfaultfd here). */
int postcopy_dst__start(struct postcopy_dst *d, char *err, size_t errlen) KMIG_MUST_CHECK;
/* Whether ram can take post-copy here: registers it with a userfaultfd of
 * its own and lets it go again (a memory file on a disk file system
 * cannot be registered).  0, or -errno with err saying why. */
int postcopy_dst__probe(const struct ram *ram, char *err, size_t errlen) KMIG_MUST_CHECK;
/* Writes one return-path record (RP_RUNNING, RP_OK, RP_FAIL) in turn with
 * the fault thread's requests, and flushes; -ENOTCONN while paused. */
int postcopy_dst__reply(struct postcopy_dst *d, const void *rec, size_t len) KMIG_MUST_CHECK;
/* The link to the source broke (or is being replaced): requests from
 * now on are only noted, the stream is not touched until resume. */
void postcopy_dst__pause(struct postcopy_dst *d);
/* A new connection to the source (recovery): tells it which pages are
 * here (RP_BITMAP of valid), asks again for every page asked for and not
 * yet placed, acknowledges what it read of s (RP_ACK: the new link's
 * count starts again at 0) and lets requests go out on s again.
 * Incoming thread. */
int postcopy_dst__resume(struct postcopy_dst *d, struct mig_stream *s) KMIG_MUST_CHECK;
/* RP_ACK: the source's push keeps at most a budget of bytes between what
 * it wrote and what this side has read and applied (consumed: the main
 * stream's position, mig_stream__consumed), so a page asked for never
 * waits behind seconds of pushed pages in the sockets' buffers.  Sent
 * when PC_ACK_BYTES more were consumed since the last, or at once with
 * now (before RP_RUNNING: the source paces its push from the first
 * page on).  Incoming thread; -ENOTCONN while paused. */
#define PC_ACK_BYTES (64u * 1024)
int postcopy_dst__ack(struct postcopy_dst *d, uint64_t consumed, bool now) KMIG_MUST_CHECK;
/* verify: END's post-copy checksum against the pages as they came (held
 * at the switch, placed since; never sent counts as zero); 0 if equal. */
int postcopy_dst__check(struct postcopy_dst *d, const uint8_t hash[PROTO_HASH_LEN]) KMIG_MUST_CHECK;
/* Places a page atomically (already there: 0).  Both place calls may run
 * on two threads at once (the main stream's, postcopy-preempt's). */
int postcopy_dst__place(struct postcopy_dst *d, uint64_t page, const void *data) KMIG_MUST_CHECK;
int postcopy_dst__place_zero(struct postcopy_dst *d, uint64_t page) KMIG_MUST_CHECK;
/* Latency percentile (0..100) of the requests answered so far, in µs
 * (the bucket's lower bound); 0 without any. */
uint64_t postcopy_dst__latency_us(const struct postcopy_dst *d, unsigned pct);
/* Every page has arrived: stops the fault thread and unregisters RAM. */
void postcopy_dst__finish(struct postcopy_dst *d);
/* After a failure: hands over the userfaultfd (the caller closes it when
 * the guest will never run again: closing lets waiting faults fill with
 * zeros); -1 if there is none. */
int postcopy_dst__release(struct postcopy_dst *d);
/* Frees; after a failure RAM stays registered (missing pages keep
 * waiting, they are never filled with zeros) until the process ends. */
void postcopy_dst__free(struct postcopy_dst *d);

struct postcopy_src {
	struct mig_stream *stream;
	const struct ram *ram;
	struct bitmap wanted;        /* pages the destination asked for, not yet sent */
	atomic_bool asked;           /* set after a bit of wanted: worth a scan */
	atomic_ullong requests;      /* RP_REQ received */
	atomic_ullong running_ms;    /* time__now_ms() when RP_RUNNING came, 0 before */
	atomic_int outcome;          /* 0 while reading; 1 RP_OK; else -errno */
	atomic_bool refused;         /* the outcome is the destination's RP_FAIL */
	atomic_ullong acked;         /* the stream position of the last RP_ACK */
	atomic_ullong acks;          /* RP_ACK received */
	char error[256];             /* set before outcome, when it is < 0 */
	pthread_mutex_t lock;
	pthread_cond_t cond;         /* a request, RP_RUNNING, RP_ACK or the outcome */
	pthread_t thread;
	bool thread_started;
};

int postcopy_src__init(struct postcopy_src *q, struct mig_stream *s, const struct ram *ram) KMIG_MUST_CHECK;
/* Starts the return-path reader. */
int postcopy_src__start(struct postcopy_src *q) KMIG_MUST_CHECK;
/* Waits up to timeout_ms for a request or an outcome (0 at once: one
 * that came since the last scan of wanted ends the wait at once too). */
void postcopy_src__wait(struct postcopy_src *q, int timeout_ms);
/* The same in ns: the pacing of the background push. */
void postcopy_src__wait_ns(struct postcopy_src *q, uint64_t timeout_ns);
/* The same, also ended by an RP_ACK past acked (the push waits for the
 * destination to read what is in flight). */
void postcopy_src__wait_ack(struct postcopy_src *q, uint64_t acked, uint64_t timeout_ns);
/* Joins the reader (after the stream was closed or shut down, or once
 * outcome is set) and frees. */
void postcopy_src__free(struct postcopy_src *q);

#endif
