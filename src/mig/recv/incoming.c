/* The incoming migration: listen, load RAM and state, resume, answer. */
#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timeutil.h"
#include "base/utf8.h"
#include "ctl/control.h"
#include "ctl/ident_opts.h"
#include "kvm/vm.h"
#include "kvm/vm_blk.h"
#include "kvm/vm_net.h"
#include "mem/memfile.h"
#include "mig/migration.h"
#include "mig/multifd.h"
#include "mig/postcopy.h"
#include "mig/recv/disk_in.h"
#include "mig/recv/early.h"
#include "mig/recv/preempt_in.h"
#include "mig/recv/recv.h"
#include "state/state.h"

#define INCOMING_MAX_SECTIONS 1024 /* far above 7 + 9 per vCPU */

struct incoming {
	struct migration *m;
	struct mig_recv recv;
	struct mig_stream stream;
	struct mig_listener listener; /* open until the multifd channels are in */
	bool listening;
	struct mig_early early;      /* its connections that spoke before their turn */
	struct proto_ram pr;
	unsigned sections;           /* loaded so far */
	int nexpected;               /* the slots state__save produces for this VM */
	uint64_t expected[INCOMING_MAX_SECTIONS];
	bool loaded[INCOMING_MAX_SECTIONS];  /* per expected slot */
	struct bitmap written;       /* pages a PAGES record has filled */
	struct multifd_recv mf;      /* parallel channels, when announced */
	bool multifd;
	bool connected;              /* under m->lock: stream holds a connection */
	bool cancelled;              /* under m->lock */
	struct postcopy_dst pc;      /* capability postcopy-ram */
	struct blocktime bt;         /* capability postcopy-blocktime */
	bool bt_ready;
	bool pc_ready;               /* pc initialised */
	bool postcopy;               /* POSTCOPY came: RAM is under userfaultfd */
	bool guest_here;             /* inmigrate ended: the guest is this VM's (running,
				      * or stopped until `cont`) */
	struct disk_in disk;         /* x-block-migration: the image in the stream */
	struct preempt_in preempt;   /* postcopy-preempt's channel */
	atomic_bool preempt_on;      /* it connected */
	uint32_t preempt_channels;   /* the multifd channels its PREEMPT announced */
	uint8_t preempt_session[PROTO_SESSION_LEN]; /* its PREEMPT's: a reopening names it too */
};

/* migration__cancel_incoming, under m->lock: unblock whatever the incoming
 * thread waits for (accept, or a read on the stream). */
static void incoming__cancel(void *ctx)
{
	struct incoming *in = ctx;
	in->cancelled = true;
	if (in->listening)
		mig_listener__shutdown(&in->listener);
	if (in->connected)
		mig_stream__shutdown(&in->stream);
	multifd_recv__cancel(&in->mf);
	preempt_in__cancel(&in->preempt);
	pthread_cond_broadcast(&in->m->cont_cond);   /* a post-copy pause waits on it */
}

/* migrate-pause, under m->lock: cut the link (post-copy then pauses). */
static void incoming__pause(void *ctx)
{
	struct incoming *in = ctx;
	if (in->connected)
		mig_stream__shutdown(&in->stream);
	preempt_in__cancel(&in->preempt);   /* both links, and END's wait for it */
	if (in->listening)      /* a recovery's wait for the reopened channel */
		mig_listener__shutdown(&in->listener);
}

#define INCOMING_CHANNEL_WAIT_MS 10000
#define INCOMING_CHANNEL_STRAYS  PROTO_MAX_CHANNELS /* dropped while channels are taken */
#define INCOMING_LATER           1  /* a connection's first record: a later connection's */

/* The listener, once no more connections are wanted on it (the channels
 * are in, or the link broke): whatever still waits there is dropped, and
 * a unix socket file goes. */
static void incoming__close_listener(struct incoming *in)
{
	pthread_mutex_lock(&in->m->lock);
	if (in->listening)
		mig_listener__close(&in->listener);
	in->listening = false;
	in->m->in_host[0] = in->m->in_path[0] = 0;
	in->m->in_port = 0;
	pthread_mutex_unlock(&in->m->lock);
	for (unsigned n = mig_early__drop(&in->early); n; n--)
		migration__stray(in->m, "connection", "held for its turn, which did not come");
}

/* Milliseconds a connection from a listener has for its first record's
 * header (and a later connection's, for the whole record). */
#define INCOMING_FIRST_RECORD_MS 10000

static const char *incoming__kind(uint32_t type)
{
	return type == PROTO_PREEMPT ? "postcopy-preempt channel" : "multifd channel";
}

/* The session of s's first record (PREEMPT or CHANNEL, as `type`; left
 * unread, and read whole into s's buffer already: the wait here is only a
 * bound): NULL, or why it is not one (a record of the main stream's,
 * CHANNEL{0, n}, is no channel's). */
static const char *incoming__early_session(struct mig_stream *s, uint32_t type,
					   uint8_t session[PROTO_SESSION_LEN])
{
	uint8_t b[PROTO_HDR_SIZE + 64];
	struct proto_hdr h;
	uint32_t index = 1, count;
	const char *why = NULL;
	mig_stream__set_read_deadline(s, time__now_ms() + INCOMING_FIRST_RECORD_MS);
	int rc = mig_stream__peek(s, b, PROTO_HDR_SIZE);
	if (!rc && (proto__decode_header(b, PROTO_HDR_SIZE, &h) || h.type != type ||
		    h.length > sizeof(b) - PROTO_HDR_SIZE))
		rc = -EPROTO;
	if (!rc)
		rc = mig_stream__peek(s, b, PROTO_HDR_SIZE + h.length);
	mig_stream__set_read_deadline(s, 0);
	if (rc)
		return "its first record is not whole";
	if (type == PROTO_PREEMPT)
		rc = proto__decode_preempt(b + PROTO_HDR_SIZE, h.length, session, &count, &why);
	else
		rc = proto__decode_channel(b + PROTO_HDR_SIZE, h.length, &index, &count, session,
					   &why);
	return rc ? why : index ? NULL : "it begins with the main stream's CHANNEL";
}

/* s (from the listener, plain) began with a whole `type` record of a
 * later connection of a migration: true if it is held for its turn;
 * false, why set, if that record is not one (it is a stray). */
static bool incoming__hold(struct incoming *in, struct mig_stream *s, uint32_t type,
			   char *why, size_t len)
{
	uint8_t session[PROTO_SESSION_LEN];
	const char *bad = incoming__early_session(s, type, session);
	if (bad) {
		snprintf(why, len, "a %s's first record, but %s", incoming__kind(type), bad);
		return false;
	}
	if (mig_early__hold(&in->early, s, type))
		migration__stray(in->m, "connection", "held for its turn, and pushed out by a "
				 "later one");
	log_info("incoming migration: a %s spoke before its turn: held", incoming__kind(type));
	return true;
}

/* Moves the oldest connection held of `type` whose first record carries
 * this migration's session into s: true, or false when there is none.
 * One of another session (an earlier attempt's, or no source's) is
 * closed and counted as a stray, but not against the budget of strays a
 * channel's wait allows (INCOMING_CHANNEL_STRAYS). */
