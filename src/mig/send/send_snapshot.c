/* background-snapshot: the guest's RAM and device state as they were at
 * one instant, written while the guest runs on (docs/usage.md,
 * "Background snapshot").
 *
 * The vCPUs stop once: the device state is saved into memory, the balloon
 * holds its discards and all RAM is write-protected (mem/ram_wp.h); then
 * the guest runs again.  Pages go in address order, each read before its
 * protection is lifted; a write to a page not sent yet waits in the kernel
 * until that page, taken ahead of the scan, has gone.  So every page goes
 * as it was at the stop, once.  The saved device state and END follow.
 * With x-verify END carries the page sum of the pages as they were sent
 * (order-free), which the destination checks against what it holds. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/timeutil.h"
#include "ctl/control.h"
#include "dev/balloon.h"
#include "mem/ram_wp.h"
#include "mig/send/send_impl.h"
#include "state/state.h"

#define SNAP_CHUNK 256          /* pages sent, then released, at a time */
#define SNAP_FAULT_EVERY 16     /* pages sent between two looks at the writes that wait */

struct snap {
	struct sender *s;
	struct ram_wp wp;
	uint8_t *state;             /* the STATE records, encoded */
	size_t len, cap;
	uint64_t sum[4];            /* x-verify: page sum of what was sent */
	bool verify;
	uint64_t ahead;             /* pages sent ahead of the scan for a write */
};

/* Each STATE record kept in memory until the pages have gone. */
static int snap__put_state(void *ctx, uint32_t id, uint32_t ver, uint32_t inst,
			   const void *data, size_t len)
{
	struct snap *sn = ctx;
	ssize_t n = sender__encode_state(sn->s, id, ver, inst, data, len);
	if (n < 0)
		return (int)n;
	if (sn->cap - sn->len < (size_t)n) {
		size_t cap = (sn->cap + (size_t)n) * 2;
		uint8_t *bigger = realloc(sn->state, cap);
		if (!bigger)
			return -ENOMEM;
		sn->state = bigger;
		sn->cap = cap;
	}
	memcpy(sn->state + sn->len, sn->s->rec, (size_t)n);
	sn->len += (size_t)n;
	return 0;
}

/* The one stop: device state saved, discards held, RAM protected. */
static int snap__begin(struct sender *s, struct snap *sn)
{
	struct migration *m = s->m;
	struct vm *vm = m->vm;
	char err[256];
	if (atomic_load(&m->cancel))
		return -ECANCELED;
	uint64_t t0 = time__now_ms();
	sender__pause_guest(s);
	int rc = state__save(vm, snap__put_state, sn);
	if (rc)
		migration__set_error(m, "device state not saved: %s", strerror(-rc));
	balloon__hold_discards(vm->balloon, true);
	if (!rc) {
		rc = ram_wp__start(&sn->wp, s->ram, 0, err, sizeof(err));
		if (rc)
			migration__set_error(m, "%s", err);
		else if (mig_fault__snapshot_unprotected(&s->fault))
			rc = ram_wp__release(&sn->wp, 0, s->ram->npages);
	}
	atomic_store(&m->write_protect, !rc);
	sender__resume_guest(s);
	pthread_mutex_lock(&m->lock);
	m->stats.downtime_ms = time__now_ms() - t0;
	m->stats.snapshot = true;
	pthread_mutex_unlock(&m->lock);
	log_info("background snapshot: the guest stopped for %llu ms%s",
		 (unsigned long long)m->stats.downtime_ms, sn->wp.populated ?
		 " (guest RAM mapped for reading first: the kernel protects no unmapped page)" : "");
	return rc;
}

/* One page, as it was at the stop (still protected). */
static int snap__page(struct sender *s, struct snap *sn, uint64_t p)
{
	bitmap__clear_bit(&s->m->todo, p);
	if (sn->verify)
		proto__page_sum_add(sn->sum, p, ram__page_host(s->ram, p));
	return sender__send_page(s, p);
}

/* The writes that wait: each page queued out of order and flushed past
 * the rate limit's wait (a vCPU waits for it; the bytes are charged all
 * the same), then released: once in the stream's buffer it is copied. */
static int snap__faults(struct sender *s, struct snap *sn)
{
	uint64_t p;
	int rc;
	while ((rc = ram_wp__fault(&sn->wp, &p)) == 1) {
		if (bitmap__test(&s->m->todo, p)) {
			sn->ahead++;
			mig_stream__set_urgent(s->stream, true);
			rc = snap__page(s, sn, p);
			rc = rc ? rc : sender__flush(s);
			mig_stream__set_urgent(s->stream, false);
			if (rc)
				return rc;
		}
		rc = ram_wp__release(&sn->wp, p, 1);
		if (rc)
			return rc;
	}
	return rc;
}

