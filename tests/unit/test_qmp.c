/* QMP server: protocol shape, negotiation, arguments, framing, garbage,
 * events from other threads, several clients, socket mode, fuzzing. */
#include "base/utf8.h"
#include "ctl/qmp.h"
#include "ctl/qmp_internal.h"
#include "harness.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "base/timeutil.h"

/* ---- server fixture: a loop thread polling the server ---- */

struct fixture {
	char dir[64];
	char path[96];
	struct qmp *q;
	pthread_t thread;
	atomic_bool stop;
	bool running;
};

static json_t *cmd_echo(void *ctx, json_t *args, struct qmp_error *err)
{
	static const char *const known[] = { "s", "i", "b", "n", "u", NULL };
	const char *s = NULL;
	int64_t i = -1;
	bool b = false;
	double n = 0.5;
	uint64_t u = 7;

	(void)ctx;
	if (qmp_arg__check_known(args, known, err) < 0 ||
	    qmp_arg__str(args, "s", &s, true, err) < 0 ||
	    qmp_arg__int(args, "i", &i, false, err) < 0 ||
	    qmp_arg__bool(args, "b", &b, false, err) < 0 ||
	    qmp_arg__number(args, "n", &n, false, err) < 0 ||
	    qmp_arg__uint(args, "u", &u, false, err) < 0)
		return NULL;
	return json_pack("{sssIsbsfsI}", "s", s, "i", (json_int_t)i, "b", b,
			 "n", n, "u", (json_int_t)u);
}

static json_t *cmd_fail(void *ctx, json_t *args, struct qmp_error *err)
{
	(void)ctx;
	(void)args;
	qmp_error__set(err, QMP_ERROR_DEVICE_NOT_ACTIVE, "No %s is active",
		       "balloon");
	qmp_error__set(err, QMP_ERROR_GENERIC, "second error is ignored");
	return NULL;
}

static json_t *cmd_nothing(void *ctx, json_t *args, struct qmp_error *err)
{
	(void)ctx;
	(void)args;
	(void)err;
	return NULL;
}

static json_t *cmd_emit(void *ctx, json_t *args, struct qmp_error *err)
{
	(void)args;
	(void)err;
	if (qmp__emit_event(ctx, "TEST_EVENT", json_pack("{si}", "n", 1)))
		return NULL;
	return json_string("done");
}

static void *fixture_loop(void *arg)
{
	struct fixture *f = arg;
	while (!atomic_load(&f->stop))
		if (qmp__poll(f->q, 1000) < 0)
			break;
	return NULL;
}

static bool fixture_init(struct fixture *f, bool thread)
{
	struct qmp_version v = { 1, 2, 3, "kmig-1.2.3" };

	memset(f, 0, sizeof(*f));
	strcpy(f->dir, "/tmp/kmig-qmp-XXXXXX");
	if (!mkdtemp(f->dir))
		return false;
	snprintf(f->path, sizeof(f->path), "%s/qmp.sock", f->dir);
	if (qmp__create(&f->q, f->path, &v))
		return false;
	if (qmp__register(f->q, "test-echo", cmd_echo, NULL) ||
	    qmp__register(f->q, "test-fail", cmd_fail, NULL) ||
	    qmp__register(f->q, "test-nothing", cmd_nothing, NULL) ||
	    qmp__register(f->q, "test-emit", cmd_emit, f->q))
		return false;
	if (thread) {
		if (pthread_create(&f->thread, NULL, fixture_loop, f))
			return false;
		f->running = true;
	}
	return true;
}

static void fixture_fini(struct fixture *f)
{
	if (f->running) {
		atomic_store(&f->stop, true);
		qmp__wake(f->q);
		pthread_join(f->thread, NULL);
	}
	qmp__destroy(f->q);
	rmdir(f->dir);
}

/* ---- a plain socket client ---- */

struct client {
	int fd;
	char buf[1 << 16];
	size_t len;
};

static bool client_connect(struct client *c, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	c->len = 0;
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	return c->fd >= 0 &&
	       connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
}

static void client_close(struct client *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
}

static bool client_send_bytes(struct client *c, const void *p, size_t n)
{
	const char *s = p;
	while (n) {
		ssize_t w = send(c->fd, s, n, MSG_NOSIGNAL);
		if (w <= 0)
			return false;
		s += w;
		n -= (size_t)w;
	}
	return true;
}

static bool client_send(struct client *c, const char *s)
{
	return client_send_bytes(c, s, strlen(s));
}

/* Next line as JSON (NULL on timeout, EOF or bad JSON). */
static json_t *client_recv(struct client *c, int timeout_ms)
{
	for (;;) {
		char *nl = memchr(c->buf, '\n', c->len);
		if (nl) {
			size_t n = (size_t)(nl - c->buf) + 1;
			json_t *v = json_loadb(c->buf, n, 0, NULL);
			memmove(c->buf, c->buf + n, c->len - n);
			c->len -= n;
			return v;
		}
		struct pollfd p = { .fd = c->fd, .events = POLLIN };
		if (c->len == sizeof(c->buf) || poll(&p, 1, timeout_ms) <= 0)
			return NULL;
		ssize_t r = recv(c->fd, c->buf + c->len,
				 sizeof(c->buf) - c->len, 0);
		if (r <= 0)
			return NULL;
		c->len += (size_t)r;
	}
}

/* Next message that is not an event. */
static json_t *client_reply(struct client *c)
{
	for (;;) {
		json_t *v = client_recv(c, 3000);
		if (!v || !json_object_get(v, "event"))
			return v;
		json_decref(v);
	}
}

static json_t *client_cmd(struct client *c, const char *line)
{
	if (!client_send(c, line))
		return NULL;
	return client_reply(c);
}