static bool incoming__take_early(struct incoming *in, uint32_t type,
				 const uint8_t session[PROTO_SESSION_LEN], struct mig_stream *s)
{
	uint8_t theirs[PROTO_SESSION_LEN];
	while (mig_early__take(&in->early, type, s)) {
		if (!incoming__early_session(s, type, theirs) &&
		    proto__same_session(theirs, session))
			return true;
		mig_stream__close(s);
		migration__stray(in->m, "connection", "held for its turn, but of another "
				 "migration's session");
	}
	return false;
}

/* The main stream announced `count` extra channels: take those held
 * since they came early (incoming__take_early), then accept the rest.  A
 * connection that is not one of them (no TLS, no CHANNEL record of this
 * migration in time) is dropped and counted; the listener waits on. */
static int incoming__on_channels(void *ctx, uint32_t count,
				 const uint8_t session[PROTO_SESSION_LEN])
{
	struct incoming *in = ctx;
	char err[256] = "";
	unsigned strays = 0;
	if (in->multifd || !in->listening ||
	    (atomic_load(&in->preempt_on) && count != in->preempt_channels))
		return -EPROTO;
	in->multifd = true;
	memcpy(in->mf.session, session, PROTO_SESSION_LEN);
	for (uint32_t i = 0; i < count;) {
		struct mig_stream *s = multifd_recv__next_stream(&in->mf);
		int rc = !s ? -ENOSPC : incoming__take_early(in, PROTO_CHANNEL, session, s) ? 0 :
			 mig_listener__accept(&in->listener, s,
					      time__now_ms() + INCOMING_CHANNEL_WAIT_MS, err,
					      sizeof(err));
		if (rc) {
			mig_recv__fail(&in->recv, rc, "multifd channel %u did not connect: %s", i + 1,
				       err);
			return rc;
		}
		rc = multifd_recv__add(&in->mf, count, err, sizeof(err));
		if (rc == -EPROTO && strays++ < INCOMING_CHANNEL_STRAYS) {
			migration__stray(in->m, "multifd channel", err);
			continue;
		}
		if (rc) {
			mig_recv__fail(&in->recv, rc, "%s", err);
			return rc;
		}
		i++;
	}
	incoming__close_listener(in);
	log_info("incoming migration: %u multifd channels", count);
	return 0;
}

static int incoming__place_page(void *ctx, uint32_t block, uint64_t offset, const void *data);
static int incoming__place_zero(void *ctx, uint32_t block, uint64_t offset);

/* A recovery's channel that did not open: the new link is lost as a
 * broken one would be (post-copy pauses again, and a new recovery
 * brings both), instead of failing a migration whose guest runs here. */
static int incoming__reopen_failed(struct incoming *in, const char *err)
{
	log_warn("incoming migration: the postcopy-preempt channel did not reopen: %s", err);
	mig_stream__fail(&in->stream, -ENOLINK, "the postcopy-preempt channel did not reopen: "
			 "%.200s", err);
	shutdown(in->stream.fd, SHUT_RD);
	incoming__close_listener(in);
	return 0;
}

/* The main stream announced the postcopy-preempt channel (at setup, or
 * again on a recovery's new link): accept it, or take it if it came
 * early.  A multifd channel that comes before it is held for its turn;
 * as for the multifd channels, a connection that is neither is dropped
 * and counted, and the listener waits on. */
static int incoming__on_preempt(void *ctx, const uint8_t session[PROTO_SESSION_LEN],
				uint32_t channels)
{
	struct incoming *in = ctx;
	struct migration *m = in->m;
	char err[256] = "";
	unsigned strays = 0;
	bool reopen = mig_recv__state(&in->recv) == MIG_RECV_POSTCOPY;
	if (in->preempt.active || !in->listening)
		return mig_recv__fail(&in->recv, -EPROTO, "PREEMPT, but %s",
				      in->preempt.active ? "the channel is open already" :
				      "this side has no listener for its connection");
	if (reopen && !proto__same_session(session, in->preempt_session))
		return incoming__reopen_failed(in, "its PREEMPT names another session");
	struct mig_recv_ops ops = { .place_page = incoming__place_page,
				    .place_zero = incoming__place_zero, .ctx = in };
	for (;;) {
		struct mig_stream *s = &in->preempt.stream;
		int rc = incoming__take_early(in, PROTO_PREEMPT, session, s) ? 0 :
			 mig_listener__accept(&in->listener, s,
					      time__now_ms() + INCOMING_CHANNEL_WAIT_MS, err,
					      sizeof(err));
		if (rc && reopen)
			return incoming__reopen_failed(in, err);
		if (rc)
			return mig_recv__fail(&in->recv, rc, "the postcopy-preempt channel did not "
					      "connect: %s", err);
		rc = preempt_in__add(&in->preempt, m->tls_in.creds ? &m->tls_in : NULL,
				     in->mf.peer, session, channels, &in->pr, &ops, err,
				     sizeof(err));
		/* a multifd channel before the preempt channel at setup waits
		 * for its turn; a recovery opens none */
		if (rc == PREEMPT_IN_CHANNEL && !reopen &&
		    incoming__hold(in, s, PROTO_CHANNEL, err, sizeof(err)))
			continue;
		if (rc == PREEMPT_IN_CHANNEL) {
			mig_stream__close(s);
			rc = -EPROTO;
		}
		/* a reopening takes no strays: the source's next try may come
		 * on this URI, and it needs migrate-recover here first */
		if (rc == -EPROTO && !reopen && strays++ < INCOMING_CHANNEL_STRAYS) {
			migration__stray(m, "postcopy-preempt channel", err);
			continue;
		}
		if (rc && reopen)
			return incoming__reopen_failed(in, err);
		if (rc)
			return mig_recv__fail(&in->recv, rc, "%s", err);
		break;
	}
	atomic_store(&in->preempt_on, true);
	if (!reopen) {
		in->preempt_channels = channels;
		memcpy(in->preempt_session, session, PROTO_SESSION_LEN);
	}
	if (!channels)          /* else the multifd channels come next */
		incoming__close_listener(in);
	log_info("incoming migration: postcopy-preempt channel open");
	return 0;
}

/* END in post-copy: the preempt channel's pages are all in first. */
static int incoming__on_postcopy_end(void *ctx)
{
	struct incoming *in = ctx;
	char err[256];
	int rc = preempt_in__wait_end(&in->preempt, INCOMING_CHANNEL_WAIT_MS, err, sizeof(err));
	if (rc)
		return mig_recv__fail(&in->recv, rc, "%s", err);
	return 0;
}

static int incoming__on_sync(void *ctx, uint64_t round)
{
	struct incoming *in = ctx;
	return in->multifd ? multifd_recv__main_sync(&in->mf, round) : 0;
}

static uint64_t incoming__page(struct incoming *in, uint32_t block, uint64_t offset)
{
	return in->m->vm->ram.blocks[block].first_page + offset / RAM_PAGE_SIZE;
}

