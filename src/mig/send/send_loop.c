/* The outgoing migration thread: phases and failure handling. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/random.h>

#include "base/timeutil.h"
#include "ctl/control.h"
#include "dev/balloon.h"
#include "dev/net.h"
#include "kvm/vm.h"
#include "mem/dirty.h"
#include "mem/memfile.h"
#include "mig/send/send_impl.h"

/* room for a ZERO batch, or a PAGES batch written whole (compression) */
#define SENDER_REC_CAP (PROTO_HDR_SIZE + 16 + SENDER_BATCH_ZERO * 8 + \
			SENDER_BATCH_PAGES * (8 + RAM_PAGE_SIZE))

void sender__update_stats(struct sender *s)
{
	struct migration *m = s->m;
	uint64_t now = time__now_ms();
	pthread_mutex_lock(&m->lock);
	struct mig_stats *st = &m->stats;
	st->transferred = sender__bytes(s);
	if (s->mf) {
		st->multifd_bytes = multifd_send__bytes(s->mf);
		st->zc_missed = multifd_send__zc_missed(s->mf);
	}
	st->duplicate = s->zero_pages;
	st->normal = s->normal_pages;
	st->normal_bytes = s->normal_pages * RAM_PAGE_SIZE;
	st->free_skipped = s->free_skipped;
	st->balloon_skipped = s->balloon_skipped;
	st->remaining = bitmap__count(&m->todo) * RAM_PAGE_SIZE;
	st->total_ms = now - st->start_ms;
	uint64_t active = now > s->active_start_ms ? now - s->active_start_ms : 0;
	if (active) {
		st->mbps = (double)st->transferred * 8.0 / 1e6 / ((double)active / 1000.0);
		st->pages_per_second = (s->zero_pages + s->normal_pages + s->xb.pages) * 1000 /
					active;
	}
	st->throttle_pct = atomic_load(&m->vm->throttle_pct);
	sender__xbzrle_stats(s, st);
	if (s->disk_on) {
		st->disk_transferred = s->disk_bytes;
		st->disk_remaining = sender__disk_pending(s);
		st->disk_normal = s->disk_data;
		st->disk_duplicate = s->disk_zero;
		st->disk_dirtied = s->disk.dirtied;
		st->disk_data_bytes = s->disk_data_bytes;
	}
	if (m->status == MIG_SETUP || m->status == MIG_ACTIVE)
		st->precopy_bytes = st->transferred;
	pthread_mutex_unlock(&m->lock);
}

/* Announces the extra channels on the main stream and opens them. */
static int sender__open_channels(struct sender *s, const char *uri, const struct proto_ram *pr)
{
	struct migration *m = s->m;
	unsigned n = m->params.multifd_channels;
	char err[256];
	ssize_t len = proto__encode_channel(s->rec, s->rec_cap, 0, n, s->session);
	int rc = len < 0 ? (int)len : mig_stream__write(s->stream, s->rec, (size_t)len);
	if (!rc)
		rc = mig_stream__flush(s->stream);
	if (rc)
		return rc;
	pthread_mutex_lock(&m->lock);
	m->mf_open = true; /* migrate_cancel may shut the channels down from now on */
	pthread_mutex_unlock(&m->lock);
	s->mf = &m->mf;
	m->mf.threads = &m->threads;
	pthread_mutex_lock(&m->lock);
	m->mf.zero_copy = m->params.cap_zero_copy_send;
	pthread_mutex_unlock(&m->lock);
	rc = multifd_send__open(&m->mf, n, uri, pr, s->chan_comp, m->params.max_bandwidth,
				m->tls_out.creds ? &m->tls_out : NULL, s->session, err, sizeof(err));
	if (rc)
		migration__set_error(m, "%s", err);
	return rc;
}

/* Free page hints: the driver holds each page it hints until DONE (after
 * the bulk pass), and the pass re-protects a page's chunk before it skips
 * the page, so a hinted page the guest takes back is logged and sent.
 * By default the pass starts at once and skips what has been hinted by
 * the time it gets there; x-free-page-hint-wait makes it wait for hints
 * first (up to that long; 250 ms for the driver's first answer, then
 * until it is quiet for 200 ms). */
