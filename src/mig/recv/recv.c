/* Migration receiver state machine; see recv.h. */
#include "mig/recv/recv.h"
#include "base/utf8.h"
#include "mig/comp.h"
#include "mig/wire/xbzrle.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int mig_recv__init(struct mig_recv *r, const struct proto_ram *ram,
		   const struct mig_recv_ops *ops)
{
	memset(r, 0, sizeof(*r));
	if (!ram || ram->nr_blocks == 0 || ram->nr_blocks > PROTO_MAX_BLOCKS)
		return -EINVAL;
	for (unsigned i = 0; i < ram->nr_blocks; i++) {
		const struct proto_ram_block *b = &ram->blocks[i];
		if (!b->host || b->size == 0 || b->size % PROTO_PAGE_SIZE)
			return -EINVAL;
	}
	r->ram = ram;
	if (ops)
		r->ops = *ops;
	r->state = MIG_RECV_WAIT_START;
	return 0;
}

int mig_recv__init_channel(struct mig_recv *r, const struct proto_ram *ram,
			   const struct mig_recv_ops *ops)
{
	int rc = mig_recv__init(r, ram, ops);
	if (rc)
		return rc;
	r->channel = true;
	r->state = MIG_RECV_RAM;
	return 0;
}

int mig_recv__init_preempt(struct mig_recv *r, const struct proto_ram *ram,
			   const struct mig_recv_ops *ops)
{
	if (!ops || !ops->place_page || !ops->place_zero)
		return -EINVAL;
	int rc = mig_recv__init(r, ram, ops);
	if (rc)
		return rc;
	r->channel = r->preempt = true;
	r->state = MIG_RECV_POSTCOPY;
	return 0;
}

void mig_recv__free(struct mig_recv *r)
{
	free(r->payload);
	free(r->scratch);
	proto_codec__free(&r->codec);
	r->payload = r->scratch = NULL;
}

const char *mig_recv__state_name(enum mig_recv_state st)
{
	switch (st) {
	case MIG_RECV_WAIT_START: return "wait-start";
	case MIG_RECV_RAM:        return "ram";
	case MIG_RECV_POSTCOPY:   return "postcopy";
	case MIG_RECV_DONE:       return "done";
	case MIG_RECV_FAILED:     return "failed";
	}
	return "?";
}

static int recv__vfail(struct mig_recv *r, int err, const char *fmt, va_list ap)
{
	if (r->state == MIG_RECV_FAILED)
		return r->err;
	r->err = err < 0 ? err : -EINVAL;
	r->state = MIG_RECV_FAILED;
	vsnprintf(r->errmsg, sizeof(r->errmsg), fmt, ap);
	utf8__sanitize(r->errmsg);
	return r->err;
}

int mig_recv__fail(struct mig_recv *r, int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int e = recv__vfail(r, err, fmt, ap);
	va_end(ap);
	return e;
}

static int recv__hook_ret(int rc)
{
	return rc < 0 ? rc : -EINVAL;
}

static int recv__placing_failed(struct mig_recv *r, const char *what, int rc, uint32_t block,
				uint64_t off)
{
	rc = recv__hook_ret(rc);
	return mig_recv__fail(r, rc, "%s: placing block %" PRIu32 " offset 0x%" PRIx64
			      " failed: %s", what, block, off, strerror(-rc));
}

/* Checks block and every offset of a PAGES/ZERO run against guest RAM. */
static int recv__check_run(struct mig_recv *r, const char *what, const struct proto_pages *pg)
{
	if (pg->block >= r->ram->nr_blocks)
		return mig_recv__fail(r, -EINVAL, "%s: block %" PRIu32 " out of range (%u blocks)",
				      what, pg->block, r->ram->nr_blocks);
	uint64_t size = r->ram->blocks[pg->block].size;
	for (uint32_t i = 0; i < pg->count; i++) {
		uint64_t off = proto__offset(pg, i);
		if (off % PROTO_PAGE_SIZE)
			return mig_recv__fail(r, -EINVAL, "%s: offset 0x%" PRIx64
					      " in block %" PRIu32 " is not page-aligned",
					      what, off, pg->block);
		if (off > size - PROTO_PAGE_SIZE)
			return mig_recv__fail(r, -EINVAL, "%s: offset 0x%" PRIx64
					      " beyond block %" PRIu32 " (size 0x%" PRIx64 ")",
					      what, off, pg->block, size);
	}
	return 0;
}