static void incoming__on_page(void *ctx, uint32_t block, uint64_t offset)
{
	struct incoming *in = ctx;
	bitmap__set(&in->written, incoming__page(in, block, offset));
}

/* Guest RAM starts out zero here; only a page filled earlier in this
 * stream needs clearing (reading every page to check would cost more). */
static int incoming__on_zero(void *ctx, uint32_t block, uint64_t offset)
{
	struct incoming *in = ctx;
	uint64_t page = incoming__page(in, block, offset);
	if (bitmap__test(&in->written, page)) {
		memset(in->m->vm->ram.blocks[block].host + offset, 0, RAM_PAGE_SIZE);
		bitmap__clear_bit(&in->written, page);
	}
	return 0;
}

static int incoming__on_state(void *ctx, uint32_t id, uint32_t ver, uint32_t inst,
			      const void *data, size_t len)
{
	struct incoming *in = ctx;
	char why[256] = "";
	/* each section this VM has, once: with the count checked at END, every
	 * one has then arrived */
	uint64_t slot = state__slot(id, inst);
	int k = 0;
	while (k < in->nexpected && in->expected[k] != slot)
		k++;
	if (k == in->nexpected) {
		state__why_unexpected(in->m->vm, id, inst, why, sizeof(why));
		return mig_recv__fail(&in->recv, -EPROTO, "%s", why);
	}
	if (in->loaded[k])
		return mig_recv__fail(&in->recv, -EPROTO, "state section %s (%u) for instance %u twice",
				      state__name(id), id, inst);
	int rc = state__load(in->m->vm, id, ver, inst, data, len, why, sizeof(why));
	if (rc)
		return mig_recv__fail(&in->recv, rc, "%s", why);
	in->loaded[k] = true;
	in->sections++;
	return 0;
}

static int incoming__on_disk(void *ctx, const struct proto_disk *d)
{
	struct incoming *in = ctx;
	char why[768];
	int rc = disk_in__record(&in->disk, d, why, sizeof(why));
	struct mig_stats *st = &in->m->stats;
	pthread_mutex_lock(&in->m->lock);      /* query-migrate's "disk" here */
	st->disk = in->disk.started;
	disk_in__stats(&in->disk, &st->disk_total, &st->disk_transferred, &st->disk_normal,
		       &st->disk_duplicate, &st->disk_data_bytes);
	pthread_mutex_unlock(&in->m->lock);
	return rc ? mig_recv__fail(&in->recv, rc, "%s", why) : 0;
}

/* Every state section this VM has arrived (at END, or at POSTCOPY). */
static int incoming__state_complete(struct incoming *in)
{
	for (int k = 0; k < in->nexpected; k++)
		if (!in->loaded[k])
			return mig_recv__fail(&in->recv, -EPROTO,
					      "state section %s (%u) instance %u missing (%u of %d arrived)",
					      state__name((uint32_t)(in->expected[k] >> 32)),
					      (unsigned)(in->expected[k] >> 32),
					      (unsigned)(in->expected[k] & 0xffffffffu), in->sections,
					      in->nexpected);
	return 0;
}

/* START's UUID (the source's validate-uuid): this VM's must be the same;
 * a VM without --uuid takes any, as QEMU's does, and says so. */
static int incoming__check_uuid(struct incoming *in, const struct proto_start *st)
{
	const struct vm_config *c = &in->m->vm->cfg;
	char theirs[37], ours[37];
	if (!st->has_uuid)
		return 0;
	ident_opts__uuid_text(st->uuid, theirs);
	if (!c->has_uuid) {
		log_warn("incoming migration: the source's UUID is %s, this VM has none "
			 "(--uuid): not checked", theirs);
		return 0;
	}
	if (!memcmp(st->uuid, c->uuid, sizeof(c->uuid)))
		return 0;
	ident_opts__uuid_text(c->uuid, ours);
	return mig_recv__fail(&in->recv, -EINVAL, "validate-uuid: the source VM's UUID is %s, "
			      "this VM's is %s: this is not the VM the migration is meant for",
			      theirs, ours);
}

/* START: the UUID first (validate-uuid); a RAM handed over needs this VM's
 * RAM in a memory file; a RAM sent page by page into a memory file needs
 * the file to itself, zeroed. */
static int incoming__on_start(void *ctx, const struct proto_start *st)
{
	struct incoming *in = ctx;
	struct memfile *f = in->m->vm->memfile;
	bool ram_shared = st->ram_shared;
	char err[512];
	int rc = incoming__check_uuid(in, st);   /* before anything is changed here */
	if (rc)
		return rc;
	if (ram_shared && !f)
		return mig_recv__fail(&in->recv, -EINVAL, "the source hands its RAM over in a "
				      "shared memory file (x-ignore-shared), but this VM's RAM is "
				      "not in one: start it with --object memory-backend-file,...,"
				      "mem-path=the source's file,share=on");
	if (!ram_shared && f && memfile__claim(f, err, sizeof(err)))
		return mig_recv__fail(&in->recv, -EBUSY, "%s", err);
	if (ram_shared)
		log_info("incoming migration: the RAM is handed over in %s, not sent", f->path);
	return 0;
}

/* Ends inmigrate (vm__end_incoming).  With the disk not taken yet
 * (late-block-activate), a guest that would run takes it first and asks
 * again, so a `stop` in between still stops it.  Returns how it ended;
 * VM_INCOMING_WANTS_RUN, still inmigrate, when the guest would run and
 * the disk cannot be taken (why in err). */
static enum vm_incoming_end incoming__end(struct incoming *in, bool disk_taken, char *err,
					  size_t errlen)
{
	struct vm *vm = in->m->vm;
	/* as QEMU's: the run state of a source stopped by a disk error is
	 * kept, so is a guest that never ran (prelaunch); a guest stopped
	 * here (-S, stop) after running there is paused */
	enum vm_status stopped = vm->never_ran ? VM_STATUS_PRELAUNCH :
				 !vm->run_after_migration && vm_blk__kept(vm) ?
				 VM_STATUS_IO_ERROR : VM_STATUS_PAUSED;
	enum vm_incoming_end end = vm__end_incoming(vm, disk_taken ? VM_RUN_ALLOWED : VM_RUN_ASK,
						    stopped);
	if (end != VM_INCOMING_WANTS_RUN)
		return end;
	if (vm_blk__activate(vm, err, errlen))
		return VM_INCOMING_WANTS_RUN;
	return vm__end_incoming(vm, VM_RUN_ALLOWED, stopped);
}

/* Runs the guest here (the source stopped it running and autostart: no
 * -S, no `stop` meanwhile) or leaves it stopped for `cont`; fails the
 * stream (its error returned) if this VM cannot take the guest or left
 * inmigrate meanwhile. */
