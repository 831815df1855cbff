#include "mig/migration.h"
#include "base/utf8.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/timeutil.h"
#include "ctl/control.h"
#include "kvm/vm.h"
#include "mem/dirty.h"

#define MIG_DEFAULT_BANDWIDTH (128ull << 20) /* QEMU's default max-bandwidth */

const char *mig_status__name(enum mig_status s)
{
	static const char *const names[] = { "none", "setup", "active", "device", "completed",
					      "cancelling", "cancelled", "failed" };
	return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "none";
}

void migration__init(struct migration *m, struct vm *vm, struct control *ctl)
{
	memset(m, 0, sizeof(*m));
	m->vm = vm;
	m->ctl = ctl;
	pthread_mutex_init(&m->lock, NULL);
	m->params.max_bandwidth = MIG_DEFAULT_BANDWIDTH;
	policy__params_default(&m->params.policy);
	m->params.throttle_policy = POLICY_STEP;
	m->params.cap_zero_detect = true;
	m->params.dirty_limit_period_ms = 1000;
	m->params.vcpu_dirty_limit = 1;
	m->params.multifd_channels = 2;
	m->params.final_round = true;
	calcrate__init(&m->calc, vm);
	tls_objects__init(&m->tls);
}

static void migration__join(struct migration *m)
{
	pthread_mutex_lock(&m->lock);
	bool running = m->thread_running;
	pthread_mutex_unlock(&m->lock);
	if (running) {
		pthread_join(m->thread, NULL);
		pthread_mutex_lock(&m->lock);
		m->thread_running = false;
		pthread_mutex_unlock(&m->lock);
	}
}

void migration__stop_threads(struct migration *m)
{
	migration__cancel(m);
	migration__join(m);
	if (m->in_running) {
		migration__cancel_incoming(m);
		pthread_join(m->in_thread, NULL);
		m->in_running = false;
	}
	calcrate__stop(&m->calc);
}

void migration__destroy(struct migration *m)
{
	migration__stop_threads(m);
	bitmap__free(&m->todo);
	calcrate__destroy(&m->calc);
	tls_objects__destroy(&m->tls);
	pthread_mutex_destroy(&m->lock);
}

void migration__set_status(struct migration *m, enum mig_status s)
{
	pthread_mutex_lock(&m->lock);
	m->status = s;
	bool events = m->params.cap_events;
	pthread_mutex_unlock(&m->lock);
	if (events)
		control__event(m->ctl, "MIGRATION", json_pack("{s:s}", "status", mig_status__name(s)));
	control__wake(m->ctl);
}

void migration__set_error(struct migration *m, const char *fmt, ...)
{
	pthread_mutex_lock(&m->lock);
	if (!m->error[0]) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(m->error, sizeof(m->error), fmt, ap);
		va_end(ap);
		utf8__sanitize(m->error);
	}
	pthread_mutex_unlock(&m->lock);
}

static bool migration__busy(enum mig_status s)
{
	return s == MIG_SETUP || s == MIG_ACTIVE || s == MIG_DEVICE || s == MIG_CANCELLING;
}

int migration__start(struct migration *m, const char *uri, char *err, size_t errlen)
{
	pthread_mutex_lock(&m->lock);
	enum mig_status st = m->status;
	pthread_mutex_unlock(&m->lock);
	enum vm_status vs = vm__status(m->vm);
	if (migration__busy(st)) {
		snprintf(err, errlen, "There's a migration process in progress");
		return -EBUSY;
	}
	if (vs != VM_STATUS_RUNNING && vs != VM_STATUS_PAUSED) {
		snprintf(err, errlen, "Cannot migrate a VM that is %s", vm_status__name(vs));
		return -EINVAL;
	}
	if (calcrate__measuring_bitmap(&m->calc)) {
		snprintf(err, errlen, "a dirty-bitmap calc-dirty-rate is measuring; retry when it is done");
		return -EBUSY;
	}
	struct mig_uri u;
	if (mig_uri__parse(uri, &u, err, errlen))
		return -EINVAL;
	pthread_mutex_lock(&m->lock);
	struct mig_params p = m->params;
	pthread_mutex_unlock(&m->lock);
	migration__join(m);
	int rc = tls_config__resolve(&m->tls, false, p.tls_creds, p.tls_hostname, NULL, uri,
				     &m->tls_out, err, errlen);
	if (rc)
		return rc;
	if (!m->todo.words && bitmap__init(&m->todo, m->vm->ram.npages)) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	snprintf(m->out_uri, sizeof(m->out_uri), "%s", uri);
	pthread_mutex_lock(&m->lock);
	memset(&m->stats, 0, sizeof(m->stats));
	m->stats.start_ms = time__now_ms();
	m->stats.total = m->vm->ram.size;
	m->error[0] = 0;
	m->confirmed = false;
	pthread_mutex_unlock(&m->lock);
	atomic_store(&m->cancel, false);
	migration__set_status(m, MIG_SETUP);
	pthread_mutex_lock(&m->lock);
	m->thread_running = true; /* before the thread exists: cancel sees it */
	pthread_mutex_unlock(&m->lock);
	rc = pthread_create(&m->thread, NULL, migration__send_thread, m);
	if (rc) {
		pthread_mutex_lock(&m->lock);
		m->thread_running = false;
		pthread_mutex_unlock(&m->lock);
		migration__set_status(m, MIG_FAILED);
		snprintf(err, errlen, "cannot start the migration thread");
		return -rc;
	}
	return 0;
}

