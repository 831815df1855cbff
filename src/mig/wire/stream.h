/* Migration stream: blocking I/O on a socket with a sticky error.
 *
 * A struct mig_stream owns one file descriptor (normally a TCP or unix
 * stream socket; pipes and files work too).  Writes are buffered
 * (256 KiB) and optionally rate limited; reads are buffered (64 KiB) and
 * exact.  The first error is kept ("sticky"): every later call returns it
 * without doing I/O, so a run of writes needs one check at the end.
 * Errors are -errno; mig_stream__strerror() says what happened:
 *   -ECONNRESET  peer closed the connection (EOF on read)
 *   -ECANCELED   mig_stream__shutdown() was called
 *   -EPROTO      a record header was invalid (get_record)
 *   -EMSGSIZE    a record was larger than the caller's buffer (get_record)
 *   other        the errno of the failed read/write/send
 *
 * With TLS (mig_stream__attach_tls) the same holds for the plaintext:
 * byte counters and the rate limit count what the caller writes and
 * reads, not the record overhead (about 0.2 %).
 *
 * Threads: one thread may write (write/flush/put_record) while one other
 * thread reads (read_full/get_record) on the same stream, also with TLS
 * (GnuTLS allows one sender and one receiver per session; tls.h's
 * sessions never update their keys and refuse the peer's key updates,
 * whose handling in a read touches the writer's key state too).
 * set_rate, slice_bytes, shutdown, error,
 * strerror and the byte counters may be called from any thread.
 * init/close must not race with anything.
 */
#ifndef KMIG_MIG_STREAM_H
#define KMIG_MIG_STREAM_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "base/log.h"
#include "mig/wire/proto.h"

#define MIG_STREAM_WBUF (256u << 10)
#define MIG_STREAM_RBUF (64u << 10)

struct mig_stream {
	int fd;
	bool is_socket;
	bool is_pipe;                   /* a FIFO: non-blocking, waits poll for shutdown */
	pid_t child;                    /* exec:'s command, 0 = none (stream_local.c) */
	atomic_int err;                 /* 0 or the first -errno */
	atomic_bool shut;               /* shutdown requested */
	pthread_mutex_t err_lock;       /* serialises setting err + errmsg */
	char errmsg[192];               /* written once, before err is set */
	/* writer side */
	uint8_t *wbuf;
	size_t wlen;
	_Atomic uint64_t rate;          /* bytes per second, 0 = unlimited */
	uint64_t rate_clock_ns;         /* rate limiter: when the bytes sent so far are due */
	bool urgent;                    /* sends skip the limiter's wait (still charged) */
	/* reader side */
	uint8_t *rbuf;
	size_t rpos, rlen;
	_Atomic uint64_t bytes_out, bytes_in;
	_Atomic uint64_t read_deadline_ms; /* time__now_ms() limit of reads, 0 = none */
	const atomic_bool *cancel;      /* from connect: ends reads under a deadline */
	void *tls;                      /* GnuTLS session (mig/wire/tls.h), NULL = plain */
	int tls_push_errno, tls_pull_errno; /* the socket's errno of a failed TLS write / read */
	/* zero-copy sends (stream_zc.c), writer's thread only */
	bool zc;                        /* SO_ZEROCOPY set */
	uint32_t zc_sent, zc_done;      /* MSG_ZEROCOPY sends made, and completed */
	bool zc_copied;                 /* a completion since the last flush said: copied */
};

/* Takes ownership of fd (closed by mig_stream__close, also when init
 * fails).  0 or -ENOMEM. */
int mig_stream__init(struct mig_stream *s, int fd) KMIG_MUST_CHECK;
/* Closes the fd and frees the buffers.  Does not flush. */
void mig_stream__close(struct mig_stream *s);

/* Moves an open stream, its unread buffered bytes with it, from one
 * struct into another (to uninitialised or closed); from is left closed.
 * Neither may be in use by another thread. */