static int incoming__resume(struct incoming *in)
{
	struct migration *m = in->m;
	struct vm *vm = m->vm;
	char err[512];
	pthread_mutex_lock(&m->lock);
	bool late = m->params.cap_late_block_activate;
	pthread_mutex_unlock(&m->lock);
	/* the guest is this VM's now: the source gave the disk's lock up
	 * after its last state, so take it (and forget any cached view) --
	 * with late-block-activate only if the guest runs now (incoming__end):
	 * one that stays stopped takes it at `cont`, so its source can still
	 * take it back until then.  Not so for a post-copy guest (its source
	 * has no whole copy) nor for RAM handed over in a file, which is
	 * taken here and after the disk, as the source takes them back. */
	uint64_t token = mig_recv__shared_token(&in->recv);
	bool take_disk = !late || in->postcopy || token;
	if (take_disk && vm_blk__activate(vm, err, sizeof(err)))
		return mig_recv__fail(&in->recv, -EBUSY, "%s: the guest does not run here", err);
	if (disk_in__complete(&in->disk, err, sizeof(err)))
		return mig_recv__fail(&in->recv, -EIO, "the disk: %s: the guest does not run here",
				      err);
	/* last, as it cannot be undone: the RAM handed over must be the one
	 * the source stopped, the token its stream carries still in the
	 * file's trailer (mem/memfile.h); if not, the disk goes back too */
	if (token && memfile__take_over(vm->memfile, token, err, sizeof(err))) {
		if (vm_blk__inactivate(vm))
			log_warn("incoming migration: the disk could not be given back");
		return mig_recv__fail(&in->recv, -ESTALE, "%s: the guest does not run here", err);
	}
	switch (incoming__end(in, take_disk, err, sizeof(err))) {
	case VM_INCOMING_WANTS_RUN:   /* as when the disk is taken above */
		return mig_recv__fail(&in->recv, -EBUSY, "%s: the guest does not run here", err);
	case VM_INCOMING_LEFT:
		/* the guest never ran here: the source may have its RAM back */
		if (token && memfile__give_back(vm->memfile, token))
			log_warn("incoming migration: the RAM could not be given back");
		return mig_recv__fail(&in->recv, -EINVAL, "the VM left inmigrate before it "
				      "could run");
	case VM_INCOMING_RAN:
		in->guest_here = true;   /* RESUME: told as it ran (vm.h) */
		break;
	case VM_INCOMING_STOPPED:
		in->guest_here = true;
		log_info("incoming migration: the guest is here, %s until `cont`",
			 vm_status__name(vm__status(vm)));
		break;
	}
	if (vm->net) {    /* the guest is this VM's now: tell the network */
		pthread_mutex_lock(&m->lock);
		struct announce_params ap = m->params.announce;
		pthread_mutex_unlock(&m->lock);
		if (vm_net__announce(vm, &ap))
			log_warn("virtio-net: the self-announcements did not start");
	}
	return 0;
}

/* ---- post-copy hooks (mig_recv_ops) ---- */

static int incoming__on_discard(void *ctx, uint32_t block, uint64_t offset)
{
	struct incoming *in = ctx;
	return postcopy_dst__discard(&in->pc, incoming__page(in, block, offset));
}

static void incoming__postcopy_stats(struct incoming *in);

/* query-migrate here sees post-copy's figures as they grow: from the
 * first page placed, then every 1024 */
static void incoming__note_placed(struct incoming *in)
{
	uint64_t n = atomic_load(&in->pc.placed);
	if (n == 1 || (n & 1023) == 0)
		incoming__postcopy_stats(in);
}

static int incoming__place_page(void *ctx, uint32_t block, uint64_t offset, const void *data)
{
	struct incoming *in = ctx;
	int rc = postcopy_dst__place(&in->pc, incoming__page(in, block, offset), data);
	incoming__note_placed(in);
	return rc;
}

static int incoming__place_zero(void *ctx, uint32_t block, uint64_t offset)
{
	struct incoming *in = ctx;
	int rc = postcopy_dst__place_zero(&in->pc, incoming__page(in, block, offset));
	incoming__note_placed(in);
	return rc;
}

static int incoming__postcopy_check(void *ctx, const uint8_t hash[PROTO_HASH_LEN])
{
	struct incoming *in = ctx;
	int rc = postcopy_dst__check(&in->pc, hash);
	if (!rc)
		log_info("incoming migration: x-verify: every page as it came matches the source's");
	return rc;
}

_Static_assert(BLOCKTIME_MAX_VCPUS >= VM_MAX_VCPUS, "blocktime covers every vCPU");

/* With postcopy-blocktime: the vCPUs' thread ids, for the fault thread. */
static int incoming__init_blocktime(struct incoming *in)
{
	struct migration *m = in->m;
	int tids[BLOCKTIME_MAX_VCPUS];
	pthread_mutex_lock(&m->lock);
	bool on = m->params.cap_postcopy_blocktime;
	pthread_mutex_unlock(&m->lock);
	if (!on || in->bt_ready)
		return 0;
	int rc = blocktime__init(&in->bt, tids, vm__vcpu_tids(m->vm, tids, BLOCKTIME_MAX_VCPUS));
	if (rc)
		return rc;
	in->bt_ready = true;
	in->pc.bt = &in->bt;
	return 0;
}

/* POSTCOPY: the state is complete; RAM goes under userfaultfd, the guest
 * runs, the source learns it (RP_RUNNING). */
static int incoming__on_postcopy(void *ctx)
{
	struct incoming *in = ctx;
	char err[256] = "";
	/* the channels' pages are in (the source's SYNC came before the
	 * discards) and no more come on them: close them before RAM is
	 * registered, so no channel thread can wait on a missing page */
	if (in->multifd && multifd_recv__finish(&in->mf))
		return mig_recv__fail(&in->recv, -EPROTO, "%s", in->mf.error);
	int rc = incoming__state_complete(in);
	if (rc)
		return rc;
	in->pc.verify = mig_recv__postcopy_verify(&in->recv);   /* x-verify at the source */
	rc = incoming__init_blocktime(in);
	if (rc)
		return mig_recv__fail(&in->recv, rc, "postcopy-blocktime: %s", strerror(-rc));
	rc = postcopy_dst__start(&in->pc, err, sizeof(err));
	if (rc)
		return mig_recv__fail(&in->recv, rc, "%s", err);
	in->postcopy = true;
	rc = incoming__resume(in);
	if (rc)
		return rc;
	uint8_t rec[PROTO_HDR_SIZE];
	ssize_t n = proto__encode_empty(rec, sizeof(rec), PROTO_RP_RUNNING);
	/* the source paces its push by RP_ACK from the first page on */
	rc = postcopy_dst__ack(&in->pc, mig_stream__consumed(&in->stream), true);
	rc = rc ? rc : n < 0 ? (int)n : postcopy_dst__reply(&in->pc, rec, (size_t)n);
	if (rc) {
		/* the guest runs here already: a broken link pauses, as later */
		log_warn("incoming migration: cannot tell the source the guest runs: %s",
			 strerror(-rc));
		mig_stream__shutdown(&in->stream);
	}
	migration__set_status(in->m, MIG_POSTCOPY_ACTIVE);
	log_info("incoming migration: post-copy, the guest is here (%s)",
		 vm_status__name(vm__status(in->m->vm)));
	return 0;
}

