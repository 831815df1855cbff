/* rtcwait: waits for the RTC's interrupts from Linux userspace, for the
 * Linux guest's tests (docs/guest.md, "Linux guest userland").
 *
 *   rtcwait [N]     default 3
 *
 * Turns on /dev/rtc0's update interrupts (RTC_UIE_ON: Linux's RTC core
 * programs the chip's alarm for every next second), reads N of them, 5 s
 * at most each, and prints
 *
 *   rtcwait interrupts=K of=N ms=MS [late_ms=L]
 *
 * (MS: from the first to the last, about N-1 seconds on a working clock);
 * status 0 when all N came.  When one did not come in 5 s, it waits LATE_S
 * more: L is how long after giving up the next one came, -1 if none did.
 * An interrupt the chip raised reaches a reader only once Linux's work
 * item for it has run (and that item arms the next alarm), so one that
 * comes late shows a guest too starved to run that item in time (a vCPU
 * the throttle holds); after an interrupt lost on its way to Linux, no
 * alarm is armed and nothing comes (so long as nothing else arms the RTC's
 * alarm or sets its time meanwhile).  An error is printed as
 * "rtcwait error: ...".
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/rtc.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define WAIT_MS 5000
#define LATE_S 20

static long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Whether the next interrupt's report came within ms. */
static int next(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	unsigned long data;
	return poll(&p, 1, ms) == 1 && read(fd, &data, sizeof(data)) == sizeof(data);
}

int main(int argc, char **argv)
{
	char *end = NULL;
	long n = argc > 1 ? strtol(argv[1], &end, 10) : 3;
	if (argc > 2 || (argc > 1 && (*end || n < 1 || n > 100))) {
		fprintf(stderr, "usage: rtcwait [N]  (1..100 interrupts)\n");
		return 2;
	}
	int fd = open("/dev/rtc0", O_RDONLY);
	if (fd < 0 || ioctl(fd, RTC_UIE_ON, 0) < 0) {
		printf("rtcwait error: %s: %s\n", fd < 0 ? "open /dev/rtc0" : "RTC_UIE_ON",
		       strerror(errno));
		return 1;
	}
	long got = 0, first = 0, last = 0;
	while (got < n && next(fd, WAIT_MS)) {
		last = now_ms();
		if (!got++)
			first = last;
	}
	long late = -1;
	if (got < n) {
		long gave_up = now_ms();
		if (next(fd, LATE_S * 1000))
			late = now_ms() - gave_up;
	}
	ioctl(fd, RTC_UIE_OFF, 0);
	close(fd);
	printf("rtcwait interrupts=%ld of=%ld ms=%ld", got, n, last - first);
	if (got < n)
		printf(" late_ms=%ld", late);
	printf("\n");
	return got == n ? 0 : 1;
}