void mig_stream__move(struct mig_stream *to, struct mig_stream *from);

/* 0 or the sticky error; message "" when there is none. */
int mig_stream__error(struct mig_stream *s);
const char *mig_stream__strerror(struct mig_stream *s);
/* Sets the sticky error (err < 0) unless one is set already, with a
 * printf-style message; returns the sticky error now in force. */
int mig_stream__fail(struct mig_stream *s, int err, const char *fmt, ...) KMIG_PRINTF(3, 4);

/* Buffered write of len bytes; may send (and sleep for the rate limit). */
int mig_stream__write(struct mig_stream *s, const void *buf, size_t len) KMIG_MUST_CHECK;
/* The source's look at the return path, also after a write error is
 * sticky (the destination gave up and may have said why): waits up to
 * timeout_ms for bytes from the peer and takes one record's worth, read
 * through TLS when the stream has it (never the raw socket then: only
 * authenticated bytes count).  1 with *hdr and *payload (inside buf) when
 * a whole record arrived, else 0; the bytes of a record not whole yet
 * stay buffered for the next look (or mig_stream__get_record), so a
 * reason that arrives in parts is read whole.  cap at most
 * MIG_STREAM_RBUF.  Does not change the sticky error, except that a TLS
 * record that stops halfway for 1 s sets -ETIMEDOUT. */
int mig_stream__peek_answer(struct mig_stream *s, int timeout_ms, struct proto_hdr *hdr,
			    const uint8_t **payload, uint8_t *buf, size_t cap) KMIG_MUST_CHECK;
/* Sends everything buffered. */
int mig_stream__flush(struct mig_stream *s) KMIG_MUST_CHECK;
/* Reads exactly len bytes; EOF before that is -ECONNRESET. */
int mig_stream__read_full(struct mig_stream *s, void *buf, size_t len) KMIG_MUST_CHECK;

/* Waits (under the read deadline) until len bytes (<= MIG_STREAM_RBUF)
 * can be read and copies them into buf without consuming them. */
int mig_stream__peek(struct mig_stream *s, void *buf, size_t len) KMIG_MUST_CHECK;

/* Buffered write of a whole record (header + payload).  Does not flush. */
int mig_stream__put_record(struct mig_stream *s, uint32_t type, uint32_t flags,
			   const void *payload, size_t len) KMIG_MUST_CHECK;
/* Writes buf at once (buffered bytes first), also after a framing error
 * on the read side (-EPROTO, -EMSGSIZE from get_record: the connection
 * itself is still good) or -ENOLINK (another connection of the migration
 * broke: mig_stream__fail by its reader), so a receiver that could not go
 * on can still tell its peer why.  Any other sticky error is returned as
 * is. */
int mig_stream__reply(struct mig_stream *s, const void *buf, size_t len) KMIG_MUST_CHECK;

/* ---- Zero-copy sends (stream_zc.c; capability zero-copy-send) ----
 * A plain TCP stream (no TLS) whose page data goes with MSG_ZEROCOPY:
 * the kernel pins the caller's pages until the send completes and reads
 * them when it transmits, so a page written in between goes out newer,
 * never older.  The pins count against RLIMIT_MEMLOCK (not for root);
 * pages that cannot be pinned fail the stream (-ENOBUFS).
 * Turns it on: 0, -EOPNOTSUPP (TLS, not a socket), or the kernel's
 * refusal (a unix socket: MSG_ZEROCOPY is TCP's). */
int mig_stream__zc_enable(struct mig_stream *s) KMIG_MUST_CHECK;
/* The rate limit of a send that bypasses the buffer (zero-copy): waits
 * as the limit wants (not when urgent), charges the clock for the bytes
 * it allows and returns how many of `want` to send now (all of them when
 * unlimited or urgent). */
size_t mig_stream__throttle(struct mig_stream *s, size_t want);
/* Sends the iovecs by reference after the buffered bytes, under the rate
 * limit; the completions are read as they come.  0 or the sticky error. */
