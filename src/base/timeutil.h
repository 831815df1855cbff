/* Monotonic time helpers. */
#ifndef KMIG_BASE_TIMEUTIL_H
#define KMIG_BASE_TIMEUTIL_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

static inline uint64_t time__now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static inline uint64_t time__now_ms(void) { return time__now_ns() / 1000000ull; }
/* The CLOCK_MONOTONIC time ns from now, as pthread_cond_timedwait wants it
 * for a condition variable made by time__cond_init. */
struct timespec time__deadline(uint64_t ns);
/* Initialises c to time its waits on CLOCK_MONOTONIC (immune to clock
 * changes); returns 0 or -errno. */
int time__cond_init(pthread_cond_t *c);
/* Sleeps for ns nanoseconds (restarting after signals). */
void time__sleep_ns(uint64_t ns);

#endif