static int recv__start(struct mig_recv *r, const struct proto_hdr *h, const void *p)
{
	struct proto_start st;
	const char *why = NULL;
	char msg[200];
	if (r->state != MIG_RECV_WAIT_START)
		return mig_recv__fail(r, -EPROTO, "second START record");
	if (proto__decode_start(p, h->length, h->flags, &st, &why))
		return mig_recv__fail(r, -EPROTO, "START: %s (version %" PRIu32 ", page size %"
				      PRIu32 ")", why, st.version, st.page_size);
	if (proto__layout_mismatch(&st, r->ram, msg, sizeof(msg)))
		return mig_recv__fail(r, -EINVAL, "START: RAM layout differs: %s", msg);
	r->ram_shared = st.ram_shared;
	if (r->ram_shared && !r->ops.on_start)
		return mig_recv__fail(r, -EPROTO, "START: the RAM is handed over in a shared file, "
				      "but this side takes none");
	int rc = r->ops.on_start ? r->ops.on_start(r->ops.ctx, &st) : 0;
	if (rc)     /* a message the hook gave first stands */
		return mig_recv__fail(r, recv__hook_ret(rc), "START: %s", strerror(-recv__hook_ret(rc)));
	r->state = MIG_RECV_RAM;
	return 0;
}

/* SHARED: once, with RAM_SHARED, before END. */
static int recv__shared(struct mig_recv *r, const struct proto_hdr *h, const void *p)
{
	uint64_t token;
	const char *why = NULL;
	if (proto__decode_shared(p, h->length, &token, &why))
		return mig_recv__fail(r, -EPROTO, "SHARED: %s", why);
	if (!r->ram_shared || r->shared_token)
		return mig_recv__fail(r, -EPROTO, r->ram_shared ? "second SHARED record" :
				      "SHARED record, but START did not say the RAM is shared");
	r->shared_token = token;
	int rc = r->ops.on_shared ? r->ops.on_shared(r->ops.ctx, token) : 0;
	if (rc)
		return mig_recv__fail(r, recv__hook_ret(rc), "SHARED: %s",
				      strerror(-recv__hook_ret(rc)));
	return 0;
}

/* With RAM_SHARED only STATE, SHARED and END carry anything: no page
 * may be written into a RAM that is handed over, not sent. */
static bool recv__shared_allows(uint32_t type)
{
	return type == PROTO_STATE || type == PROTO_SHARED || type == PROTO_END;
}

static int recv__pages(struct mig_recv *r, const struct proto_hdr *h, const void *p)
{
	struct proto_pages pg;
	const char *why = NULL;
	if (proto__decode_pages(p, h->length, h->flags, &pg, &why))
		return mig_recv__fail(r, -EPROTO, "PAGES: %s", why);
	int e = recv__check_run(r, "PAGES", &pg);
	if (e)
		return e;
	const uint8_t *data = pg.data;
	if (pg.comp != PROTO_COMP_NONE) {
		if (!r->scratch && !(r->scratch = malloc((size_t)PROTO_MAX_PAGES * PROTO_PAGE_SIZE)))
			return mig_recv__fail(r, -ENOMEM, "PAGES: out of memory");
		e = proto__decompress(&r->codec, pg.comp, pg.data, pg.data_len, r->scratch,
				      pg.raw_len);
		if (e == -ENOMEM)
			return mig_recv__fail(r, e, "PAGES: out of memory for the %s decoder",
					      mig_comp__name(pg.comp));
		if (e)
			return mig_recv__fail(r, e, "PAGES: %s blob does not decompress to %"
					      PRIu32 " bytes", mig_comp__name(pg.comp), pg.raw_len);
		data = r->scratch;
	}
	uint8_t *host = r->ram->blocks[pg.block].host;
	for (uint32_t i = 0; i < pg.count; i++) {
		uint64_t off = proto__offset(&pg, i);
		const uint8_t *src = data + (size_t)i * PROTO_PAGE_SIZE;
		if (r->state == MIG_RECV_POSTCOPY) {
			int rc = r->ops.place_page(r->ops.ctx, pg.block, off, src);
			if (rc)
				return recv__placing_failed(r, "PAGES", rc, pg.block, off);
			r->stats.postcopy_pages++;
			continue;
		}
		memcpy(host + off, src, PROTO_PAGE_SIZE);
		if (r->ops.on_page_written)
			r->ops.on_page_written(r->ops.ctx, pg.block, off);
	}
	r->stats.pages += pg.count;
	return 0;
}

