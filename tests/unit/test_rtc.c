/* CMOS RTC (src/dev/rtc.c): the time as the guest reads it in BCD and
 * binary, 12- and 24-hour modes; setting the time under SET and outside
 * it, alarm bytes; register A,
 * C, D; index masking; state save/load and its refusals; the update,
 * alarm and periodic interrupts (flags, IRQF, the line, the next event),
 * stepped with rtc__tick_at. */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "dev/rtc.h"
#include "harness.h"

/* 2026-12-02 13:45:07 UTC, a Wednesday */
#define T0 1796219107ll

static uint8_t rd(struct rtc *r, uint8_t reg, int64_t now)
{
	uint8_t v = reg;
	rtc__pio_at(r, RTC_BASE, true, &v, now);
	rtc__pio_at(r, RTC_BASE + 1, false, &v, now);
	return v;
}

static void wr(struct rtc *r, uint8_t reg, uint8_t val, int64_t now)
{
	rtc__pio_at(r, RTC_BASE, true, &reg, now);
	rtc__pio_at(r, RTC_BASE + 1, true, &val, now);
}

#define NS 1000000000ll

/* The alarm bytes for 13:45:sec (BCD), written at now. */
static void alarm_at(struct rtc *r, uint8_t sec, int64_t now)
{
	wr(r, 0x01, sec, now);
	wr(r, 0x03, 0x45, now);
	wr(r, 0x05, 0x13, now);
}

struct line { int level, raises; };

static void on_irq(void *ctx, bool level)
{
	struct line *l = ctx;
	l->raises += level && !l->level;
	l->level = level;
}

/* An RTC whose line goes to l (no thread: the test steps it). */
static void irq_rtc(struct rtc *r, struct line *l)
{
	rtc__init(r);
	memset(l, 0, sizeof(*l));
	r->irq = on_irq;
	r->irq_ctx = l;
}

/* UIE: UF and IRQF at each second of the guest's time, the line high
 * until C is read; the next event is the next whole second. */
static void t_update_irq(struct t *t)
{
	struct rtc r;
	struct line l;
	irq_rtc(&r, &l);
	int64_t ns = T0 * NS + 300000000;           /* 13:45:07.3 */
	T_CHECK_EQ(t, rtc__next_event_ns(&r, ns), -1);  /* nothing enabled */
	wr(&r, 0x0b, 0x02 | 0x10, T0);              /* 24-hour BCD, UIE */
	rtc__tick_at(&r, ns);                       /* counts from now: no flag yet */
	T_CHECK_EQ(t, l.raises, 0);
	T_CHECK_EQ(t, rtc__next_event_ns(&r, ns), (T0 + 1) * NS);
	rtc__tick_at(&r, ns + 100000000);           /* the same second: nothing */
	T_CHECK_EQ(t, l.raises, 0);
	rtc__tick_at(&r, (T0 + 1) * NS);
	T_CHECK(t, l.level == 1 && l.raises == 1);
	T_CHECK_EQ(t, rd(&r, 0x0c, T0 + 1), 0x90);  /* IRQF | UF, then cleared */
	T_CHECK_EQ(t, l.level, 0);
	T_CHECK_EQ(t, rd(&r, 0x0c, T0 + 1), 0);
	rtc__tick_at(&r, (T0 + 2) * NS + 5);
	T_CHECK(t, l.level == 1 && l.raises == 2);
	/* not read: the next second sets UF again, the line stays high */
	rtc__tick_at(&r, (T0 + 3) * NS);
	T_CHECK(t, l.level == 1 && l.raises == 2);
	/* UIE off with UF pending: IRQF and the line go down; on again: up,
	 * a new edge */
	wr(&r, 0x0b, 0x02, T0 + 3);
	T_CHECK(t, l.level == 0 && (rd(&r, 0x0c, T0 + 3) & 0x80) == 0);
	rtc__tick_at(&r, (T0 + 4) * NS);
	wr(&r, 0x0b, 0x02 | 0x10, T0 + 4);
	rtc__tick_at(&r, (T0 + 4) * NS + 1);
	rtc__tick_at(&r, (T0 + 5) * NS);
	T_CHECK(t, l.level == 1 && l.raises == 3);
	/* SET holds the updates, and clears UIE */
	wr(&r, 0x0b, 0x80 | 0x02 | 0x10, T0 + 5);
	T_CHECK_EQ(t, rd(&r, 0x0b, T0 + 5), 0x82);
	T_CHECK_EQ(t, rtc__next_event_ns(&r, (T0 + 5) * NS), -1);
	rtc__destroy(&r);
}

