/* The outgoing post-copy phase: the guest stops here, its stale pages are
 * discarded at the destination, the device state goes, the destination
 * runs the guest and the rest follows, pages it asks for first
 * (docs/protocol.md "Post-copy"). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/timeutil.h"
#include "base/utf8.h"
#include "ctl/control.h"
#include "kvm/vm.h"
#include "mig/postcopy.h"
#include "mig/send/send_impl.h"
#include "state/state.h"

/* pages pushed between two looks at the destination's requests: 64 KiB,
 * 0.5 ms of a 125 MB/s link, is what a request waits at most behind the
 * push (64 pages made it 2 ms: a median request latency of 1.8 ms).  With
 * max-postcopy-bandwidth the push waits for its turn where a request
 * wakes it (pc__send_rest), never inside the stream. */
#define PC_PUSH_PAGES 16
/* what a push's records take besides its pages' bytes: their headers and
 * offsets (8 bytes a page) */
#define PC_PUSH_SLACK 1024
/* the longest wait for the push's turn before looking at the rate again */
#define PC_PUSH_WAIT_NS 50000000ull
/* The push's flight: bytes written to the main stream that the
 * destination has not read and applied yet (its RP_ACK).  Without a
 * bound the sockets' buffers on both sides (autotuned to megabytes) fill
 * with pushed pages, and a page asked for, or one the push sent just
 * after it, waits behind all of them: 100-300 ms on a destination whose
 * receiving thread shares its CPU with the guest.  The budget is
 * PC_FLIGHT_MIN, or twice what the link holds (the rate the destination
 * reads at, times the connection's smallest round trip) where that is
 * more, so a long link still runs full. */
#define PC_FLIGHT_MIN (256u * 1024)
/* how often the rate behind the budget is measured again */
#define PC_RATE_NS 20000000ull
/* how long the source waits for RP_RUNNING, and for RP_OK after END */
#define PC_RUNNING_WAIT_MS 10000

bool sender__postcopy_due(struct sender *s)
{
	return !s->paused && atomic_load(&s->m->postcopy_start);
}

/* DISCARD every page still to send that the destination may hold: its
 * copy is stale.  After a switch during the bulk pass the pages the pass
 * never reached are left out (sender__bulk_reached): the destination
 * never received them, and with 2 GiB of RAM their list alone would be
 * 4 MB of the downtime. */
static int pc__discard(struct sender *s)
{
	struct bitmap *todo = &s->m->todo;
	uint64_t offs[PROTO_MAX_ZERO / 16];
	uint64_t end = s->discard_end < todo->nbits ? s->discard_end : todo->nbits;
	unsigned n = 0;
	int block = 0, rc = 0;
	for (size_t p = bitmap__next_set(todo, 0); !rc; p = bitmap__next_set(todo, p + 1)) {
		if (p > end)
			p = end;
		int b = p < end && s->ram->nr_blocks > 1 &&
			p >= s->ram->blocks[1].first_page ? 1 : 0;
		if (n && (p >= end || b != block || n == sizeof(offs) / sizeof(offs[0]))) {
			ssize_t len = proto__encode_discard(s->rec, s->rec_cap, (uint32_t)block, n, offs);
			rc = len < 0 ? (int)len : mig_stream__write(s->stream, s->rec, (size_t)len);
			n = 0;
		}
		if (p >= end)
			break;
		block = b;
		offs[n++] = (p - s->ram->blocks[b].first_page) * RAM_PAGE_SIZE;
	}
	return rc;
}

static void pc__stats(struct sender *s, struct postcopy_src *q)
{
	sender__update_stats(s);
	pthread_mutex_lock(&s->m->lock);
	s->m->stats.postcopy_requests = atomic_load(&q->requests);
	s->m->stats.postcopy_acks = atomic_load(&q->acks);
	s->m->stats.postcopy_flight_max = s->pc_flight_max;
	s->m->stats.postcopy_budget = s->pc_budget;
	s->m->stats.preempt |= s->preempt != NULL;
	s->m->stats.preempt_pages = s->preempt_pages;
	pthread_mutex_unlock(&s->m->lock);
}

