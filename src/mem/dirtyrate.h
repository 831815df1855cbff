/* Dirty-page rate estimators: pure arithmetic, no clocks (time comes in as
 * arguments), no locks.
 *
 * (a) Ring-based estimator (struct dirtyrate).  Whoever harvests the dirty
 *     rings (reaper thread, or a vCPU thread on a ring-full exit) reports
 *     per vCPU the pages that became dirty for the first time in the current
 *     period: the caller counts each page once per period, e.g. with
 *     bitmap__test_and_set() on the migration bitmap.  dirtyrate__tick()
 *     closes the period once at least period_ms have elapsed and computes
 *     per-vCPU and total rates in pages/s, and the peak total rate.
 *     Not thread-safe: all calls on one estimator must be serialized by the
 *     caller (the ring backend harvests under one lock; readers such as the
 *     migration thread or QMP take the same lock).
 * (b) Bitmap-based rate: dirty pages found by a sync / the sync interval.
 * (c) Unit conversions.  QEMU reports dirty rates (calc-dirty-rate,
 *     query-dirty-rate, set-vcpu-dirty-limit) in "MB/s" where MB = 2^20
 *     bytes (MiB); so do we.  All conversions truncate, as QEMU's do. */
#ifndef KMIG_MEM_DIRTYRATE_H
#define KMIG_MEM_DIRTYRATE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/log.h"

#define DIRTYRATE_MB            (1024ull * 1024ull)
#define DIRTYRATE_DEFAULT_PERIOD_MS 1000ull   /* as the seed and QEMU */

struct dirtyrate {
	unsigned nr_vcpus;
	uint64_t period_ms;        /* minimum length of a period */
	uint64_t period_start_ms;  /* when the open period began */
	uint64_t *pages;           /* per vCPU: new pages in the open period */
	uint64_t *vcpu_rate;       /* per vCPU: pages/s of the last closed period */
	uint64_t rate;             /* total pages/s of the last closed period */
	uint64_t peak;             /* highest total rate since the last take_peak */
	uint64_t periods;          /* number of periods closed so far */
};

/* Sets up an estimator for nr_vcpus (>= 1) with periods of period_ms (>= 1)
 * starting at now_ms.  Returns 0, -EINVAL or -ENOMEM. */
int dirtyrate__init(struct dirtyrate *e, unsigned nr_vcpus, uint64_t period_ms,
		    uint64_t now_ms) KMIG_MUST_CHECK;
void dirtyrate__free(struct dirtyrate *e);
/* Forgets counts, rates and peak; a new period starts at now_ms. */
void dirtyrate__reset(struct dirtyrate *e, uint64_t now_ms);

/* Adds new_pages newly dirtied pages for vcpu in the open period (the sum
 * saturates).  Returns 0, or -EINVAL if vcpu >= nr_vcpus. */
int dirtyrate__add(struct dirtyrate *e, unsigned vcpu, uint64_t new_pages) KMIG_MUST_CHECK;

/* Closes the open period if now_ms - start >= period_ms: rates become
 * pages * 1000 / elapsed_ms (elapsed may be longer than period_ms if ticks
 * are late: the rate is the average over the whole elapsed time), the peak
 * is raised if the total rate is higher, counts restart at zero and a new
 * period starts at now_ms.  Returns true if a period was closed.  If now_ms
 * is before the period start (a caller bug), the period restarts at now_ms
 * with its counts kept, and false is returned. */
bool dirtyrate__tick(struct dirtyrate *e, uint64_t now_ms);

/* Total rate of the last closed period, pages/s (0 before the first). */
uint64_t dirtyrate__rate(const struct dirtyrate *e);
/* One vCPU's rate of the last closed period, pages/s; 0 if out of range. */
uint64_t dirtyrate__vcpu_rate(const struct dirtyrate *e, unsigned vcpu);
/* Highest total rate since init/reset/the last take_peak. */
uint64_t dirtyrate__peak(const struct dirtyrate *e);
/* Returns the peak and restarts peak tracking from the current rate (not
 * from 0, so a reader right after a take never sees 0 while the guest is
 * dirtying memory). */
uint64_t dirtyrate__take_peak(struct dirtyrate *e);

/* (b) Rate from a bitmap sync: dirty_pages * 1000 / interval_ms, pages/s;
 * 0 if interval_ms is 0 (no measurement). Saturates. */
uint64_t dirtyrate__from_sync(uint64_t dirty_pages, uint64_t interval_ms);

/* (c) Conversions; page_size in bytes (0 gives 0). Saturating. */
uint64_t dirtyrate__pages_to_bytes(uint64_t pages_per_s, uint64_t page_size);
/* pages/s -> MB/s (MB = 2^20), floor. */
uint64_t dirtyrate__pages_to_mbps(uint64_t pages_per_s, uint64_t page_size);
/* MB/s -> pages/s, floor. */
uint64_t dirtyrate__mbps_to_pages(uint64_t mbps, uint64_t page_size);
/* bytes/s -> MB/s, floor. */
uint64_t dirtyrate__bytes_to_mbps(uint64_t bytes_per_s);
/* The number QEMU's calc-dirty-rate reports for dirty_pages found over
 * interval_ms: whole MiB first (truncated), then * 1000 / interval_ms. */
uint64_t dirtyrate__qemu_mbps(uint64_t dirty_pages, uint64_t page_size,
			      uint64_t interval_ms);

#endif
