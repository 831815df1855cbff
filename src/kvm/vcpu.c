#include "kvm/vcpu.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/timeutil.h"
#include "dev/pci.h"
#include "kvm/vm.h"
#include "mem/dirty.h"
#include "kvm/throttle_math.h"
#include "x86/cpuid.h"

#define VCPU_KICK_SIGNAL SIGUSR1

int vcpu__create(struct vcpu *v, struct vm *vm, unsigned index)
{
	memset(v, 0, sizeof(*v));
	v->vm = vm;
	v->index = index;
	v->fd = ioctl(vm->vm_fd, KVM_CREATE_VCPU, index);
	if (v->fd < 0)
		return -errno;
	v->run = mmap(NULL, vm->run_size, PROT_READ | PROT_WRITE, MAP_SHARED, v->fd, 0);
	if (v->run == MAP_FAILED) {
		int e = errno;
		close(v->fd);
		return -e;
	}
	struct cpuid_opts opts = {
		.tsc_khz = vm->tsc_khz, .hypervisor = vm->cfg.kvmclock,
		.tsc_deadline = ioctl(vm->kvm_fd, KVM_CHECK_EXTENSION, KVM_CAP_TSC_DEADLINE_TIMER) > 0,
	};
	struct kvm_cpuid2 *c = cpuid__for_vcpu(vm->cpuid, index, vm->cfg.cpus, &opts);
	if (!c)
		return -ENOMEM;
	int rc = ioctl(v->fd, KVM_SET_CPUID2, c) < 0 ? -errno : 0;
	free(c);
	return rc;
}

void vcpu__destroy(struct vcpu *v)
{
	if (v->run && v->run != MAP_FAILED)
		munmap(v->run, v->vm->run_size);
	if (v->fd > 0)
		close(v->fd);
}

static void vcpu__seg(struct kvm_segment *s, uint16_t sel, uint8_t type, uint8_t s_bit)
{
	*s = (struct kvm_segment){ .base = 0, .limit = 0xffffffff, .selector = sel,
		.type = type, .present = 1, .dpl = 0, .db = 1, .s = s_bit, .l = 0, .g = 1 };
}

int vcpu__setup_entry32(struct vcpu *v, uint32_t entry, uint32_t ebx, uint32_t esi)
{
	struct kvm_sregs sr;
	if (ioctl(v->fd, KVM_GET_SREGS, &sr) < 0)
		return -errno;
	vcpu__seg(&sr.cs, 0x8, 0xb, 1);
	vcpu__seg(&sr.ds, 0x10, 0x3, 1);
	sr.es = sr.fs = sr.gs = sr.ss = sr.ds;
	vcpu__seg(&sr.tr, 0x18, 0xb, 0);
	sr.tr.limit = 0x67;
	sr.tr.g = 0;
	sr.cr0 = 0x11; /* PE | ET */
	sr.cr4 = 0;
	sr.efer = 0;
	if (ioctl(v->fd, KVM_SET_SREGS, &sr) < 0)
		return -errno;
	struct kvm_regs r = { .rip = entry, .rbx = ebx, .rsi = esi, .rflags = 0x2 };
	if (ioctl(v->fd, KVM_SET_REGS, &r) < 0)
		return -errno;
	return 0;
}

void vcpu__signal(struct vcpu *v)
{
	__atomic_store_n(&v->run->immediate_exit, 1, __ATOMIC_SEQ_CST);
	if (v->thread_started)
		pthread_kill(v->thread, VCPU_KICK_SIGNAL);
}

/* A PC's reset requests: the keyboard controller's pulse-reset command
 * and the reset control register's reset bit (Linux's reboot tries both
 * before a triple fault). */
static bool vcpu__is_reset(uint16_t port, uint8_t v)
{
	return (port == 0x64 && v == 0xfe) || (port == 0xcf9 && (v & 0x04));
}

static void vcpu__pio(struct vcpu *v)
{
	struct kvm_run *run = v->run;
	uint8_t *data = (uint8_t *)run + run->io.data_offset;
	bool wr = run->io.direction == KVM_EXIT_IO_OUT;
	for (uint32_t i = 0; i < run->io.count; i++, data += run->io.size) {
		uint16_t port = run->io.port;
		if (port >= SERIAL_BASE && port < SERIAL_BASE + SERIAL_NPORTS && run->io.size == 1) {
			serial__pio(&v->vm->serial, port, wr, data);
		} else if (port >= RTC_BASE && port < RTC_BASE + RTC_NPORTS && run->io.size == 1) {
			rtc__pio(&v->vm->rtc, port, wr, data);
		} else if (port == VM_POWEROFF_PORT && wr) {
			vm__shutdown(v->vm, 0);
		} else if (wr && run->io.size == 1 && vcpu__is_reset(port, *data)) {
			log_info("vCPU %u: the guest asked for a reset (port 0x%x); kmig does not "
				 "reboot a guest: the VM ends", v->index, port);
			vm__shutdown(v->vm, 0);
		} else if (v->vm->pci && port >= PCI_CONF_ADDR && port < PCI_CONF_ADDR + PCI_CONF_NPORTS) {
			pci__pio(v->vm->pci, port, wr, data, run->io.size);
		} else if (!wr) {
			memset(data, 0xff, run->io.size);
		}
	}
}

