#include "ctl/control.h"


#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/timeutil.h"
#include "ctl/balloon_cmds.h"
#include "ctl/blk_cmds.h"
#include "ctl/fd_cmds.h"
#include "ctl/net_cmds.h"
#include "kvm/vm_blk.h"


#define KMIG_VERSION_MAJOR 0
#define KMIG_VERSION_MINOR 1
#define KMIG_VERSION_MICRO 0

/* The write end of the signal pipe: a signal handler can reach nothing else. */
static int control__signal_fd = -1;

static void control__on_signal(int sig)
{
	(void)sig;
	if (control__signal_fd >= 0) {
		ssize_t w = write(control__signal_fd, "s", 1);
		(void)w;
	}
}

void control__wake(struct control *c)
{
	ssize_t w = write(c->wake_pipe[1], "w", 1);
	(void)w;
}

void control__event(struct control *c, const char *name, json_t *data)
{
	if (!c->qmp) {
		json_decref(data);
		return;
	}
	if (qmp__emit_event(c->qmp, name, data))
		log_warn("QMP event %s dropped", name);
}

static void control__on_vm_event(void *ctx, enum vm_event ev)
{
	struct control *c = ctx;
	if (ev == VM_EVENT_SHUTDOWN) {
		control__event(c, "SHUTDOWN", json_pack("{s:b, s:s}", "guest", 1,
							  "reason", "guest-shutdown"));
		atomic_store(&c->shutdown_seen, true);
	} else {
		control__event(c, "GUEST_PANICKED", json_pack("{s:s}", "action", "pause"));
		if (ev == VM_EVENT_FAILED)   /* it left running (vm.h) */
			control__event(c, "STOP", NULL);
		atomic_store(&c->failed_seen, true);
	}
	control__wake(c);
}

/* STOP and RESUME: queued under vm->lock as the status changes (vm.h),
 * so they come in the order of the changes, whichever thread made them */
static void control__on_run_change(void *ctx, bool running)
{
	control__event(ctx, running ? "RESUME" : "STOP", NULL);
}

static void control__drain(void *ctx, int fd, short revents)
{
	(void)ctx;
	(void)revents;
	char buf[64];
	while (read(fd, buf, sizeof(buf)) > 0)
		;
}

static void control__on_sig_pipe(void *ctx, int fd, short revents)
{
	struct control *c = ctx;
	control__drain(ctx, fd, revents);
	atomic_store(&c->quit, true);
}

int control__init(struct control *c, struct vm *vm, const char *qmp_path,
		  char *err, size_t errlen)
{
	memset(c, 0, sizeof(*c));
	c->vm = vm;
	ev_throttle__init(&c->balloon_change, CONTROL_BALLOON_CHANGE_MS);
	if (pipe2(c->wake_pipe, O_NONBLOCK | O_CLOEXEC) < 0 ||
	    pipe2(c->sig_pipe, O_NONBLOCK | O_CLOEXEC) < 0)
		return -errno;
	control__signal_fd = c->sig_pipe[1];
	struct sigaction sa = { .sa_handler = control__on_signal };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	vm->on_event = control__on_vm_event;
	vm->on_io_error = control__on_io_error;
	vm->on_run_change = control__on_run_change;
	vm->event_ctx = c;
	c->exit_on_failure = !qmp_path;
	if (!qmp_path)
		return 0;
	struct qmp_version ver = { KMIG_VERSION_MAJOR, KMIG_VERSION_MINOR,
				   KMIG_VERSION_MICRO, "kmig-0.1.0" };
	int rc = qmp__create(&c->qmp, qmp_path, &ver);
	if (rc) {
		snprintf(err, errlen, "cannot create QMP socket %s: %s", qmp_path, strerror(-rc));
		return rc;
	}
	rc = qmp__add_fd(c->qmp, c->wake_pipe[0], POLLIN, control__drain, c);
	if (!rc)
		rc = qmp__add_fd(c->qmp, c->sig_pipe[0], POLLIN, control__on_sig_pipe, c);
	if (!rc)
		rc = control__register_commands(c);
	if (!rc)
		rc = control__register_balloon(c);
	if (!rc)
		rc = control__register_net(c);
	if (!rc)
		rc = control__register_blk(c);
	if (!rc)
		rc = control__register_fds(c);
	if (!rc)
		rc = control__register_introspection(c);
	if (rc)
		snprintf(err, errlen, "cannot set up QMP commands: %s", strerror(-rc));
	return rc;
}

