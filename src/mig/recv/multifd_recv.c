/* Parallel migration channels: the receiving side. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "base/timeutil.h"
#include "base/utf8.h"
#include "mig/multifd.h"

void multifd_recv__init(struct multifd_recv *mf, const struct proto_ram *ram,
			const struct mig_recv_ops *ops, struct mig_stream *main)
{
	memset(mf, 0, sizeof(*mf));
	mf->ram = ram;
	mf->main = main;
	mf->ops = *ops;
	pthread_mutex_init(&mf->lock, NULL);
	pthread_cond_init(&mf->cond, NULL);
}

/* A channel failed: wake every waiter and stop reading the main stream
 * (its reader then fails and answers the source, whose writes to the
 * failed channel error out as that socket is shut down). */
static void multifd_recv__fail(struct multifd_recv *mf, struct multifd_recv_chan *c,
			       const char *why)
{
	pthread_mutex_lock(&mf->lock);
	if (!mf->failed && !mf->done) {
		mf->failed = true;
		snprintf(mf->error, sizeof(mf->error), "%.250s", why);
		utf8__sanitize(mf->error);
		if (mf->main)
			shutdown(mf->main->fd, SHUT_RD);
		mig_stream__shutdown(&c->stream);
	}
	pthread_cond_broadcast(&mf->cond);
	pthread_mutex_unlock(&mf->lock);
}

/* Stream `who` (0 = main) reached round r: wait until every stream has,
 * or until the migration failed or is being finished (a main stream that
 * ended before its own SYNC(r) never arrives: finish must still end the
 * channels waiting here, or its join never returns). */
static int multifd_recv__barrier(struct multifd_recv *mf, unsigned who, uint64_t round)
{
	pthread_mutex_lock(&mf->lock);
	if (round <= mf->arrived[who]) {
		pthread_mutex_unlock(&mf->lock);
		return -EPROTO; /* rounds only go forward */
	}
	mf->arrived[who] = round;
	pthread_cond_broadcast(&mf->cond);
	bool all;
	for (;;) {
		uint64_t low = mf->arrived[0];
		for (unsigned i = 1; i <= mf->n; i++)
			if (mf->arrived[i] < low)
				low = mf->arrived[i];
		all = low >= round;
		if (all || mf->failed || mf->done)
			break;
		pthread_cond_wait(&mf->cond, &mf->lock);
	}
	int rc = mf->failed ? -EPROTO : all ? 0 : -ECANCELED;
	pthread_mutex_unlock(&mf->lock);
	return rc;
}


static int chan__on_sync(void *ctx, uint64_t round)
{
	struct multifd_recv_chan *c = ctx;
	return multifd_recv__barrier(c->mf, c->index, round);
}

/* Page hooks go to the shared ones; the channel itself is the context
 * of on_sync only. */
static int chan__on_zero(void *ctx, uint32_t block, uint64_t off)
{
	struct multifd_recv_chan *c = ctx;
	return c->mf->ops.on_zero(c->mf->ops.ctx, block, off);
}

static void chan__on_page(void *ctx, uint32_t block, uint64_t off)
{
	struct multifd_recv_chan *c = ctx;
	c->mf->ops.on_page_written(c->mf->ops.ctx, block, off);
}

static void *chan__thread(void *arg)
{
	struct multifd_recv_chan *c = arg;
	pthread_setname_np(pthread_self(), "multifd-in");
	for (;;) {
		int rc = mig_recv__step(&c->recv, &c->stream);
		if (!rc)
			continue;
		pthread_mutex_lock(&c->mf->lock);
		bool done = c->mf->done;
		pthread_mutex_unlock(&c->mf->lock);
		if (!done) {
			char why[300];
			snprintf(why, sizeof(why), "channel %u: %s", c->index,
				 mig_recv__error(&c->recv)[0] ? mig_recv__error(&c->recv)
							      : mig_stream__strerror(&c->stream));
			multifd_recv__fail(c->mf, c, why);
		}
		return NULL;
	}
}

struct mig_stream *multifd_recv__next_stream(struct multifd_recv *mf)
{
	return mf->accepted < PROTO_MAX_CHANNELS ? &mf->chan[mf->accepted].stream : NULL;
}

static bool multifd_recv__index_taken(struct multifd_recv *mf, uint32_t index)
{
	for (unsigned i = 0; i < mf->accepted; i++)
		if (mf->chan[i].index == index)
			return true;
	return false;
}

void multifd_recv__cancel(struct multifd_recv *mf)
{
	pthread_mutex_lock(&mf->lock);
	if (mf->done) {                 /* finish closes the streams: leave them */
		pthread_mutex_unlock(&mf->lock);
		return;
	}
	if (!mf->failed) {
		mf->failed = true;
		snprintf(mf->error, sizeof(mf->error), "cancelled");
	}
	for (unsigned i = 0; i < mf->accepted; i++)
		mig_stream__shutdown(&mf->chan[i].stream);
	if (mf->pending)
		mig_stream__shutdown(mf->pending);
	pthread_cond_broadcast(&mf->cond);
	pthread_mutex_unlock(&mf->lock);
}

/* The CHANNEL record, read before a deadline and while
 * multifd_recv__cancel can shut the stream down. */
