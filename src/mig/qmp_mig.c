/* QMP commands of the migration engine, with QEMU's names and units. */
#include <errno.h>
#include <string.h>

#include "ctl/control.h"
#include "kvm/vm.h"
#include "mem/dirty.h"
#include "mig/migration.h"
#include "mig/postcopy.h"
#include "mig/send/xbzrle_cache.h"

static json_t *cmd_migrate(void *ctx, json_t *args, struct qmp_error *err)
{
	struct migration *m = ctx;
	static const char *const known[] = { "uri", "blk", "inc", "detach", "resume", NULL };
	const char *uri = NULL;
	bool resume = false;
	char why[256];
	if (qmp_arg__check_known(args, known, err) || qmp_arg__str(args, "uri", &uri, true, err) < 0 ||
	    qmp_arg__bool(args, "resume", &resume, false, err) < 0)
		return NULL;
	int rc = resume ? migration__resume(m, uri, why, sizeof(why))
			: migration__start(m, uri, why, sizeof(why));
	if (rc)
		qmp_error__set(err, QMP_ERROR_GENERIC, "%s", why);
	return NULL;
}

static json_t *cmd_migrate_recover(void *ctx, json_t *args, struct qmp_error *err)
{
	static const char *const known[] = { "uri", NULL };
	const char *uri = NULL;
	char why[256];
	if (qmp_arg__check_known(args, known, err) || qmp_arg__str(args, "uri", &uri, true, err) < 0)
		return NULL;
	if (migration__recover(ctx, uri, why, sizeof(why)))
		qmp_error__set(err, QMP_ERROR_GENERIC, "%s", why);
	return NULL;
}

static json_t *cmd_migrate_pause(void *ctx, json_t *args, struct qmp_error *err)
{
	char why[160];
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	if (migration__pause(ctx, why, sizeof(why)))
		qmp_error__set(err, QMP_ERROR_GENERIC, "%s", why);
	return NULL;
}

/* QEMU's yank: instances [{type: migration}] (kmig has no other kind). */
static json_t *cmd_yank(void *ctx, json_t *args, struct qmp_error *err)
{
	static const char *const known[] = { "instances", NULL };
	json_t *list = NULL, *inst;
	size_t i;
	if (qmp_arg__check_known(args, known, err) ||
	    qmp_arg__array(args, "instances", &list, true, err) < 0)
		return NULL;
	json_array_foreach(list, i, inst) {
		json_t *type = json_is_object(inst) ? json_object_get(inst, "type") : NULL;
		if (!json_is_string(type) || strcmp(json_string_value(type), "migration")) {
			qmp_error__set(err, QMP_ERROR_GENERIC, "Instance %zu: kmig yanks only "
				       "{\"type\": \"migration\"}", i);
			return NULL;
		}
	}
	json_array_foreach(list, i, inst) {
		if (migration__yank(ctx)) {
			qmp_error__set(err, QMP_ERROR_GENERIC, "Instance 'migration' not found");
			return NULL;
		}
	}
	return NULL;
}

static json_t *cmd_query_yank(void *ctx, json_t *args, struct qmp_error *err)
{
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	json_t *r = json_array();
	if (migration__has_yank(ctx))
		json_array_append_new(r, json_pack("{s:s}", "type", "migration"));
	return r;
}

/* QEMU 7.2's: the outgoing migration's threads that run now, with their
 * thread ids (mig/threads.h) */
static json_t *cmd_query_threads(void *ctx, json_t *args, struct qmp_error *err)
{
	struct migration *m = ctx;
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	return mig_threads__json(&m->threads);
}

static json_t *cmd_migrate_incoming(void *ctx, json_t *args, struct qmp_error *err)
{
	struct migration *m = ctx;
	static const char *const known[] = { "uri", NULL };
	const char *uri = NULL;
	char why[256];
	if (qmp_arg__check_known(args, known, err) || qmp_arg__str(args, "uri", &uri, true, err) < 0)
		return NULL;
	if (migration__incoming(m, uri, why, sizeof(why)))
		qmp_error__set(err, QMP_ERROR_GENERIC, "%s", why);
	return NULL;
}

static json_t *cmd_migrate_cancel(void *ctx, json_t *args, struct qmp_error *err)
{
	struct migration *m = ctx;
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	if (!migration__cancel(m, false))
		qmp_error__set(err, QMP_ERROR_GENERIC, "Postcopy migration can't be cancelled: "
			       "the destination runs the guest");
	return NULL;
}

