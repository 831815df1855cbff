/* The outgoing migration: setup, bulk pass, dirty rounds, switchover,
 * return path.  Runs on the migration thread. */
#include <errno.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/timeutil.h"
#include "ctl/control.h"
#include "dev/balloon.h"
#include "kvm/throttle_math.h"
#include "kvm/vm.h"
#include "kvm/vm_blk.h"
#include "mem/dirty.h"
#include "mem/memfile.h"
#include "mig/migration.h"
#include "mig/wire/proto.h"
#include "mig/send/send_impl.h"
#include "state/state.h"

/* Longest wait at the switchover for throttled vCPUs to begin a sleep:
 * many throttle cycles (a cycle is at most a run slice and a sleep scaled
 * to a late kick's run, at most 2 x THROTTLE_MAX_STALL_NS), so that slow
 * kicks (an emulated KVM) still end it before it times out */
#define SWITCHOVER_SLEEP_WAIT_NS 450000000ull

bool sender__page_is_zero(const uint8_t *p)
{
	const uint64_t *w = (const uint64_t *)p;
	for (unsigned i = 0; i < RAM_PAGE_SIZE / 8; i += 4)
		if (w[i] | w[i + 1] | w[i + 2] | w[i + 3])
			return false;
	return true;
}

uint64_t sender__bytes(struct sender *s)
{
	return s->bytes_closed + mig_stream__bytes_out(s->stream) +
	       (s->mf ? multifd_send__bytes(s->mf) : 0) +
	       (s->preempt ? mig_stream__bytes_out(s->preempt) : 0);
}

uint64_t sender__moved(struct sender *s)
{
	return sender__bytes(s) + s->comp_saved + (s->mf ? multifd_send__comp_saved(s->mf) : 0);
}

static int sender__flush_zero(struct sender *s)
{
	if (!s->zn)
		return 0;
	if (s->mf && !s->mf_quiet) {
		unsigned n = s->zn;
		s->zn = 0;
		return multifd_send__queue(s->mf, PROTO_ZERO, (uint32_t)s->zblock, n, s->zoffs);
	}
	ssize_t n = proto__encode_zero(s->rec, s->rec_cap, (uint32_t)s->zblock, s->zn, s->zoffs);
	s->zn = 0;
	if (n < 0)
		return (int)n;
	return mig_stream__write(s->stream, s->rec, (size_t)n);
}

static int sender__flush_pages(struct sender *s)
{
	if (!s->pn)
		return 0;
	if (s->mf && !s->mf_quiet) {
		unsigned n = s->pn;
		s->pn = 0;
		return multifd_send__queue(s->mf, PROTO_PAGES, (uint32_t)s->pblock, n, s->poffs);
	}
	const struct ram_block *b = &s->ram->blocks[s->pblock];
	if (s->comp.kind != PROTO_COMP_NONE) {
		ssize_t n = proto__encode_pages_comp(&s->codec, s->comp.kind, s->comp.level,
						     s->rec, s->rec_cap,
						     (uint32_t)s->pblock, s->pn, s->poffs, b->host);
		int rc = n < 0 ? (int)n : mig_stream__write(s->stream, s->rec, (size_t)n);
		if (!rc)
			s->comp_saved += proto__comp_saved((uint32_t)s->pn, (size_t)n);
		s->pn = 0;
		return rc;
	}
	uint64_t data_len = (uint64_t)s->pn * RAM_PAGE_SIZE;
	ssize_t n = proto__encode_pages_head(s->rec, s->rec_cap, 0, (uint32_t)s->pblock,
					     s->pn, s->poffs, data_len);
	int rc = n < 0 ? (int)n : mig_stream__write(s->stream, s->rec, (size_t)n);
	for (unsigned i = 0; !rc && i < s->pn; i++)
		rc = mig_stream__write(s->stream, b->host + s->poffs[i], RAM_PAGE_SIZE);
	s->pn = 0;
	return rc;
}

int sender__flush(struct sender *s)
{
	int rc = sender__flush_zero(s);
	rc = rc ? rc : sender__xbzrle_flush(s);
	return rc ? rc : sender__flush_pages(s);
}

