/* Post-copy, source side: the return-path reader; see postcopy.h. */
#include "mig/postcopy.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/timeutil.h"
#include "mem/ram.h"
#include "mig/wire/proto.h"

int postcopy_src__init(struct postcopy_src *q, struct mig_stream *s, const struct ram *ram)
{
	memset(q, 0, sizeof(*q));
	q->stream = s;
	q->ram = ram;
	pthread_mutex_init(&q->lock, NULL);
	time__cond_init(&q->cond);
	return bitmap__init(&q->wanted, ram->npages);
}

static void pcs__signal(struct postcopy_src *q)
{
	pthread_mutex_lock(&q->lock);
	pthread_cond_broadcast(&q->cond);
	pthread_mutex_unlock(&q->lock);
}

static void pcs__end(struct postcopy_src *q, int outcome, const char *fmt, const char *detail)
{
	if (outcome < 0)
		snprintf(q->error, sizeof(q->error), fmt, detail);
	atomic_store(&q->outcome, outcome);
	pcs__signal(q);
}

/* An RP_REQ: the page must lie in guest RAM. */
static int pcs__request(struct postcopy_src *q, const uint8_t *p, uint64_t len)
{
	uint32_t block;
	uint64_t off;
	const char *why = NULL;
	if (proto__decode_rp_req(p, len, &block, &off, &why))
		return -EPROTO;
	if (block >= q->ram->nr_blocks || off % RAM_PAGE_SIZE ||
	    off >= q->ram->blocks[block].size)
		return -EINVAL;
	bitmap__set(&q->wanted, q->ram->blocks[block].first_page + off / RAM_PAGE_SIZE);
	atomic_store(&q->asked, true);  /* after the bit: a scan that sees it finds it */
	atomic_fetch_add(&q->requests, 1);
	pcs__signal(q);
	return 0;
}

/* An RP_ACK: the destination's position in the stream never goes back
 * (a new link has a new postcopy_src). */
static int pcs__ack(struct postcopy_src *q, const uint8_t *p, uint64_t len)
{
	uint64_t pos;
	const char *why = NULL;
	if (proto__decode_rp_ack(p, len, &pos, &why) || pos < atomic_load(&q->acked))
		return -EPROTO;
	pthread_mutex_lock(&q->lock);
	atomic_store(&q->acked, pos);
	atomic_fetch_add(&q->acks, 1);
	pthread_cond_broadcast(&q->cond);
	pthread_mutex_unlock(&q->lock);
	return 0;
}

static void *pcs__reader(void *arg)
{
	struct postcopy_src *q = arg;
	uint8_t buf[PROTO_HDR_SIZE + 4 + PROTO_MAX_MSG];
	pthread_setname_np(pthread_self(), "pc-return");
	for (;;) {
		struct proto_hdr h;
		int rc = mig_stream__get_record(q->stream, &h, buf, sizeof(buf));
		if (rc) {
			pcs__end(q, rc, "return path: %s", mig_stream__strerror(q->stream));
			return NULL;
		}
		switch (h.type) {
		case PROTO_RP_REQ:
			if (pcs__request(q, buf, h.length)) {
				pcs__end(q, -EPROTO, "%s", "the destination asked for a page outside RAM");
				return NULL;
			}
			break;
		case PROTO_RP_ACK:
			if (pcs__ack(q, buf, h.length)) {
				pcs__end(q, -EPROTO, "%s", "RP_ACK went back in the stream");
				return NULL;
			}
			break;
		case PROTO_RP_RUNNING:
			atomic_store(&q->running_ms, time__now_ms());
			pcs__signal(q);
			break;
		case PROTO_RP_OK:
			pcs__end(q, 1, NULL, NULL);
			return NULL;
		case PROTO_RP_FAIL: {
			struct proto_error e;
			const char *why;
			char msg[200];
			if (proto__decode_error(buf, h.length, &e, &why))
				snprintf(msg, sizeof(msg), "(unreadable reason)");
			else
				snprintf(msg, sizeof(msg), "%.*s", (int)e.msg_len, e.msg);
			atomic_store(&q->refused, true);
			pcs__end(q, -EPROTO, "destination failed: %s", msg);
			return NULL;
		}
		default:
			pcs__end(q, -EPROTO, "unexpected %s record on the return path",
				 proto__type_name(h.type));
			return NULL;
		}
	}
}

int postcopy_src__start(struct postcopy_src *q)
{
	int rc = pthread_create(&q->thread, NULL, pcs__reader, q);
	q->thread_started = rc == 0;
	return -rc;
}

void postcopy_src__wait(struct postcopy_src *q, int timeout_ms)
{
	postcopy_src__wait_ns(q, (uint64_t)timeout_ms * 1000000ull);
}

void postcopy_src__wait_ns(struct postcopy_src *q, uint64_t timeout_ns)
{
	struct timespec ts = time__deadline(timeout_ns);
	pthread_mutex_lock(&q->lock);
	if (!atomic_load(&q->outcome) && !atomic_load(&q->asked))
		pthread_cond_timedwait(&q->cond, &q->lock, &ts);
	pthread_mutex_unlock(&q->lock);
}

void postcopy_src__wait_ack(struct postcopy_src *q, uint64_t acked, uint64_t timeout_ns)
{
	struct timespec ts = time__deadline(timeout_ns);
	pthread_mutex_lock(&q->lock);
	if (!atomic_load(&q->outcome) && !atomic_load(&q->asked) && atomic_load(&q->acked) == acked)
		pthread_cond_timedwait(&q->cond, &q->lock, &ts);
	pthread_mutex_unlock(&q->lock);
}

void postcopy_src__free(struct postcopy_src *q)
{
	if (q->thread_started)
		pthread_join(q->thread, NULL);
	q->thread_started = false;
	bitmap__free(&q->wanted);
	pthread_cond_destroy(&q->cond);
	pthread_mutex_destroy(&q->lock);
}