static bool recv__page_is_zero(const uint8_t *p)
{
	uint64_t acc = 0, w;
	for (size_t i = 0; i < PROTO_PAGE_SIZE; i += 8) {
		memcpy(&w, p + i, 8);
		acc |= w;
	}
	return acc == 0;
}

/* One page zeroed before POSTCOPY (a ZERO record's, an XBZRLE entry's). */
static int recv__zero_one(struct mig_recv *r, const char *what, uint32_t block, uint64_t off)
{
	uint8_t *page = r->ram->blocks[block].host + off;
	if (r->ops.on_zero) {
		int rc = r->ops.on_zero(r->ops.ctx, block, off);
		if (rc)
			return mig_recv__fail(r, recv__hook_ret(rc), "%s: zeroing block %" PRIu32
					      " offset 0x%" PRIx64 " failed: %s", what, block, off,
					      strerror(-recv__hook_ret(rc)));
	} else if (recv__page_is_zero(page)) {
		r->stats.zero_skipped++;
	} else {
		memset(page, 0, PROTO_PAGE_SIZE);
	}
	if (r->ops.on_page_written)
		r->ops.on_page_written(r->ops.ctx, block, off);
	return 0;
}

static int recv__zero(struct mig_recv *r, const struct proto_hdr *h, const void *p)
{
	struct proto_pages pg;
	const char *why = NULL;
	if (proto__decode_zero(p, h->length, &pg, &why))
		return mig_recv__fail(r, -EPROTO, "ZERO: %s", why);
	int e = recv__check_run(r, "ZERO", &pg);
	if (e)
		return e;
	for (uint32_t i = 0; i < pg.count; i++) {
		uint64_t off = proto__offset(&pg, i);
		if (r->state == MIG_RECV_POSTCOPY) {
			int rc = r->ops.place_zero(r->ops.ctx, pg.block, off);
			if (rc)
				return recv__placing_failed(r, "ZERO", rc, pg.block, off);
			r->stats.postcopy_pages++;
			continue;
		}
		int rc = recv__zero_one(r, "ZERO", pg.block, off);
		if (rc)
			return rc;
	}
	r->stats.zero_pages += pg.count;
	return 0;
}

/* XBZRLE (mig/wire/xbzrle.h), before POSTCOPY on the main stream: the
 * whole record is checked (every delta, every offset) before a page is
 * touched. */
static int recv__xbzrle(struct mig_recv *r, const struct proto_hdr *h, const void *p)
{
	struct proto_xbzrle x;
	struct proto_xbzrle_entry e;
	const char *why = NULL;
	if (proto__decode_xbzrle(p, h->length, &x, &why))
		return mig_recv__fail(r, -EPROTO, "XBZRLE: %s", why);
	if (x.block >= r->ram->nr_blocks)
		return mig_recv__fail(r, -EINVAL, "XBZRLE: block %" PRIu32 " out of range (%u blocks)",
				      x.block, r->ram->nr_blocks);
	uint64_t size = r->ram->blocks[x.block].size;
	size_t pos = 0;
	for (uint32_t i = 0; i < x.count; i++) {
		proto__xbzrle_entry(&x, &pos, &e);
		if (e.offset % PROTO_PAGE_SIZE || e.offset > size - PROTO_PAGE_SIZE)
			return mig_recv__fail(r, -EINVAL, "XBZRLE: offset 0x%" PRIx64 " is not a page "
					      "of block %" PRIu32 " (size 0x%" PRIx64 ")",
					      e.offset, x.block, size);
	}
	uint8_t *host = r->ram->blocks[x.block].host;
	pos = 0;
	for (uint32_t i = 0; i < x.count; i++) {
		proto__xbzrle_entry(&x, &pos, &e);
		if (!e.len) {
			int rc = recv__zero_one(r, "XBZRLE", x.block, e.offset);
			if (rc)
				return rc;
			r->stats.zero_pages++;
			continue;
		}
		if (e.len == PROTO_PAGE_SIZE) {
			memcpy(host + e.offset, e.data, PROTO_PAGE_SIZE);
			r->stats.pages++;
		} else {
			xbzrle__apply(e.data, e.len, host + e.offset);
			r->stats.xbzrle_pages++;
		}
		if (r->ops.on_page_written)
			r->ops.on_page_written(r->ops.ctx, x.block, e.offset);
	}
	return 0;
}