static void sender__start_hints(struct sender *s)
{
	struct migration *m = s->m;
	struct balloon *b = m->vm->balloon;
	if (!b || !balloon__hint_ready(b) || balloon__hint_start(b))
		return;
	pthread_mutex_lock(&m->lock);
	uint64_t wait = m->params.hint_wait_ms;
	pthread_mutex_unlock(&m->lock);
	if (!wait) {
		log_info("migration: free page hinting runs alongside the bulk pass");
		return;
	}
	unsigned ack = wait < 250 ? (unsigned)wait : 250;
	log_info("migration: %llu free pages hinted before the bulk pass",
		 (unsigned long long)balloon__hint_wait(b, ack, 200, (unsigned)wait));
}

int sender__tls(struct sender *s, char *err, size_t errlen)
{
	const struct tls_config *tls = &s->m->tls_out;
	if (!tls->creds)
		return 0;
	int rc = tls__client(s->stream, tls, err, errlen);
	if (!rc)
		log_info("migration: TLS 1.3 with '%s'", tls->creds->id);
	return rc;
}

static int sender__setup(struct sender *s, const char *uri)
{
	struct migration *m = s->m;
	char err[256];
	struct mig_uri u;
	int rc = mig_uri__parse(uri, &u, err, sizeof(err));
	if (!rc && mig_uri__is_socket(&u)) {
		rc = mig_stream__connect(s->stream, uri, &m->cancel, err, sizeof(err));
	} else if (!rc) {
		rc = mig_stream__open_local(s->stream, &u, true, m->out_fd, err, sizeof(err));
		m->out_fd = -1;         /* the stream's now, or closed */
		if (!rc)
			log_info("migration: %s stream to %s", mig_stream__two_way(s->stream) ?
				 "a socket's" : "a one-way", uri);
	}
	if (rc) {
		migration__set_error(m, "%s", err);
		return rc;
	}
	pthread_mutex_lock(&m->lock);
	m->stream_open = true; /* migrate_cancel may shut it down from now on */
	bool cancelled = atomic_load(&m->cancel);
	pthread_mutex_unlock(&m->lock);
	if (cancelled)
		return -ECANCELED;
	rc = sender__tls(s, err, sizeof(err));
	if (rc) {
		migration__set_error(m, "%s", err);
		return rc;
	}
	mig_stream__set_rate(s->stream, m->params.max_bandwidth);
	struct proto_start st;
	struct proto_ram *pr = &s->pr;
	migration__proto_ram(s->ram, pr);
	proto_start__from_ram(&st, pr);
	st.ram_shared = s->ram_shared;
	st.has_uuid = m->params.cap_validate_uuid && m->vm->cfg.has_uuid;
	memcpy(st.uuid, m->vm->cfg.uuid, sizeof(st.uuid));
	ssize_t n = proto__encode_start(s->rec, s->rec_cap, &st);
	rc = n < 0 ? (int)n : mig_stream__write(s->stream, s->rec, (size_t)n);
	/* at once: until START arrives the destination takes this connection
	 * for a stray, and what follows (dirty tracking's start, the hints)
	 * may take seconds on a big or slow host */
	rc = rc ? rc : mig_stream__flush(s->stream);
	if (rc)
		return rc;
	bool more = m->params.cap_multifd || m->params.cap_postcopy_preempt;
	if (more && getrandom(s->session, sizeof(s->session), 0) != (ssize_t)sizeof(s->session)) {
		migration__set_error(m, "no random bytes for the migration's session: %s",
				     strerror(errno));
		return -EIO;
	}
	/* the preempt channel first: it is in before the multifd channels
	 * connect, so the destination never takes one for the other */
	if (m->params.cap_postcopy_preempt)
		rc = sender__preempt_open(s, uri);
	if (!rc && m->params.cap_multifd)
		rc = sender__open_channels(s, uri, pr);
	if (!rc)
		rc = sender__disk_setup(s);
	if (rc || s->snapshot)    /* it tracks writes its own way */
		return rc;
	if (s->ram_shared) {      /* no page is sent: nothing to track */
		bitmap__clear_all(&m->todo);
		pthread_mutex_lock(&m->lock);
		m->stats.ram_shared = true;
		pthread_mutex_unlock(&m->lock);
		log_info("migration: x-ignore-shared: RAM stays in %s and is handed over, not sent",
			 m->vm->memfile->path);
		return 0;
	}
	rc = dirty__start(m->vm->dirty);
	if (rc) {
		migration__set_error(m, "cannot start dirty tracking: %s", strerror(-rc));
		return rc;
	}
	s->tracking = true;
	/* Collect what tracking reports at once (KVM_DIRTY_LOG_INITIALLY_SET:
	 * everything) without protecting it: the bulk pass sends all and
	 * re-protects each chunk as it reaches it. */
	int64_t got = dirty__sync(m->vm->dirty, &m->todo, DIRTY_SYNC_DEFER_CLEAR);
	if (got < 0)
		return (int)got;
	bitmap__set_all(&m->todo);
	sender__start_hints(s);
	return 0;
}

