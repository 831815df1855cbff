/* 8250/16550A UART at COM1 (ports 0x3f8..0x3ff), output only: bytes the
 * guest writes to THR go to the console sink (a file descriptor), line by
 * line.  The transmitter is always ready; the receiver never has data.
 * The transmitter-empty interrupt works as a 16550's (what Linux's tty
 * layer waits for before it writes more): with IER bit 1 set, THR empty
 * raises it (after each byte, and when the bit is set), reading IIR while
 * it is the source or writing THR clears it; the line to the interrupt
 * controller (COM1's IRQ 4) is gated by MCR's OUT2 as on a PC.
 * Registers are kept so the guest sees what it wrote, and so they migrate.
 * Thread-safe: any vCPU thread may call serial__pio. */
#ifndef KMIG_DEV_SERIAL_H
#define KMIG_DEV_SERIAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"

#define SERIAL_BASE 0x3f8
#define SERIAL_NPORTS 8
#define SERIAL_STATE_SIZE 10
#define SERIAL_IRQ 4           /* COM1 */

struct serial {
	pthread_mutex_t lock;
	int out_fd;            /* console sink, -1 = discard */
	uint8_t ier, lcr, mcr, scr, dll, dlm, fcr;
	bool thr_int;          /* transmitter-empty interrupt pending */
	bool irq_level;        /* the line as last set */
	void (*set_irq)(void *ctx, bool level); /* NULL: no interrupt line */
	void *irq_ctx;
	char line[512];        /* pending output, flushed at '\n' or when full */
	size_t len;
	uint64_t bytes_out;
};

void serial__init(struct serial *s, int out_fd);
/* Connects the interrupt line (before the guest runs); set_irq is called
 * with the serial's lock held, whenever the level changes. */
void serial__connect_irq(struct serial *s, void (*set_irq)(void *ctx, bool level), void *ctx);
void serial__destroy(struct serial *s);
/* Handles an access to port (SERIAL_BASE..+7); data is 1 byte. */
void serial__pio(struct serial *s, uint16_t port, bool is_write, uint8_t *data);
/* Writes any pending partial line. */
void serial__flush(struct serial *s);
/* Register state for migration: SERIAL_STATE_SIZE bytes. */
void serial__save(struct serial *s, uint8_t out[SERIAL_STATE_SIZE]);
int serial__load(struct serial *s, const uint8_t *in, size_t len) KMIG_MUST_CHECK;

#endif
