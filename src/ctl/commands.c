/* The VM's QMP commands: run state and query-cpus-fast.  Migration commands are registered by
 * the migration engine (mig/qmp_mig.c). */
#include <errno.h>
#include <stdio.h>

#include "ctl/control.h"
#include "kvm/vm_blk.h"
#include "mem/memfile.h"

static json_t *cmd_query_status(void *ctx, json_t *args, struct qmp_error *err)
{
	struct control *c = ctx;
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	enum vm_status s = vm__status(c->vm);
	return json_pack("{s:b, s:b, s:s}", "running", s == VM_STATUS_RUNNING,
			 "singlestep", 0, "status", vm_status__name(s));
}

static json_t *cmd_stop(void *ctx, json_t *args, struct qmp_error *err)
{
	struct control *c = ctx;
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	control__stop_vm(c);
	return NULL;
}

static json_t *cmd_cont(void *ctx, json_t *args, struct qmp_error *err)
{
	struct control *c = ctx;
	char why[512];
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	/* a source whose migration gave its image up (completed, or failed
	 * after the last state went) takes it back first, as QEMU does: not
	 * while another process (the destination) holds it */
	enum vm_status st = vm__status(c->vm);
	bool after = st == VM_STATUS_PAUSED || st == VM_STATUS_POSTMIGRATE ||
		     st == VM_STATUS_IO_ERROR;
	if (after && vm_blk__activate(c->vm, why, sizeof(why))) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "Guest can not be resumed: %s", why);
		return NULL;
	}
	/* and its RAM, handed over in a memory file (x-ignore-shared): only
	 * if nobody took it since (mem/memfile.h); the disk first, as the
	 * destination takes them */
	if (after && c->vm->memfile && memfile__take_back(c->vm->memfile, why, sizeof(why))) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "Guest can not be resumed: %s", why);
		return NULL;
	}
	if (control__cont_vm(c))
		return NULL;
	switch (vm__status(c->vm)) {
	case VM_STATUS_RUNNING:
		return NULL;
	case VM_STATUS_INMIGRATE:
		qmp_error__set(err, QMP_ERROR_GENERIC, "Guest can not be resumed: incoming migration in progress");
		return NULL;
	default:
		qmp_error__set(err, QMP_ERROR_GENERIC, "Guest can not be resumed: it is %s",
			       vm_status__name(vm__status(c->vm)));
		return NULL;
	}
}

static json_t *cmd_quit(void *ctx, json_t *args, struct qmp_error *err)
{
	struct control *c = ctx;
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	atomic_store(&c->quit, true);
	control__event(c, "SHUTDOWN", json_pack("{s:b, s:s}", "guest", 0, "reason", "host-qmp-quit"));
	return NULL;
}

/* QEMU's query-cpus-fast: one entry per vCPU, its thread's id (0 before
 * it runs), one socket each as kmig's MP table lays them out. */
static json_t *cmd_query_cpus_fast(void *ctx, json_t *args, struct qmp_error *err)
{
	struct control *c = ctx;
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	int tids[VM_MAX_VCPUS];
	unsigned n = vm__vcpu_tids(c->vm, tids, VM_MAX_VCPUS);
	json_t *r = json_array();
	for (unsigned i = 0; i < n; i++) {
		char path[64];
		snprintf(path, sizeof(path), "/machine/unattached/device[%u]", i);
		json_array_append_new(r, json_pack("{s:i, s:s, s:i, s:s, s:{s:i, s:i, s:i}}",
			"cpu-index", (int)i, "qom-path", path, "thread-id", tids[i],
			"target", "x86_64", "props", "socket-id", (int)i, "core-id", 0,
			"thread-id", 0));
	}
	return r;
}

int control__register_commands(struct control *c)
{
	static const struct { const char *name; qmp_handler fn; } cmds[] = {
		{ "query-status", cmd_query_status },
		{ "query-cpus-fast", cmd_query_cpus_fast },
		{ "stop", cmd_stop },
		{ "cont", cmd_cont },
		{ "quit", cmd_quit },
	};
	for (unsigned i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
		int rc = qmp__register(c->qmp, cmds[i].name, cmds[i].fn, c);
		if (rc)
			return rc;
	}
	return 0;
}