void migration__cancel(struct migration *m)
{
	/* check and change the status at once: the migration thread may be
	 * finishing.  After END has gone out the destination may already run
	 * the guest: a cancel then stops waiting for its confirmation and the
	 * guest stays paused here (see sender__cleanup) */
	pthread_mutex_lock(&m->lock);
	bool busy = m->thread_running && (m->status == MIG_SETUP || m->status == MIG_ACTIVE ||
					  m->status == MIG_DEVICE) && !m->confirmed;
	if (busy) {
		atomic_store(&m->cancel, true);
		m->status = MIG_CANCELLING;
		if (m->stream_open)
			mig_stream__shutdown(&m->stream);
		if (m->mf_open)
			multifd_send__shutdown(&m->mf);
	}
	bool events = m->params.cap_events;
	pthread_mutex_unlock(&m->lock);
	if (busy && events)
		control__event(m->ctl, "MIGRATION", json_pack("{s:s}", "status", "cancelling"));
}

void migration__cancel_incoming(struct migration *m)
{
	pthread_mutex_lock(&m->lock);
	m->in_cancelled = true;       /* seen by a thread that registers later */
	if (m->in_cancel)
		m->in_cancel(m->in_ctx);
	pthread_mutex_unlock(&m->lock);
}

static json_t *migration__ram_json(const struct mig_stats *st)
{
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:I, s:I, s:I, s:I}",
			 "transferred", (json_int_t)st->transferred,
			 "remaining", (json_int_t)st->remaining,
			 "total", (json_int_t)st->total,
			 "duplicate", (json_int_t)st->duplicate,
			 "normal", (json_int_t)st->normal,
			 "normal-bytes", (json_int_t)st->normal_bytes,
			 "dirty-pages-rate", (json_int_t)st->dirty_pages_rate,
			 "mbps", st->mbps,
			 "dirty-sync-count", (json_int_t)st->dirty_sync_count,
			 "page-size", (json_int_t)RAM_PAGE_SIZE,
			 "pages-per-second", (json_int_t)st->pages_per_second,
			 "precopy-bytes", (json_int_t)st->precopy_bytes,
			 "downtime-bytes", (json_int_t)st->downtime_bytes,
			 "skipped", (json_int_t)0);
}

json_t *migration__query(struct migration *m)
{
	pthread_mutex_lock(&m->lock);
	struct mig_stats st = m->stats;
	enum mig_status s = m->status;
	json_t *r = json_object();
	json_object_set_new(r, "status", json_string(mig_status__name(s)));
	if (s != MIG_NONE && s != MIG_SETUP) {
		bool done = s == MIG_COMPLETED;
		uint64_t total = done || s == MIG_FAILED || s == MIG_CANCELLED ?
				 st.total_ms : time__now_ms() - st.start_ms;
		json_object_set_new(r, "total-time", json_integer((json_int_t)total));
		json_object_set_new(r, "setup-time", json_integer((json_int_t)st.setup_ms));
		if (done)
			json_object_set_new(r, "downtime", json_integer((json_int_t)st.downtime_ms));
		else if (st.expected_downtime_ms <= INT64_MAX) /* UINT64_MAX: not measured yet */
			json_object_set_new(r, "expected-downtime",
					    json_integer((json_int_t)st.expected_downtime_ms));
		json_object_set_new(r, "ram", migration__ram_json(&st));
		json_object_set_new(r, "cpu-throttle-percentage", json_integer(st.throttle_pct));
		json_object_set_new(r, "x-dirty-rate-peak", json_integer((json_int_t)st.dirty_rate_peak));
		json_object_set_new(r, "x-iterations", json_integer((json_int_t)st.iteration));
		json_object_set_new(r, "x-free-pages-skipped", json_integer((json_int_t)st.free_skipped));
		json_object_set_new(r, "x-balloon-pages-skipped", json_integer((json_int_t)st.balloon_skipped));
		if (m->params.cap_dirty_limit) {
			json_object_set_new(r, "dirty-limit-throttle-time-per-round",
					    json_integer((json_int_t)st.limit_sleep_us));
			json_object_set_new(r, "dirty-limit-ring-full-time",
					    json_integer((json_int_t)st.limit_ring_full_us));
		}
	}
	/* what the migration holds on the VM right now (off again after it
	 * ends, whatever the outcome) */
	json_object_set_new(r, "x-dirty-tracking",
			    json_boolean(m->vm->dirty && dirty__active(m->vm->dirty)));
	json_object_set_new(r, "x-cpu-throttle-now",
			    json_integer(atomic_load(&m->vm->throttle_pct)));
	/* a cancel after END also says why the guest stays paused */
	if ((s == MIG_FAILED || s == MIG_CANCELLED) && m->error[0])
		json_object_set_new(r, "error-desc", json_string(m->error));
	pthread_mutex_unlock(&m->lock);
	return r;
}
