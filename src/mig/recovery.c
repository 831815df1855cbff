/* Post-copy recovery's commands: migrate-pause, migrate-recover and
 * migrate resume=true (migration.h; docs/protocol.md "Post-copy recovery"). */
#include <errno.h>
#include <stdio.h>

#include "mig/migration.h"

static bool migration__outgoing(const struct migration *m)
{
	return m->thread_running && !m->in_ctx;
}

int migration__pause(struct migration *m, char *err, size_t errlen)
{
	pthread_mutex_lock(&m->lock);
	bool ok = m->status == MIG_POSTCOPY_ACTIVE;
	if (ok && migration__outgoing(m) && m->stream_open) {
		mig_stream__shutdown(&m->stream);
		if (m->preempt_open)
			mig_stream__shutdown(&m->preempt);
	} else if (ok && m->in_pause)
		m->in_pause(m->in_ctx);
	pthread_mutex_unlock(&m->lock);
	if (!ok)
		snprintf(err, errlen, "migrate-pause is currently only supported during "
			 "postcopy-active state");
	return ok ? 0 : -EINVAL;
}

/* Lock held: whether the migration has a link yank could cut. */
static bool migration__yankable(const struct migration *m)
{
	if (migration__outgoing(m))
		return m->stream_open && mig_status__busy(m->status) && m->status != MIG_CANCELLING;
	return m->in_ctx && (m->status == MIG_ACTIVE || m->status == MIG_DEVICE ||
			     m->status == MIG_POSTCOPY_ACTIVE);
}

bool migration__has_yank(struct migration *m)
{
	pthread_mutex_lock(&m->lock);
	bool yes = migration__yankable(m);
	pthread_mutex_unlock(&m->lock);
	return yes;
}

int migration__yank(struct migration *m)
{
	pthread_mutex_lock(&m->lock);
	bool yes = migration__yankable(m);
	if (yes && migration__outgoing(m)) {
		mig_stream__shutdown(&m->stream);
		if (m->mf_open)
			multifd_send__shutdown(&m->mf);
		if (m->preempt_open)
			mig_stream__shutdown(&m->preempt);
	} else if (yes && m->in_pause) {
		m->in_pause(m->in_ctx);
	}
	pthread_mutex_unlock(&m->lock);
	return yes ? 0 : -ENOENT;
}

/* Both: the URI is well-formed and fits. */
static int migration__recovery_uri(const char *uri, char *dst, size_t cap, char *err,
				   size_t errlen)
{
	struct mig_uri u;
	if (mig_uri__parse(uri, &u, err, errlen))
		return -EINVAL;
	if (!mig_uri__is_socket(&u)) {
		snprintf(err, errlen, "post-copy recovery needs a tcp: or unix: URI: it takes "
			 "a new connection");
		return -EINVAL;
	}
	if ((size_t)snprintf(dst, cap, "%s", uri) >= cap) {
		snprintf(err, errlen, "URI too long");
		return -EINVAL;
	}
	return 0;
}

int migration__recover(struct migration *m, const char *uri, char *err, size_t errlen)
{
	char u[sizeof(m->in_uri)];
	if (migration__recovery_uri(uri, u, sizeof(u), err, errlen))
		return -EINVAL;
	pthread_mutex_lock(&m->lock);
	bool busy = m->recovering;
	bool ok = !busy && m->status == MIG_POSTCOPY_PAUSED && m->in_ctx;
	if (ok) {
		snprintf(m->in_uri, sizeof(m->in_uri), "%s", u);
		m->recover = m->recovering = true;
		pthread_cond_broadcast(&m->cont_cond);
	}
	pthread_mutex_unlock(&m->lock);
	if (busy)
		snprintf(err, errlen, "Migrate recovery is triggered already");
	else if (!ok)
		snprintf(err, errlen, "Migrate recover can only be run when postcopy is paused.");
	return ok ? 0 : -EINVAL;
}

int migration__resume(struct migration *m, const char *uri, char *err, size_t errlen)
{
	char u[sizeof(m->resume_uri)];
	if (migration__recovery_uri(uri, u, sizeof(u), err, errlen))
		return -EINVAL;
	/* postcopy-recover at once, as QEMU shows it, and before the sender
	 * wakes: its own moves (to postcopy-active, or back to paused when
	 * the new link fails) must come after this one, or a quick failure
	 * would leave the status at postcopy-recover with nobody recovering */
	pthread_mutex_lock(&m->lock);
	bool ok = m->status == MIG_POSTCOPY_PAUSED && migration__outgoing(m) && !m->resume;
	struct mig_params p = m->params;
	pthread_mutex_unlock(&m->lock);
	if (!ok) {
		snprintf(err, errlen, "Cannot resume if there is no paused migration");
		return -EINVAL;
	}
	/* the new link's TLS: the credentials the migration began with (the
	 * destination expects them, whatever tls-creds says now), checked
	 * against tls-hostname or the new URI's host; the sender reads
	 * tls_out only once resume is set */
	struct tls_config tls;
	pthread_mutex_lock(&m->lock);
	const char *creds = m->tls_out.creds ? m->tls_out.creds->id : "";
	pthread_mutex_unlock(&m->lock);
	int rc = tls_config__resolve(&m->tls, false, creds, p.tls_hostname, NULL, u, &tls,
				     err, errlen);
	if (rc)
		return rc;
	if (!migration__advance(m, MIG_POSTCOPY_PAUSED, MIG_POSTCOPY_RECOVER)) {
		snprintf(err, errlen, "Cannot resume if there is no paused migration");
		return -EINVAL;
	}
	pthread_mutex_lock(&m->lock);
	m->tls_out = tls;
	snprintf(m->resume_uri, sizeof(m->resume_uri), "%s", u);
	m->resume = true;
	pthread_cond_broadcast(&m->cont_cond);
	pthread_mutex_unlock(&m->lock);
	return 0;
}

bool migration__await_recovery(struct migration *m, bool *flag, const bool *cancelled)
{
	pthread_mutex_lock(&m->lock);
	for (;;) {
		bool stop = cancelled ? *cancelled : atomic_load(&m->cancel);
		if (stop || *flag)
			break;
		pthread_cond_wait(&m->cont_cond, &m->lock);
	}
	bool go = *flag && !(cancelled ? *cancelled : atomic_load(&m->cancel));
	*flag = false;
	pthread_mutex_unlock(&m->lock);
	return go;
}
