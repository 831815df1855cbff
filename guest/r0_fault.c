/*
 * Ring-0 fault reporter: the only C code that runs in ring 0 (linked into
 * .text.r0, compiled with -mgeneral-regs-only).  Runs once per fatal
 * exception, prints one line to COM1 and returns to fault_common, which
 * halts the CPU.
 */
#include <stdint.h>
#include "layout.h"

void r0_fault(uint64_t vec, uint64_t rip, uint64_t err, uint64_t cr2, uint64_t cpu);

static int put_str(char *b, int n, const char *s)
{
	while (*s)
		b[n++] = *s++;
	return n;
}

static int put_hex(char *b, int n, uint64_t v)
{
	int shift = 60;

	b[n++] = '0';
	b[n++] = 'x';
	while (shift > 0 && ((v >> shift) & 0xf) == 0)
		shift -= 4;
	for (; shift >= 0; shift -= 4)
		b[n++] = "0123456789abcdef"[(v >> shift) & 0xf];
	return n;
}

static int put_dec(char *b, int n, uint64_t v)
{
	char t[20];
	int k = 0;

	do {
		t[k++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	while (k)
		b[n++] = t[--k];
	return n;
}

void r0_fault(uint64_t vec, uint64_t rip, uint64_t err, uint64_t cr2, uint64_t cpu)
{
	char buf[160];
	const char *p = buf;
	uint64_t n = 0;

	n = put_str(buf, n, "kmig-guest fault vec=");
	n = put_dec(buf, n, vec);
	n = put_str(buf, n, " rip=");
	n = put_hex(buf, n, rip);
	n = put_str(buf, n, " err=");
	n = put_hex(buf, n, err);
	n = put_str(buf, n, " cr2=");
	n = put_hex(buf, n, cr2);
	n = put_str(buf, n, " cpu=");
	n = put_dec(buf, n, cpu);
	buf[n++] = '\n';
	__asm__ volatile("rep outsb" : "+S"(p), "+c"(n) : "d"(COM1_PORT) : "memory");
}
