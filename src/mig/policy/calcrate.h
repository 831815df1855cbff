/* calc-dirty-rate / query-dirty-rate (QEMU's shapes): measures the guest's
 * dirty rate over calc-time seconds on a background thread, in one of
 * three modes:
 *   page-sampling: hash sample-pages random pages per GiB, wait, count
 *                  the changed ones, scale to all of RAM (no tracking);
 *   dirty-ring:    ring entries harvested per vCPU over the interval
 *                  (per-vCPU rates; needs the ring backend);
 *   dirty-bitmap:  pages found dirty by one sync after the interval
 *                  (refused while a migration is tracking).
 * Rates are MB/s with MB = 2^20.  Loop thread calls; one measurement at a
 * time. */
#ifndef KMIG_MIG_CALCRATE_H
#define KMIG_MIG_CALCRATE_H

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/log.h"

struct vm;

enum calcrate_mode { CALC_PAGE_SAMPLING, CALC_DIRTY_RING, CALC_DIRTY_BITMAP };
enum calcrate_status { CALC_UNSTARTED, CALC_MEASURING, CALC_MEASURED };

#define CALCRATE_MAX_VCPUS 64

struct calcrate {
	struct vm *vm;
	pthread_mutex_t lock;
	pthread_cond_t cond;         /* wakes the measurement wait on stop */
	bool stop;
	pthread_t thread;
	bool thread_running;
	enum calcrate_status status;
	enum calcrate_mode mode;
	uint64_t calc_time_s, sample_pages, start_time_s;
	uint64_t rate_mbps;
	uint64_t vcpu_mbps[CALCRATE_MAX_VCPUS];
};

void calcrate__init(struct calcrate *c, struct vm *vm);
void calcrate__destroy(struct calcrate *c);
/* Ends a measurement in progress at once and joins its thread. */
void calcrate__stop(struct calcrate *c);
/* A dirty-bitmap measurement is running: its syncs would take the dirty
 * pages a migration needs, so `migrate` must wait for it. */
bool calcrate__measuring_bitmap(struct calcrate *c);
/* Starts a measurement; err gets a reason on failure. */
int calcrate__start(struct calcrate *c, uint64_t calc_time_s, uint64_t sample_pages,
		    enum calcrate_mode mode, char *err, size_t errlen) KMIG_MUST_CHECK;
/* query-dirty-rate's answer (new reference). */
json_t *calcrate__query(struct calcrate *c);

#endif
