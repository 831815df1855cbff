/* Monotonic time helpers. */
#ifndef KMIG_BASE_TIMEUTIL_H
#define KMIG_BASE_TIMEUTIL_H

#include <stdint.h>
#include <time.h>

static inline uint64_t time__now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static inline uint64_t time__now_ms(void) { return time__now_ns() / 1000000ull; }
/* Sleeps for ns nanoseconds (restarting after signals). */
void time__sleep_ns(uint64_t ns);

#endif