/* AIE: AF only at the second the alarm bytes match (0xc0 and above: any
 * value); UF is set too, but raises nothing without UIE; enabling UIE
 * with UF pending raises IRQF at once. */
static void t_alarm_irq(struct t *t)
{
	struct rtc r;
	struct line l;
	irq_rtc(&r, &l);
	alarm_at(&r, 0x10, T0);                     /* alarm 13:45:10 */
	wr(&r, 0x0b, 0x02 | 0x20, T0);              /* AIE */
	rtc__tick_at(&r, T0 * NS);
	for (int64_t s = T0 + 1; s <= T0 + 2; s++)
		rtc__tick_at(&r, s * NS);
	T_CHECK_EQ(t, l.raises, 0);
	T_CHECK_EQ(t, rd(&r, 0x0c, T0 + 2), 0x10);  /* UF alone */
	rtc__tick_at(&r, (T0 + 3) * NS);            /* 13:45:10 */
	T_CHECK_EQ(t, l.raises, 1);
	T_CHECK_EQ(t, rd(&r, 0x0c, T0 + 3), 0xb0);  /* IRQF | AF | UF */
	rtc__tick_at(&r, (T0 + 4) * NS);
	T_CHECK_EQ(t, l.raises, 1);
	wr(&r, 0x05, 0xff, T0 + 4);                 /* any hour, any minute */
	wr(&r, 0x03, 0xc0, T0 + 4);
	rtc__tick_at(&r, (T0 + 63) * NS);           /* 13:46:10 */
	T_CHECK_EQ(t, l.raises, 2);
	rd(&r, 0x0c, T0 + 63);
	rtc__tick_at(&r, (T0 + 64) * NS);           /* UF pending, no UIE */
	T_CHECK_EQ(t, l.level, 0);
	wr(&r, 0x0b, 0x02 | 0x20 | 0x10, T0 + 64);  /* UIE now: IRQF at once */
	T_CHECK(t, l.level == 1 && l.raises == 3);
	rtc__destroy(&r);
}

/* An alarm due at a second no tick saw (the VM stopped for a migration's
 * switchover across it, or the RTC's thread late) comes at the next
 * tick, also on a destination that loaded the state. */
static void t_alarm_late(struct t *t)
{
	struct rtc r, d;
	struct line l, ld;
	uint8_t st[RTC_STATE_SIZE];
	irq_rtc(&r, &l);
	alarm_at(&r, 0x10, T0);                     /* alarm 13:45:10, T0 + 3 */
	wr(&r, 0x0b, 0x02 | 0x20, T0);              /* AIE */
	rtc__tick_at(&r, T0 * NS);
	rtc__tick_at(&r, (T0 + 1) * NS);
	rtc__tick_at(&r, (T0 + 5) * NS);            /* T0 + 3 never ticked */
	T_CHECK_EQ(t, l.raises, 1);
	T_CHECK_EQ(t, rd(&r, 0x0c, T0 + 5), 0xb0);
	/* saved after the tick of 13:46:09 with the alarm due at 13:46:10
	 * (any minute), loaded on a destination that first ticks at 13:46:12 */
	rtc__tick_at(&r, (T0 + 62) * NS);
	wr(&r, 0x03, 0xc0, T0 + 62);
	rtc__save(&r, st);
	irq_rtc(&d, &ld);
	T_CHECK_EQ(t, rtc__load(&d, st, sizeof(st)), 0);
	rtc__tick_at(&d, (T0 + 65) * NS);
	T_CHECK_EQ(t, ld.raises, 1);
	T_CHECK_EQ(t, rd(&d, 0x0c, T0 + 65), 0xb0);
	rtc__destroy(&r);
	rtc__destroy(&d);
}