/* x-final-round: the first time the policy would switch over with much
 * still to send, one more round goes first (the next decision stands). */
static bool sender__hold_for_final_round(struct sender *s, const struct policy_input *in,
					 uint64_t limit_ms)
{
	struct migration *m = s->m;
	pthread_mutex_lock(&m->lock);
	bool on = m->params.final_round;
	pthread_mutex_unlock(&m->lock);
	if (!on || s->final_round || !policy__final_round(in, limit_ms))
		return false;
	s->final_round = true;
	log_debug("migration: one more round before the switchover (%llu KiB left)",
		  (unsigned long long)(in->remaining_bytes >> 10));
	return true;
}

/* The hybrid's switch, as migrate-start-postcopy; false (said once) when
 * that refuses. */
static bool sender__hybrid_switch(struct sender *s, const struct policy_input *in,
				  const char *when)
{
	struct migration *m = s->m;
	char why[160];
	if (migration__start_postcopy(m, why, sizeof(why))) {
		log_warn("migration: x-postcopy-auto cannot switch: %s", why);
		s->hybrid_refused = true;
		return false;
	}
	pthread_mutex_lock(&m->lock);
	m->stats.postcopy_auto = true;
	m->stats.postcopy_bw_bps = in->bandwidth_bps;
	m->stats.postcopy_rate_bps = in->dirty_rate_bps;
	pthread_mutex_unlock(&m->lock);
	log_info("migration: post-copy (x-postcopy-auto) %s: %llu MB left, dirty rate %llu MB/s, "
		 "bandwidth %llu MB/s", when, (unsigned long long)(in->remaining_bytes / 1000000),
		 (unsigned long long)(in->dirty_rate_bps / 1000000),
		 (unsigned long long)(in->bandwidth_bps / 1000000));
	return true;
}

/* x-postcopy-auto: after the bulk pass, post-copy when pre-copy would not
 * converge soon (policy__postcopy_now); true when it will switch. */
static bool sender__hybrid(struct sender *s, const struct policy_input *in, uint64_t limit_ms)
{
	struct migration *m = s->m;
	pthread_mutex_lock(&m->lock);
	bool on = m->params.cap_postcopy_auto;
	pthread_mutex_unlock(&m->lock);
	if (!on || !s->bulk_done || s->hybrid_refused || !policy__postcopy_now(in, limit_ms))
		return false;
	return sender__hybrid_switch(s, in, "after the bulk pass");
}

int sender__bulk_probe(struct sender *s)
{
	struct migration *m = s->m;
	uint64_t now = time__now_ms();
	pthread_mutex_lock(&m->lock);
	bool on = m->params.cap_postcopy_auto && m->params.postcopy_early;
	uint64_t limit_ms = m->params.policy.downtime_limit_ms;
	pthread_mutex_unlock(&m->lock);
	uint64_t since = s->probe_ms ? s->probe_ms : s->active_start_ms;
	if (!on || s->bulk_done || s->paused || s->hybrid_refused || now < since + SENDER_PROBE_MS)
		return 0;
	/* the pages the pass has read and the guest wrote again since go back
	 * into todo, for the next round (or the switch's discards) */
	int64_t got = dirty__sync(m->vm->dirty, &m->todo, DIRTY_SYNC_DEFER_CLEAR);
	if (got < 0) {
		migration__set_error(m, "dirty tracking: %s", strerror((int)-got));
		return (int)got;
	}
	sender__synced(s);
	s->probe_ms = now;
	s->rewritten += (uint64_t)got;
	uint64_t elapsed = now - s->active_start_ms;
	/* the pages rewritten per second since the last look, a rate each
	 * page counts in once; with the ring, its peak rate (as after the
	 * pass) when higher.  The bitmap's own rate is not true during the
	 * pass: pages the pass has not reached read as dirty. */
	uint64_t rate = (uint64_t)got * 1000 / (now - since);
	if (dirty__backend(m->vm->dirty) == DIRTY_RING) {
		uint64_t peak = dirty__take_peak(m->vm->dirty);
		rate = peak > rate ? peak : rate;
	}
	uint64_t moved = sender__moved(s);
	struct policy_input in = {
		.remaining_bytes = s->rewritten * RAM_PAGE_SIZE,
		.bandwidth_bps = elapsed ? moved * 1000 / elapsed : 0,
		.dirty_rate_bps = rate * RAM_PAGE_SIZE,
	};
	if (!policy__postcopy_early(&in, elapsed, limit_ms) ||
	    !sender__hybrid_switch(s, &in, "during the bulk pass"))
		return 0;
	pthread_mutex_lock(&m->lock);
	m->stats.postcopy_rewritten = in.remaining_bytes;
	pthread_mutex_unlock(&m->lock);
	return 0;
}