static bool recv__postcopy_hooks(const struct mig_recv *r)
{
	return r->ops.on_discard && r->ops.on_postcopy && r->ops.place_page && r->ops.place_zero;
}

static int recv__discard(struct mig_recv *r, const struct proto_hdr *h, const void *p)
{
	struct proto_pages pg;
	const char *why = NULL;
	if (!recv__postcopy_hooks(r))
		return mig_recv__fail(r, -EPROTO, "DISCARD record but post-copy is not enabled here "
				      "(capability postcopy-ram)");
	if (proto__decode_discard(p, h->length, &pg, &why))
		return mig_recv__fail(r, -EPROTO, "DISCARD: %s", why);
	int e = recv__check_run(r, "DISCARD", &pg);
	for (uint32_t i = 0; !e && i < pg.count; i++) {
		uint64_t off = proto__offset(&pg, i);
		int rc = r->ops.on_discard(r->ops.ctx, pg.block, off);
		if (rc)
			e = recv__placing_failed(r, "DISCARD", rc, pg.block, off);
	}
	r->stats.discarded += e ? 0 : pg.count;
	return e;
}

static int recv__postcopy(struct mig_recv *r, uint32_t flags)
{
	if (!recv__postcopy_hooks(r))
		return mig_recv__fail(r, -EPROTO, "POSTCOPY record but post-copy is not enabled here "
				      "(capability postcopy-ram)");
	r->pc_verify = flags & PROTO_F_HAS_CHECKSUM;
	if (r->pc_verify && !r->ops.postcopy_check)
		return mig_recv__fail(r, -EPROTO, "POSTCOPY announces a checksum this side cannot check");
	int rc = r->ops.on_postcopy(r->ops.ctx);
	if (rc) {
		rc = recv__hook_ret(rc);
		return r->state == MIG_RECV_FAILED ? r->err :
		       mig_recv__fail(r, rc, "cannot start post-copy: %s", strerror(-rc));
	}
	r->state = MIG_RECV_POSTCOPY;
	return 0;
}

static int recv__state_rec(struct mig_recv *r, const struct proto_hdr *h, const void *p)
{
	struct proto_state st;
	const char *why = NULL;
	if (proto__decode_state(p, h->length, &st, &why))
		return mig_recv__fail(r, -EPROTO, "STATE: %s", why);
	if (!r->ops.on_state)
		return mig_recv__fail(r, -ENOTSUP, "STATE section 0x%" PRIx32
				      " but no state handler", st.id);
	int rc = r->ops.on_state(r->ops.ctx, st.id, st.version, st.instance, st.data, st.len);
	if (rc) {
		rc = recv__hook_ret(rc);
		return mig_recv__fail(r, rc, "STATE section 0x%" PRIx32 " version %" PRIu32
				      " instance %" PRIu32 " (%zu bytes) rejected: %s",
				      st.id, st.version, st.instance, st.len, strerror(-rc));
	}
	r->stats.sections++;
	return 0;
}