static void vcpu__mmio(struct vcpu *v)
{
	struct kvm_run *run = v->run;
	if (v->vm->pci && run->mmio.len <= sizeof(run->mmio.data) &&
	    pci__mmio(v->vm->pci, run->mmio.phys_addr, run->mmio.is_write, run->mmio.data, run->mmio.len))
		return;
	log_debug("vcpu%u: unhandled MMIO %s at 0x%llx len %u", v->index,
		  v->run->mmio.is_write ? "write" : "read",
		  (unsigned long long)v->run->mmio.phys_addr, v->run->mmio.len);
	if (!v->run->mmio.is_write)
		memset(v->run->mmio.data, 0xff, sizeof(v->run->mmio.data));
}

/* Handles one exit; returns false when the vCPU must stop running. */
static bool vcpu__handle_exit(struct vcpu *v)
{
	struct kvm_run *run = v->run;
	switch (run->exit_reason) {
	case KVM_EXIT_IO:
		vcpu__pio(v);
		return true;
	case KVM_EXIT_MMIO:
		vcpu__mmio(v);
		return true;
	case KVM_EXIT_INTR:
		return true;
	case KVM_EXIT_DIRTY_RING_FULL:
		if (v->vm->dirty)
			dirty__on_ring_full(v->vm->dirty, v->index);
		return true;
	case KVM_EXIT_HLT:
		vm__shutdown(v->vm, 0);
		return false;
	case KVM_EXIT_SHUTDOWN:
		vcpu__report(v, "guest triple fault (KVM_EXIT_SHUTDOWN)");
		vm__fail(v->vm, VM_STATUS_GUEST_PANICKED);
		return false;
	case KVM_EXIT_INTERNAL_ERROR: {
		char what[96];
		snprintf(what, sizeof(what), "KVM internal error, suberror %u",
			 run->internal.suberror);
		vcpu__report(v, what);
		vm__fail(v->vm, VM_STATUS_INTERNAL_ERROR);
		return false;
	}
	case KVM_EXIT_FAIL_ENTRY: {
		char what[96];
		snprintf(what, sizeof(what), "VM entry failed, reason 0x%llx",
			 (unsigned long long)run->fail_entry.hardware_entry_failure_reason);
		vcpu__report(v, what);
		vm__fail(v->vm, VM_STATUS_INTERNAL_ERROR);
		return false;
	}
	default: {
		char what[64];
		snprintf(what, sizeof(what), "unexpected exit reason %u", run->exit_reason);
		vcpu__report(v, what);
		vm__fail(v->vm, VM_STATUS_INTERNAL_ERROR);
		return false;
	}
	}
}

static bool vcpu__must_park(struct vm *vm)
{
	return vm->pause_depth > 0 || vm->failed || vm->quit;
}

/* Parks while the VM is paused; returns false when the thread must exit. */
static bool vcpu__gate(struct vcpu *v)
{
	struct vm *vm = v->vm;
	pthread_mutex_lock(&vm->lock);
	__atomic_store_n(&v->run->immediate_exit, 0, __ATOMIC_SEQ_CST);
	v->kick_ack = v->kick_req;
	while (vcpu__must_park(vm) && !vm->quit) {
		if (!v->parked) {
			v->parked = true;
			pthread_cond_broadcast(&vm->cond);
		}
		pthread_cond_wait(&vm->cond, &vm->lock);
		__atomic_store_n(&v->run->immediate_exit, 0, __ATOMIC_SEQ_CST);
		v->kick_ack = v->kick_req;
	}
	bool go = !vm->quit;
	v->parked = !go;
	pthread_cond_broadcast(&vm->cond);
	pthread_mutex_unlock(&vm->lock);
	return go;
}

/* Sleeps ns unless a pause or quit comes first (a pause must not wait for
 * a throttled vCPU's sleep: that would add to the migration downtime). */
static void vcpu__sleep(struct vcpu *v, uint64_t ns)
{
	struct vm *vm = v->vm;
	struct timespec ts = time__deadline(ns);
	pthread_mutex_lock(&vm->lock);
	if (vm->sleep_watch && !v->sleep_seen) {
		v->sleep_seen = true;        /* vm__await_throttle_sleeps */
		pthread_cond_broadcast(&vm->cond);
	}
	while (!vcpu__must_park(vm) &&
	       pthread_cond_timedwait(&vm->cond, &vm->lock, &ts) != ETIMEDOUT)
		;
	pthread_mutex_unlock(&vm->lock);
}

/* cpu-throttle and dirty-limit: after each run slice (10 ms, shorter above
 * a 20 ms sleep: throttle_math.h) sleep the larger of the two sleeps,
 * scaled to the run measured, so that the share of time asleep is the
 * throttle's whatever the kick's latency.  The throttle thread kicks each
 * vCPU when its slice is due (throttle_due_ns). */
