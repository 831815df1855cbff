/* Parallel migration channels: the sending side. */
#include "mig/multifd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MULTIFD_REC_CAP (PROTO_HDR_SIZE + 16 + MULTIFD_BATCH * 8 + 256 * (8 + PROTO_PAGE_SIZE))
#define MULTIFD_MAX_PAGES 256        /* pages per PAGES record */

/* One channel's share of the limit (0 = unlimited stays unlimited; a
 * limit below the channel count must not become 0). */
static uint64_t multifd__share(uint64_t rate, unsigned n)
{
	if (!rate || !n)
		return rate;
	return rate / n ? rate / n : 1;
}

static void chan__fail(struct multifd_send_chan *c, int rc)
{
	int zero = 0;
	if (!atomic_compare_exchange_strong(&c->mf->err, &zero, rc ? rc : -EIO))
		return;
	const char *msg = mig_stream__strerror(&c->stream);
	snprintf(c->mf->why, sizeof(c->mf->why), "multifd channel %u: %s", c->index,
		 msg[0] ? msg : strerror(rc ? -rc : EIO));
	atomic_store(&c->mf->why_set, true);
}

const char *multifd_send__why(struct multifd_send *mf)
{
	return atomic_load(&mf->why_set) ? mf->why : "";
}

/* A PAGES record whose pages go by reference: the header and offsets
 * copied (the record buffer is reused at once), then the pages, runs of
 * neighbours as one iovec. */
static int chan__pages_zc(struct multifd_send_chan *c, uint32_t count, const uint64_t *offs,
			  uint32_t block, const uint8_t *host)
{
	struct iovec iov[MULTIFD_MAX_PAGES];
	int n = 0;
	ssize_t head = proto__encode_pages_head(c->rec, MULTIFD_REC_CAP, 0, block, count, offs,
						(uint64_t)count * PROTO_PAGE_SIZE);
	int rc = head < 0 ? (int)head : mig_stream__write(&c->stream, c->rec, (size_t)head);
	for (uint32_t i = 0; !rc && i < count; i++) {
		uint8_t *p = (uint8_t *)host + offs[i];
		if (n && (uint8_t *)iov[n - 1].iov_base + iov[n - 1].iov_len == p)
			iov[n - 1].iov_len += PROTO_PAGE_SIZE;
		else
			iov[n++] = (struct iovec){ p, PROTO_PAGE_SIZE };
	}
	return rc ? rc : mig_stream__zc_write(&c->stream, iov, n);
}

/* Writes one PAGES record for up to MULTIFD_MAX_PAGES offsets. */
static int chan__pages(struct multifd_send_chan *c, uint32_t block, uint32_t count,
		       const uint64_t *offs)
{
	const struct proto_ram_block *b = &c->mf->ram->blocks[block];
	ssize_t n;
	if (c->mf->zero_copy && c->mf->comp.kind == PROTO_COMP_NONE)
		return chan__pages_zc(c, count, offs, block, b->host);
	if (c->mf->comp.kind != PROTO_COMP_NONE)
		n = proto__encode_pages_comp(&c->codec, c->mf->comp.kind, c->mf->comp.level,
					     c->rec, MULTIFD_REC_CAP,
					     block, count, offs, b->host);
	else
		n = proto__encode_pages(c->rec, MULTIFD_REC_CAP, block, count, offs, b->host);
	int rc = n < 0 ? (int)n : mig_stream__write(&c->stream, c->rec, (size_t)n);
	if (!rc)
		atomic_fetch_add(&c->comp_saved, proto__comp_saved(count, (size_t)n));
	return rc;
}

static int chan__job(struct multifd_send_chan *c, const struct multifd_job *j)
{
	ssize_t n;
	int rc = 0;
	switch (j->type) {
	case PROTO_PAGES:
		for (uint32_t i = 0; !rc && i < j->count; i += MULTIFD_MAX_PAGES) {
			uint32_t k = j->count - i < MULTIFD_MAX_PAGES ? j->count - i : MULTIFD_MAX_PAGES;
			rc = chan__pages(c, j->block, k, j->offsets + i);
		}
		return rc;
	case PROTO_ZERO:
		n = proto__encode_zero(c->rec, MULTIFD_REC_CAP, j->block, j->count, j->offsets);
		return n < 0 ? (int)n : mig_stream__write(&c->stream, c->rec, (size_t)n);
	default: /* PROTO_SYNC: the end of a pass, flushed at once */
		n = proto__encode_sync(c->rec, MULTIFD_REC_CAP, j->round);
		rc = n < 0 ? (int)n : mig_stream__write(&c->stream, c->rec, (size_t)n);
		rc = rc ? rc : mig_stream__flush(&c->stream);
		if (!rc && c->mf->zero_copy) {   /* the pass's sends all done */
			bool copied;
			rc = mig_stream__zc_flush(&c->stream, &copied);
			if (!rc && copied)
				atomic_fetch_add(&c->mf->zc_missed, 1);
		}
		return rc;
	}
}