/* After n pages were queued: out on the wire now; n or -errno. */
static int pc__flushed(struct sender *s, int n)
{
	if (!n)
		return 0;
	int rc = sender__flush(s);
	rc = rc ? rc : mig_stream__flush(s->stream);
	return rc ? rc : n;
}

/* One page out in post-copy: it is on its way from now on. */
static int pc__send(struct sender *s, size_t p)
{
	bitmap__clear_bit(&s->m->todo, p);  /* not pushed again */
	bitmap__set(&s->pc_sent, p);
	if (s->unsent.words)
		bitmap__clear_bit(&s->unsent, p);   /* hashed as it is from now on */
	return sender__send_page(s, p);
}

/* Queues what the destination asked for, and moves the push to follow
 * the last page asked for (a guest that faults on a page tends to touch
 * the next ones).  A page already sent since the switch is on its way: the
 * destination asked before it arrived, and it is not sent twice.  Returns
 * pages queued or -errno. */
static int pc__queue_wanted(struct sender *s, struct postcopy_src *q, size_t *cursor)
{
	int n = 0;
	for (size_t p = bitmap__next_set(&q->wanted, 0); p < q->wanted.nbits;
	     p = bitmap__next_set(&q->wanted, p + 1)) {
		bitmap__clear_bit(&q->wanted, p);
		*cursor = p + 1;
		if (bitmap__test(&s->pc_sent, p)) {
			s->pc_dup_asks++;
			continue;
		}
		if (p == s->pc_skip) {
			bitmap__clear_bit(&s->m->todo, p);
			continue;
		}
		int rc = pc__send(s, p);
		if (rc)
			return rc;
		n++;
	}
	return n;
}

/* postcopy-preempt: what the destination asked for goes on its own
 * channel (the push's batches are flushed: nothing of them is pending),
 * unlimited there and charged to the main stream's limit.  With the
 * preempt-late fault the pages stay in the channel's buffer. */
static int pc__serve_preempt(struct sender *s, struct postcopy_src *q, size_t *cursor)
{
	struct mig_stream *main = s->stream;
	uint64_t before = mig_stream__bytes_out(s->preempt);
	s->stream = s->preempt;
	int n = pc__queue_wanted(s, q, cursor);
	if (n > 0 && mig_fault__preempt_late(&s->fault, true)) {
		int rc = sender__flush(s);   /* into the buffer, not onto the wire */
		n = rc ? rc : n;
	} else {
		n = n < 0 ? n : pc__flushed(s, n);
	}
	s->stream = main;
	if (n < 0)      /* the reason of a pause, as the main stream's would be */
		migration__set_error(s->m, "the postcopy-preempt channel: %s",
				     mig_stream__strerror(s->preempt));
	if (n > 0) {
		s->preempt_pages += (uint64_t)n;
		mig_stream__charge(main, mig_stream__bytes_out(s->preempt) - before);
	}
	return n;
}

/* Sends what the destination asked for at once: a vCPU there waits for
 * it.  The bytes skip the rate limiter's wait and are charged to it (the
 * push after them waits longer), so max-postcopy-bandwidth holds on
 * average.  Returns pages sent or -errno. */
static int pc__serve(struct sender *s, struct postcopy_src *q, size_t *cursor)
{
	if (!atomic_exchange(&q->asked, false))
		return 0;    /* nothing asked since the last scan */
	if (s->preempt)
		return pc__serve_preempt(s, q, cursor);
	mig_stream__set_urgent(s->stream, true);
	int n = pc__queue_wanted(s, q, cursor);
	n = n < 0 ? n : pc__flushed(s, n);
	mig_stream__set_urgent(s->stream, false);
	return n;
}

/* Pages of one push: PC_PUSH_PAGES, or as many as go in one slice of the
 * rate limit (at least one), so the push's flush never waits inside the
 * stream, where a request could not wake it. */