/* Connects, reads the greeting, negotiates. */
static bool client_open(struct client *c, const char *path)
{
	json_t *v;
	bool ok;

	if (!client_connect(c, path))
		return false;
	v = client_recv(c, 3000);
	ok = v && json_object_get(v, "QMP");
	json_decref(v);
	if (!ok)
		return false;
	v = client_cmd(c, "{\"execute\": \"qmp_capabilities\"}\n");
	ok = v && json_is_object(json_object_get(v, "return"));
	json_decref(v);
	return ok;
}

static bool is_error(json_t *v, const char *cls, const char *desc)
{
	json_t *e = json_object_get(v, "error");
	const char *c = json_string_value(json_object_get(e, "class"));
	const char *d = json_string_value(json_object_get(e, "desc"));
	bool ok = c && d && strcmp(c, cls) == 0 &&
		  (!desc || strstr(d, desc) != NULL);
	if (!ok) {
		char *s = v ? json_dumps(v, 0) : NULL;
		printf("#   got %s, expected %s \"%s\"\n", s ? s : "nothing",
		       cls, desc ? desc : "");
		free(s);
	}
	json_decref(v);
	return ok;
}

/* True if V is {"return": X, ...} and X equals the JSON text WANT. */
static bool is_return(json_t *v, const char *want)
{
	json_t *w = json_loads(want, JSON_DECODE_ANY, NULL);
	bool ok = w && json_equal(json_object_get(v, "return"), w);
	if (!ok) {
		char *s = v ? json_dumps(v, 0) : NULL;
		printf("#   got %s, expected return %s\n", s ? s : "nothing",
		       want);
		free(s);
	}
	json_decref(w);
	json_decref(v);
	return ok;
}

/* ---- tests ---- */

static void t_greeting(struct t *t)
{
	struct fixture f;
	struct client c;
	json_t *g, *ver;

	T_CHECK(t, fixture_init(&f, true));
	T_CHECK(t, client_connect(&c, f.path));
	g = client_recv(&c, 3000);
	T_CHECK(t, g && json_object_size(g) == 1);
	ver = json_object_get(json_object_get(g, "QMP"), "version");
	T_CHECK_EQ(t, json_integer_value(json_object_get(
		json_object_get(ver, "qemu"), "major")), 1);
	T_CHECK_EQ(t, json_integer_value(json_object_get(
		json_object_get(ver, "qemu"), "minor")), 2);
	T_CHECK_EQ(t, json_integer_value(json_object_get(
		json_object_get(ver, "qemu"), "micro")), 3);
	T_CHECK(t, !strcmp(json_string_value(json_object_get(ver, "package")) ?: "",
			   "kmig-1.2.3"));
	json_t *caps = json_object_get(json_object_get(g, "QMP"),
				       "capabilities");
	T_CHECK(t, json_is_array(caps) && json_array_size(caps) == 0);
	json_decref(g);
	client_close(&c);
	fixture_fini(&f);
}

static void t_negotiation(struct t *t)
{
	struct fixture f;
	struct client c;

	T_CHECK(t, fixture_init(&f, true));
	T_CHECK(t, client_connect(&c, f.path));
	json_decref(client_recv(&c, 3000));
	T_CHECK(t, is_error(client_cmd(&c, "{\"execute\": \"query-version\"}\n"),
			    "CommandNotFound",
			    "Expecting capabilities negotiation with 'qmp_capabilities'"));
	T_CHECK(t, is_error(client_cmd(&c,
		"{\"execute\": \"qmp_capabilities\", \"arguments\": {\"enable\": [\"oob\"]}}"),
		"GenericError", "oob"));
	T_CHECK(t, is_return(client_cmd(&c,
		"{\"execute\": \"qmp_capabilities\", \"arguments\": {\"enable\": []}, \"id\": 1}"),
		"{}"));
	T_CHECK(t, is_error(client_cmd(&c, "{\"execute\": \"qmp_capabilities\"}"),
			    "CommandNotFound",
			    "Capabilities negotiation is already complete"));
	T_CHECK(t, is_return(client_cmd(&c, "{\"execute\": \"query-version\"}"),
		"{\"qemu\": {\"major\": 1, \"minor\": 2, \"micro\": 3}, \"package\": \"kmig-1.2.3\"}"));
	json_t *r = client_cmd(&c, "{\"execute\": \"query-commands\"}");
	json_t *list = json_object_get(r, "return"), *e;
	size_t i;
	int seen = 0;
	json_array_foreach(list, i, e) {
		const char *n = json_string_value(json_object_get(e, "name"));
		if (n && (!strcmp(n, "qmp_capabilities") ||
			  !strcmp(n, "query-version") ||
			  !strcmp(n, "query-commands") ||
			  !strcmp(n, "test-echo")))
			seen++;
	}
	T_CHECK_EQ(t, seen, 4);
	json_decref(r);
	T_CHECK(t, is_error(client_cmd(&c, "{\"execute\": \"no-such\"}"),
			    "CommandNotFound",
			    "The command no-such has not been found"));
	client_close(&c);
	fixture_fini(&f);
}

