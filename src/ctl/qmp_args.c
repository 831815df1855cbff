/* QMP errors and typed access to command arguments, with QEMU's messages. */
#include "ctl/qmp.h"
#include "base/utf8.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void qmp_error__set(struct qmp_error *err, enum qmp_error_class cls,
		    const char *fmt, ...)
{
	va_list ap;

	if (!err || err->set)
		return;
	err->set = true;
	err->cls = cls;
	va_start(ap, fmt);
	vsnprintf(err->desc, sizeof(err->desc), fmt, ap);
	va_end(ap);
	utf8__sanitize(err->desc);
}

const char *qmp_error__class_name(enum qmp_error_class cls)
{
	switch (cls) {
	case QMP_ERROR_COMMAND_NOT_FOUND:
		return "CommandNotFound";
	case QMP_ERROR_DEVICE_NOT_ACTIVE:
		return "DeviceNotActive";
	case QMP_ERROR_DEVICE_NOT_FOUND:
		return "DeviceNotFound";
	case QMP_ERROR_KVM_MISSING_CAP:
		return "KVMMissingCap";
	case QMP_ERROR_GENERIC:
	default:
		return "GenericError";
	}
}

/* Finds NAME; returns 1 with *v set, 0 if absent and optional, -EINVAL if
 * absent and required. */
static int qmp_arg__lookup(json_t *args, const char *name, json_t **v,
			   bool required, struct qmp_error *err)
{
	*v = json_is_object(args) ? json_object_get(args, name) : NULL;
	if (*v)
		return 1;
	if (!required)
		return 0;
	qmp_error__set(err, QMP_ERROR_GENERIC, "Parameter '%s' is missing",
		       name);
	return -EINVAL;
}

static int qmp_arg__wrong_type(const char *name, const char *expected,
			       struct qmp_error *err)
{
	qmp_error__set(err, QMP_ERROR_GENERIC,
		       "Invalid parameter type for '%s', expected: %s",
		       name, expected);
	return -EINVAL;
}

int qmp_arg__str(json_t *args, const char *name, const char **out,
		 bool required, struct qmp_error *err)
{
	json_t *v;
	int r = qmp_arg__lookup(args, name, &v, required, err);
	if (r <= 0)
		return r;
	if (!json_is_string(v))
		return qmp_arg__wrong_type(name, "string", err);
	*out = json_string_value(v);
	return 1;
}

int qmp_arg__int(json_t *args, const char *name, int64_t *out,
		 bool required, struct qmp_error *err)
{
	json_t *v;
	int r = qmp_arg__lookup(args, name, &v, required, err);
	if (r <= 0)
		return r;
	if (!json_is_integer(v))
		return qmp_arg__wrong_type(name, "integer", err);
	*out = (int64_t)json_integer_value(v);
	return 1;
}

int qmp_arg__uint(json_t *args, const char *name, uint64_t *out,
		  bool required, struct qmp_error *err)
{
	int64_t i = 0;
	int r = qmp_arg__int(args, name, &i, required, err);
	if (r <= 0)
		return r;
	if (i < 0) {
		qmp_error__set(err, QMP_ERROR_GENERIC,
			       "Parameter '%s' expects uint64", name);
		return -EINVAL;
	}
	*out = (uint64_t)i;
	return 1;
}

int qmp_arg__bool(json_t *args, const char *name, bool *out,
		  bool required, struct qmp_error *err)
{
	json_t *v;
	int r = qmp_arg__lookup(args, name, &v, required, err);
	if (r <= 0)
		return r;
	if (!json_is_boolean(v))
		return qmp_arg__wrong_type(name, "boolean", err);
	*out = json_is_true(v);
	return 1;
}

int qmp_arg__number(json_t *args, const char *name, double *out,
		    bool required, struct qmp_error *err)
{
	json_t *v;
	int r = qmp_arg__lookup(args, name, &v, required, err);
	if (r <= 0)
		return r;
	if (!json_is_number(v))
		return qmp_arg__wrong_type(name, "number", err);
	*out = json_number_value(v);
	return 1;
}

int qmp_arg__object(json_t *args, const char *name, json_t **out,
		    bool required, struct qmp_error *err)
{
	json_t *v;
	int r = qmp_arg__lookup(args, name, &v, required, err);
	if (r <= 0)
		return r;
	if (!json_is_object(v))
		return qmp_arg__wrong_type(name, "object", err);
	*out = v;
	return 1;
}

int qmp_arg__array(json_t *args, const char *name, json_t **out,
		   bool required, struct qmp_error *err)
{
	json_t *v;
	int r = qmp_arg__lookup(args, name, &v, required, err);
	if (r <= 0)
		return r;
	if (!json_is_array(v))
		return qmp_arg__wrong_type(name, "array", err);
	*out = v;
	return 1;
}

static bool qmp_arg__listed(const char *key, const char *const *allowed)
{
	for (; allowed && *allowed; allowed++)
		if (strcmp(key, *allowed) == 0)
			return true;
	return false;
}

int qmp_arg__check_known(json_t *args, const char *const *allowed,
			 struct qmp_error *err)
{
	const char *key;
	json_t *v;

	if (!json_is_object(args))
		return 0;
	json_object_foreach(args, key, v) {
		if (!qmp_arg__listed(key, allowed)) {
			qmp_error__set(err, QMP_ERROR_GENERIC,
				       "Parameter '%s' is unexpected", key);
			return -EINVAL;
		}
	}
	return 0;
}