static json_t *cmd_start_postcopy(void *ctx, json_t *args, struct qmp_error *err)
{
	char why[160];
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	if (migration__start_postcopy(ctx, why, sizeof(why)))
		qmp_error__set(err, QMP_ERROR_GENERIC, "%s", why);
	return NULL;
}

static json_t *cmd_migrate_continue(void *ctx, json_t *args, struct qmp_error *err)
{
	static const char *const known[] = { "state", NULL };
	const char *state = NULL;
	char why[128];
	if (qmp_arg__check_known(args, known, err) || qmp_arg__str(args, "state", &state, true, err) < 0)
		return NULL;
	if (migration__continue(ctx, state, why, sizeof(why)))
		qmp_error__set(err, QMP_ERROR_GENERIC, "%s", why);
	return NULL;
}

static json_t *cmd_query_migrate(void *ctx, json_t *args, struct qmp_error *err)
{
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	return migration__query(ctx);
}

static const char *const policy_names[] = { "none", "step", "computed" };

static json_t *cmd_query_params(void *ctx, json_t *args, struct qmp_error *err)
{
	struct migration *m = ctx;
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	pthread_mutex_lock(&m->lock);
	struct mig_params p = m->params;
	pthread_mutex_unlock(&m->lock);
	json_t *r = json_pack("{s:I, s:I, s:I, s:i, s:i, s:i, s:b, s:i, s:s, s:I, s:I, s:s, s:s, s:i, s:i, s:i, s:s, s:s, s:s, s:I, s:b, s:b, s:b, s:b, s:b, s:I}",
			 "max-bandwidth", (json_int_t)p.max_bandwidth,
			 "max-postcopy-bandwidth", (json_int_t)p.max_postcopy_bandwidth,
			 "downtime-limit", (json_int_t)p.policy.downtime_limit_ms,
			 "throttle-trigger-threshold", p.policy.throttle_trigger_threshold,
			 "cpu-throttle-initial", p.policy.cpu_throttle_initial,
			 "cpu-throttle-increment", p.policy.cpu_throttle_increment,
			 "cpu-throttle-tailslow", p.policy.cpu_throttle_tailslow,
			 "max-cpu-throttle", p.policy.max_cpu_throttle,
			 "x-cpu-throttle-policy", policy_names[p.throttle_policy],
			 "x-vcpu-dirty-limit-period", (json_int_t)p.dirty_limit_period_ms,
			 "vcpu-dirty-limit", (json_int_t)p.vcpu_dirty_limit,
			 "x-compression", mig_comp__name(p.comp.stream),
			 "multifd-compression", mig_comp__name(p.comp.multifd),
			 "multifd-zstd-level", p.comp.zstd_level,
			 "multifd-zlib-level", p.comp.zlib_level,
			 "multifd-channels", p.multifd_channels,
			 "tls-creds", p.tls_creds, "tls-hostname", p.tls_hostname,
			 "tls-authz", p.tls_authz,
			 "x-free-page-hint-wait", (json_int_t)p.hint_wait_ms,
			 "x-final-round", p.final_round,
			 "x-postcopy-early", p.postcopy_early,
			 "x-sync-per-slot", p.sync_per_slot, "x-kick-throttled", p.kick_throttled,
			 "x-sync-dirty-rate", p.sync_dirty_rate,
			 "xbzrle-cache-size", (json_int_t)p.xbzrle_cache_size);
	json_t *an = json_pack("{s:I, s:I, s:I, s:I}",
			       "announce-initial", (json_int_t)p.announce.initial_ms,
			       "announce-max", (json_int_t)p.announce.max_ms,
			       "announce-rounds", (json_int_t)p.announce.rounds,
			       "announce-step", (json_int_t)p.announce.step_ms);
	if (r && an)
		(void)json_object_update(r, an);
	json_decref(an);
	return r;
}

static int params_uint(json_t *args, const char *name, uint64_t max, unsigned *out,
		       struct qmp_error *err)
{
	uint64_t v;
	int rc = qmp_arg__uint(args, name, &v, false, err);
	if (rc <= 0)
		return rc;
	if (v > max) {
		qmp_error__set(err, QMP_ERROR_GENERIC,
			       "Parameter '%s' expects a value from 0 to %llu", name,
			       (unsigned long long)max);
		return -EINVAL;
	}
	*out = (unsigned)v;
	return 0;
}