/* Pages [first, first + n) not sent yet, then their release; the writes
 * that wait are taken every SNAP_FAULT_EVERY pages, each batch flushed
 * first.  A write then waits for those pages and, where the stream's
 * buffer fills meanwhile, for that buffer (256 KiB) to go at the rate. */
static int snap__chunk(struct sender *s, struct snap *sn, uint64_t first, uint64_t n)
{
	int rc = 0;
	for (uint64_t p = first; !rc && p < first + n; p++) {
		if (bitmap__test(&s->m->todo, p))
			rc = snap__page(s, sn, p);
		if (!rc && (p + 1) % SNAP_FAULT_EVERY == 0) {
			rc = sender__flush(s);
			rc = rc ? rc : snap__faults(s, sn);
		}
	}
	rc = rc ? rc : sender__flush(s);
	return rc ? rc : ram_wp__release(&sn->wp, first, n);
}

static int snap__pages(struct sender *s, struct snap *sn)
{
	struct migration *m = s->m;
	uint64_t npages = s->ram->npages;
	bitmap__set_all(&m->todo);
	for (uint64_t next = 0; next < npages; next += SNAP_CHUNK) {
		uint64_t n = npages - next < SNAP_CHUNK ? npages - next : SNAP_CHUNK;
		int rc = snap__chunk(s, sn, next, n);
		if (!rc && (time__now_ms() - s->last_poll_ms >= SENDER_POLL_MS)) {
			s->last_poll_ms = time__now_ms();
			rc = sender__look(s);
			pthread_mutex_lock(&m->lock);
			m->stats.snapshot_faults = sn->wp.faults;
			m->stats.snapshot_ahead = sn->ahead;
			pthread_mutex_unlock(&m->lock);
		}
		if (rc && rc != -ECANCELED && !mig_stream__error(s->stream))
			migration__set_error(m, "background snapshot: guest RAM's write "
					     "protection: %s", strerror(-rc));
		if (rc)     /* else the cleanup says why: the stream's error */
			return rc;
	}
	return 0;
}

/* The saved state, END, and the stream's end confirmed. */
static int snap__finish(struct sender *s, struct snap *sn)
{
	int rc = mig_stream__write(s->stream, sn->state, sn->len);
	uint8_t sum[PROTO_HASH_LEN];
	proto__page_sum_out(sn->sum, sum);
	ssize_t n = sn->verify ? proto__encode_end_sum(s->rec, s->rec_cap, sum)
			       : proto__encode_end(s->rec, s->rec_cap, NULL);
	if (!rc)
		rc = n < 0 ? (int)n : mig_stream__write(s->stream, s->rec, (size_t)n);
	rc = rc ? rc : mig_stream__flush(s->stream);
	if (!rc)
		s->end_sent = true;
	return rc ? rc : sender__finish_one_way(s);
}

int sender__snapshot(struct sender *s)
{
	struct migration *m = s->m;
	if (mig_stream__two_way(s->stream)) {
		migration__set_error(m, "background-snapshot writes a snapshot: use a file:, exec: "
				     "or fd: URI, not a connection to a destination that would run "
				     "the guest beside this one");
		return -EINVAL;
	}
	pthread_mutex_lock(&m->lock);   /* migrate-set-parameters rewrites all of params */
	struct snap sn = { .s = s, .verify = m->params.cap_verify };
	pthread_mutex_unlock(&m->lock);
	ram_wp__init(&sn.wp);
	int rc = snap__begin(s, &sn);
	if (!rc)
		rc = snap__pages(s, &sn);
	ram_wp__stop(&sn.wp);
	atomic_store(&m->write_protect, false);
	balloon__hold_discards(m->vm->balloon, false);
	pthread_mutex_lock(&m->lock);
	m->stats.snapshot_faults = sn.wp.faults;
	m->stats.snapshot_ahead = sn.ahead;
	pthread_mutex_unlock(&m->lock);
	if (!rc) {
		log_info("background snapshot: %llu writes waited for their page, %llu pages "
			 "sent ahead of the scan", (unsigned long long)sn.wp.faults,
			 (unsigned long long)sn.ahead);
		rc = snap__finish(s, &sn);
	}
	free(sn.state);
	return rc;
}
