#include "dev/rtc.h"

#include <errno.h>
#include <string.h>
#include <time.h>

enum { R_SEC = 0, R_MIN = 2, R_HOUR = 4, R_WDAY = 6, R_MDAY = 7, R_MON = 8, R_YEAR = 9,
       R_A = 0x0a, R_B = 0x0b, R_C = 0x0c, R_D = 0x0d, R_CENTURY = 0x32 };
#define B_SET 0x80
#define B_PIE 0x40
#define B_AIE 0x20
#define B_UIE 0x10
#define B_BINARY 0x04
#define B_24H 0x02
#define A_UIP 0x80
#define A_DIV_RUN 0x20          /* divider bits 6:4 = 010: the time base runs */
#define C_IRQF 0x80
#define C_PF 0x40
#define C_AF 0x20
#define C_UF 0x10
#define C_FLAGS 0x70            /* PF, AF, UF: the same bits as PIE, AIE, UIE in B */
#define NS 1000000000ll
#define D_VRT 0x80
#define HOUR_PM 0x80
/* 2: register C holds the interrupt flags (1: always 0); both load */
#define RTC_STATE_VERSION 2
/* the guest clock's offset stays within +-10000 years of the host's, where
 * gmtime and timegm are defined and a destination accepts it */
#define RTC_MAX_OFFSET_S 315360000000ll
#define RTC_CATCH_UP_S 600      /* seconds a late tick looks back for an alarm */
#define RTC_LATE_ALARM_S 3      /* seconds an alarm armed late looks back */

void rtc__init(struct rtc *r)
{
	memset(r, 0, sizeof(*r));
	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->cond, NULL);
	r->last_sec = r->last_period = -1;
	r->ram[R_A] = 0x26;     /* 32.768 kHz time base, 1024 Hz rate */
	r->ram[R_B] = B_24H;    /* 24-hour BCD, as a PC firmware leaves it */
	r->ram[R_D] = D_VRT;
}

void rtc__destroy(struct rtc *r)
{
	pthread_cond_destroy(&r->cond);
	pthread_mutex_destroy(&r->lock);
}

static uint8_t rtc__to_bcd(unsigned v)
{
	return (uint8_t)((v / 10) << 4 | (v % 10));
}

static unsigned rtc__from_bcd(uint8_t v)
{
	return (v >> 4) * 10 + (v & 0x0f);
}

static uint8_t rtc__enc(const struct rtc *r, unsigned v)
{
	return r->ram[R_B] & B_BINARY ? (uint8_t)v : rtc__to_bcd(v);
}

static unsigned rtc__dec(const struct rtc *r, uint8_t v)
{
	return r->ram[R_B] & B_BINARY ? v : rtc__from_bcd(v);
}

static uint8_t rtc__enc_hour(const struct rtc *r, unsigned h)
{
	if (r->ram[R_B] & B_24H)
		return rtc__enc(r, h);
	unsigned h12 = h % 12 ? h % 12 : 12;
	return rtc__enc(r, h12) | (h >= 12 ? HOUR_PM : 0);
}

static unsigned rtc__dec_hour(const struct rtc *r, uint8_t v)
{
	if (r->ram[R_B] & B_24H)
		return rtc__dec(r, v);
	unsigned h = rtc__dec(r, v & ~HOUR_PM) % 12;
	return h + (v & HOUR_PM ? 12 : 0);
}

/* The guest's time, written into the time bytes of RAM. */
static void rtc__latch(struct rtc *r, int64_t host_s)
{
	time_t t = (time_t)(host_s + r->offset_s);
	struct tm tm;
	if (!gmtime_r(&t, &tm))
		return;
	r->ram[R_SEC] = rtc__enc(r, tm.tm_sec);
	r->ram[R_MIN] = rtc__enc(r, tm.tm_min);
	r->ram[R_HOUR] = rtc__enc_hour(r, tm.tm_hour);
	r->ram[R_WDAY] = rtc__enc(r, tm.tm_wday + 1);
	r->ram[R_MDAY] = rtc__enc(r, tm.tm_mday);
	r->ram[R_MON] = rtc__enc(r, tm.tm_mon + 1);
	r->ram[R_YEAR] = rtc__enc(r, (tm.tm_year + 1900) % 100);
	r->ram[R_CENTURY] = rtc__to_bcd((tm.tm_year + 1900) / 100 % 100);
}

/* The guest time the time bytes hold (timegm's normalising for fields
 * out of range, as a real part would roll over); -1 if none. */
