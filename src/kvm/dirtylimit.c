#include "kvm/dirtylimit.h"

#include <errno.h>
#include <string.h>

#include "base/timeutil.h"
#include "kvm/vcpu.h"
#include "kvm/vm.h"
#include "mem/dirty.h"
#include "mem/ram.h"
#include "mem/dirtyrate.h"
#include "kvm/throttle_math.h"

void dirtylimit__init(struct dirtylimit *dl, struct vm *vm)
{
	memset(dl, 0, sizeof(*dl));
	dl->vm = vm;
	dl->period_ms = DIRTYLIMIT_DEFAULT_PERIOD_MS;
	pthread_mutex_init(&dl->lock, NULL);
}

void dirtylimit__destroy(struct dirtylimit *dl)
{
	if (dirtylimit__cancel(dl, -1))
		log_warn("dirty-limit: could not stop dirty tracking");
	pthread_mutex_destroy(&dl->lock);
}

/* Sleep of one 10 ms run slice for a sleep of sleep_us per period. */
static uint64_t dirtylimit__slice_ns(uint64_t sleep_us, uint64_t period_ms)
{
	return sleep_us * 1000 / period_ms * (THROTTLE_TIMESLICE_NS / 1000000ull);
}

static void dirtylimit__apply(struct dirtylimit *dl, unsigned i)
{
	struct vcpu *v = &dl->vm->vcpus[i];
	atomic_store(&v->limit_sleep_ns, dl->quota[i] ?
		     dirtylimit__slice_ns(dl->sleep_us[i], dl->period_ms) : 0);
}

/* Holds tracking on while any quota is set; dl->lock held. */
static int dirtylimit__update_tracking(struct dirtylimit *dl)
{
	unsigned n = 0;
	for (unsigned i = 0; i < dl->vm->nr_vcpus; i++)
		n += dl->quota[i] != 0;
	dl->limited = n;
	int rc = 0;
	if (n && !dl->tracking) {
		rc = dirty__start(dl->vm->dirty);
		dl->tracking = rc == 0;
	} else if (!n && dl->tracking) {
		rc = dirty__stop(dl->vm->dirty);
		dl->tracking = false;
	}
	return rc;
}

int dirtylimit__set(struct dirtylimit *dl, int cpu, uint64_t mbps)
{
	struct vm *vm = dl->vm;
	if (dirty__backend(vm->dirty) != DIRTY_RING)
		return -ENOTSUP;
	if ((cpu >= 0 && (unsigned)cpu >= vm->nr_vcpus) || !mbps)
		return -EINVAL;
	pthread_mutex_lock(&dl->lock);
	for (unsigned i = 0; i < vm->nr_vcpus; i++) {
		if (cpu >= 0 && i != (unsigned)cpu)
			continue;
		dl->quota[i] = mbps;
		dirtylimit__apply(dl, i);
	}
	int rc = dirtylimit__update_tracking(dl);
	pthread_mutex_unlock(&dl->lock);
	/* wake the slice timer (after dropping our lock: it takes both) */
	throttle__set(&vm->throttle, atomic_load(&vm->throttle_pct));
	return rc;
}

int dirtylimit__cancel(struct dirtylimit *dl, int cpu)
{
	struct vm *vm = dl->vm;
	if (cpu >= 0 && (unsigned)cpu >= vm->nr_vcpus)
		return -EINVAL;
	pthread_mutex_lock(&dl->lock);
	for (unsigned i = 0; i < vm->nr_vcpus; i++) {
		if (cpu >= 0 && i != (unsigned)cpu)
			continue;
		dl->quota[i] = 0;
		dl->sleep_us[i] = 0;
		dirtylimit__apply(dl, i);
	}
	int rc = dirtylimit__update_tracking(dl);
	pthread_mutex_unlock(&dl->lock);
	/* wake the slice timer (after dropping our lock: it takes both) */
	throttle__set(&vm->throttle, atomic_load(&vm->throttle_pct));
	return rc;
}