/* One string parameter: absent leaves *out, "" clears it. */
static int params_str(json_t *args, const char *name, char *out, size_t cap,
		      struct qmp_error *err)
{
	const char *v = NULL;
	int rc = qmp_arg__str(args, name, &v, false, err);
	if (rc <= 0)
		return rc;
	if (strlen(v) >= cap) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "Parameter '%s' is longer than %zu bytes",
			       name, cap - 1);
		return -EINVAL;
	}
	memcpy(out, v, strlen(v) + 1);
	return 0;
}

/* One algorithm's name: absent leaves *kind. */
static int params_comp_kind(json_t *args, const char *name, bool multifd_only,
			    enum proto_comp *kind, struct qmp_error *err)
{
	const char *v = NULL;
	int rc = qmp_arg__str(args, name, &v, false, err);
	if (rc <= 0)
		return rc;
	if (mig_comp__parse(v, multifd_only, kind)) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "Parameter '%s' expects %s", name,
			       multifd_only ? "none, zlib or zstd (lz4: x-compression)" :
					      "none, zstd, lz4 or zlib");
		return -EINVAL;
	}
	return 0;
}

/* x-compression, multifd-compression and their levels (mig/comp.h). */
static int params_comp(json_t *args, struct mig_comp_params *c, struct qmp_error *err)
{
	unsigned zstd = (unsigned)c->zstd_level, zlib = (unsigned)c->zlib_level;
	if (params_comp_kind(args, "x-compression", false, &c->stream, err) < 0 ||
	    params_comp_kind(args, "multifd-compression", true, &c->multifd, err) < 0 ||
	    params_uint(args, "multifd-zstd-level", PROTO_ZSTD_LEVEL_MAX, &zstd, err) < 0 ||
	    params_uint(args, "multifd-zlib-level", PROTO_ZLIB_LEVEL_MAX, &zlib, err) < 0)
		return -EINVAL;
	c->zstd_level = (int)zstd;
	c->zlib_level = (int)zlib;
	return 0;
}

/* tls-creds, tls-hostname, tls-authz: the objects must exist (--object). */
static int params_tls(struct migration *m, json_t *args, struct mig_params *p,
		      struct qmp_error *err)
{
	if (params_str(args, "tls-creds", p->tls_creds, sizeof(p->tls_creds), err) < 0 ||
	    params_str(args, "tls-hostname", p->tls_hostname, sizeof(p->tls_hostname), err) < 0 ||
	    params_str(args, "tls-authz", p->tls_authz, sizeof(p->tls_authz), err) < 0)
		return -EINVAL;
	if (p->tls_creds[0] && !tls_objects__creds(&m->tls, p->tls_creds)) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "No TLS credentials with id '%s'", p->tls_creds);
		return -ENOENT;
	}
	if (p->tls_authz[0] && !tls_objects__authz(&m->tls, p->tls_authz)) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "No authorization object with id '%s'",
			       p->tls_authz);
		return -ENOENT;
	}
	return 0;
}

/* tls-creds and tls-authz of a destination are taken when it starts
 * listening (migrate-incoming, --incoming): while it listens or loads,
 * a change would be shown and not be in force, so it is refused. */
static int params_tls_in_force(struct migration *m, const struct mig_params *p,
			       struct qmp_error *err)
{
	pthread_mutex_lock(&m->lock);
	bool same = !strcmp(p->tls_creds, m->params.tls_creds) &&
		    !strcmp(p->tls_authz, m->params.tls_authz);
	bool busy = m->in_running && (m->in_ctx || m->status == MIG_SETUP);
	pthread_mutex_unlock(&m->lock);
	if (same || !busy)
		return 0;
	qmp_error__set(err, QMP_ERROR_GENERIC, "tls-creds and tls-authz cannot change while an "
		       "incoming migration listens or runs: they are taken when migrate-incoming "
		       "(or --incoming) starts it");
	return -EBUSY;
}