static void t_arguments(struct t *t)
{
	struct fixture f;
	struct client c;
	json_t *r;

	T_CHECK(t, fixture_init(&f, true));
	T_CHECK(t, client_open(&c, f.path));
	T_CHECK(t, is_return(client_cmd(&c,
		"{\"execute\": \"test-echo\", \"arguments\": {\"s\": \"tcp:1:2\", \"i\": -5, \"b\": true, \"n\": 2, \"u\": 9}}"),
		"{\"s\": \"tcp:1:2\", \"i\": -5, \"b\": true, \"n\": 2.0, \"u\": 9}"));
	T_CHECK(t, is_return(client_cmd(&c,
		"{\"execute\": \"test-echo\", \"arguments\": {\"s\": \"x\"}}"),
		"{\"s\": \"x\", \"i\": -1, \"b\": false, \"n\": 0.5, \"u\": 7}"));
	T_CHECK(t, is_error(client_cmd(&c,
		"{\"execute\": \"test-echo\", \"arguments\": {\"s\": \"x\", \"i\": \"3\"}}"),
		"GenericError", "Invalid parameter type for 'i', expected: integer"));
	T_CHECK(t, is_error(client_cmd(&c,
		"{\"execute\": \"test-echo\", \"arguments\": {\"s\": \"x\", \"i\": 1.5}}"),
		"GenericError", "Invalid parameter type for 'i', expected: integer"));
	T_CHECK(t, is_error(client_cmd(&c,
		"{\"execute\": \"test-echo\", \"arguments\": {\"s\": 1}}"),
		"GenericError", "Invalid parameter type for 's', expected: string"));
	T_CHECK(t, is_error(client_cmd(&c,
		"{\"execute\": \"test-echo\", \"arguments\": {\"s\": \"x\", \"b\": 1}}"),
		"GenericError", "Invalid parameter type for 'b', expected: boolean"));
	T_CHECK(t, is_error(client_cmd(&c,
		"{\"execute\": \"test-echo\", \"arguments\": {\"s\": \"x\", \"n\": \"1\"}}"),
		"GenericError", "Invalid parameter type for 'n', expected: number"));
	T_CHECK(t, is_error(client_cmd(&c,
		"{\"execute\": \"test-echo\", \"arguments\": {\"s\": \"x\", \"u\": -1}}"),
		"GenericError", "Parameter 'u' expects uint64"));
	T_CHECK(t, is_error(client_cmd(&c,
		"{\"execute\": \"test-echo\", \"arguments\": {\"s\": \"x\", \"foo\": 1}}"),
		"GenericError", "Parameter 'foo' is unexpected"));
	T_CHECK(t, is_error(client_cmd(&c, "{\"execute\": \"test-echo\"}"),
		"GenericError", "Parameter 's' is missing"));
	T_CHECK(t, is_error(client_cmd(&c, "{\"execute\": \"test-fail\"}"),
		"DeviceNotActive", "No balloon is active"));
	T_CHECK(t, is_return(client_cmd(&c, "{\"execute\": \"test-nothing\"}"),
			     "{}"));

	/* id is echoed verbatim, on success and on error */
	r = client_cmd(&c, "{\"id\": {\"a\": [1, \"x\"]}, \"execute\": \"test-nothing\"}");
	json_t *want = json_pack("{s[is]}", "a", 1, "x");
	T_CHECK(t, r && json_equal(json_object_get(r, "id"), want));
	json_decref(want);
	json_decref(r);
	r = client_cmd(&c, "{\"execute\": \"test-fail\", \"id\": \"abc\"}");
	T_CHECK(t, r && !strcmp(json_string_value(json_object_get(r, "id")) ?: "", "abc"));
	json_decref(r);
	r = client_cmd(&c, "{\"execute\": 5, \"id\": 42}");
	T_CHECK_EQ(t, json_integer_value(json_object_get(r, "id")), 42);
	T_CHECK(t, is_error(r, "GenericError", "'execute' must be a string"));
	client_close(&c);
	fixture_fini(&f);
}

static void t_garbage(struct t *t)
{
	static const struct { const char *in, *desc; } cases[] = {
		{ "hello world\n", "JSON parse error" },
		{ "42\n", "QMP input must be a JSON object" },
		{ "\"str\"\n", "QMP input must be a JSON object" },
		{ "[1, 2]", "QMP input must be a JSON object" },
		{ "{}", "QMP input lacks member 'execute'" },
		{ "{\"arguments\": {}}", "QMP input lacks member 'execute'" },
		{ "{\"execute\": 1}", "QMP input member 'execute' must be a string" },
		{ "{\"execute\": \"test-echo\", \"arguments\": [1]}",
		  "QMP input member 'arguments' must be an object" },
		{ "{\"execute\": \"test-echo\", \"bogus\": 1}",
		  "QMP input member 'bogus' is unexpected" },
		{ "{\"execute\": \"x\", \"execute\": \"y\"}", "JSON parse error" },
		{ "{]", "JSON parse error" },
		{ "{\"execute\": \"\xff\xfe\"}", "JSON parse error" },
		{ "}\n", "JSON parse error" },
		{ "{\"execute\": \"test-echo\", \"arguments\": {\"s\": \"x\", \"i\": 99999999999999999999999}}",
		  "JSON parse error" },
		{ "{\"execute\": \"test-echo\", \"arguments\": {\"s\": \"x\", \"n\": 1e999}}",
		  "JSON parse error" },
	};
	struct fixture f;
	struct client c;

	T_CHECK(t, fixture_init(&f, true));
	T_CHECK(t, client_open(&c, f.path));
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		T_CHECK(t, is_error(client_cmd(&c, cases[i].in),
				    "GenericError", cases[i].desc));
		T_CHECK(t, is_return(client_cmd(&c,
			"{\"execute\": \"test-nothing\"}"), "{}"));
	}
	/* deep nesting: one error, the rest of the line is skipped */
	char *deep = malloc(20002);
	memset(deep, '[', 10000);
	memset(deep + 10000, ']', 10000);
	deep[20000] = '\n';
	deep[20001] = 0;
	T_CHECK(t, is_error(client_cmd(&c, deep), "GenericError", "nesting"));
	T_CHECK(t, is_return(client_cmd(&c, "{\"execute\": \"test-nothing\"}"),
			     "{}"));
	free(deep);
	client_close(&c);
	fixture_fini(&f);
}

