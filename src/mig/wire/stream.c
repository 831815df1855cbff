/* Migration stream: buffered blocking I/O with a sticky error; see stream.h. */
#include "mig/wire/stream.h"
#include "base/utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <gnutls/gnutls.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <linux/sockios.h>

#include "base/timeutil.h"

#define STREAM_BURST_NS   20000000ull   /* idle time credited: 20 ms of sending */
#define STREAM_SLICE_NS   20000000ull   /* a normal send goes in slices of 20 ms */
#define STREAM_MIN_CHUNK  8192ull       /* smallest slice: a page and its record header */
#define STREAM_MAX_SLEEP  50000000ull   /* re-check rate/shutdown every 50 ms */

int mig_stream__init(struct mig_stream *s, int fd)
{
	struct stat st;
	memset(s, 0, sizeof(*s));
	s->fd = fd;
	bool known = fstat(fd, &st) == 0;
	s->is_socket = known && S_ISSOCK(st.st_mode);
	/* a pipe may stall for ever (exec:'s command does not read): its
	 * waits poll, so that a cancel ends them */
	s->is_pipe = known && S_ISFIFO(st.st_mode);
	int fl = s->is_pipe ? fcntl(fd, F_GETFL) : 0;
	if (fl < 0 || (s->is_pipe && fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0))
		s->is_pipe = false;
	atomic_init(&s->err, 0);
	atomic_init(&s->shut, false);
	atomic_init(&s->rate, 0);
	atomic_init(&s->bytes_out, 0);
	atomic_init(&s->bytes_in, 0);
	s->wbuf = malloc(MIG_STREAM_WBUF);
	s->rbuf = malloc(MIG_STREAM_RBUF);
	if (!s->wbuf || !s->rbuf || pthread_mutex_init(&s->err_lock, NULL)) {
		free(s->wbuf);
		free(s->rbuf);
		close(fd);
		s->fd = -1;
		s->wbuf = s->rbuf = NULL;
		return -ENOMEM;
	}
	return 0;
}

void mig_stream__close(struct mig_stream *s)
{
	if (s->tls)
		gnutls_deinit(s->tls);
	s->tls = NULL;
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
	mig_stream__reap(s);
	if (s->wbuf || s->rbuf)
		pthread_mutex_destroy(&s->err_lock);
	free(s->wbuf);
	free(s->rbuf);
	s->wbuf = s->rbuf = NULL;
}

void mig_stream__move(struct mig_stream *to, struct mig_stream *from)
{
	memcpy(to, from, sizeof(*to));
	pthread_mutex_destroy(&from->err_lock);
	pthread_mutex_init(&to->err_lock, NULL);
	if (to->tls)            /* its transport names the struct */
		gnutls_transport_set_ptr(to->tls, to);
	memset(from, 0, sizeof(*from));
	from->fd = -1;
}

int mig_stream__error(struct mig_stream *s)
{
	return atomic_load_explicit(&s->err, memory_order_acquire);
}

const char *mig_stream__strerror(struct mig_stream *s)
{
	return mig_stream__error(s) ? s->errmsg : "";
}

static int stream__vfail(struct mig_stream *s, int err, const char *fmt, va_list ap)
{
	if (err >= 0)
		err = -EIO;
	pthread_mutex_lock(&s->err_lock);
	if (!atomic_load_explicit(&s->err, memory_order_relaxed)) {
		vsnprintf(s->errmsg, sizeof(s->errmsg), fmt, ap);
		utf8__sanitize(s->errmsg);
		atomic_store_explicit(&s->err, err, memory_order_release);
	}
	pthread_mutex_unlock(&s->err_lock);
	return mig_stream__error(s);
}

int mig_stream__fail(struct mig_stream *s, int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int r = stream__vfail(s, err, fmt, ap);
	va_end(ap);
	return r;
}

/* Error of a failed read/write (what == NULL: EOF).  Shutdown wins over
 * whatever the interrupted call produced. */