int mig_stream__zc_write(struct mig_stream *s, const struct iovec *iov, int iovcnt)
	KMIG_MUST_CHECK;
/* Waits until every zero-copy send so far has completed; *copied says
 * whether the kernel copied any of them after all (loopback and veth
 * always do).  0 or the sticky error. */
int mig_stream__zc_flush(struct mig_stream *s, bool *copied) KMIG_MUST_CHECK;

/* Reads one record: the header into *hdr (checked with
 * proto__header_problem: -EPROTO) and its payload into buf, which must
 * hold hdr->length bytes (else -EMSGSIZE).  Both errors are sticky: the
 * framing is lost. */
int mig_stream__get_record(struct mig_stream *s, struct proto_hdr *hdr, void *buf,
			   size_t cap) KMIG_MUST_CHECK;

/* Send rate limit in bytes per second (0 = unlimited).  A virtual clock
 * says when the bytes sent so far are due at the rate: a send waits until
 * then and goes in slices of 20 ms of sending (at least 8 KiB), each
 * moving the clock on; idle time is credited up to 20 ms.  A new rate
 * takes effect within 50 ms. */
void mig_stream__set_rate(struct mig_stream *s, uint64_t bytes_per_sec);
uint64_t mig_stream__rate(struct mig_stream *s);
/* Urgent sending, for bytes someone is waiting for (a page a post-copy
 * destination asked for): while on, every send of s (a flush, a write that
 * fills the buffer) goes at once, without the limiter's wait and without
 * slicing, and is charged to the clock all the same, so the normal sends
 * after it wait that much longer and the average stays within the rate.
 * Writer thread only; turn it off again after the urgent bytes are
 * flushed. */
void mig_stream__set_urgent(struct mig_stream *s, bool on);
/* Charges n bytes sent elsewhere (postcopy-preempt's channel) to s's rate
 * limit, as an urgent send of s would be: the sends after it wait that
 * much longer.  Nothing without a limit.  Writer thread only. */
void mig_stream__charge(struct mig_stream *s, size_t n);
/* ns until a normal send may go without waiting: 0 when the bytes sent so
 * far are due, without a rate, or after shutdown.  For a writer that does
 * its waiting where something else can wake it.  Writer thread only. */
uint64_t mig_stream__due_ns(struct mig_stream *s);
/* The most a normal send sends after its wait (more waits again between
 * slices); SIZE_MAX without a rate.  Any thread. */
size_t mig_stream__slice_bytes(struct mig_stream *s);
/* Aborts the stream from any thread: shutdown(SHUT_RDWR) so a blocked
 * read or write returns; the sticky error becomes -ECANCELED.  On a
 * non-socket fd (pipe, file) only the error is set: a call blocked in the
 * kernel is not woken. */
void mig_stream__shutdown(struct mig_stream *s);
/* Reads fail with -ETIMEDOUT (sticky) once time__now_ms() reaches
 * deadline_ms, however the bytes trickle in; 0 removes the deadline.  For
 * the short waits with a stated bound (a channel's handshake, the answer
 * after END). */
void mig_stream__set_read_deadline(struct mig_stream *s, uint64_t deadline_ms);
/* From now on every read and write of s goes through the GnuTLS session
 * (a gnutls_session_t), which does its own I/O on s's socket with s's
 * deadline, cancel flag and shutdown; s frees it on close.  For
 * tls_session.c, before the handshake. */
void mig_stream__attach_tls(struct mig_stream *s, void *session);

/* TCP_NODELAY (off by default: bulk transfer, we buffer ourselves).
 * No-op (0) on non-TCP descriptors. */
int mig_stream__set_nodelay(struct mig_stream *s, bool on) KMIG_MUST_CHECK;

/* Bytes written but not yet sent: the stream's buffer and the socket's
 * send queue (SIOCOUTQ).  0, or -ENOTSOCK (not a socket), -errno. */
