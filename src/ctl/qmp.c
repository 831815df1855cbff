/* QMP server core: the listening socket, clients, the poll loop, extra fds
 * and the cross-thread event queue.  Request handling is in qmp_dispatch.c,
 * input framing in qmp_split.c. */
#include "ctl/qmp_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/timeutil.h"

#define QMP_READ_CHUNK 65536

struct qmp_client {
	int fd;
	bool negotiated;
	bool eof;               /* peer shut down its side; answer, then close */
	bool dead;              /* to be closed at the end of this poll */
	int passed_fd;          /* the last descriptor sent with SCM_RIGHTS, -1 = none */
	struct qmp_splitter in;
	struct qmp_buf out;
};

struct qmp_extra_fd {
	bool used;
	int fd;
	short events;
	unsigned gen;           /* bumped on each add, to spot a reused slot */
	qmp_fd_cb cb;
	void *ctx;
};

struct qmp_event {
	struct qmp_event *next;
	size_t len;
	char text[];
};

enum qmp_slot_kind { QMP_SLOT_LISTEN, QMP_SLOT_WAKE, QMP_SLOT_CLIENT,
		     QMP_SLOT_EXTRA };

struct qmp_slot {
	enum qmp_slot_kind kind;
	int index;
	unsigned gen;
};

#define QMP_MAX_SLOTS (2 + QMP_MAX_CLIENTS + QMP_MAX_EXTRA_FDS)

struct qmp {
	int listen_fd;
	int wake_fd;
	char *path;
	dev_t sock_dev;
	ino_t sock_ino;
	struct qmp_dispatch disp;
	struct qmp_client *clients[QMP_MAX_CLIENTS];
	int nclients;
	struct qmp_client *running;     /* whose command runs now (qmp__take_fd) */
	struct qmp_extra_fd extra[QMP_MAX_EXTRA_FDS];
	unsigned extra_gen;
	struct pollfd pfds[QMP_MAX_SLOTS];
	struct qmp_slot slots[QMP_MAX_SLOTS];

	/* Shared with other threads; everything below is under ev_lock. */
	pthread_mutex_t ev_lock;
	struct qmp_event *ev_head, *ev_tail;
	unsigned ev_count;
};

/* ---- listening socket ---- */

/* Removes PATH if it is a socket nobody listens on. */
static int qmp__remove_stale(const char *path, const struct sockaddr_un *sa)
{
	struct stat st;
	int fd, r;

	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISSOCK(st.st_mode))
		return -EEXIST;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	r = connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) < 0 ? -errno : 0;
	close(fd);
	if (r == 0 || r == -EAGAIN)
		return -EADDRINUSE;
	if (r != -ECONNREFUSED)
		return r;
	if (unlink(path) < 0 && errno != ENOENT)
		return -errno;
	return 0;
}

static int qmp__listen(struct qmp *q, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	size_t len = strlen(path);
	struct stat st;
	mode_t old;
	int fd, r;

	if (len == 0)
		return -EINVAL;
	if (len >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, len + 1);
	r = qmp__remove_stale(path, &sa);
	if (r)
		return r;
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	old = umask(0177);      /* the socket is born 0600 */
	r = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ? -errno : 0;
	umask(old);
	if (r)
		goto fail;
	if (chmod(path, 0600) < 0 || lstat(path, &st) < 0 ||
	    listen(fd, QMP_MAX_CLIENTS) < 0) {
		r = -errno;
		unlink(path);
		goto fail;
	}
	q->sock_dev = st.st_dev;
	q->sock_ino = st.st_ino;
	q->listen_fd = fd;
	return 0;
fail:
	close(fd);
	return r;
}