/* A round's sync: pages newly dirty, or -errno.  Seed 000's patch 1 (one
 * harvest for every memslot) and 3 (no all-vCPU kick while throttled or
 * limited), each unless its x- switch turns it off. */
static int64_t sender__round_sync(struct sender *s)
{
	struct migration *m = s->m;
	pthread_mutex_lock(&m->lock);
	bool per_slot = m->params.sync_per_slot, kick_always = m->params.kick_throttled;
	pthread_mutex_unlock(&m->lock);
	bool kick = kick_always || (atomic_load(&m->vm->throttle_pct) == 0 && !m->limit_set);
	/* the idea is the ring's (one harvest serves every memslot); the
	 * bitmap reads each slot's log anyway */
	bool ring = dirty__backend(m->vm->dirty) == DIRTY_RING;
	unsigned syncs = per_slot && ring ? m->vm->ram.nr_blocks : 1;
	unsigned flags = DIRTY_SYNC_DEFER_CLEAR;
	int64_t got = 0;
	for (unsigned i = 0; i < syncs; i++) {
		int64_t g = dirty__sync(m->vm->dirty, &m->todo, (kick ? DIRTY_SYNC_KICK : 0) | flags);
		if (g < 0)
			return g;
		got += g;
	}
	return got;
}

/* A new throttle: the ring's rates so far were measured at the old speed,
 * and the computed policy scales the rate it reads by the throttle now in
 * effect, so a peak from before would count the throttle twice (a rate
 * measured unthrottled, read as one under 72%, asked for 93%).  Not at a
 * dirty limit's start: its law reads each vCPU's last rate as the one under
 * the sleep in effect (none yet), so the rate from before is what its first
 * step needs; forgotten, the vCPUs ran on unlimited until a period closed
 * (bench/converge at 512 MiB: 2.4 s at 250 MB/s, one more round, 18.1 s
 * against 13.7). */
static void sender__speed_changed(struct sender *s)
{
	if (dirty__backend(s->m->vm->dirty) == DIRTY_RING)
		dirty__rate_restart(s->m->vm->dirty);
}