static int recv__end(struct mig_recv *r, const struct proto_hdr *h, const void *p)
{
	uint8_t theirs[PROTO_HASH_LEN], ours[PROTO_HASH_LEN];
	bool has = false;
	const char *why = NULL;
	if (proto__decode_end(p, h->length, h->flags, theirs, &has, &why))
		return mig_recv__fail(r, -EPROTO, "END: %s", why);
	r->checksum_present = has;
	if (r->ram_shared && !r->shared_token)
		return mig_recv__fail(r, -EPROTO, "END before the RAM's hand-over (SHARED)");
	if (r->preempt) {
		if (has)
			return mig_recv__fail(r, -EPROTO, "END with a checksum on the preempt channel");
		r->state = MIG_RECV_DONE;
		return 0;
	}
	if (r->state == MIG_RECV_POSTCOPY && r->ops.on_postcopy_end) {
		int rc = r->ops.on_postcopy_end(r->ops.ctx);
		if (rc) {
			rc = mig_recv__fail(r, recv__hook_ret(rc), "END: the preempt channel's "
					    "pages are not all in");
			r->link_lost = rc != -EPROTO;
			return rc;
		}
	}
	if (r->state == MIG_RECV_POSTCOPY && (h->flags & PROTO_F_PAGE_SUM))
		return mig_recv__fail(r, -EPROTO, "END: a background snapshot's page sum after "
				      "post-copy");
	if (r->state == MIG_RECV_POSTCOPY && has != r->pc_verify)
		return mig_recv__fail(r, -EPROTO, has ? "END: a RAM checksum POSTCOPY did not announce"
						      : "END without the checksum POSTCOPY announced");
	if (has && r->state == MIG_RECV_POSTCOPY) {
		int rc = r->ops.postcopy_check(r->ops.ctx, theirs);
		r->checksum_ok = rc == 0;
		if (rc)
			return mig_recv__fail(r, -EBADMSG, "END: guest RAM checksum mismatch after "
					      "post-copy (pages lost or corrupted)");
	} else if (has) {
		/* a background snapshot's pages were read out of order: it
		 * sums them, each as it went */
		if (h->flags & PROTO_F_PAGE_SUM)
			proto__ram_page_sum(r->ram, ours);
		else
			proto__ram_hash(r->ram, ours);
		r->checksum_ok = memcmp(ours, theirs, PROTO_HASH_LEN) == 0;
		if (!r->checksum_ok)
			return mig_recv__fail(r, -EBADMSG,
					      "END: guest RAM checksum mismatch (pages lost or corrupted)");
	}
	r->state = MIG_RECV_DONE;
	return 0;
}

static int recv__disk(struct mig_recv *r, const struct proto_hdr *h, const void *p)
{
	struct proto_disk d;
	const char *why = NULL;
	if (proto__decode_disk(p, h->length, h->flags, &d, &why))
		return mig_recv__fail(r, -EPROTO, "DISK: %s", why);
	if (!r->ops.on_disk)
		return mig_recv__fail(r, -EPROTO, "DISK record, but this side takes no disk");
	int rc = r->ops.on_disk(r->ops.ctx, &d);
	if (rc) {       /* a message the hook gave first stands */
		rc = recv__hook_ret(rc);
		return mig_recv__fail(r, rc, "DISK at offset 0x%" PRIx64 " (%" PRIu64 " bytes): %s",
				      d.offset, d.length, strerror(-rc));
	}
	return 0;
}

/* The source's ERROR record: keep its text printable. */
static int recv__error_rec(struct mig_recv *r, const struct proto_hdr *h, const void *p)
{
	struct proto_error e;
	const char *why = NULL;
	char text[160];
	if (proto__decode_error(p, h->length, &e, &why))
		return mig_recv__fail(r, -EPROTO, "ERROR: %s", why);
	size_t n = e.msg_len < sizeof(text) - 1 ? e.msg_len : sizeof(text) - 1;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)e.msg[i];
		text[i] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
	}
	text[n] = 0;
	return mig_recv__fail(r, -ECANCELED, "source aborted the migration (code %" PRIu32
			      "): %s", e.code, text);
}

