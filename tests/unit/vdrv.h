/* A fake virtio-pci driver for the device tests and fuzzers: what a
 * guest's driver does to a modern virtio-pci device, done from the test's
 * own thread over fake guest RAM.  No KVM, no vCPU: BAR accesses go
 * straight to pci__mmio, configuration accesses to pci__pio.
 *
 * It fakes: guest RAM (one block from gpa 0, ram__create with no VM), a
 * PCI bus the test plugs its device into, feature negotiation and
 * DRIVER_OK, split virtqueues laid out at fixed places (queue q's
 * descriptor table at qbase + q * qstride, its available ring 0x1000
 * after it, its used ring 0x2000 after it), descriptor chains made
 * available and notified, the used ring read back; and two recorders the
 * test hands to its device: what the device reports written in guest
 * memory (vdrv__mark) and its interrupt line (vdrv__irq).
 *
 * It does not fake: MSI-X, indirect descriptors, event indexes, packed
 * rings, interrupts that do anything (the line is recorded, nobody is
 * woken), a driver thread (wait_used polls).  The device itself is the
 * test's: it creates it over vdrv.ram with vdrv__mark/vdrv__irq and ctx
 * &vdrv, plugs it with vdrv__plug, and destroys it before vdrv__fini.
 *
 * Bounds: every queue number, ring index and chain length is checked
 * (-EINVAL); the rings are written through ram__gpa_to_host over their
 * whole length.  A BAR access nothing on the bus decodes (the BAR moved,
 * memory decoding off, past the BAR's end) reads ~0 and fails a write
 * with -ENODEV; with conf.strict it aborts instead (a test that never
 * moves its BAR made a mistake).  vdrv__host checks one byte: the bytes
 * after it up to ram.size are the caller's to stay within.
 *
 * Threads: the mark and irq recorders may be called from the device's
 * worker threads (the marks are under a lock, the line and counts are
 * atomic); everything else from one thread. */
#ifndef KMIG_TESTS_VDRV_H
#define KMIG_TESTS_VDRV_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "dev/pci.h"
#include "dev/virtio_pci.h"
#include "mem/ram.h"

#define VDRV_MAX_VQS VIRTIO_MAX_QUEUES
#define VDRV_MAX_QSIZE 256        /* a descriptor table fits its 4 KiB */
#define VDRV_MARKS 1024           /* reported writes kept (all are counted) */
#define VDRV_RING_BYTES 0x3000ull /* descriptors, available and used ring */

struct vdrv_conf {
	uint64_t ram_size;
	uint64_t bar;             /* where the device's BAR 4 decodes */
	uint64_t qbase, qstride;  /* queue q's rings at qbase + q * qstride */
	unsigned nq;              /* queues vdrv__start enables */
	uint16_t qsize;           /* each queue's size */
	bool strict;              /* abort on a BAR write nothing decodes */
};

struct vdrv_seg {
	uint64_t gpa;
	uint32_t len;
	bool w;                   /* device-writable */
};

struct vdrv_desc {
	uint64_t gpa;
	uint32_t len;
	uint16_t flags, next;
};

struct vdrv_mark {
	uint64_t gpa, len;
};

struct vdrv {
	struct ram ram;
	struct pci_bus bus;
	uint64_t bar;             /* a test that moves the BAR updates it */
	uint64_t qbase, qstride;
	unsigned nq;
	uint16_t qsize;           /* a test may change it before vdrv__start */
	bool strict;
	/* the driver's side of each ring: the next descriptor it fills and
	 * the available index it publishes next */
	uint16_t next_desc[VDRV_MAX_VQS], avail_idx[VDRV_MAX_VQS];
	/* vdrv__mark's record: the first VDRV_MARKS ranges since the last
	 * vdrv__marks_reset (under mlock), every call and every one not
	 * inside RAM (empty included) since vdrv__init */
	pthread_mutex_t mlock;
	struct vdrv_mark marks[VDRV_MARKS];
	unsigned nmarks;
	uint64_t mark_calls, mark_outside;
	/* vdrv__irq's record: the line's level and how often it was set */
	int irq_level;
	unsigned irq_changes;
};

/* Guest RAM and an empty bus; 0, -EINVAL (nq, qsize, qstride or a ring
 * past the RAM), or ram__create's failure. */
int vdrv__init(struct vdrv *d, const struct vdrv_conf *c);
/* Plugs dev into slot; 0 or pci__add's failure. */
int vdrv__plug(struct vdrv *d, unsigned slot, struct pci_dev *dev);
/* The bus and the RAM (the device destroyed before). */
void vdrv__fini(struct vdrv *d);

