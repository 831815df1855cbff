/* virtio-blk: what a request the image failed does (QEMU's werror and
 * rerror, dev/blk.h), the requests kept for a retry and the retry. */
#include <errno.h>

#include "dev/blk_impl.h"

enum blk_err_action blk__error_action(enum blk_on_error on, int error)
{
	switch (on) {
	case BLK_ON_ERR_IGNORE: return BLK_ACT_IGNORE;
	case BLK_ON_ERR_STOP: return BLK_ACT_STOP;
	case BLK_ON_ERR_ENOSPC: return error == ENOSPC ? BLK_ACT_STOP : BLK_ACT_REPORT;
	default: return BLK_ACT_REPORT;
	}
}

const char *blk_on_error__name(enum blk_on_error on)
{
	static const char *const names[] = { "report", "ignore", "stop", "enospc" };
	return (unsigned)on < 4 ? names[on] : "report";
}

const char *blk_err_action__name(enum blk_err_action a)
{
	static const char *const names[] = { "report", "ignore", "stop" };
	return (unsigned)a < 3 ? names[a] : "report";
}

const char *blk_io_status__name(enum blk_io_status s)
{
	static const char *const names[] = { "ok", "failed", "nospace" };
	return (unsigned)s < 3 ? names[s] : "ok";
}

/* Lock held: r failed with res (-errno); fills e.  The action. */
enum blk_err_action blk__on_failure(struct blk *b, const struct blk_req *r, int res,
				    struct blk_io_error *e)
{
	e->write = r->type != BLK_T_IN;
	e->error = -res;
	e->action = blk__error_action(e->write ? b->werror : b->rerror, e->error);
	if (e->action == BLK_ACT_STOP) {
		int none = BLK_IOS_OK;   /* the first error since the last run stays */
		__atomic_compare_exchange_n(&b->io_status, &none,
					    e->error == ENOSPC ? BLK_IOS_NOSPACE : BLK_IOS_FAILED,
					    false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
	}
	return e->action;
}

/* Lock held: r goes to the end of the kept list (it stays unanswered). */
void blk__keep(struct blk *b, struct blk_req *r)
{
	r->next_free = NULL;
	if (b->kept_tail)
		b->kept_tail->next_free = r;
	else
		b->kept = r;
	b->kept_tail = r;
	b->nkept++;
	BLK_STAT_ADD(b, kept, 1);
}

/* Lock held: the kept requests leave the list, in order; the count
 * taken.  *out the first (linked by next_free). */
static unsigned blk__take_kept(struct blk *b, struct blk_req **out)
{
	unsigned n = b->nkept;
	*out = b->kept;
	b->kept = b->kept_tail = NULL;
	b->nkept = 0;
	b->restart = false;
	BLK_STAT_ADD(b, kept, (uint64_t)-(int64_t)n);
	return n;
}

void blk__drop_kept(struct blk *b)
{
	struct blk_req *r;
	blk__take_kept(b, &r);
	while (r) {
		struct blk_req *next = r->next_free;
		r->next_free = b->free;
		b->free = r;
		r = next;
	}
}

void blk__resubmit_kept(struct blk *b, bool *used)
{
	struct blk_req *r;
	if (!b->restart)
		return;
	unsigned n = blk__take_kept(b, &r);
	log_debug("virtio-blk: retrying %u requests kept after an I/O error", n);
	while (r) {
		struct blk_req *next = r->next_free;
		*used |= blk__submit(b, r);
		r = next;
	}
}

bool blk__restart(struct blk *b)
{
	__atomic_store_n(&b->io_status, BLK_IOS_OK, __ATOMIC_RELAXED);
	pthread_mutex_lock(&b->vp.lock);
	bool some = b->nkept > 0;
	b->restart = some;
	pthread_mutex_unlock(&b->vp.lock);
	return some;
}

unsigned blk__kept(struct blk *b)
{
	return (unsigned)__atomic_load_n(&b->stats.kept, __ATOMIC_RELAXED);
}

enum blk_io_status blk__io_status(struct blk *b)
{
	return (enum blk_io_status)__atomic_load_n(&b->io_status, __ATOMIC_RELAXED);
}
