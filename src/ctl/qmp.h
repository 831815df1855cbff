/* QMP server: QEMU Machine Protocol (JSON over a unix stream socket).
 *
 * Speaks the wire protocol of QEMU's QMP so that socat scripts, qmp-shell and
 * QEMU's python client work unchanged (see docs/qmp.md): greeting, capability
 * negotiation with "qmp_capabilities", {"execute", "arguments", "id"} requests
 * answered by {"return"|"error", "id"}, and asynchronous events.  The server
 * knows no VM commands itself; the VMM registers them by name.
 *
 * Threading contract
 *  - One thread, the "loop thread" (owned by the VMM), calls qmp__poll() in a
 *    loop.  qmp__create(), qmp__register(), qmp__add_fd(), qmp__del_fd(),
 *    qmp__flush() and qmp__destroy() are called on that thread, or before it
 *    starts / after it has stopped.  Command handlers and fd callbacks run on
 *    the loop thread, inside qmp__poll(); they may call qmp__register(),
 *    qmp__add_fd(), qmp__del_fd() and qmp__emit_event(), but not qmp__poll(),
 *    qmp__flush() or qmp__destroy().
 *  - qmp__emit_event() and qmp__wake() may be called from ANY thread (vCPU
 *    threads, the migration thread, signal-free contexts) at any time between
 *    qmp__create() and qmp__destroy().  They never block on a socket: events are
 *    queued under a mutex and the loop thread writes them out.
 *  - Socket writes never block the loop: each client has an output buffer; a
 *    client whose buffer grows past QMP_MAX_OUTPUT is disconnected.
 *
 * Ownership: the server borrows the "arguments" object it hands to handlers
 * (valid only during the call); handlers return a NEW reference, which the
 * server consumes.  qmp__emit_event() steals its data reference.
 */
#ifndef KMIG_CTL_QMP_H
#define KMIG_CTL_QMP_H

#include <jansson.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/log.h"

#define QMP_MAX_CLIENTS   8                 /* simultaneous connections */
#define QMP_MAX_INPUT     (1u << 20)        /* bytes of one JSON request */
#define QMP_MAX_OUTPUT    (4u << 20)        /* queued reply bytes per client */
#define QMP_MAX_NESTING   1024              /* brackets in one request */
#define QMP_MAX_EVENTS    4096              /* events queued, not yet sent */
#define QMP_MAX_EXTRA_FDS 16                /* fds added with qmp__add_fd() */
#define QMP_MAX_NAME      64                /* bytes of a command name */
#define QMP_MAX_PASSED_FDS 8                /* SCM_RIGHTS descriptors taken per read */

struct qmp;

/* QEMU's error classes (QapiErrorClass), sent as the "class" member. */
enum qmp_error_class {
	QMP_ERROR_GENERIC,              /* "GenericError" */
	QMP_ERROR_COMMAND_NOT_FOUND,    /* "CommandNotFound" */
	QMP_ERROR_DEVICE_NOT_ACTIVE,    /* "DeviceNotActive" */
	QMP_ERROR_DEVICE_NOT_FOUND,     /* "DeviceNotFound" */
	QMP_ERROR_KVM_MISSING_CAP,      /* "KVMMissingCap" */
};

/* An error being built by a handler.  Zero-initialised by the server before
 * each call; `set` tells whether a handler filled it. */
struct qmp_error {
	bool set;
	enum qmp_error_class cls;
	char desc[512];
};

/* Fills err (class + printf-style "desc").  The first error set wins: later
 * calls on an already set err are ignored, so helpers can be chained. */
void qmp_error__set(struct qmp_error *err, enum qmp_error_class cls,
		    const char *fmt, ...) KMIG_PRINTF(3, 4);
/* "GenericError", "CommandNotFound", ... */
const char *qmp_error__class_name(enum qmp_error_class cls);

/* A command handler.  Runs on the loop thread, so it must not block for long
 * (start long work on another thread and report it with events or a query
 * command, as "migrate" does in QEMU).  `args` is the request's
 * "arguments" object (borrowed; an empty object when the request had none,
 * never NULL).  Returns a new reference to the "return" value.  Returning NULL
 * with err->set is an error reply; NULL without err->set means `{}`, QEMU's
 * reply for commands that return nothing.  A non-NULL value together with
 * err->set is an error reply (the value is released). */
typedef json_t *(*qmp_handler)(void *ctx, json_t *args, struct qmp_error *err);

/* Callback for an fd added with qmp__add_fd().  Runs on the loop thread with
 * the poll revents (may include POLLERR/POLLHUP). */
typedef void (*qmp_fd_cb)(void *ctx, int fd, short revents);

/* What the greeting and query-version report. */
struct qmp_version {
	int major, minor, micro;
	const char *package;            /* e.g. "kmig-0.1.0"; NULL means "" */
};

/* Creates a server listening on the unix socket PATH (mode 0600, created with
 * a restrictive umask so there is no window where it is wider; the process
 * umask is changed for the duration of bind(), so call this at start-up).  A
 * stale socket at PATH (nobody listening) is removed; a live one gives
 * -EADDRINUSE, a non-socket file -EEXIST, a too long path -ENAMETOOLONG.
 * `version` may be NULL (0.0.0, package "").  Built-in commands:
 * qmp_capabilities, query-commands, query-version. */
KMIG_MUST_CHECK int qmp__create(struct qmp **out, const char *path,
				const struct qmp_version *version);