/* Measures the round, asks the policy; returns 1 to switch over. */
static int sender__round_decision(struct sender *s, uint64_t bytes_round, uint64_t ms_round,
				  uint64_t dirty_pages)
{
	struct migration *m = s->m;
	struct vm *vm = m->vm;
	if (ms_round >= 5 && bytes_round)
		s->bandwidth_bps = bytes_round * 1000 / ms_round;
	struct dirty_stats ds;
	dirty__get_stats(vm->dirty, &ds);
	uint64_t rate = dirty__backend(vm->dirty) == DIRTY_RING ?
			dirty__take_peak(vm->dirty) : ds.rate_pages;
	pthread_mutex_lock(&m->lock);
	/* seed 000's patch 4 off; or no ring period has closed since the
	 * throttle last changed (sender__speed_changed): the round's own rate */
	if (m->params.sync_dirty_rate || !rate)
		rate = ms_round ? dirty_pages * 1000 / ms_round : 0;
	pthread_mutex_unlock(&m->lock);
	/* the disk's chunks count as RAM's pages do: what the guest wrote in
	 * the round is to send, at the rate it wrote it */
	uint64_t disk_dirty = sender__disk_dirty(s);
	struct policy_input in = {
		.bytes_sent_period = bytes_round, .period_ms = ms_round,
		.dirty_bytes_period = dirty_pages * RAM_PAGE_SIZE + disk_dirty,
		.remaining_bytes = bitmap__count(&m->todo) * RAM_PAGE_SIZE + sender__disk_pending(s),
		.bandwidth_bps = s->bandwidth_bps,
		.dirty_rate_bps = rate * RAM_PAGE_SIZE + (ms_round ? disk_dirty * 1000 / ms_round : 0),
		.throttle_pct = atomic_load(&vm->throttle_pct),
	};
	struct policy_params pp;
	pthread_mutex_lock(&m->lock);
	pp = m->params.policy;
	pp.kind = m->params.cap_auto_converge ? m->params.throttle_policy : POLICY_NONE;
	bool limit = m->params.cap_dirty_limit;
	uint64_t quota = m->params.vcpu_dirty_limit;
	if (limit)
		pp.kind = POLICY_STEP; /* QEMU's trigger; dirty-limit acts instead of the throttle */
	pthread_mutex_unlock(&m->lock);
	struct policy_decision d;
	policy__decide(&m->pstate, &pp, &in, &d);
	pthread_mutex_lock(&m->lock);
	m->stats.expected_downtime_ms = d.expected_downtime_ms;
	m->stats.policy_bw_bps = in.bandwidth_bps;
	m->stats.dirty_pages_rate = rate;
	if (rate > m->stats.dirty_rate_peak)
		m->stats.dirty_rate_peak = rate;
	pthread_mutex_unlock(&m->lock);
	if (m->limit_set) {
		uint64_t sleep_us, full_us;
		dirtylimit__stats(&vm->dirtylimit, &sleep_us, &full_us);
		pthread_mutex_lock(&m->lock);
		m->stats.limit_sleep_us = sleep_us;
		m->stats.limit_ring_full_us = full_us;
		pthread_mutex_unlock(&m->lock);
	}
	if (d.action == POLICY_SWITCHOVER)
		return sender__hold_for_final_round(s, &in, pp.downtime_limit_ms) ? 0 : 1;
	if (sender__hybrid(s, &in, pp.downtime_limit_ms))
		return 0;       /* post-copy instead of another round (or a throttle) */
	if (d.action == POLICY_SET_THROTTLE && limit) {
		if (!m->limit_set) {
			dirtylimit__save(&vm->dirtylimit, m->user_limits);
			dirtylimit__set_period(&vm->dirtylimit, m->params.dirty_limit_period_ms);
			m->limit_set = dirtylimit__set(&vm->dirtylimit, -1, quota) == 0;
		}
	} else if (d.action == POLICY_SET_THROTTLE) {
		throttle__set(&vm->throttle, d.throttle_pct);
		sender__speed_changed(s);
	}
	return 0;
}

static int sender__iterate(struct sender *s)
{
	struct migration *m = s->m;
	uint64_t t = time__now_ms(), moved = sender__moved(s);
	int rc = sender__pass(s); /* the bulk pass */
	s->bulk_done = true;
	if (rc == SENDER_POSTCOPY) {
		pthread_mutex_lock(&m->lock);
		m->stats.postcopy_in_bulk = true;
		pthread_mutex_unlock(&m->lock);
	}
	if (m->vm->balloon)
		balloon__hint_done(m->vm->balloon); /* the guest takes its pages back */
	while (!rc) {
		uint64_t now = time__now_ms(), out = sender__moved(s);
		int64_t got = sender__round_sync(s);
		if (got < 0)
			return (int)got;
		sender__synced(s);
		pthread_mutex_lock(&m->lock);
		uint64_t pass = ++m->stats.dirty_sync_count;
		m->stats.iteration++;
		pthread_mutex_unlock(&m->lock);
		if (m->params.cap_events) /* after every sync, as QEMU */
			control__event(m->ctl, "MIGRATION_PASS", json_pack("{s:I}", "pass", (json_int_t)pass));
		sender__update_stats(s);
		if (sender__postcopy_due(s))
			return SENDER_POSTCOPY;
		if (sender__round_decision(s, out - moved, now - t, (uint64_t)got))
			return 0;
		if (sender__postcopy_due(s))
			return SENDER_POSTCOPY;
		if (atomic_load(&m->cancel))
			return -ECANCELED;
		t = now;
		moved = out;
		rc = sender__pass(s);
	}
	return rc;
}