static json_t *cmd_set_params(void *ctx, json_t *args, struct qmp_error *err)
{
	struct migration *m = ctx;
	static const char *const known[] = {
		"max-bandwidth", "max-postcopy-bandwidth", "downtime-limit", "throttle-trigger-threshold",
		"cpu-throttle-initial", "cpu-throttle-increment", "cpu-throttle-tailslow",
		"max-cpu-throttle", "x-cpu-throttle-policy", "x-vcpu-dirty-limit-period",
		"vcpu-dirty-limit", "x-compression", "multifd-compression", "multifd-zstd-level",
		"multifd-zlib-level", "multifd-channels", "tls-creds",
		"tls-hostname", "tls-authz", "x-free-page-hint-wait", "x-final-round",
		"x-postcopy-early", "announce-initial", "announce-max", "announce-rounds",
		"announce-step", "x-sync-per-slot", "x-kick-throttled", "x-sync-dirty-rate",
		"xbzrle-cache-size", NULL };
	pthread_mutex_lock(&m->lock);
	struct mig_params p = m->params;
	pthread_mutex_unlock(&m->lock);
	const char *pol = NULL;
	if (qmp_arg__check_known(args, known, err) || params_comp(args, &p.comp, err) ||
	    qmp_arg__uint(args, "max-bandwidth", &p.max_bandwidth, false, err) < 0 ||
	    qmp_arg__uint(args, "max-postcopy-bandwidth", &p.max_postcopy_bandwidth, false, err) < 0 ||
	    qmp_arg__uint(args, "downtime-limit", &p.policy.downtime_limit_ms, false, err) < 0 ||
	    params_uint(args, "throttle-trigger-threshold", 100, &p.policy.throttle_trigger_threshold, err) < 0 ||
	    params_uint(args, "cpu-throttle-initial", 99, &p.policy.cpu_throttle_initial, err) < 0 ||
	    params_uint(args, "cpu-throttle-increment", 99, &p.policy.cpu_throttle_increment, err) < 0 ||
	    params_uint(args, "max-cpu-throttle", 99, &p.policy.max_cpu_throttle, err) < 0 ||
	    params_uint(args, "multifd-channels", PROTO_MAX_CHANNELS, &p.multifd_channels, err) < 0 ||
	    qmp_arg__bool(args, "cpu-throttle-tailslow", &p.policy.cpu_throttle_tailslow, false, err) < 0 ||
	    qmp_arg__str(args, "x-cpu-throttle-policy", &pol, false, err) < 0 ||
	    qmp_arg__uint(args, "x-vcpu-dirty-limit-period", &p.dirty_limit_period_ms, false, err) < 0 ||
	    qmp_arg__uint(args, "vcpu-dirty-limit", &p.vcpu_dirty_limit, false, err) < 0 ||
	    qmp_arg__uint(args, "x-free-page-hint-wait", &p.hint_wait_ms, false, err) < 0 ||
	    qmp_arg__bool(args, "x-final-round", &p.final_round, false, err) < 0 ||
	    qmp_arg__bool(args, "x-postcopy-early", &p.postcopy_early, false, err) < 0 ||
	    qmp_arg__bool(args, "x-sync-per-slot", &p.sync_per_slot, false, err) < 0 ||
	    qmp_arg__bool(args, "x-kick-throttled", &p.kick_throttled, false, err) < 0 ||
	    qmp_arg__bool(args, "x-sync-dirty-rate", &p.sync_dirty_rate, false, err) < 0 ||
	    qmp_arg__uint(args, "announce-initial", &p.announce.initial_ms, false, err) < 0 ||
	    qmp_arg__uint(args, "announce-max", &p.announce.max_ms, false, err) < 0 ||
	    qmp_arg__uint(args, "announce-rounds", &p.announce.rounds, false, err) < 0 ||
	    qmp_arg__uint(args, "announce-step", &p.announce.step_ms, false, err) < 0 ||
	    qmp_arg__uint(args, "xbzrle-cache-size", &p.xbzrle_cache_size, false, err) < 0)
		return NULL;
	if (!xbzrle_cache__size_ok(p.xbzrle_cache_size)) {   /* QEMU's words */
		qmp_error__set(err, QMP_ERROR_GENERIC, "Parameter 'xbzrle_cache_size' expects "
			       "a power of two no less than the target page size");
		return NULL;
	}
	if (announce__check(&p.announce)) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "announce-initial, -max and -step must be "
			       "1..%u ms with initial <= max, announce-rounds 1..%u", ANNOUNCE_MAX_MS,
			       ANNOUNCE_MAX_ROUNDS);
		return NULL;
	}
	if (p.hint_wait_ms > MIG_HINT_WAIT_MAX_MS) {
		qmp_error__set(err, QMP_ERROR_GENERIC,
			       "Parameter 'x-free-page-hint-wait' expects a value from 0 to %d",
			       MIG_HINT_WAIT_MAX_MS);
		return NULL;
	}
	if (params_tls(m, args, &p, err) || params_tls_in_force(m, &p, err))
		return NULL;
	if (p.multifd_channels < 1) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "multifd-channels must be 1..%u", PROTO_MAX_CHANNELS);
		return NULL;
	}
	if (p.dirty_limit_period_ms < 1 || p.dirty_limit_period_ms > 1000 || p.vcpu_dirty_limit < 1) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "x-vcpu-dirty-limit-period must be 1..1000 ms "
			       "and vcpu-dirty-limit at least 1 MB/s");
		return NULL;
	}
	if (pol) {
		p.throttle_policy_set = true;
		if (!strcmp(pol, "step"))
			p.throttle_policy = POLICY_STEP;
		else if (!strcmp(pol, "computed"))
			p.throttle_policy = POLICY_COMPUTED;
		else {
			qmp_error__set(err, QMP_ERROR_GENERIC,
				       "Parameter 'x-cpu-throttle-policy' expects step or computed");
			return NULL;
		}
	}
	/* QEMU's step-law knobs ask for QEMU's law, unless a policy was named */
	if (!p.throttle_policy_set &&
	    (json_object_get(args, "cpu-throttle-initial") ||
	     json_object_get(args, "cpu-throttle-increment") ||
	     json_object_get(args, "cpu-throttle-tailslow")))
		p.throttle_policy = POLICY_STEP;
	if (policy__params_check(&p.policy)) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "Migration parameters out of range");
		return NULL;
	}
	pthread_mutex_lock(&m->lock);
	m->params = p;
	if (m->status == MIG_POSTCOPY_ACTIVE) {
		mig_stream__set_rate(&m->stream, p.max_postcopy_bandwidth);
	} else if (m->status != MIG_DEVICE) {   /* the stop-and-copy runs unlimited */
		mig_stream__set_rate(&m->stream, p.max_bandwidth);
		if (m->mf_open)
			multifd_send__set_rate(&m->mf, p.max_bandwidth);
	}
	pthread_mutex_unlock(&m->lock);
	return NULL;
}

