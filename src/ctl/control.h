/* The control loop of one VM process: owns the QMP server (if any), turns
 * VM events into QMP events and runs until quit, guest power-off or a
 * signal.  Runs on the main thread; commands run there too. */
#ifndef KMIG_CTL_CONTROL_H
#define KMIG_CTL_CONTROL_H

#include <stdatomic.h>
#include <stdbool.h>

#include "base/log.h"
#include "ctl/evthrottle.h"
#include "ctl/fdnames.h"
#include "ctl/qmp.h"
#include "kvm/vm.h"

struct migration;               /* mig/migration.h */

struct control {
	struct vm *vm;
	struct qmp *qmp;             /* NULL without --qmp */
	struct migration *mig;       /* migration engine (source and destination) */
	int wake_pipe[2];            /* VM events wake the loop */
	int sig_pipe[2];             /* SIGINT/SIGTERM: readable means quit */
	atomic_bool quit;            /* leave the loop */
	atomic_bool shutdown_seen;   /* the guest powered off */
	atomic_bool failed_seen;     /* a guest failure parked the VM */
	atomic_bool incoming_failed; /* the incoming migration failed: exit non-zero */
	atomic_bool io_error_stop;   /* a disk error asks for the stop into io-error */
	bool exit_on_failure;        /* without QMP nobody can inspect a failed VM */
	struct ev_throttle balloon_change; /* BALLOON_CHANGE: one per second, as QEMU */
	struct fd_names fds;         /* getfd's descriptors (loop thread) */
};

#define CONTROL_BALLOON_CHANGE_MS 1000

/* Sets up the loop; qmp_path NULL = no control socket. */
int control__init(struct control *c, struct vm *vm, const char *qmp_path,
		  char *err, size_t errlen) KMIG_MUST_CHECK;
/* Runs until the VM should go away; returns the process exit status. */
int control__run(struct control *c);
void control__destroy(struct control *c);
/* Emits a QMP event (any thread; no-op without QMP). */
void control__event(struct control *c, const char *name, json_t *data);
/* Wakes the loop (any thread). */
void control__wake(struct control *c);
/* QMP stop: a running VM is paused, in one step with the status check
 * (vm__pause_into); any other status is left alone. */
void control__stop_vm(struct control *c);
/* The same into io-error (a disk error with action stop).  Loop thread. */
void control__stop_io_error(struct control *c);
/* QMP cont: a prelaunch (-S), paused, io-error or post-migrate VM runs (the disk
 * then retries what it kept); false for any other status.  Loop thread. */
bool control__cont_vm(struct control *c);

/* Registers the VM commands (ctl/commands.c). */
int control__register_commands(struct control *c) KMIG_MUST_CHECK;
/* Registers x-query-dirty-tracking and x-query-kvm-stats (ctl/introspect.c). */
int control__register_introspection(struct control *c) KMIG_MUST_CHECK;

#endif
