/* Migration URIs, connect, listen and accept; see stream.h. */
#include "mig/wire/stream.h"
#include "base/timeutil.h"
#include "base/utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define NET_UNIX_BUF (4 << 20)          /* socket buffers for unix sockets */
#define NET_BACKLOG  MIG_LISTENER_PENDING /* strays must not fill the queue */

/* Listeners poll before accept: an accept never blocks (a connection
 * reset in between is EAGAIN). */
static int net__nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	return fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 ? -errno : 0;
}

static int uri__parse_port(const char *s, uint16_t *port)
{
	unsigned long v = 0;
	if (!*s || strlen(s) > 5)
		return -EINVAL;
	for (const char *p = s; *p; p++) {
		if (*p < '0' || *p > '9')
			return -EINVAL;
		v = v * 10 + (unsigned long)(*p - '0');
	}
	if (v > 65535)
		return -EINVAL;
	*port = (uint16_t)v;
	return 0;
}

static int uri__parse_tcp(const char *rest, struct mig_uri *u, char *err, size_t errlen)
{
	const char *colon, *host = rest;
	size_t hlen;
	if (rest[0] == '[') {                   /* [IPv6]:port */
		const char *close = strchr(rest, ']');
		if (!close || close[1] != ':')
			return utf8__err(err, errlen, -EINVAL, "tcp: bad IPv6 address in '%s'", rest);
		host = rest + 1;
		hlen = (size_t)(close - host);
		colon = close + 1;
		if (hlen == 0)
			return utf8__err(err, errlen, -EINVAL, "tcp: empty IPv6 address");
	} else {
		colon = strrchr(rest, ':');
		if (!colon)
			return utf8__err(err, errlen, -EINVAL, "tcp URI needs HOST:PORT, got '%s'", rest);
		hlen = (size_t)(colon - rest);
		if (memchr(rest, ':', hlen))
			return utf8__err(err, errlen, -EINVAL, "tcp: IPv6 addresses need [brackets]");
	}
	if (hlen >= sizeof(u->host))
		return utf8__err(err, errlen, -EINVAL, "tcp: host name too long");
	for (size_t i = 0; i < hlen; i++)
		if (host[i] <= ' ' || host[i] == '/' || (unsigned char)host[i] >= 0x7f)
			return utf8__err(err, errlen, -EINVAL, "tcp: invalid character in host");
	if (uri__parse_port(colon + 1, &u->port))
		return utf8__err(err, errlen, -EINVAL, "tcp: bad port '%s' (want 0..65535)", colon + 1);
	memcpy(u->host, host, hlen);
	u->host[hlen] = 0;
	u->kind = MIG_URI_TCP;
	return 0;
}

/* exec:CMD, file:PATH, fd:NAME (a name getfd gave, or an inherited
 * descriptor's number): one argument, a command, path or name. */
static int uri__parse_local(const char *uri, struct mig_uri *u, char *err, size_t errlen)
{
	const char *colon = strchr(uri, ':');
	const char *arg = colon + 1;
	size_t len = strlen(arg);
	u->kind = uri[0] == 'e' ? MIG_URI_EXEC : uri[1] == 'i' ? MIG_URI_FILE : MIG_URI_FD;
	int scheme = (int)(colon - uri);
	if (!len)
		return utf8__err(err, errlen, -EINVAL, "%.*s: empty %s", scheme, uri,
				u->kind == MIG_URI_EXEC ? "command" : u->kind == MIG_URI_FILE ?
				"path" : "descriptor name");
	if (len >= sizeof(u->arg))
		return utf8__err(err, errlen, -EINVAL, "%.*s: too long (max %zu bytes)", scheme, uri,
				sizeof(u->arg) - 1);
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)arg[i] < ' ')
			return utf8__err(err, errlen, -EINVAL, "%.*s: control character in '%s'",
					scheme, uri, arg);
	if (u->kind == MIG_URI_FD && len >= MIG_FD_NAME_MAX)
		return utf8__err(err, errlen, -EINVAL, "fd: name too long (max %d bytes)",
				MIG_FD_NAME_MAX - 1);
	memcpy(u->arg, arg, len + 1);
	return 0;
}