static time_t rtc__regs_time(const struct rtc *r)
{
	unsigned century = rtc__from_bcd(r->ram[R_CENTURY]);
	struct tm tm = {
		.tm_sec = (int)rtc__dec(r, r->ram[R_SEC]),
		.tm_min = (int)rtc__dec(r, r->ram[R_MIN]),
		.tm_hour = (int)rtc__dec_hour(r, r->ram[R_HOUR]),
		.tm_mday = (int)rtc__dec(r, r->ram[R_MDAY]),
		.tm_mon = (int)rtc__dec(r, r->ram[R_MON]) - 1,
		.tm_year = (int)((century ? century : 20) * 100 + rtc__dec(r, r->ram[R_YEAR])) - 1900,
	};
	return timegm(&tm);
}

/* The time bytes the guest wrote become its clock. */
static void rtc__commit(struct rtc *r, int64_t host_s)
{
	time_t t = rtc__regs_time(r);
	int64_t off = (int64_t)t - host_s;
	if (t != (time_t)-1 && off <= RTC_MAX_OFFSET_S && off >= -RTC_MAX_OFFSET_S)
		r->offset_s = off;      /* else the time written is ignored */
}

/* The bytes that hold the time (not the alarm bytes 1, 3 and 5). */
static bool rtc__is_time(uint8_t i)
{
	return i == R_SEC || i == R_MIN || i == R_HOUR || (i >= R_WDAY && i <= R_YEAR) ||
	       i == R_CENTURY;
}

/* ---------------------------------------------------------- interrupts */

static bool rtc__running(const struct rtc *r)
{
	return (r->ram[R_A] & 0x70) == A_DIV_RUN;
}

/* The periodic interrupt's period in ns, 0 for none (rates 1 and 2 of a
 * 32.768 kHz time base are those of 8 and 9). */
static int64_t rtc__period_ns(const struct rtc *r)
{
	unsigned rate = r->ram[R_A] & 0x0f;
	if (!rate || !(r->ram[R_B] & B_PIE) || !rtc__running(r))
		return 0;
	if (rate < 3)
		rate += 7;
	return (NS << (rate - 1)) / 32768;
}

/* UF and AF come with the updates: not while SET holds them. */
static bool rtc__updates(const struct rtc *r)
{
	return (r->ram[R_B] & (B_UIE | B_AIE)) && !(r->ram[R_B] & B_SET) && rtc__running(r);
}

static void rtc__set_line(struct rtc *r, bool level)
{
	bool changed = level != r->line;
	r->line = level;
	if (changed && r->irq && !r->held)
		r->irq(r->irq_ctx, level);
}

void rtc__hold(struct rtc *r)
{
	pthread_mutex_lock(&r->lock);
	r->held++;
	pthread_mutex_unlock(&r->lock);
}

void rtc__release(struct rtc *r)
{
	pthread_mutex_lock(&r->lock);
	if (r->held && !--r->held && r->irq)
		r->irq(r->irq_ctx, r->line);
	pthread_mutex_unlock(&r->lock);
}

/* IRQF exactly while a flag is set whose interrupt is enabled; the line
 * follows. */
static void rtc__update_irq(struct rtc *r)
{
	if (r->ram[R_C] & r->ram[R_B] & C_FLAGS)
		r->ram[R_C] |= C_IRQF;
	else
		r->ram[R_C] &= ~C_IRQF;
	rtc__set_line(r, r->ram[R_C] & C_IRQF);
}

static bool rtc__alarm_byte(uint8_t alarm, uint8_t now)
{
	return alarm >= 0xc0 || alarm == now;
}

int64_t rtc__next_event_ns(const struct rtc *r, int64_t host_ns)
{
	int64_t next = -1, p = rtc__period_ns(r);
	if (rtc__updates(r))
		next = (host_ns / NS + 1) * NS;
	if (p && (next < 0 || (host_ns / p + 1) * p < next))
		next = (host_ns / p + 1) * p;
	return next;
}

static bool rtc__alarm_now(const struct rtc *r)
{
	return rtc__alarm_byte(r->ram[1], r->ram[R_SEC]) &&
	       rtc__alarm_byte(r->ram[3], r->ram[R_MIN]) &&
	       rtc__alarm_byte(r->ram[5], r->ram[R_HOUR]);
}

/* AIE just turned on: an alarm for a second that passed in the last
 * RTC_LATE_ALARM_S (this one included) comes now.  A guest arms the alarm
 * for a second still ahead when it reads the clock (Linux: the next
 * second), then writes it; if its vCPU stopped in between (a migration's
 * throttle sleeps up to a second, the switchover longer) the second has
 * passed by the time AIE goes on, and a real part would wait a day. */