static int pc__push_pages(struct sender *s)
{
	size_t slice = mig_stream__slice_bytes(s->stream);
	size_t n = slice >= PC_PUSH_SLACK + RAM_PAGE_SIZE ?
		   (slice - PC_PUSH_SLACK) / RAM_PAGE_SIZE : 1;
	return n < PC_PUSH_PAGES ? (int)n : PC_PUSH_PAGES;
}

/* The next pages of todo from *cursor, round to the start once at the
 * end; returns pages sent or -errno. */
static int pc__push(struct sender *s, size_t *cursor)
{
	struct bitmap *todo = &s->m->todo;
	int n = 0, most = pc__push_pages(s);
	size_t p = *cursor < todo->nbits ? *cursor : 0;
	if (bitmap__next_set(todo, p) >= todo->nbits)
		p = 0;
	while (n < most && (p = bitmap__next_set(todo, p)) < todo->nbits) {
		if (p == s->pc_skip || mig_fault__skip(&s->fault, p)) {
			bitmap__clear_bit(todo, p);
			s->pc_skip = p++;   /* never sent, asked for or not */
			continue;
		}
		int rc = pc__send(s, p);
		if (rc)
			return rc;
		n++;
		p++;
	}
	*cursor = p;
	return pc__flushed(s, n);
}

struct pc_flight {
	uint64_t budget;
	uint64_t t_ns, acked;   /* the last measurement of the rate */
};

static void pc__budget(struct sender *s, struct pc_flight *f, uint64_t acked)
{
	uint64_t now = time__now_ns();
	if (!f->t_ns || now - f->t_ns >= PC_RATE_NS) {
		double rate = f->t_ns ? (double)(acked - f->acked) * 1e9 / (double)(now - f->t_ns) : 0;
		double bdp = rate * (double)mig_stream__min_rtt_us(s->stream) / 1e6;
		f->budget = 2 * bdp > PC_FLIGHT_MIN ? (uint64_t)(2 * bdp) : PC_FLIGHT_MIN;
		f->t_ns = now;
		f->acked = acked;
		s->pc_budget = f->budget;
	}
}

/* Bytes written and not yet acknowledged (a destination that does not
 * acknowledge, none yet: 0). */
static uint64_t pc__in_flight(struct sender *s, struct postcopy_src *q, uint64_t *acked)
{
	*acked = atomic_load(&q->acked);
	uint64_t out = mig_stream__bytes_out(s->stream);
	return atomic_load(&q->acks) && out > *acked ? out - *acked : 0;
}

/* Whether the push must wait for the destination to read what is in
 * flight; *acked: the position the wait is for an RP_ACK past. */
static bool pc__over_budget(struct sender *s, struct postcopy_src *q, struct pc_flight *f,
			    uint64_t *acked)
{
	uint64_t flight = pc__in_flight(s, q, acked);
	if (!atomic_load(&q->acks))
		return false;
	pc__budget(s, f, *acked);
	return flight >= f->budget;
}

static void pc__note_flight(struct sender *s, struct postcopy_src *q)
{
	uint64_t acked, flight = pc__in_flight(s, q, &acked);
	if (flight > s->pc_flight_max)
		s->pc_flight_max = flight;
}

static int pc__outcome(struct sender *s, struct postcopy_src *q)
{
	int o = atomic_load(&q->outcome);
	if (o >= 0)
		return 0;
	/* a destination that failed before it ran the guest: ours may run again */
	s->dest_refused = atomic_load(&q->refused) && !atomic_load(&q->running_ms);
	migration__set_error(s->m, "%s", q->error);
	return o;
}

/* Until every page is out: requests first, then the background push.
 * With a rate limit the push waits for its turn (mig_stream__due_ns), and
 * with its budget in flight for an RP_ACK, on the return path's
 * condition: a request that comes meanwhile is served at once, not after
 * the wait. */