int mig_uri__parse(const char *uri, struct mig_uri *u, char *err, size_t errlen)
{
	memset(u, 0, sizeof(*u));
	if (!uri)
		return utf8__err(err, errlen, -EINVAL, "no URI");
	if (strlen(uri) >= MIG_URI_MAX)
		return utf8__err(err, errlen, -EINVAL, "URI too long (max %d bytes)", MIG_URI_MAX - 1);
	if (!strncmp(uri, "tcp:", 4))
		return uri__parse_tcp(uri + 4, u, err, errlen);
	if (!strncmp(uri, "unix:", 5)) {
		const char *path = uri + 5;
		if (!*path)
			return utf8__err(err, errlen, -EINVAL, "unix: empty socket path");
		if (strlen(path) >= sizeof(u->path))
			return utf8__err(err, errlen, -EINVAL, "unix: socket path too long (max %zu)",
					sizeof(u->path) - 1);
		strcpy(u->path, path);
		u->kind = MIG_URI_UNIX;
		return 0;
	}
	if (!strncmp(uri, "exec:", 5) || !strncmp(uri, "file:", 5) || !strncmp(uri, "fd:", 3))
		return uri__parse_local(uri, u, err, errlen);
	const char *c = strchr(uri, ':');
	return utf8__err(err, errlen, -EINVAL, "unknown URI scheme '%.*s' (want tcp:, unix:, "
			"exec:, file: or fd:)", c ? (int)(c - uri) : (int)strlen(uri), uri);
}

static void net__tune(int fd, bool is_unix)
{
	/* TCP: keep the kernel's buffer auto-tuning (an explicit SO_RCVBUF
	 * would switch it off); unix sockets have none, so ask for more. */
	if (is_unix) {
		int v = NET_UNIX_BUF;
		(void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v));
		(void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v));
	}
}

static int net__unix_addr(const struct mig_uri *u, struct sockaddr_un *sa)
{
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	memcpy(sa->sun_path, u->path, strlen(u->path) + 1);
	return 0;
}

static int net__resolve(const struct mig_uri *u, bool passive, struct addrinfo **res,
			char *err, size_t errlen)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0) };
	char port[8];
	snprintf(port, sizeof(port), "%u", u->port);
	int r = getaddrinfo(u->host[0] ? u->host : NULL, port, &hints, res);
	if (r)
		return utf8__err(err, errlen, -EHOSTUNREACH, "cannot resolve '%s': %s",
				u->host, gai_strerror(r));
	return 0;
}

/* connect() on fd that gives up with -ECANCELED as soon as *cancel (may be
 * NULL) is set, checked every NET_CONNECT_SLICE_MS, and with -ETIMEDOUT
 * at deadline (time__now_ms()): a TCP peer that never answers, or a unix
 * listener whose backlog stays full, holds no one for ever. */
#define NET_CONNECT_SLICE_MS 50
static int net__connect_fd(int fd, const struct sockaddr *sa, socklen_t len,
			   const atomic_bool *cancel, uint64_t deadline)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	int e = connect(fd, sa, len) == 0 ? 0 : -errno;
	while (e == -EINPROGRESS || e == -EALREADY || e == -EINTR || e == -EAGAIN) {
		if (cancel && atomic_load(cancel)) {
			e = -ECANCELED;
			break;
		}
		if (time__now_ms() >= deadline) {
			e = -ETIMEDOUT;
			break;
		}
		if (e == -EAGAIN) {     /* unix: the listener's backlog is full */
			(void)poll(NULL, 0, NET_CONNECT_SLICE_MS);
			e = connect(fd, sa, len) == 0 ? 0 : -errno;
			continue;
		}
		struct pollfd p = { .fd = fd, .events = POLLOUT };
		if (poll(&p, 1, NET_CONNECT_SLICE_MS) > 0) {
			int so = 0;
			socklen_t sl = sizeof(so);
			e = getsockopt(fd, SOL_SOCKET, SO_ERROR, &so, &sl) < 0 ? -errno : -so;
		}
	}
	if (!e && fcntl(fd, F_SETFL, fl) < 0)
		e = -errno;
	return e;
}

static int net__connect_tcp(const struct mig_uri *u, const atomic_bool *cancel, char *err,
			    size_t errlen)
{
	struct addrinfo *res, *ai;
	int fd = -1, e = -ECONNREFUSED;
	if (!u->host[0] || u->port == 0)
		return utf8__err(err, errlen, -EINVAL, "tcp: connect needs a host and a port > 0");
	e = net__resolve(u, false, &res, err, errlen);
	if (e)
		return e;
	uint64_t deadline = time__now_ms() + MIG_CONNECT_TIMEOUT_MS; /* for all addresses */
	for (ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
		if (fd < 0) {
			e = -errno;
			continue;
		}
		net__tune(fd, false);
		e = net__connect_fd(fd, ai->ai_addr, ai->ai_addrlen, cancel, deadline);
		if (!e)
			break;
		close(fd);
		fd = -1;
		if (e == -ECANCELED || e == -ETIMEDOUT)
			break;
	}
	freeaddrinfo(res);
	if (fd < 0)
		return utf8__err(err, errlen, e, "connect to %s:%u: %s", u->host, u->port,
				strerror(-e));
	return fd;
}