int sender__send_page(struct sender *s, uint64_t page)
{
	int b = s->ram->nr_blocks > 1 && page >= s->ram->blocks[1].first_page ? 1 : 0;
	uint64_t off = (page - s->ram->blocks[b].first_page) * RAM_PAGE_SIZE;
	const uint8_t *host = s->ram->blocks[b].host + off;
	int rc = 0;
	mig_fault__sent(&s->fault, s->paused, page, host);
	if (sender__xbzrle_active(s))
		return sender__xbzrle_page(s, b, off, page, host);
	if (s->zero_detect && sender__page_is_zero(host)) {
		/* a full batch of zeros takes the pages batched meanwhile with
		 * it: the stream keeps to the pass's order, so the destination
		 * maps a sparse guest's few pages (a huge page's first touch
		 * can take milliseconds) as the pass goes, not in the downtime */
		if (s->zn && (s->zblock != b || s->zn == SENDER_BATCH_ZERO)) {
			rc = sender__flush_zero(s);
			if (!rc && s->pn)
				rc = sender__flush_pages(s);
		}
		s->zblock = b;
		s->zoffs[s->zn++] = off;
		s->zero_pages++;
	} else {
		if (s->pn && (s->pblock != b || s->pn == SENDER_BATCH_PAGES))
			rc = sender__flush_pages(s);
		s->pblock = b;
		s->poffs[s->pn++] = off;
		s->normal_pages++;
	}
	return rc;
}

/* Reads the destination's reason if it has sent one (RP_FAIL) within
 * timeout_ms (mig_stream__peek_answer: also after a sticky write error,
 * and through TLS when the stream has it).  Returns -EPROTO with the error
 * set if a reason arrived, 0 otherwise. */
int sender__check_return_path(struct sender *s, int timeout_ms)
{
	uint8_t buf[PROTO_HDR_SIZE + PROTO_MAX_MSG + 8];
	const uint8_t *payload;
	struct proto_hdr hdr;
	if (!mig_stream__peek_answer(s->stream, timeout_ms, &hdr, &payload, buf, sizeof(buf)) ||
	    hdr.type != PROTO_RP_FAIL)
		return 0;
	struct proto_error e;
	const char *why;
	if (proto__decode_error(payload, hdr.length, &e, &why))
		return 0;
	migration__set_error(s->m, "destination refused the stream: %.*s", (int)e.msg_len, e.msg);
	s->dest_refused = true;
	return -EPROTO;
}

/* Bulk pass: pages the guest hinted free or ballooned out are not sent
 * (the destination keeps them zero); counts them. */
static bool sender__skip(struct sender *s, uint64_t page)
{
	enum balloon_skip k = balloon__skip(s->m->vm->balloon, page);
	if (k == BALLOON_SKIP_FREE)
		s->free_skipped++;
	else if (k == BALLOON_SKIP_BALLOONED)
		s->balloon_skipped++;
	return k != BALLOON_SKIP_NONE;
}

/* With parallel channels every pass ends with SYNC(round) on each of them
 * and on the main stream: the destination applies round r+1 only after
 * every channel has applied round r.  The pass also waits until each
 * channel has taken its SYNC, i.e. written every batch of the pass: the
 * round's bandwidth and the policy's remaining bytes are then true, and
 * no backlog of queued batches (up to MULTIFD_QUEUE per channel) is left
 * to drain in the downtime. */
int sender__end_pass(struct sender *s)
{
	if (!s->mf || s->mf_quiet)
		return 0;
	s->round++;
	int rc = multifd_send__sync(s->mf, s->round);
	if (!rc)
		rc = multifd_send__drain(s->mf);
	ssize_t n = rc ? rc : proto__encode_sync(s->rec, s->rec_cap, s->round);
	rc = n < 0 ? (int)n : mig_stream__write(s->stream, s->rec, (size_t)n);
	/* the channels wait at the destination until the main stream's SYNC arrives */
	return rc ? rc : mig_stream__flush(s->stream);
}

/* Every 4096 pages, or every SENDER_POLL_MS on a slow link: a cancel, a
 * destination that refused the stream (read before it gives up waiting
 * for us to read its reason and closes), fresh statistics. */
static bool sender__poll_due(struct sender *s, uint64_t n)
{
	uint64_t now = time__now_ms();
	if (n % 4096 && now - s->last_poll_ms < SENDER_POLL_MS)
		return false;
	s->last_poll_ms = now;
	return true;
}

int sender__look(struct sender *s)
{
	if (atomic_load(&s->m->cancel))
		return -ECANCELED;
	int rc = sender__check_return_path(s, 0);
	if (!rc)
		sender__update_stats(s);
	return rc;
}