static int pc__send_rest(struct sender *s, struct postcopy_src *q)
{
	size_t cursor = 0;
	uint64_t last_stats = 0, acked;
	struct pc_flight f = { 0 };
	for (;;) {
		int rc = pc__outcome(s, q);
		if (!rc && atomic_load(&q->outcome) > 0)
			rc = -EPROTO;   /* RP_OK before END */
		if (rc)
			return rc;
		int served = pc__serve(s, q, &cursor), pushed = 0;
		if (served < 0)
			return served;
		uint64_t due = mig_stream__due_ns(s->stream);
		bool full = !due && pc__over_budget(s, q, &f, &acked);
		if (due)
			postcopy_src__wait_ns(q, due < PC_PUSH_WAIT_NS ? due : PC_PUSH_WAIT_NS);
		else if (full)
			postcopy_src__wait_ack(q, acked, PC_PUSH_WAIT_NS);
		else if ((pushed = pc__push(s, &cursor)) < 0)
			return pushed;
		pc__note_flight(s, q);
		if (time__now_ms() - last_stats >= SENDER_POLL_MS) {
			pc__stats(s, q);
			last_stats = time__now_ms();
		}
		if (!due && !full && !served && !pushed)
			return 0;
	}
}

/* After END: RP_OK (every page arrived, the guest runs there). */
static int pc__await_ok(struct sender *s, struct postcopy_src *q)
{
	uint64_t end = time__now_ms() + SENDER_CONFIRM_S * 1000ull;
	while (!atomic_load(&q->outcome) && time__now_ms() < end) {
		/* a request that crossed END on the way: everything was sent */
		bitmap__clear_all(&q->wanted);
		atomic_store(&q->asked, false);
		postcopy_src__wait(q, 100);
	}
	int o = atomic_load(&q->outcome);
	if (o > 0) {
		pthread_mutex_lock(&s->m->lock);
		s->m->confirmed = true;
		pthread_mutex_unlock(&s->m->lock);
		return 0;
	}
	return o < 0 ? pc__outcome(s, q) : -ETIMEDOUT;
}

static int pc__complete(struct sender *s, struct postcopy_src *q);

static int pc__run(struct sender *s, struct postcopy_src *q, uint64_t t0)
{
	int rc = postcopy_src__start(q);
	if (rc)
		return rc;
	/* the guest runs at the destination from RP_RUNNING on */
	uint64_t end = time__now_ms() + PC_RUNNING_WAIT_MS;
	while (!atomic_load(&q->running_ms) && !atomic_load(&q->outcome) && time__now_ms() < end)
		postcopy_src__wait(q, 100);
	rc = pc__outcome(s, q);
	if (rc)
		return rc;
	uint64_t run = atomic_load(&q->running_ms);
	if (!run) {     /* the reason of the pause that follows */
		migration__set_error(s->m, "no RP_RUNNING within %d s of POSTCOPY",
				     PC_RUNNING_WAIT_MS / 1000);
		return -ETIMEDOUT;
	}
	pthread_mutex_lock(&s->m->lock);
	s->m->stats.downtime_ms = run - t0;
	pthread_mutex_unlock(&s->m->lock);
	log_info("post-copy: the destination runs the guest after %llu ms",
		 (unsigned long long)(run - t0));
	return pc__complete(s, q);
}