static int net__connect_unix(const struct mig_uri *u, const atomic_bool *cancel, char *err,
			     size_t errlen)
{
	struct sockaddr_un sa;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return utf8__err(err, errlen, -errno, "socket: %s", strerror(errno));
	net__tune(fd, true);
	net__unix_addr(u, &sa);
	int e = net__connect_fd(fd, (struct sockaddr *)&sa, sizeof(sa), cancel,
				time__now_ms() + MIG_CONNECT_TIMEOUT_MS);
	if (e) {
		close(fd);
		return utf8__err(err, errlen, e, "connect to unix:%s: %s", u->path, strerror(-e));
	}
	return fd;
}

int mig_stream__connect(struct mig_stream *s, const char *uri, const atomic_bool *cancel,
			char *err, size_t errlen)
{
	struct mig_uri u;
	int fd = mig_uri__parse(uri, &u, err, errlen);
	if (fd)
		return fd;
	if (!mig_uri__is_socket(&u))
		return utf8__err(err, errlen, -EINVAL, "'%s' is not a tcp: or unix: URI", uri);
	fd = u.kind == MIG_URI_TCP ? net__connect_tcp(&u, cancel, err, errlen)
				   : net__connect_unix(&u, cancel, err, errlen);
	if (fd < 0)
		return fd;
	int e = mig_stream__init(s, fd);
	if (e)
		return utf8__err(err, errlen, e, "out of memory");
	s->cancel = cancel;
	return 0;
}

/* Binds a unix socket; a stale socket file (nobody listening) is replaced. */
static int net__bind_unix(int fd, const struct mig_uri *u)
{
	struct sockaddr_un sa;
	struct stat st;
	net__unix_addr(u, &sa);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
		return 0;
	if (errno != EADDRINUSE || stat(u->path, &st) || !S_ISSOCK(st.st_mode))
		return -errno;
	int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (probe < 0)
		return -errno;
	int live = connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0 || errno != ECONNREFUSED;
	close(probe);
	if (live)
		return -EADDRINUSE;
	unlink(u->path);
	return bind(fd, (struct sockaddr *)&sa, sizeof(sa)) ? -errno : 0;
}

static int net__listen_unix(struct mig_listener *l, const struct mig_uri *u, char *err,
			    size_t errlen)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return utf8__err(err, errlen, -errno, "socket: %s", strerror(errno));
	int e = net__bind_unix(fd, u);
	/* 0600 before listen(): until then a connect is refused, so nobody but
	 * the owner ever reaches the socket, whatever the umask */
	if (!e && (chmod(u->path, 0600) < 0 || listen(fd, NET_BACKLOG) < 0 ||
		   net__nonblock(fd) < 0)) {
		e = -errno;
		unlink(u->path);
	}
	if (e) {
		close(fd);
		return utf8__err(err, errlen, e, "listen on unix:%s: %s", u->path, strerror(-e));
	}
	strcpy(l->path, u->path);
	l->fd = fd;
	return 0;
}

static int net__listen_tcp(struct mig_listener *l, const struct mig_uri *u, char *err,
			   size_t errlen)
{
	struct addrinfo *res, *ai;
	int fd = -1, e = net__resolve(u, true, &res, err, errlen), one = 1;
	if (e)
		return e;
	e = -EADDRNOTAVAIL;
	for (ai = res; ai; ai = ai->ai_next) {
		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
		if (fd < 0) {
			e = -errno;
			continue;
		}
		(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, NET_BACKLOG) == 0 &&
		    net__nonblock(fd) == 0)
			break;
		e = -errno;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd < 0)
		return utf8__err(err, errlen, e, "listen on %s:%u: %s", u->host, u->port,
				strerror(-e));
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
		l->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
							 : ((struct sockaddr_in *)&ss)->sin_port);
		if (getnameinfo((struct sockaddr *)&ss, sl, l->host, sizeof(l->host), NULL, 0,
				NI_NUMERICHOST))
			l->host[0] = 0;
	}
	l->fd = fd;
	return 0;
}

int mig_listener__open(struct mig_listener *l, const char *uri, char *err, size_t errlen)
{
	struct mig_uri u;
	memset(l, 0, sizeof(*l));
	l->fd = -1;
	atomic_init(&l->shut, false);
	int e = mig_uri__parse(uri, &u, err, errlen);
	if (e)
		return e;
	if (!mig_uri__is_socket(&u))
		return utf8__err(err, errlen, -EINVAL, "'%s' is not a tcp: or unix: URI", uri);
	return u.kind == MIG_URI_TCP ? net__listen_tcp(l, &u, err, errlen)
				     : net__listen_unix(l, &u, err, errlen);
}