static void *chan__thread(void *arg)
{
	struct multifd_send_chan *c = arg;
	char name[16];
	snprintf(name, sizeof(name), "multifd%u", c->index);
	pthread_setname_np(pthread_self(), name);
	pid_t tid = gettid();
	(void)mig_threads__add(c->mf->threads, tid, "multifdsend_%u", c->index - 1);
	pthread_mutex_lock(&c->lock);
	for (;;) {
		while (c->head == c->tail && !c->stop)
			pthread_cond_wait(&c->cond, &c->lock);
		if (c->head == c->tail)
			break;
		struct multifd_job *j = &c->jobs[c->tail % MULTIFD_QUEUE];
		pthread_mutex_unlock(&c->lock);
		int rc = atomic_load(&c->mf->err) ? 0 : chan__job(c, j);
		if (rc)
			chan__fail(c, rc);
		pthread_mutex_lock(&c->lock);
		c->tail++;
		pthread_cond_broadcast(&c->cond);
	}
	pthread_mutex_unlock(&c->lock);
	mig_threads__remove(c->mf->threads, tid);
	return NULL;
}

static int chan__open(struct multifd_send *mf, unsigned i, unsigned n, const char *uri,
		      uint64_t rate, char *err, size_t errlen)
{
	struct multifd_send_chan *c = &mf->chan[i];
	c->mf = mf;
	c->index = i + 1;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	c->jobs = calloc(MULTIFD_QUEUE, sizeof(*c->jobs));
	c->rec = malloc(MULTIFD_REC_CAP);
	if (!c->jobs || !c->rec)
		return -ENOMEM;
	int rc = mig_stream__connect(&c->stream, uri, &mf->stop, err, errlen);
	if (rc)
		return rc;
	c->open = true;
	if (mf->tls) {
		char why[256];
		rc = tls__client(&c->stream, mf->tls, why, sizeof(why));
		if (rc) {
			snprintf(err, errlen, "channel %u: %s", c->index, why);
			return rc;
		}
	}
	if (mf->zero_copy && (rc = mig_stream__zc_enable(&c->stream))) {
		snprintf(err, errlen, "channel %u: zero-copy-send: MSG_ZEROCOPY refused: %s",
			 c->index, strerror(-rc));
		return rc;
	}
	mig_stream__set_rate(&c->stream, rate);
	ssize_t len = proto__encode_channel(c->rec, MULTIFD_REC_CAP, c->index, n, mf->session);
	rc = len < 0 ? (int)len : mig_stream__write(&c->stream, c->rec, (size_t)len);
	if (!rc)
		rc = mig_stream__flush(&c->stream);
	if (rc) {
		snprintf(err, errlen, "channel %u: %s", c->index, mig_stream__strerror(&c->stream));
		return rc;
	}
	rc = pthread_create(&c->thread, NULL, chan__thread, c);
	if (rc)
		return -rc;
	c->thread_running = true;
	return 0;
}

static void chan__free(struct multifd_send_chan *c)
{
	if (c->open)
		mig_stream__close(&c->stream);
	proto_codec__free(&c->codec);
	free(c->jobs);
	free(c->rec);
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->cond);
	memset(c, 0, sizeof(*c));
}

int multifd_send__open(struct multifd_send *mf, unsigned n, const char *uri,
		       const struct proto_ram *ram, struct mig_comp comp, uint64_t rate,
		       const struct tls_config *tls, const uint8_t session[PROTO_SESSION_LEN],
		       char *err, size_t errlen)
{
	if (n < 1 || n > PROTO_MAX_CHANNELS) {
		snprintf(err, errlen, "multifd-channels must be 1..%u", PROTO_MAX_CHANNELS);
		return -EINVAL;
	}
	mf->ram = ram;
	mf->comp = comp;
	mf->tls = tls;
	memcpy(mf->session, session, PROTO_SESSION_LEN);
	for (unsigned i = 0; i < n; i++) {
		int rc = chan__open(mf, i, n, uri, multifd__share(rate, n), err, errlen);
		if (rc) {
			chan__free(&mf->chan[i]);
			return rc;
		}
		/* counted only once whole: shutdown and close see finished channels */
		atomic_store(&mf->n, i + 1);
	}
	return 0;
}