static void incoming__postcopy_stats(struct incoming *in)
{
	pthread_mutex_lock(&in->m->lock);
	in->m->stats.postcopy_faults = atomic_load(&in->pc.faults);
	in->m->stats.postcopy_asked = atomic_load(&in->pc.requests);
	in->m->stats.postcopy_zero_mapped = atomic_load(&in->pc.zero_mapped);
	in->m->stats.postcopy_lat_p50_us = postcopy_dst__latency_us(&in->pc, 50);
	in->m->stats.postcopy_lat_p99_us = postcopy_dst__latency_us(&in->pc, 99);
	in->m->stats.preempt = atomic_load(&in->preempt_on);
	in->m->stats.preempt_pages = atomic_load(&in->preempt.pages);
	if (in->bt_ready) {
		struct mig_stats *st = &in->m->stats;
		st->blocktime = true;
		st->blocktime_vcpus = in->bt.nr_vcpus;
		st->blocktime_ms = blocktime__read(&in->bt, time__now_ns(), st->vcpu_blocktime_ms);
	}
	pthread_mutex_unlock(&in->m->lock);
}

/* Every record of the main stream; in post-copy, what was read and
 * applied is acknowledged as it goes (postcopy_dst__ack).  A lost link
 * shows in the next read, not here. */
static int incoming__run(struct incoming *in)
{
	while (mig_recv__state(&in->recv) != MIG_RECV_DONE) {
		int rc = mig_recv__step(&in->recv, &in->stream);
		if (rc)
			return rc;
		rc = in->postcopy ? postcopy_dst__ack(&in->pc, mig_stream__consumed(&in->stream),
						      false) : 0;
		if (rc && rc != -ENOTCONN)
			log_debug("post-copy: RP_ACK not sent: %s", strerror(-rc));
	}
	return 0;
}

/* Loads the whole stream; 0 when the guest may resume. */
static int incoming__load(struct incoming *in)
{
	int rc = incoming__run(in);
	if (in->multifd && multifd_recv__finish(&in->mf)) {
		migration__set_error(in->m, "%s", in->mf.error); /* the root cause */
		return mig_recv__fail(&in->recv, -EPROTO, "%s", in->mf.error);
	}
	if (rc)
		return rc;
	rc = incoming__state_complete(in);
	if (rc)
		return rc;
	if (mig_recv__checksum_present(&in->recv) && !mig_recv__checksum_ok(&in->recv))
		return mig_recv__fail(&in->recv, -EIO, "guest RAM checksum mismatch (x-verify)");
	return 0;
}

/* The header of a connection's first record, left unread: of type want
 * (START, or RESUME on a recovery), within INCOMING_FIRST_RECORD_MS when
 * bounded (a connection from a listener, which may be a stray; a stream
 * of exec:, file: or fd: has no rival and waits as long as it takes).
 * INCOMING_LATER with *type set: a plain connection that begins with the
 * first record of a later connection of a migration (PREEMPT, CHANNEL),
 * which has come whole within the same time. */
static int incoming__first_header(struct mig_stream *s, uint32_t want, bool tls, bool bounded,
				  uint32_t *type, char *why, size_t len)
{
	uint8_t b[PROTO_HDR_SIZE];
	struct proto_hdr h;
	uint64_t t0 = time__now_ms();
	if (bounded)
		mig_stream__set_read_deadline(s, t0 + INCOMING_FIRST_RECORD_MS);
	int rc = mig_stream__peek(s, b, sizeof(b));
	mig_stream__set_read_deadline(s, 0);
	if (rc == -ETIMEDOUT)
		snprintf(why, len, "silent: no record header within %d s",
			 INCOMING_FIRST_RECORD_MS / 1000);
	else if (rc)
		snprintf(why, len, "%s", mig_stream__strerror(s));
	if (rc)
		return rc;
	bool framed = !proto__decode_header(b, sizeof(b), &h);
	if (framed && h.type == want)
		return 0;
	if (framed && !tls && (h.type == PROTO_PREEMPT || h.type == PROTO_CHANNEL)) {
		*type = h.type;
		if (!bounded)   /* a local stream: never held, no need of the rest */
			return INCOMING_LATER;
		/* the rest of it (20 or 24 bytes: decode_header checked the
		 * length) under the same deadline, while a cancel can still shut
		 * the stream down */
		uint8_t rec[PROTO_HDR_SIZE + 64];
		mig_stream__set_read_deadline(s, t0 + INCOMING_FIRST_RECORD_MS);
		rc = h.length > sizeof(rec) - PROTO_HDR_SIZE ? -EPROTO :
		     mig_stream__peek(s, rec, PROTO_HDR_SIZE + h.length);
		mig_stream__set_read_deadline(s, 0);
		if (rc)
			snprintf(why, len, "a %s's first record, not whole within %d s",
				 incoming__kind(h.type), INCOMING_FIRST_RECORD_MS / 1000);
		return rc ? rc : INCOMING_LATER;
	}
	snprintf(why, len, "not a kmig migration stream (first bytes %02x %02x %02x %02x%s)",
		 b[0], b[1], b[2], b[3], b[0] == 0x16 && b[1] == 3 && !tls ?
		 ": a TLS handshake, and tls-creds is not set here" : "");
	return -EPROTO;
}

/* A connection just taken into in->stream (bounded: from the listener):
 * its TLS handshake (with tls-creds) and its first record's header.  0, or
 * -errno with why set, or INCOMING_LATER (*type: a later connection's
 * first record). */
static int incoming__vet(struct incoming *in, uint32_t want, bool bounded, uint32_t *type,
			 char *why, size_t len)
{
	struct migration *m = in->m;
	/* the return path carries one small record: send it at once */
	if (mig_stream__set_nodelay(&in->stream, true))
		log_debug("incoming migration: TCP_NODELAY not set");
	if (m->tls_in.creds) {
		int rc = tls__server(&in->stream, &m->tls_in, why, len);
		if (rc)
			return rc;
		log_info("incoming migration: TLS 1.3 with '%s'", m->tls_in.creds->id);
		/* the channels must come from the same client */
		if (tls__peer(&in->stream, &m->tls_in, in->mf.peer, sizeof(in->mf.peer)))
			in->mf.peer[0] = 0;
	}
	return incoming__first_header(&in->stream, want, m->tls_in.creds != NULL, bounded, type,
				      why, len);
}

/* Takes the source's connection into in->stream.  One of its later
 * connections that speaks first is held for its turn (incoming__hold);
 * one that fails its TLS handshake or does not begin with a `want` record
 * is dropped and counted (migration__stray): the listener waits on. */