static int stream__io_fail(struct mig_stream *s, int err, const char *what)
{
	if (atomic_load(&s->shut))
		return mig_stream__fail(s, -ECANCELED, "stream shut down (cancelled)");
	if (!what && !s->is_socket)
		return mig_stream__fail(s, -ECONNRESET, "the stream ended early (end of file "
					"or pipe)");
	if (!what)
		return mig_stream__fail(s, -ECONNRESET, "connection closed by peer");
	return mig_stream__fail(s, err, "%s: %s", what, strerror(-err));
}

void mig_stream__set_rate(struct mig_stream *s, uint64_t bytes_per_sec)
{
	atomic_store(&s->rate, bytes_per_sec);
}

uint64_t mig_stream__rate(struct mig_stream *s)
{
	return atomic_load(&s->rate);
}

uint64_t mig_stream__bytes_out(struct mig_stream *s)
{
	return atomic_load_explicit(&s->bytes_out, memory_order_relaxed);
}

uint64_t mig_stream__bytes_in(struct mig_stream *s)
{
	return atomic_load_explicit(&s->bytes_in, memory_order_relaxed);
}

uint64_t mig_stream__consumed(struct mig_stream *s)
{
	return mig_stream__bytes_in(s) - (s->rlen - s->rpos);
}

void mig_stream__set_read_deadline(struct mig_stream *s, uint64_t deadline_ms)
{
	atomic_store(&s->read_deadline_ms, deadline_ms);
}

void mig_stream__shutdown(struct mig_stream *s)
{
	atomic_store(&s->shut, true);
	if (s->is_socket)
		shutdown(s->fd, SHUT_RDWR);
	mig_stream__fail(s, -ECANCELED, "stream shut down (cancelled)");
}

int mig_stream__set_nodelay(struct mig_stream *s, bool on)
{
	int v = on;
	if (!s->is_socket)
		return 0;
	if (setsockopt(s->fd, IPPROTO_TCP, TCP_NODELAY, &v, sizeof(v)) == 0)
		return 0;
	return errno == EOPNOTSUPP || errno == ENOPROTOOPT ? 0 : -errno;
}

int mig_stream__outq(struct mig_stream *s, size_t *bytes)
{
	int q = 0;
	if (!s->is_socket)
		return -ENOTSOCK;
	if (ioctl(s->fd, SIOCOUTQ, &q) < 0)
		return -errno;
	*bytes = q > 0 ? (size_t)q : 0;
	return 0;
}

int mig_stream__unsent(struct mig_stream *s, size_t *bytes)
{
	int rc = mig_stream__outq(s, bytes);
	if (!rc)
		*bytes += s->wlen;
	return rc;
}

/* Rate limiter: a virtual clock (s->rate_clock_ns) says when the bytes
 * sent so far are due at the configured rate.  A normal send waits until
 * the clock has caught up with now, then goes (at most one slice of
 * STREAM_SLICE_NS) and moves the clock on by its own send time; an urgent
 * send (mig_stream__set_urgent) goes at once and moves the clock all the
 * same, so the sends after it wait for it.  Idle time is credited up to
 * STREAM_BURST_NS, so the time a migration spends syncing or scanning
 * between sends is not lost bandwidth, without allowing long bursts. */

static bool stream__limited(struct mig_stream *s, uint64_t *rate)
{
	*rate = atomic_load_explicit(&s->rate, memory_order_relaxed);
	return *rate && !atomic_load(&s->shut);
}

static size_t stream__slice(uint64_t rate)
{
	uint64_t n = rate * STREAM_SLICE_NS / 1000000000ull;
	return n > STREAM_MIN_CHUNK ? (size_t)n : (size_t)STREAM_MIN_CHUNK;
}

/* Sleeps until the bytes sent so far are due (or the limit is lifted, or
 * the stream shut down), in steps of STREAM_MAX_SLEEP that look again. */
static void stream__wait_due(struct mig_stream *s)
{
	uint64_t rate;
	for (uint64_t now = time__now_ns(); s->rate_clock_ns > now; now = time__now_ns()) {
		uint64_t wait = s->rate_clock_ns - now;
		time__sleep_ns(wait < STREAM_MAX_SLEEP ? wait : STREAM_MAX_SLEEP);
		if (!stream__limited(s, &rate))
			return;
	}
}