static void t_framing(struct t *t)
{
	struct fixture f;
	struct client c;
	json_t *r;

	T_CHECK(t, fixture_init(&f, true));
	T_CHECK(t, client_open(&c, f.path));
	/* two commands in one write, no separator between them */
	T_CHECK(t, client_send(&c,
		"{\"execute\": \"test-nothing\", \"id\": 1}{\"execute\": \"test-fail\", \"id\": 2}\n"));
	r = client_reply(&c);
	T_CHECK_EQ(t, json_integer_value(json_object_get(r, "id")), 1);
	json_decref(r);
	r = client_reply(&c);
	T_CHECK_EQ(t, json_integer_value(json_object_get(r, "id")), 2);
	json_decref(r);

	/* one command split over writes, in the middle of a string with an
	 * escaped quote and a brace inside it; no trailing newline */
	T_CHECK(t, client_send(&c, "{\"execute\": \"test-echo\", \"argu"));
	time__sleep_ns(30000000);
	T_CHECK(t, client_send(&c, "ments\": {\"s\": \"a\\\"}{"));
	time__sleep_ns(30000000);
	T_CHECK(t, client_send(&c, "b\"}, \"id\": 3}"));
	r = client_reply(&c);
	T_CHECK_EQ(t, json_integer_value(json_object_get(r, "id")), 3);
	T_CHECK(t, is_return(r, "{\"s\": \"a\\\"}{b\", \"i\": -1, \"b\": false, \"n\": 0.5, \"u\": 7}"));
	/* ...followed later by more bytes */
	time__sleep_ns(30000000);
	T_CHECK(t, is_return(client_cmd(&c, "  {\"execute\": \"test-nothing\"}\r\n"),
			     "{}"));
	/* byte by byte */
	const char *cmd = "{\"execute\": \"test-nothing\", \"id\": \"b\"}";
	for (const char *p = cmd; *p; p++)
		T_CHECK(t, client_send_bytes(&c, p, 1));
	r = client_reply(&c);
	T_CHECK(t, !strcmp(json_string_value(json_object_get(r, "id")) ?: "", "b"));
	json_decref(r);
	client_close(&c);
	fixture_fini(&f);
}

static void t_oversized(struct t *t)
{
	struct fixture f;
	struct client c;
	size_t big = QMP_MAX_INPUT + QMP_MAX_INPUT / 2;
	char *s = malloc(big + 64);

	T_CHECK(t, fixture_init(&f, true));
	T_CHECK(t, client_open(&c, f.path));
	strcpy(s, "{\"execute\": \"test-echo\", \"arguments\": {\"s\": \"");
	size_t n = strlen(s);
	memset(s + n, 'x', big - n);
	strcpy(s + big, "\"}}\n");
	T_CHECK(t, is_error(client_cmd(&c, s), "GenericError", "too large"));
	T_CHECK(t, is_return(client_cmd(&c, "{\"execute\": \"test-nothing\"}"),
			     "{}"));
	/* a huge garbage line */
	memset(s, 'g', big);
	strcpy(s + big, "\n");
	T_CHECK(t, is_error(client_cmd(&c, s), "GenericError", "too large"));
	T_CHECK(t, is_return(client_cmd(&c, "{\"execute\": \"test-nothing\"}"),
			     "{}"));
	free(s);
	client_close(&c);
	fixture_fini(&f);
}

struct emitter {
	struct qmp *q;
	int count;
	int failed;
};

static void *emitter_main(void *arg)
{
	struct emitter *e = arg;
	for (int i = 0; i < e->count; i++)
		if (qmp__emit_event(e->q, "MIGRATION",
				    json_pack("{sssi}", "status", "active",
					      "seq", i)))
			e->failed++;
	return NULL;
}

static void t_events(struct t *t)
{
	struct fixture f;
	struct client c, raw;
	struct emitter em;
	pthread_t th;
	json_t *v;

	T_CHECK(t, fixture_init(&f, true));
	T_CHECK(t, client_open(&c, f.path));
	T_CHECK(t, client_connect(&raw, f.path));   /* never negotiates */
	json_decref(client_recv(&raw, 3000));

	em = (struct emitter){ .q = f.q, .count = 100 };
	T_CHECK(t, pthread_create(&th, NULL, emitter_main, &em) == 0);
	pthread_join(th, NULL);
	T_CHECK_EQ(t, em.failed, 0);
	for (int i = 0; i < 100; i++) {
		v = client_recv(&c, 3000);
		json_t *ts = json_object_get(v, "timestamp");
		T_CHECK(t, !strcmp(json_string_value(json_object_get(v, "event")) ?: "",
				   "MIGRATION"));
		T_CHECK(t, json_integer_value(json_object_get(ts, "seconds")) > 1600000000);
		T_CHECK(t, json_is_integer(json_object_get(ts, "microseconds")));
		T_CHECK(t, json_integer_value(json_object_get(ts, "microseconds")) < 1000000);
		T_CHECK_EQ(t, json_integer_value(json_object_get(
			json_object_get(v, "data"), "seq")), i);
		json_decref(v);
	}
	/* no data member when data is NULL; bad arguments refused */
	T_CHECK_EQ(t, qmp__emit_event(f.q, "STOP", NULL), 0);
	v = client_recv(&c, 3000);
	T_CHECK(t, v && !json_object_get(v, "data") &&
		   json_object_size(v) == 2);
	json_decref(v);
	T_CHECK_EQ(t, qmp__emit_event(f.q, "", NULL), -EINVAL);
	T_CHECK_EQ(t, qmp__emit_event(f.q, "X", json_integer(1)), -EINVAL);

	/* an event raised by a command precedes its reply */
	T_CHECK(t, client_send(&c, "{\"execute\": \"test-emit\"}"));
	v = client_recv(&c, 3000);
	T_CHECK(t, !strcmp(json_string_value(json_object_get(v, "event")) ?: "",
			   "TEST_EVENT"));
	json_decref(v);
	T_CHECK(t, is_return(client_recv(&c, 3000), "\"done\""));

	/* the client that did not negotiate got no event: its next message
	 * is the reply to its command */
	T_CHECK(t, is_error(client_cmd(&raw, "{\"execute\": \"test-nothing\"}"),
			    "CommandNotFound", "Expecting capabilities"));
	struct pollfd p = { .fd = raw.fd, .events = POLLIN };
	T_CHECK_EQ(t, raw.len, 0);
	T_CHECK_EQ(t, poll(&p, 1, 50), 0);
	client_close(&raw);
	client_close(&c);
	fixture_fini(&f);
}

