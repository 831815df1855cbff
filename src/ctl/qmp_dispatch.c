/* QMP request validation, the command table and the built-in commands.
 * Messages follow QEMU's (qapi/qmp-dispatch.c, monitor/qmp.c) so clients that
 * match on them keep working. */
#include "ctl/qmp_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static const char QMP_CAPS_CMD[] = "qmp_capabilities";

static struct qmp_command *qmp_dispatch__find(struct qmp_dispatch *d,
					      const char *name)
{
	for (size_t i = 0; i < d->n; i++)
		if (strcmp(d->cmds[i].name, name) == 0)
			return &d->cmds[i];
	return NULL;
}

int qmp_dispatch__register(struct qmp_dispatch *d, const char *name,
			   qmp_handler fn, void *ctx)
{
	size_t len = name ? strnlen(name, QMP_MAX_NAME) : 0;

	if (!fn || len == 0 || len >= QMP_MAX_NAME)
		return -EINVAL;
	if (strcmp(name, QMP_CAPS_CMD) == 0 || qmp_dispatch__find(d, name))
		return -EEXIST;
	if (d->n == d->cap) {
		size_t cap = d->cap ? d->cap * 2 : 16;
		struct qmp_command *c = realloc(d->cmds, cap * sizeof(*c));
		if (!c)
			return -ENOMEM;
		d->cmds = c;
		d->cap = cap;
	}
	struct qmp_command *c = &d->cmds[d->n++];
	memcpy(c->name, name, len + 1);
	c->fn = fn;
	c->ctx = ctx;
	return 0;
}

static json_t *qmp_dispatch__query_commands(void *ctx, json_t *args,
					    struct qmp_error *err)
{
	struct qmp_dispatch *d = ctx;
	json_t *list = json_array();

	if (qmp_arg__check_known(args, NULL, err) < 0 || !list)
		goto fail;
	if (json_array_append_new(list, json_pack("{ss}", "name", QMP_CAPS_CMD)))
		goto fail;
	for (size_t i = 0; i < d->n; i++)
		if (json_array_append_new(list, json_pack("{ss}", "name",
							  d->cmds[i].name)))
			goto fail;
	return list;
fail:
	json_decref(list);
	qmp_error__set(err, QMP_ERROR_GENERIC, "out of memory");
	return NULL;
}

static json_t *qmp_dispatch__query_version(void *ctx, json_t *args,
					   struct qmp_error *err)
{
	struct qmp_dispatch *d = ctx;

	if (qmp_arg__check_known(args, NULL, err) < 0)
		return NULL;
	return json_deep_copy(d->version);
}

int qmp_dispatch__init(struct qmp_dispatch *d, const struct qmp_version *v)
{
	struct qmp_version zero = { 0, 0, 0, NULL };
	int r;

	memset(d, 0, sizeof(*d));
	if (!v)
		v = &zero;
	d->version = json_pack("{s{sisisi}ss}", "qemu",
			       "micro", v->micro, "minor", v->minor,
			       "major", v->major,
			       "package", v->package ? v->package : "");
	if (!d->version)
		return -ENOMEM;
	r = qmp_dispatch__register(d, "query-commands",
				   qmp_dispatch__query_commands, d);
	if (!r)
		r = qmp_dispatch__register(d, "query-version",
					   qmp_dispatch__query_version, d);
	if (r)
		qmp_dispatch__fini(d);
	return r;
}

void qmp_dispatch__fini(struct qmp_dispatch *d)
{
	json_decref(d->version);
	free(d->cmds);
	memset(d, 0, sizeof(*d));
}

json_t *qmp_dispatch__greeting(const struct qmp_dispatch *d)
{
	return json_pack("{s{sOs[]}}", "QMP", "version", d->version,
			 "capabilities");
}

json_t *qmp_dispatch__error_reply(const struct qmp_error *err, json_t *id)
{
	json_t *r = json_pack("{s{ssss}}", "error",
			      "class", qmp_error__class_name(err->cls),
			      "desc", err->desc);
	if (r && id && json_object_set(r, "id", id)) {
		json_decref(r);
		return NULL;
	}
	return r;
}

