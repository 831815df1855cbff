/* The migration engine of one VM: the outgoing side (QMP migrate) and the
 * incoming side (--incoming / migrate-incoming), their parameters,
 * capabilities and statistics.
 *
 * Threads: QMP handlers (loop thread) call migration__start,
 * migration__cancel, the parameter setters and migration__query; the
 * migration work runs on its own thread (one at a time per direction).
 * m->lock guards status, statistics and parameters. */
#ifndef KMIG_MIG_MIGRATION_H
#define KMIG_MIG_MIGRATION_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/bitmap.h"
#include "base/log.h"
#include "dev/announce.h"
#include "kvm/dirtylimit.h"
#include "mig/comp.h"
#include "mig/policy/calcrate.h"
#include "mig/multifd.h"
#include "mig/policy/policy.h"
#include "mig/recv/blocktime.h"
#include "mig/wire/proto.h"
#include "mig/wire/stream.h"
#include "mig/wire/tls.h"

struct control;
struct ram;
struct vm;

/* QMP MigrationStatus names. */
enum mig_status {
	MIG_NONE, MIG_SETUP, MIG_ACTIVE, MIG_DEVICE, MIG_COMPLETED,
	MIG_CANCELLING, MIG_CANCELLED, MIG_FAILED,
	MIG_PRE_SWITCHOVER, /* pause-before-switchover: vCPUs stopped, waiting for migrate-continue */
	MIG_POSTCOPY_ACTIVE, /* post-copy: the destination runs the guest, pages follow */
	MIG_POSTCOPY_PAUSED, /* post-copy: the link broke; both sides wait for a new one */
	MIG_POSTCOPY_RECOVER, /* post-copy: a new link is being set up */
};
#define MIG_STATUS_LAST MIG_POSTCOPY_RECOVER
/* setup, active, pre-switchover, device, cancelling or a post-copy status:
 * a migration is under way */
bool mig_status__busy(enum mig_status s);
const char *mig_status__name(enum mig_status s);