static void rtc__late_alarm(struct rtc *r, int64_t host_s)
{
	if (!rtc__updates(r) || (r->ram[R_C] & C_AF))
		return;
	for (int64_t s = host_s - RTC_LATE_ALARM_S; s <= host_s; s++) {
		rtc__latch(r, s);
		if (rtc__alarm_now(r)) {
			r->ram[R_C] |= C_AF;
			break;
		}
	}
	rtc__latch(r, host_s);
}

void rtc__tick_at(struct rtc *r, int64_t host_ns)
{
	int64_t sec = host_ns / NS, p = rtc__period_ns(r);
	/* an interrupt just enabled counts from when it was (rtc__pio_at) or,
	 * failing that, from now; never from its last use */
	if (rtc__updates(r) && sec != r->last_sec) {
		bool was = r->last_sec >= 0;
		int64_t from = r->last_sec;
		r->last_sec = sec;
		if (was) {
			/* every second since the last tick, not only this one: an
			 * alarm due while the VM was stopped (a migration's
			 * switchover) or this thread late comes now, as on a part
			 * whose clock went on */
			if (sec - from > RTC_CATCH_UP_S || sec < from)
				from = sec - 1;
			for (int64_t s = from + 1; s <= sec && !(r->ram[R_C] & C_AF); s++) {
				rtc__latch(r, s);
				if (rtc__alarm_now(r))
					r->ram[R_C] |= C_AF;
			}
			rtc__latch(r, sec);
			r->ram[R_C] |= C_UF;
		}
	} else if (!rtc__updates(r)) {
		r->last_sec = -1;
	}
	if (p && host_ns / p != r->last_period) {
		bool was = r->last_period >= 0;
		r->last_period = host_ns / p;
		if (was)
			r->ram[R_C] |= C_PF;
	} else if (!p) {
		r->last_period = -1;
	}
	rtc__update_irq(r);
}

static int64_t rtc__now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * NS + ts.tv_nsec;
}

static void *rtc__thread(void *arg)
{
	struct rtc *r = arg;
	pthread_setname_np(pthread_self(), "rtc");
	pthread_mutex_lock(&r->lock);
	while (!r->stopping) {
		int64_t now = rtc__now_ns();
		rtc__tick_at(r, now);
		int64_t next = rtc__next_event_ns(r, now);
		if (next < 0) {
			pthread_cond_wait(&r->cond, &r->lock);
		} else {
			struct timespec ts = { (time_t)(next / NS), (long)(next % NS) };
			pthread_cond_timedwait(&r->cond, &r->lock, &ts);
		}
	}
	pthread_mutex_unlock(&r->lock);
	return NULL;
}

int rtc__start(struct rtc *r, rtc_irq_fn irq, void *ctx)
{
	pthread_mutex_lock(&r->lock);
	r->irq = irq;
	r->irq_ctx = ctx;
	r->stopping = false;
	pthread_mutex_unlock(&r->lock);
	int rc = pthread_create(&r->thread, NULL, rtc__thread, r);
	r->running = rc == 0;
	return -rc;
}

void rtc__stop(struct rtc *r)
{
	if (!r->running)
		return;
	pthread_mutex_lock(&r->lock);
	r->stopping = true;
	pthread_cond_signal(&r->cond);
	pthread_mutex_unlock(&r->lock);
	pthread_join(r->thread, NULL);
	r->running = false;
}

/* ---------------------------------------------------------- registers */

static uint8_t rtc__read(struct rtc *r, int64_t host_s)
{
	uint8_t i = r->index;
	if (rtc__is_time(i)) {
		if (!(r->ram[R_B] & B_SET))
			rtc__latch(r, host_s);
		return r->ram[i];
	}
	switch (i) {
	case R_A: return r->ram[R_A] & ~A_UIP;
	case R_C: {
		uint8_t c = r->ram[R_C];     /* reading acknowledges */
		r->ram[R_C] = 0;
		rtc__set_line(r, false);
		return c;
	}
	case R_D: return D_VRT;
	default: return r->ram[i];
	}
}