int mig_stream__unsent(struct mig_stream *s, size_t *bytes) KMIG_MUST_CHECK;
/* The socket's send queue alone: safe from a thread other than the
 * writer's (the stream's buffer is not looked at).  As unsent. */
int mig_stream__outq(struct mig_stream *s, size_t *bytes) KMIG_MUST_CHECK;

uint64_t mig_stream__bytes_out(struct mig_stream *s);
uint64_t mig_stream__bytes_in(struct mig_stream *s);
/* Bytes taken out of the stream by its reader so far (bytes_in less what
 * is read ahead in the stream's buffer): the reader's thread only. */
uint64_t mig_stream__consumed(struct mig_stream *s);
/* The connection's smallest round-trip time seen (TCP_INFO), in µs; 0 for
 * a stream that is not TCP or where the kernel does not say. */
uint64_t mig_stream__min_rtt_us(struct mig_stream *s);

/* ---- URIs, connect and listen (stream_net.c) ----
 * "tcp:HOST:PORT"  HOST a name, an IPv4 address or "[IPv6]"; empty HOST
 *                  means all addresses (listen only); PORT 0..65535
 *                  decimal (0 = any free port, listen only).
 * "unix:PATH"      a filesystem socket path (< 108 bytes).
 * "exec:CMD"       a shell command (/bin/sh -c): the stream is its
 *                  standard input (source) or output (destination).
 * "file:PATH"      a file, written whole (source) or read (destination).
 * "fd:NAME"        a descriptor passed with QMP getfd under NAME, or
 *                  (destination's --incoming) an inherited descriptor's
 *                  number.
 * The last three open no connection: see stream_local.c below.
 * Errors fill err[0..errlen) with a message. */
enum mig_uri_kind { MIG_URI_TCP, MIG_URI_UNIX, MIG_URI_EXEC, MIG_URI_FILE, MIG_URI_FD };
#define MIG_URI_MAX     1024            /* bytes of a URI, with its NUL */
#define MIG_FD_NAME_MAX 64              /* bytes of a getfd name, with its NUL */
struct mig_uri {
	enum mig_uri_kind kind;
	char host[256];
	uint16_t port;
	char path[108];
	char arg[MIG_URI_MAX];          /* exec:, file:, fd: what follows the colon */
};
/* 0 or -EINVAL (malformed: bad port, unknown scheme, empty path, ...). */
int mig_uri__parse(const char *uri, struct mig_uri *u, char *err, size_t errlen) KMIG_MUST_CHECK;
static inline bool mig_uri__is_socket(const struct mig_uri *u)
{
	return u->kind == MIG_URI_TCP || u->kind == MIG_URI_UNIX;
}
/* A URI without a connection as its errors name it ("a %s: URI"): exec,
 * file, or an fd: that is a pipe's or a file's. */
static inline const char *mig_uri__local_name(const struct mig_uri *u)
{
	return u->kind == MIG_URI_EXEC ? "exec" : u->kind == MIG_URI_FILE ? "file" :
	       "pipe's or file's fd";
}

/* Connects and initialises s.  Blocks until connected, at most
 * MIG_CONNECT_TIMEOUT_MS over all the host's addresses (-ETIMEDOUT; the
 * name lookup before is not bounded), and returns -ECANCELED within ~50 ms
 * of *cancel becoming true (cancel may be NULL).  s keeps cancel: a read
 * under a deadline (a handshake) also ends within ~100 ms of it. */
#define MIG_CONNECT_TIMEOUT_MS 30000
int mig_stream__connect(struct mig_stream *s, const char *uri, const atomic_bool *cancel,
			char *err, size_t errlen) KMIG_MUST_CHECK;