static int incoming__take(struct incoming *in, uint32_t want, char *err, size_t errlen)
{
	struct migration *m = in->m;
	for (;;) {
		int rc = mig_listener__accept(&in->listener, &in->stream, 0, err, errlen);
		pthread_mutex_lock(&m->lock);
		in->connected = rc == 0;
		if (in->cancelled && !rc)
			mig_stream__shutdown(&in->stream);
		pthread_mutex_unlock(&m->lock);
		if (rc)
			return rc;
		char why[200] = "";
		uint32_t type = 0;
		rc = incoming__vet(in, want, true, &type, why, sizeof(why));
		if (!rc)
			return 0;
		pthread_mutex_lock(&m->lock);
		in->connected = false;
		bool cancelled = in->cancelled;
		pthread_mutex_unlock(&m->lock);
		if (!cancelled && rc == INCOMING_LATER &&
		    incoming__hold(in, &in->stream, type, why, sizeof(why)))
			continue;
		mig_stream__close(&in->stream);
		if (cancelled)
			return utf8__err(err, errlen, -ECANCELED, "cancelled");
		migration__stray(m, "connection", why);
	}
}

static void incoming__silent(void *ctx, const char *why)
{
	migration__stray(ctx, "connection", why);
}

/* exec:, file:, fd: (u): the stream is there already, with no listener
 * and no other peer that could connect: what it begins with decides. */
static int incoming__open_local(struct incoming *in, const struct mig_uri *u, char *err,
				size_t errlen)
{
	struct migration *m = in->m;
	int rc = mig_stream__open_local(&in->stream, u, false, m->in_fd, err, errlen);
	m->in_fd = -1;          /* the stream's now, or closed */
	if (rc)
		return rc;
	pthread_mutex_lock(&m->lock);
	in->connected = true;
	if (in->cancelled)
		mig_stream__shutdown(&in->stream);
	pthread_mutex_unlock(&m->lock);
	log_info("incoming migration: reading %s stream from %s",
		 mig_stream__two_way(&in->stream) ? "a socket's" : "a one-way", m->in_uri);
	char why[200];
	uint32_t type;
	rc = incoming__vet(in, PROTO_START, false, &type, why, sizeof(why));
	if (rc == INCOMING_LATER) {     /* no later connection on a local stream */
		rc = -EPROTO;
		snprintf(why, sizeof(why), "not a kmig migration stream (it begins with a %s's "
			 "record)", incoming__kind(type));
	}
	if (!rc)
		return 0;
	utf8__err(err, errlen, rc, "%s", why);
	pthread_mutex_lock(&m->lock);
	in->connected = false;
	pthread_mutex_unlock(&m->lock);
	mig_stream__close(&in->stream);         /* and exec:'s command with it */
	return rc;
}

/* Under m->lock, the listener just open: where it listens, for QMP's
 * socket-address, and as a URI for the log (the port bound, also after
 * port 0). */
static void incoming__show_address(struct incoming *in, char *where, size_t len)
{
	struct migration *m = in->m;
	const struct mig_listener *l = &in->listener;
	if (l->path[0]) {
		snprintf(m->in_path, sizeof(m->in_path), "%s", l->path);
		snprintf(where, len, "unix:%s", m->in_path);
		return;
	}
	if (!l->host[0]) {     /* not known: no socket-address */
		snprintf(where, len, "port %u", l->port);
		return;
	}
	snprintf(m->in_host, sizeof(m->in_host), "%s", l->host);
	m->in_port = l->port;
	bool v6 = strchr(m->in_host, ':') != NULL;
	snprintf(where, len, "tcp:%s%s%s:%u", v6 ? "[" : "", m->in_host, v6 ? "]" : "", m->in_port);
}

/* Listens on uri and takes the source's connection, which begins with a
 * `want` record; `ready`, unless MIG_NONE, is the status once the
 * listener is open (the peer may connect). */
static int incoming__accept(struct incoming *in, const char *uri, uint32_t want,
			    enum mig_status ready)
{
	char err[256];
	struct migration *m = in->m;
	struct mig_uri u;
	if (!mig_uri__parse(uri, &u, NULL, 0) && !mig_uri__is_socket(&u)) {
		int rc = incoming__open_local(in, &u, err, sizeof(err));
		if (rc)
			migration__set_error(m, "%s", err);
		return rc;
	}
	incoming__close_listener(in);
	int rc = mig_listener__open(&in->listener, uri, err, sizeof(err));
	if (!rc) {
		in->listener.on_drop = incoming__silent;
		in->listener.drop_ctx = m;
		char where[200];
		pthread_mutex_lock(&m->lock);
		in->listening = true;
		incoming__show_address(in, where, sizeof(where));
		if (in->cancelled)
			mig_listener__shutdown(&in->listener);
		pthread_mutex_unlock(&m->lock);
		log_info("incoming migration: listening on %s", where);
		if (ready != MIG_NONE)
			migration__set_status(m, ready);
		rc = incoming__take(in, want, err, sizeof(err));
	}
	if (rc)
		migration__set_error(in->m, "%s", err);
	return rc;
}

/* After refusing a stream: stop sending and read what the source still
 * sends for a while, so closing does not reset the connection before the
 * source has read our reason. */
static void incoming__linger(struct incoming *in)
{
	char buf[65536];
	shutdown(in->stream.fd, SHUT_WR);
	for (int i = 0; i < 40; i++) {
		struct pollfd p = { .fd = in->stream.fd, .events = POLLIN };
		if (poll(&p, 1, 50) < 0)
			return;
		if (p.revents && read(in->stream.fd, buf, sizeof(buf)) <= 0)
			return;
	}
}

/* The totals, and the status a client reads: set before the source is
 * told, so a client that saw the source complete finds this side complete
 * too. */
static void incoming__complete(struct incoming *in)
{
	struct migration *m = in->m;
	const struct mig_recv_stats *st = mig_recv__stats(&in->recv);
	/* pages with contents: whole, and changed by an XBZRLE delta */
	uint64_t pages = st->pages + st->xbzrle_pages, zero = st->zero_pages, bytes = st->bytes;
	uint64_t cp, cz, cb, pp, pz, pb;
	multifd_recv__stats(&in->mf, &cp, &cz, &cb);
	preempt_in__totals(&in->preempt, &pp, &pz, &pb);     /* closed: joined */
	pages += cp + pp;
	zero += cz + pz;
	bytes += cb + pb;
	pthread_mutex_lock(&m->lock);
	m->stats.transferred = bytes;
	m->stats.normal = pages;
	m->stats.duplicate = zero;
	m->stats.total_ms = time__now_ms() - m->stats.start_ms;
	pthread_mutex_unlock(&m->lock);
	log_info("incoming migration completed: %llu pages, %llu zero pages, %llu bytes",
		 (unsigned long long)pages, (unsigned long long)zero,
		 (unsigned long long)bytes);
	migration__set_status(m, MIG_COMPLETED);
}