/* Checks the members of a request object; returns the command name. */
static const char *qmp_dispatch__check(json_t *req, struct qmp_error *err)
{
	const char *key, *exec = NULL;
	json_t *v;

	json_object_foreach(req, key, v) {
		if (strcmp(key, "execute") == 0) {
			if (!json_is_string(v)) {
				qmp_error__set(err, QMP_ERROR_GENERIC,
					       "QMP input member 'execute' must be a string");
				return NULL;
			}
			exec = json_string_value(v);
		} else if (strcmp(key, "arguments") == 0) {
			if (!json_is_object(v)) {
				qmp_error__set(err, QMP_ERROR_GENERIC,
					       "QMP input member 'arguments' must be an object");
				return NULL;
			}
		} else if (strcmp(key, "id") != 0) {
			qmp_error__set(err, QMP_ERROR_GENERIC,
				       "QMP input member '%.64s' is unexpected", key);
			return NULL;
		}
	}
	if (!exec)
		qmp_error__set(err, QMP_ERROR_GENERIC,
			       "QMP input lacks member 'execute'");
	return exec;
}

/* qmp_capabilities {"enable": [...]}: no capability is offered. */
static json_t *qmp_dispatch__capabilities(json_t *args, bool *negotiated,
					  struct qmp_error *err)
{
	static const char *const known[] = { "enable", NULL };
	json_t *enable = NULL, *cap;
	size_t i;

	if (*negotiated) {
		qmp_error__set(err, QMP_ERROR_COMMAND_NOT_FOUND,
			       "Capabilities negotiation is already complete, command ignored");
		return NULL;
	}
	if (qmp_arg__check_known(args, known, err) < 0 ||
	    qmp_arg__array(args, "enable", &enable, false, err) < 0)
		return NULL;
	json_array_foreach(enable, i, cap) {
		if (!json_is_string(cap)) {
			qmp_error__set(err, QMP_ERROR_GENERIC,
				       "Invalid parameter type for 'enable[%zu]', expected: string", i);
			return NULL;
		}
		qmp_error__set(err, QMP_ERROR_GENERIC,
			       "Capability '%.64s' not available",
			       json_string_value(cap));
		return NULL;
	}
	*negotiated = true;
	return json_object();
}

static json_t *qmp_dispatch__run(struct qmp_dispatch *d, const char *name,
				 json_t *args, bool *negotiated,
				 struct qmp_error *err)
{
	struct qmp_command *cmd;
	json_t *ret;

	if (strcmp(name, QMP_CAPS_CMD) == 0)
		return qmp_dispatch__capabilities(args, negotiated, err);
	if (!*negotiated) {
		qmp_error__set(err, QMP_ERROR_COMMAND_NOT_FOUND,
			       "Expecting capabilities negotiation with '%s'",
			       QMP_CAPS_CMD);
		return NULL;
	}
	cmd = qmp_dispatch__find(d, name);
	if (!cmd) {
		qmp_error__set(err, QMP_ERROR_COMMAND_NOT_FOUND,
			       "The command %.64s has not been found", name);
		return NULL;
	}
	ret = cmd->fn(cmd->ctx, args, err);
	if (!ret && !err->set)
		ret = json_object();
	return ret;
}

/* Runs a parsed request; returns the reply. */
static json_t *qmp_dispatch__request(struct qmp_dispatch *d, json_t *req,
				     bool *negotiated)
{
	struct qmp_error err = { 0 };
	json_t *id = NULL, *args, *ret = NULL, *reply;
	const char *name;

	if (!json_is_object(req)) {
		qmp_error__set(&err, QMP_ERROR_GENERIC,
			       "QMP input must be a JSON object");
		return qmp_dispatch__error_reply(&err, NULL);
	}
	id = json_object_get(req, "id");
	name = qmp_dispatch__check(req, &err);
	if (!name)
		return qmp_dispatch__error_reply(&err, id);

	args = json_object_get(req, "arguments");
	if (args)
		json_incref(args);
	else
		args = json_object();
	if (args)
		ret = qmp_dispatch__run(d, name, args, negotiated, &err);
	else
		qmp_error__set(&err, QMP_ERROR_GENERIC, "out of memory");
	json_decref(args);
	if (err.set || !ret) {
		json_decref(ret);
		qmp_error__set(&err, QMP_ERROR_GENERIC, "out of memory");
		return qmp_dispatch__error_reply(&err, id);
	}
	reply = json_pack("{so}", "return", ret);
	if (reply && id && json_object_set(reply, "id", id)) {
		json_decref(reply);
		reply = NULL;
	}
	return reply;
}

json_t *qmp_dispatch__text(struct qmp_dispatch *d, const char *text,
			   size_t len, bool *negotiated)
{
	struct qmp_error err = { 0 };
	json_error_t jerr;
	json_t *req, *reply;

	req = json_loadb(text, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES,
			 &jerr);
	if (!req) {
		qmp_error__set(&err, QMP_ERROR_GENERIC, "JSON parse error, %s",
			       jerr.text);
		return qmp_dispatch__error_reply(&err, NULL);
	}
	reply = qmp_dispatch__request(d, req, negotiated);
	json_decref(req);
	return reply;
}
