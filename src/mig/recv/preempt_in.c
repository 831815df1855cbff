/* postcopy-preempt, destination side; see preempt_in.h. */
#include "mig/recv/preempt_in.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "base/timeutil.h"
#include "base/utf8.h"

void preempt_in__init(struct preempt_in *p, struct mig_stream *main)
{
	memset(p, 0, sizeof(*p));
	p->main = main;
	pthread_mutex_init(&p->lock, NULL);
	time__cond_init(&p->cond);
}

/* The channel's end: END (0) or a failure, told to wait_end.  A failure
 * nobody asked for becomes the main stream's error (a lost link or a
 * protocol error: mig_recv__step tells them apart), and its blocked read
 * is woken. */
static void preempt__stopped(struct preempt_in *p, int rc)
{
	bool link = mig_recv__link_lost(&p->recv);
	pthread_mutex_lock(&p->lock);
	bool quiet = p->closing || p->cancelled;
	if (rc) {
		p->failed = true;
		p->link = link;
		p->err = rc;
		snprintf(p->error, sizeof(p->error), "%s", mig_recv__error(&p->recv));
	} else {
		p->ended = true;
	}
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	if (rc && !quiet) {
		log_warn("incoming migration: the postcopy-preempt channel failed: %s",
			 mig_recv__error(&p->recv));
		mig_stream__fail(p->main, link ? -ENOLINK : -EPROTO,
				 "the postcopy-preempt channel: %.200s", mig_recv__error(&p->recv));
		shutdown(p->main->fd, SHUT_RD);
	}
}

static void *preempt__thread(void *arg)
{
	struct preempt_in *p = arg;
	pthread_setname_np(pthread_self(), "pc-preempt");
	for (;;) {
		int rc = mig_recv__step(&p->recv, &p->stream);
		atomic_store(&p->pages, p->done.postcopy_pages +
			     mig_recv__stats(&p->recv)->postcopy_pages);
		if (!rc && mig_recv__state(&p->recv) != MIG_RECV_DONE)
			continue;
		preempt__stopped(p, rc);
		return NULL;
	}
}

/* A plain connection that begins with a whole multifd channel's CHANNEL
 * record (left unread, in the stream's buffer): it came before this one
 * (mig/recv/early.h). */
static bool preempt__is_channel(struct preempt_in *p)
{
	uint8_t b[PROTO_HDR_SIZE + 64];
	struct proto_hdr h;
	return !mig_stream__peek(&p->stream, b, PROTO_HDR_SIZE) &&
	       !proto__decode_header(b, PROTO_HDR_SIZE, &h) && h.type == PROTO_CHANNEL &&
	       h.length <= sizeof(b) - PROTO_HDR_SIZE &&
	       !mig_stream__peek(&p->stream, b, PROTO_HDR_SIZE + h.length);
}

/* TLS, then the PREEMPT record, within PREEMPT_HANDSHAKE_MS; NULL if it
 * is this migration's, else why not (*channel: it is a multifd channel's
 * instead, plain, its record unread). */
static const char *preempt__vet(struct preempt_in *p, const struct tls_config *tls,
				const char *peer, const uint8_t session[PROTO_SESSION_LEN],
				uint32_t channels, char *buf, size_t len, bool *channel)
{
	struct proto_hdr h;
	uint8_t rec[64], theirs[PROTO_SESSION_LEN];
	uint32_t count;
	const char *why = NULL;
	if (tls && tls__server(&p->stream, tls, buf, len))
		return buf;
	char who[256];
	if (tls && peer[0] && (tls__peer(&p->stream, tls, who, sizeof(who)) || strcmp(who, peer)))
		return "TLS client other than the main stream's";
	mig_stream__set_read_deadline(&p->stream, time__now_ms() + PREEMPT_HANDSHAKE_MS);
	if (!tls && (*channel = preempt__is_channel(p))) {
		mig_stream__set_read_deadline(&p->stream, 0);
		return "a multifd channel's CHANNEL record";
	}
	int rc = mig_stream__get_record(&p->stream, &h, rec, sizeof(rec));
	mig_stream__set_read_deadline(&p->stream, 0);
	if (rc) {
		snprintf(buf, len, "%s", rc == -ETIMEDOUT ? "no PREEMPT record in time"
							   : mig_stream__strerror(&p->stream));
		return buf;
	}
	if (h.type != PROTO_PREEMPT)
		return "not a PREEMPT record";
	if (proto__decode_preempt(rec, h.length, theirs, &count, &why))
		return why;
	if (!proto__same_session(theirs, session))
		return "not this migration's session";
	return count == channels ? NULL : "multifd channels other than the main stream's";
}