/* AIE turned on with the alarm for a second that has just passed (the
 * guest stopped between reading the clock and arming it): AF at once; one
 * more than 3 seconds back, or one still ahead, waits for its second. */
static void t_alarm_armed_late(struct t *t)
{
	struct rtc r;
	struct line l;
	irq_rtc(&r, &l);
	rtc__tick_at(&r, (T0 + 3) * NS + 500000000);
	alarm_at(&r, 0x10, T0 + 3);                 /* 13:45:10 = T0 + 3: this second */
	wr(&r, 0x0b, 0x02 | 0x20, T0 + 3);
	T_CHECK(t, l.level == 1 && l.raises == 1);
	T_CHECK_EQ(t, rd(&r, 0x0c, T0 + 3), 0xa0);  /* IRQF | AF */
	wr(&r, 0x0b, 0x02, T0 + 5);                 /* AIE off, armed again 2 s late */
	wr(&r, 0x0b, 0x02 | 0x20, T0 + 5);
	T_CHECK_EQ(t, l.raises, 2);
	rd(&r, 0x0c, T0 + 5);
	wr(&r, 0x0b, 0x02, T0 + 7);                 /* 4 s late: a day away, as on the part */
	wr(&r, 0x0b, 0x02 | 0x20, T0 + 7);
	T_CHECK(t, l.level == 0 && l.raises == 2);
	wr(&r, 0x0b, 0x02, T0 + 7);                 /* ahead: at its second, not before */
	wr(&r, 0x01, 0x15, T0 + 7);                 /* 13:45:15 = T0 + 8 */
	wr(&r, 0x0b, 0x02 | 0x20, T0 + 7);
	T_CHECK_EQ(t, l.raises, 2);
	rtc__tick_at(&r, (T0 + 7) * NS + 600000000);
	rtc__tick_at(&r, (T0 + 8) * NS);
	T_CHECK(t, l.level == 1 && l.raises == 3);
	rtc__destroy(&r);
}

/* The clock's thread late (a loaded host): AIE went on at T0 with the
 * alarm for T0 + 1, and the thread's first tick since comes only in
 * T0 + 1.  The alarm is still due: the updates count from the second they
 * were enabled in, not from the thread's first tick (Linux arms each next
 * alarm from the last one's interrupt: one lost, and its RTC never
 * interrupts again).  The same when SET ends or the divider starts. */
static void t_enabled_before_tick(struct t *t)
{
	struct rtc r;
	struct line l;
	irq_rtc(&r, &l);
	alarm_at(&r, 0x08, T0);                     /* alarm 13:45:08 = T0 + 1 */
	wr(&r, 0x0b, 0x02 | 0x20, T0);
	T_CHECK_EQ(t, l.raises, 0);
	rtc__tick_at(&r, (T0 + 1) * NS + 50000000);
	T_CHECK(t, l.level == 1 && l.raises == 1);
	T_CHECK_EQ(t, rd(&r, 0x0c, T0 + 1), 0xb0);  /* IRQF | AF | UF */
	/* SET (the thread ticks while it holds the updates), ended at T0 + 1
	 * with UIE on: UF at the next second, however late the tick */
	int before = l.raises;
	wr(&r, 0x0b, 0x80 | 0x02, T0 + 1);
	rtc__tick_at(&r, (T0 + 1) * NS + 2000);
	wr(&r, 0x0b, 0x02 | 0x10, T0 + 1);
	rtc__tick_at(&r, (T0 + 2) * NS + 900000000);
	T_CHECK(t, l.level == 1 && l.raises == before + 1);
	rd(&r, 0x0c, T0 + 2);
	/* the divider held, then started at T0 + 3 */
	before = l.raises;
	wr(&r, 0x0a, 0x76, T0 + 2);
	rtc__tick_at(&r, (T0 + 3) * NS);
	wr(&r, 0x0a, 0x26, T0 + 3);
	rtc__tick_at(&r, (T0 + 4) * NS + 10);
	T_CHECK(t, l.level == 1 && l.raises == before + 1);
	rtc__destroy(&r);
}

