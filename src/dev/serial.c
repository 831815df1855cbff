#include "dev/serial.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#define LCR_DLAB 0x80
#define LSR_THRE_TEMT 0x60
#define IIR_NO_INT 0x01
#define IIR_THRI 0x02
#define IER_THRI 0x02
#define MCR_OUT2 0x08
#define MSR_DCD_DSR_CTS 0xb0

void serial__init(struct serial *s, int out_fd)
{
	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->lock, NULL);
	s->out_fd = out_fd;
	s->lcr = 0x03;
	s->dll = 0x0c;
}

void serial__connect_irq(struct serial *s, void (*set_irq)(void *ctx, bool level), void *ctx)
{
	pthread_mutex_lock(&s->lock);
	s->set_irq = set_irq;
	s->irq_ctx = ctx;
	pthread_mutex_unlock(&s->lock);
}

/* The interrupt line follows the pending interrupt, IER and OUT2. */
static void serial__update_irq(struct serial *s)
{
	bool level = s->thr_int && (s->ier & IER_THRI) && (s->mcr & MCR_OUT2);
	if (level != s->irq_level && s->set_irq)
		s->set_irq(s->irq_ctx, level);
	s->irq_level = level;
}

void serial__destroy(struct serial *s)
{
	serial__flush(s);
	pthread_mutex_destroy(&s->lock);
}

static void serial__write_locked(struct serial *s)
{
	size_t off = 0;
	while (s->out_fd >= 0 && off < s->len) {
		ssize_t w = write(s->out_fd, s->line + off, s->len - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			break;
		off += w;
	}
	s->len = 0;
}

void serial__flush(struct serial *s)
{
	pthread_mutex_lock(&s->lock);
	serial__write_locked(s);
	pthread_mutex_unlock(&s->lock);
}

static void serial__tx(struct serial *s, uint8_t c)
{
	s->bytes_out++;
	s->thr_int = true;      /* sent at once: THR is empty again */
	s->line[s->len++] = (char)c;
	if (c == '\n' || s->len == sizeof(s->line))
		serial__write_locked(s);
}

static uint8_t serial__read(struct serial *s, unsigned reg)
{
	bool dlab = s->lcr & LCR_DLAB;
	switch (reg) {
	case 0: return dlab ? s->dll : 0;
	case 1: return dlab ? s->dlm : s->ier;
	case 2: {
		uint8_t fifo = s->fcr & 1 ? 0xc0 : 0;
		if (s->thr_int && (s->ier & IER_THRI)) {
			s->thr_int = false;     /* reading IIR clears THRE as the source */
			return IIR_THRI | fifo;
		}
		return IIR_NO_INT | fifo;
	}
	case 3: return s->lcr;
	case 4: return s->mcr;
	case 5: return LSR_THRE_TEMT;
	case 6: return MSR_DCD_DSR_CTS;
	default: return s->scr;
	}
}

static void serial__write(struct serial *s, unsigned reg, uint8_t v)
{
	bool dlab = s->lcr & LCR_DLAB;
	switch (reg) {
	case 0: if (dlab) s->dll = v; else serial__tx(s, v); break;
	case 1:
		if (dlab) {
			s->dlm = v;
		} else {
			if ((v & IER_THRI) && !(s->ier & IER_THRI))
				s->thr_int = true;      /* THR is empty: enabling raises it */
			s->ier = v & 0x0f;
		}
		break;
	case 2: s->fcr = v; break;
	case 3: s->lcr = v; break;
	case 4: s->mcr = v & 0x1f; break;
	case 7: s->scr = v; break;
	default: break;
	}
}

void serial__pio(struct serial *s, uint16_t port, bool is_write, uint8_t *data)
{
	unsigned reg = (port - SERIAL_BASE) & 7;
	pthread_mutex_lock(&s->lock);
	if (is_write)
		serial__write(s, reg, *data);
	else
		*data = serial__read(s, reg);
	serial__update_irq(s);
	pthread_mutex_unlock(&s->lock);
}

void serial__save(struct serial *s, uint8_t out[SERIAL_STATE_SIZE])
{
	pthread_mutex_lock(&s->lock);
	uint8_t regs[SERIAL_STATE_SIZE] = { 1, s->ier, s->lcr, s->mcr, s->scr,
					    s->dll, s->dlm, s->fcr, s->thr_int, 0 };
	memcpy(out, regs, sizeof(regs));
	pthread_mutex_unlock(&s->lock);
}

int serial__load(struct serial *s, const uint8_t *in, size_t len)
{
	if (len != SERIAL_STATE_SIZE || in[0] != 1 || in[8] > 1 || in[9])
		return -EINVAL;
	pthread_mutex_lock(&s->lock);
	s->ier = in[1] & 0x0f;
	s->lcr = in[2];
	s->mcr = in[3] & 0x1f;
	s->scr = in[4];
	s->dll = in[5];
	s->dlm = in[6];
	s->fcr = in[7];
	s->thr_int = in[8];
	serial__update_irq(s);
	log_debug("serial: loaded ier %#x mcr %#x thr_int %d: line %s", s->ier, s->mcr, s->thr_int,
		  s->irq_level ? "high" : "low");
	pthread_mutex_unlock(&s->lock);
	return 0;
}