static void sender__cleanup(struct sender *s, int rc)
{
	struct migration *m = s->m;
	struct vm *vm = m->vm;
	char why[512];
	if (vm->balloon)
		balloon__hint_done(vm->balloon);
	throttle__set(&vm->throttle, 0);
	atomic_store(&vm->device_marks_off, false);
	if (m->limit_set && dirtylimit__restore(&vm->dirtylimit, m->user_limits))
		log_warn("migration: dirty limits not restored");
	m->limit_set = false;
	if (s->tracking && dirty__stop(vm->dirty))
		log_warn("migration: dirty tracking did not stop cleanly");
	s->tracking = false;
	if (m->stream_open)
		sender__update_stats(s);
	if (!rc && s->snapshot) {
		migration__set_status(m, MIG_COMPLETED);  /* the guest runs on */
		return;
	}
	if (!rc) {
		vm__set_status(vm, VM_STATUS_POSTMIGRATE);
		if (vm->net)    /* frames that came for the guest after it stopped here */
			log_info("virtio-net: %llu frames waiting in the tap at the switchover "
				 "were dropped", (unsigned long long)net__drop_backlog(vm->net));
		/* one pause level is enough for `cont` to undo: a VM the user had
		 * stopped keeps the user's, ours goes */
		if (s->paused && s->prev_status != VM_STATUS_RUNNING)
			vm__resume_vcpus(vm);
		migration__set_status(m, MIG_COMPLETED);
		return;
	}
	if (m->stream_open && mig_stream__error(s->stream))
		sender__check_return_path(s, 500); /* the destination may say why */
	/* RAM handed over in its file and no answer after END: the file says
	 * whether anybody took it.  Taken back here (the lock and the token
	 * hold), nobody can run the guest but this VM (mem/memfile.h) */
	if (s->paused && s->end_sent && !s->dest_refused && s->ram_handed &&
	    !sender__take_back_image(s, why, sizeof(why))) {
		log_info("migration: the RAM was not taken over: it is this VM's again");
		s->dest_refused = true;
	}
	if (s->paused && s->postcopy_sent && !s->dest_refused &&
	    s->prev_status == VM_STATUS_RUNNING) {
		/* the destination runs the guest (or may): this copy lacks
		 * nothing but must not run too, and the destination cannot go
		 * on without the pages it still lacks */
		vm__set_status(vm, VM_STATUS_PAUSED);
		migration__set_error(m, "post-copy failed after the destination started the guest: "
				     "it cannot go on without the pages it lacks; the guest stays "
				     "paused here");
	} else if (s->paused && s->end_sent && !s->dest_refused &&
		   s->prev_status == VM_STATUS_RUNNING) {
		/* END went out but the destination never answered: it may be
		 * running the guest, so this copy must not run too.  It stays
		 * paused (our pause is kept); `cont` runs it if the destination
		 * is known not to. */
		vm__set_status(vm, VM_STATUS_PAUSED);
		if (rc == -ETIMEDOUT)
			migration__set_error(m, "the destination did not confirm within %d s after "
					     "the last state was sent; the guest stays paused here",
					     SENDER_CONFIRM_S);
		migration__set_error(m, "the destination did not confirm after the last state was sent; "
				     "the guest stays paused here");
	} else if (s->paused && sender__take_back_image(s, why, sizeof(why))) {
		/* the disk is another's now: this copy must not write it.  One
		 * pause level is enough for `cont` to undo: a VM the user had
		 * stopped (or never started) keeps its own, ours goes */
		vm__set_status(vm, VM_STATUS_PAUSED);
		if (s->prev_status != VM_STATUS_RUNNING)
			vm__resume_vcpus(vm);
		migration__set_error(m, "%s; the guest stays paused here", why);
	} else if (s->paused) {
		/* a VM the user had stopped stays stopped (its own pause remains) */
		sender__resume_guest(s);
	}
	if (atomic_load(&m->cancel)) {
		migration__set_status(m, MIG_CANCELLED);
		return;
	}
	if (m->stream_open && mig_stream__error(s->stream))
		migration__set_error(m, "%s", mig_stream__strerror(s->stream));
	if (s->mf && multifd_send__why(s->mf)[0])
		migration__set_error(m, "%s", multifd_send__why(s->mf));
	migration__set_error(m, "%s", strerror(-rc));
	/* logged first: whoever sees the status failed finds the reason logged */
	log_err("migration failed: %s", m->error);
	migration__set_status(m, MIG_FAILED);
}