struct mig_params {
	uint64_t max_bandwidth;      /* bytes/s; 0 = unlimited */
	uint64_t max_postcopy_bandwidth; /* bytes/s after the switch to post-copy; 0 = unlimited */
	struct policy_params policy; /* downtime-limit and auto-converge knobs */
	bool cap_events;             /* MIGRATION / MIGRATION_PASS events */
	bool cap_auto_converge;
	bool cap_verify;             /* x-verify: whole-RAM hash checked on the destination */
	bool cap_zero_detect;        /* send all-zero pages as offsets only (default on) */
	enum policy_kind throttle_policy; /* x-cpu-throttle-policy: step | computed */
	bool throttle_policy_set;         /* named by the user (else QEMU's step-law
					   * parameters choose step) */
	bool cap_dirty_limit;        /* dirty-limit: limit vCPU dirty rates instead of throttling */
	struct mig_comp_params comp; /* x-compression, multifd-compression and levels */
	bool cap_multifd;            /* multifd: pages over parallel channels */
	bool cap_pause_before_switchover; /* stop in pre-switchover until migrate-continue */
	bool cap_postcopy_ram;       /* postcopy-ram: migrate-start-postcopy may switch */
	bool cap_postcopy_auto;      /* x-postcopy-auto: switch by itself (policy__postcopy_now) */
	bool cap_postcopy_blocktime; /* postcopy-blocktime: the destination measures vCPU waits */
	bool cap_postcopy_preempt;   /* postcopy-preempt: pages asked for on a channel of their own */
	bool cap_block_migration;    /* x-block-migration: the disk image in the stream */
	bool cap_xbzrle;             /* xbzrle: pages the destination holds go as deltas */
	bool cap_background_snapshot; /* background-snapshot: RAM as it was when the
				       * migration began, the guest running on */
	bool cap_ignore_shared;      /* x-ignore-shared: RAM in a shared memory file is
				      * handed over, not sent (mem/memfile.h) */
	bool cap_validate_uuid;      /* validate-uuid: START carries this VM's --uuid, a
				      * destination with another refuses the stream */
	bool cap_zero_copy_send;     /* zero-copy-send: multifd pages with MSG_ZEROCOPY
				      * (plain TCP, no compression, no TLS) */
	bool cap_late_block_activate; /* late-block-activate (destination): a guest that
				       * stays stopped once here (-S, stop) takes the disk at
				       * `cont`, not at the end of the migration */
	uint64_t xbzrle_cache_size;  /* xbzrle-cache-size: bytes, a power of two */
	unsigned multifd_channels;   /* multifd-channels */
	uint64_t dirty_limit_period_ms; /* x-vcpu-dirty-limit-period */
	uint64_t vcpu_dirty_limit;   /* vcpu-dirty-limit, MB/s */
	char tls_creds[TLS_ID_MAX];  /* tls-creds: an object id, "" = plain */
	char tls_hostname[256];      /* tls-hostname: the destination's name to check */
	char tls_authz[TLS_ID_MAX];  /* tls-authz: the only source a destination accepts */
	/* x-free-page-hint-wait: ms the bulk pass waits at most for free page
	 * hints before it starts; 0 (default): hints arrive while it sends */
	uint64_t hint_wait_ms;
	/* x-final-round: once the policy would switch over with more than a
	 * quarter of the downtime limit still to send, one more round first
	 * (policy__final_round); off = QEMU's switchover */
	bool final_round;
	/* x-postcopy-early: with x-postcopy-auto, the hybrid also asks during
	 * the bulk pass (policy__postcopy_early); off = only after it */
	bool postcopy_early;
	/* Seed 000's ideas 1, 3 and 4, on unless one of these (default false)
	 * turns it off, to measure what it gives (bench/seed000; ideas 2 and 5
	 * are kmig run --reaper fixed and x-cpu-throttle-policy step):
	 * x-sync-per-slot: each round's sync harvests once per memslot, as
	 * QEMU did per memory region, instead of once for all; x-kick-throttled:
	 * every sync kicks every vCPU out of KVM_RUN, throttled or limited or
	 * not; x-sync-dirty-rate: the policy's dirty rate is what the round's
	 * sync found over the round's time (QEMU's dirty-pages-rate) instead
	 * of the ring's per-second peak. */
	bool sync_per_slot, kick_throttled, sync_dirty_rate;
	/* announce-initial, -max, -rounds, -step: the destination's
	 * self-announcements once the guest is here (dev/announce.h) */
	struct announce_params announce;
};
#define MIG_HINT_WAIT_MAX_MS 10000
#define MIG_XBZRLE_CACHE_DEFAULT (64ull << 20)  /* QEMU's */