static void rtc__write(struct rtc *r, uint8_t v, int64_t host_s)
{
	uint8_t i = r->index;
	if (i == R_B) {
		bool was_set = r->ram[R_B] & B_SET;
		bool aie_on = (v & B_AIE) && !(r->ram[R_B] & B_AIE);
		if (v & B_SET)
			v &= ~B_UIE;                /* SET clears UIE, as on the MC146818A */
		if ((v & B_SET) && !was_set)
			rtc__latch(r, host_s);     /* the guest edits the time as it is now */
		r->ram[R_B] = v;
		if (was_set && !(v & B_SET))
			rtc__commit(r, host_s);
		if (aie_on)
			rtc__late_alarm(r, host_s);
		rtc__update_irq(r);
		pthread_cond_signal(&r->cond);  /* the next event may have moved */
		return;
	}
	if (i == R_C || i == R_D)
		return;                        /* read-only */
	if (i == R_A) {
		if ((v ^ r->ram[R_A]) & 0x7f)
			r->last_period = -1;       /* a new rate counts from now */
		r->ram[R_A] = v & ~A_UIP;
		pthread_cond_signal(&r->cond);
		return;
	}
	if (rtc__is_time(i) && !(r->ram[R_B] & B_SET)) {
		/* outside SET a write takes effect at once, on the time as it is now */
		rtc__latch(r, host_s);
		r->ram[i] = v;
		rtc__commit(r, host_s);
		return;
	}
	r->ram[i] = v;
}

void rtc__pio_at(struct rtc *r, uint16_t port, bool is_write, uint8_t *data, int64_t host_s)
{
	pthread_mutex_lock(&r->lock);
	if (port == RTC_BASE) {
		if (is_write)
			r->index = *data & 0x7f;   /* bit 7 masks NMIs on a PC */
		else
			*data = 0xff;
	} else if (is_write) {
		bool updating = rtc__updates(r);
		rtc__write(r, *data, host_s);
		/* the updates count from the second they were enabled in, not
		 * from the thread's next tick: a thread late into the next
		 * second still finds that second's alarm.  The time bytes hold
		 * that second too, for a load to count from it (rtc__load). */
		if (!updating && rtc__updates(r)) {
			r->last_sec = host_s;
			rtc__latch(r, host_s);
		}
	} else {
		*data = rtc__read(r, host_s);
	}
	pthread_mutex_unlock(&r->lock);
}

void rtc__pio(struct rtc *r, uint16_t port, bool is_write, uint8_t *data)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	rtc__pio_at(r, port, is_write, data, (int64_t)ts.tv_sec);
}

void rtc__save(struct rtc *r, uint8_t out[RTC_STATE_SIZE])
{
	pthread_mutex_lock(&r->lock);
	memset(out, 0, RTC_STATE_SIZE);
	out[0] = RTC_STATE_VERSION;
	out[1] = r->index;
	memcpy(out + 4, r->ram, RTC_RAM_SIZE);
	int64_t off = r->offset_s;
	memcpy(out + 4 + RTC_RAM_SIZE, &off, sizeof(off));
	pthread_mutex_unlock(&r->lock);
}

int rtc__load(struct rtc *r, const uint8_t *in, size_t len)
{
	if (len != RTC_STATE_SIZE || (in[0] != RTC_STATE_VERSION && in[0] != 1) ||
	    in[1] >= RTC_RAM_SIZE || in[2] || in[3] || (in[4 + R_C] & ~(C_IRQF | C_FLAGS)))
		return -EINVAL;
	int64_t off;
	memcpy(&off, in + 4 + RTC_RAM_SIZE, sizeof(off));
	if (off > RTC_MAX_OFFSET_S || off < -RTC_MAX_OFFSET_S)
		return -EINVAL;
	pthread_mutex_lock(&r->lock);
	r->index = in[1];
	memcpy(r->ram, in + 4, RTC_RAM_SIZE);
	r->offset_s = off;
	/* the source's last tick, from the time it latched there: the first
	 * tick here goes on from it (an alarm due during the switchover is
	 * not lost); -1 when the bytes hold no time */
	time_t t = rtc__regs_time(r);
	r->last_sec = rtc__updates(r) && t != (time_t)-1 ? (int64_t)t - off : -1;
	/* the line is driven to the level the state holds, whatever level this
	 * side last set: the irqchip's state, loaded before, holds the level
	 * the source left (the next read of C must lower it there, or the next
	 * flag raises no edge), or a lower one when a flag came after the
	 * irqchip was saved (this raises it); while held (the VM is paused,
	 * its vCPUs' state perhaps not loaded yet), at the release */
	bool level = r->ram[R_C] & r->ram[R_B] & C_FLAGS;
	r->line = !level;
	rtc__update_irq(r);
	pthread_cond_signal(&r->cond);
	pthread_mutex_unlock(&r->lock);
	return 0;
}
