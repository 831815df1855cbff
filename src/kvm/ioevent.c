/* ioeventfds and the thread that reads them (see ioevent.h). */
#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <linux/kvm.h>

#include "base/timeutil.h"
#include "kvm/ioevent.h"

int ioevent__init(struct ioevent *io, int vm_fd, unsigned n, uint32_t len,
		  ioevent_fn fn, void *ctx)
{
	memset(io, 0, sizeof(*io));
	io->vm_fd = io->wake = io->watch_fd = -1;
	for (unsigned i = 0; i < IOEVENT_MAX; i++)
		io->fds[i] = -1;
	pthread_mutex_init(&io->lock, NULL);
	time__cond_init(&io->cond);
	if (!n || n > IOEVENT_MAX || !fn)
		return -EINVAL;
	io->vm_fd = vm_fd;
	io->n = n;
	io->len = len;
	io->fn = fn;
	io->ctx = ctx;
	io->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (io->wake < 0)
		return -errno;
	for (unsigned i = 0; i < n; i++) {
		io->fds[i] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
		if (io->fds[i] < 0)
			return -errno;
	}
	return 0;
}

/* Registers (assign) or unregisters eventfds [0, upto) at base. */
static int ioevent__kvm(struct ioevent *io, uint64_t base, uint64_t stride, unsigned upto,
			bool assign)
{
	for (unsigned i = 0; i < upto; i++) {
		struct kvm_ioeventfd e = {
			.addr = base + i * stride, .len = io->len, .fd = io->fds[i],
			.flags = assign ? 0 : KVM_IOEVENTFD_FLAG_DEASSIGN,
		};
		if (ioctl(io->vm_fd, KVM_IOEVENTFD, &e) < 0) {
			int rc = -errno;
			if (assign)
				(void)ioevent__kvm(io, base, stride, i, false);
			return rc;
		}
	}
	return 0;
}

int ioevent__map(struct ioevent *io, uint64_t base, uint64_t stride)
{
	int rc = 0;
	pthread_mutex_lock(&io->lock);
	if (io->vm_fd >= 0 && io->base && (io->base != base || io->stride != stride))
		(void)ioevent__kvm(io, io->base, io->stride, io->n, false);
	if (io->vm_fd >= 0 && base && (io->base != base || io->stride != stride))
		rc = ioevent__kvm(io, base, stride, io->n, true);
	io->base = rc ? 0 : base;
	io->stride = stride;
	pthread_mutex_unlock(&io->lock);
	return rc;
}

/* Reads eventfd i; calls fn if it had been signalled.  Lock not held. */
static void ioevent__take(struct ioevent *io, unsigned i)
{
	uint64_t count;
	if (read(io->fds[i], &count, sizeof(count)) != sizeof(count) || !count)
		return;
	io->fn(io->ctx, i);
	pthread_mutex_lock(&io->lock);
	io->events++;
	pthread_mutex_unlock(&io->lock);
}

/* Lock held: handles whatever is pending (unless held since the start),
 * then waits out the holds. */
static void ioevent__park(struct ioevent *io)
{
	if (!io->held) {
		pthread_mutex_unlock(&io->lock);
		for (unsigned i = 0; i < io->n; i++)
			ioevent__take(io, i);
		pthread_mutex_lock(&io->lock);
	}
	io->held = true;
	pthread_cond_broadcast(&io->cond);
	while (io->holds && !io->stopping)
		pthread_cond_wait(&io->cond, &io->lock);
	io->held = false;
}

static void *ioevent__thread(void *arg)
{
	struct ioevent *io = arg;
	struct pollfd p[IOEVENT_MAX + 2];
	pthread_setname_np(pthread_self(), "ioevent");
	pthread_mutex_lock(&io->lock);
	while (!io->stopping) {
		if (io->holds) {
			ioevent__park(io);
			continue;
		}
		bool watch = io->watch_on && io->watch_fd >= 0;
		pthread_mutex_unlock(&io->lock);
		for (unsigned i = 0; i < io->n; i++)
			p[i] = (struct pollfd){ .fd = io->fds[i], .events = POLLIN };
		p[io->n] = (struct pollfd){ .fd = io->wake, .events = POLLIN };
		p[io->n + 1] = (struct pollfd){ .fd = io->watch_fd, .events = POLLIN };
		if (poll(p, io->n + 1 + watch, -1) > 0) {
			uint64_t count;
			for (unsigned i = 0; i < io->n; i++)
				if (p[i].revents & POLLIN)
					ioevent__take(io, i);
			if (p[io->n].revents & POLLIN && read(io->wake, &count, sizeof(count)) < 0)
				log_debug("ioevent: reading the wake eventfd: %s", strerror(errno));
			if (watch && (p[io->n + 1].revents & (POLLIN | POLLERR | POLLHUP)))
				io->watch_fn(io->ctx);
		}
		pthread_mutex_lock(&io->lock);
	}
	pthread_mutex_unlock(&io->lock);
	return NULL;
}