/* test-takefd: takes the descriptor this client passed, writes "x" into
 * it and closes it; returns whether there was one. */
static json_t *cmd_takefd(void *ctx, json_t *args, struct qmp_error *err)
{
	(void)args;
	(void)err;
	int fd = qmp__take_fd(ctx);
	bool got = fd >= 0;
	if (got) {
		if (write(fd, "x", 1) != 1)
			got = false;
		close(fd);
	}
	return json_boolean(got);
}

/* text with fd attached (SCM_RIGHTS) */
static bool client_send_fd(struct client *c, const char *text, int fd)
{
	union {
		struct cmsghdr align;
		char b[CMSG_SPACE(sizeof(int))];
	} ctl;
	struct iovec iov = { .iov_base = (void *)text, .iov_len = strlen(text) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
			     .msg_controllen = sizeof(ctl.b) };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	return sendmsg(c->fd, &mh, 0) == (ssize_t)iov.iov_len;
}

/* What the pipe's read end gives within 2 s: 'x', 0 at EOF, -1 nothing. */
static int pipe_read(int rfd)
{
	struct pollfd p = { .fd = rfd, .events = POLLIN };
	char b;
	if (poll(&p, 1, 2000) <= 0)
		return -1;
	ssize_t n = read(rfd, &b, 1);
	return n == 1 ? b : n == 0 ? 0 : -1;
}

/* Descriptors passed with SCM_RIGHTS: the command that takes it gets the
 * last one its own client sent; an older one, one nobody takes and one of
 * a client that leaves are closed. */
static void t_passed_fds(struct t *t)
{
	struct fixture f;
	struct client a, b;
	int p1[2], p2[2], p3[2];
	const char *take = "{\"execute\": \"test-takefd\"}\n";

	T_CHECK(t, fixture_init(&f, false));
	T_CHECK_EQ(t, qmp__register(f.q, "test-takefd", cmd_takefd, f.q), 0);
	T_CHECK(t, pthread_create(&f.thread, NULL, fixture_loop, &f) == 0);
	f.running = true;
	T_CHECK(t, client_open(&a, f.path));
	T_CHECK(t, client_open(&b, f.path));
	T_CHECK(t, pipe2(p1, O_CLOEXEC) == 0 && pipe2(p2, O_CLOEXEC) == 0 &&
		   pipe2(p3, O_CLOEXEC) == 0);
	/* none passed */
	T_CHECK(t, is_return(client_cmd(&a, take), "false"));
	/* passed with the command's own bytes */
	T_CHECK(t, client_send_fd(&a, take, p1[1]));
	close(p1[1]);
	T_CHECK(t, is_return(client_reply(&a), "true"));
	T_CHECK_EQ(t, pipe_read(p1[0]), 'x');
	T_CHECK_EQ(t, pipe_read(p1[0]), 0);     /* and closed by the handler */
	/* two passed before: the newer is taken, the older closed */
	T_CHECK(t, client_send_fd(&a, " ", p1[0]) && client_send_fd(&a, " ", p2[1]));
	close(p2[1]);
	T_CHECK(t, is_return(client_cmd(&a, take), "true"));
	T_CHECK_EQ(t, pipe_read(p2[0]), 'x');
	/* another client cannot take a's */
	T_CHECK(t, client_send_fd(&a, " ", p3[1]));
	close(p3[1]);
	T_CHECK(t, is_return(client_cmd(&b, take), "false"));
	/* a leaving: its descriptor is closed (EOF on the pipe) */
	client_close(&a);
	T_CHECK_EQ(t, pipe_read(p3[0]), 0);
	client_close(&b);
	close(p1[0]);
	close(p2[0]);
	close(p3[0]);
	fixture_fini(&f);
}

static void t_clients(struct t *t)
{
	struct fixture f;
	struct client a, b, c[QMP_MAX_CLIENTS];

	T_CHECK(t, fixture_init(&f, true));
	/* one after another */
	T_CHECK(t, client_open(&a, f.path));
	client_close(&a);
	T_CHECK(t, client_open(&b, f.path));
	T_CHECK(t, is_return(client_cmd(&b, "{\"execute\": \"test-nothing\"}"),
			     "{}"));
	client_close(&b);

	/* several at once, interleaved */
	for (int i = 0; i < QMP_MAX_CLIENTS; i++)
		T_CHECK(t, client_open(&c[i], f.path));
	for (int i = QMP_MAX_CLIENTS - 1; i >= 0; i--)
		T_CHECK(t, is_return(client_cmd(&c[i],
			"{\"execute\": \"test-nothing\"}"), "{}"));
	/* one more waits in the backlog until a slot frees up */
	T_CHECK(t, client_connect(&a, f.path));
	T_CHECK(t, client_recv(&a, 100) == NULL);
	client_close(&c[0]);
	json_t *g = client_recv(&a, 3000);
	T_CHECK(t, g && json_object_get(g, "QMP"));
	json_decref(g);
	client_close(&a);
	for (int i = 1; i < QMP_MAX_CLIENTS; i++)
		client_close(&c[i]);

	/* disconnect in the middle of a command, and right after sending one */
	T_CHECK(t, client_open(&a, f.path));
	T_CHECK(t, client_send(&a, "{\"execute\": \"test-ec"));
	client_close(&a);
	T_CHECK(t, client_open(&a, f.path));
	T_CHECK(t, client_send(&a, "{\"execute\": \"test-nothing\"}"));
	client_close(&a);
	/* half-close: the reply still arrives (socat one-liners) */
	T_CHECK(t, client_connect(&a, f.path));
	T_CHECK(t, client_send(&a, "{\"execute\": \"qmp_capabilities\"}\n"
				   "{\"execute\": \"query-version\", \"id\": 7}\n"));
	shutdown(a.fd, SHUT_WR);
	json_decref(client_recv(&a, 3000));          /* greeting */
	T_CHECK(t, is_return(client_recv(&a, 3000), "{}"));
	json_t *r = client_recv(&a, 3000);
	T_CHECK_EQ(t, json_integer_value(json_object_get(r, "id")), 7);
	json_decref(r);
	T_CHECK(t, client_recv(&a, 3000) == NULL);   /* then EOF */
	client_close(&a);

	T_CHECK(t, client_open(&b, f.path));
	T_CHECK(t, is_return(client_cmd(&b, "{\"execute\": \"test-nothing\"}"),
			     "{}"));
	client_close(&b);
	fixture_fini(&f);
}

