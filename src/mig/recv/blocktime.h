/* Post-copy blocktime (capability postcopy-blocktime, QEMU's names): how
 * long the destination's vCPUs waited for pages that had not arrived.
 *
 * A vCPU is blocked from its fault on a missing page (the fault thread
 * learns the faulting thread from userfaultfd's thread id) until that page
 * is placed.  Per vCPU the blocked times add up (postcopy-vcpu-blocktime);
 * postcopy-blocktime adds up the times when every vCPU was blocked at once.
 * Faults of threads that are not vCPUs (kmig's own, reading guest RAM) do
 * not count.
 *
 * Pure logic: times come from the caller (ns).  Thread-safe: the fault
 * thread calls blocktime__fault, the receiving thread blocktime__placed,
 * anyone blocktime__read. */
#ifndef KMIG_MIG_RECV_BLOCKTIME_H
#define KMIG_MIG_RECV_BLOCKTIME_H

#include <pthread.h>
#include <stdint.h>

#include "base/log.h"

#define BLOCKTIME_MAX_VCPUS 64

struct blocktime {
	pthread_mutex_t lock;
	unsigned nr_vcpus;
	int tid[BLOCKTIME_MAX_VCPUS];          /* each vCPU thread's id */
	uint64_t page[BLOCKTIME_MAX_VCPUS];    /* page + 1 it waits for; 0: running */
	uint64_t since[BLOCKTIME_MAX_VCPUS];   /* when it began to wait */
	uint64_t vcpu_ns[BLOCKTIME_MAX_VCPUS]; /* waits that ended */
	unsigned blocked;                      /* vCPUs waiting now */
	uint64_t all_since, all_ns;            /* every vCPU waiting: since, ended */
};

/* tids: the vCPU threads' ids, index = vCPU; -EINVAL beyond the maximum. */
int blocktime__init(struct blocktime *b, const int *tids, unsigned nr_vcpus) KMIG_MUST_CHECK;
/* Thread tid faulted on page at now; the vCPU's index, or -1 when tid is
 * no vCPU's.  A vCPU that waits already (its fault was cut short by a
 * signal and it faulted on another page) goes on waiting, for the new
 * page.  With KVM's asynchronous page faults a kernel worker, not the
 * vCPU thread, may fault for a guest with interrupts on: such waits do
 * not count. */
int blocktime__fault(struct blocktime *b, int tid, uint64_t page, uint64_t now);
/* page is in place at now: every vCPU waiting for it runs again. */
void blocktime__placed(struct blocktime *b, uint64_t page, uint64_t now);
/* Totals in ms up to now (waits still going count so far): every vCPU at
 * once, and per vCPU into vcpu_ms[nr_vcpus]. */
uint64_t blocktime__read(struct blocktime *b, uint64_t now, uint64_t *vcpu_ms);
void blocktime__free(struct blocktime *b);

#endif