int qmp__create(struct qmp **out, const char *path,
		const struct qmp_version *version)
{
	struct qmp *q;
	int r;

	if (!out || !path)
		return -EINVAL;
	q = calloc(1, sizeof(*q));
	if (!q)
		return -ENOMEM;
	q->listen_fd = q->wake_fd = -1;
	r = pthread_mutex_init(&q->ev_lock, NULL);
	if (r) {
		free(q);
		return -r;
	}
	r = qmp_dispatch__init(&q->disp, version);
	if (r)
		goto fail;
	q->path = strdup(path);
	if (!q->path) {
		r = -ENOMEM;
		goto fail;
	}
	q->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (q->wake_fd < 0) {
		r = -errno;
		goto fail;
	}
	r = qmp__listen(q, path);
	if (r)
		goto fail;
	*out = q;
	return 0;
fail:
	free(q->path);
	q->path = NULL;     /* nothing of ours to unlink */
	qmp__destroy(q);
	return r;
}

/* ---- clients ---- */

static void qmp__client_free(struct qmp_client *c)
{
	if (c->fd >= 0)
		close(c->fd);
	if (c->passed_fd >= 0)
		close(c->passed_fd);
	qmp_split__free(&c->in);
	qmp_buf__free(&c->out);
	free(c);
}

static void qmp__client_drop(struct qmp_client *c, const char *why)
{
	if (!c->dead)
		log_debug("qmp: dropping client fd %d: %s", c->fd, why);
	c->dead = true;
}

/* Queues raw bytes for C; drops a client that stopped reading. */
static void qmp__client_queue(struct qmp_client *c, const char *s, size_t n)
{
	if (c->dead)
		return;
	if (qmp_buf__pending(&c->out) + n > QMP_MAX_OUTPUT) {
		log_warn("qmp: client fd %d does not read its replies, dropping it",
			 c->fd);
		qmp__client_drop(c, "output buffer full");
		return;
	}
	if (qmp_buf__append(&c->out, s, n))
		qmp__client_drop(c, "out of memory");
}

/* Queues a JSON value as one line; consumes V. */
static void qmp__client_send(struct qmp_client *c, json_t *v)
{
	char *s;

	if (!v) {
		qmp__client_drop(c, "out of memory");
		return;
	}
	s = json_dumps(v, JSON_ENCODE_ANY);
	json_decref(v);
	if (!s) {
		qmp__client_drop(c, "out of memory");
		return;
	}
	qmp__client_queue(c, s, strlen(s));
	qmp__client_queue(c, "\r\n", 2);
	free(s);
}

/* Writes what the socket takes without blocking. */
static void qmp__client_write(struct qmp_client *c)
{
	while (!c->dead && qmp_buf__pending(&c->out)) {
		ssize_t n = send(c->fd, c->out.data + c->out.head,
				 qmp_buf__pending(&c->out),
				 MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				qmp__client_drop(c, strerror(errno));
			return;
		}
		c->out.head += (size_t)n;
	}
	if (!qmp_buf__pending(&c->out)) {
		c->out.head = c->out.len = 0;
		if (c->eof)
			qmp__client_drop(c, "end of input");
	}
}

static void qmp__deliver_events(struct qmp *q);

/* Handles every complete request in C's input buffer. */
static void qmp__client_process(struct qmp *q, struct qmp_client *c)
{
	const char *text;
	size_t len;

	while (!c->dead) {
		enum qmp_split_result r = qmp_split__next(&c->in, &text, &len);
		json_t *reply;

		if (r == QMP_SPLIT_MORE)
			break;
		if (r == QMP_SPLIT_ERROR) {
			struct qmp_error err = { 0 };
			qmp_error__set(&err, QMP_ERROR_GENERIC, "%s", text);
			reply = qmp_dispatch__error_reply(&err, NULL);
		} else {
			q->running = c;
			reply = qmp_dispatch__text(&q->disp, text, len,
						   &c->negotiated);
			q->running = NULL;
		}
		/* Events raised by the command go out before its reply. */
		qmp__deliver_events(q);
		qmp__client_send(c, reply);
	}
}

/* Descriptors that came with the bytes (SCM_RIGHTS): the client's last
 * one is kept for getfd, any other closed. */
static void qmp__client_take_fds(struct qmp_client *c, struct msghdr *mh)
{
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(fd));
			if (c->passed_fd >= 0)
				close(c->passed_fd);
			c->passed_fd = fd;
		}
	}
}

