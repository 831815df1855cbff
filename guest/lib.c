/* Ring-3 support: console output through the trap, formatting, string functions. */
#include "guest.h"

static volatile int con_lock;

void con_write(const char *s, u64 n)
{
	while (__atomic_exchange_n(&con_lock, 1, __ATOMIC_ACQUIRE))
		cpu_relax();
	trap(TRAP_WRITE, (u64)s, n);
	__atomic_store_n(&con_lock, 0, __ATOMIC_RELEASE);
}

struct out {
	char *buf;
	int size, n;
};

static void out_c(struct out *o, char c)
{
	if (o->n < o->size - 1)
		o->buf[o->n] = c;
	o->n++;
}

static void out_num(struct out *o, u64 v, int base, int width, char pad)
{
	char t[24];
	int k = 0;

	do {
		t[k++] = "0123456789abcdef"[v % base];
		v /= base;
	} while (v);
	while (width-- > k)
		out_c(o, pad);
	while (k)
		out_c(o, t[--k]);
}

/* %d %u %x %s %c with an optional 0/width and l/ll modifiers; %x is unsigned. */
int kvsnprintf(char *buf, int size, const char *fmt, va_list ap)
{
	struct out o = { buf, size, 0 };

	for (; *fmt; fmt++) {
		if (*fmt != '%') {
			out_c(&o, *fmt);
			continue;
		}
		fmt++;
		char pad = ' ';
		int width = 0, lng = 0;
		if (*fmt == '0')
			pad = '0';
		while (*fmt >= '0' && *fmt <= '9')
			width = width * 10 + (*fmt++ - '0');
		while (*fmt == 'l') {
			lng = 1;
			fmt++;
		}
		switch (*fmt) {
		case 'd': {
			int64_t v = lng ? va_arg(ap, int64_t) : va_arg(ap, int);
			if (v < 0) {
				out_c(&o, '-');
				v = -v;
			}
			out_num(&o, (u64)v, 10, width, pad);
			break;
		}
		case 'u':
			out_num(&o, lng ? va_arg(ap, u64) : va_arg(ap, unsigned), 10, width, pad);
			break;
		case 'x':
			out_num(&o, lng ? va_arg(ap, u64) : va_arg(ap, unsigned), 16, width, pad);
			break;
		case 's': {
			const char *s = va_arg(ap, const char *);
			while (*s)
				out_c(&o, *s++);
			break;
		}
		case 'c':
			out_c(&o, (char)va_arg(ap, int));
			break;
		case '%':
			out_c(&o, '%');
			break;
		default:
			out_c(&o, '?');
			break;
		}
	}
	if (size > 0)
		buf[o.n < size ? o.n : size - 1] = 0;
	return o.n;
}

void kprintf(const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	int n = kvsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	if (n > (int)sizeof(buf) - 1)
		n = sizeof(buf) - 1;
	con_write(buf, n);
}

void delay_us(u64 us)
{
	u64 end = rdtsc() + us * tsc_khz / 1000;
	while (rdtsc() < end)
		cpu_relax();
}

void *memset(void *d, int c, size_t n)
{
	u8 *p = d;
	while (n--)
		*p++ = (u8)c;
	return d;
}

void *memcpy(void *d, const void *s, size_t n)
{
	u8 *p = d;
	const u8 *q = s;
	while (n--)
		*p++ = *q++;
	return d;
}

void *memmove(void *d, const void *s, size_t n)
{
	u8 *p = d;
	const u8 *q = s;
	if (p < q)
		return memcpy(d, s, n);
	while (n--)
		p[n] = q[n];
	return d;
}

int memcmp(const void *a, const void *b, size_t n)
{
	const u8 *p = a, *q = b;
	for (; n; n--, p++, q++)
		if (*p != *q)
			return *p - *q;
	return 0;
}

size_t strlen(const char *s)
{
	size_t n = 0;
	while (s[n])
		n++;
	return n;
}