/* Closes every client and the listener, unlinks PATH, frees everything.
 * Pending events are dropped.  NULL is a no-op.  No other thread may be
 * inside qmp__emit_event()/qmp__wake() any more. */
void qmp__destroy(struct qmp *q);

/* Registers command NAME (copied; at most QMP_MAX_NAME-1 bytes).
 * -EEXIST if already registered (built-ins included), -EINVAL on a bad name,
 * -ENOMEM. */
KMIG_MUST_CHECK int qmp__register(struct qmp *q, const char *name,
				  qmp_handler fn, void *ctx);

/* Polls the listener, the clients, the wake fd and the extra fds for at most
 * timeout_ms (-1: forever; 0: don't wait) and handles whatever is ready:
 * accepts clients, runs commands, writes replies and queued events, calls fd
 * callbacks.  Returns the number of ready fds (0 on timeout or EINTR), or
 * -errno if poll() itself failed.  Client errors never fail this call. */
KMIG_MUST_CHECK int qmp__poll(struct qmp *q, int timeout_ms);

/* Makes a qmp__poll() in progress (or the next one) return promptly.  Any
 * thread. */
void qmp__wake(struct qmp *q);

/* Watches FD (owned by the caller, not closed by the server) for EVENTS
 * (POLLIN, POLLOUT) in qmp__poll(); cb runs on the loop thread when it is
 * ready.  -EEXIST if FD is already watched, -ENOSPC past QMP_MAX_EXTRA_FDS,
 * -EBADF/-EINVAL on bad arguments. */
KMIG_MUST_CHECK int qmp__add_fd(struct qmp *q, int fd, short events,
				qmp_fd_cb cb, void *ctx);
/* Stops watching FD; its callback is not called again, even later in the
 * qmp__poll() that is running.  -ENOENT if not watched. */
int qmp__del_fd(struct qmp *q, int fd);

/* Sends an event {"timestamp": {"seconds", "microseconds"}, "event": NAME,
 * "data": DATA} to every negotiated client (no "data" member if DATA is NULL).
 * The timestamp is taken now (wall clock).  Steals DATA.  ANY thread.  Events
 * emitted by a command handler reach clients before that command's reply, as
 * in QEMU.  Returns 0, -EINVAL (bad name or data not an object),
 * -ENOMEM, or -ENOBUFS when QMP_MAX_EVENTS are already queued. */
int qmp__emit_event(struct qmp *q, const char *name, json_t *data);

/* Writes queued events and pending replies to every client, waiting up to
 * timeout_ms for slow readers.  Used before exiting (e.g. after "quit") so
 * the reply is not lost: let the quit handler set a flag, and after
 * qmp__poll() returns, call qmp__flush().  Loop thread only.  Returns 0 when
 * everything was written (or the clients went away), -ETIMEDOUT otherwise. */
KMIG_MUST_CHECK int qmp__flush(struct qmp *q, int timeout_ms);

/* Number of connected clients (negotiated or not).  Loop thread. */
int qmp__client_count(const struct qmp *q);
/* In a command handler: the descriptor the client running the command
 * sent last with SCM_RIGHTS (on the bytes of this command or before),
 * now the caller's; -1 if it sent none since the last take.  A client
 * keeps one: a newer one closes the older, and closing the connection
 * closes it. */
int qmp__take_fd(struct qmp *q);

/* ---- Argument helpers for handlers, with QEMU's error messages ----
 * Each looks up NAME in ARGS (NULL ARGS counts as empty).  Returns 1 and sets
 * *out when the member is present with the right type; 0 when it is absent
 * and not required (*out untouched, so preset the default); -EINVAL with err
 * set ("Parameter 'x' is missing", "Invalid parameter type for 'x', expected:
 * integer") otherwise. */
KMIG_MUST_CHECK int qmp_arg__str(json_t *args, const char *name,
				 const char **out, bool required,
				 struct qmp_error *err);
KMIG_MUST_CHECK int qmp_arg__int(json_t *args, const char *name,
				 int64_t *out, bool required,
				 struct qmp_error *err);
/* An integer >= 0; a negative one gives "Parameter 'x' expects uint64". */
KMIG_MUST_CHECK int qmp_arg__uint(json_t *args, const char *name,
				  uint64_t *out, bool required,
				  struct qmp_error *err);
KMIG_MUST_CHECK int qmp_arg__bool(json_t *args, const char *name,
				  bool *out, bool required,
				  struct qmp_error *err);
/* Accepts integers and reals, as QEMU's "number". */
KMIG_MUST_CHECK int qmp_arg__number(json_t *args, const char *name,
				    double *out, bool required,
				    struct qmp_error *err);
/* *out is borrowed from ARGS. */
KMIG_MUST_CHECK int qmp_arg__object(json_t *args, const char *name,
				    json_t **out, bool required,
				    struct qmp_error *err);
KMIG_MUST_CHECK int qmp_arg__array(json_t *args, const char *name,
				   json_t **out, bool required,
				   struct qmp_error *err);
/* Rejects members of ARGS not in ALLOWED (NULL-terminated list):
 * "Parameter 'foo' is unexpected".  0 or -EINVAL with err set.  The server
 * does not know a command's arguments, so every handler should call this
 * first; ALLOWED may be NULL for commands without arguments. */
KMIG_MUST_CHECK int qmp_arg__check_known(json_t *args,
					 const char *const *allowed,
					 struct qmp_error *err);

#endif
