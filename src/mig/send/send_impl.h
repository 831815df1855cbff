/* Internals of the outgoing migration (send.c, send_loop.c). */
#ifndef KMIG_MIG_SEND_IMPL_H
#define KMIG_MIG_SEND_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "kvm/vm.h"
#include "mem/ram.h"
#include "mig/migration.h"
#include "mig/send/disk_out.h"
#include "mig/send/fault.h"
#include "mig/send/xbzrle_cache.h"
#include "mig/multifd.h"
#include "mig/wire/proto.h"

#define SENDER_BATCH_PAGES 256
#define SENDER_BATCH_ZERO 4096
/* the pass looks at cancel and the return path, and publishes statistics,
 * every 4096 pages it goes by (sent or skipped) and, on a slow link, at
 * least every SENDER_POLL_MS (checked every 256 pages) */
#define SENDER_POLL_PAGES 256
#define SENDER_POLL_MS 100
/* x-postcopy-early: the bulk pass's look at the pages it has sent that the
 * guest wrote again (a sync), at most this often */
#define SENDER_PROBE_MS 250
/* How long the source waits for the destination's answer after END (the
 * destination loads the device state and, with x-verify, hashes all RAM).
 * Without an answer by then the migration fails and the guest stays paused
 * here: the destination may be running it. */
#define SENDER_CONFIRM_S 60

/* xbzrle (send_xbzrle.c): from the end of the bulk pass until a switch
 * to post-copy, every page of the main stream goes in XBZRLE records,
 * as a delta against the cache's copy, whole, or as zero. */
struct sender_xbzrle {
	bool on;                    /* capability xbzrle: the cache is set up */
	bool stopped;               /* post-copy: pages go in PAGES and ZERO again */
	uint64_t cache_size;        /* xbzrle-cache-size when the migration began */
	struct xbzrle_cache cache;
	uint8_t *snap;              /* the page as read for this send: what is sent
				     * and what the cache keeps */
	uint8_t *rec;               /* the record being built */
	size_t len;                 /* its entries' bytes */
	unsigned n;                 /* its entries */
	int block;
	uint64_t saved;             /* what its deltas and the unchanged pages save
				     * (sender__moved, once out) */
	/* QEMU's counters: deltas sent and their bytes (entry heads included),
	 * pages not in the cache, deltas too long to send; and kmig's: pages
	 * unchanged since their copy (nothing sent), pages looked at */
	uint64_t pages, bytes, misses, overflows, unchanged, looked;
};

struct sender {
	struct migration *m;
	struct ram *ram;
	struct mig_stream *stream;
	uint8_t *rec;               /* record buffer */
	size_t rec_cap;
	bool zero_detect;
	bool snapshot;              /* background-snapshot (read under the lock at the start:
				     * migrate-set-parameters rewrites all of m->params) */
	struct mig_comp comp;        /* of the main stream's PAGES records (mig/comp.h) */
	struct mig_comp chan_comp;   /* of the multifd channels' */
	struct proto_codec codec;
	bool paused;                /* we stopped the vCPUs */
	bool tracking;              /* we hold dirty tracking on */
	bool end_sent;              /* END is out: the destination may run the guest */
	bool dest_refused;          /* the destination answered RP_FAIL */
	bool image_given_up;        /* the disk's write lock went at the switchover */
	bool ram_shared;            /* x-ignore-shared with RAM in a memory file: it is
				     * handed over at the switchover, not sent */
	bool ram_handed;            /* ... and was: the destination may take it */
	bool postcopy_sent;         /* POSTCOPY is out: the destination may run the guest */
	bool hybrid_refused;        /* x-postcopy-auto could not switch (said once) */
	struct multifd_send *mf;    /* parallel channels, or NULL */
	uint8_t session[PROTO_SESSION_LEN]; /* random: binds the channels to this migration */
	struct mig_stream *preempt; /* postcopy-preempt's channel (m->preempt), or NULL */
	uint64_t preempt_pages;     /* pages sent on it */
	uint64_t bytes_closed;      /* sent on links closed before (post-copy recovery) */
	uint64_t pc_skip;           /* post-copy: the page a skip-page fault keeps back, or
				     * UINT64_MAX (fault.h; test builds) */
	struct bitmap pc_sent;      /* post-copy: pages sent since the switch (or the
				     * last resume): on their way, never sent again */
	uint64_t pc_dup_asks;       /* requests for such pages, not answered */
	uint64_t pc_flight_max;     /* post-copy: the most bytes in flight after a push */
	uint64_t pc_budget;         /* and the push's last budget (send_postcopy.c) */
	struct proto_ram pr;        /* guest RAM as the protocol sees it */
	uint64_t round;             /* passes completed (SYNC numbers) */
	enum vm_status prev_status; /* VM status before switchover */
	/* pending batches */
	int pblock, zblock;
	unsigned pn, zn;
	uint64_t poffs[SENDER_BATCH_PAGES];
	uint64_t zoffs[SENDER_BATCH_ZERO];
	/* counters */
	uint64_t zero_pages, normal_pages;
	uint64_t comp_saved;         /* on the main stream (sender__moved) */
	uint64_t active_start_ms;
	uint64_t last_poll_ms;       /* sender__pass's last look at cancel and the return path */
	uint64_t bandwidth_bps;      /* last measured */
	bool bulk_done;              /* the first pass is over: nothing is skipped any more */
	bool final_round;            /* x-final-round: the extra round was taken */
	uint64_t probe_ms;           /* x-postcopy-early: the last look, 0 before */
	uint64_t discard_end;        /* post-copy's DISCARD covers todo below this page
				      * (UINT64_MAX: all; a switch in the bulk pass:
				      * sender__bulk_reached) */
	uint64_t rewritten;          /* pages the bulk pass sent that syncs since found written */
	uint64_t free_skipped, balloon_skipped; /* pages the bulk pass did not send */
	/* x-verify or postcopy-ram with a balloon: pages the bulk pass
	 * skipped (hinted free or ballooned) that no sync has reported
	 * written since, nor post-copy sent.  The destination never received
	 * them (they read as zero there), so the END hash counts them as zero
	 * pages, leaving the source's memory as it is; a page the guest wrote
	 * after its hint is sent and hashed.  In post-copy the destination
	 * asks for one when its guest touches it (it is sent as it is here),
	 * and a recovery does not push them. */
	struct bitmap unsent;
	/* post-copy with multifd: every page from the switch on goes on the
	 * main stream (the channels synced at the switch, then carry nothing) */
	bool mf_quiet;
	struct mig_fault fault;     /* test-only fault injection (fault.h) */
	/* x-block-migration: the disk in the stream (disk_out.h) */
	bool disk_on;
	struct disk_out disk;
	uint64_t disk_data, disk_zero;  /* records (runs of blocks) sent as DATA, as ZERO */
	uint64_t disk_data_bytes;       /* the DATA records' data */
	uint64_t disk_bytes;            /* bytes of DISK records */
	struct sender_xbzrle xb;
};