/* After the setup: the passes, then the switchover or post-copy; or
 * the background snapshot. */
static int sender__run(struct sender *s)
{
	if (s->snapshot)
		return sender__snapshot(s);
	if (s->ram_shared)
		return sender__switchover(s);
	int rc = sender__iterate(s);
	if (rc == SENDER_POSTCOPY)
		return sender__postcopy(s);
	return rc ? rc : sender__switchover(s);
}

/* KMIG_FAULT (test builds only; fault.h). */
static int sender__init_fault(struct sender *s)
{
	char err[256];
	int rc = mig_fault__init(&s->fault, getenv("KMIG_FAULT"), s->ram, err, sizeof(err));
	if (rc)
		migration__set_error(s->m, "%s", err);
	if (!rc && s->fault.kind == MIG_FAULT_NO_DEVICE_MARKS) {
		log_warn("fault injected: no-device-marks: device writes into guest RAM go "
			 "unreported for this migration");
		atomic_store(&s->m->vm->device_marks_off, true);
	}
	return rc;
}

void *migration__send_thread(void *arg)
{
	struct migration *m = arg;
	struct sender *s = calloc(1, sizeof(*s));
	int rc = -ENOMEM;
	pthread_setname_np(pthread_self(), "migration");
	pid_t tid = gettid();
	if (mig_threads__add(&m->threads, tid, "live_migration"))
		log_debug("migration: thread not listed in query-migrationthreads");
	if (!s)
		goto out;
	s->m = m;
	s->ram = &m->vm->ram;
	s->stream = &m->stream;
	s->rec_cap = SENDER_REC_CAP;
	s->pc_skip = UINT64_MAX;
	s->discard_end = UINT64_MAX;
	s->rec = malloc(s->rec_cap);
	pthread_mutex_lock(&m->lock);    /* migrate-set-parameters may write them */
	s->zero_detect = m->params.cap_zero_detect;
	s->snapshot = m->params.cap_background_snapshot;
	s->ram_shared = m->params.cap_ignore_shared && m->vm->memfile;
	s->comp = mig_comp__stream(&m->params.comp);
	s->chan_comp = mig_comp__channel(&m->params.comp);
	pthread_mutex_unlock(&m->lock);
	policy__state_init(&m->pstate);
	rc = s->rec ? 0 : -ENOMEM;
	if (!rc && (m->params.cap_verify || m->params.cap_postcopy_ram) && m->vm->balloon)
		rc = bitmap__init(&s->unsent, s->ram->npages);
	if (!rc)
		rc = sender__init_fault(s);
	if (!rc)
		rc = sender__xbzrle_init(s);
	if (!rc)
		rc = sender__setup(s, m->out_uri);
	if (!rc) {
		pthread_mutex_lock(&m->lock);
		m->stats.setup_ms = time__now_ms() - m->stats.start_ms;
		pthread_mutex_unlock(&m->lock);
		s->active_start_ms = time__now_ms();
		migration__set_status(m, MIG_ACTIVE);
		rc = sender__run(s);
	}
	if (rc && atomic_load(&m->cancel))
		rc = -ECANCELED;
	sender__cleanup(s, rc);
	sender__disk_stop(s);
	if (s->mf) {
		pthread_mutex_lock(&m->lock);
		m->mf_open = false;
		pthread_mutex_unlock(&m->lock);
		if (rc)
			multifd_send__shutdown(s->mf);
		multifd_send__close(s->mf);
	}
	sender__preempt_close(s);
	pthread_mutex_lock(&m->lock);
	if (m->stream_open) {
		mig_stream__close(&m->stream);
		m->stream_open = false;
	}
	pthread_mutex_unlock(&m->lock);
	free(s->rec);
	bitmap__free(&s->unsent);
	mig_fault__free(&s->fault);
	proto_codec__free(&s->codec);
	sender__xbzrle_free(s);
out:
	free(s);
	mig_threads__remove(&m->threads, tid);
	return NULL;
}