struct mig_stats {
	uint64_t start_ms, setup_ms, total_ms, downtime_ms, expected_downtime_ms;
	uint64_t transferred, remaining, total;
	uint64_t multifd_bytes;      /* of transferred, what the multifd channels carried */
	uint64_t zc_missed;          /* dirty-sync-missed-zero-copy (multifd.h) */
	uint64_t duplicate, normal, normal_bytes;
	uint64_t dirty_pages_rate, dirty_rate_peak;
	uint64_t policy_bw_bps;      /* the bandwidth of the last round decision (sender__moved) */
	double mbps;
	uint64_t dirty_sync_count, pages_per_second;
	uint64_t precopy_bytes, downtime_bytes;
	unsigned throttle_pct;
	uint64_t iteration;
	uint64_t free_skipped, balloon_skipped; /* bulk pass: hinted free, ballooned */
	uint64_t limit_sleep_us, limit_ring_full_us; /* dirty-limit, last round */
	uint64_t switchover_wait_us; /* for throttled vCPUs to begin a sleep */
	bool postcopy;               /* the migration went post-copy */
	bool postcopy_auto;          /* x-postcopy-auto took it there (not the command) */
	bool postcopy_in_bulk;       /* the switch came during the bulk pass */
	uint64_t postcopy_switch_ms; /* when, from the start */
	uint64_t postcopy_rewritten; /* hybrid in the bulk pass: bytes sent, then rewritten */
	uint64_t postcopy_bw_bps;    /* hybrid: the bandwidth and dirty rate (B/s) */
	uint64_t postcopy_rate_bps;  /* its switch decided on */
	uint64_t postcopy_requests;  /* RP_REQ received (source) */
	uint64_t postcopy_acks;      /* RP_ACK received (source), the most bytes in */
	uint64_t postcopy_flight_max, postcopy_budget; /* flight after a push, its last budget */
	uint64_t postcopy_faults;    /* destination: faults, pages asked for, mapped as zero */
	uint64_t postcopy_asked, postcopy_zero_mapped;
	uint64_t postcopy_lat_p50_us, postcopy_lat_p99_us; /* RP_REQ to placement */
	bool preempt;                /* postcopy-preempt's channel was open */
	uint64_t preempt_pages;      /* pages it carried (sent / placed) */
	bool blocktime;              /* destination, postcopy-blocktime: the two below */
	uint64_t blocktime_ms;       /* every vCPU waiting for a page at once */
	unsigned blocktime_vcpus;
	uint64_t vcpu_blocktime_ms[BLOCKTIME_MAX_VCPUS];
	bool switchover_wait_timed_out;
	/* x-block-migration (query-migrate's "disk"): the image's size, bytes
	 * of DISK records, bytes still to send, chunks sent as data and as
	 * zero, chunks the guest wrote after the bulk pass took them; on the
	 * destination, what came so far (remaining and dirtied stay 0) */
	bool disk;
	uint64_t disk_total, disk_transferred, disk_remaining;
	uint64_t disk_normal, disk_duplicate, disk_dirtied, disk_data_bytes;
	/* xbzrle (query-migrate's "xbzrle-cache"; struct sender_xbzrle) */
	bool xbzrle;
	uint64_t xbzrle_cache_size, xbzrle_pages, xbzrle_bytes, xbzrle_misses;
	uint64_t xbzrle_overflow, xbzrle_unchanged, xbzrle_looked;
	/* background-snapshot (query-migrate's "x-background-snapshot"):
	 * guest writes that waited for their page, pages sent ahead of the
	 * scan for them */
	bool snapshot;
	uint64_t snapshot_faults, snapshot_ahead;
	/* x-ignore-shared with RAM in a memory file (query-migrate's
	 * "x-ignore-shared"): RAM not sent */
	bool ram_shared;
};

struct migration {
	struct vm *vm;
	struct control *ctl;
	pthread_mutex_t lock;
	struct mig_params params;
	struct tls_objects tls;      /* --object: credentials, created before any migration */
	struct tls_config tls_out;   /* this outgoing migration's, set at start */
	struct tls_config tls_in;    /* this incoming migration's, set at migrate-incoming */
	enum mig_status status;
	struct mig_stats stats;
	char error[256];
	/* outgoing */
	pthread_t thread;
	bool thread_running;
	atomic_bool cancel;
	struct mig_stream stream;
	bool stream_open;
	struct multifd_send mf;      /* parallel channels (capability multifd) */
	bool mf_open;                /* under lock: mf may be shut down by cancel */
	struct mig_stream preempt;   /* postcopy-preempt's channel */
	bool preempt_open;           /* under lock: preempt may be shut down by cancel */
	struct bitmap todo;          /* pages still to send */
	struct policy_state pstate;
	pthread_cond_t cont_cond;    /* with lock: migrate-continue or a cancel came */
	bool cont;                   /* under lock: migrate-continue came */
	atomic_bool postcopy_start;  /* migrate-start-postcopy came */
	atomic_bool write_protect;   /* background-snapshot holds guest RAM write-protected */
	bool resume;                 /* under lock: migrate resume=true came (to resume_uri) */
	char resume_uri[256];
	/* incoming */
	pthread_t in_thread;
	bool in_running;
	void (*in_cancel)(void *ctx); /* under lock: unblocks the incoming thread */
	void *in_ctx;
	bool in_cancelled;            /* under lock: a cancel came, maybe before in_cancel */
	void (*in_pause)(void *ctx);  /* under lock: migrate-pause (the link is cut) */
	bool recover;                 /* under lock: migrate-recover came (to in_uri) */
	bool recovering;              /* under lock: from migrate-recover until that
				       * attempt ended (a second one is refused) */
	int pc_uffd;                  /* under lock: a failed post-copy's userfaultfd, kept
				       * until the process ends (-1: none) */
	bool confirmed;              /* under lock: RP_OK arrived, a cancel is too late */
	struct mig_threads threads;  /* the threads query-migrationthreads lists */
	char in_uri[MIG_URI_MAX];
	/* under lock: where the incoming side listens now (QMP's
	 * socket-address): a TCP address (port bound, also after port 0) or
	 * a unix path; none ("" both) when no listener is open */
	char in_host[64];
	uint16_t in_port;
	char in_path[108];
	char out_uri[MIG_URI_MAX];
	int in_fd;                   /* --incoming/migrate-incoming fd:'s descriptor, -1 = none */
	int inherited_fd;            /* --incoming fd:N's N, checked open at start-up, -1 = none */
	int out_fd;                  /* migrate fd:'s descriptor until the thread takes it */
	bool incoming_expected;      /* --incoming given: the VM waits for a stream */
	uint64_t strays;             /* under lock: connections the incoming side dropped */
	char stray_why[256];         /* under lock: the last one's reason */
	struct calcrate calc;        /* calc-dirty-rate */
	bool limit_set;              /* this migration set dirty limits */
	uint64_t user_limits[DIRTYLIMIT_MAX_VCPUS]; /* quotas before it did */
};