/* Every SENDER_POLL_PAGES pages looked at (sent or skipped), when due. */
static int sender__poll(struct sender *s, uint64_t n)
{
	if (n % SENDER_POLL_PAGES || !sender__poll_due(s, n))
		return 0;
	int rc = sender__look(s);
	if (!rc)
		rc = sender__bulk_probe(s);
	return !rc && sender__postcopy_due(s) ? SENDER_POSTCOPY : rc;
}

/* A switch to post-copy during the bulk pass, which has read the pages
 * below next: none above them has been sent, so the destination holds
 * none of them, unless as the zeros of a huge page it backed for a page
 * it did receive.  Every page from next up to the second 2 MiB boundary
 * above it is counted in, whatever the alignment of the host's huge
 * pages. */
uint64_t sender__bulk_reached(uint64_t next, uint64_t npages)
{
	uint64_t end = (next + SENDER_HUGE_PAGES - 1) / SENDER_HUGE_PAGES * SENDER_HUGE_PAGES +
		       SENDER_HUGE_PAGES;
	return end < npages ? end : npages;
}

/* Sends every page set in todo, clearing it. */
int sender__pass(struct sender *s)
{
	struct bitmap *todo = &s->m->todo;
	uint64_t n = 0;
	int drc = sender__disk_pass(s);  /* the disk first (x-block-migration) */
	if (drc)
		return drc;
	sender__xbzrle_resize(s);
	for (size_t p = bitmap__next_set(todo, 0); p < todo->nbits; p = bitmap__next_set(todo, p + 1)) {
		bitmap__clear_bit(todo, p);
		/* the chunk's log is re-protected before its first page is read
		 * (sent or skipped); stopped vCPUs write nothing, so not then */
		int rc = s->paused ? 0 : dirty__clear_before_read(s->m->vm->dirty, p);
		if (rc) {
			migration__set_error(s->m, "dirty tracking: cannot re-protect pages: %s",
					     strerror(-rc));
			return rc;
		}
		if (s->paused && mig_fault__skip(&s->fault, p))
			continue;
		if (!s->bulk_done && s->m->vm->balloon && sender__skip(s, p)) {
			if (s->unsent.words)
				bitmap__set(&s->unsent, p);
		} else if ((rc = sender__send_page(s, p)) != 0) {
			return rc;
		}
		rc = sender__poll(s, ++n);
		if (rc == SENDER_POSTCOPY) {    /* what was taken from todo goes first */
			if (!s->bulk_done)
				s->discard_end = sender__bulk_reached(p + 1, todo->nbits);
			rc = sender__flush(s);
			return rc ? rc : SENDER_POSTCOPY;
		}
		if (rc)
			return rc;
	}
	int rc = sender__flush(s);
	return rc ? rc : sender__end_pass(s);
}

ssize_t sender__encode_state(struct sender *s, uint32_t id, uint32_t ver, uint32_t inst,
			     const void *data, size_t len)
{
	size_t need = PROTO_HDR_SIZE + 12 + len;
	if (need > PROTO_HDR_SIZE + PROTO_MAX_PAYLOAD)
		return -E2BIG;
	if (need > s->rec_cap) {        /* a large section (the balloon's bitmap) */
		uint8_t *bigger = realloc(s->rec, need);
		if (!bigger)
			return -ENOMEM;
		s->rec = bigger;
		s->rec_cap = need;
	}
	return proto__encode_state(s->rec, s->rec_cap, id, ver, inst, data, len);
}

int sender__put_state(void *ctx, uint32_t id, uint32_t ver, uint32_t inst,
			     const void *data, size_t len)
{
	struct sender *s = ctx;
	if (mig_fault__drop_state(&s->fault, id, inst))
		return 0;
	ssize_t n = sender__encode_state(s, id, ver, inst, data, len);
	if (n < 0)
		return (int)n;
	return mig_stream__write(s->stream, s->rec, (size_t)n);
}

void sender__pause_guest(struct sender *s)
{
	struct vm *vm = s->m->vm;
	bool done;
	s->prev_status = vm__pause_into(vm, ~0u, VM_STATUS_FINISH_MIGRATE, 0, &done);
	/* what the run-state section says (state.c) */
	vm->run_after_migration = s->prev_status == VM_STATUS_RUNNING;
	vm->never_ran = s->prev_status == VM_STATUS_PRELAUNCH;
	s->paused = true;     /* STOP, if it ran: told as it stopped (vm.h) */
}