struct cap_desc {
	const char *name;
	size_t offset;
};

static const struct cap_desc caps[] = {
	{ "events", offsetof(struct mig_params, cap_events) },
	{ "auto-converge", offsetof(struct mig_params, cap_auto_converge) },
	{ "x-verify", offsetof(struct mig_params, cap_verify) },
	{ "zero-blocks", offsetof(struct mig_params, cap_zero_detect) },
	{ "dirty-limit", offsetof(struct mig_params, cap_dirty_limit) },
	{ "multifd", offsetof(struct mig_params, cap_multifd) },
	{ "pause-before-switchover", offsetof(struct mig_params, cap_pause_before_switchover) },
	{ "postcopy-ram", offsetof(struct mig_params, cap_postcopy_ram) },
	{ "x-postcopy-auto", offsetof(struct mig_params, cap_postcopy_auto) },
	{ "postcopy-blocktime", offsetof(struct mig_params, cap_postcopy_blocktime) },
	{ "postcopy-preempt", offsetof(struct mig_params, cap_postcopy_preempt) },
	{ "x-block-migration", offsetof(struct mig_params, cap_block_migration) },
	{ "xbzrle", offsetof(struct mig_params, cap_xbzrle) },
	{ "background-snapshot", offsetof(struct mig_params, cap_background_snapshot) },
	{ "x-ignore-shared", offsetof(struct mig_params, cap_ignore_shared) },
	{ "validate-uuid", offsetof(struct mig_params, cap_validate_uuid) },
	{ "late-block-activate", offsetof(struct mig_params, cap_late_block_activate) },
	{ "zero-copy-send", offsetof(struct mig_params, cap_zero_copy_send) },
};
#define NCAPS (sizeof(caps) / sizeof(caps[0]))

static json_t *cmd_query_caps(void *ctx, json_t *args, struct qmp_error *err)
{
	struct migration *m = ctx;
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	json_t *list = json_array();
	pthread_mutex_lock(&m->lock);
	for (unsigned i = 0; i < NCAPS; i++) {
		bool on = *(bool *)((char *)&m->params + caps[i].offset);
		json_array_append_new(list, json_pack("{s:s, s:b}", "capability", caps[i].name,
						      "state", on));
	}
	pthread_mutex_unlock(&m->lock);
	return list;
}

/* A destination that will wait for post-copy's pages must be able to
 * register its RAM with userfaultfd: asked once, as the capability is set. */
static bool set_caps__postcopy_refused(struct migration *m, struct qmp_error *err)
{
	char why[160];
	if (!postcopy_dst__probe(&m->vm->ram, why, sizeof(why)))
		return false;
	qmp_error__set(err, QMP_ERROR_GENERIC, "Postcopy is not supported: %s", why);
	return true;
}