void migration__init(struct migration *m, struct vm *vm, struct control *ctl);
void migration__destroy(struct migration *m);

/* exec:, file: and fd: URIs (mig/wire/stream.h).  migration__fd: the
 * descriptor of fd:NAME, taken from getfd's table, or for a number N only
 * m->inherited_fd (--incoming fd:N, checked when kmig started, before it
 * opened any descriptor of its own), taken once: the fd, now the
 * caller's, or -errno with err. */
int migration__fd(struct migration *m, const char *name, char *err, size_t errlen);
bool migration__fd_is_socket(int fd);
/* Closes *fd if open; *fd = -1. */
void migration__drop_fd(int *fd);

/* With zero-copy-send on: true unless multifd is on, its channels
 * uncompressed and TLS off (QEMU's refusal, MIG_ZERO_COPY_ONLY). */
#define MIG_ZERO_COPY_ONLY "Zero copy only available for non-compressed non-TLS multifd migration"
bool migration__zero_copy_conflict(const struct mig_params *p);
/* With background-snapshot on: the first capability on that it does not
 * go with (QEMU's name where QEMU has it), or NULL. */
const char *migration__snapshot_conflict(const struct mig_params *p);
/* With x-ignore-shared and RAM in a memory file (its RAM is handed over,
 * not sent): the name of a capability that has nothing to do then, or
 * NULL. */
const char *migration__shared_conflict(const struct mig_params *p, const struct vm *vm);
/* Starts an outgoing migration to uri in the background. */
int migration__start(struct migration *m, const char *uri, char *err, size_t errlen) KMIG_MUST_CHECK;
/* Requests cancellation (setup, active, pre-switchover or device, until the destination's
 * RP_OK has arrived); the thread cleans up.  After END the guest then stays
 * paused here (the destination may run it).  Returns false, doing nothing,
 * in postcopy-active unless quitting: the destination runs the guest and
 * the source cannot take it back (quit and SIGTERM end it anyway, the
 * guest paused here). */
bool migration__cancel(struct migration *m, bool quitting);
/* migrate-continue: lets a migration waiting in pre-switchover go on.
 * -EINVAL (err says why) unless the status is `state` (QEMU's rule: the
 * same name in any other status is accepted and does nothing; an unknown
 * name is refused). */
int migration__continue(struct migration *m, const char *state, char *err, size_t errlen) KMIG_MUST_CHECK;
/* migrate-start-postcopy: -EINVAL (err says why) unless an outgoing
 * migration is active with postcopy-ram and nothing post-copy cannot
 * carry yet (multifd, TLS, x-verify, a virtio-balloon). */