static int multifd_recv__handshake(struct multifd_recv *mf, struct mig_stream *s,
				   struct proto_hdr *h, uint8_t *buf, size_t cap, char *why,
				   size_t whylen)
{
	pthread_mutex_lock(&mf->lock);
	bool failed = mf->failed;
	mf->pending = s;
	pthread_mutex_unlock(&mf->lock);
	if (failed)
		mig_stream__shutdown(s);
	int rc = 0;
	if (mf->tls && (rc = tls__server(s, mf->tls, why, whylen)))
		return rc;
	mig_stream__set_read_deadline(s, time__now_ms() + MULTIFD_HANDSHAKE_MS);
	rc = mig_stream__get_record(s, h, buf, cap);
	mig_stream__set_read_deadline(s, 0);
	if (rc)
		snprintf(why, whylen, "%s", rc == -ETIMEDOUT ? "no CHANNEL record in time" :
			 mig_stream__strerror(s));
	return rc;
}

/* Under TLS with a known client on the main stream: this channel's
 * client is the same one. */
static bool multifd_recv__same_peer(struct multifd_recv *mf, struct mig_stream *s)
{
	char who[sizeof(mf->peer)];
	return !mf->tls || !mf->peer[0] ||
	       (!tls__peer(s, mf->tls, who, sizeof(who)) && !strcmp(who, mf->peer));
}

/* The CHANNEL record a channel began with, checked against this
 * migration: its count, a free index, the session; NULL if it fits. */
static const char *multifd_recv__check(struct multifd_recv *mf, const struct proto_hdr *h,
				       const uint8_t *buf, unsigned expected, uint32_t *index)
{
	uint32_t count;
	uint8_t session[PROTO_SESSION_LEN];
	const char *why = NULL;
	if (h->type != PROTO_CHANNEL)
		return "not a CHANNEL record";
	if (proto__decode_channel(buf, h->length, index, &count, session, &why))
		return why;
	if (count != expected || *index < 1 || *index > expected)
		return "channel index or count not this migration's";
	if (multifd_recv__index_taken(mf, *index))
		return "channel index taken already";
	if (!proto__same_session(session, mf->session))
		return "not this migration's session";
	if (!multifd_recv__same_peer(mf, &mf->chan[mf->accepted].stream))
		return "TLS client other than the main stream's";
	return NULL;
}

int multifd_recv__add(struct multifd_recv *mf, unsigned expected, char *err, size_t errlen)
{
	struct multifd_recv_chan *c = &mf->chan[mf->accepted];
	uint8_t buf[64];
	struct proto_hdr h;
	uint32_t index = 0;
	const char *why = NULL;
	char io_why[256] = "";
	int rc = multifd_recv__handshake(mf, &c->stream, &h, buf, sizeof(buf), io_why,
					 sizeof(io_why));
	if (rc || (why = multifd_recv__check(mf, &h, buf, expected, &index))) {
		pthread_mutex_lock(&mf->lock);
		mf->pending = NULL;
		bool failed = mf->failed;
		pthread_mutex_unlock(&mf->lock);
		snprintf(err, errlen, "bad multifd channel handshake: %s", rc ? io_why : why);
		utf8__sanitize(err);
		mig_stream__close(&c->stream);
		return failed ? -ECANCELED : -EPROTO;
	}
	c->mf = mf;
	c->index = index;
	pthread_mutex_lock(&mf->lock);       /* cancel sees it from now on */
	mf->pending = NULL;
	mf->n = expected;
	mf->accepted++;
	pthread_mutex_unlock(&mf->lock);
	struct mig_recv_ops ops = { .on_sync = chan__on_sync, .ctx = c };
	if (mf->ops.on_zero)
		ops.on_zero = chan__on_zero;
	if (mf->ops.on_page_written)
		ops.on_page_written = chan__on_page;
	rc = mig_recv__init_channel(&c->recv, mf->ram, &ops);
	if (!rc)
		rc = pthread_create(&c->thread, NULL, chan__thread, c) ? -EAGAIN : 0;
	if (rc) {
		snprintf(err, errlen, "cannot start multifd channel %u", index);
		return rc;
	}
	c->thread_running = true;
	return 0;
}

int multifd_recv__main_sync(struct multifd_recv *mf, uint64_t round)
{
	return multifd_recv__barrier(mf, 0, round);
}

int multifd_recv__finish(struct multifd_recv *mf)
{
	if (mf->closed)
		return mf->failed ? -EPROTO : 0;
	mf->closed = true;
	pthread_mutex_lock(&mf->lock);
	mf->done = true;
	pthread_cond_broadcast(&mf->cond);
	pthread_mutex_unlock(&mf->lock);
	for (unsigned i = 0; i < mf->accepted; i++) {
		struct multifd_recv_chan *c = &mf->chan[i];
		if (c->thread_running) {
			mig_stream__shutdown(&c->stream);
			pthread_join(c->thread, NULL);
			c->thread_running = false;
		}
		mig_recv__free(&c->recv);
		mig_stream__close(&c->stream);
	}
	return mf->failed ? -EPROTO : 0;
}

void multifd_recv__stats(struct multifd_recv *mf, uint64_t *pages, uint64_t *zero,
			 uint64_t *bytes)
{
	*pages = *zero = *bytes = 0;
	for (unsigned i = 0; i < mf->accepted; i++) {
		const struct mig_recv_stats *st = mig_recv__stats(&mf->chan[i].recv);
		*pages += st->pages;
		*zero += st->zero_pages;
		*bytes += st->bytes;
	}
}