void sender__resume_guest(struct sender *s)
{
	struct vm *vm = s->m->vm;
	if (!vm__resume_from(vm, VM_STATUS_BIT(VM_STATUS_FINISH_MIGRATE), s->prev_status))
		vm__resume_vcpus(vm);   /* the status moved on (a guest failure) */
	s->paused = false;
}

/* Reads the destination's answer on the return path: at most
 * SENDER_CONFIRM_S seconds in all (migrate_cancel ends it sooner), and at
 * most an RP_FAIL's worth of bytes. */
static int sender__await_destination(struct sender *s)
{
	struct proto_hdr hdr;
	size_t cap = PROTO_HDR_SIZE + 4 + PROTO_MAX_MSG;
	mig_stream__set_read_deadline(s->stream, time__now_ms() + SENDER_CONFIRM_S * 1000ull);
	int rc = mig_stream__get_record(s->stream, &hdr, s->rec, cap < s->rec_cap ? cap : s->rec_cap);
	if (rc)
		return rc;
	if (hdr.type == PROTO_RP_OK) {
		pthread_mutex_lock(&s->m->lock);
		s->m->confirmed = true;     /* a cancel from now on is too late */
		pthread_mutex_unlock(&s->m->lock);
		return 0;
	}
	if (hdr.type == PROTO_RP_FAIL) {
		struct proto_error e;
		s->dest_refused = true;
		const char *why;
		if (!proto__decode_error(s->rec, hdr.length, &e, &why))
			migration__set_error(s->m, "destination failed: %.*s", (int)e.msg_len, e.msg);
		else
			migration__set_error(s->m, "destination failed (unreadable reason)");
		return -EPROTO;
	}
	migration__set_error(s->m, "unexpected %s record on the return path",
			     proto__type_name(hdr.type));
	return -EPROTO;
}

/* A one-way stream (exec:, file:, a pipe's or file's fd:) has nobody to
 * answer: the end is confirmed once the bytes are out, a file's on its
 * disk and exec:'s command exited with status 0. */
int sender__finish_one_way(struct sender *s)
{
	char err[256];
	int rc = mig_stream__finish_local(s->stream, SENDER_CONFIRM_S * 1000, &s->m->cancel, err,
					  sizeof(err));
	if (rc) {   /* a snapshot hands the guest to no one: it runs on */
		migration__set_error(s->m, "the stream's end is not confirmed (%s)%s", err,
				     s->snapshot ? "" : s->ram_handed ?
				     "; the guest runs on here if nobody took its RAM" :
				     "; the guest stays paused here");
		return rc;
	}
	pthread_mutex_lock(&s->m->lock);
	s->m->confirmed = true;
	pthread_mutex_unlock(&s->m->lock);
	return 0;
}

void sender__synced(struct sender *s)
{
	if (s->unsent.words)
		bitmap__andnot(&s->unsent, &s->m->todo);
}

static int sender__end(struct sender *s)
{
	uint8_t hash[PROTO_HASH_LEN];
	bool verify = s->m->params.cap_verify;
	if (verify) {
		struct proto_ram pr;
		migration__proto_ram(s->ram, &pr);
		proto__ram_hash_as_zero(&pr, s->unsent.words ? &s->unsent : NULL, hash);
		if (s->unsent.words)
			log_info("x-verify: %zu pages hinted free or ballooned and never written since "
				 "count as zero", bitmap__count(&s->unsent));
	}
	ssize_t n = proto__encode_end(s->rec, s->rec_cap, verify ? hash : NULL);
	if (n < 0)
		return (int)n;
	int rc = mig_stream__write(s->stream, s->rec, (size_t)n);
	return rc ? rc : mig_stream__flush(s->stream);
}

/* Test builds: the stale or flipped page a fault wants sent again, as one
 * PAGES record on the main stream after the final pass. */
static int sender__fault_extra(struct sender *s)
{
	uint64_t page;
	const uint8_t *data;
	if (!mig_fault__extra(&s->fault, &page, &data))
		return 0;
	int b = s->ram->nr_blocks > 1 && page >= s->ram->blocks[1].first_page ? 1 : 0;
	uint64_t off = (page - s->ram->blocks[b].first_page) * RAM_PAGE_SIZE;
	ssize_t n = proto__encode_pages_head(s->rec, s->rec_cap, 0, (uint32_t)b, 1, &off,
					     RAM_PAGE_SIZE);
	int rc = n < 0 ? (int)n : mig_stream__write(s->stream, s->rec, (size_t)n);
	return rc ? rc : mig_stream__write(s->stream, data, RAM_PAGE_SIZE);
}