int migration__start_postcopy(struct migration *m, char *err, size_t errlen) KMIG_MUST_CHECK;
/* Post-copy recovery (docs/protocol.md "Post-copy recovery").
 * migrate-pause: in postcopy-active, cuts the link on this side (both
 * sides then go postcopy-paused).  migrate-recover (destination, in
 * postcopy-paused): listens on uri for the source's new connection.
 * migrate resume=true (source, in postcopy-paused): connects to uri and
 * goes on from where post-copy stopped.  -EINVAL (err says why) in any
 * other state. */
int migration__pause(struct migration *m, char *err, size_t errlen) KMIG_MUST_CHECK;
/* QMP yank, instance `migration`: cuts this side's links at once (the
 * main stream and, on the source, every multifd channel), whatever the
 * peer does; the migration then fails as on a broken link (post-copy:
 * pauses).  -ENOENT when no migration has a link (has_yank false). */
int migration__yank(struct migration *m) KMIG_MUST_CHECK;
bool migration__has_yank(struct migration *m);
int migration__recover(struct migration *m, const char *uri, char *err, size_t errlen) KMIG_MUST_CHECK;
int migration__resume(struct migration *m, const char *uri, char *err, size_t errlen) KMIG_MUST_CHECK;
/* The post-copy threads' wait in postcopy-paused: until resume (source)
 * or recover (destination) is set, or a cancel / quit; true for a new
 * link (the flag is taken), false for a cancel.  cancelled: the
 * incoming side's flag (NULL on the source, which uses m->cancel). */
bool migration__await_recovery(struct migration *m, bool *flag, const bool *cancelled);
/* Migration thread, vCPUs already stopped: with pause-before-switchover,
 * status pre-switchover until migrate-continue (0) or a cancel
 * (-ECANCELED); without it, 0 at once. */
int migration__pre_switchover(struct migration *m) KMIG_MUST_CHECK;
/* Unblocks an incoming migration (listening or loading): it fails. */
void migration__cancel_incoming(struct migration *m);
/* Cancels and joins every migration thread (outgoing, incoming,
 * calc-dirty-rate); call before the VM is destroyed. */
void migration__stop_threads(struct migration *m);
/* Starts listening for an incoming stream on uri in the background. */
int migration__incoming(struct migration *m, const char *uri, char *err, size_t errlen) KMIG_MUST_CHECK;
/* query-migrate's answer (new reference). */
json_t *migration__query(struct migration *m);
/* Sets the status and emits MIGRATION when the capability is on. */
void migration__set_status(struct migration *m, enum mig_status s);
/* The same, only if the status is `from` (a cancel's `cancelling` is not
 * overwritten); false if it was not. */
bool migration__advance(struct migration *m, enum mig_status from, enum mig_status to) KMIG_MUST_CHECK;
/* The incoming side dropped a connection that is not the source's (what:
 * "connection", "multifd channel"; why: the reason): counted, logged and
 * shown by query-migrate (x-stray-connections) until the next
 * migrate-incoming. */
void migration__stray(struct migration *m, const char *what, const char *why);
/* Records a failure description (first one wins until the next start). */
void migration__set_error(struct migration *m, const char *fmt, ...) KMIG_PRINTF(2, 3);

/* Registers migrate, migrate_cancel, migrate-continue, query-migrate, migrate-incoming,
 * migrate-set/query-parameters and -capabilities (mig/qmp_mig.c). */
int migration__register_qmp(struct migration *m) KMIG_MUST_CHECK;
/* Registers calc-dirty-rate, query-dirty-rate and the vCPU dirty-limit
 * commands (mig/qmp_rate.c). */
int migration__register_rate_qmp(struct migration *m) KMIG_MUST_CHECK;

/* Guest RAM as the wire protocol describes it (both sides). */
void migration__proto_ram(const struct ram *ram, struct proto_ram *out);

/* Outgoing worker (mig/send/send.c) and incoming worker (mig/recv/incoming.c). */
void *migration__send_thread(void *arg);
void *migration__incoming_thread(void *arg);

#endif