/* Saved between the write that enabled the updates and the thread's first
 * tick (a migration's switchover can fall there): the destination counts
 * from the same second as the source, so an alarm for a second before the
 * enabling write comes on neither (the time bytes, from which a load
 * takes the last second, hold the enabling write's). */
static void t_enabled_then_saved(struct t *t)
{
	struct rtc r, d;
	struct line l, ld;
	uint8_t st[RTC_STATE_SIZE];
	irq_rtc(&r, &l);
	rd(&r, 0x00, T0 - 10);                      /* the guest reads the clock */
	wr(&r, 0x0a, 0x76, T0 - 10);                /* divider held */
	alarm_at(&r, 0x02, T0 - 10);                /* alarm 13:45:02 = T0 - 5 */
	wr(&r, 0x0b, 0x02 | 0x20, T0 - 10);
	wr(&r, 0x0a, 0x26, T0);                     /* started at T0 */
	rtc__save(&r, st);
	irq_rtc(&d, &ld);
	T_CHECK_EQ(t, rtc__load(&d, st, sizeof(st)), 0);
	rtc__tick_at(&r, (T0 + 1) * NS);
	rtc__tick_at(&d, (T0 + 1) * NS);
	T_CHECK_EQ(t, rd(&r, 0x0c, T0 + 1), 0x10);  /* UF only: no alarm */
	T_CHECK_EQ(t, rd(&d, 0x0c, T0 + 1), 0x10);
	T_CHECK(t, l.raises == 0 && ld.raises == 0);
	rtc__destroy(&r);
	rtc__destroy(&d);
}

/* Alarm bytes "any" (every second), then AIE on at T0. */
static void alarm_every_second(struct rtc *r)
{
	wr(r, 0x01, 0xc0, T0);
	wr(r, 0x03, 0xc0, T0);
	wr(r, 0x05, 0xc0, T0);
	wr(r, 0x0b, 0x02 | 0x20, T0);
}

/* Saved with the line high (an alarm the guest has not acknowledged: the
 * VM stopped for the switchover just after it): the destination's
 * irqchip holds that level, so the destination's RTC must lower the line
 * when the guest reads C, or the next alarm raises no edge and the guest
 * never hears from its RTC again. */
static void t_load_line_high(struct t *t)
{
	struct rtc r, d;
	struct line l, ld;
	uint8_t st[RTC_STATE_SIZE];
	irq_rtc(&r, &l);
	alarm_every_second(&r);
	rtc__tick_at(&r, T0 * NS);
	rtc__tick_at(&r, (T0 + 1) * NS);
	T_CHECK(t, l.level == 1 && l.raises == 1);
	rtc__save(&r, st);
	irq_rtc(&d, &ld);
	ld.level = 1;                               /* as the irqchip's state left it */
	T_CHECK_EQ(t, rtc__load(&d, st, sizeof(st)), 0);
	T_CHECK_EQ(t, rd(&d, 0x0c, T0 + 1), 0xb0);  /* the guest's handler */
	T_CHECK_EQ(t, ld.level, 0);
	rtc__tick_at(&d, (T0 + 2) * NS);
	T_CHECK(t, ld.level == 1 && ld.raises == 1);
	/* a flag that came after the irqchip was saved (its level low there):
	 * the load raises the line */
	irq_rtc(&d, &ld);
	T_CHECK_EQ(t, rtc__load(&d, st, sizeof(st)), 0);
	T_CHECK(t, ld.level == 1 && ld.raises == 1);
	rtc__destroy(&r);
	rtc__destroy(&d);
}

/* While held (the VM paused, a destination's vCPUs perhaps not loaded):
 * the clock sets its flags but the line stays where it was; the last
 * release drives it, so the alarm that came meanwhile raises its edge
 * then.  Holds nest.  A load while held drives nothing either. */