/* Moves the clock on by the send time of n bytes at rate. */
static void stream__charge(struct mig_stream *s, size_t n, uint64_t rate)
{
	uint64_t now = time__now_ns();
	uint64_t floor = now > STREAM_BURST_NS ? now - STREAM_BURST_NS : 0;
	if (s->rate_clock_ns < floor)
		s->rate_clock_ns = floor;
	s->rate_clock_ns += (uint64_t)n * 1000000000ull / rate;
}

/* Waits as the limit wants and charges the clock; returns how many of
 * `want` bytes to send now (all of them when urgent or unlimited). */
static size_t stream__throttle(struct mig_stream *s, size_t want)
{
	uint64_t rate;
	if (!stream__limited(s, &rate))
		return want;
	if (!s->urgent) {
		stream__wait_due(s);
		if (!stream__limited(s, &rate))
			return want;
		size_t slice = stream__slice(rate);
		want = want < slice ? want : slice;
	}
	stream__charge(s, want, rate);
	return want;
}

size_t mig_stream__throttle(struct mig_stream *s, size_t want)
{
	return stream__throttle(s, want);
}

void mig_stream__set_urgent(struct mig_stream *s, bool on)
{
	s->urgent = on;
}

void mig_stream__charge(struct mig_stream *s, size_t n)
{
	uint64_t rate;
	if (n && stream__limited(s, &rate))
		stream__charge(s, n, rate);
}

uint64_t mig_stream__due_ns(struct mig_stream *s)
{
	uint64_t rate, now = time__now_ns();
	if (!stream__limited(s, &rate) || s->rate_clock_ns <= now)
		return 0;
	return s->rate_clock_ns - now;
}

size_t mig_stream__slice_bytes(struct mig_stream *s)
{
	uint64_t rate;
	return stream__limited(s, &rate) ? stream__slice(rate) : SIZE_MAX;
}

/* A failed TLS record call: the stream's own error if the transport set
 * one (deadline, cancel), shutdown, EOF, or GnuTLS's reason. */
static int stream__tls_fail(struct mig_stream *s, ssize_t r, const char *what)
{
	int e = mig_stream__error(s);
	if (e)
		return e;
	if (atomic_load(&s->shut))
		return stream__io_fail(s, -ECANCELED, what);
	if (r == 0 || r == GNUTLS_E_PREMATURE_TERMINATION)
		return stream__io_fail(s, -ECONNRESET, NULL);
	if (r == GNUTLS_E_FATAL_ALERT_RECEIVED)
		return mig_stream__fail(s, -ECONNABORTED, "TLS %s: the peer ended the session: %s",
					what, gnutls_alert_get_name(gnutls_alert_get(s->tls)));
	int sys = r == GNUTLS_E_PUSH_ERROR ? s->tls_push_errno :
		  r == GNUTLS_E_PULL_ERROR ? s->tls_pull_errno : 0;
	if (sys)                /* the socket's own error: EPIPE, ECONNRESET, ... */
		return stream__io_fail(s, -sys, what);
	return mig_stream__fail(s, -ECONNABORTED, "TLS %s: %s", what, gnutls_strerror((int)r));
}

static ssize_t stream__send_some(struct mig_stream *s, const uint8_t *p, size_t n)
{
	if (s->tls) {
		ssize_t r = gnutls_record_send(s->tls, p, n);
		return r < 0 ? stream__tls_fail(s, r, "write") : r;
	}
	ssize_t r = s->is_socket ? send(s->fd, p, n, MSG_NOSIGNAL) : write(s->fd, p, n);
	return r < 0 ? -errno : r;
}

/* A pipe (non-blocking) that cannot take more: waits until it can, or
 * the stream is shut down.  0 or the sticky error. */
#define STREAM_PIPE_SLICE_MS 100
static int stream__wait_pipe(struct mig_stream *s, short events)
{
	for (;;) {
		if (atomic_load(&s->shut))
			return mig_stream__fail(s, -ECANCELED, "stream shut down (cancelled)");
		struct pollfd p = { .fd = s->fd, .events = events };
		int r = poll(&p, 1, STREAM_PIPE_SLICE_MS);
		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return stream__io_fail(s, -errno, "poll");
	}
}

