#include "ctl/client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

/* Reads one JSON message (events are skipped); NULL on EOF/error. */
static json_t *qmp_client__read(struct qmp_client *c)
{
	for (;;) {
		char *nl = memchr(c->buf, '\n', c->len);
		if (nl) {
			size_t n = nl - c->buf + 1;
			json_t *msg = json_loadb(c->buf, n, 0, NULL);
			memmove(c->buf, c->buf + n, c->len - n);
			c->len -= n;
			if (msg && json_object_get(msg, "event")) {
				json_decref(msg);
				continue;
			}
			if (msg)
				return msg;
			continue;
		}
		if (c->len == sizeof(c->buf))
			return NULL;
		ssize_t r = read(c->fd, c->buf + c->len, sizeof(c->buf) - c->len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return NULL;
		c->len += r;
	}
}

int qmp_client__connect(struct qmp_client *c, const char *path, char *err, size_t errlen)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	memset(c, 0, sizeof(*c));
	if (strlen(path) >= sizeof(sa.sun_path)) {
		snprintf(err, errlen, "socket path too long: %s", path);
		return -ENAMETOOLONG;
	}
	strcpy(sa.sun_path, path);
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		snprintf(err, errlen, "cannot connect to %s: %s", path, strerror(e));
		if (c->fd >= 0)
			close(c->fd);
		return -e;
	}
	json_t *greeting = qmp_client__read(c);
	if (!greeting || !json_object_get(greeting, "QMP")) {
		json_decref(greeting);
		snprintf(err, errlen, "%s does not speak QMP", path);
		close(c->fd);
		return -EPROTO;
	}
	json_decref(greeting);
	json_t *r = qmp_client__call(c, "qmp_capabilities", NULL, err, errlen);
	if (!r) {
		close(c->fd);
		return -EPROTO;
	}
	json_decref(r);
	return 0;
}

void qmp_client__close(struct qmp_client *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
}

json_t *qmp_client__call(struct qmp_client *c, const char *cmd, json_t *args, char *err, size_t errlen)
{
	json_t *req = json_pack("{s:s}", "execute", cmd);
	if (args)
		json_object_set_new(req, "arguments", args);
	char *text = json_dumps(req, JSON_COMPACT);
	json_decref(req);
	size_t n = strlen(text);
	text[n] = '\n';
	ssize_t w = send(c->fd, text, n + 1, MSG_NOSIGNAL);
	free(text);
	if (w != (ssize_t)n + 1) {
		snprintf(err, errlen, "lost the connection to the VM");
		return NULL;
	}
	json_t *reply = qmp_client__read(c);
	if (!reply) {
		snprintf(err, errlen, "lost the connection to the VM");
		return NULL;
	}
	json_t *ret = json_incref(json_object_get(reply, "return"));
	if (!ret) {
		const char *desc = json_string_value(json_object_get(json_object_get(reply, "error"), "desc"));
		snprintf(err, errlen, "%s: %s", cmd, desc ? desc : "unknown error");
	}
	json_decref(reply);
	return ret;
}