/* The guest runs at the destination: the rest of the pages, END, RP_OK. */
static int pc__complete(struct sender *s, struct postcopy_src *q)
{
	int rc = pc__send_rest(s, q);
	/* x-verify: every page as this side holds it (the guest is stopped here
	 * since the switch), as a sum the destination adds up page by page */
	uint8_t hash[PROTO_HASH_LEN];
	bool verify = s->m->params.cap_verify;
	if (!rc && verify) {
		struct bitmap *zero = s->unsent.words ? &s->unsent : NULL;
		proto__ram_page_sum_as_zero(&s->pr, zero, hash);
		if (zero)
			log_info("x-verify: %zu pages hinted free or ballooned, never written since "
				 "nor asked for, count as zero", bitmap__count(zero));
	}
	/* the preempt channel's pages first: the destination waits for its
	 * END before it checks or finishes (preempt-late: after ours) */
	bool late = s->preempt && mig_fault__preempt_late(&s->fault, false);
	rc = rc || late ? rc : sender__preempt_end(s);
	ssize_t n = rc ? rc : proto__encode_end(s->rec, s->rec_cap, verify ? hash : NULL);
	rc = n < 0 ? (int)n : mig_stream__write(s->stream, s->rec, (size_t)n);
	rc = rc ? rc : mig_stream__flush(s->stream);
	if (!rc && late) {
		time__sleep_ns(500000000ull);
		rc = sender__preempt_end(s);
	}
	if (!rc)
		s->end_sent = true;
	rc = rc ? rc : pc__await_ok(s, q);
	pc__stats(s, q);
	return rc;
}

/* ---- recovery (docs/protocol.md "Post-copy recovery") ---- */

/* Post-copy may pause on rc: the link broke or migrate-pause cut it (a
 * shutdown: -ECANCELED), not a quit, not the destination's RP_FAIL, not a
 * protocol violation. */
static bool pc__recoverable(struct sender *s, struct postcopy_src *q, int rc)
{
	return rc && rc != -EPROTO && !atomic_load(&s->m->cancel) && !atomic_load(&q->refused);
}

/* The reader ends with the stream: shut it down unless it answered. */
static void pc__end_reader(struct sender *s, struct postcopy_src *q)
{
	if (!atomic_load(&q->outcome))
		mig_stream__shutdown(s->stream);
	postcopy_src__free(q);
}

/* The new link's handshake: RESUME, then the destination's RP_BITMAP of
 * the pages it holds; todo becomes every page it lacks (a page it lacks
 * that needs no sending, zero here, goes as a ZERO offset). */
static int pc__handshake(struct sender *s)
{
	struct migration *m = s->m;
	struct proto_start st;
	struct bitmap have;
	proto_start__from_ram(&st, &s->pr);
	ssize_t n = proto__encode_resume(s->rec, s->rec_cap, &st);
	int rc = n < 0 ? (int)n : mig_stream__write(s->stream, s->rec, (size_t)n);
	rc = rc ? rc : mig_stream__flush(s->stream);
	if (rc || (rc = bitmap__init(&have, s->ram->npages)))
		return rc;
	mig_stream__set_read_deadline(s->stream, time__now_ms() + PC_RUNNING_WAIT_MS);
	uint64_t next = 0, words = (have.nbits + 63) / 64;
	while (!rc && next < words) {
		struct proto_hdr h;
		const char *why = NULL;
		rc = mig_stream__get_record(s->stream, &h, s->rec, s->rec_cap);
		if (!rc && h.type != PROTO_RP_BITMAP) {
			migration__set_error(m, "unexpected %s record while resuming post-copy",
					     proto__type_name(h.type));
			rc = -EPROTO;
		} else if (!rc && proto__decode_rp_bitmap(s->rec, h.length, &have, &next, &why)) {
			migration__set_error(m, "RP_BITMAP: %s", why);
			rc = -EPROTO;
		}
	}
	mig_stream__set_read_deadline(s->stream, 0);
	if (!rc) {
		/* what the old link carried and the destination lacks goes again */
		bitmap__clear_all(&s->pc_sent);
		bitmap__set_all(&m->todo);
		bitmap__andnot(&m->todo, &have);
		if (s->unsent.words)        /* never sent: asked for, or zero there */
			bitmap__andnot(&m->todo, &s->unsent);
		log_info("post-copy: resuming, %zu pages the destination lacks",
			 bitmap__count(&m->todo));
	}
	bitmap__free(&have);
	return rc;
}