/* sender__pass's answer when migrate-start-postcopy came during it (every
 * page it took from todo was sent) */
#define SENDER_POSTCOPY 1

int sender__pass(struct sender *s);
/* 4 KiB pages in a host huge page (2 MiB) */
#define SENDER_HUGE_PAGES 512u
/* The end of what a bulk pass that reads next as its next page may have
 * left at the destination (see send.c), at most npages. */
uint64_t sender__bulk_reached(uint64_t next, uint64_t npages);
/* The TLS handshake of a connected main stream when the migration has
 * tls-creds (logged); 0 without.  Errors fill err. */
int sender__tls(struct sender *s, char *err, size_t errlen);
/* With multifd: SYNC(next round) on every channel, their queues drained,
 * then SYNC on the main stream, flushed (the destination applies what
 * follows only after every channel's pages before it).  0 without. */
int sender__end_pass(struct sender *s);
int sender__stop_guest(struct sender *s, bool pre, uint64_t *t0);
/* Writes one STATE record (state__save's callback). */
/* A STATE record in s->rec (grown for a large section, the balloon's
 * bitmap); its length or -errno. */
ssize_t sender__encode_state(struct sender *s, uint32_t id, uint32_t ver, uint32_t inst,
			     const void *data, size_t len);
/* Stops the vCPUs for the device state, whatever the VM's status
 * (finish-migrate; the one before in s->prev_status, and in the VM what
 * the run-state section carries), in one step with reading that status,
 * so a `stop` cannot slip in between.  sender__resume_guest undoes it. */
void sender__pause_guest(struct sender *s);
/* Undoes the pause sender__stop_guest (or a snapshot's stop) took: a VM
 * the user had stopped stays stopped; RESUME when it runs again. */
void sender__resume_guest(struct sender *s);
int sender__put_state(void *ctx, uint32_t id, uint32_t ver, uint32_t inst,
		      const void *data, size_t len);
/* x-postcopy-auto during the bulk pass (x-postcopy-early; called as the
 * pass polls): every SENDER_PROBE_MS a sync puts the pages the pass has
 * sent and the guest wrote again back into todo, and
 * policy__postcopy_early decides on them; a yes asks for post-copy as
 * migrate-start-postcopy does.  0 or -errno (a failed sync). */
int sender__bulk_probe(struct sender *s);
/* postcopy-preempt (send_preempt.c).  open: PREEMPT on the main stream,
 * then the channel's connection to uri, its TLS handshake and its own
 * PREEMPT (setup).  end: an END without checksum on it, flushed, before
 * the main stream's END.  close: the channel goes (a pause, the end). */