static void t_hold_line(struct t *t)
{
	struct rtc r, d;
	struct line l, ld;
	uint8_t st[RTC_STATE_SIZE];
	irq_rtc(&r, &l);
	alarm_every_second(&r);                     /* this second's alarm too */
	rtc__tick_at(&r, T0 * NS);
	T_CHECK(t, l.level == 1 && l.raises == 1);
	rd(&r, 0x0c, T0);                           /* acknowledged */
	l.raises = 0;
	rtc__hold(&r);
	rtc__hold(&r);
	rtc__tick_at(&r, (T0 + 1) * NS);
	T_CHECK(t, l.level == 0 && l.raises == 0);
	T_CHECK_EQ(t, rd(&r, 0x0c, T0 + 1) & 0xa0, 0xa0);  /* the flags are set */
	rtc__tick_at(&r, (T0 + 2) * NS);
	rtc__release(&r);
	T_CHECK(t, l.level == 0 && l.raises == 0);
	rtc__release(&r);
	T_CHECK(t, l.level == 1 && l.raises == 1);
	rtc__release(&r);                           /* one too many: nothing */
	T_CHECK(t, l.level == 1 && l.raises == 1);
	rtc__save(&r, st);
	irq_rtc(&d, &ld);
	rtc__hold(&d);
	T_CHECK_EQ(t, rtc__load(&d, st, sizeof(st)), 0);
	rtc__tick_at(&d, (T0 + 3) * NS);
	T_CHECK(t, ld.level == 0 && ld.raises == 0);
	rtc__release(&d);
	T_CHECK(t, ld.level == 1 && ld.raises == 1);
	rtc__destroy(&r);
	rtc__destroy(&d);
}

/* PIE: PF at each period of register A's rate; rates 1 and 2 are 8 and 9;
 * rate 0 or a stopped divider: no event. */
static void t_periodic_irq(struct t *t)
{
	struct rtc r;
	struct line l;
	irq_rtc(&r, &l);
	int64_t ns = T0 * NS, p = NS / 1024;       /* rate 6: 1024 Hz */
	wr(&r, 0x0a, 0x26, T0);
	wr(&r, 0x0b, 0x02 | 0x40, T0);
	rtc__tick_at(&r, ns);
	int64_t next = rtc__next_event_ns(&r, ns);
	T_CHECK(t, next > ns && next <= ns + p + 1);
	rtc__tick_at(&r, next);
	T_CHECK_EQ(t, l.raises, 1);
	T_CHECK_EQ(t, rd(&r, 0x0c, T0), 0xc0);      /* IRQF | PF */
	wr(&r, 0x0a, 0x2f, T0);                     /* rate 15 (2 Hz), counted from now */
	rtc__tick_at(&r, next + 1);
	T_CHECK_EQ(t, rd(&r, 0x0c, T0), 0);
	rtc__tick_at(&r, rtc__next_event_ns(&r, next + 1));
	T_CHECK_EQ(t, rd(&r, 0x0c, T0), 0xc0);
	wr(&r, 0x0a, 0x21, T0);                     /* rate 1: as 8, 256 Hz */
	next = rtc__next_event_ns(&r, ns);
	T_CHECK(t, next > ns && next <= ns + NS / 256 + 1);
	wr(&r, 0x0a, 0x20, T0);                     /* rate 0 */
	T_CHECK_EQ(t, rtc__next_event_ns(&r, ns), -1);
	wr(&r, 0x0a, 0x76, T0);                     /* divider held in reset */
	T_CHECK_EQ(t, rtc__next_event_ns(&r, ns), -1);
	wr(&r, 0x0b, 0x02 | 0x10, T0);              /* UIE with the divider stopped */
	T_CHECK_EQ(t, rtc__next_event_ns(&r, ns), -1);
	rtc__destroy(&r);
}

static void t_bcd_24h(struct t *t)
{
	struct rtc r;
	rtc__init(&r);
	T_CHECK_EQ(t, rd(&r, 0x00, T0), 0x07);
	T_CHECK_EQ(t, rd(&r, 0x02, T0), 0x45);
	T_CHECK_EQ(t, rd(&r, 0x04, T0), 0x13);
	T_CHECK_EQ(t, rd(&r, 0x06, T0), 0x04);      /* Wednesday: 4 (Sunday = 1) */
	T_CHECK_EQ(t, rd(&r, 0x07, T0), 0x02);
	T_CHECK_EQ(t, rd(&r, 0x08, T0), 0x12);
	T_CHECK_EQ(t, rd(&r, 0x09, T0), 0x26);
	T_CHECK_EQ(t, rd(&r, 0x32, T0), 0x20);
	T_CHECK_EQ(t, rd(&r, 0x00, T0 + 60), 0x07); /* a minute later */
	T_CHECK_EQ(t, rd(&r, 0x02, T0 + 60), 0x46);
	rtc__destroy(&r);
}