static void incoming__finish(struct incoming *in, int rc, bool connected)
{
	struct migration *m = in->m;
	int fault_rc = in->postcopy ? atomic_load(&in->pc.error) : 0;
	uint64_t t_end = time__now_ms();
	preempt_in__close(&in->preempt);   /* it places pages: it stops first */
	if (in->postcopy) {
		/* every page is in: RAM is plain memory again.  After a failure
		 * it stays registered, so a missing page is never zero-filled */
		if (!rc) {
			postcopy_dst__finish(&in->pc);
		} else {
			int fd = postcopy_dst__release(&in->pc);
			pthread_mutex_lock(&m->lock);
			m->pc_uffd = fd;
			pthread_mutex_unlock(&m->lock);
		}
		incoming__postcopy_stats(in);
		postcopy_dst__free(&in->pc);
		in->pc_ready = false;
	} else if (!rc) {   /* RP_OK only once the guest runs here */
		rc = incoming__resume(in);
		log_debug("switchover: the guest resumed %llu ms after END",
			  (unsigned long long)(time__now_ms() - t_end));
	}
	if (!rc)
		incoming__complete(in);
	if (connected && mig_stream__two_way(&in->stream)) {
		log_debug("switchover: answering the source %llu ms after END",
			  (unsigned long long)(time__now_ms() - t_end));
		int r2 = mig_recv__reply(&in->recv, &in->stream);
		if (r2 && !rc)
			log_warn("incoming migration: could not confirm to the source: %s",
				 strerror(-r2));
		if (rc)
			incoming__linger(in);
	}
	if (rc) {
		if (in->guest_here)
			migration__set_error(m, "post-copy broke off with the guest here "
					     "(%s): it cannot go on without the pages it lacks",
					     fault_rc ? strerror(-fault_rc) : mig_recv__error(&in->recv));
		if (connected && mig_recv__error(&in->recv)[0])
			migration__set_error(m, "%s", mig_recv__error(&in->recv));
		migration__set_error(m, "%s", strerror(-rc));
		log_err("incoming migration failed: %s", m->error);
		migration__set_status(m, MIG_FAILED);
		/* a destination that never took the guest exits (post-copy's
		 * too, if it failed to take it); one that took it stays, with
		 * the guest and its state as they are */
		if (!in->guest_here)
			atomic_store(&m->ctl->incoming_failed, true);
		control__wake(m->ctl);
	}
}

/* ---- post-copy recovery (docs/protocol.md "Post-copy recovery") ---- */

/* The first record of the source's new connection: RESUME, with our RAM
 * layout. */
static int incoming__check_resume(struct incoming *in, char *err, size_t errlen)
{
	struct proto_hdr h;
	uint8_t buf[PROTO_MAGIC_LEN + 12 + 16 * PROTO_MAX_BLOCKS];
	struct proto_start st;
	const char *why = NULL;
	char msg[200];
	mig_stream__set_read_deadline(&in->stream, time__now_ms() + INCOMING_CHANNEL_WAIT_MS);
	int rc = mig_stream__get_record(&in->stream, &h, buf, sizeof(buf));
	mig_stream__set_read_deadline(&in->stream, 0);
	if (rc)
		snprintf(err, errlen, "no RESUME on the new connection: %s",
			 mig_stream__strerror(&in->stream));
	else if (h.type != PROTO_RESUME && (rc = -EPROTO))
		snprintf(err, errlen, "the new connection began with %s, not RESUME",
			 proto__type_name(h.type));
	else if (proto__decode_start(buf, h.length, h.flags, &st, &why) && (rc = -EPROTO))
		snprintf(err, errlen, "RESUME: %s", why);
	else if (proto__layout_mismatch(&st, &in->pr, msg, sizeof(msg)) && (rc = -EINVAL))
		snprintf(err, errlen, "RESUME: the RAM layout differs: %s", msg);
	return rc;
}

/* Closes the link (post-copy state stays as it is) and the preempt
 * channel (a recovery reopens it). */
static void incoming__drop_link(struct incoming *in)
{
	preempt_in__close(&in->preempt);
	postcopy_dst__pause(&in->pc);
	pthread_mutex_lock(&in->m->lock);
	bool was = in->connected;
	in->connected = false;
	pthread_mutex_unlock(&in->m->lock);
	if (was)
		mig_stream__close(&in->stream);
}

/* One recovery: the source's new connection on the URI migrate-recover
 * gave, its RESUME, our bitmap and repeated requests back, the receiver
 * in POSTCOPY again.  0, or -errno with err set and the link closed. */
static int incoming__reconnect(struct incoming *in, char *err, size_t errlen)
{
	struct migration *m = in->m;
	char uri[MIG_URI_MAX];
	pthread_mutex_lock(&m->lock);
	snprintf(uri, sizeof(uri), "%s", m->in_uri);
	m->error[0] = 0;
	pthread_mutex_unlock(&m->lock);
	/* a migration that had the preempt channel gets it again: the
	 * listener stays for its connection, which follows PREEMPT */
	bool preempt = atomic_load(&in->preempt_on);
	preempt_in__rearm(&in->preempt);
	int rc = incoming__accept(in, uri, PROTO_RESUME, MIG_POSTCOPY_RECOVER);
	if (!preempt)   /* else closed once the channel is in, or on a failure below */
		incoming__close_listener(in);
	if (rc) {
		pthread_mutex_lock(&m->lock);
		snprintf(err, errlen, "%s", m->error);
		pthread_mutex_unlock(&m->lock);
	}
	rc = rc ? rc : incoming__check_resume(in, err, errlen);
	if (!rc && (rc = postcopy_dst__resume(&in->pc, &in->stream)))
		snprintf(err, errlen, "cannot answer RESUME: %s", strerror(-rc));
	if (!rc && (rc = mig_recv__resume(&in->recv)))
		snprintf(err, errlen, "the receiver cannot resume");
	if (rc) {
		incoming__close_listener(in);
		incoming__drop_link(in);
		return rc;
	}
	if (preempt)
		mig_recv__expect_preempt(&in->recv);
	pthread_mutex_lock(&m->lock);
	m->error[0] = 0;
	pthread_mutex_unlock(&m->lock);
	migration__set_status(m, MIG_POSTCOPY_ACTIVE);
	log_info("incoming migration: post-copy resumed on %s", uri);
	return 0;
}

/* Post-copy lost its link (rc): postcopy-paused, the guest's missing
 * pages waiting, until migrate-recover brings a new link and loading goes
 * on, or a cancel or quit (rc stands).  Returns loading's outcome. */
static int incoming__paused(struct incoming *in, int rc)
{
	struct migration *m = in->m;
	char why[256];
	snprintf(why, sizeof(why), "%s", mig_recv__error(&in->recv));
	/* a fault thread that stopped (pc.error) is no lost link: after a
	 * recovery nobody would answer the guest's faults */
	while (rc && in->postcopy && mig_recv__link_lost(&in->recv) &&
	       !atomic_load(&in->pc.error)) {
		incoming__drop_link(in);
		incoming__close_listener(in);   /* migrate-recover opens one, maybe on its URI */
		pthread_mutex_lock(&m->lock);
		snprintf(m->error, sizeof(m->error), "post-copy paused, the link to the source broke "
			 "(%.60s): the guest cannot go on without the source's pages; "
			 "migrate-recover here and migrate resume=true there continue", why);
		utf8__sanitize(m->error);
		pthread_mutex_unlock(&m->lock);
		incoming__postcopy_stats(in);
		migration__set_status(m, MIG_POSTCOPY_PAUSED);
		log_warn("incoming migration: %s", m->error);
		bool go = migration__await_recovery(m, &m->recover, &in->cancelled) &&
			  !atomic_load(&in->pc.error);
		int r = go ? incoming__reconnect(in, why, sizeof(why)) : 0;
		pthread_mutex_lock(&m->lock);
		m->recovering = false;
		pthread_mutex_unlock(&m->lock);
		if (!go)
			return rc;
		if (r) {
			log_warn("incoming migration: post-copy recovery failed: %s", why);
			continue;
		}
		rc = incoming__load(in);
		snprintf(why, sizeof(why), "%s", mig_recv__error(&in->recv));
	}
	return rc;
}