int preempt_in__add(struct preempt_in *p, const struct tls_config *tls, const char *peer,
		    const uint8_t session[PROTO_SESSION_LEN], uint32_t channels,
		    const struct proto_ram *ram, const struct mig_recv_ops *ops, char *err,
		    size_t errlen)
{
	char buf[256] = "";
	pthread_mutex_lock(&p->lock);
	p->open = true;
	if (p->cancelled)
		mig_stream__shutdown(&p->stream);
	pthread_mutex_unlock(&p->lock);
	bool channel = false;
	const char *why = preempt__vet(p, tls, peer, session, channels, buf, sizeof(buf),
				       &channel);
	if (why) {
		pthread_mutex_lock(&p->lock);
		p->open = false;
		bool cancelled = p->cancelled;
		pthread_mutex_unlock(&p->lock);
		if (cancelled || !channel)
			mig_stream__close(&p->stream);
		snprintf(err, errlen, "bad postcopy-preempt channel handshake: %s", why);
		utf8__sanitize(err);
		return cancelled ? -ECANCELED : channel ? PREEMPT_IN_CHANNEL : -EPROTO;
	}
	struct mig_recv_ops pops = { .place_page = ops->place_page,
				     .place_zero = ops->place_zero, .ctx = ops->ctx };
	int rc = mig_recv__init_preempt(&p->recv, ram, &pops);
	if (!rc && pthread_create(&p->thread, NULL, preempt__thread, p))
		rc = -EAGAIN;
	if (rc) {
		snprintf(err, errlen, "cannot start the postcopy-preempt channel: %s",
			 strerror(-rc));
		return rc;
	}
	p->active = true;
	return 0;
}

int preempt_in__wait_end(struct preempt_in *p, int timeout_ms, char *err, size_t errlen)
{
	if (!p->active)
		return 0;
	struct timespec ts = time__deadline((uint64_t)timeout_ms * 1000000ull);
	int rc = 0;
	pthread_mutex_lock(&p->lock);
	while (!p->ended && !p->failed && !p->cancelled && rc != ETIMEDOUT)
		rc = pthread_cond_timedwait(&p->cond, &p->lock, &ts);
	int out = p->ended ? 0 : p->failed ? (p->link ? -ECONNRESET : -EPROTO) :
		  p->cancelled ? -ECANCELED : -ETIMEDOUT;
	if (out == -ETIMEDOUT)
		snprintf(err, errlen, "no END on the postcopy-preempt channel within %d s",
			 timeout_ms / 1000);
	else if (out == -ECANCELED)
		snprintf(err, errlen, "the postcopy-preempt channel was cut");
	else if (out)
		snprintf(err, errlen, "the postcopy-preempt channel: %s", p->error);
	pthread_mutex_unlock(&p->lock);
	return out;
}

void preempt_in__rearm(struct preempt_in *p)
{
	pthread_mutex_lock(&p->lock);
	p->cancelled = p->closing = p->ended = p->failed = p->link = false;
	p->err = 0;
	p->error[0] = 0;
	pthread_mutex_unlock(&p->lock);
}

void preempt_in__cancel(struct preempt_in *p)
{
	pthread_mutex_lock(&p->lock);
	p->cancelled = true;
	if (p->open)
		mig_stream__shutdown(&p->stream);
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
}

void preempt_in__close(struct preempt_in *p)
{
	pthread_mutex_lock(&p->lock);
	bool open = p->open;
	p->closing = true;
	if (open)
		mig_stream__shutdown(&p->stream);
	pthread_mutex_unlock(&p->lock);
	if (p->active) {
		pthread_join(p->thread, NULL);
		const struct mig_recv_stats *st = mig_recv__stats(&p->recv);
		p->done.pages += st->pages;
		p->done.zero_pages += st->zero_pages;
		p->done.bytes += st->bytes;
		p->done.records += st->records;
		p->done.postcopy_pages += st->postcopy_pages;
		mig_recv__free(&p->recv);
		p->active = false;
	}
	if (open) {
		pthread_mutex_lock(&p->lock);
		p->open = false;
		pthread_mutex_unlock(&p->lock);
		mig_stream__close(&p->stream);
	}
}

void preempt_in__totals(const struct preempt_in *p, uint64_t *pages, uint64_t *zero,
			uint64_t *bytes)
{
	*pages = p->done.pages;
	*zero = p->done.zero_pages;
	*bytes = p->done.bytes;
}

void preempt_in__free(struct preempt_in *p)
{
	preempt_in__close(p);
	pthread_cond_destroy(&p->cond);
	pthread_mutex_destroy(&p->lock);
}