/* A client that stops reading is dropped; the others keep working. */
static void t_slow_client(struct t *t)
{
	struct fixture f;
	struct client slow, ok;
	char pad[4000];
	int rcv = 4096;

	memset(pad, 'p', sizeof(pad) - 1);
	pad[sizeof(pad) - 1] = 0;
	T_CHECK(t, fixture_init(&f, true));
	T_CHECK(t, client_open(&slow, f.path));
	setsockopt(slow.fd, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
	T_CHECK(t, client_open(&ok, f.path));
	for (int round = 0; round < 12; round++) {
		for (int i = 0; i < 200; i++)
			T_CHECK_EQ(t, qmp__emit_event(f.q, "BIG",
				json_pack("{ss}", "pad", pad)), 0);
		/* keep the good client drained */
		json_t *v;
		int got = 0;
		while (got < 200 && (v = client_recv(&ok, 3000))) {
			json_decref(v);
			got++;
		}
		T_CHECK_EQ(t, got, 200);
	}
	T_CHECK(t, is_return(client_cmd(&ok, "{\"execute\": \"test-nothing\"}"),
			     "{}"));
	/* the slow one reads what the kernel kept, then EOF */
	char buf[65536];
	ssize_t n = -1;
	size_t total = 0;
	struct pollfd p = { .fd = slow.fd, .events = POLLIN };
	while (poll(&p, 1, 3000) > 0 &&
	       (n = recv(slow.fd, buf, sizeof(buf), 0)) > 0)
		total += (size_t)n;
	T_CHECK(t, total < 12u * 200 * sizeof(pad));
	T_CHECK(t, n == 0 || (n < 0 && errno == ECONNRESET));
	client_close(&slow);
	client_close(&ok);
	fixture_fini(&f);
}

static void t_socket_file(struct t *t)
{
	struct fixture f;
	struct stat st;
	struct qmp *q2 = NULL;
	char other[160];
	int fd;

	T_CHECK(t, fixture_init(&f, false));
	T_CHECK(t, stat(f.path, &st) == 0);
	T_CHECK(t, S_ISSOCK(st.st_mode));
	T_CHECK_EQ(t, st.st_mode & 0777, 0600);
	/* a live server is not replaced */
	T_CHECK_EQ(t, qmp__create(&q2, f.path, NULL), -EADDRINUSE);
	fixture_fini(&f);
	T_CHECK(t, stat(f.path, &st) < 0 && errno == ENOENT);

	/* a stale socket (bound, never unlinked) is replaced */
	T_CHECK(t, mkdtemp(strcpy(f.dir, "/tmp/kmig-qmp-XXXXXX")) != NULL);
	snprintf(f.path, sizeof(f.path), "%s/qmp.sock", f.dir);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	memcpy(sa.sun_path, f.path, strlen(f.path) + 1);  /* < 64 bytes */
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	T_CHECK(t, bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
	close(fd);
	T_CHECK_EQ(t, qmp__create(&q2, f.path, NULL), 0);
	qmp__destroy(q2);
	/* not a socket: left alone */
	snprintf(other, sizeof(other), "%s/file", f.dir);
	fd = open(other, O_CREAT | O_WRONLY, 0600);
	close(fd);
	T_CHECK_EQ(t, qmp__create(&q2, other, NULL), -EEXIST);
	T_CHECK(t, stat(other, &st) == 0 && S_ISREG(st.st_mode));
	unlink(other);
	char longp[200];
	memset(longp, 'a', sizeof(longp) - 1);
	longp[sizeof(longp) - 1] = 0;
	T_CHECK_EQ(t, qmp__create(&q2, longp, NULL), -ENAMETOOLONG);
	rmdir(f.dir);
}

/* Interleaved mode (no loop thread): extra fds, quit + flush. */
struct quit_ctx { bool quit; int fd_calls; struct qmp *q; int pipe_r; };

static json_t *cmd_quit(void *ctx, json_t *args, struct qmp_error *err)
{
	(void)args;
	(void)err;
	((struct quit_ctx *)ctx)->quit = true;
	return NULL;
}

static void on_pipe(void *ctx, int fd, short revents)
{
	struct quit_ctx *qc = ctx;
	char b[16];
	(void)revents;
	if (read(fd, b, sizeof(b)) > 0)
		qc->fd_calls++;
	qmp__del_fd(qc->q, fd);
}

static void t_loop_and_flush(struct t *t)
{
	struct fixture f;
	struct client c;
	struct quit_ctx qc = { 0 };
	int p[2];

	T_CHECK(t, fixture_init(&f, false));
	qc.q = f.q;
	T_CHECK_EQ(t, qmp__register(f.q, "quit", cmd_quit, &qc), 0);
	T_CHECK_EQ(t, qmp__register(f.q, "quit", cmd_quit, &qc), -EEXIST);
	T_CHECK_EQ(t, qmp__register(f.q, "qmp_capabilities", cmd_quit, &qc),
		   -EEXIST);
	T_CHECK_EQ(t, qmp__register(f.q, "", cmd_quit, &qc), -EINVAL);
	T_CHECK(t, pipe2(p, O_NONBLOCK | O_CLOEXEC) == 0);
	T_CHECK_EQ(t, qmp__add_fd(f.q, p[0], POLLIN, on_pipe, &qc), 0);
	T_CHECK_EQ(t, qmp__add_fd(f.q, p[0], POLLIN, on_pipe, &qc), -EEXIST);
	T_CHECK(t, write(p[1], "x", 1) == 1);
	T_CHECK(t, qmp__poll(f.q, 1000) >= 1);
	T_CHECK_EQ(t, qc.fd_calls, 1);
	T_CHECK(t, write(p[1], "y", 1) == 1);
	T_CHECK_EQ(t, qmp__poll(f.q, 50), 0);   /* removed: not called */
	T_CHECK_EQ(t, qc.fd_calls, 1);
	T_CHECK_EQ(t, qmp__del_fd(f.q, p[0]), -ENOENT);

	T_CHECK(t, client_connect(&c, f.path));
	T_CHECK(t, client_send(&c, "{\"execute\": \"qmp_capabilities\"}"
				   "{\"execute\": \"quit\", \"id\": \"q\"}"));
	for (int i = 0; i < 100 && !qc.quit; i++)
		T_CHECK(t, qmp__poll(f.q, 100) >= 0);
	T_CHECK(t, qc.quit);
	T_CHECK_EQ(t, qmp__emit_event(f.q, "SHUTDOWN",
				      json_pack("{sb}", "guest", 0)), 0);
	T_CHECK_EQ(t, qmp__flush(f.q, 1000), 0);
	json_decref(client_recv(&c, 1000));             /* greeting */
	T_CHECK(t, is_return(client_recv(&c, 1000), "{}"));
	json_t *r = client_recv(&c, 1000);
	T_CHECK(t, !strcmp(json_string_value(json_object_get(r, "id")) ?: "", "q"));
	json_decref(r);
	r = client_recv(&c, 1000);
	T_CHECK(t, !strcmp(json_string_value(json_object_get(r, "event")) ?: "",
			   "SHUTDOWN"));
	json_decref(r);
	client_close(&c);
	close(p[0]);
	close(p[1]);
	fixture_fini(&f);
}

/* Random input straight into the splitter and dispatcher: every text gets
 * a well-formed reply and nothing crashes (run under ASan for value). */
static void t_fuzz(struct t *t)
{
	static const char alphabet[] = "{}[]\"\\:,\n 0123456789.eE-+truefalsnl"
				       "executeargumentsid\xff\x01";
	struct qmp_dispatch d;
	struct qmp_splitter s = { 0 };
	unsigned seed = 12345;
	int replies = 0, bad = 0;

	T_CHECK_EQ(t, qmp_dispatch__init(&d, NULL), 0);
	for (int iter = 0; iter < 20000; iter++) {
		char buf[256];
		size_t n = (size_t)(rand_r(&seed) % sizeof(buf));
		bool negotiated = iter & 1;
		for (size_t i = 0; i < n; i++)
			buf[i] = (rand_r(&seed) & 3) ?
				alphabet[rand_r(&seed) % (sizeof(alphabet) - 1)] :
				(char)rand_r(&seed);
		if (qmp_split__feed(&s, buf, n)) {
			bad++;
			break;
		}
		for (;;) {
			const char *text;
			size_t len;
			enum qmp_split_result r = qmp_split__next(&s, &text, &len);
			if (r == QMP_SPLIT_MORE)
				break;
			if (r == QMP_SPLIT_ERROR)
				continue;
			json_t *reply = qmp_dispatch__text(&d, text, len,
							   &negotiated);
			if (!reply || !(json_object_get(reply, "return") ||
					json_object_get(reply, "error")))
				bad++;
			replies++;
			json_decref(reply);
		}
		/* also whole random buffers as one text */
		bool neg2 = true;
		json_decref(qmp_dispatch__text(&d, buf, n, &neg2));
	}
	T_CHECK_EQ(t, bad, 0);
	T_CHECK(t, replies > 100);
	T_CHECK(t, s.in.len - s.in.head <= QMP_MAX_INPUT + 256);
	qmp_split__free(&s);

	/* deep nesting and huge numbers straight to the parser */
	size_t depth = 100000;
	char *deep = malloc(2 * depth);
	memset(deep, '[', depth);
	memset(deep + depth, ']', depth);
	bool neg = true;
	T_CHECK(t, is_error(qmp_dispatch__text(&d, deep, 2 * depth, &neg),
			    "GenericError", "JSON parse error"));
	free(deep);
	const char *huge = "{\"execute\": \"query-version\", \"id\": 1e400}";
	T_CHECK(t, is_error(qmp_dispatch__text(&d, huge, strlen(huge), &neg),
			    "GenericError", "JSON parse error"));
	huge = "{\"execute\": \"query-version\", \"id\": -99999999999999999999}";
	T_CHECK(t, is_error(qmp_dispatch__text(&d, huge, strlen(huge), &neg),
			    "GenericError", "JSON parse error"));
	qmp_dispatch__fini(&d);
}

static void t_arg_helpers(struct t *t)
{
	struct qmp_error err = { 0 };
	const char *s = "default";
	int64_t i = 5;

	/* NULL args: absent optional keeps the default, required fails */
	T_CHECK_EQ(t, qmp_arg__str(NULL, "x", &s, false, &err), 0);
	T_CHECK(t, !strcmp(s, "default") && !err.set);
	T_CHECK_EQ(t, qmp_arg__int(NULL, "x", &i, true, &err), -EINVAL);
	T_CHECK(t, err.set && !strcmp(err.desc, "Parameter 'x' is missing"));
	T_CHECK(t, !strcmp(qmp_error__class_name(err.cls), "GenericError"));
	T_CHECK_EQ(t, qmp_arg__check_known(NULL, NULL, &err), 0);
	T_CHECK(t, !strcmp(qmp_error__class_name(QMP_ERROR_COMMAND_NOT_FOUND),
			   "CommandNotFound"));
	T_CHECK(t, !strcmp(qmp_error__class_name(QMP_ERROR_KVM_MISSING_CAP),
			   "KVMMissingCap"));
	json_t *a = json_pack("{s[i]s{}}", "arr", 1, "obj");
	json_t *o = NULL;
	struct qmp_error e2 = { 0 };
	T_CHECK_EQ(t, qmp_arg__array(a, "arr", &o, true, &e2), 1);
	T_CHECK(t, json_is_array(o));
	T_CHECK_EQ(t, qmp_arg__object(a, "obj", &o, true, &e2), 1);
	T_CHECK(t, json_is_object(o));
	T_CHECK_EQ(t, qmp_arg__object(a, "arr", &o, true, &e2), -EINVAL);
	T_CHECK(t, !strcmp(e2.desc,
			   "Invalid parameter type for 'arr', expected: object"));
	json_decref(a);
}

/* Error messages quote the client's text cut to a fixed length; a cut
 * inside a UTF-8 character must not cost the client its reply. */
static void t_utf8_cut(struct t *t)
{
	struct qmp_dispatch d;
	bool neg = true;
	char name[80], text[200];

	T_CHECK_EQ(t, qmp_dispatch__init(&d, NULL), 0);
	/* 63 ASCII bytes then "é" (0xc3 0xa9): %.64s keeps only 0xc3 */
	memset(name, 'a', 63);
	memcpy(name + 63, "\xc3\xa9", 3);
	snprintf(text, sizeof(text), "{\"execute\": \"%s\", \"id\": 7}", name);
	json_t *r = qmp_dispatch__text(&d, text, strlen(text), &neg);
	T_CHECK(t, r && json_integer_value(json_object_get(r, "id")) == 7);
	T_CHECK(t, is_error(r, "CommandNotFound", "aaaa?"));
	/* the same cut in an unexpected member's name */
	snprintf(text, sizeof(text),
		 "{\"execute\": \"query-version\", \"%s\": 1}", name);
	T_CHECK(t, is_error(qmp_dispatch__text(&d, text, strlen(text), &neg),
			    "GenericError", "is unexpected"));
	qmp_dispatch__fini(&d);

	struct qmp_error err = { 0 };
	qmp_error__set(&err, QMP_ERROR_GENERIC, "x%sy", "\xff\xc3\xa9\xe2\x82");
	T_CHECK(t, !strcmp(err.desc, "x?\xc3\xa9??y"));
}

static void t_utf8(struct t *t)
{
	static const struct { const char *s; const char *want; } cases[] = {
		{ "plain", "plain" },
		{ "\xc3\xa9t\xc3\xa9", "\xc3\xa9t\xc3\xa9" },            /* été */
		{ "\xe2\x82\xac", "\xe2\x82\xac" },                      /* € */
		{ "\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80" },              /* U+1F600 */
		{ "a\xc3", "a?" },                                   /* cut */
		{ "a\xe2\x82", "a??" },                              /* cut */
		{ "\x80x", "?x" },                                   /* stray continuation */
		{ "\xc0\xaf", "??" },                                /* overlong '/' */
		{ "\xe0\x80\xaf", "???" },                           /* overlong */
		{ "\xed\xa0\x80", "???" },                           /* surrogate */
		{ "\xf4\x90\x80\x80", "????" },                      /* > U+10FFFF */
		{ "\xff\xfe", "??" },
		/* from here on valid UTF-8, but control characters: replaced too */
		{ "a\x1b[2Jb", "a?[2Jb" },                           /* ESC */
		{ "x\ny\tz\x7f", "x?y?z?" },                          /* LF, TAB, DEL */
		{ "\xc2\x9b" "31m", "??31m" },                         /* C1 CSI */
		{ "\xc2\xa0\xc2\xbf", "\xc2\xa0\xc2\xbf" },              /* NBSP, inverted ? */
	};
	const size_t first_control = 12;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char buf[32];
		snprintf(buf, sizeof(buf), "%s", cases[i].s);
		utf8__sanitize(buf);
		if (strcmp(buf, cases[i].want))
			printf("#   case %zu: got \"%s\"\n", i, buf);
		T_CHECK(t, !strcmp(buf, cases[i].want));
		T_CHECK(t, utf8__valid(buf, strlen(buf)));
		T_CHECK(t, utf8__valid(cases[i].s, strlen(cases[i].s)) ==
			   (i >= first_control || !strcmp(cases[i].s, cases[i].want)));
		json_t *js = json_string(buf);
		T_CHECK(t, js != NULL);
		json_decref(js);
	}
}

int main(void)
{
	struct t t = { 0 };

	T_RUN(&t, t_arg_helpers);
	T_RUN(&t, t_greeting);
	T_RUN(&t, t_negotiation);
	T_RUN(&t, t_arguments);
	T_RUN(&t, t_garbage);
	T_RUN(&t, t_framing);
	T_RUN(&t, t_oversized);
	T_RUN(&t, t_events);
	T_RUN(&t, t_clients);
	T_RUN(&t, t_passed_fds);
	T_RUN(&t, t_slow_client);
	T_RUN(&t, t_socket_file);
	T_RUN(&t, t_loop_and_flush);
	T_RUN(&t, t_fuzz);
	T_RUN(&t, t_utf8);
	T_RUN(&t, t_utf8_cut);
	printf("%d passed, %d failed\n", t.passed, t.failed);
	return T_DONE(&t);
}