void ioevent__watch(struct ioevent *io, int fd, void (*fn)(void *ctx))
{
	io->watch_fd = fn ? fd : -1;
	io->watch_fn = fn;
}

static void ioevent__wake(struct ioevent *io);

void ioevent__watch_on(struct ioevent *io, bool on)
{
	pthread_mutex_lock(&io->lock);
	bool changed = io->watch_on != on;
	io->watch_on = on;
	if (changed)
		ioevent__wake(io);
	pthread_mutex_unlock(&io->lock);
}

int ioevent__start(struct ioevent *io)
{
	pthread_mutex_lock(&io->lock);
	io->stopping = false;
	io->held = io->holds > 0;    /* held from the start: nothing to drain */
	pthread_mutex_unlock(&io->lock);
	int rc = pthread_create(&io->thread, NULL, ioevent__thread, io);
	if (rc)
		return -rc;
	io->running = true;
	return 0;
}

static void ioevent__wake(struct ioevent *io)
{
	uint64_t one = 1;
	if (write(io->wake, &one, sizeof(one)) != sizeof(one))
		log_debug("ioevent: writing the wake eventfd: %s", strerror(errno));
}

bool ioevent__hold(struct ioevent *io, uint64_t timeout_ns)
{
	struct timespec ts = time__deadline(timeout_ns);
	bool ok = true;
	pthread_mutex_lock(&io->lock);
	io->holds++;
	if (io->running) {
		ioevent__wake(io);
		while (!io->held && !io->stopping && ok) {
			if (!timeout_ns)
				pthread_cond_wait(&io->cond, &io->lock);
			else if (pthread_cond_timedwait(&io->cond, &io->lock, &ts) == ETIMEDOUT)
				ok = io->held || io->stopping;
		}
		if (!ok) {
			io->holds--;     /* not taken: the thread goes on once free */
			pthread_cond_broadcast(&io->cond);
		}
	}
	pthread_mutex_unlock(&io->lock);
	return ok;
}

void ioevent__release(struct ioevent *io)
{
	pthread_mutex_lock(&io->lock);
	if (io->holds)
		io->holds--;
	pthread_cond_broadcast(&io->cond);
	pthread_mutex_unlock(&io->lock);
}

uint64_t ioevent__events(struct ioevent *io)
{
	pthread_mutex_lock(&io->lock);
	uint64_t n = io->events;
	pthread_mutex_unlock(&io->lock);
	return n;
}

void ioevent__destroy(struct ioevent *io)
{
	if (io->running) {
		pthread_mutex_lock(&io->lock);
		io->stopping = true;
		ioevent__wake(io);
		pthread_cond_broadcast(&io->cond);
		pthread_mutex_unlock(&io->lock);
		pthread_join(io->thread, NULL);
		io->running = false;
	}
	if (ioevent__map(io, 0, 0))
		log_debug("ioevent: unregistering failed");
	for (unsigned i = 0; i < IOEVENT_MAX; i++)
		if (io->fds[i] >= 0)
			close(io->fds[i]);
	if (io->wake >= 0)
		close(io->wake);
	pthread_cond_destroy(&io->cond);
	pthread_mutex_destroy(&io->lock);
}

void ioevent__signal(struct ioevent *io, unsigned i)
{
	uint64_t one = 1;
	if (i < io->n && io->fds[i] >= 0 && write(io->fds[i], &one, sizeof(one)) != sizeof(one))
		log_warn("ioevent: cannot signal eventfd %u: %s", i, strerror(errno));
}