int sender__preempt_open(struct sender *s, const char *uri) KMIG_MUST_CHECK;
int sender__preempt_end(struct sender *s) KMIG_MUST_CHECK;
void sender__preempt_close(struct sender *s);
/* Post-copy from the stop on (send_postcopy.c). */
int sender__postcopy(struct sender *s);
/* Whether migrate-start-postcopy asks to switch now (never once stopped). */
bool sender__postcopy_due(struct sender *s);
/* After each dirty__sync into m->todo: pages about to be sent leave unsent. */
void sender__synced(struct sender *s);
int sender__flush(struct sender *s);
/* Whether the page (RAM_PAGE_SIZE bytes, 8-byte aligned) is all zero. */
bool sender__page_is_zero(const uint8_t *p);
/* Queues one page (a ZERO offset or PAGES data) in the pending batches. */
int sender__send_page(struct sender *s, uint64_t page);
int sender__switchover(struct sender *s);
/* A one-way stream's end (exec:, file:, fd: of a pipe or file): confirmed
 * once its bytes are out, a file's on its disk, exec:'s command exited 0. */
int sender__finish_one_way(struct sender *s);
/* background-snapshot instead of the passes and the switchover
 * (send_snapshot.c): RAM and devices as they were at the start, the
 * guest running on. */
int sender__snapshot(struct sender *s);
int sender__check_return_path(struct sender *s, int timeout_ms);
/* A pass's look around: -ECANCELED for a cancel, -EPROTO when the
 * destination refused (sender__check_return_path), else fresh statistics
 * and 0. */
int sender__look(struct sender *s);
/* Bytes written on the main stream and every channel. */
uint64_t sender__bytes(struct sender *s);
/* The bytes moved so far, for the policy's bandwidth: sender__bytes plus
 * what compression saved (each compressed PAGES record counts as its
 * pages' 4096 bytes each), counted as the records are written on the
 * main stream and each channel.  The policy weighs remaining and dirty
 * pages at 4096 bytes each; a bandwidth in compressed bytes would make it
 * wait for a switchover it could already make.  Everything else (ZERO
 * records at 8 bytes a page, the disk's, STATE) counts as written.  Never
 * goes back, so differences of two readings are a period's. */
uint64_t sender__moved(struct sender *s);
void sender__update_stats(struct sender *s);

/* send_disk.c, x-block-migration (no-ops without it).  setup: tracking
 * of the guest's writes starts and INFO goes out (err set on a failure);
 * pass: what the guest wrote since the last one joins what is left, and
 * all of it is sent (the bulk pass: every chunk that may hold data);
 * stop: tracking ends. */
int sender__disk_setup(struct sender *s) KMIG_MUST_CHECK;
int sender__disk_pass(struct sender *s) KMIG_MUST_CHECK;
void sender__disk_stop(struct sender *s);
/* x-verify, after the final pass: SUM, the disk's sum as the source holds
 * it (disk_out__sum). */
int sender__disk_sum(struct sender *s) KMIG_MUST_CHECK;
/* Bytes still to send, and bytes the guest wrote since the last pass. */
uint64_t sender__disk_pending(const struct sender *s);
uint64_t sender__disk_dirty(const struct sender *s);

/* send_xbzrle.c.  init: the cache and buffers when the capability is on
 * (err set on a failure); active: whether pages go through page now;
 * page: queues one page of block b at off (the record goes out when
 * full, or at flush); flush: the record out; stop: post-copy switched;
 * stats: the counters into st (under the migration's lock). */
int sender__xbzrle_init(struct sender *s) KMIG_MUST_CHECK;
/* Before a pass: an xbzrle-cache-size changed since takes effect, the
 * cache emptied (QEMU too drops it); kept as it is when there is no
 * memory for the new one (logged). */
void sender__xbzrle_resize(struct sender *s);
void sender__xbzrle_free(struct sender *s);
static inline bool sender__xbzrle_active(const struct sender *s)
{
	return s->xb.on && s->bulk_done && !s->xb.stopped;
}
int sender__xbzrle_page(struct sender *s, int b, uint64_t off, uint64_t page,
			const uint8_t *host) KMIG_MUST_CHECK;
int sender__xbzrle_flush(struct sender *s) KMIG_MUST_CHECK;
void sender__xbzrle_stats(const struct sender *s, struct mig_stats *st);

/* send.c: the disk at the switchover, after the last state: drained,
 * flushed and its write lock given up for the destination to take
 * (kvm/vm_blk.h); and, when the source goes on after all, taken back
 * (-errno with err set: another process holds it now). */
int sender__give_up_image(struct sender *s) KMIG_MUST_CHECK;
int sender__take_back_image(struct sender *s, char *err, size_t errlen) KMIG_MUST_CHECK;
/* send.c, x-ignore-shared: the RAM's file handed over after the last
 * state (mem/memfile.h), its token in a SHARED record; taken back as the
 * disk is. */
int sender__hand_over_ram(struct sender *s) KMIG_MUST_CHECK;

#endif
