/* Migration receiver: the destination's state machine over the record
 * stream (docs/protocol.md, "Receiver state machine").
 *
 *   WAIT_START --START--> RAM --END--> DONE
 *        \                 |  PAGES, ZERO, XBZRLE, STATE, SYNC, DISCARD
 *         \                |  (START with RAM_SHARED: STATE, SHARED only)
 *         \                +--POSTCOPY--> POSTCOPY --END--> DONE
 *          \                                 PAGES, ZERO (placed by hooks)
 *           `---- any error -----------------+--> FAILED  (sticky, with a message)
 *
 * Every record is validated as a whole (header, payload structure, block
 * index, every offset) before anything is written into guest RAM, so a
 * rejected record leaves RAM unchanged.  Errors:
 *   -EPROTO      record out of place or malformed (incl. bad magic/version)
 *   -EINVAL      the source's RAM layout differs from ours, or an offset
 *                or block index lies outside guest RAM
 *   -EBADMSG     END checksum does not match our RAM
 *   -ECANCELED   the source sent ERROR (it aborted)
 *   other        a stream error, or what a hook returned
 * After an error every call returns the same error; mig_recv__error()
 * says what happened.
 *
 * Pure memory: guest RAM is a struct proto_ram supplied by the caller (who
 * keeps it alive and mapped).  Not thread-safe: one thread drives a
 * receiver; the hooks run on that thread.
 */
#ifndef KMIG_MIG_RECV_H
#define KMIG_MIG_RECV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"
#include "mig/wire/proto.h"
#include "mig/wire/stream.h"

enum mig_recv_state {
	MIG_RECV_WAIT_START,
	MIG_RECV_RAM,
	MIG_RECV_POSTCOPY,      /* the guest runs here; pages arrive on demand */
	MIG_RECV_DONE,
	MIG_RECV_FAILED,
};

struct mig_recv_ops {
	/* A STATE section.  Required (a STATE record without it fails with
	 * -ENOTSUP).  A non-zero return fails the stream with that error
	 * (positive values are turned into -EINVAL). */
	int (*on_state)(void *ctx, uint32_t id, uint32_t ver, uint32_t instance,
			const void *data, size_t len);
	/* Optional: make the page at (block, offset) zero (e.g. madvise).
	 * Default: memset, skipped if the page already reads as zero.
	 * Non-zero return fails as for on_state. */
	int (*on_zero)(void *ctx, uint32_t block, uint64_t offset);
	/* Optional: called after each page of a PAGES or ZERO record was
	 * applied (e.g. to mark it received). */
	void (*on_page_written)(void *ctx, uint32_t block, uint64_t offset);
	/* Optional: a SYNC (round) marker. */
	int (*on_sync)(void *ctx, uint64_t round);
	/* Optional: the main stream announced `count` extra channels (multifd);
	 * a CHANNEL record without this hook, or on a channel stream, fails.
	 * Non-zero return fails as for on_state. */
	int (*on_channels)(void *ctx, uint32_t count, const uint8_t session[PROTO_SESSION_LEN]);
	/* Post-copy (all four, or DISCARD and POSTCOPY records fail with
	 * -EPROTO).  on_discard: the page's copy here is stale (before
	 * POSTCOPY only).  on_postcopy: every state section is in, the guest
	 * may run here.  From then on every page of a PAGES or ZERO record
	 * goes to place_page (data = the page) or place_zero instead of a
	 * plain write: the hook places it atomically (userfaultfd).  Non-zero
	 * returns fail as for on_state. */
	int (*on_discard)(void *ctx, uint32_t block, uint64_t offset);
	int (*on_postcopy)(void *ctx);
	int (*place_page)(void *ctx, uint32_t block, uint64_t offset, const void *data);
	int (*place_zero)(void *ctx, uint32_t block, uint64_t offset);
	/* Optional, post-copy with a checksum (POSTCOPY's HAS_CHECKSUM flag,
	 * refused without this hook): END's post-copy sum (proto.h) against
	 * the pages as this side holds and placed them; 0 if they match. */
	int (*postcopy_check)(void *ctx, const uint8_t hash[PROTO_HASH_LEN]);
	/* Optional: a DISK record (x-block-migration), structure checked, on
	 * the main stream before POSTCOPY; without the hook DISK fails with
	 * -EPROTO.  The hook checks the range against its image.  Non-zero
	 * returns fail as for on_state (a hook that called mig_recv__fail
	 * keeps its own message). */
	int (*on_disk)(void *ctx, const struct proto_disk *d);
	/* Optional: the main stream announced the postcopy-preempt channel
	 * (PREEMPT, before CHANNEL and POSTCOPY) and the multifd channels
	 * that follow it; without the hook PREEMPT fails with -EPROTO.
	 * Non-zero returns fail as for on_disk. */
	int (*on_preempt)(void *ctx, const uint8_t session[PROTO_SESSION_LEN], uint32_t channels);
	/* Optional: END came on the main stream in post-copy, before its
	 * checksum is checked: every page sent on another channel must be in
	 * by the time it returns 0.  A return other than -EPROTO counts as a
	 * lost link (post-copy pauses, mig_recv__link_lost). */
	int (*on_postcopy_end)(void *ctx);
	/* Optional: START came, its layout checked; st->ram_shared: its flag
	 * RAM_SHARED (RAM is handed over in a shared file, not sent; without
	 * the hook such a START fails with -EPROTO), st->has_uuid/uuid: the
	 * source VM's UUID (validate-uuid; ignored without the hook).
	 * Non-zero returns fail as for on_disk. */
	int (*on_start)(void *ctx, const struct proto_start *st);
	/* Optional: the SHARED record's token (also kept: mig_recv__shared_token).
	 * Non-zero returns fail as for on_disk. */
	int (*on_shared)(void *ctx, uint64_t token);
	void *ctx;
};

