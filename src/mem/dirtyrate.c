#include <errno.h>
#include <stdlib.h>

#include "mem/dirtyrate.h"

/* floor(a * b / c), saturated to UINT64_MAX; c must not be 0. */
static uint64_t muldiv(uint64_t a, uint64_t b, uint64_t c)
{
	unsigned __int128 r = (unsigned __int128)a * b / c;

	return r > UINT64_MAX ? UINT64_MAX : (uint64_t)r;
}

int dirtyrate__init(struct dirtyrate *e, unsigned nr_vcpus, uint64_t period_ms,
		    uint64_t now_ms)
{
	*e = (struct dirtyrate){0};
	if (!nr_vcpus || !period_ms)
		return -EINVAL;
	e->pages = calloc(nr_vcpus, sizeof(*e->pages));
	e->vcpu_rate = calloc(nr_vcpus, sizeof(*e->vcpu_rate));
	if (!e->pages || !e->vcpu_rate) {
		dirtyrate__free(e);
		return -ENOMEM;
	}
	e->nr_vcpus = nr_vcpus;
	e->period_ms = period_ms;
	e->period_start_ms = now_ms;
	return 0;
}

void dirtyrate__free(struct dirtyrate *e)
{
	free(e->pages);
	free(e->vcpu_rate);
	*e = (struct dirtyrate){0};
}

void dirtyrate__reset(struct dirtyrate *e, uint64_t now_ms)
{
	for (unsigned v = 0; v < e->nr_vcpus; v++) {
		e->pages[v] = 0;
		e->vcpu_rate[v] = 0;
	}
	e->rate = 0;
	e->peak = 0;
	e->periods = 0;
	e->period_start_ms = now_ms;
}

int dirtyrate__add(struct dirtyrate *e, unsigned vcpu, uint64_t new_pages)
{
	if (vcpu >= e->nr_vcpus)
		return -EINVAL;
	if (e->pages[vcpu] + new_pages < e->pages[vcpu])
		e->pages[vcpu] = UINT64_MAX;
	else
		e->pages[vcpu] += new_pages;
	return 0;
}

bool dirtyrate__tick(struct dirtyrate *e, uint64_t now_ms)
{
	uint64_t elapsed, total = 0;

	if (now_ms < e->period_start_ms) {
		e->period_start_ms = now_ms;
		return false;
	}
	elapsed = now_ms - e->period_start_ms;
	if (elapsed < e->period_ms)
		return false;
	for (unsigned v = 0; v < e->nr_vcpus; v++) {
		e->vcpu_rate[v] = muldiv(e->pages[v], 1000, elapsed);
		total = total + e->vcpu_rate[v] < total ? UINT64_MAX
							: total + e->vcpu_rate[v];
		e->pages[v] = 0;
	}
	e->rate = total;
	if (total > e->peak)
		e->peak = total;
	e->periods++;
	e->period_start_ms = now_ms;
	return true;
}

uint64_t dirtyrate__rate(const struct dirtyrate *e)
{
	return e->rate;
}

uint64_t dirtyrate__vcpu_rate(const struct dirtyrate *e, unsigned vcpu)
{
	return vcpu < e->nr_vcpus ? e->vcpu_rate[vcpu] : 0;
}

uint64_t dirtyrate__peak(const struct dirtyrate *e)
{
	return e->peak;
}

uint64_t dirtyrate__take_peak(struct dirtyrate *e)
{
	uint64_t peak = e->peak;

	e->peak = e->rate;
	return peak;
}

uint64_t dirtyrate__from_sync(uint64_t dirty_pages, uint64_t interval_ms)
{
	return interval_ms ? muldiv(dirty_pages, 1000, interval_ms) : 0;
}

uint64_t dirtyrate__pages_to_bytes(uint64_t pages_per_s, uint64_t page_size)
{
	return muldiv(pages_per_s, page_size, 1);
}

uint64_t dirtyrate__pages_to_mbps(uint64_t pages_per_s, uint64_t page_size)
{
	return muldiv(pages_per_s, page_size, DIRTYRATE_MB);
}

uint64_t dirtyrate__mbps_to_pages(uint64_t mbps, uint64_t page_size)
{
	return page_size ? muldiv(mbps, DIRTYRATE_MB, page_size) : 0;
}

uint64_t dirtyrate__bytes_to_mbps(uint64_t bytes_per_s)
{
	return bytes_per_s / DIRTYRATE_MB;
}

uint64_t dirtyrate__qemu_mbps(uint64_t dirty_pages, uint64_t page_size,
			      uint64_t interval_ms)
{
	uint64_t mib = muldiv(dirty_pages, page_size, DIRTYRATE_MB);

	return interval_ms ? muldiv(mib, 1000, interval_ms) : 0;
}