/* postcopy-ram as it is when the source connects (a destination may set
 * it while it listens): the post-copy hooks and their state. */
static int incoming__postcopy_ops(struct incoming *in, struct mig_recv_ops *ops)
{
	struct migration *m = in->m;
	pthread_mutex_lock(&m->lock);
	bool postcopy = m->params.cap_postcopy_ram;
	bool preempt = m->params.cap_postcopy_preempt;
	pthread_mutex_unlock(&m->lock);
	if (!postcopy)
		return 0;
	if (preempt)
		ops->on_preempt = incoming__on_preempt;
	ops->on_postcopy_end = incoming__on_postcopy_end;
	ops->on_discard = incoming__on_discard;
	ops->on_postcopy = incoming__on_postcopy;
	ops->place_page = incoming__place_page;
	ops->place_zero = incoming__place_zero;
	ops->postcopy_check = incoming__postcopy_check;
	int rc = postcopy_dst__init(&in->pc, &m->vm->ram, &in->stream, &in->written);
	in->pc_ready = rc == 0;
	if (rc) {
		migration__set_error(m, "out of memory for post-copy");
		return rc;
	}
	/* refused now, while the source still has the whole guest, rather
	 * than at the switch (set-capabilities asked already; the RAM is
	 * asked again as the source comes) */
	char why[160];
	rc = postcopy_dst__probe(&m->vm->ram, why, sizeof(why));
	if (rc)
		migration__set_error(m, "post-copy is not possible here: %s", why);
	return rc;
}

void *migration__incoming_thread(void *arg)
{
	struct migration *m = arg;
	struct incoming *in = calloc(1, sizeof(*in));
	pthread_setname_np(pthread_self(), "incoming");
	if (!in)
		return NULL;
	in->m = m;
	migration__proto_ram(&m->vm->ram, &in->pr);
	struct mig_recv_ops ops = { .on_state = incoming__on_state, .on_zero = incoming__on_zero,
				    .on_page_written = incoming__on_page, .on_sync = incoming__on_sync,
				    .on_channels = incoming__on_channels, .on_disk = incoming__on_disk,
				    .on_start = incoming__on_start,
				    .ctx = in };
	disk_in__init(&in->disk, m->vm->blkfile);
	preempt_in__init(&in->preempt, &in->stream);
	multifd_recv__init(&in->mf, &in->pr, &ops, &in->stream);
	in->mf.tls = m->tls_in.creds ? &m->tls_in : NULL;
	pthread_mutex_lock(&m->lock);
	m->in_cancel = incoming__cancel;
	m->in_pause = incoming__pause;
	m->in_ctx = in;
	in->cancelled = m->in_cancelled;  /* a cancel that came before the thread ran */
	pthread_mutex_unlock(&m->lock);
	int rc = bitmap__init(&in->written, m->vm->ram.npages);
	in->nexpected = state__expected_slots(m->vm, in->expected, INCOMING_MAX_SECTIONS);
	if (!rc && in->nexpected < 0) {
		migration__set_error(m, "this VM has more state sections than %d",
				     INCOMING_MAX_SECTIONS);
		rc = in->nexpected;
	}
	if (!rc)
		rc = incoming__accept(in, m->in_uri, PROTO_START, MIG_NONE);
	bool connected = rc == 0, recv_ready = false;
	if (!rc) {
		pthread_mutex_lock(&m->lock);
		m->stats.start_ms = time__now_ms();
		pthread_mutex_unlock(&m->lock);
		migration__set_status(m, MIG_ACTIVE);
		rc = incoming__postcopy_ops(in, &ops);
		if (!rc)
			rc = mig_recv__init(&in->recv, &in->pr, &ops);
		recv_ready = rc == 0;
		if (!rc)
			rc = incoming__load(in);
		rc = incoming__paused(in, rc);
		connected = in->connected;   /* after a recovery: the last link, or none */
	}
	incoming__close_listener(in);
	incoming__finish(in, rc, connected);
	pthread_mutex_lock(&m->lock);
	m->in_cancel = NULL;
	m->in_pause = NULL;
	m->in_ctx = NULL;
	in->connected = false;
	pthread_mutex_unlock(&m->lock);
	if (recv_ready)
		mig_recv__free(&in->recv);
	if (connected)
		mig_stream__close(&in->stream);
	if (in->pc_ready)
		postcopy_dst__free(&in->pc);
	if (in->bt_ready)
		blocktime__free(&in->bt);
	preempt_in__free(&in->preempt);
	bitmap__free(&in->written);
	disk_in__free(&in->disk);
	free(in);
	return NULL;
}

int migration__incoming(struct migration *m, const char *uri, char *err, size_t errlen)
{
	if (m->in_running) {
		snprintf(err, errlen, "The incoming migration has already been started");
		return -EBUSY;
	}
	if (vm__status(m->vm) != VM_STATUS_INMIGRATE) {
		snprintf(err, errlen, "'-incoming' was not specified on the command line");
		return -EINVAL;
	}
	struct mig_uri u;
	if (mig_uri__parse(uri, &u, err, errlen))
		return -EINVAL;
	pthread_mutex_lock(&m->lock);
	struct mig_params p = m->params;
	pthread_mutex_unlock(&m->lock);
	if (tls_config__resolve(&m->tls, true, p.tls_creds, NULL, p.tls_authz, uri, &m->tls_in,
				err, errlen))
		return -EINVAL;
	int fd = u.kind == MIG_URI_FD ? migration__fd(m, u.arg, err, errlen) : -1;
	if (u.kind == MIG_URI_FD && fd < 0)
		return fd;
	if (!mig_uri__is_socket(&u) && p.tls_creds[0] && !migration__fd_is_socket(fd)) {
		migration__drop_fd(&fd);
		snprintf(err, errlen, "tls-creds needs a connection, and a %s: URI has none",
			 mig_uri__local_name(&u));
		return -EINVAL;
	}
	migration__drop_fd(&m->in_fd);
	m->in_fd = fd;
	snprintf(m->in_uri, sizeof(m->in_uri), "%s", uri);
	pthread_mutex_lock(&m->lock);
	m->in_cancelled = false;
	m->strays = 0;
	m->stray_why[0] = 0;
	pthread_mutex_unlock(&m->lock);
	migration__set_status(m, MIG_SETUP);
	int rc = pthread_create(&m->in_thread, NULL, migration__incoming_thread, m);
	if (rc) {
		snprintf(err, errlen, "cannot start the incoming migration thread");
		return -rc;
	}
	m->in_running = true;
	return 0;
}