struct mig_recv_stats {
	uint64_t records;       /* records accepted */
	uint64_t bytes;         /* header + payload bytes of those records */
	uint64_t pages;         /* pages written from PAGES records */
	uint64_t zero_pages;    /* pages from ZERO records */
	uint64_t zero_skipped;  /* of those, already zero (default path) */
	uint64_t sections;      /* STATE records */
	uint64_t syncs;         /* SYNC records */
	uint64_t last_round;    /* round of the last SYNC */
	uint64_t discarded;     /* pages named by DISCARD records */
	uint64_t postcopy_pages; /* pages placed after POSTCOPY (of pages + zero_pages) */
	uint64_t xbzrle_pages;  /* pages changed by an XBZRLE delta (XBZRLE's whole
				 * pages count in pages, its zero pages in zero_pages) */
};

struct mig_recv {
	enum mig_recv_state state;
	bool channel;           /* an extra multifd channel: PAGES, ZERO, SYNC only */
	bool preempt;           /* the postcopy-preempt channel: PAGES, ZERO, empty END */
	const struct proto_ram *ram;
	struct mig_recv_ops ops;
	struct mig_recv_stats stats;
	bool checksum_present, checksum_ok;
	bool ram_shared;        /* START's RAM_SHARED: no page record may come */
	uint64_t shared_token;  /* SHARED's (0: none yet) */
	bool link_lost;         /* FAILED in POSTCOPY because the stream broke */
	bool pc_verify;         /* POSTCOPY announced END's post-copy checksum */
	bool preempt_due;       /* resumed post-copy: one PREEMPT may come (the
				 * channel reopened), announcing no multifd channel */
	int err;
	char errmsg[256];
	uint8_t *payload;       /* record buffer for step(), lazily allocated */
	uint8_t *scratch;       /* decompressed pages, lazily allocated */
	struct proto_codec codec;
};

/* ram must outlive r; every block size must be a non-zero multiple of
 * PROTO_PAGE_SIZE and nr_blocks in 1..PROTO_MAX_BLOCKS (else -EINVAL).
 * ops is copied; NULL means no hooks. */
int mig_recv__init(struct mig_recv *r, const struct proto_ram *ram,
		   const struct mig_recv_ops *ops) KMIG_MUST_CHECK;