static void t_binary_12h(struct t *t)
{
	struct rtc r;
	rtc__init(&r);
	wr(&r, 0x0b, 0x04, T0);                     /* binary, 12-hour */
	T_CHECK_EQ(t, rd(&r, 0x00, T0), 7);
	T_CHECK_EQ(t, rd(&r, 0x02, T0), 45);
	T_CHECK_EQ(t, rd(&r, 0x04, T0), 0x80 | 1);  /* 1 PM */
	T_CHECK_EQ(t, rd(&r, 0x04, T0 - 13 * 3600), 12); /* 00:45: 12 AM */
	T_CHECK_EQ(t, rd(&r, 0x09, T0), 26);
	rtc__destroy(&r);
}

static void t_registers(struct t *t)
{
	struct rtc r;
	rtc__init(&r);
	T_CHECK_EQ(t, rd(&r, 0x0a, T0) & 0x80, 0);  /* never update-in-progress */
	wr(&r, 0x0a, 0xa6, T0);
	T_CHECK_EQ(t, rd(&r, 0x0a, T0), 0x26);
	T_CHECK_EQ(t, rd(&r, 0x0c, T0), 0);
	T_CHECK_EQ(t, rd(&r, 0x0d, T0), 0x80);      /* battery good */
	wr(&r, 0x0d, 0x00, T0);
	T_CHECK_EQ(t, rd(&r, 0x0d, T0), 0x80);
	wr(&r, 0x80 | 0x40, 0x5a, T0);              /* NMI mask bit, plain RAM */
	T_CHECK_EQ(t, rd(&r, 0x40, T0), 0x5a);
	uint8_t v = 0;
	rtc__pio_at(&r, RTC_BASE, false, &v, T0);
	T_CHECK_EQ(t, v, 0xff);
	rtc__destroy(&r);
}

/* The guest sets 2030-01-01 00:00:00 under SET; the clock runs from there. */
static void t_set_time(struct t *t)
{
	struct rtc r;
	rtc__init(&r);
	wr(&r, 0x0b, 0x82, T0);                     /* SET, 24h BCD */
	T_CHECK_EQ(t, rd(&r, 0x02, T0 + 500), 0x45); /* held while SET */
	wr(&r, 0x00, 0x00, T0);
	wr(&r, 0x02, 0x00, T0);
	wr(&r, 0x04, 0x00, T0);
	wr(&r, 0x07, 0x01, T0);
	wr(&r, 0x08, 0x01, T0);
	wr(&r, 0x09, 0x30, T0);
	T_CHECK_EQ(t, rd(&r, 0x09, T0 + 5), 0x30);
	wr(&r, 0x0b, 0x02, T0 + 10);                /* SET off at host T0 + 10 */
	T_CHECK_EQ(t, rd(&r, 0x09, T0 + 15), 0x30);
	T_CHECK_EQ(t, rd(&r, 0x08, T0 + 15), 0x01);
	T_CHECK_EQ(t, rd(&r, 0x00, T0 + 15), 0x05);
	T_CHECK_EQ(t, rd(&r, 0x06, T0 + 15), 0x03); /* 2030-01-01 is a Tuesday */
	rtc__destroy(&r);
}

/* Outside SET: an alarm byte is plain storage, a time byte changes only
 * that field of the time as it is at the write (not as last read). */
