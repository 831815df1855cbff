#include "mig/migration.h"
#include "base/utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/timeutil.h"
#include "ctl/control.h"
#include "kvm/vm.h"
#include "kvm/vm_blk.h"
#include "mem/dirty.h"
#include "mem/memfile.h"
#include "mig/send/disk_out.h"

#define MIG_DEFAULT_BANDWIDTH (128ull << 20) /* QEMU's default max-bandwidth */

const char *mig_status__name(enum mig_status s)
{
	static const char *const names[] = { "none", "setup", "active", "device", "completed",
					      "cancelling", "cancelled", "failed", "pre-switchover",
					      "postcopy-active", "postcopy-paused", "postcopy-recover" };
	return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "none";
}

void migration__init(struct migration *m, struct vm *vm, struct control *ctl)
{
	memset(m, 0, sizeof(*m));
	m->pc_uffd = -1;
	m->in_fd = m->out_fd = m->inherited_fd = -1;
	m->vm = vm;
	m->ctl = ctl;
	pthread_mutex_init(&m->lock, NULL);
	pthread_cond_init(&m->cont_cond, NULL);
	mig_threads__init(&m->threads);
	m->params.max_bandwidth = MIG_DEFAULT_BANDWIDTH;
	policy__params_default(&m->params.policy);
	m->params.throttle_policy = POLICY_COMPUTED;
	m->params.cap_zero_detect = true;
	m->params.dirty_limit_period_ms = 1000;
	m->params.vcpu_dirty_limit = 1;
	m->params.multifd_channels = 2;
	m->params.xbzrle_cache_size = MIG_XBZRLE_CACHE_DEFAULT;
	mig_comp_params__init(&m->params.comp);
	m->params.announce = (struct announce_params)ANNOUNCE_DEFAULTS;
	m->params.final_round = true;
	m->params.postcopy_early = true;
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
	migration__cancel(m, true);
	migration__join(m);
	if (m->in_running) {
		migration__cancel_incoming(m);
		pthread_join(m->in_thread, NULL);
		m->in_running = false;
	}
	if (m->pc_uffd >= 0) {
		/* vCPUs that wait for pages that will never come: they leave as
		 * the faults complete (the guest is never run again) */
		vm__request_quit(m->vm);
		close(m->pc_uffd);
		m->pc_uffd = -1;
	}
	calcrate__stop(&m->calc);
}

void migration__destroy(struct migration *m)
{
	migration__stop_threads(m);
	migration__drop_fd(&m->in_fd);
	migration__drop_fd(&m->out_fd);
	bitmap__free(&m->todo);
	calcrate__destroy(&m->calc);
	tls_objects__destroy(&m->tls);
	pthread_cond_destroy(&m->cont_cond);
	mig_threads__destroy(&m->threads);
	pthread_mutex_destroy(&m->lock);
}

/* After a status change: MIGRATION (capability events) and a wake-up of
 * the control loop. */
static void migration__announce(struct migration *m, enum mig_status s, bool events)
{
	if (events)
		control__event(m->ctl, "MIGRATION", json_pack("{s:s}", "status", mig_status__name(s)));
	control__wake(m->ctl);
}

void migration__set_status(struct migration *m, enum mig_status s)
{
	pthread_mutex_lock(&m->lock);
	m->status = s;
	bool events = m->params.cap_events;
	pthread_mutex_unlock(&m->lock);
	migration__announce(m, s, events);
}

