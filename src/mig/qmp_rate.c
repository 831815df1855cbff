/* QMP: calc-dirty-rate, query-dirty-rate, set/cancel/query-vcpu-dirty-limit
 * (QEMU's names, arguments and shapes; rates in MB/s, MB = 2^20). */
#include <errno.h>
#include <string.h>

#include "ctl/control.h"
#include "kvm/vm.h"
#include "mig/migration.h"

static json_t *cmd_calc_dirty_rate(void *ctx, json_t *args, struct qmp_error *err)
{
	struct migration *m = ctx;
	static const char *const known[] = { "calc-time", "sample-pages", "mode", NULL };
	static const char *const modes[] = { "page-sampling", "dirty-ring", "dirty-bitmap" };
	int64_t t = 0;
	uint64_t sample = 512;
	const char *mode = "page-sampling";
	char why[256];
	if (qmp_arg__check_known(args, known, err) ||
	    qmp_arg__int(args, "calc-time", &t, true, err) < 0 ||
	    qmp_arg__uint(args, "sample-pages", &sample, false, err) < 0 ||
	    qmp_arg__str(args, "mode", &mode, false, err) < 0)
		return NULL;
	unsigned k = 0;
	while (k < 3 && strcmp(modes[k], mode))
		k++;
	if (k == 3) {
		qmp_error__set(err, QMP_ERROR_GENERIC,
			       "Parameter 'mode' does not accept value '%s'", mode);
		return NULL;
	}
	if (t < 1 || calcrate__start(&m->calc, (uint64_t)t, sample, (enum calcrate_mode)k,
				     why, sizeof(why)))
		qmp_error__set(err, QMP_ERROR_GENERIC, "%s",
			       t < 1 ? "calc-time is out of range[1, 60]." : why);
	return NULL;
}

static json_t *cmd_query_dirty_rate(void *ctx, json_t *args, struct qmp_error *err)
{
	struct migration *m = ctx;
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	return calcrate__query(&m->calc);
}

/* Reads the optional cpu-index; -1 = every vCPU. */
static int arg_cpu(struct migration *m, json_t *args, int64_t *cpu, struct qmp_error *err)
{
	*cpu = -1;
	if (qmp_arg__int(args, "cpu-index", cpu, false, err) < 0)
		return -EINVAL;
	if (*cpu < -1 || *cpu >= (int64_t)m->vm->nr_vcpus) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "cpu-index out of range");
		return -EINVAL;
	}
	return 0;
}

static json_t *cmd_set_vcpu_dirty_limit(void *ctx, json_t *args, struct qmp_error *err)
{
	struct migration *m = ctx;
	static const char *const known[] = { "cpu-index", "dirty-rate", NULL };
	int64_t cpu;
	uint64_t rate = 0;
	if (qmp_arg__check_known(args, known, err) || arg_cpu(m, args, &cpu, err) ||
	    qmp_arg__uint(args, "dirty-rate", &rate, true, err) < 0)
		return NULL;
	int rc = dirtylimit__set(&m->vm->dirtylimit, (int)cpu, rate);
	if (rc == -ENOTSUP)
		qmp_error__set(err, QMP_ERROR_GENERIC, "Dirty page limit feature requires KVM "
			       "with dirty ring (kmig run --dirty-ring ENTRIES)");
	else if (rc)
		qmp_error__set(err, QMP_ERROR_GENERIC, "cannot set the dirty limit: %s", strerror(-rc));
	return NULL;
}

static json_t *cmd_cancel_vcpu_dirty_limit(void *ctx, json_t *args, struct qmp_error *err)
{
	struct migration *m = ctx;
	static const char *const known[] = { "cpu-index", NULL };
	int64_t cpu;
	if (qmp_arg__check_known(args, known, err) || arg_cpu(m, args, &cpu, err))
		return NULL;
	int rc = dirtylimit__cancel(&m->vm->dirtylimit, (int)cpu);
	if (rc)
		qmp_error__set(err, QMP_ERROR_GENERIC, "cannot cancel the dirty limit: %s", strerror(-rc));
	return NULL;
}

static json_t *cmd_query_vcpu_dirty_limit(void *ctx, json_t *args, struct qmp_error *err)
{
	struct migration *m = ctx;
	if (qmp_arg__check_known(args, NULL, err))
		return NULL;
	json_t *list = json_array();
	for (unsigned i = 0; i < m->vm->nr_vcpus; i++) {
		uint64_t quota, rate;
		dirtylimit__get(&m->vm->dirtylimit, i, &quota, &rate);
		if (quota)
			json_array_append_new(list, json_pack("{s:i, s:I, s:I}", "cpu-index", i,
							      "limit-rate", (json_int_t)quota,
							      "current-rate", (json_int_t)rate));
	}
	return list;
}

int migration__register_rate_qmp(struct migration *m)
{
	static const struct { const char *name; qmp_handler fn; } cmds[] = {
		{ "calc-dirty-rate", cmd_calc_dirty_rate },
		{ "query-dirty-rate", cmd_query_dirty_rate },
		{ "set-vcpu-dirty-limit", cmd_set_vcpu_dirty_limit },
		{ "cancel-vcpu-dirty-limit", cmd_cancel_vcpu_dirty_limit },
		{ "query-vcpu-dirty-limit", cmd_query_vcpu_dirty_limit },
	};
	for (unsigned i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
		int rc = qmp__register(m->ctl->qmp, cmds[i].name, cmds[i].fn, m);
		if (rc)
			return rc;
	}
	return 0;
}
