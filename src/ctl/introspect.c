/* QMP introspection of the machinery under a migration:
 *   x-query-dirty-tracking  the dirty tracker: backend, whether it is on,
 *                           whether KVM logs writes to the memslots, its
 *                           users and counters (deferred clear included),
 *                           and the vCPU throttle now in force;
 *   x-query-kvm-stats       KVM's binary statistics of the VM (e.g.
 *                           pages_4k/2m/1g: huge pages back after logging
 *                           went off), {"vm": {name: value}}. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/control.h"
#include "kvm/kvm_stats.h"
#include "mem/dirty.h"

static json_t *cmd_query_tracking(void *ctx, json_t *args, struct qmp_error *err)
{
	struct control *c = ctx;
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	struct dirty *d = c->vm->dirty;
	if (!d) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "no dirty tracker");
		return NULL;
	}
	struct dirty_stats st;
	dirty__get_stats(d, &st);
	return json_pack("{s:s, s:b, s:b, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i}",
			 "backend", dirty__backend(d) == DIRTY_RING ? "ring" : "bitmap",
			 "active", dirty__active(d), "logging", dirty__logging(d),
			 "users", (json_int_t)st.users, "syncs", (json_int_t)st.syncs,
			 "clear-calls", (json_int_t)st.clear_calls,
			 "cleared-pages", (json_int_t)st.cleared_pages,
			 "pending-pages", (json_int_t)st.pending_pages,
			 "ring-full-exits", (json_int_t)st.ring_full_exits,
			 "reaper-runs", (json_int_t)st.reaper_runs,
			 "reaper-interval-ms", (json_int_t)st.reaper_interval_ms,
			 "throttle-percentage", (int)atomic_load(&c->vm->throttle_pct));
}

static json_t *cmd_query_kvm_stats(void *ctx, json_t *args, struct qmp_error *err)
{
	struct control *c = ctx;
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	const struct kvm_stats *s = &c->vm->kstats;
	if (s->fd < 0) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "KVM has no binary statistics (KVM_GET_STATS_FD)");
		return NULL;
	}
	uint64_t *v = calloc(s->n ? s->n : 1, sizeof(*v));
	int rc = v ? kvm_stats__read(s, v) : -ENOMEM;
	json_t *vm = rc ? NULL : json_object();
	for (uint32_t i = 0; vm && i < s->n; i++)
		json_object_set_new(vm, s->desc[i].name, json_integer((json_int_t)v[i]));
	free(v);
	if (!vm) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "cannot read KVM statistics: %s", strerror(-rc));
		return NULL;
	}
	return json_pack("{s:o}", "vm", vm);
}

int control__register_introspection(struct control *c)
{
	int rc = qmp__register(c->qmp, "x-query-dirty-tracking", cmd_query_tracking, c);
	return rc ? rc : qmp__register(c->qmp, "x-query-kvm-stats", cmd_query_kvm_stats, c);
}
