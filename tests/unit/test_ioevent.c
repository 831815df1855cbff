/* Unit tests of the ioeventfd thread (kvm/ioevent): real eventfds and a
 * real thread, written to by the test instead of by KVM (vm_fd -1). */
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "kvm/ioevent.h"

struct seen {
	atomic_uint count[IOEVENT_MAX];
	atomic_bool slow;            /* each call takes 20 ms */
};

static void on_event(void *ctx, unsigned i)
{
	struct seen *s = ctx;
	if (atomic_load(&s->slow))
		usleep(20000);
	atomic_fetch_add(&s->count[i], 1);
}

static void signal_fd(struct ioevent *io, unsigned i)
{
	uint64_t one = 1;
	if (write(io->fds[i], &one, sizeof(one)) != sizeof(one))
		return;
}

/* waits up to 2 s for count[i] to reach want */
static unsigned wait_count(struct seen *s, unsigned i, unsigned want)
{
	for (int k = 0; k < 2000 && atomic_load(&s->count[i]) < want; k++)
		usleep(1000);
	return atomic_load(&s->count[i]);
}

/* The thread calls fn for the eventfd that was signalled, and only it. */
static void t_dispatch(struct t *t)
{
	struct ioevent io;
	struct seen s = { 0 };
	T_CHECK_EQ(t, ioevent__init(&io, -1, 3, 2, on_event, &s), 0);
	T_CHECK_EQ(t, ioevent__start(&io), 0);
	signal_fd(&io, 2);
	T_CHECK_EQ(t, wait_count(&s, 2, 1), 1);
	signal_fd(&io, 0);
	T_CHECK_EQ(t, wait_count(&s, 0, 1), 1);
	T_CHECK_EQ(t, atomic_load(&s.count[1]), 0);
	T_CHECK_EQ(t, ioevent__events(&io), 2);
	ioevent__destroy(&io);
}

/* A hold returns only once every signal sent before it was handled, even
 * when the handler is slow; while held nothing is handled; the signals
 * that come during the hold are handled after the release. */
static void t_hold_drains(struct t *t)
{
	struct ioevent io;
	struct seen s = { 0 };
	T_CHECK_EQ(t, ioevent__init(&io, -1, 4, 2, on_event, &s), 0);
	T_CHECK_EQ(t, ioevent__start(&io), 0);
	atomic_store(&s.slow, true);
	for (unsigned i = 0; i < 4; i++)
		signal_fd(&io, i);
	ioevent__hold(&io);
	for (unsigned i = 0; i < 4; i++)
		T_CHECK_EQ(t, atomic_load(&s.count[i]), 1);
	atomic_store(&s.slow, false);
	ioevent__hold(&io);              /* holds nest */
	signal_fd(&io, 1);
	usleep(100000);
	T_CHECK_EQ(t, atomic_load(&s.count[1]), 1);
	ioevent__release(&io);
	usleep(100000);
	T_CHECK_EQ(t, atomic_load(&s.count[1]), 1);   /* one hold is left */
	ioevent__release(&io);
	T_CHECK_EQ(t, wait_count(&s, 1, 2), 2);
	ioevent__destroy(&io);
}

/* A hold taken before the thread starts keeps it from handling anything
 * until released (a VM that starts paused). */
static void t_hold_before_start(struct t *t)
{
	struct ioevent io;
	struct seen s = { 0 };
	T_CHECK_EQ(t, ioevent__init(&io, -1, 1, 2, on_event, &s), 0);
	ioevent__hold(&io);
	T_CHECK_EQ(t, ioevent__start(&io), 0);
	signal_fd(&io, 0);
	usleep(100000);
	T_CHECK_EQ(t, atomic_load(&s.count[0]), 0);
	ioevent__release(&io);
	T_CHECK_EQ(t, wait_count(&s, 0, 1), 1);
	ioevent__destroy(&io);
}

/* Bad arguments are refused, and destroy is safe after that. */
static void t_bad_init(struct t *t)
{
	struct ioevent io;
	struct seen s = { 0 };
	T_CHECK_EQ(t, ioevent__init(&io, -1, 0, 2, on_event, &s), -22);
	ioevent__destroy(&io);
	T_CHECK_EQ(t, ioevent__init(&io, -1, IOEVENT_MAX + 1, 2, on_event, &s), -22);
	ioevent__destroy(&io);
	T_CHECK_EQ(t, ioevent__init(&io, -1, 1, 2, NULL, &s), -22);
	ioevent__destroy(&io);
}

int main(void)
{
	struct t t = { 0 };
	T_RUN(&t, t_dispatch);
	T_RUN(&t, t_hold_drains);
	T_RUN(&t, t_hold_before_start);
	T_RUN(&t, t_bad_init);
	return T_DONE(&t);
}