/* A listener keeps the connections it has accepted that have sent
 * nothing yet (at most MIG_LISTENER_PENDING, the oldest dropped for a new
 * one), so one connector that stays silent holds no one up: accept hands
 * out the first connection that has bytes to read (or has hung up), and
 * closes one silent for MIG_LISTENER_SILENT_MS, telling on_drop (one that
 * has spoken by the time that is checked is no silent one, however long
 * the caller was busy elsewhere). */
#define MIG_LISTENER_PENDING   8
#define MIG_LISTENER_SILENT_MS 10000
struct mig_listener {
	int fd;
	atomic_bool shut;
	char path[108];                 /* unix socket to unlink on close, or "" */
	uint16_t port;                  /* bound TCP port (after port 0) */
	char host[64];                  /* bound TCP address, numeric (with an IPv6 scope), or "" */
	int pending[MIG_LISTENER_PENDING];      /* accepted, silent so far; oldest first */
	uint64_t pending_ms[MIG_LISTENER_PENDING]; /* time__now_ms() of each accept */
	unsigned npending;
	/* optional, set after open: a connection closed unused, and why */
	void (*on_drop)(void *ctx, const char *why);
	void *drop_ctx;
};
/* Binds and listens.  A unix path that exists but refuses connections
 * (stale socket) is replaced. */
int mig_listener__open(struct mig_listener *l, const char *uri, char *err,
		       size_t errlen) KMIG_MUST_CHECK;
/* Waits for a connection that has sent something or hung up and
 * initialises s with it; -ETIMEDOUT at deadline_ms (time__now_ms(), 0 =
 * none), -ECANCELED after mig_listener__shutdown.  The caller vets what
 * the peer sends. */
int mig_listener__accept(struct mig_listener *l, struct mig_stream *s, uint64_t deadline_ms,
			 char *err, size_t errlen) KMIG_MUST_CHECK;
/* Makes a blocked accept return (any thread). */
void mig_listener__shutdown(struct mig_listener *l);
/* Closes the listener and the connections it holds. */
void mig_listener__close(struct mig_listener *l);

/* ---- Streams without a connection (stream_local.c) ----
 * exec:, file: and fd: URIs.  A stream on a pipe or a file has no way
 * back: mig_stream__two_way() is false and the protocol's return path is
 * absent (the source learns nothing from the destination; see
 * protocol.md "One-way streams").  An fd: descriptor that is a socket
 * keeps both ways.
 *
 * Opens the stream of a parsed exec:/file:/fd: URI, for sending (out) or
 * receiving.  fd: takes `fd` (the caller resolved the name; s owns it
 * from now on, also on error); exec: runs the command with /bin/sh -c,
 * with no descriptor of ours but the pipe (its stdin: /dev/null when
 * receiving; its stdout: our stderr when sending); file: creates or
 * truncates PATH (mode 0600) for sending and opens it read-only for
 * receiving.  0 or -errno with err. */
int mig_stream__open_local(struct mig_stream *s, const struct mig_uri *u, bool out, int fd,
			   char *err, size_t errlen) KMIG_MUST_CHECK;
/* exec:'s command (it runs in a process group of its own), if it has not
 * been waited for: the group killed (SIGKILL) and the command reaped at
 * once.  mig_stream__close does this after closing the descriptor, so a
 * destination's command that is still running after the stream's end
 * (the source's END is read) is killed too. */
void mig_stream__reap(struct mig_stream *s);
/* Both ways: a socket. */
static inline bool mig_stream__two_way(const struct mig_stream *s)
{
	return s->is_socket;
}
/* The source's end of a one-way stream, after its last flush: a file's
 * data reaches its disk (fdatasync), the descriptor is closed, and an
 * exec: command's exit is awaited (at most timeout_ms; *cancel ends the
 * wait at once and kills it): 0 only if it exited with status 0. */
int mig_stream__finish_local(struct mig_stream *s, int timeout_ms, const atomic_bool *cancel,
			     char *err, size_t errlen) KMIG_MUST_CHECK;

#endif
