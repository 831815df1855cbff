/* Write protection of guest RAM through userfaultfd, for a snapshot taken
 * while the guest runs (capability background-snapshot).
 *
 * ram_wp__start registers all of guest RAM (one mapping, mem/ram.h) with
 * a userfaultfd in write-protect mode and protects every page, present or
 * not: where the kernel cannot protect a page it has not mapped yet
 * (before UFFD_FEATURE_WP_UNPOPULATED, Linux 6.4), every page is first
 * mapped for reading (MADV_POPULATE_READ: the shared zero page where
 * nothing was written, no memory used).  From then on any write to a
 * protected page, by a vCPU (KVM's own fault on the page goes through the
 * same path), by a device thread of kmig or by KVM on the guest's behalf,
 * stops the writing thread in the kernel and queues a fault here, until
 * the page is released.  So a page read before its release holds what it
 * held when ram_wp__start protected it.
 *
 * The owner (one thread) takes the queued faults (ram_wp__fault), copies
 * what it needs, and releases pages (ram_wp__release), which wakes their
 * writers.  ram_wp__stop releases everything and unregisters: no thread
 * is left waiting.  Discarding protected pages (MADV_DONTNEED) loses what
 * they held unseen: the owner keeps the balloon from doing it meanwhile. */
#ifndef KMIG_MEM_RAM_WP_H
#define KMIG_MEM_RAM_WP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"
#include "mem/ram.h"

struct ram_wp {
	const struct ram *ram;
	int uffd;                  /* -1 when off */
	bool registered;
	bool populated;            /* pages were mapped for reading first */
	uint64_t faults;           /* write faults taken */
};

/* Sets w up and protects all of ram; on failure nothing stays protected
 * or registered, a reason is written into err and -errno returned
 * (-ENOTSUP where the kernel has no write-protect mode for this memory).
 * flags: RAM_WP_POPULATE maps unmapped pages for reading first even where
 * the kernel could protect them unmapped (the older kernels' way, for
 * tests on a newer one). */
#define RAM_WP_POPULATE 1u
int ram_wp__start(struct ram_wp *w, const struct ram *ram, unsigned flags, char *err,
		  size_t errlen) KMIG_MUST_CHECK;
/* The descriptor to poll for faults (POLLIN), or -1 when off. */
int ram_wp__fd(const struct ram_wp *w);
/* Takes one queued write fault without waiting: 1 and *page (VM-wide
 * index) when there was one, 0 when none waits, -errno on an error. */
int ram_wp__fault(struct ram_wp *w, uint64_t *page) KMIG_MUST_CHECK;
/* Releases pages [first, first + n) (they may be released already) and
 * wakes the threads waiting to write them. */
int ram_wp__release(struct ram_wp *w, uint64_t first, uint64_t n) KMIG_MUST_CHECK;
/* Releases every page, unregisters and closes; w is off afterwards.
 * Safe on a w that is off. */
void ram_wp__stop(struct ram_wp *w);
/* w zeroed and off, for ram_wp__stop to be safe before a start. */
void ram_wp__init(struct ram_wp *w);

#endif
