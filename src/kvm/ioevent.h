/* ioeventfds for a device's queue notifications (KVM_IOEVENTFD).
 *
 * A set of n eventfds: KVM signals eventfd i when the guest writes `len`
 * bytes at base + i * stride (MMIO), instead of a vCPU exit to kmig, and
 * a thread of the set's own calls fn(ctx, i) for each signal it reads.  A
 * write of another length still exits and reaches the device through its
 * BAR, so a failed registration only costs speed.
 *
 * Pauses: ioevent__hold (called once the vCPUs are parked) returns when
 * the thread has handled every signal already sent and will handle no
 * more; ioevent__release undoes one hold (holds nest).  So the device
 * writes no guest memory while the VM is stopped, and no notification
 * the guest sent before a stop waits in an eventfd when its state is
 * saved.  A hold before ioevent__start just counts: the thread starts
 * held and handles nothing until the release.
 *
 * A set may also watch one more fd (a device's backend, e.g. a tap):
 * while the watch is on, the thread calls watch_fn(ctx) whenever that fd
 * is readable.  A held thread does not watch it (frames wait there).
 *
 * With vm_fd < 0 nothing is registered with KVM: the eventfds are only
 * signalled by writes to them (the unit test of the thread). */
#ifndef KMIG_KVM_IOEVENT_H
#define KMIG_KVM_IOEVENT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/log.h"

#define IOEVENT_MAX 8

typedef void (*ioevent_fn)(void *ctx, unsigned i);

struct ioevent {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int vm_fd;
	unsigned n;
	uint32_t len;
	uint64_t base, stride;       /* where the eventfds are registered; base 0: nowhere */
	int fds[IOEVENT_MAX];
	int wake;                    /* eventfd: a hold or the stop wants the thread */
	ioevent_fn fn;
	void *ctx;
	unsigned holds;
	bool held;                   /* the thread has drained and waits for release */
	bool stopping, running;
	uint64_t events;             /* signals handled (under lock) */
	int watch_fd;                /* -1: none */
	void (*watch_fn)(void *ctx);
	bool watch_on;               /* under lock */
	pthread_t thread;
};

/* n <= IOEVENT_MAX eventfds, not yet registered.  0/-errno. */
int ioevent__init(struct ioevent *io, int vm_fd, unsigned n, uint32_t len,
		  ioevent_fn fn, void *ctx) KMIG_MUST_CHECK;
/* Registers eventfd i at base + i * stride (base 0: nowhere), undoing
 * the previous registration.  -errno if KVM refused; then nothing is
 * registered. */
int ioevent__map(struct ioevent *io, uint64_t base, uint64_t stride) KMIG_MUST_CHECK;
/* Before ioevent__start: the fd to watch (off until ioevent__watch_on). */
void ioevent__watch(struct ioevent *io, int fd, void (*fn)(void *ctx));
/* From any thread, the set's own included. */
void ioevent__watch_on(struct ioevent *io, bool on);
int ioevent__start(struct ioevent *io) KMIG_MUST_CHECK;
/* Holds for ever (timeout_ns 0) or until the deadline: false if the thread
 * was still busy then (a device blocked on a page a post-copy destination
 * lacks); the hold is not taken then. */
bool ioevent__hold(struct ioevent *io, uint64_t timeout_ns);
void ioevent__release(struct ioevent *io);
uint64_t ioevent__events(struct ioevent *io);
/* Signals eventfd i as KVM would (any thread): the set's thread calls
 * fn(ctx, i) for it, once it is not held. */
void ioevent__signal(struct ioevent *io, unsigned i);
/* Stops the thread, unregisters, closes the eventfds.  Safe after any
 * ioevent__init, failed or not. */
void ioevent__destroy(struct ioevent *io);

#endif