static int recv__channel_rec(struct mig_recv *r, const struct proto_hdr *h, const void *p)
{
	uint32_t index, count;
	uint8_t session[PROTO_SESSION_LEN];
	const char *why = NULL;
	if (proto__decode_channel(p, h->length, &index, &count, session, &why))
		return mig_recv__fail(r, -EPROTO, "CHANNEL: %s", why);
	if (r->channel || index != 0 || !r->ops.on_channels)
		return mig_recv__fail(r, -EPROTO, "unexpected CHANNEL record");
	int e = r->ops.on_channels(r->ops.ctx, count, session);
	if (e)
		return mig_recv__fail(r, e > 0 ? -EINVAL : e, "cannot open %" PRIu32
				      " migration channels", count);
	return 0;
}

static int recv__preempt_rec(struct mig_recv *r, const struct proto_hdr *h, const void *p)
{
	uint8_t session[PROTO_SESSION_LEN];
	uint32_t channels;
	const char *why = NULL;
	if (proto__decode_preempt(p, h->length, session, &channels, &why))
		return mig_recv__fail(r, -EPROTO, "PREEMPT: %s", why);
	bool reopen = r->state == MIG_RECV_POSTCOPY && r->preempt_due;
	if (r->channel || (r->state != MIG_RECV_RAM && !reopen))
		return mig_recv__fail(r, -EPROTO, "unexpected PREEMPT record");
	if (reopen && channels)
		return mig_recv__fail(r, -EPROTO, "PREEMPT after a resume names multifd channels");
	r->preempt_due = false;
	if (!r->ops.on_preempt)
		return mig_recv__fail(r, -EPROTO, "PREEMPT record but postcopy-preempt is not "
				      "enabled here (capability postcopy-preempt)");
	int e = r->ops.on_preempt(r->ops.ctx, session, channels);
	if (e)      /* a message the hook gave first stands */
		return mig_recv__fail(r, recv__hook_ret(e), "the preempt channel did not open");
	return 0;
}

/* Records an extra channel may carry. */
static bool recv__channel_allows(const struct mig_recv *r, uint32_t type)
{
	if (r->preempt)
		return type == PROTO_PAGES || type == PROTO_ZERO || type == PROTO_END;
	return type == PROTO_PAGES || type == PROTO_ZERO || type == PROTO_SYNC;
}

/* Records the main stream may carry once the guest runs here. */
static bool recv__postcopy_allows(uint32_t type)
{
	return type == PROTO_PAGES || type == PROTO_ZERO || type == PROTO_END;
}

static int recv__ram_record(struct mig_recv *r, const struct proto_hdr *h, const void *p)
{
	if (r->channel && !recv__channel_allows(r, h->type))
		return mig_recv__fail(r, -EPROTO, "%s record on a %s channel",
				      proto__type_name(h->type), r->preempt ? "preempt" : "multifd");
	if (r->state == MIG_RECV_POSTCOPY && !recv__postcopy_allows(h->type) &&
	    !(h->type == PROTO_PREEMPT && r->preempt_due))
		return mig_recv__fail(r, -EPROTO, "%s record during post-copy",
				      proto__type_name(h->type));
	if (r->ram_shared && !recv__shared_allows(h->type))
		return mig_recv__fail(r, -EPROTO, "%s record, but the RAM is handed over in a shared "
				      "file (x-ignore-shared), not sent", proto__type_name(h->type));
	uint64_t round;
	const char *why = NULL;
	switch (h->type) {
	case PROTO_SHARED:
		return recv__shared(r, h, p);
	case PROTO_PAGES:
		return recv__pages(r, h, p);
	case PROTO_ZERO:
		return recv__zero(r, h, p);
	case PROTO_STATE:
		return recv__state_rec(r, h, p);
	case PROTO_SYNC:
		if (proto__decode_sync(p, h->length, &round, &why))
			return mig_recv__fail(r, -EPROTO, "SYNC: %s", why);
		r->stats.syncs++;
		r->stats.last_round = round;
		if (r->ops.on_sync) {
			int e = r->ops.on_sync(r->ops.ctx, round);
			if (e)
				return mig_recv__fail(r, e > 0 ? -EINVAL : e, "round %" PRIu64
						      " did not complete on every channel", round);
		}
		return 0;
	case PROTO_CHANNEL:
		return recv__channel_rec(r, h, p);
	case PROTO_PREEMPT:
		return recv__preempt_rec(r, h, p);
	case PROTO_DISCARD:
		return recv__discard(r, h, p);
	case PROTO_POSTCOPY:
		return recv__postcopy(r, h->flags);
	case PROTO_END:
		return recv__end(r, h, p);
	case PROTO_DISK:
		return recv__disk(r, h, p);
	case PROTO_XBZRLE:
		return recv__xbzrle(r, h, p);
	default:
		return mig_recv__fail(r, -EPROTO, "%s record on the migration stream",
				      proto__type_name(h->type));
	}
}

