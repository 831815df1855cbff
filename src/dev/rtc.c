#include "dev/rtc.h"

#include <errno.h>
#include <string.h>
#include <time.h>

enum { R_SEC = 0, R_MIN = 2, R_HOUR = 4, R_WDAY = 6, R_MDAY = 7, R_MON = 8, R_YEAR = 9,
       R_A = 0x0a, R_B = 0x0b, R_C = 0x0c, R_D = 0x0d, R_CENTURY = 0x32 };
#define B_SET 0x80
#define B_BINARY 0x04
#define B_24H 0x02
#define A_UIP 0x80
#define D_VRT 0x80
#define HOUR_PM 0x80
#define RTC_STATE_VERSION 1
/* the guest clock's offset stays within +-10000 years of the host's, where
 * gmtime and timegm are defined and a destination accepts it */
#define RTC_MAX_OFFSET_S 315360000000ll

void rtc__init(struct rtc *r)
{
	memset(r, 0, sizeof(*r));
	pthread_mutex_init(&r->lock, NULL);
	r->ram[R_A] = 0x26;     /* 32.768 kHz time base, 1024 Hz rate */
	r->ram[R_B] = B_24H;    /* 24-hour BCD, as a PC firmware leaves it */
	r->ram[R_D] = D_VRT;
}

void rtc__destroy(struct rtc *r)
{
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

/* The time bytes the guest wrote become its clock (out-of-range fields
 * are left to timegm's normalising, as a real part would roll over). */
static void rtc__commit(struct rtc *r, int64_t host_s)
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
	time_t t = timegm(&tm);
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
	case R_C: return 0;
	case R_D: return D_VRT;
	default: return r->ram[i];
	}
}

static void rtc__write(struct rtc *r, uint8_t v, int64_t host_s)
{
	uint8_t i = r->index;
	if (i == R_B) {
		bool was_set = r->ram[R_B] & B_SET;
		if ((v & B_SET) && !was_set)
			rtc__latch(r, host_s);     /* the guest edits the time as it is now */
		r->ram[R_B] = v;
		if (was_set && !(v & B_SET))
			rtc__commit(r, host_s);
		return;
	}
	if (i == R_C || i == R_D)
		return;                        /* read-only */
	if (i == R_A)
		v &= ~A_UIP;
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
		rtc__write(r, *data, host_s);
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
	if (len != RTC_STATE_SIZE || in[0] != RTC_STATE_VERSION || in[1] >= RTC_RAM_SIZE ||
	    in[2] || in[3])
		return -EINVAL;
	int64_t off;
	memcpy(&off, in + 4 + RTC_RAM_SIZE, sizeof(off));
	if (off > RTC_MAX_OFFSET_S || off < -RTC_MAX_OFFSET_S)
		return -EINVAL;
	pthread_mutex_lock(&r->lock);
	r->index = in[1];
	memcpy(r->ram, in + 4, RTC_RAM_SIZE);
	r->offset_s = off;
	pthread_mutex_unlock(&r->lock);
	return 0;
}