int qmp__take_fd(struct qmp *q)
{
	struct qmp_client *c = q->running;
	int fd = c ? c->passed_fd : -1;
	if (c)
		c->passed_fd = -1;
	return fd;
}

static void qmp__client_read(struct qmp *q, struct qmp_client *c)
{
	char buf[QMP_READ_CHUNK];
	union {
		struct cmsghdr align;
		char b[CMSG_SPACE(QMP_MAX_PASSED_FDS * sizeof(int))];
	} ctl;
	struct iovec iov = { .iov_base = buf, .iov_len = sizeof(buf) };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b,
			     .msg_controllen = sizeof(ctl.b) };
	ssize_t n;

	n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (n >= 0)
		qmp__client_take_fds(c, &mh);
	if (n < 0) {
		if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			qmp__client_drop(c, strerror(errno));
		return;
	}
	if (n == 0) {
		c->eof = true;          /* replies still go out, then close */
		return;
	}
	if (qmp_split__feed(&c->in, buf, (size_t)n)) {
		qmp__client_drop(c, "out of memory");
		return;
	}
	qmp__client_process(q, c);
}

static void qmp__accept(struct qmp *q)
{
	while (q->nclients < QMP_MAX_CLIENTS) {
		struct qmp_client *c;
		int fd = accept4(q->listen_fd, NULL, NULL,
				 SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK &&
			    errno != EINTR && errno != ECONNABORTED)
				log_warn("qmp: accept: %s", strerror(errno));
			return;
		}
		c = calloc(1, sizeof(*c));
		if (!c) {
			close(fd);
			return;
		}
		c->fd = fd;
		c->passed_fd = -1;
		q->clients[q->nclients++] = c;
		qmp__client_send(c, qmp_dispatch__greeting(&q->disp));
	}
}

/* Closes dead clients and compacts the array. */
static void qmp__reap(struct qmp *q)
{
	int j = 0;

	for (int i = 0; i < q->nclients; i++) {
		if (q->clients[i]->dead)
			qmp__client_free(q->clients[i]);
		else
			q->clients[j++] = q->clients[i];
	}
	for (int i = j; i < q->nclients; i++)
		q->clients[i] = NULL;
	q->nclients = j;
}

static void qmp__write_all(struct qmp *q)
{
	for (int i = 0; i < q->nclients; i++)
		qmp__client_write(q->clients[i]);
}

int qmp__client_count(const struct qmp *q)
{
	return q->nclients;
}

/* ---- events ---- */

static json_t *qmp__event_build(const char *name, json_t *data)
{
	struct timespec ts;
	json_t *ev;

	clock_gettime(CLOCK_REALTIME, &ts);
	ev = json_pack("{s{sIsI}ss}", "timestamp",
		       "seconds", (json_int_t)ts.tv_sec,
		       "microseconds", (json_int_t)(ts.tv_nsec / 1000),
		       "event", name);
	if (ev && data && json_object_set(ev, "data", data)) {
		json_decref(ev);
		ev = NULL;
	}
	return ev;
}

/* Serialises outside the lock, appends under it. */
int qmp__emit_event(struct qmp *q, const char *name, json_t *data)
{
	size_t nlen = name ? strnlen(name, QMP_MAX_NAME) : 0;
	struct qmp_event *e = NULL;
	json_t *ev = NULL;
	char *s = NULL;
	int r = -EINVAL;

	if (nlen == 0 || nlen >= QMP_MAX_NAME || (data && !json_is_object(data)))
		goto out;
	r = -ENOMEM;
	ev = qmp__event_build(name, data);
	s = ev ? json_dumps(ev, 0) : NULL;
	if (!s)
		goto out;
	e = malloc(sizeof(*e) + strlen(s) + 3);
	if (!e)
		goto out;
	e->next = NULL;
	e->len = (size_t)sprintf(e->text, "%s\r\n", s);

	pthread_mutex_lock(&q->ev_lock);
	if (q->ev_count >= QMP_MAX_EVENTS) {
		r = -ENOBUFS;
	} else {
		if (q->ev_tail)
			q->ev_tail->next = e;
		else
			q->ev_head = e;
		q->ev_tail = e;
		q->ev_count++;
		e = NULL;
		r = 0;
	}
	pthread_mutex_unlock(&q->ev_lock);
	if (r == 0)
		qmp__wake(q);
out:
	free(e);
	free(s);
	json_decref(ev);
	json_decref(data);
	return r;
}