void mig_recv__free(struct mig_recv *r);
/* A receiver for an extra multifd channel: no START (the main stream
 * checked the layout); only PAGES, ZERO and SYNC records are accepted. */
int mig_recv__init_channel(struct mig_recv *r, const struct proto_ram *ram,
			   const struct mig_recv_ops *ops) KMIG_MUST_CHECK;

/* A receiver for the postcopy-preempt channel: no START, already in
 * POSTCOPY (pages go to place_page and place_zero, both required); only
 * PAGES, ZERO and an END without checksum (then DONE) are accepted. */
int mig_recv__init_preempt(struct mig_recv *r, const struct proto_ram *ram,
			   const struct mig_recv_ops *ops) KMIG_MUST_CHECK;

/* Applies one record whose payload (hdr->length bytes) is in memory.
 * 0 or -errno (and the receiver is FAILED). */
int mig_recv__feed_record(struct mig_recv *r, const struct proto_hdr *hdr,
			  const void *payload) KMIG_MUST_CHECK;
/* Reads one record from s and applies it.  In DONE, returns 0 without
 * reading. */
int mig_recv__step(struct mig_recv *r, struct mig_stream *s) KMIG_MUST_CHECK;
/* Steps until DONE (0) or an error. */
int mig_recv__run(struct mig_recv *r, struct mig_stream *s) KMIG_MUST_CHECK;

/* Fails the receiver from outside (e.g. restoring state failed after
 * END); keeps an earlier error.  Returns the error in force. */
int mig_recv__fail(struct mig_recv *r, int err, const char *fmt, ...) KMIG_PRINTF(3, 4);
/* Post-copy recovery: a receiver that failed in POSTCOPY only because
 * its stream broke (a read error other than bad framing, or a shutdown)
 * goes back to POSTCOPY for a new stream; -EINVAL for any other state or
 * failure. */
int mig_recv__resume(struct mig_recv *r) KMIG_MUST_CHECK;
/* After mig_recv__resume, on a migration that had the postcopy-preempt
 * channel: the source reopens it, so one PREEMPT (with no multifd
 * channels) is accepted in POSTCOPY; mig_recv__resume clears it. */
static inline void mig_recv__expect_preempt(struct mig_recv *r)
{
	r->preempt_due = true;
}
/* Whether POSTCOPY announced a checksum at END (for on_postcopy). */
static inline bool mig_recv__postcopy_verify(const struct mig_recv *r)
{
	return r->pc_verify;
}
/* Whether the receiver failed in POSTCOPY only because its stream broke. */
static inline bool mig_recv__link_lost(const struct mig_recv *r)
{
	return r->state == MIG_RECV_FAILED && r->link_lost;
}
/* Return path: RP_OK if DONE, else RP_FAIL with the error code (positive
 * errno) and message; flushes.  Call RP_OK only once the guest runs. */
int mig_recv__reply(struct mig_recv *r, struct mig_stream *s) KMIG_MUST_CHECK;

static inline enum mig_recv_state mig_recv__state(const struct mig_recv *r)
{
	return r->state;
}
const char *mig_recv__state_name(enum mig_recv_state st);
/* SHARED's token: non-zero once the RAM was handed over in a shared file
 * (START's RAM_SHARED; END before SHARED is refused, so after END it is
 * non-zero exactly when RAM_SHARED was set). */
static inline uint64_t mig_recv__shared_token(const struct mig_recv *r)
{
	return r->shared_token;
}
/* "" when there is no error. */
static inline const char *mig_recv__error(const struct mig_recv *r)
{
	return r->errmsg;
}
static inline const struct mig_recv_stats *mig_recv__stats(const struct mig_recv *r)
{
	return &r->stats;
}
/* Whether END carried a checksum, and whether it matched our RAM. */
static inline bool mig_recv__checksum_present(const struct mig_recv *r)
{
	return r->checksum_present;
}
static inline bool mig_recv__checksum_ok(const struct mig_recv *r)
{
	return r->checksum_ok;
}

#endif