static void vcpu__throttle(struct vcpu *v)
{
	unsigned pct = atomic_load(&v->vm->throttle_pct);
	uint64_t limit = atomic_load(&v->limit_sleep_ns);
	if (!pct && !limit)
		return;
	uint64_t now = time__now_ns();
	uint64_t sleep10 = throttle__sleep_ns(pct, THROTTLE_TIMESLICE_NS);
	if (limit > sleep10)
		sleep10 = limit;
	uint64_t slice = throttle__slice_ns(sleep10);
	uint64_t run = now - v->last_throttle_ns;
	if (run > THROTTLE_STALE_NS) {
		/* the throttle (re)started: a first slice begins now */
		v->last_throttle_ns = now;
		atomic_store(&v->throttle_due_ns, now + slice);
		return;
	}
	if (run < slice) {
		atomic_store(&v->throttle_due_ns, v->last_throttle_ns + slice);
		return;
	}
	vcpu__sleep(v, throttle__run_sleep_ns(sleep10, slice, run));
	v->last_throttle_ns = time__now_ns();
	atomic_store(&v->throttle_due_ns, v->last_throttle_ns + slice);
	atomic_fetch_add(&v->throttle_ns, v->last_throttle_ns - now);
}

/* Answers a halt probe (vm__all_halted): is this vCPU stopped for good,
 * halted with interrupts off or never started? */
static void vcpu__probe_halt(struct vcpu *v)
{
	struct kvm_mp_state mp;
	struct kvm_regs r;
	bool dead = false;
	if (ioctl(v->fd, KVM_GET_MP_STATE, &mp) == 0) {
		if (mp.mp_state == KVM_MP_STATE_UNINITIALIZED ||
		    mp.mp_state == KVM_MP_STATE_INIT_RECEIVED)
			dead = true;
		else if (mp.mp_state == KVM_MP_STATE_HALTED && ioctl(v->fd, KVM_GET_REGS, &r) == 0)
			dead = !(r.rflags & 0x200); /* IF clear */
	}
	atomic_store(&v->dead_halted, dead);
}

static bool vcpu__park_wanted(struct vm *vm)
{
	pthread_mutex_lock(&vm->lock);
	bool park = vcpu__must_park(vm);
	pthread_mutex_unlock(&vm->lock);
	return park;
}

static bool vcpu__exit_is_io(const struct kvm_run *run)
{
	return run->exit_reason == KVM_EXIT_IO || run->exit_reason == KVM_EXIT_MMIO;
}

/* KVM finishes an exit to userspace (PIO, MMIO: the data of a read goes
 * to the guest's register, RIP past the instruction) only at the next
 * KVM_RUN.  A vCPU about to park re-enters once with immediate_exit set,
 * which finishes it without running the guest, so the state a migration
 * saves is past the instruction.  Else the destination would execute it
 * again: a UART's IIR read twice loses its THRE interrupt, and Linux's
 * console stops for good.  String I/O may need more exits: a few rounds. */
static void vcpu__finish_io(struct vcpu *v)
{
	for (int i = 0; i < 16 && v->io_unfinished && vcpu__park_wanted(v->vm); i++) {
		__atomic_store_n(&v->run->immediate_exit, 1, __ATOMIC_SEQ_CST);
		int rc = ioctl(v->fd, KVM_RUN, 0);
		v->io_unfinished = rc == 0 && vcpu__exit_is_io(v->run);
		if (rc == 0 && !vcpu__handle_exit(v))
			return;
	}
}

static void *vcpu__thread(void *arg)
{
	struct vcpu *v = arg;
	char name[16];
	snprintf(name, sizeof(name), "vcpu%u", v->index);
	pthread_setname_np(pthread_self(), name);
	atomic_store(&v->tid, (int)gettid());
	for (;;) {
		vcpu__finish_io(v);
		if (!vcpu__gate(v))
			break;
		vcpu__throttle(v);
		int rc = ioctl(v->fd, KVM_RUN, 0);
		v->io_unfinished = rc == 0 && vcpu__exit_is_io(v->run);
		if (rc < 0) {
			if (errno == EINTR || errno == EAGAIN) {
				if (atomic_exchange(&v->probe, false))
					vcpu__probe_halt(v);
				continue;
			}
			log_err("vcpu%u: KVM_RUN failed: %s", v->index, strerror(errno));
			vm__fail(v->vm, VM_STATUS_INTERNAL_ERROR);
			continue;
		}
		atomic_fetch_add(&v->exits, 1);
		if (!vcpu__handle_exit(v))
			continue;
	}
	return NULL;
}

static void vcpu__sig_noop(int sig)
{
	(void)sig;
}

int vcpu__start(struct vcpu *v)
{
	struct sigaction sa = { .sa_handler = vcpu__sig_noop };
	sigemptyset(&sa.sa_mask);
	sigaction(VCPU_KICK_SIGNAL, &sa, NULL); /* no SA_RESTART: KVM_RUN returns EINTR */
	int rc = pthread_create(&v->thread, NULL, vcpu__thread, v);
	if (rc)
		return -rc;
	v->thread_started = true;
	return 0;
}