/* Before the guest stops, the stream's backlog goes out while it still
 * runs: when the link is slower than the sender (a shaped or busy wire, or
 * max-bandwidth above what it carries) the socket holds megabytes, which
 * END would otherwise wait behind in the downtime (bench/disk found 3-4
 * MB, 25-32 ms at 125 MB/s, in every disk-in-the-stream switchover).
 * Flushed, then waited on until at most SWITCHOVER_BACKLOG_LOW bytes are
 * unsent, for at most SWITCHOVER_BACKLOG_WAIT_NS (a stalled peer), or a
 * cancel.  What the guest dirties meanwhile is found by the last sync.
 * With multifd the channels' sockets count too (their queues are empty:
 * every pass waits for them, sender__end_pass), SWITCHOVER_BACKLOG_LOW
 * each. */
#define SWITCHOVER_BACKLOG_LOW      (64u << 10)
#define SWITCHOVER_BACKLOG_WAIT_NS  500000000ull
#define SWITCHOVER_BACKLOG_POLL_NS  1000000ull

/* The main stream's unsent bytes and the channels'; false if the main
 * stream is not a socket. */
static bool sender__unsent(struct sender *s, size_t *left)
{
	if (mig_stream__unsent(s->stream, left))
		return false;
	if (s->mf && !s->mf_quiet)
		*left += multifd_send__unsent(s->mf);
	return true;
}

static void sender__drain_backlog(struct sender *s)
{
	size_t left = 0, low = SWITCHOVER_BACKLOG_LOW;
	if (s->mf && !s->mf_quiet)
		low *= 1 + s->mf->n;
	if (!sender__unsent(s, &left) || left <= low)
		return;
	if (mig_stream__flush(s->stream))
		return;                       /* the stream failed: said there */
	uint64_t t0 = time__now_ns(), start = left;
	while (!atomic_load(&s->m->cancel) && time__now_ns() - t0 < SWITCHOVER_BACKLOG_WAIT_NS &&
	       sender__unsent(s, &left) && left > low)
		time__sleep_ns(SWITCHOVER_BACKLOG_POLL_NS);
	log_debug("switchover: %zu bytes unsent, %zu after %llu us with the guest running",
		  start, left, (unsigned long long)((time__now_ns() - t0) / 1000));
}

/* The guest stops for the switchover or for post-copy: a throttled guest
 * as its vCPUs begin a sleep (what it sees of the downtime then starts
 * where it last ran, not part-way into a sleep; this costs at most one
 * throttle cycle more of pre-copy), status device (pre-switchover first
 * when `pre` and the capability asks), vCPUs stopped, the rate limit
 * lifted, the last sync into todo.  *t0: when the vCPUs stopped. */
int sender__stop_guest(struct sender *s, bool pre, uint64_t *t0)
{
	struct vm *vm = s->m->vm;
	sender__drain_backlog(s);
	uint64_t w0 = time__now_ns();
	int wrc = vm__await_throttle_sleeps(vm, SWITCHOVER_SLEEP_WAIT_NS);
	uint64_t waited_us = (time__now_ns() - w0) / 1000;
	if (wrc)
		log_debug("switchover: a throttled vCPU began no sleep in %llu us",
			  (unsigned long long)waited_us);
	*t0 = time__now_ms();
	pthread_mutex_lock(&s->m->lock);
	s->m->stats.switchover_wait_us = waited_us;
	s->m->stats.switchover_wait_timed_out = wrc != 0;
	bool pause = pre && s->m->params.cap_pause_before_switchover;
	pthread_mutex_unlock(&s->m->lock);
	/* a cancel that came during the last round's decision wins */
	if (atomic_load(&s->m->cancel) || (!pause && !migration__advance(s->m, MIG_ACTIVE, MIG_DEVICE)))
		return -ECANCELED;
	/* from here on every flush must leave at once: no Nagle delays */
	if (mig_stream__set_nodelay(s->stream, true))
		log_debug("switchover: TCP_NODELAY not set");
	/* the status read and the pause in one step: a `stop` cannot slip in */
	sender__pause_guest(s);
	throttle__set(&vm->throttle, 0);
	/* pause-before-switchover: wait, stopped, for migrate-continue */
	int rc = pause ? migration__pre_switchover(s->m) : 0;
	if (rc)
		return rc;
	if (pause && !migration__advance(s->m, MIG_PRE_SWITCHOVER, MIG_DEVICE))
		return -ECANCELED;
	/* as QEMU: the guest is stopped, so the rest goes as fast as the link
	 * allows; max-bandwidth holds again for the next migration */
	pthread_mutex_lock(&s->m->lock);
	mig_stream__set_rate(s->stream, 0);
	if (s->m->mf_open)
		multifd_send__set_rate(&s->m->mf, 0);
	pthread_mutex_unlock(&s->m->lock);
	if (!s->tracking)     /* x-ignore-shared: no page to find */
		return 0;
	/* deferred, and never cleared: the vCPUs stay stopped until tracking
	 * ends, so the downtime spends nothing on write protection */
	int64_t got = dirty__sync(vm->dirty, &s->m->todo, DIRTY_SYNC_DEFER_CLEAR);
	if (got < 0)
		return (int)got;
	sender__synced(s);
	log_debug("switchover: vCPUs stopped and synced after %llu ms",
		  (unsigned long long)(time__now_ms() - *t0));
	pthread_mutex_lock(&s->m->lock);     /* query-migrate reads it */
	s->m->stats.dirty_sync_count++;
	pthread_mutex_unlock(&s->m->lock);
	return 0;
}