static void t_write_outside_set(struct t *t)
{
	struct rtc r;
	rtc__init(&r);
	T_CHECK_EQ(t, rd(&r, 0x02, T0), 0x45);      /* RAM now holds T0's time */
	wr(&r, 0x01, 0x30, T0 + 3600);              /* seconds alarm, an hour later */
	T_CHECK_EQ(t, rd(&r, 0x01, T0 + 3600), 0x30);
	T_CHECK_EQ(t, rd(&r, 0x04, T0 + 3600), 0x14); /* the clock went on: 14:45 */
	wr(&r, 0x02, 0x10, T0 + 3600);              /* minutes := 10 */
	T_CHECK_EQ(t, rd(&r, 0x04, T0 + 3600), 0x14);
	T_CHECK_EQ(t, rd(&r, 0x02, T0 + 3600), 0x10);
	T_CHECK_EQ(t, rd(&r, 0x00, T0 + 3605), 0x12); /* seconds kept running */
	T_CHECK_EQ(t, rd(&r, 0x07, T0 + 3600), 0x02);
	wr(&r, 0x32, 0xff, T0 + 3600);              /* century "165": out of range */
	T_CHECK_EQ(t, rd(&r, 0x09, T0 + 3600), 0x26); /* ignored */
	T_CHECK_EQ(t, rd(&r, 0x02, T0 + 3600), 0x10);
	uint8_t s[RTC_STATE_SIZE];
	struct rtc b;
	rtc__init(&b);
	rtc__save(&r, s);
	T_CHECK_EQ(t, rtc__load(&b, s, sizeof(s)), 0); /* what a guest sets migrates */
	rtc__destroy(&b);
	rtc__destroy(&r);
}

static void t_state(struct t *t)
{
	struct rtc a, b;
	rtc__init(&a);
	rtc__init(&b);
	wr(&a, 0x0b, 0x82, T0);
	wr(&a, 0x09, 0x40, T0);
	wr(&a, 0x0b, 0x02, T0);                     /* 2040 */
	wr(&a, 0x41, 0x99, T0);
	uint8_t s[RTC_STATE_SIZE];
	rtc__save(&a, s);
	T_CHECK_EQ(t, rtc__load(&b, s, sizeof(s)), 0);
	T_CHECK_EQ(t, rd(&b, 0x09, T0 + 3), 0x40);
	T_CHECK_EQ(t, rd(&b, 0x41, T0), 0x99);
	T_CHECK_EQ(t, rtc__load(&b, s, sizeof(s) - 1), -EINVAL);
	uint8_t bad[RTC_STATE_SIZE];
	memcpy(bad, s, sizeof(bad));
	bad[0] = 3;
	T_CHECK_EQ(t, rtc__load(&b, bad, sizeof(bad)), -EINVAL);
	memcpy(bad, s, sizeof(bad));
	bad[4 + 0x0c] = 0x01;                       /* register C: no such flag */
	T_CHECK_EQ(t, rtc__load(&b, bad, sizeof(bad)), -EINVAL);
	memcpy(bad, s, sizeof(bad));
	bad[0] = 1;                                 /* an older kmig's state loads */
	T_CHECK_EQ(t, rtc__load(&b, bad, sizeof(bad)), 0);
	memcpy(bad, s, sizeof(bad));
	bad[1] = 0x80;                              /* index past the RAM */
	T_CHECK_EQ(t, rtc__load(&b, bad, sizeof(bad)), -EINVAL);
	memcpy(bad, s, sizeof(bad));
	int64_t far = INT64_MAX;
	memcpy(bad + 4 + RTC_RAM_SIZE, &far, sizeof(far));
	T_CHECK_EQ(t, rtc__load(&b, bad, sizeof(bad)), -EINVAL);
	T_CHECK_EQ(t, rd(&b, 0x09, T0), 0x40);      /* a refused load changed nothing */
	rtc__destroy(&a);
	rtc__destroy(&b);
}

int main(void)
{
	struct t t = {0};

	T_RUN(&t, t_bcd_24h);
	T_RUN(&t, t_binary_12h);
	T_RUN(&t, t_registers);
	T_RUN(&t, t_set_time);
	T_RUN(&t, t_write_outside_set);
	T_RUN(&t, t_state);
	T_RUN(&t, t_update_irq);
	T_RUN(&t, t_alarm_irq);
	T_RUN(&t, t_alarm_late);
	T_RUN(&t, t_alarm_armed_late);
	T_RUN(&t, t_enabled_before_tick);
	T_RUN(&t, t_enabled_then_saved);
	T_RUN(&t, t_load_line_high);
	T_RUN(&t, t_hold_line);
	T_RUN(&t, t_periodic_irq);
	return T_DONE(&t);
}