static void qmp__deliver_events(struct qmp *q)
{
	struct qmp_event *e, *next;

	pthread_mutex_lock(&q->ev_lock);
	e = q->ev_head;
	q->ev_head = q->ev_tail = NULL;
	q->ev_count = 0;
	pthread_mutex_unlock(&q->ev_lock);

	for (; e; e = next) {
		next = e->next;
		for (int i = 0; i < q->nclients; i++)
			if (q->clients[i]->negotiated)
				qmp__client_queue(q->clients[i], e->text,
						  e->len);
		free(e);
	}
}

void qmp__wake(struct qmp *q)
{
	uint64_t one = 1;
	ssize_t n = write(q->wake_fd, &one, sizeof(one));
	(void)n;        /* EAGAIN: the counter is already non-zero */
}

static void qmp__drain_wake(struct qmp *q)
{
	uint64_t v;
	ssize_t n = read(q->wake_fd, &v, sizeof(v));
	(void)n;
}

/* ---- extra fds ---- */

int qmp__add_fd(struct qmp *q, int fd, short events, qmp_fd_cb cb, void *ctx)
{
	struct qmp_extra_fd *free_slot = NULL;

	if (fd < 0)
		return -EBADF;
	if (!cb || !(events & (POLLIN | POLLOUT | POLLPRI)))
		return -EINVAL;
	for (int i = 0; i < QMP_MAX_EXTRA_FDS; i++) {
		if (q->extra[i].used && q->extra[i].fd == fd)
			return -EEXIST;
		if (!q->extra[i].used && !free_slot)
			free_slot = &q->extra[i];
	}
	if (!free_slot)
		return -ENOSPC;
	*free_slot = (struct qmp_extra_fd){
		.used = true, .fd = fd, .events = events,
		.gen = ++q->extra_gen, .cb = cb, .ctx = ctx,
	};
	return 0;
}

int qmp__del_fd(struct qmp *q, int fd)
{
	for (int i = 0; i < QMP_MAX_EXTRA_FDS; i++) {
		if (q->extra[i].used && q->extra[i].fd == fd) {
			q->extra[i].used = false;
			return 0;
		}
	}
	return -ENOENT;
}

/* ---- the loop ---- */

static int qmp__add_slot(struct qmp *q, int n, int fd, short events,
			 enum qmp_slot_kind kind, int index, unsigned gen)
{
	q->pfds[n] = (struct pollfd){ .fd = fd, .events = events };
	q->slots[n] = (struct qmp_slot){ .kind = kind, .index = index,
					 .gen = gen };
	return n + 1;
}

static int qmp__build_pollfds(struct qmp *q)
{
	int n = 0;

	if (q->nclients < QMP_MAX_CLIENTS)
		n = qmp__add_slot(q, n, q->listen_fd, POLLIN, QMP_SLOT_LISTEN,
				  0, 0);
	n = qmp__add_slot(q, n, q->wake_fd, POLLIN, QMP_SLOT_WAKE, 0, 0);
	for (int i = 0; i < q->nclients; i++) {
		struct qmp_client *c = q->clients[i];
		short ev = c->eof ? 0 : POLLIN;
		if (qmp_buf__pending(&c->out))
			ev |= POLLOUT;
		n = qmp__add_slot(q, n, c->fd, ev, QMP_SLOT_CLIENT, i, 0);
	}
	for (int i = 0; i < QMP_MAX_EXTRA_FDS; i++) {
		struct qmp_extra_fd *x = &q->extra[i];
		if (x->used)
			n = qmp__add_slot(q, n, x->fd, x->events,
					  QMP_SLOT_EXTRA, i, x->gen);
	}
	return n;
}