/* Closes pending connection i (oldest first); why: tell on_drop. */
static void listener__drop(struct mig_listener *l, unsigned i, const char *why)
{
	int fd = l->pending[i];
	l->npending--;
	memmove(&l->pending[i], &l->pending[i + 1], (l->npending - i) * sizeof(l->pending[0]));
	memmove(&l->pending_ms[i], &l->pending_ms[i + 1], (l->npending - i) * sizeof(l->pending_ms[0]));
	if (fd >= 0)
		close(fd);
	if (why && l->on_drop)
		l->on_drop(l->drop_ctx, why);
}

/* The listener is readable: one more pending connection (the oldest
 * dropped when they are MIG_LISTENER_PENDING). */
static int listener__take(struct mig_listener *l, char *err, size_t errlen)
{
	int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
	if (fd < 0) {
		if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN)
			return 0;
		int e = atomic_load(&l->shut) ? -ECANCELED : -errno;
		return utf8__err(err, errlen, e, "accept: %s", strerror(-e));
	}
	if (l->npending == MIG_LISTENER_PENDING)
		listener__drop(l, 0, "silent after connecting, and newer connections came");
	l->pending[l->npending] = fd;
	l->pending_ms[l->npending++] = time__now_ms();
	return 0;
}

/* Whether a pending connection has spoken (or closed) by now: one that
 * did while the caller was busy with another (a stray's handshake may take
 * its 10 s) is no silent one, however long it waited. */
static bool listener__has_bytes(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, 0) > 0;
}

/* Milliseconds poll may wait: until the oldest pending connection has
 * been silent too long or the deadline, at most 1 s. */
static int listener__wait_ms(const struct mig_listener *l, uint64_t now, uint64_t deadline)
{
	uint64_t until = now + 1000;
	if (l->npending && l->pending_ms[0] + MIG_LISTENER_SILENT_MS < until)
		until = l->pending_ms[0] + MIG_LISTENER_SILENT_MS;
	if (deadline && deadline < until)
		until = deadline;
	return until > now ? (int)(until - now) : 0;
}

int mig_listener__accept(struct mig_listener *l, struct mig_stream *s, uint64_t deadline_ms,
			 char *err, size_t errlen)
{
	struct pollfd p[1 + MIG_LISTENER_PENDING];
	for (;;) {
		if (atomic_load(&l->shut))
			return utf8__err(err, errlen, -ECANCELED, "listener shut down");
		uint64_t now = time__now_ms();
		while (l->npending && now - l->pending_ms[0] >= MIG_LISTENER_SILENT_MS &&
		       !listener__has_bytes(l->pending[0]))
			listener__drop(l, 0, "silent for 10 s after connecting");
		if (deadline_ms && now >= deadline_ms)
			return utf8__err(err, errlen, -ETIMEDOUT, "no connection in time");
		p[0] = (struct pollfd){ .fd = l->fd, .events = POLLIN };
		for (unsigned i = 0; i < l->npending; i++)
			p[1 + i] = (struct pollfd){ .fd = l->pending[i], .events = POLLIN };
		int r = poll(p, 1 + l->npending, listener__wait_ms(l, now, deadline_ms));
		if (r < 0 && errno != EINTR)
			return utf8__err(err, errlen, -errno, "poll: %s", strerror(errno));
		for (unsigned i = 0; r > 0 && i < l->npending; i++) {
			if (!p[1 + i].revents)
				continue;
			int fd = l->pending[i];
			l->pending[i] = -1;
			listener__drop(l, i, NULL);
			net__tune(fd, l->path[0] != 0);
			int e = mig_stream__init(s, fd);
			return e ? utf8__err(err, errlen, e, "out of memory") : 0;
		}
		if (r > 0 && p[0].revents) {
			int e = listener__take(l, err, errlen);
			if (e)
				return e;
		}
	}
}

void mig_listener__shutdown(struct mig_listener *l)
{
	atomic_store(&l->shut, true);
	if (l->fd >= 0)
		shutdown(l->fd, SHUT_RDWR);
}

void mig_listener__close(struct mig_listener *l)
{
	while (l->npending)
		listener__drop(l, 0, NULL);
	if (l->fd >= 0)
		close(l->fd);
	l->fd = -1;
	if (l->path[0])
		unlink(l->path);
	l->path[0] = 0;
}
