/* postcopy-preempt, source side: the channel that carries the pages the
 * destination asks for in post-copy, so they never queue behind the
 * background push in the main stream's buffers (docs/protocol.md
 * "Post-copy preempt"). */
#include <errno.h>
#include <stdio.h>

#include "mig/send/send_impl.h"
#include "mig/wire/tls.h"

/* PREEMPT (the session, the multifd channels that follow: none on a
 * post-copy recovery's link) on st, flushed. */
static int preempt__announce(struct sender *s, struct mig_stream *st)
{
	uint32_t channels = s->m->params.cap_multifd && !s->postcopy_sent ?
			    s->m->params.multifd_channels : 0;
	ssize_t n = proto__encode_preempt(s->rec, s->rec_cap, s->session, channels);
	int rc = n < 0 ? (int)n : mig_stream__write(st, s->rec, (size_t)n);
	return rc ? rc : mig_stream__flush(st);
}

/* The connection, its TLS handshake and its PREEMPT; err says why not. */
static int preempt__connect(struct sender *s, const char *uri, char *err, size_t errlen)
{
	struct migration *m = s->m;
	int rc = mig_stream__connect(&m->preempt, uri, &m->cancel, err, errlen);
	if (rc)
		return rc;
	pthread_mutex_lock(&m->lock);
	m->preempt_open = true;  /* migrate_cancel may shut it down from now on */
	bool cancelled = atomic_load(&m->cancel);
	pthread_mutex_unlock(&m->lock);
	s->preempt = &m->preempt;
	if (cancelled)
		return -ECANCELED;
	/* one page at a time, each waited for by a vCPU: no Nagle delay */
	if (mig_stream__set_nodelay(s->preempt, true))
		log_debug("postcopy-preempt: TCP_NODELAY not set");
	if (m->tls_out.creds && (rc = tls__client(s->preempt, &m->tls_out, err, errlen)))
		return rc;
	rc = preempt__announce(s, s->preempt);
	if (rc)
		snprintf(err, errlen, "%s", mig_stream__strerror(s->preempt));
	return rc;
}

int sender__preempt_open(struct sender *s, const char *uri)
{
	char err[256] = "";
	int rc = preempt__announce(s, s->stream);
	if (rc)
		return rc;
	rc = preempt__connect(s, uri, err, sizeof(err));
	/* at setup a destination that refused PREEMPT says why on the main
	 * stream (and closes, which may be all this connection sees); a
	 * recovery's destination pauses again instead, and its requests
	 * queue on the main stream */
	if (rc && rc != -ECANCELED && !s->postcopy_sent)
		sender__check_return_path(s, 500);
	if (rc && rc != -ECANCELED)
		migration__set_error(s->m, "the postcopy-preempt channel: %s", err);
	if (!rc)
		log_info("migration: postcopy-preempt channel open");
	return rc;
}

int sender__preempt_end(struct sender *s)
{
	if (!s->preempt)
		return 0;
	ssize_t n = proto__encode_end(s->rec, s->rec_cap, NULL);
	int rc = n < 0 ? (int)n : mig_stream__write(s->preempt, s->rec, (size_t)n);
	return rc ? rc : mig_stream__flush(s->preempt);
}

void sender__preempt_close(struct sender *s)
{
	struct migration *m = s->m;
	pthread_mutex_lock(&m->lock);
	bool open = m->preempt_open;
	m->preempt_open = false;    /* a cancel no longer touches it */
	pthread_mutex_unlock(&m->lock);
	if (!open)
		return;
	s->bytes_closed += mig_stream__bytes_out(&m->preempt);
	mig_stream__close(&m->preempt);
	s->preempt = NULL;
}