/* The host address of guest byte gpa, NULL outside RAM. */
uint8_t *vdrv__host(const struct vdrv *d, uint64_t gpa);
/* Whether [gpa, gpa + len) is non-empty and inside RAM. */
bool vdrv__in_ram(const struct vdrv *d, uint64_t gpa, uint64_t len);

/* BAR 4 registers at offset off, len 1, 2, 4 or 8 bytes: a read (~0 when
 * not decoded), a write (0 or -ENODEV; strict: aborts). */
uint64_t vdrv__read(struct vdrv *d, uint64_t off, unsigned len);
int vdrv__write(struct vdrv *d, uint64_t off, uint64_t v, unsigned len);
/* PCI configuration of slot through ports 0xCF8/0xCFC: the dword holding
 * off addressed, then size bytes at data port 0xCFC + (off & 3). */
uint32_t vdrv__cfg_read(struct vdrv *d, unsigned slot, unsigned off, unsigned size);
void vdrv__cfg_write(struct vdrv *d, unsigned slot, unsigned off, uint32_t v, unsigned size);

/* The device status register; the 64 feature bits the device offers. */
uint8_t vdrv__status(struct vdrv *d);
uint64_t vdrv__offered(struct vdrv *d);
/* ACKNOWLEDGE | DRIVER, the driver's features, FEATURES_OK (no reset
 * before): the status the device shows after, or -ENODEV. */
int vdrv__negotiate(struct vdrv *d, uint64_t features);
/* Queue q's size (d->qsize), ring addresses (the descriptor and used
 * ring's as two 32-bit halves, the available ring's as one 64-bit write:
 * both widths of the transport's address registers), enable.  0, -EINVAL
 * (q, qsize), -ENODEV. */
int vdrv__enable_queue(struct vdrv *d, unsigned q);
/* Every queue enabled, then DRIVER_OK (whatever the device answered to
 * FEATURES_OK): 0, -EINVAL, -ENODEV. */
int vdrv__driver_ok(struct vdrv *d);
/* Zeroes every queue's rings and the driver's indexes. */
void vdrv__rings_reset(struct vdrv *d);
/* A reset, vdrv__negotiate; if the device kept FEATURES_OK, fresh rings
 * and vdrv__driver_ok.  The status the device shows after
 * (0x0f: started), or -ENODEV / -EINVAL. */
int vdrv__start(struct vdrv *d, uint64_t features);

/* Guest addresses of queue q's rings (q unchecked: arithmetic only). */
uint64_t vdrv__desc_gpa(const struct vdrv *d, unsigned q);
uint64_t vdrv__avail_gpa(const struct vdrv *d, unsigned q);
uint64_t vdrv__used_gpa(const struct vdrv *d, unsigned q);

/* One descriptor, as given (flags and next unchecked: a fuzzer's), put
 * at queue q's next slot and made available on its own.  Its index, or
 * -EINVAL. */
int vdrv__add_desc(struct vdrv *d, unsigned q, const struct vdrv_desc *desc);
/* n segments (1..qsize) chained in consecutive descriptors from queue q's
 * next slot, the head made available.  The head's index, or -EINVAL. */
int vdrv__add_chain(struct vdrv *d, unsigned q, const struct vdrv_seg *s, unsigned n);
/* Notifies queue q (its notify address, value q); 0, -EINVAL, -ENODEV. */
int vdrv__kick(struct vdrv *d, unsigned q);

/* Queue q's used index, or -EINVAL. */
int vdrv__used_idx(const struct vdrv *d, unsigned q);
/* Waits (timeout_ms at most, polling each millisecond) until queue q's
 * used index is n: 0, -ETIMEDOUT, -EINVAL. */
int vdrv__wait_used(const struct vdrv *d, unsigned q, uint16_t n, unsigned timeout_ms);
/* Used ring entry i (taken modulo qsize) of queue q: its length; ~0u for
 * a bad q. */
uint32_t vdrv__used_len(const struct vdrv *d, unsigned q, uint16_t i);
/* The length of the first used entry so far whose id is head; ~0u when
 * none (or a bad q). */
uint32_t vdrv__used_len_of(const struct vdrv *d, unsigned q, uint16_t head);
/* Used ring entry i's id; ~0u for a bad q. */
uint32_t vdrv__used_id(const struct vdrv *d, unsigned q, uint16_t i);

/* The device's mark and irq hooks (ctx: the struct vdrv). */
void vdrv__mark(void *ctx, uint64_t gpa, uint64_t len);
void vdrv__irq(void *ctx, bool level);
/* Whether every byte of [gpa, gpa + len) was reported written since the
 * last vdrv__marks_reset (of the first VDRV_MARKS reports); the reset
 * forgets the ranges (not the counts). */
bool vdrv__marked(struct vdrv *d, uint64_t gpa, uint64_t len);
void vdrv__marks_reset(struct vdrv *d);

#endif