static int chan__push(struct multifd_send_chan *c, const struct multifd_job *j)
{
	pthread_mutex_lock(&c->lock);
	while (c->head - c->tail == MULTIFD_QUEUE && !atomic_load(&c->mf->err))
		pthread_cond_wait(&c->cond, &c->lock);
	int rc = atomic_load(&c->mf->err);
	if (!rc) {
		struct multifd_job *slot = &c->jobs[c->head % MULTIFD_QUEUE];
		slot->type = j->type;
		slot->block = j->block;
		slot->count = j->count;
		slot->round = j->round;
		memcpy(slot->offsets, j->offsets, (size_t)j->count * sizeof(uint64_t));
		c->head++;
		pthread_cond_broadcast(&c->cond);
	}
	pthread_mutex_unlock(&c->lock);
	return rc;
}

int multifd_send__queue(struct multifd_send *mf, uint32_t type, uint32_t block,
			uint32_t count, const uint64_t *offsets)
{
	static __thread struct multifd_job job; /* large: not on the stack */
	if (count > MULTIFD_BATCH)
		return -EINVAL;
	job.type = type;
	job.block = block;
	job.count = count;
	memcpy(job.offsets, offsets, (size_t)count * sizeof(uint64_t));
	struct multifd_send_chan *c = &mf->chan[mf->next++ % mf->n];
	return chan__push(c, &job);
}

int multifd_send__sync(struct multifd_send *mf, uint64_t round)
{
	struct multifd_job j = { .type = PROTO_SYNC, .round = round };
	for (unsigned i = 0; i < mf->n; i++) {
		int rc = chan__push(&mf->chan[i], &j);
		if (rc)
			return rc;
	}
	return 0;
}

int multifd_send__drain(struct multifd_send *mf)
{
	for (unsigned i = 0; i < mf->n; i++) {
		struct multifd_send_chan *c = &mf->chan[i];
		pthread_mutex_lock(&c->lock);
		while (c->head != c->tail && !atomic_load(&mf->err))
			pthread_cond_wait(&c->cond, &c->lock);
		pthread_mutex_unlock(&c->lock);
	}
	return atomic_load(&mf->err);
}

size_t multifd_send__unsent(struct multifd_send *mf)
{
	size_t sum = 0, q;
	for (unsigned i = 0; i < mf->n; i++)
		if (mf->chan[i].open && !mig_stream__outq(&mf->chan[i].stream, &q))
			sum += q;
	return sum;
}

void multifd_send__set_rate(struct multifd_send *mf, uint64_t rate)
{
	for (unsigned i = 0; i < mf->n; i++)
		if (mf->chan[i].open)
			mig_stream__set_rate(&mf->chan[i].stream, multifd__share(rate, mf->n));
}

/* One counter summed over the open channels: the bytes written, or (saved)
 * what compression saved. */
static uint64_t multifd__sum(struct multifd_send *mf, bool saved)
{
	uint64_t b = 0;
	for (unsigned i = 0; i < mf->n; i++) {
		struct multifd_send_chan *c = &mf->chan[i];
		if (c->open)
			b += saved ? atomic_load(&c->comp_saved) : mig_stream__bytes_out(&c->stream);
	}
	return b;
}

uint64_t multifd_send__zc_missed(struct multifd_send *mf)
{
	return atomic_load(&mf->zc_missed);
}

uint64_t multifd_send__bytes(struct multifd_send *mf)
{
	return multifd__sum(mf, false);
}

uint64_t multifd_send__comp_saved(struct multifd_send *mf)
{
	return multifd__sum(mf, true);
}

void multifd_send__shutdown(struct multifd_send *mf)
{
	int zero = 0;
	atomic_store(&mf->stop, true);   /* a channel still connecting gives up */
	atomic_compare_exchange_strong(&mf->err, &zero, -ECANCELED);
	for (unsigned i = 0; i < mf->n; i++) {
		struct multifd_send_chan *c = &mf->chan[i];
		if (c->open)
			mig_stream__shutdown(&c->stream);
		pthread_mutex_lock(&c->lock);
		pthread_cond_broadcast(&c->cond);
		pthread_mutex_unlock(&c->lock);
	}
}

void multifd_send__close(struct multifd_send *mf)
{
	for (unsigned i = 0; i < mf->n; i++) {
		struct multifd_send_chan *c = &mf->chan[i];
		if (c->thread_running) {
			pthread_mutex_lock(&c->lock);
			c->stop = true;
			pthread_cond_broadcast(&c->cond);
			pthread_mutex_unlock(&c->lock);
			pthread_join(c->thread, NULL);
		}
		chan__free(c);
	}
	memset(mf, 0, sizeof(*mf));
}