static int control__status(struct control *c)
{
	if (atomic_load(&c->shutdown_seen))
		return atomic_load(&c->vm->exit_code);
	if (atomic_load(&c->failed_seen) || atomic_load(&c->incoming_failed))
		return 1;
	return 0;
}

static bool control__done(struct control *c)
{
	if (atomic_load(&c->quit) || atomic_load(&c->shutdown_seen) ||
	    atomic_load(&c->incoming_failed))
		return true;
	return atomic_load(&c->failed_seen) && c->exit_on_failure;
}

/* A guest that halted every vCPU with interrupts off has ended. */
static void control__check_halt(struct control *c, uint64_t *last_ms)
{
	uint64_t now = time__now_ms();
	if (now - *last_ms < 1000)
		return;
	*last_ms = now;
	if (vm__all_halted(c->vm)) {
		log_info("every vCPU halted with interrupts off: the guest has ended");
		vm__shutdown(c->vm, 0);
	}
}

int control__run(struct control *c)
{
	uint64_t halt_check_ms = time__now_ms();
	while (!control__done(c)) {
		control__check_halt(c, &halt_check_ms);
		if (atomic_exchange(&c->io_error_stop, false))
			control__stop_io_error(c);
		json_t *held = ev_throttle__due(&c->balloon_change, time__now_ms());
		if (held)
			control__event(c, "BALLOON_CHANGE", held);
		if (c->qmp) {
			int rc = qmp__poll(c->qmp, 200);
			if (rc < 0 && rc != -EINTR)
				log_warn("QMP poll failed: %s", strerror(-rc));
		} else {
			struct pollfd p[2] = { { .fd = c->wake_pipe[0], .events = POLLIN },
					       { .fd = c->sig_pipe[0], .events = POLLIN } };
			if (poll(p, 2, 200) > 0) {
				control__drain(c, c->wake_pipe[0], p[0].revents);
				if (p[1].revents)
					control__on_sig_pipe(c, c->sig_pipe[0], p[1].revents);
			}
		}
	}
	if (c->qmp && qmp__flush(c->qmp, 1000))
		log_warn("QMP replies not fully delivered before exit");
	return control__status(c);
}

void control__destroy(struct control *c)
{
	control__signal_fd = -1;
	qmp__destroy(c->qmp);
	fd_names__destroy(&c->fds);
	ev_throttle__destroy(&c->balloon_change);
	for (int i = 0; i < 2; i++) {
		close(c->wake_pipe[i]);
		close(c->sig_pipe[i]);
	}
}

/* `stop` waits this long for the vCPUs to park: on a post-copy
 * destination whose link broke, a vCPU waits in the kernel for a page and
 * parks only once it has come, which must not hold up the QMP loop */
#define CONTROL_STOP_WAIT_NS 1000000000ull

static void control__stop_into(struct control *c, enum vm_status to)
{
	bool done;
	vm__pause_into(c->vm, VM_STATUS_BIT(VM_STATUS_RUNNING), to, CONTROL_STOP_WAIT_NS, &done);
}

void control__stop_vm(struct control *c)
{
	control__stop_into(c, VM_STATUS_PAUSED);
}

/* A disk error with action stop: a running VM stops (a stopped one
 * keeps its status, as QEMU's; its resume retries the requests all the
 * same).  Not if nothing is kept any more: a request kept while a
 * migration's switchover held the VM, retried (and done) when the failed
 * migration resumed it before this loop came round (one that fails
 * again asks again). */
void control__stop_io_error(struct control *c)
{
	if (vm_blk__kept(c->vm))
		control__stop_into(c, VM_STATUS_IO_ERROR);
}

bool control__cont_vm(struct control *c)
{
	unsigned from = VM_STATUS_BIT(VM_STATUS_PAUSED) | VM_STATUS_BIT(VM_STATUS_POSTMIGRATE) |
			VM_STATUS_BIT(VM_STATUS_IO_ERROR) | VM_STATUS_BIT(VM_STATUS_PRELAUNCH);
	return vm__resume_from(c->vm, from, VM_STATUS_RUNNING);
}