static void qmp__handle_client(struct qmp *q, struct qmp_client *c,
			       short revents)
{
	if (revents & POLLIN)
		qmp__client_read(q, c);
	else if (revents & (POLLERR | POLLNVAL))
		qmp__client_drop(c, "socket error");
	else if ((revents & POLLHUP) && !c->eof)
		c->eof = true;
}

static void qmp__dispatch_slot(struct qmp *q, int i)
{
	struct qmp_slot *s = &q->slots[i];
	short rev = q->pfds[i].revents;
	struct qmp_extra_fd *x;

	switch (s->kind) {
	case QMP_SLOT_LISTEN:
		qmp__accept(q);
		break;
	case QMP_SLOT_WAKE:
		qmp__drain_wake(q);
		qmp__deliver_events(q);
		break;
	case QMP_SLOT_CLIENT:
		qmp__handle_client(q, q->clients[s->index], rev);
		break;
	case QMP_SLOT_EXTRA:
		x = &q->extra[s->index];
		if (x->used && x->gen == s->gen)
			x->cb(x->ctx, x->fd, rev);
		break;
	}
}

int qmp__poll(struct qmp *q, int timeout_ms)
{
	int n = qmp__build_pollfds(q);
	int ready = poll(q->pfds, (nfds_t)n, timeout_ms);

	if (ready < 0)
		return errno == EINTR ? 0 : -errno;
	/* Clients accepted during dispatch are appended after the ones polled,
	 * so slot indexes stay valid until qmp__reap(). */
	for (int i = 0; i < n; i++)
		if (q->pfds[i].revents)
			qmp__dispatch_slot(q, i);
	qmp__write_all(q);
	qmp__reap(q);
	return ready;
}

static bool qmp__output_pending(const struct qmp *q)
{
	for (int i = 0; i < q->nclients; i++)
		if (qmp_buf__pending(&q->clients[i]->out))
			return true;
	return false;
}

int qmp__flush(struct qmp *q, int timeout_ms)
{
	uint64_t deadline = time__now_ms() + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
	struct pollfd pfds[QMP_MAX_CLIENTS];

	qmp__deliver_events(q);
	for (;;) {
		uint64_t now;
		int n = 0;

		qmp__write_all(q);
		qmp__reap(q);
		if (!qmp__output_pending(q))
			return 0;
		now = time__now_ms();
		if (now >= deadline)
			return -ETIMEDOUT;
		for (int i = 0; i < q->nclients; i++)
			if (qmp_buf__pending(&q->clients[i]->out))
				pfds[n++] = (struct pollfd){
					.fd = q->clients[i]->fd,
					.events = POLLOUT };
		if (poll(pfds, (nfds_t)n, (int)(deadline - now)) < 0 &&
		    errno != EINTR)
			return -errno;
	}
}

void qmp__destroy(struct qmp *q)
{
	struct qmp_event *e, *next;
	struct stat st;

	if (!q)
		return;
	for (int i = 0; i < q->nclients; i++)
		qmp__client_free(q->clients[i]);
	if (q->listen_fd >= 0) {
		/* Unlink only if PATH is still our socket. */
		if (q->path && lstat(q->path, &st) == 0 &&
		    st.st_dev == q->sock_dev && st.st_ino == q->sock_ino)
			unlink(q->path);
		close(q->listen_fd);
	}
	if (q->wake_fd >= 0)
		close(q->wake_fd);
	for (e = q->ev_head; e; e = next) {
		next = e->next;
		free(e);
	}
	pthread_mutex_destroy(&q->ev_lock);
	qmp_dispatch__fini(&q->disp);
	free(q->path);
	free(q);
}

int qmp__register(struct qmp *q, const char *name, qmp_handler fn, void *ctx)
{
	return qmp_dispatch__register(&q->disp, name, fn, ctx);
}
