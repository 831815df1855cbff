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
	atomic_bool slow;            /* each call takes 20 ms, or stuck_ms */
	atomic_uint stuck_ms;
	atomic_bool entered;         /* a call has begun */
};

static void on_event(void *ctx, unsigned i)
{
	struct seen *s = ctx;
	atomic_store(&s->entered, true);
	if (atomic_load(&s->slow))
		usleep(1000 * (atomic_load(&s->stuck_ms) ? atomic_load(&s->stuck_ms) : 20));
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
	T_CHECK(t, ioevent__hold(&io, 0));
	for (unsigned i = 0; i < 4; i++)
		T_CHECK_EQ(t, atomic_load(&s.count[i]), 1);
	atomic_store(&s.slow, false);
	T_CHECK(t, ioevent__hold(&io, 0));   /* holds nest */
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
	T_CHECK(t, ioevent__hold(&io, 0));
	T_CHECK_EQ(t, ioevent__start(&io), 0);
	signal_fd(&io, 0);
	usleep(100000);
	T_CHECK_EQ(t, atomic_load(&s.count[0]), 0);
	ioevent__release(&io);
	T_CHECK_EQ(t, wait_count(&s, 0, 1), 1);
	ioevent__destroy(&io);
}

/* A hold with a deadline while the handler is stuck: false in time, and
 * the thread goes on once the handler returns (a device blocked on a
 * page a post-copy destination lacks). */
static void t_hold_timeout(struct t *t)
{
	struct ioevent io;
	struct seen s = { 0 };
	T_CHECK_EQ(t, ioevent__init(&io, -1, 1, 2, on_event, &s), 0);
	T_CHECK_EQ(t, ioevent__start(&io), 0);
	atomic_store(&s.stuck_ms, 500);
	atomic_store(&s.slow, true);
	signal_fd(&io, 0);
	for (int k = 0; k < 1000 && !atomic_load(&s.entered); k++)
		usleep(100);                  /* the thread is in the handler */
	T_CHECK(t, !ioevent__hold(&io, 1000000));   /* 1 ms */
	T_CHECK_EQ(t, io.holds, 0);
	atomic_store(&s.slow, false);
	T_CHECK_EQ(t, wait_count(&s, 0, 1), 1);
	signal_fd(&io, 0);
	T_CHECK_EQ(t, wait_count(&s, 0, 2), 2);     /* not held: it goes on */
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
	T_RUN(&t, t_hold_timeout);
	T_RUN(&t, t_bad_init);
	return T_DONE(&t);
}
