#include "base/timeutil.h"

#include <errno.h>

void time__sleep_ns(uint64_t ns)
{
	struct timespec ts = { .tv_sec = ns / 1000000000ull, .tv_nsec = ns % 1000000000ull };
	while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
		;
}
