/* Free page hinting of the balloon device (see balloon.h). */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "base/timeutil.h"
#include "dev/balloon_impl.h"

static bool balloon__hint_active(const struct balloon *b)
{
	return b->cmd_id >= BALLOON_CMD_ID_MIN;
}

/* A readable buffer: the driver tells which command id it works on. */
static void balloon__hint_id(struct balloon *b, const struct virtq_buf *buf)
{
	uint32_t id;
	if (buf->len < sizeof(id)) {
		BALLOON_STAT_ADD(b, stale_hints, 1);
		return;
	}
	memcpy(&id, buf->host, sizeof(id));
	if (balloon__hint_active(b) && id == b->cmd_id) {
		b->hint_acked = true;
		b->hint_last_ns = time__now_ns();
	} else if (id == BALLOON_CMD_ID_STOP && b->hint_acked) {
		b->hint_stopped = true;
	} else {
		BALLOON_STAT_ADD(b, stale_hints, 1);
	}
	pthread_cond_broadcast(&b->hint_cond);
}

/* A writable buffer: one free range, if the current round accepts it. */
static void balloon__hint_range(struct balloon *b, const struct virtq_buf *buf)
{
	if (!balloon__hint_active(b) || !b->hint_acked || b->hint_stopped) {
		BALLOON_STAT_ADD(b, stale_hints, 1);
		return;
	}
	uint64_t lo = (buf->gpa + RAM_PAGE_SIZE - 1) & ~(RAM_PAGE_SIZE - 1);
	uint64_t hi = (buf->gpa + buf->len) & ~(RAM_PAGE_SIZE - 1);
	int64_t first = balloon__page_of(b, lo);
	if (hi <= lo || first < 0)
		return;
	uint64_t n = (hi - lo) >> RAM_PAGE_SHIFT;
	bitmap__set_range(&b->hinted, (size_t)first, (size_t)n);
	BALLOON_STAT_ADD(b, hint_bufs, 1);
	BALLOON_STAT_ADD(b, hinted_pages, n);
	b->hint_round_pages += n;
	b->hint_last_ns = time__now_ns();
	pthread_cond_broadcast(&b->hint_cond);
}

void balloon__hint_chain(struct balloon *b, unsigned qi, const struct virtq_chain *c)
{
	(void)qi;
	for (unsigned i = 0; i < c->n; i++) {
		if (c->bufs[i].writable)
			balloon__hint_range(b, &c->bufs[i]);
		else
			balloon__hint_id(b, &c->bufs[i]);
	}
}

void balloon__hint_reset(struct balloon *b)
{
	b->cmd_id = BALLOON_CMD_ID_STOP;
	b->hint_acked = b->hint_stopped = false;
	b->hint_round_pages = 0;
	bitmap__clear_all(&b->hinted);
	pthread_cond_broadcast(&b->hint_cond);
}

/* Lock held: the driver runs, negotiated hinting and enabled its queue. */
static bool balloon__hint_usable(const struct balloon *b)
{
	int qi = balloon__queue(b, BALLOON_VQ_FREE_PAGE);   /* -1 without the feature */
	return virtio_pci__running(&b->vp) && qi >= 0 && b->vp.vqs[qi].ready;
}

bool balloon__hint_ready(struct balloon *b)
{
	pthread_mutex_lock(&b->vp.lock);
	bool ok = balloon__hint_usable(b);
	pthread_mutex_unlock(&b->vp.lock);
	return ok;
}

/* Lock held: publishes id and tells the driver. */
static void balloon__set_cmd_id(struct balloon *b, uint32_t id)
{
	b->cmd_id = id;
	b->hint_acked = b->hint_stopped = false;
	virtio_pci__config_changed(&b->vp);
	pthread_cond_broadcast(&b->hint_cond);
}

int balloon__hint_start(struct balloon *b)
{
	pthread_mutex_lock(&b->vp.lock);
	int rc = 0;
	if (!balloon__hint_usable(b)) {
		rc = -ENOTSUP;
	} else {
		bitmap__clear_all(&b->hinted);
		b->hint_round_pages = 0;
		uint32_t id = b->next_cmd_id;
		b->next_cmd_id = id == UINT32_MAX ? BALLOON_CMD_ID_MIN : id + 1;
		balloon__set_cmd_id(b, id);
	}
	pthread_mutex_unlock(&b->vp.lock);
	return rc;
}

uint64_t balloon__hint_wait(struct balloon *b, unsigned ack_ms, unsigned quiet_ms, unsigned max_ms)
{
	uint64_t start = time__now_ns(), quiet = (uint64_t)quiet_ms * 1000000;
	uint64_t ack = (uint64_t)ack_ms * 1000000;
	uint64_t deadline = start + (uint64_t)max_ms * 1000000;
	pthread_mutex_lock(&b->vp.lock);
	uint32_t id = b->cmd_id;
	for (;;) {
		uint64_t now = time__now_ns();
		if (now >= deadline || b->cmd_id != id || !balloon__hint_active(b) || b->hint_stopped)
			break;
		if (b->hint_acked ? now - b->hint_last_ns >= quiet : now - start >= ack)
			break;
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		uint64_t step = 10000000; /* 10 ms */
		ts.tv_nsec += (long)step;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&b->hint_cond, &b->vp.lock, &ts);
	}
	uint64_t pages = b->hint_round_pages;
	pthread_mutex_unlock(&b->vp.lock);
	return pages;
}

void balloon__hint_stop(struct balloon *b)
{
	pthread_mutex_lock(&b->vp.lock);
	if (balloon__hint_active(b))
		balloon__set_cmd_id(b, BALLOON_CMD_ID_STOP);
	pthread_mutex_unlock(&b->vp.lock);
}

void balloon__hint_done(struct balloon *b)
{
	pthread_mutex_lock(&b->vp.lock);
	if (b->cmd_id != BALLOON_CMD_ID_DONE && (balloon__hint_active(b) || b->hint_round_pages)) {
		balloon__set_cmd_id(b, BALLOON_CMD_ID_DONE);
		bitmap__clear_all(&b->hinted);
	}
	pthread_mutex_unlock(&b->vp.lock);
}

uint32_t balloon__hint_cmd_id(struct balloon *b)
{
	pthread_mutex_lock(&b->vp.lock);
	uint32_t id = b->cmd_id;
	pthread_mutex_unlock(&b->vp.lock);
	return id;
}