/* Why the link failed, while it is open: its error, else the migration's. */
static void pc__reason(struct sender *s, char *why, size_t n)
{
	pthread_mutex_lock(&s->m->lock);
	snprintf(why, n, "%.150s", mig_stream__error(s->stream) ? mig_stream__strerror(s->stream)
							    : s->m->error);
	pthread_mutex_unlock(&s->m->lock);
}

/* Closes the broken link; status postcopy-paused with the reason. */
static void pc__pause(struct sender *s, const char *why)
{
	struct migration *m = s->m;
	pthread_mutex_lock(&m->lock);
	bool open = m->stream_open;
	m->stream_open = false;    /* a cancel no longer touches it */
	snprintf(m->error, sizeof(m->error), "post-copy paused, the link to the destination "
		 "broke (%.60s): the guest runs there and needs the pages here; "
		 "migrate-recover there and migrate resume=true here continue", why);
	utf8__sanitize(m->error);
	pthread_mutex_unlock(&m->lock);
	if (open) {
		s->bytes_closed += mig_stream__bytes_out(s->stream);
		mig_stream__close(s->stream);
	}
	/* the preempt channel too: a recovery reopens it */
	sender__preempt_close(s);
	if (migration__advance(m, MIG_POSTCOPY_ACTIVE, MIG_POSTCOPY_PAUSED) ||
	    migration__advance(m, MIG_POSTCOPY_RECOVER, MIG_POSTCOPY_PAUSED))
		log_warn("migration: %s", m->error);
}

/* The new link (migrate resume=true): connected, its handshake done;
 * why gets the reason of a failure. */
static int pc__reconnect(struct sender *s, char *why, size_t n)
{
	struct migration *m = s->m;
	char uri[256], err[256];
	pthread_mutex_lock(&m->lock);
	snprintf(uri, sizeof(uri), "%s", m->resume_uri);
	pthread_mutex_unlock(&m->lock);
	/* migrate resume=true moved the status to postcopy-recover already */
	if (atomic_load(&m->cancel))
		return -ECANCELED;
	int rc = mig_stream__connect(s->stream, uri, &m->cancel, err, sizeof(err));
	if (rc) {
		snprintf(why, n, "%.150s", err);
		log_warn("migration: post-copy cannot resume: %s", err);
		return rc;
	}
	pthread_mutex_lock(&m->lock);
	m->stream_open = true;
	m->error[0] = 0;
	mig_stream__set_rate(s->stream, m->params.max_postcopy_bandwidth);
	pthread_mutex_unlock(&m->lock);
	if (mig_stream__set_nodelay(s->stream, true))
		log_debug("post-copy: TCP_NODELAY not set");
	if (atomic_load(&m->cancel))
		return -ECANCELED;
	rc = sender__tls(s, err, sizeof(err));
	if (rc) {
		snprintf(why, n, "%.150s", err);
		log_warn("migration: post-copy cannot resume: %s", err);
		return rc;
	}
	rc = atomic_load(&m->cancel) ? -ECANCELED : pc__handshake(s);
	/* the preempt channel again, on the same URI (the destination keeps
	 * its listener for it); a channel that does not open fails this
	 * attempt, which pauses again */
	if (!rc && m->params.cap_postcopy_preempt &&
	    (rc = sender__preempt_open(s, uri)) == -EPROTO)
		rc = -ENOLINK;  /* a link's trouble (a TLS refusal): pause again */
	if (rc)
		pc__reason(s, why, n);
	return rc;
}

/* postcopy-paused until migrate resume=true names a new link, then the
 * rest of post-copy on it; *again: it broke once more (pause again). */
