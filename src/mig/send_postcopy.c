/* The outgoing post-copy phase: the guest stops here, its stale pages are
 * discarded at the destination, the device state goes, the destination
 * runs the guest and the rest follows, pages it asks for first
 * (docs/protocol.md "Post-copy"). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/timeutil.h"
#include "ctl/control.h"
#include "kvm/vm.h"
#include "mig/postcopy.h"
#include "mig/send_impl.h"
#include "state/state.h"

/* pages pushed between two looks at the destination's requests: 64 KiB,
 * 0.5 ms of a 125 MB/s link, is what a request waits at most behind the
 * push (64 pages made it 2 ms: a median request latency of 1.8 ms) */
#define PC_PUSH_PAGES 16
/* how long the source waits for RP_RUNNING, and for RP_OK after END */
#define PC_RUNNING_WAIT_MS 10000

bool sender__postcopy_due(struct sender *s)
{
	return !s->paused && atomic_load(&s->m->postcopy_start);
}

/* DISCARD every page still to send: the destination's copy is stale. */
static int pc__discard(struct sender *s)
{
	struct bitmap *todo = &s->m->todo;
	uint64_t offs[PROTO_MAX_ZERO / 16];
	unsigned n = 0;
	int block = 0, rc = 0;
	for (size_t p = bitmap__next_set(todo, 0); !rc; p = bitmap__next_set(todo, p + 1)) {
		int b = p < todo->nbits && s->ram->nr_blocks > 1 &&
			p >= s->ram->blocks[1].first_page ? 1 : 0;
		if (n && (p >= todo->nbits || b != block || n == sizeof(offs) / sizeof(offs[0]))) {
			ssize_t len = proto__encode_discard(s->rec, s->rec_cap, (uint32_t)block, n, offs);
			rc = len < 0 ? (int)len : mig_stream__write(s->stream, s->rec, (size_t)len);
			n = 0;
		}
		if (p >= todo->nbits)
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

/* Sends what the destination asked for; returns pages sent or -errno. */
static int pc__serve(struct sender *s, struct postcopy_src *q)
{
	int n = 0;
	for (size_t p = bitmap__next_set(&q->wanted, 0); p < q->wanted.nbits;
	     p = bitmap__next_set(&q->wanted, p + 1)) {
		bitmap__clear_bit(&q->wanted, p);
		bitmap__clear_bit(&s->m->todo, p);  /* sent now: not pushed again */
		int rc = sender__send_page(s, p);
		if (rc)
			return rc;
		n++;
	}
	return pc__flushed(s, n);
}

/* The next pages of todo from *cursor; returns pages sent or -errno. */
static int pc__push(struct sender *s, size_t *cursor)
{
	struct bitmap *todo = &s->m->todo;
	int n = 0;
	size_t p = *cursor;
	while (n < PC_PUSH_PAGES && (p = bitmap__next_set(todo, p)) < todo->nbits) {
		bitmap__clear_bit(todo, p);
		int rc = sender__send_page(s, p);
		if (rc)
			return rc;
		n++;
		p++;
	}
	*cursor = p;
	return pc__flushed(s, n);
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

/* Until every page is out: requests first, then the background push. */
static int pc__send_rest(struct sender *s, struct postcopy_src *q)
{
	size_t cursor = 0;
	uint64_t last_stats = 0;
	for (;;) {
		int rc = pc__outcome(s, q);
		if (!rc && atomic_load(&q->outcome) > 0)
			rc = -EPROTO;   /* RP_OK before END */
		if (rc)
			return rc;
		int served = pc__serve(s, q);
		if (served < 0)
			return served;
		int pushed = pc__push(s, &cursor);
		if (pushed < 0)
			return pushed;
		if (time__now_ms() - last_stats >= SENDER_POLL_MS) {
			pc__stats(s, q);
			last_stats = time__now_ms();
		}
		if (!served && !pushed)
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
	if (!run)
		return -ETIMEDOUT;
	pthread_mutex_lock(&s->m->lock);
	s->m->stats.downtime_ms = run - t0;
	pthread_mutex_unlock(&s->m->lock);
	log_info("post-copy: the destination runs the guest after %llu ms",
		 (unsigned long long)(run - t0));
	rc = pc__send_rest(s, q);
	ssize_t n = rc ? rc : proto__encode_end(s->rec, s->rec_cap, NULL);
	rc = n < 0 ? (int)n : mig_stream__write(s->stream, s->rec, (size_t)n);
	rc = rc ? rc : mig_stream__flush(s->stream);
	if (!rc)
		s->end_sent = true;
	rc = rc ? rc : pc__await_ok(s, q);
	pc__stats(s, q);
	return rc;
}

int sender__postcopy(struct sender *s)
{
	struct migration *m = s->m;
	uint64_t t0, bytes0 = sender__bytes(s);
	int rc = sender__stop_guest(s, false, &t0);
	s->comp = PROTO_COMP_NONE;   /* a page asked for goes as it is */
	log_info("post-copy: %zu pages left at the switch", bitmap__count(&m->todo));
	rc = rc ? rc : pc__discard(s);
	rc = rc ? rc : state__save(m->vm, sender__put_state, s);
	if (rc)
		return rc;
	/* postcopy-active before POSTCOPY goes: no cancel can come between
	 * (migrate_cancel is refused from here on), and from the first byte of
	 * it on the destination may run the guest, so this copy stays paused
	 * whatever happens next (unless the destination says it failed) */
	if (!migration__advance(m, MIG_DEVICE, MIG_POSTCOPY_ACTIVE))
		return -ECANCELED;
	s->postcopy_sent = true;
	ssize_t n = proto__encode_empty(s->rec, s->rec_cap, PROTO_POSTCOPY);
	rc = n < 0 ? (int)n : mig_stream__write(s->stream, s->rec, (size_t)n);
	rc = rc ? rc : mig_stream__flush(s->stream);
	if (rc)
		return rc;
	/* the guest runs again (there): max-postcopy-bandwidth from now on */
	pthread_mutex_lock(&m->lock);
	m->stats.downtime_bytes = sender__bytes(s) - bytes0;
	m->stats.postcopy = true;
	mig_stream__set_rate(s->stream, m->params.max_postcopy_bandwidth);
	pthread_mutex_unlock(&m->lock);
	struct postcopy_src q;
	rc = postcopy_src__init(&q, s->stream, s->ram);
	if (!rc)
		rc = pc__run(s, &q, t0);
	/* the reader ends with the stream: shut it down unless it answered */
	if (!atomic_load(&q.outcome))
		mig_stream__shutdown(s->stream);
	postcopy_src__free(&q);
	return rc;
}