void dirtylimit__save(struct dirtylimit *dl, uint64_t quota[DIRTYLIMIT_MAX_VCPUS])
{
	pthread_mutex_lock(&dl->lock);
	memcpy(quota, dl->quota, sizeof(dl->quota));
	pthread_mutex_unlock(&dl->lock);
}

int dirtylimit__restore(struct dirtylimit *dl, const uint64_t quota[DIRTYLIMIT_MAX_VCPUS])
{
	int rc = 0;
	for (unsigned i = 0; i < dl->vm->nr_vcpus && !rc; i++)
		rc = quota[i] ? dirtylimit__set(dl, (int)i, quota[i]) : dirtylimit__cancel(dl, (int)i);
	return rc;
}

void dirtylimit__set_period(struct dirtylimit *dl, uint64_t period_ms)
{
	pthread_mutex_lock(&dl->lock);
	dl->period_ms = period_ms < DIRTYLIMIT_MIN_PERIOD_MS ? DIRTYLIMIT_MIN_PERIOD_MS : period_ms;
	pthread_mutex_unlock(&dl->lock);
}

bool dirtylimit__active(struct dirtylimit *dl)
{
	pthread_mutex_lock(&dl->lock);
	bool on = dl->limited > 0;
	pthread_mutex_unlock(&dl->lock);
	return on;
}

void dirtylimit__tick(struct dirtylimit *dl, uint64_t now_ms)
{
	pthread_mutex_lock(&dl->lock);
	if (!dl->limited || now_ms - dl->last_ms < dl->period_ms) {
		pthread_mutex_unlock(&dl->lock);
		return;
	}
	dl->last_ms = now_ms;
	dirty__harvest(dl->vm->dirty);
	/* The rate periods (1 s) are not aligned with these steps: the period
	 * that closed last may have begun before the previous change of the
	 * sleep.  Act on every other step only, so the rate read was measured
	 * under the sleep now in effect (the law assumes it). */
	if (dl->skip_next) {
		dl->skip_next = false;
		pthread_mutex_unlock(&dl->lock);
		return;
	}
	dl->skip_next = true;
	for (unsigned i = 0; i < dl->vm->nr_vcpus; i++) {
		if (!dl->quota[i])
			continue;
		dl->sleep_us[i] = dirtylimit__next_sleep_pages(dl->sleep_us[i], dl->quota[i],
							       dirty__vcpu_rate(dl->vm->dirty, i),
							       RAM_PAGE_SIZE, dl->period_ms);
		dirtylimit__apply(dl, i);
	}
	pthread_mutex_unlock(&dl->lock);
}

void dirtylimit__get(struct dirtylimit *dl, unsigned cpu, uint64_t *quota, uint64_t *rate)
{
	pthread_mutex_lock(&dl->lock);
	*quota = cpu < dl->vm->nr_vcpus ? dl->quota[cpu] : 0;
	pthread_mutex_unlock(&dl->lock);
	*rate = dirtyrate__pages_to_mbps(dirty__vcpu_rate(dl->vm->dirty, cpu), RAM_PAGE_SIZE);
}

void dirtylimit__stats(struct dirtylimit *dl, uint64_t *sleep_us, uint64_t *ring_full_us)
{
	uint64_t sleep = 0, full = 0;
	unsigned n = 0, m = 0;
	pthread_mutex_lock(&dl->lock);
	for (unsigned i = 0; i < dl->vm->nr_vcpus; i++) {
		if (!dl->quota[i])
			continue;
		sleep += dl->sleep_us[i];
		n++;
		uint64_t pps = dirty__vcpu_rate(dl->vm->dirty, i);
		if (pps) {
			full += (uint64_t)dl->vm->cfg.dirty_ring * 1000000ull / pps;
			m++;
		}
	}
	pthread_mutex_unlock(&dl->lock);
	*sleep_us = n ? sleep / n : 0;
	*ring_full_us = m ? full / m : 0;
}
