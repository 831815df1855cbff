/* The VM's QMP commands: run state, query-cpus-fast, query-uuid and query-name.  Migration
 * commands are registered by the migration engine (mig/qmp_mig.c). */
#include <errno.h>
#include <stdio.h>

#include "ctl/control.h"
#include "ctl/ident_opts.h"
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
	/* as QEMU's: a guest still arriving stays stopped once it is here */
	if (!vm__set_autostart(c->vm, false))
		control__stop_vm(c);
	return NULL;
}

static json_t *cmd_cont(void *ctx, json_t *args, struct qmp_error *err)
{
	struct control *c = ctx;
	char why[512];
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	/* as QEMU's: a guest still arriving runs once it is here (if its
	 * source ran it) */
	if (vm__set_autostart(c->vm, true))
		return NULL;
	/* a source whose migration gave its image up (completed, or failed
	 * after the last state went) takes it back first, as QEMU does: not
	 * while another process (the destination) holds it; so does a
	 * destination that left it (late-block-activate), its guest paused or
	 * never run (prelaunch) */
	enum vm_status st = vm__status(c->vm);
	bool after = st == VM_STATUS_PAUSED || st == VM_STATUS_POSTMIGRATE ||
		     st == VM_STATUS_IO_ERROR || st == VM_STATUS_PRELAUNCH;
	bool had_disk = vm_blk__active(c->vm);
	if (after && vm_blk__activate(c->vm, why, sizeof(why))) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "Guest can not be resumed: %s", why);
		return NULL;
	}
	/* and its RAM, handed over in a memory file (x-ignore-shared): only
	 * if nobody took it since (mem/memfile.h); the disk first, as the
	 * destination takes them */
	if (after && c->vm->memfile && memfile__take_back(c->vm->memfile, why, sizeof(why))) {
		/* the disk this `cont` took goes back to whoever has the RAM */
		if (!had_disk && vm_blk__inactivate(c->vm))
			log_warn("cont: the disk's image could not be given back");
		qmp_error__set(err, QMP_ERROR_GENERIC, "Guest can not be resumed: %s", why);
		return NULL;
	}
	if (control__cont_vm(c))
		return NULL;
	switch (vm__status(c->vm)) {
	case VM_STATUS_RUNNING:
		return NULL;
	default:
		qmp_error__set(err, QMP_ERROR_GENERIC, "Guest can not be resumed: it is %s",
			       vm_status__name(vm__status(c->vm)));
		return NULL;
	}
}

/* QEMU's query-uuid: --uuid, or the nil UUID without one. */
static json_t *cmd_query_uuid(void *ctx, json_t *args, struct qmp_error *err)
{
	struct control *c = ctx;
	char text[37];
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	ident_opts__uuid_text(c->vm->cfg.uuid, text);   /* all zero without --uuid */
	return json_pack("{s:s}", "UUID", text);
}

/* QEMU's query-name: {"name"} with --name, {} without. */
static json_t *cmd_query_name(void *ctx, json_t *args, struct qmp_error *err)
{
	struct control *c = ctx;
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	return c->vm->cfg.name[0] ? json_pack("{s:s}", "name", c->vm->cfg.name) : json_object();
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
		{ "query-uuid", cmd_query_uuid },
		{ "query-name", cmd_query_name },
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
