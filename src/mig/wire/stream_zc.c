/* Zero-copy sends on a TCP stream: MSG_ZEROCOPY and its completions
 * (mig/wire/stream.h). */
#include "mig/wire/stream.h"
#include "base/timeutil.h"

#include <errno.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>

#define ZC_IOV_MAX    64                 /* iovecs per sendmsg */
#define ZC_WAIT_MS    50                 /* re-check shutdown this often */
#define ZC_NOBUFS_TRIES 20               /* ENOBUFS with nothing in flight: 1 s, then fail */

int mig_stream__zc_enable(struct mig_stream *s)
{
	int one = 1;
	if (s->tls || !s->is_socket)
		return -EOPNOTSUPP;
	if (setsockopt(s->fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof(one)))
		return -errno;
	s->zc = true;
	return 0;
}

/* One completion notice from the error queue, if any (wait: up to
 * ZC_WAIT_MS for one).  1 taken, 0 none, or the sticky error. */
static int zc__reap_one(struct mig_stream *s, bool wait)
{
	char ctl[CMSG_SPACE(sizeof(struct sock_extended_err) + sizeof(struct sockaddr_in6))];
	struct msghdr msg = { .msg_control = ctl, .msg_controllen = sizeof(ctl) };
	struct pollfd p = { .fd = s->fd, .events = 0 };   /* POLLERR: the queue */
	if (wait && poll(&p, 1, ZC_WAIT_MS) < 0 && errno != EINTR)
		return mig_stream__fail(s, -errno, "zero-copy: poll: %s", strerror(errno));
	if (recvmsg(s->fd, &msg, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) {
		if (errno != EAGAIN && errno != EINTR)
			return mig_stream__fail(s, -errno, "zero-copy: reading completions: %s",
						strerror(errno));
		/* a socket hung up wakes poll at once, with no notice yet */
		if (wait && (p.revents & (POLLHUP | POLLNVAL)))
			time__sleep_ns(10000000);
		return 0;
	}
	if (msg.msg_flags & MSG_CTRUNC)
		return mig_stream__fail(s, -EIO, "zero-copy: a completion notice cut short");
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
		if (!((c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR) ||
		      (c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_RECVERR)) ||
		    c->cmsg_len < CMSG_LEN(sizeof(struct sock_extended_err)))
			continue;
		struct sock_extended_err e;
		memcpy(&e, CMSG_DATA(c), sizeof(e));
		if (e.ee_origin != SO_EE_ORIGIN_ZEROCOPY)
			return mig_stream__fail(s, e.ee_errno ? -(int)e.ee_errno : -EIO,
						"zero-copy: socket error: %s",
						strerror(e.ee_errno ? (int)e.ee_errno : EIO));
		if (e.ee_errno || e.ee_data - e.ee_info >= s->zc_sent - s->zc_done)
			return mig_stream__fail(s, -EIO, "zero-copy: a completion for sends "
						"%u..%u, %u outstanding", e.ee_info, e.ee_data,
						s->zc_sent - s->zc_done);
		s->zc_done += e.ee_data - e.ee_info + 1;
		if (e.ee_code & SO_EE_CODE_ZEROCOPY_COPIED)
			s->zc_copied = true;
		return 1;
	}
	return 0;
}

/* A cancel (shutdown) or the stream's sticky error: what ends a wait. */
static int zc__stopped(struct mig_stream *s)
{
	if (atomic_load(&s->shut))
		return mig_stream__fail(s, -ECANCELED, "stream shut down (cancelled)");
	return mig_stream__error(s);
}

/* Takes the completions already there, without waiting. */
static int zc__reap(struct mig_stream *s)
{
	int r;
	while ((r = zc__reap_one(s, false)) > 0)
		;
	return r;
}

/* At most `limit` bytes of iov[0..n) as the sendmsg vector v; their count. */
static int zc__slice(const struct iovec *iov, int n, size_t limit, struct iovec *v,
		     size_t *bytes)
{
	int k = 0;
	*bytes = 0;
	for (; k < n && k < ZC_IOV_MAX && *bytes < limit; k++) {
		v[k] = iov[k];
		if (v[k].iov_len > limit - *bytes)
			v[k].iov_len = limit - *bytes;
		*bytes += v[k].iov_len;
	}
	return k;
}

int mig_stream__zc_write(struct mig_stream *s, const struct iovec *iov, int iovcnt)
{
	struct iovec cur[ZC_IOV_MAX], v[ZC_IOV_MAX];
	int e = mig_stream__flush(s);     /* what is buffered goes first */
	if (e)
		return e;
	if (!s->zc)
		return mig_stream__fail(s, -EINVAL, "zero-copy: not enabled on this stream");
	unsigned nobufs = 0;
	size_t allow = 0;                  /* bytes the rate limit let go, not sent yet */
	while (iovcnt > 0) {
		int n = iovcnt < ZC_IOV_MAX ? iovcnt : ZC_IOV_MAX;
		memcpy(cur, iov, (size_t)n * sizeof(*iov));
		iov += n;
		iovcnt -= n;
		for (int i = 0; i < n;) {
			if (!allow) {
				size_t left = 0;
				for (int k = i; k < n; k++)
					left += cur[k].iov_len;
				if ((e = zc__stopped(s)))
					return e;
				allow = mig_stream__throttle(s, left);
			}
			size_t bytes;
			struct msghdr msg = { .msg_iov = v };
			msg.msg_iovlen = (size_t)zc__slice(cur + i, n - i, allow, v, &bytes);
			ssize_t r = sendmsg(s->fd, &msg, MSG_ZEROCOPY | MSG_NOSIGNAL);
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0 && errno == ENOBUFS) {
				/* too many notices held (take them), or the pages
				 * cannot be pinned: with nothing in flight no notice
				 * comes, so that ends */
				if ((e = zc__stopped(s)))
					return e;
				if (s->zc_sent == s->zc_done && ++nobufs > ZC_NOBUFS_TRIES)
					return mig_stream__fail(s, -ENOBUFS, "zero-copy: the kernel "
								"cannot pin the pages to send "
								"(RLIMIT_MEMLOCK, `ulimit -l`, too "
								"small?)");
				if ((e = zc__reap_one(s, true)) < 0)
					return e;
				continue;
			}
			nobufs = 0;
			if (r <= 0)
				return mig_stream__fail(s, r ? -errno : -EPIPE, "write: %s",
							r ? strerror(errno) : "connection closed");
			s->zc_sent++;
			allow -= (size_t)r;
			atomic_fetch_add_explicit(&s->bytes_out, (uint64_t)r, memory_order_relaxed);
			for (size_t left = (size_t)r; left;) {   /* past what went */
				size_t take = left < cur[i].iov_len ? left : cur[i].iov_len;
				cur[i].iov_base = (uint8_t *)cur[i].iov_base + take;
				cur[i].iov_len -= take;
				left -= take;
				if (!cur[i].iov_len)
					i++;
			}
			while (i < n && !cur[i].iov_len)
				i++;
			if ((e = zc__reap(s)) < 0)
				return e;
		}
	}
	return 0;
}

int mig_stream__zc_flush(struct mig_stream *s, bool *copied)
{
	int e = mig_stream__flush(s);
	*copied = false;
	if (e)
		return e;
	while (s->zc_done != s->zc_sent) {
		if ((e = zc__stopped(s)) || (e = zc__reap_one(s, true)) < 0)
			return e;
	}
	*copied = s->zc_copied;
	s->zc_copied = false;
	return 0;
}
