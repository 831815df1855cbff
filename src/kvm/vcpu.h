/* vCPU threads.  Each vCPU has one thread running KVM_RUN and handling
 * exits.  Requests from other threads (pause, kick) go through the vm lock
 * plus kvm_run.immediate_exit and a signal, so they are safe at any time:
 * a kick that arrives just before KVM_RUN makes it return at once.
 * Other threads may use a vCPU fd (state save/restore) only while the VM
 * is paused: KVM serialises vCPU ioctls. */
#ifndef KMIG_KVM_VCPU_H
#define KMIG_KVM_VCPU_H

#include <linux/kvm.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/log.h"

struct vm;

struct vcpu {
	struct vm *vm;
	unsigned index;
	int fd;
	struct kvm_run *run;
	pthread_t thread;
	bool thread_started;
	atomic_int tid;              /* the vCPU thread's id, once it runs (0 before) */
	bool io_unfinished;          /* vCPU thread only: the last exit was PIO/MMIO,
				      * finished by the next KVM_RUN */
	/* under vm->lock */
	uint64_t kick_req, kick_ack;
	bool parked;
	bool sleep_seen;             /* began a throttle sleep since vm->sleep_watch */
	/* throttling: the current run slice began at last_throttle_ns (vCPU
	 * thread only) and ends at throttle_due_ns, when the throttle thread
	 * kicks this vCPU into its sleep */
	uint64_t last_throttle_ns;
	atomic_ullong throttle_due_ns;
	/* statistics */
	atomic_ullong exits;
	atomic_ullong throttle_ns;   /* time slept for throttling / dirty limit */
	atomic_ullong limit_sleep_ns; /* dirty-limit: sleep per 10 ms run slice */
	atomic_bool probe;           /* halt probe requested (vm__all_halted) */
	atomic_bool dead_halted;     /* probe answer: halted with IF=0 or never started */
	/* incoming state: the TSC deadline of the MSR section, written again
	 * once the LAPIC section has set the timer's mode */
	uint64_t tsc_deadline_in;
	bool tsc_deadline_in_set;
};

/* Creates the vCPU fd, maps kvm_run, sets CPUID. */
int vcpu__create(struct vcpu *v, struct vm *vm, unsigned index) KMIG_MUST_CHECK;
/* Sets the boot vCPU for a 32-bit entry (PVH or the Linux boot protocol):
 * flat protected mode, paging and interrupts off, %ebx and %esi given. */
int vcpu__setup_entry32(struct vcpu *v, uint32_t entry, uint32_t ebx, uint32_t esi) KMIG_MUST_CHECK;
int vcpu__start(struct vcpu *v) KMIG_MUST_CHECK;
void vcpu__destroy(struct vcpu *v);
/* Sends the kick signal (caller holds vm->lock and has bumped kick_req). */
void vcpu__signal(struct vcpu *v);
/* Prints the vCPU's registers and the bytes at RIP to the log. */
void vcpu__report(struct vcpu *v, const char *what);

#endif