int sender__give_up_image(struct sender *s)
{
	int rc = vm_blk__inactivate(s->m->vm);
	if (rc)
		log_warn("switchover: the disk could not be flushed and handed over: %s",
			 strerror(-rc));
	s->image_given_up = s->m->vm->blk != NULL;
	return rc;
}

int sender__hand_over_ram(struct sender *s)
{
	uint64_t token;
	if (!s->ram_shared)
		return 0;
	int rc = memfile__hand_over(s->m->vm->memfile, &token);
	if (rc) {
		migration__set_error(s->m, "memory file %s: cannot hand it over: %s",
				     s->m->vm->memfile->path, strerror(-rc));
		return rc;
	}
	s->ram_handed = true;
	ssize_t n = proto__encode_shared(s->rec, s->rec_cap, token);
	return n < 0 ? (int)n : mig_stream__write(s->stream, s->rec, (size_t)n);
}

int sender__take_back_image(struct sender *s, char *err, size_t errlen)
{
	/* the disk first, then the RAM: the destination's order, so that of
	 * two racing for both one gets both */
	if (s->image_given_up) {
		int rc = vm_blk__activate(s->m->vm, err, errlen);
		if (rc)
			return rc;
		s->image_given_up = false;
	}
	if (s->ram_handed) {
		int rc = memfile__take_back(s->m->vm->memfile, err, errlen);
		if (rc)
			return rc;
		s->ram_handed = false;
	}
	return 0;
}

/* Stop-and-copy: the last dirty pages, device state, END, the answer. */
int sender__switchover(struct sender *s)
{
	struct vm *vm = s->m->vm;
	uint64_t t0, bytes0 = sender__bytes(s);
	int rc = sender__stop_guest(s, true, &t0);
	if (!rc && !s->ram_shared)   /* shared: not a page is sent */
		rc = sender__pass(s);
	if (!rc)
		rc = sender__disk_sum(s);
	if (!rc && !s->ram_shared)
		rc = sender__fault_extra(s);
	if (!rc)
		rc = state__save(vm, sender__put_state, s);
	if (!rc)
		rc = sender__give_up_image(s);
	if (!rc)
		rc = sender__hand_over_ram(s);
	mig_fault__report(&s->fault);
	log_debug("switchover: pages and state queued after %llu ms",
		  (unsigned long long)(time__now_ms() - t0));
	if (!rc)
		rc = sender__end(s);
	if (!rc)
		s->end_sent = true;
	log_debug("switchover: END sent after %llu ms", (unsigned long long)(time__now_ms() - t0));
	if (!rc)
		rc = mig_stream__two_way(s->stream) ? sender__await_destination(s)
						    : sender__finish_one_way(s);
	pthread_mutex_lock(&s->m->lock);
	s->m->stats.downtime_ms = time__now_ms() - t0;
	s->m->stats.downtime_bytes = sender__bytes(s) - bytes0;
	pthread_mutex_unlock(&s->m->lock);
	return rc;
}
