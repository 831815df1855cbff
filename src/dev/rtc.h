/* MC146818 CMOS real-time clock at ports 0x70 (index) and 0x71 (data), as
 * a PC has it: what Linux's rtc_cmos and its boot-time wall clock read.
 *
 * The clock is the host's wall clock (CLOCK_REALTIME, UTC) plus an offset
 * the guest sets by writing the time: registers 0x00..0x09 while register
 * B's SET bit is on are held, and clearing SET makes them the guest's new
 * time.  Register A never shows update-in-progress (a read always sees a
 * settled time), register D always says the battery is good.
 *
 * Interrupts (IRQ 8): while register B's UIE or AIE is on, register C's UF
 * and AF are set as a real part sets them, and PF while PIE is on (a real
 * part sets all three whenever it runs; here a guest polling a flag whose
 * interrupt is off sees none) — UF at every second of the guest's time, AF when that second matches the alarm bytes (1, 3, 5;
 * a byte of 0xc0 or more matches any value), PF at every period of
 * register A's rate (rates 1 and 2 as 8 and 9; 0 or a stopped divider:
 * none) — and IRQF with them when an enabled flag is set; the IRQ line
 * is high while IRQF is, and reading C returns the flags, clears them and
 * lowers the line; IRQF is set exactly while a flag is whose interrupt is
 * enabled.  SET clears UIE, as on the MC146818A.  One departure from the
 * part, for guests whose vCPUs a migration stops (throttle sleeps, the
 * switchover): when AIE turns on and the alarm bytes match a second of
 * the last 3 (the current one included), AF comes at once, not a day
 * later; an alarm seconds late is an alarm armed by a guest stopped
 * between reading the clock and writing the alarm (Linux never arms one
 * for the current second: it fires those itself).  rtc__start runs the
 * thread that does this at each event's time; rtc__tick_at is its step,
 * pure but for the irq callback, which runs with the RTC's lock held and
 * must not call back into the RTC.  Register B's data mode (BCD or binary) and hour
 * mode (12 or 24) apply to what is read and written; a time more than
 * 10000 years from the host's is ignored (it could not migrate).  The other bytes of
 * the 128-byte CMOS RAM are plain storage; 0x32 is the BCD century.
 *
 * State (index, RAM, offset) migrates: the destination's clock goes on
 * from the same offset against its own host clock.  Pure logic apart from
 * reading the host clock: rtc__pio_at takes the time for tests.
 * Thread-safe: any vCPU thread may call rtc__pio. */
#ifndef KMIG_DEV_RTC_H
#define KMIG_DEV_RTC_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"

#define RTC_BASE 0x70
#define RTC_IRQ 8
#define RTC_NPORTS 2
#define RTC_RAM_SIZE 128
#define RTC_STATE_SIZE (4 + RTC_RAM_SIZE + 8) /* version, index, 2 pad; RAM; offset */

typedef void (*rtc_irq_fn)(void *ctx, bool level);

struct rtc {
	pthread_mutex_t lock;
	uint8_t index;
	uint8_t ram[RTC_RAM_SIZE];  /* time bytes 0..9 only meaningful while SET;
				     * 0x0c: register C's flags */
	int64_t offset_s;           /* guest time = host time + offset */
	/* interrupts: the line, the last second and period ticked (host ns) */
	rtc_irq_fn irq;
	void *irq_ctx;
	bool line;
	unsigned held;              /* rtc__hold depth: the line is not driven */
	int64_t last_sec, last_period;
	pthread_cond_t cond;        /* a register that moves the next event changed */
	pthread_t thread;
	bool running, stopping;
};

void rtc__init(struct rtc *r);
/* rtc__stop first if started. */
void rtc__destroy(struct rtc *r);
/* The interrupt thread, raising irq (IRQ 8's line) from now on. */
int rtc__start(struct rtc *r, rtc_irq_fn irq, void *ctx) KMIG_MUST_CHECK;
void rtc__stop(struct rtc *r);
/* The host time (ns since the epoch) of the next event the guest enabled,
 * or -1 (lock held). */
int64_t rtc__next_event_ns(const struct rtc *r, int64_t host_ns);
/* The events due by host_ns: flags set, the line raised (lock held). */
void rtc__tick_at(struct rtc *r, int64_t host_ns);
/* One byte of port I/O at RTC_BASE..RTC_BASE+1. */
void rtc__pio(struct rtc *r, uint16_t port, bool is_write, uint8_t *data);
/* The same with the host's time given (seconds since the epoch, UTC). */
void rtc__pio_at(struct rtc *r, uint16_t port, bool is_write, uint8_t *data, int64_t host_s);
void rtc__save(struct rtc *r, uint8_t out[RTC_STATE_SIZE]);
/* -EINVAL for a wrong size, version, index, register C value or offset.
 * Drives the interrupt line (when connected and not held) to the level the
 * state holds: call it after the irqchip's state is loaded. */
int rtc__load(struct rtc *r, const uint8_t *in, size_t len);
/* While the vCPUs are paused (a level of rtc__hold per pause level) the
 * clock goes on and sets its flags, but the line is not driven: an
 * interrupt raised then would reach local APICs whose state is not there
 * yet (a migration's destination loads the vCPUs after the devices, and a
 * fresh local APIC drops it) or is being saved (the source).  The last
 * rtc__release drives the line to its level: a flag that came meanwhile
 * raises an edge once the vCPUs' state is in place. */
void rtc__hold(struct rtc *r);
void rtc__release(struct rtc *r);

#endif