bool migration__advance(struct migration *m, enum mig_status from, enum mig_status to)
{
	pthread_mutex_lock(&m->lock);
	bool ok = m->status == from;
	if (ok)
		m->status = to;
	bool events = m->params.cap_events;
	pthread_mutex_unlock(&m->lock);
	if (ok)
		migration__announce(m, to, events);
	return ok;
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

void migration__stray(struct migration *m, const char *what, const char *why)
{
	char copy[sizeof(m->stray_why)];
	pthread_mutex_lock(&m->lock);
	uint64_t n = ++m->strays;
	snprintf(m->stray_why, sizeof(m->stray_why), "%s: %s", what, why);
	utf8__sanitize(m->stray_why);
	memcpy(copy, m->stray_why, sizeof(copy));
	pthread_mutex_unlock(&m->lock);
	log_warn("incoming migration: dropped a connection that is not the source's "
		 "(%llu so far), the listener waits on: %s", (unsigned long long)n, copy);
}

void migration__proto_ram(const struct ram *ram, struct proto_ram *out)
{
	memset(out, 0, sizeof(*out));
	out->nr_blocks = ram->nr_blocks;
	for (unsigned i = 0; i < ram->nr_blocks; i++)
		out->blocks[i] = (struct proto_ram_block){ ram->blocks[i].gpa, ram->blocks[i].size,
							   ram->blocks[i].host };
}

bool mig_status__busy(enum mig_status s)
{
	return s == MIG_SETUP || s == MIG_ACTIVE || s == MIG_PRE_SWITCHOVER || s == MIG_DEVICE ||
	       s == MIG_POSTCOPY_ACTIVE || s == MIG_POSTCOPY_PAUSED || s == MIG_POSTCOPY_RECOVER ||
	       s == MIG_CANCELLING;
}

void migration__drop_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

/* A descriptor given to getfd under name, or the one --incoming fd:N
 * named (see migration.h). */
int migration__fd(struct migration *m, const char *name, char *err, size_t errlen)
{
	if (name[0] >= '0' && name[0] <= '9') {
		char *end;
		long v = strtol(name, &end, 10);
		if (*end || v != m->inherited_fd || v < 0) {
			snprintf(err, errlen, "fd:%s: a number names only the descriptor given "
				 "with --incoming fd:N; use getfd and a name", name);
			return -EINVAL;
		}
		m->inherited_fd = -1;
		return (int)v;
	}
	int fd = m->ctl ? fd_names__take(&m->ctl->fds, name) : -ENOENT;
	if (fd < 0)
		snprintf(err, errlen, "File descriptor named '%s' has not been found", name);
	return fd;
}

bool migration__fd_is_socket(int fd)
{
	struct stat st;
	return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
}

bool migration__zero_copy_conflict(const struct mig_params *p)
{
	return p->cap_zero_copy_send &&
	       (!p->cap_multifd || mig_comp__channel(&p->comp).kind != PROTO_COMP_NONE ||
		p->tls_creds[0]);
}

const char *migration__snapshot_conflict(const struct mig_params *p)
{
	const struct { bool on; const char *name; } with[] = {
		{ p->cap_postcopy_ram, "postcopy-ram" },
		{ p->cap_postcopy_preempt, "postcopy-preempt" },
		{ p->cap_postcopy_auto, "x-postcopy-auto" },
		{ p->cap_postcopy_blocktime, "postcopy-blocktime" },
		{ p->cap_multifd, "multifd" },
		{ p->cap_xbzrle, "xbzrle" },
		{ p->cap_auto_converge, "auto-converge" },
		{ p->cap_dirty_limit, "dirty-limit" },
		{ p->cap_pause_before_switchover, "pause-before-switchover" },
		{ p->cap_block_migration, "x-block-migration" },
	};
	if (!p->cap_background_snapshot)
		return NULL;
	for (size_t i = 0; i < sizeof(with) / sizeof(with[0]); i++)
		if (with[i].on)
			return with[i].name;
	return NULL;
}

const char *migration__shared_conflict(const struct mig_params *p, const struct vm *vm)
{
	const struct { bool on; const char *name; } with[] = {
		{ p->cap_postcopy_ram, "postcopy-ram" },
		{ p->cap_postcopy_preempt, "postcopy-preempt" },
		{ p->cap_postcopy_auto, "x-postcopy-auto" },
		{ p->cap_multifd, "multifd" },
		{ p->cap_background_snapshot, "background-snapshot" },
		{ p->cap_block_migration, "x-block-migration" },
		{ p->cap_xbzrle, "xbzrle" },
	};
	if (!p->cap_ignore_shared || !vm->memfile)
		return NULL;
	for (size_t i = 0; i < sizeof(with) / sizeof(with[0]); i++)
		if (with[i].on)
			return with[i].name;
	return NULL;
}

/* Source, exec:/file:/fd: URIs: what a stream without a connection
 * cannot do is refused before anything starts; an fd: descriptor is
 * taken (into m->out_fd) once the rest is known good. */
static int migration__take_local(struct migration *m, const struct mig_uri *u,
				 const struct mig_params *p, char *err, size_t errlen)
{
	if (p->cap_multifd || p->cap_postcopy_preempt) {
		snprintf(err, errlen, "%s needs a tcp: or unix: URI: %s to the same address",
			 p->cap_multifd ? "multifd" : "postcopy-preempt",
			 p->cap_multifd ? "its channels are more connections" :
			 "its channel is one more connection");
		return -EINVAL;
	}
	int fd = -1;
	if (u->kind == MIG_URI_FD) {
		fd = migration__fd(m, u->arg, err, errlen);
		if (fd < 0)
			return fd;
	}
	if (fd >= 0 && p->cap_background_snapshot && migration__fd_is_socket(fd)) {
		migration__drop_fd(&fd);
		snprintf(err, errlen, "background-snapshot writes a snapshot: use a file:, exec: or "
			 "fd: URI of a file or pipe, not a socket to a destination that would run "
			 "the guest beside this one");
		return -EINVAL;
	}
	if (fd < 0 || !migration__fd_is_socket(fd)) {
		const char *no = p->cap_postcopy_ram ? "postcopy-ram" : p->tls_creds[0] ?
				 "tls-creds" : NULL;
		if (no) {
			migration__drop_fd(&fd);
			snprintf(err, errlen, "%s needs a return path, and a %s: URI has none: "
				 "use tcp:, unix: or a socket's fd:", no, mig_uri__local_name(u));
			return -EINVAL;
		}
	}
	migration__drop_fd(&m->out_fd);
	m->out_fd = fd;
	return 0;
}

int migration__start(struct migration *m, const char *uri, char *err, size_t errlen)
{
	pthread_mutex_lock(&m->lock);
	enum mig_status st = m->status;
	pthread_mutex_unlock(&m->lock);
	enum vm_status vs = vm__status(m->vm);
	if (mig_status__busy(st)) {
		snprintf(err, errlen, "There's a migration process in progress");
		return -EBUSY;
	}
	if (vs != VM_STATUS_RUNNING && vs != VM_STATUS_PAUSED && vs != VM_STATUS_IO_ERROR &&
	    vs != VM_STATUS_PRELAUNCH) {
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
	if (p.cap_background_snapshot && mig_uri__is_socket(&u)) {
		snprintf(err, errlen, "background-snapshot writes a snapshot: use a file:, exec: or "
			 "fd: URI, not a connection to a destination that would run the guest "
			 "beside this one");
		return -EINVAL;
	}
	if (m->vm->memfile && !memfile__owner(m->vm->memfile)) {
		snprintf(err, errlen, "this VM's RAM is not its own: memory file %s was handed over "
			 "(cont takes it back if nobody took it)", m->vm->memfile->path);
		return -EPERM;
	}
	const char *sh = migration__shared_conflict(&p, m->vm);
	if (sh) {
		snprintf(err, errlen, "x-ignore-shared is not compatible with %s: this VM's RAM "
			 "is handed over in its memory file, not sent", sh);
		return -EINVAL;
	}
	/* the parameters may have changed since the capability was set */
	if (migration__zero_copy_conflict(&p)) {
		snprintf(err, errlen, "%s", MIG_ZERO_COPY_ONLY);
		return -EINVAL;
	}
	if (p.cap_zero_copy_send && u.kind != MIG_URI_TCP) {
		snprintf(err, errlen, "zero-copy-send needs a tcp: URI: MSG_ZEROCOPY is TCP's");
		return -EINVAL;
	}
	migration__join(m);
	/* a destination migrated on as soon as it said completed: its
	 * incoming thread may still be confirming to its source, and ends by
	 * itself (its stream is not this migration's to yank) */
	if (m->in_running) {
		pthread_join(m->in_thread, NULL);
		pthread_mutex_lock(&m->lock);
		m->in_running = false;
		pthread_mutex_unlock(&m->lock);
	}
	int rc = mig_uri__is_socket(&u) ? 0 : migration__take_local(m, &u, &p, err, errlen);
	if (!rc)
		rc = tls_config__resolve(&m->tls, false, p.tls_creds, p.tls_hostname, NULL, uri,
					 &m->tls_out, err, errlen);
	if (rc) {
		migration__drop_fd(&m->out_fd);
		return rc;
	}
	if (!m->todo.words && bitmap__init(&m->todo, m->vm->ram.npages)) {
		migration__drop_fd(&m->out_fd);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	/* last of the refusals: a guest that arrived paused with
	 * late-block-activate has not taken its disk, and a migration from
	 * here must hold it, as a `cont` would (refused while another VM, its
	 * last source, has it back); from here on it keeps it */
	if (vm_blk__activate(m->vm, err, errlen)) {
		migration__drop_fd(&m->out_fd);
		return -EBUSY;
	}
	snprintf(m->out_uri, sizeof(m->out_uri), "%s", uri);
	pthread_mutex_lock(&m->lock);
	memset(&m->stats, 0, sizeof(m->stats));
	m->stats.start_ms = time__now_ms();
	m->stats.total = m->vm->ram.size;
	m->error[0] = 0;
	m->confirmed = false;
	m->cont = false;
	pthread_mutex_unlock(&m->lock);
	atomic_store(&m->cancel, false);
	atomic_store(&m->postcopy_start, false);
	migration__set_status(m, MIG_SETUP);
	pthread_mutex_lock(&m->lock);
	m->thread_running = true; /* before the thread exists: cancel sees it */
	pthread_mutex_unlock(&m->lock);
	rc = pthread_create(&m->thread, NULL, migration__send_thread, m);
	if (rc) {
		migration__drop_fd(&m->out_fd);
		pthread_mutex_lock(&m->lock);
		m->thread_running = false;
		pthread_mutex_unlock(&m->lock);
		migration__set_status(m, MIG_FAILED);
		snprintf(err, errlen, "cannot start the migration thread");
		return -rc;
	}
	return 0;
}

bool migration__cancel(struct migration *m, bool quitting)
{
	/* check and change the status at once: the migration thread may be
	 * finishing.  After END has gone out the destination may already run
	 * the guest: a cancel then stops waiting for its confirmation and the
	 * guest stays paused here (see sender__cleanup) */
	pthread_mutex_lock(&m->lock);
	bool postcopy = m->status == MIG_POSTCOPY_ACTIVE || m->status == MIG_POSTCOPY_PAUSED ||
			m->status == MIG_POSTCOPY_RECOVER;
	if (postcopy && !quitting) {
		pthread_mutex_unlock(&m->lock);
		return false;   /* the destination runs the guest: no way back */
	}
	bool busy = m->thread_running && mig_status__busy(m->status) &&
		    m->status != MIG_CANCELLING && !m->confirmed;
	if (busy) {
		atomic_store(&m->cancel, true);
		pthread_cond_broadcast(&m->cont_cond);
		m->status = MIG_CANCELLING;
		if (m->stream_open)
			mig_stream__shutdown(&m->stream);
		if (m->mf_open)
			multifd_send__shutdown(&m->mf);
		if (m->preempt_open)
			mig_stream__shutdown(&m->preempt);
	}
	bool events = m->params.cap_events;
	pthread_mutex_unlock(&m->lock);
	if (busy && events)
		control__event(m->ctl, "MIGRATION", json_pack("{s:s}", "status", "cancelling"));
	return true;
}

int migration__continue(struct migration *m, const char *state, char *err, size_t errlen)
{
	unsigned k = 0;
	while (k <= MIG_STATUS_LAST && strcmp(state, mig_status__name((enum mig_status)k)))
		k++;
	if (k > MIG_STATUS_LAST) {
		snprintf(err, errlen, "Parameter 'state' does not accept value '%.64s'", state);
		utf8__sanitize(err);
		return -EINVAL;
	}
	pthread_mutex_lock(&m->lock);
	enum mig_status s = m->status;
	bool ok = s == (enum mig_status)k;   /* as QEMU: only pre-switchover waits for it */
	if (ok && s == MIG_PRE_SWITCHOVER) {
		m->cont = true;
		pthread_cond_broadcast(&m->cont_cond);
	}
	pthread_mutex_unlock(&m->lock);
	if (!ok)
		snprintf(err, errlen, "Migration not in expected state: %s", mig_status__name(s));
	return ok ? 0 : -EINVAL;
}

int migration__start_postcopy(struct migration *m, char *err, size_t errlen)
{
	pthread_mutex_lock(&m->lock);
	struct mig_params p = m->params;
	enum mig_status s = m->status;
	bool running = m->thread_running;
	pthread_mutex_unlock(&m->lock);
	const char *why = NULL;
	if (!p.cap_postcopy_ram)
		why = "Enable postcopy with migrate_set_capability before the start of migration";
	else if (!running || (s != MIG_SETUP && s != MIG_ACTIVE))
		why = "Postcopy must be started after migration has been started";
	else if (p.cap_block_migration)
		why = "Postcopy cannot carry the disk: x-block-migration sends it in pre-copy only";
	if (why) {
		snprintf(err, errlen, "%s", why);
		return -EINVAL;
	}
	atomic_store(&m->postcopy_start, true);
	return 0;
}

int migration__pre_switchover(struct migration *m)
{
	pthread_mutex_lock(&m->lock);
	bool pause = m->params.cap_pause_before_switchover;
	pthread_mutex_unlock(&m->lock);
	if (!pause)
		return 0;
	if (!migration__advance(m, MIG_ACTIVE, MIG_PRE_SWITCHOVER))
		return -ECANCELED;   /* a cancel came first */
	pthread_mutex_lock(&m->lock);
	while (!m->cont && !atomic_load(&m->cancel))
		pthread_cond_wait(&m->cont_cond, &m->lock);
	bool go = m->cont && !atomic_load(&m->cancel);
	pthread_mutex_unlock(&m->lock);
	return go ? 0 : -ECANCELED;
}

void migration__cancel_incoming(struct migration *m)
{
	pthread_mutex_lock(&m->lock);
	m->in_cancelled = true;       /* seen by a thread that registers later */
	if (m->in_cancel)
		m->in_cancel(m->in_ctx);
	pthread_mutex_unlock(&m->lock);
}

/* postcopy-blocktime (destination): QEMU's two members, in ms */
static void migration__blocktime_json(json_t *r, const struct mig_stats *st)
{
	json_t *per = json_array();
	for (unsigned i = 0; i < st->blocktime_vcpus; i++)
		json_array_append_new(per, json_integer((json_int_t)st->vcpu_blocktime_ms[i]));
	json_object_set_new(r, "postcopy-blocktime", json_integer((json_int_t)st->blocktime_ms));
	json_object_set_new(r, "postcopy-vcpu-blocktime", per);
}

/* QEMU's "xbzrle-cache" object, its rates over the migration so far (QEMU's
 * are over the last period), and kmig's unchanged pages. */
static json_t *migration__xbzrle_json(const struct mig_stats *st)
{
	double miss = st->xbzrle_looked ? (double)st->xbzrle_misses / (double)st->xbzrle_looked : 0;
	double enc = st->xbzrle_bytes ? (double)st->xbzrle_pages * RAM_PAGE_SIZE /
					(double)st->xbzrle_bytes : 0;
	return json_pack("{s:I, s:I, s:I, s:I, s:f, s:f, s:I, s:I}",
			 "cache-size", (json_int_t)st->xbzrle_cache_size,
			 "bytes", (json_int_t)st->xbzrle_bytes,
			 "pages", (json_int_t)st->xbzrle_pages,
			 "cache-miss", (json_int_t)st->xbzrle_misses,
			 "cache-miss-rate", miss, "encoding-rate", enc,
			 "overflow", (json_int_t)st->xbzrle_overflow,
			 "x-unchanged", (json_int_t)st->xbzrle_unchanged);
}

static json_t *migration__ram_json(const struct mig_stats *st)
{
	return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I,"
			 " s:I}",
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
			 "multifd-bytes", (json_int_t)st->multifd_bytes,
			 "precopy-bytes", (json_int_t)st->precopy_bytes,
			 "downtime-bytes", (json_int_t)st->downtime_bytes,
			 "skipped", (json_int_t)0,
			 "dirty-sync-missed-zero-copy", (json_int_t)st->zc_missed);
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
		if (done) {
			json_object_set_new(r, "downtime", json_integer((json_int_t)st.downtime_ms));
			json_object_set_new(r, "x-switchover-throttle-wait",
					    json_pack("{s:I, s:b}", "us", (json_int_t)st.switchover_wait_us,
						      "timed-out", st.switchover_wait_timed_out));
		}
		else if (st.expected_downtime_ms <= INT64_MAX) /* UINT64_MAX: not measured yet */
			json_object_set_new(r, "expected-downtime",
					    json_integer((json_int_t)st.expected_downtime_ms));
		json_t *ram = migration__ram_json(&st);
		if (m->params.cap_postcopy_ram) {
			uint64_t pre = st.precopy_bytes + st.downtime_bytes;
			json_object_set_new(ram, "postcopy-requests",
					    json_integer((json_int_t)st.postcopy_requests));
			json_object_set_new(ram, "postcopy-bytes", json_integer(
				(json_int_t)(st.postcopy && st.transferred > pre ? st.transferred - pre : 0)));
		}
		json_object_set_new(r, "ram", ram);
		if (st.disk)    /* x-block-migration: QEMU's names, then kmig's own */
			json_object_set_new(r, "disk", json_pack(
				"{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}",
				"transferred", (json_int_t)st.disk_transferred,
				"remaining", (json_int_t)st.disk_remaining,
				"total", (json_int_t)st.disk_total,
				"x-chunk-size", (json_int_t)DISK_OUT_CHUNK,
				"x-block-size", (json_int_t)DISK_OUT_BLOCK,
				"x-data-chunks", (json_int_t)st.disk_normal,
				"x-data-bytes", (json_int_t)st.disk_data_bytes,
				"x-zero-chunks", (json_int_t)st.disk_duplicate,
				"x-dirtied-blocks", (json_int_t)st.disk_dirtied));
		if (st.xbzrle)
			json_object_set_new(r, "xbzrle-cache", migration__xbzrle_json(&st));
		if (st.snapshot)
			json_object_set_new(r, "x-background-snapshot", json_pack("{s:I, s:I}",
				"write-faults", (json_int_t)st.snapshot_faults,
				"pages-ahead", (json_int_t)st.snapshot_ahead));
		if (st.ram_shared)
			json_object_set_new(r, "x-ignore-shared", json_pack("{s:s, s:b}",
				"mem-path", m->vm->memfile ? m->vm->memfile->path : "",
				"handed-over", m->vm->memfile && !memfile__owner(m->vm->memfile)));
		if (st.postcopy_faults)
			json_object_set_new(r, "x-postcopy", json_pack("{s:I, s:I, s:I, s:I, s:I}",
				"faults", (json_int_t)st.postcopy_faults,
				"requested", (json_int_t)st.postcopy_asked,
				"zero-mapped", (json_int_t)st.postcopy_zero_mapped,
				"latency-p50-us", (json_int_t)st.postcopy_lat_p50_us,
				"latency-p99-us", (json_int_t)st.postcopy_lat_p99_us));
		if (st.postcopy_acks)  /* source: the push's pace (docs/protocol.md "Post-copy") */
			json_object_set_new(r, "x-postcopy-flight", json_pack("{s:I, s:I, s:I}",
				"acks", (json_int_t)st.postcopy_acks,
				"max-bytes", (json_int_t)st.postcopy_flight_max,
				"budget", (json_int_t)st.postcopy_budget));
		if (st.preempt)   /* postcopy-preempt's channel */
			json_object_set_new(r, "x-postcopy-preempt",
					    json_pack("{s:I}", "pages", (json_int_t)st.preempt_pages));
		if (st.postcopy)  /* source: how the switch came */
			json_object_set_new(r, "x-postcopy-switch",
				json_pack("{s:s, s:b, s:I, s:I, s:I, s:I}",
				"by", st.postcopy_auto ? "x-postcopy-auto" : "migrate-start-postcopy",
				"in-bulk-pass", st.postcopy_in_bulk,
				"at-ms", (json_int_t)st.postcopy_switch_ms,
				"rewritten", (json_int_t)st.postcopy_rewritten,
				"bandwidth", (json_int_t)st.postcopy_bw_bps,
				"dirty-rate", (json_int_t)st.postcopy_rate_bps));
		if (st.blocktime)
			migration__blocktime_json(r, &st);
		json_object_set_new(r, "cpu-throttle-percentage", json_integer(st.throttle_pct));
		json_object_set_new(r, "x-dirty-rate-peak", json_integer((json_int_t)st.dirty_rate_peak));
		json_object_set_new(r, "x-policy-bandwidth", json_integer((json_int_t)st.policy_bw_bps));
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
	json_object_set_new(r, "x-write-protect", json_boolean(atomic_load(&m->write_protect)));
	json_object_set_new(r, "x-cpu-throttle-now",
			    json_integer(atomic_load(&m->vm->throttle_pct)));
	if (m->in_path[0])   /* the incoming side: where a source connects now */
		json_object_set_new(r, "socket-address", json_pack("[{s:s, s:s}]", "type", "unix",
								   "path", m->in_path));
	else if (m->in_host[0]) {
		char port[8];
		snprintf(port, sizeof(port), "%u", m->in_port);
		json_object_set_new(r, "socket-address", json_pack("[{s:s, s:s, s:s}]", "type", "inet",
								   "host", m->in_host, "port", port));
	}
	if (m->strays)   /* the incoming side: who else knocked, and why it was dropped */
		json_object_set_new(r, "x-stray-connections", json_pack("{s:I, s:s}",
			"count", (json_int_t)m->strays, "last-reason", m->stray_why));
	/* a cancel after END also says why the guest stays paused; a paused
	 * post-copy why it waits and what continues it */
	if ((s == MIG_FAILED || s == MIG_CANCELLED || s == MIG_POSTCOPY_PAUSED) && m->error[0])
		json_object_set_new(r, "error-desc", json_string(m->error));
	pthread_mutex_unlock(&m->lock);
	return r;
}