static json_t *cmd_set_caps(void *ctx, json_t *args, struct qmp_error *err)
{
	struct migration *m = ctx;
	static const char *const known[] = { "capabilities", NULL };
	json_t *list = NULL, *item;
	size_t i;
	if (qmp_arg__check_known(args, known, err) ||
	    qmp_arg__array(args, "capabilities", &list, true, err) < 0)
		return NULL;
	pthread_mutex_lock(&m->lock);
	struct mig_params p = m->params;
	/* a destination may still set them while it waits for the source */
	bool busy = mig_status__busy(m->status) &&
		    !(m->status == MIG_SETUP && vm__status(m->vm) == VM_STATUS_INMIGRATE);
	pthread_mutex_unlock(&m->lock);
	if (busy) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "There's a migration process in progress");
		return NULL;
	}
	bool had_postcopy = p.cap_postcopy_ram;
	json_array_foreach(list, i, item) {
		const char *name = NULL;
		bool state = false;
		if (!json_is_object(item) || qmp_arg__str(item, "capability", &name, true, err) < 0 ||
		    qmp_arg__bool(item, "state", &state, true, err) < 0) {
			qmp_error__set(err, QMP_ERROR_GENERIC, "Invalid capability entry");
			return NULL;
		}
		unsigned c = 0;
		while (c < NCAPS && strcmp(caps[c].name, name))
			c++;
		if (c == NCAPS) {
			qmp_error__set(err, QMP_ERROR_GENERIC,
				       "Parameter 'capability' does not accept value '%s'", name);
			return NULL;
		}
		*(bool *)((char *)&p + caps[c].offset) = state;
	}
	if (p.cap_postcopy_preempt && !p.cap_postcopy_ram) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "Postcopy preempt requires postcopy-ram");
		return NULL;
	}
	if (p.cap_multifd && p.cap_xbzrle) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "Multifd is not compatible with xbzrle");
		return NULL;
	}
	if (migration__zero_copy_conflict(&p)) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "%s", MIG_ZERO_COPY_ONLY);
		return NULL;
	}
	const char *bg = migration__snapshot_conflict(&p);
	if (bg) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "Background-snapshot is not compatible "
			       "with %s", bg);
		return NULL;
	}
	const char *sh = migration__shared_conflict(&p, m->vm);
	if (sh) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "x-ignore-shared is not compatible with %s: "
			       "this VM's RAM is handed over in its memory file, not sent", sh);
		return NULL;
	}
	if (p.cap_postcopy_auto && !p.cap_postcopy_ram) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "x-postcopy-auto needs postcopy-ram");
		return NULL;
	}
	if (p.cap_dirty_limit && p.cap_auto_converge) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "dirty-limit conflicts with auto-converge: "
			       "enable one of them");
		return NULL;
	}
	if (p.cap_dirty_limit && dirty__backend(m->vm->dirty) != DIRTY_RING) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "dirty-limit needs the dirty ring "
			       "(kmig run --dirty-ring ENTRIES)");
		return NULL;
	}
	if (p.cap_postcopy_ram && !had_postcopy && vm__status(m->vm) == VM_STATUS_INMIGRATE &&
	    set_caps__postcopy_refused(m, err))
		return NULL;
	pthread_mutex_lock(&m->lock);
	m->params = p;
	pthread_mutex_unlock(&m->lock);
	return NULL;
}

int migration__register_qmp(struct migration *m)
{
	static const struct { const char *name; qmp_handler fn; } cmds[] = {
		{ "migrate", cmd_migrate },
		{ "migrate-incoming", cmd_migrate_incoming },
		{ "migrate_cancel", cmd_migrate_cancel },
		{ "migrate-continue", cmd_migrate_continue },
		{ "migrate-start-postcopy", cmd_start_postcopy },
		{ "migrate-recover", cmd_migrate_recover },
		{ "migrate-pause", cmd_migrate_pause },
		{ "yank", cmd_yank },
		{ "query-yank", cmd_query_yank },
		{ "query-migrationthreads", cmd_query_threads },
		{ "query-migrate", cmd_query_migrate },
		{ "migrate-set-parameters", cmd_set_params },
		{ "query-migrate-parameters", cmd_query_params },
		{ "migrate-set-capabilities", cmd_set_caps },
		{ "query-migrate-capabilities", cmd_query_caps },
	};
	for (unsigned i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
		int rc = qmp__register(m->ctl->qmp, cmds[i].name, cmds[i].fn, m);
		if (rc)
			return rc;
	}
	return migration__register_rate_qmp(m);
}
