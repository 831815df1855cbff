/* getfd and closefd; see fd_cmds.h. */
#include "ctl/fd_cmds.h"
#include "ctl/control.h"

#include <errno.h>
#include <unistd.h>

static const char *fd_cmds__name(json_t *args, struct qmp_error *err)
{
	static const char *const allowed[] = { "fdname", NULL };
	const char *name = NULL, *why;
	if (qmp_arg__check_known(args, allowed, err) ||
	    qmp_arg__str(args, "fdname", &name, true, err) < 0)
		return NULL;
	if (fd_names__check(name, &why)) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "Parameter 'fdname' expects %s", why);
		return NULL;
	}
	return name;
}

static json_t *cmd_getfd(void *ctx, json_t *args, struct qmp_error *err)
{
	struct control *c = ctx;
	const char *name = fd_cmds__name(args, err);
	if (!name)
		return NULL;
	int fd = qmp__take_fd(c->qmp);
	if (fd < 0) {
		qmp_error__set(err, QMP_ERROR_GENERIC, "No file descriptor supplied via SCM_RIGHTS");
		return NULL;
	}
	if (fd_names__put(&c->fds, name, fd)) {
		close(fd);
		qmp_error__set(err, QMP_ERROR_GENERIC, "too many named descriptors (max %d): "
			       "closefd one first", FD_NAMES_MAX);
	}
	return NULL;
}

static json_t *cmd_closefd(void *ctx, json_t *args, struct qmp_error *err)
{
	struct control *c = ctx;
	const char *name = fd_cmds__name(args, err);
	if (name && fd_names__close(&c->fds, name))
		qmp_error__set(err, QMP_ERROR_GENERIC, "File descriptor named '%s' not found", name);
	return NULL;
}

int control__register_fds(struct control *c)
{
	int rc = qmp__register(c->qmp, "getfd", cmd_getfd, c);
	return rc ? rc : qmp__register(c->qmp, "closefd", cmd_closefd, c);
}