static int pc__recover(struct sender *s, bool *again, char *why, size_t n)
{
	struct migration *m = s->m;
	pc__pause(s, why);
	*again = false;
	if (!migration__await_recovery(m, &m->resume, NULL))
		return -ECANCELED;
	int rc = pc__reconnect(s, why, n);
	if (rc) {
		*again = rc != -EPROTO && !atomic_load(&m->cancel);
		return rc;
	}
	struct postcopy_src q;
	rc = postcopy_src__init(&q, s->stream, s->ram);
	rc = rc ? rc : postcopy_src__start(&q);
	if (!rc && !migration__advance(m, MIG_POSTCOPY_RECOVER, MIG_POSTCOPY_ACTIVE))
		rc = -ECANCELED;
	if (!rc) {
		log_info("post-copy: resumed on %s", m->resume_uri);
		rc = pc__complete(s, &q);
	}
	*again = pc__recoverable(s, &q, rc);
	if (rc)
		pc__reason(s, why, n);
	pc__end_reader(s, &q);
	return rc;
}

/* The switch: the stop, discards, state and POSTCOPY, then the rest of
 * post-copy (and its recoveries). */
static int pc__switch(struct sender *s)
{
	struct migration *m = s->m;
	uint64_t t0, bytes0 = sender__bytes(s);
	int rc = sender__stop_guest(s, false, &t0);
	s->comp = (struct mig_comp){ PROTO_COMP_NONE, 0 }; /* a page asked for goes as it is */
	s->xb.stopped = true;   /* the destination places whole pages from now on */
	/* multifd: every channel's pages are in before the discards, and
	 * nothing more goes on the channels (QEMU too sends post-copy's pages
	 * on the main stream); the destination closes them at POSTCOPY */
	if (!rc && s->mf) {
		rc = sender__end_pass(s);
		s->mf_quiet = true;
	}
	log_info("post-copy: %zu pages left at the switch", bitmap__count(&m->todo));
	rc = rc ? rc : pc__discard(s);
	rc = rc ? rc : state__save(m->vm, sender__put_state, s);
	rc = rc ? rc : sender__give_up_image(s);
	if (rc)
		return rc;
	/* postcopy-active before POSTCOPY goes: no cancel can come between
	 * (migrate_cancel is refused from here on), and from the first byte of
	 * it on the destination may run the guest, so this copy stays paused
	 * whatever happens next (unless the destination says it failed) */
	if (!migration__advance(m, MIG_DEVICE, MIG_POSTCOPY_ACTIVE))
		return -ECANCELED;
	s->postcopy_sent = true;
	ssize_t n = proto__encode_postcopy(s->rec, s->rec_cap, m->params.cap_verify);
	rc = n < 0 ? (int)n : mig_stream__write(s->stream, s->rec, (size_t)n);
	rc = rc ? rc : mig_stream__flush(s->stream);
	if (rc)
		return rc;
	/* the guest runs again (there): max-postcopy-bandwidth from now on */
	pthread_mutex_lock(&m->lock);
	m->stats.downtime_bytes = sender__bytes(s) - bytes0;
	m->stats.postcopy = true;
	m->stats.postcopy_switch_ms = time__now_ms() - m->stats.start_ms;
	mig_stream__set_rate(s->stream, m->params.max_postcopy_bandwidth);
	pthread_mutex_unlock(&m->lock);
	struct postcopy_src q;
	rc = postcopy_src__init(&q, s->stream, s->ram);
	if (!rc)
		rc = pc__run(s, &q, t0);
	bool again = pc__recoverable(s, &q, rc);
	char why[160] = "";
	if (rc)
		pc__reason(s, why, sizeof(why));
	pc__end_reader(s, &q);
	while (again)
		rc = pc__recover(s, &again, why, sizeof(why));
	return rc;
}

int sender__postcopy(struct sender *s)
{
	int rc = bitmap__init(&s->pc_sent, s->ram->npages);
	if (rc)
		return rc;
	rc = pc__switch(s);
	log_info("post-copy: %llu requests for pages already on their way",
		 (unsigned long long)s->pc_dup_asks);
	if (s->m->stats.preempt)
		log_info("post-copy: %llu pages asked for went on the preempt channel",
			 (unsigned long long)s->preempt_pages);
	if (mig_fault__preempt_late(&s->fault, false))
		mig_fault__report(&s->fault);
	bitmap__free(&s->pc_sent);
	return rc;
}