int mig_recv__feed_record(struct mig_recv *r, const struct proto_hdr *h, const void *p)
{
	if (r->state == MIG_RECV_FAILED)
		return r->err;
	if (r->state == MIG_RECV_DONE)
		return mig_recv__fail(r, -EPROTO, "%s record after END", proto__type_name(h->type));
	const char *problem = proto__header_problem(h);
	if (problem)
		return mig_recv__fail(r, -EPROTO, "bad record header (type 0x%" PRIx32 " flags 0x%"
				      PRIx32 " length %" PRIu64 "): %s",
				      h->type, h->flags, h->length, problem);
	if (h->length && !p)
		return mig_recv__fail(r, -EINVAL, "record payload missing");
	int e;
	if (h->type == PROTO_ERROR)
		return recv__error_rec(r, h, p);
	if (h->type == PROTO_START)
		e = recv__start(r, h, p);
	else if (r->state == MIG_RECV_WAIT_START)
		return mig_recv__fail(r, -EPROTO, "%s record before START",
				      proto__type_name(h->type));
	else
		e = recv__ram_record(r, h, p);
	if (e)
		return e;
	r->stats.records++;
	r->stats.bytes += PROTO_HDR_SIZE + h->length;
	return 0;
}

int mig_recv__step(struct mig_recv *r, struct mig_stream *s)
{
	struct proto_hdr h;
	if (r->state == MIG_RECV_FAILED)
		return r->err;
	if (r->state == MIG_RECV_DONE)
		return 0;
	if (!r->payload && !(r->payload = malloc(PROTO_MAX_PAYLOAD)))
		return mig_recv__fail(r, -ENOMEM, "out of memory for the record buffer");
	int e = mig_stream__get_record(s, &h, r->payload, PROTO_MAX_PAYLOAD);
	if (e) {
		r->link_lost = r->state == MIG_RECV_POSTCOPY && e != -EPROTO && e != -EMSGSIZE;
		return mig_recv__fail(r, e, "%s%s", e == -EPROTO ? "" : "stream: ",
				      mig_stream__strerror(s));
	}
	return mig_recv__feed_record(r, &h, r->payload);
}

int mig_recv__resume(struct mig_recv *r)
{
	if (!mig_recv__link_lost(r))
		return -EINVAL;
	r->state = MIG_RECV_POSTCOPY;
	r->link_lost = false;
	r->preempt_due = false;
	r->err = 0;
	r->errmsg[0] = 0;
	return 0;
}

int mig_recv__run(struct mig_recv *r, struct mig_stream *s)
{
	while (r->state != MIG_RECV_DONE) {
		int e = mig_recv__step(r, s);
		if (e)
			return e;
	}
	return 0;
}

int mig_recv__reply(struct mig_recv *r, struct mig_stream *s)
{
	uint8_t buf[PROTO_HDR_SIZE + 4 + PROTO_MAX_MSG];
	ssize_t n;
	if (r->state == MIG_RECV_DONE)
		n = proto__encode_rp_ok(buf, sizeof(buf));
	else
		n = proto__encode_rp_fail(buf, sizeof(buf), (uint32_t)(r->err ? -r->err : EPROTO),
					  r->errmsg[0] ? r->errmsg : "migration incomplete");
	if (n < 0)
		return (int)n;
	return mig_stream__reply(s, buf, (size_t)n);
}