/* Sends all n bytes (a send may take fewer; a TLS record at most 16 KiB). */
static int stream__send_chunk(struct mig_stream *s, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t r = stream__send_some(s, p, n);
		if (r < 0) {
			if (s->tls)
				return (int)r;
			if (r == -EINTR)
				continue;
			if (r == -EAGAIN && s->is_pipe) {
				int e = stream__wait_pipe(s, POLLOUT);
				if (e)
					return e;
				continue;
			}
			return stream__io_fail(s, (int)r, "write");
		}
		if (r == 0)
			return stream__io_fail(s, -EPIPE, "write");
		atomic_fetch_add_explicit(&s->bytes_out, (uint64_t)r, memory_order_relaxed);
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

/* The rate limiter is charged once per chunk, for the whole chunk. */
static int stream__send_all(struct mig_stream *s, const uint8_t *p, size_t len)
{
	while (len) {
		size_t chunk = stream__throttle(s, len);
		int e = stream__send_chunk(s, p, chunk);
		if (e)
			return e;
		p += chunk;
		len -= chunk;
	}
	return 0;
}

int mig_stream__flush(struct mig_stream *s)
{
	int e = mig_stream__error(s);
	if (e)
		return e;
	size_t n = s->wlen;
	s->wlen = 0;
	return n ? stream__send_all(s, s->wbuf, n) : 0;
}

int mig_stream__reply(struct mig_stream *s, const void *buf, size_t len)
{
	int e = mig_stream__error(s);
	if (e && e != -EPROTO && e != -EMSGSIZE && e != -ENOLINK)
		return e;
	if (!e && s->wlen && (e = mig_stream__flush(s)))
		return e;
	return stream__send_all(s, buf, len);
}

int mig_stream__write(struct mig_stream *s, const void *buf, size_t len)
{
	int e = mig_stream__error(s);
	if (e)
		return e;
	if (len > MIG_STREAM_WBUF - s->wlen) {
		e = mig_stream__flush(s);
		if (e)
			return e;
		if (len >= MIG_STREAM_WBUF)
			return stream__send_all(s, buf, len);
	}
	memcpy(s->wbuf + s->wlen, buf, len);
	s->wlen += len;
	return 0;
}

/* Waits until the fd is readable or the read deadline passes (or, with
 * a deadline, the connect's cancel flag is set). */
static int stream__wait_readable(struct mig_stream *s)
{
	uint64_t deadline = atomic_load(&s->read_deadline_ms);
	if (!deadline && s->is_pipe)
		return stream__wait_pipe(s, POLLIN);
	for (;;) {
		if (!deadline)
			return 0;
		uint64_t now = time__now_ms();
		if (now >= deadline)
			return stream__io_fail(s, -ETIMEDOUT, "read");
		if (s->cancel && atomic_load(s->cancel))
			return mig_stream__fail(s, -ECANCELED, "stream shut down (cancelled)");
		uint64_t slice = s->cancel ? 100 : 1000;
		struct pollfd p = { .fd = s->fd, .events = POLLIN };
		int r = poll(&p, 1, (int)(deadline - now < slice ? deadline - now : slice));
		if (r > 0)
			return 0;
		if (r < 0 && errno != EINTR)
			return stream__io_fail(s, -errno, "poll");
		if (atomic_load(&s->shut))
			return 0;               /* the read then reports the shutdown */
	}
}

/* One TLS record read into p (the transport waits under the deadline). */
static int stream__tls_read_some(struct mig_stream *s, uint8_t *p, size_t cap, size_t *got)
{
	for (;;) {
		ssize_t r = gnutls_record_recv(s->tls, p, cap);
		if (r > 0) {
			atomic_fetch_add_explicit(&s->bytes_in, (uint64_t)r, memory_order_relaxed);
			*got = (size_t)r;
			return 0;
		}
		if (r != GNUTLS_E_AGAIN && r != GNUTLS_E_INTERRUPTED)
			return stream__tls_fail(s, r, "read");
	}
}

/* One read(2) into p; 0 on success with *got > 0, or the sticky error. */
static int stream__read_some(struct mig_stream *s, uint8_t *p, size_t cap, size_t *got)
{
	if (s->tls)
		return stream__tls_read_some(s, p, cap, got);
	for (;;) {
		int e = stream__wait_readable(s);
		if (e)
			return e;
		ssize_t r = read(s->fd, p, cap);
		if (r > 0) {
			atomic_fetch_add_explicit(&s->bytes_in, (uint64_t)r, memory_order_relaxed);
			*got = (size_t)r;
			return 0;
		}
		if (r == 0)
			return stream__io_fail(s, -ECONNRESET, NULL);
		if (errno == EAGAIN && s->is_pipe && atomic_load(&s->shut))
			return mig_stream__fail(s, -ECANCELED, "stream shut down (cancelled)");
		if (errno != EINTR && (errno != EAGAIN || !s->is_pipe))
			return stream__io_fail(s, -errno, "read");
	}
}

int mig_stream__read_full(struct mig_stream *s, void *buf, size_t len)
{
	uint8_t *p = buf;
	int e = mig_stream__error(s);
	if (e)
		return e;
	while (len) {
		size_t have = s->rlen - s->rpos, got;
		if (have) {
			size_t n = have < len ? have : len;
			memcpy(p, s->rbuf + s->rpos, n);
			s->rpos += n;
			p += n;
			len -= n;
			continue;
		}
		if (len >= MIG_STREAM_RBUF) {   /* large: read straight into buf */
			e = stream__read_some(s, p, len, &got);
			if (e)
				return e;
			p += got;
			len -= got;
			continue;
		}
		e = stream__read_some(s, s->rbuf, MIG_STREAM_RBUF, &got);
		if (e)
			return e;
		s->rpos = 0;
		s->rlen = got;
	}
	return 0;
}

int mig_stream__peek(struct mig_stream *s, void *buf, size_t len)
{
	int e = mig_stream__error(s);
	if (e || len > MIG_STREAM_RBUF)
		return e ? e : -EINVAL;
	if (s->rpos) {                  /* what is buffered to the front */
		memmove(s->rbuf, s->rbuf + s->rpos, s->rlen - s->rpos);
		s->rlen -= s->rpos;
		s->rpos = 0;
	}
	while (s->rlen < len) {
		size_t got;
		e = stream__read_some(s, s->rbuf + s->rlen, MIG_STREAM_RBUF - s->rlen, &got);
		if (e)
			return e;
		s->rlen += got;
	}
	memcpy(buf, s->rbuf, len);
	return 0;
}

int mig_stream__put_record(struct mig_stream *s, uint32_t type, uint32_t flags,
			   const void *payload, size_t len)
{
	uint8_t h[PROTO_HDR_SIZE];
	if (len > PROTO_MAX_PAYLOAD || (len && !payload))
		return -EINVAL;
	if (proto__encode_header(h, sizeof(h), type, flags, len))
		return -EINVAL;
	int e = mig_stream__write(s, h, sizeof(h));
	if (!e && len)
		e = mig_stream__write(s, payload, len);
	return e;
}

int mig_stream__get_record(struct mig_stream *s, struct proto_hdr *hdr, void *buf,
			   size_t cap)
{
	uint8_t h[PROTO_HDR_SIZE];
	int e = mig_stream__read_full(s, h, sizeof(h));
	if (e)
		return e;
	if (proto__decode_header(h, sizeof(h), hdr)) {
		return mig_stream__fail(s, -EPROTO,
			"bad record header (type %u flags 0x%x length %llu): %s",
			hdr->type, hdr->flags, (unsigned long long)hdr->length,
			proto__header_problem(hdr));
	}
	if (hdr->length > cap) {
		return mig_stream__fail(s, -EMSGSIZE,
			"%s record of %llu bytes exceeds the buffer (%zu)",
			proto__type_name(hdr->type), (unsigned long long)hdr->length, cap);
	}
	return mig_stream__read_full(s, buf, (size_t)hdr->length);
}

/* ---- GnuTLS transport: the session's raw I/O on s's socket ---- */

static ssize_t stream__tls_push(gnutls_transport_ptr_t ptr, const void *buf, size_t len)
{
	struct mig_stream *s = ptr;
	for (;;) {
		ssize_t r = send(s->fd, buf, len, MSG_NOSIGNAL);
		if (r < 0 && errno != EINTR)
			s->tls_push_errno = errno;
		if (r >= 0 || errno != EINTR)
			return r;       /* GnuTLS reads errno itself */
	}
}

static ssize_t stream__tls_pull(gnutls_transport_ptr_t ptr, void *buf, size_t len)
{
	struct mig_stream *s = ptr;
	if (stream__wait_readable(s)) {         /* deadline or cancel: error is set */
		errno = EIO;
		return -1;
	}
	for (;;) {
		ssize_t r = recv(s->fd, buf, len, 0);
		if (r < 0 && errno != EINTR)
			s->tls_pull_errno = errno;
		if (r >= 0 || errno != EINTR)
			return r;       /* GnuTLS reads errno itself */
	}
}

void mig_stream__attach_tls(struct mig_stream *s, void *session)
{
	gnutls_session_t ses = session;
	s->tls = ses;
	gnutls_transport_set_ptr(ses, s);
	gnutls_transport_set_push_function(ses, stream__tls_push);
	gnutls_transport_set_pull_function(ses, stream__tls_pull);
}

/* ---- the source's look at the return path ---- */

static bool stream__whole_record(const uint8_t *buf, size_t n)
{
	struct proto_hdr h;
	return n >= PROTO_HDR_SIZE && !proto__decode_header(buf, n, &h) &&
	       h.length <= n - PROTO_HDR_SIZE;
}

/* Up to cap bytes the peer has sent, within timeout_ms: buffered bytes
 * first, then one read (plain), or TLS records until a whole record is
 * in, each under a 1 s deadline. */
static size_t stream__take(struct mig_stream *s, uint8_t *buf, size_t cap, int timeout_ms)
{
	size_t got = s->rlen - s->rpos < cap ? s->rlen - s->rpos : cap;
	memcpy(buf, s->rbuf + s->rpos, got);
	s->rpos += got;
	bool pending = s->tls && gnutls_record_check_pending(s->tls);
	struct pollfd p = { .fd = s->fd, .events = POLLIN };
	if (stream__whole_record(buf, got) ||
	    (!pending && (poll(&p, 1, timeout_ms) <= 0 || !(p.revents & POLLIN))))
		return got;
	if (!s->tls) {
		ssize_t n = recv(s->fd, buf + got, cap - got, MSG_DONTWAIT);
		return got + (n > 0 ? (size_t)n : 0);
	}
	uint64_t old = atomic_load(&s->read_deadline_ms);
	atomic_store(&s->read_deadline_ms, time__now_ms() + 1000);
	while (got < cap && !stream__whole_record(buf, got)) {
		ssize_t n = gnutls_record_recv(s->tls, buf + got, cap - got);
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	atomic_store(&s->read_deadline_ms, old);
	return got;
}

/* Puts the n bytes stream__take gave back in front of what is still
 * buffered (n + the rest fit: take reads only when it emptied the buffer). */
static void stream__untake(struct mig_stream *s, const uint8_t *buf, size_t n)
{
	size_t rest = s->rlen - s->rpos;
	if (!n || n + rest > MIG_STREAM_RBUF)
		return;
	memmove(s->rbuf + n, s->rbuf + s->rpos, rest);
	memcpy(s->rbuf, buf, n);
	s->rpos = 0;
	s->rlen = n + rest;
}

int mig_stream__peek_answer(struct mig_stream *s, int timeout_ms, struct proto_hdr *hdr,
			    const uint8_t **payload, uint8_t *buf, size_t cap)
{
	if (!mig_stream__two_way(s))
		return 0;       /* a pipe or a file: nobody answers on it */
	size_t n = stream__take(s, buf, cap < MIG_STREAM_RBUF ? cap : MIG_STREAM_RBUF, timeout_ms);
	if (!stream__whole_record(buf, n) || proto__decode_header(buf, n, hdr)) {
		stream__untake(s, buf, n);
		return 0;
	}
	*payload = buf + PROTO_HDR_SIZE;
	return 1;
}
