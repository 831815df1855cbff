#include "kvm/vm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "base/timeutil.h"
#include "dev/balloon.h"
#include "dev/pci.h"
#include "kvm/ioevent.h"
#include "kvm/vm_balloon.h"
#include "kvm/vm_blk.h"
#include "kvm/vm_net.h"
#include "kvm/vcpu.h"
#include "mem/dirty.h"
#include "mem/memfile.h"
#include "x86/boot.h"
#include "x86/cpuid.h"
#include "x86/mptable.h"

#define VM_TSS_ADDR 0xfffbd000ul
#define VM_IDENTITY_MAP_ADDR 0xfffbc000ul

const char *vm_status__name(enum vm_status s)
{
	static const char *const names[] = {
		"prelaunch", "running", "paused", "inmigrate", "finish-migrate",
		"postmigrate", "guest-panicked", "internal-error", "shutdown", "io-error",
	};
	return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "unknown";
}

static int vm__open_kvm(struct vm *vm, char *err, size_t errlen)
{
	vm->kvm_fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (vm->kvm_fd < 0) {
		int e = errno;
		snprintf(err, errlen, "cannot open /dev/kvm: %s", strerror(e));
		return -e;
	}
	if (ioctl(vm->kvm_fd, KVM_GET_API_VERSION, 0) != KVM_API_VERSION) {
		snprintf(err, errlen, "/dev/kvm speaks an unknown KVM API version");
		return -ENOTSUP;
	}
	int max = ioctl(vm->kvm_fd, KVM_CHECK_EXTENSION, KVM_CAP_MAX_VCPUS);
	if (max <= 0)
		max = ioctl(vm->kvm_fd, KVM_CHECK_EXTENSION, KVM_CAP_NR_VCPUS);
	if (max > VM_MAX_VCPUS)
		max = VM_MAX_VCPUS;
	if (vm->cfg.cpus < 1 || vm->cfg.cpus > (unsigned)max) {
		snprintf(err, errlen, "--cpus %u: KVM allows 1 to %d vCPUs", vm->cfg.cpus, max);
		return -EINVAL;
	}
	vm->run_size = ioctl(vm->kvm_fd, KVM_GET_VCPU_MMAP_SIZE, 0);
	vm->vm_fd = ioctl(vm->kvm_fd, KVM_CREATE_VM, 0);
	if (vm->run_size <= 0 || vm->vm_fd < 0) {
		int e = errno;
		snprintf(err, errlen, "cannot create a KVM VM: %s", strerror(e));
		return -e;
	}
	return 0;
}

static int vm__setup_platform(struct vm *vm, char *err, size_t errlen)
{
	const char *what = NULL;
	if (ioctl(vm->vm_fd, KVM_SET_TSS_ADDR, VM_TSS_ADDR) < 0)
		what = "KVM_SET_TSS_ADDR";
	else if (ioctl(vm->vm_fd, KVM_SET_IDENTITY_MAP_ADDR, &(uint64_t){ VM_IDENTITY_MAP_ADDR }) < 0)
		what = "KVM_SET_IDENTITY_MAP_ADDR";
	else if (ioctl(vm->vm_fd, KVM_CREATE_IRQCHIP, 0) < 0)
		what = "KVM_CREATE_IRQCHIP";
	else if (ioctl(vm->vm_fd, KVM_CREATE_PIT2, &(struct kvm_pit_config){ .flags = KVM_PIT_SPEAKER_DUMMY }) < 0)
		what = "KVM_CREATE_PIT2";
	if (what) {
		int e = errno;
		snprintf(err, errlen, "%s failed: %s", what, strerror(e));
		return -e;
	}
	int rc = cpuid__supported(vm->kvm_fd, &vm->cpuid);
	if (rc) {
		snprintf(err, errlen, "KVM_GET_SUPPORTED_CPUID failed: %s", strerror(-rc));
		return rc;
	}
	if (vm->cfg.dirty_ring == VM_DIRTY_RING_AUTO) {
		vm->cfg.dirty_ring = dirty__ring_acq_rel_max(vm->vm_fd) >= VM_DIRTY_RING_DEFAULT ?
				     VM_DIRTY_RING_DEFAULT : 0;
	}
	if (vm->cfg.dirty_ring) {
		bool acq_rel;
		rc = dirty__enable_ring_cap(vm->vm_fd, vm->cfg.dirty_ring, &acq_rel);
		if (rc) {
			snprintf(err, errlen, "--dirty-ring %u: %s", vm->cfg.dirty_ring,
				 rc == -ENOTSUP ? "KVM has no dirty ring" :
				 rc == -EINVAL ? "must be a power of two KVM accepts" : strerror(-rc));
			return rc;
		}
	}
	return 0;
}

static int vm__create_vcpus(struct vm *vm, char *err, size_t errlen)
{
	int khz = ioctl(vm->kvm_fd, KVM_CHECK_EXTENSION, KVM_CAP_GET_TSC_KHZ) > 0 ?
		  ioctl(vm->vm_fd, KVM_GET_TSC_KHZ, 0) : -1;
	vm->tsc_khz = khz > 0 ? (uint32_t)khz : 0;
	vm->vcpus = calloc(vm->cfg.cpus, sizeof(*vm->vcpus));
	if (!vm->vcpus)
		return -ENOMEM;
	for (unsigned i = 0; i < vm->cfg.cpus; i++) {
		int rc = vcpu__create(&vm->vcpus[i], vm, i);
		vm->nr_vcpus = i + 1;
		if (rc) {
			snprintf(err, errlen, "cannot create vCPU %u: %s", i, strerror(-rc));
			return rc;
		}
		if (!vm->tsc_khz) {
			khz = ioctl(vm->vcpus[i].fd, KVM_GET_TSC_KHZ, 0);
			vm->tsc_khz = khz > 0 ? (uint32_t)khz : 0;
		}
	}
	/*
	 * KVM rebuilds its APIC ID -> vCPU map while KVM_CREATE_VCPU resets the
	 * new vCPU, before that vCPU is visible, so the map lacks the last vCPU
	 * created and an INIT/SIPI sent to it is dropped (it stays
	 * UNINITIALIZED) until something else rebuilds the map: an AP's INIT,
	 * a guest SVR write, or KVM_SET_LAPIC.  Rebuild it now that all vCPUs
	 * exist; one vCPU's round trip is enough.
	 */
	struct kvm_lapic_state lapic;
	if (ioctl(vm->vcpus[0].fd, KVM_GET_LAPIC, &lapic) < 0 ||
	    ioctl(vm->vcpus[0].fd, KVM_SET_LAPIC, &lapic) < 0) {
		int e = errno;
		snprintf(err, errlen, "KVM_GET/SET_LAPIC failed: %s", strerror(e));
		return -e;
	}
	return 0;
}

static void vm__kick_cb(void *ctx)
{
	vm__kick_all_sync(ctx);
}

/* The dirty tracker gets what it needs of the VM, no more. */
static int vm__create_tracker(struct vm *vm, char *err, size_t errlen)
{
	int fds[VM_MAX_VCPUS];
	for (unsigned i = 0; i < vm->nr_vcpus; i++)
		fds[i] = vm->vcpus[i].fd;
	struct dirty_host h = {
		.kvm_fd = vm->kvm_fd, .vm_fd = vm->vm_fd, .ram = &vm->ram,
		.nr_vcpus = vm->nr_vcpus, .vcpu_fds = fds, .ring_entries = vm->cfg.dirty_ring,
		.kick_all = vm__kick_cb, .kick_ctx = vm,
		.clear_chunk_pages = vm->cfg.clear_chunk_pages,
	};
	int rc = dirty__create(&vm->dirty, &h, vm->cfg.reaper_fixed ? REAPER_FIXED : REAPER_ADAPTIVE);
	if (rc)
		snprintf(err, errlen, "cannot set up dirty tracking: %s", strerror(-rc));
	return rc;
}

/* The MP table in the BIOS area: how a guest without ACPI finds its CPUs,
 * and the balloon's INTA when there is a PCI bus. */
static int vm__write_mptable(struct vm *vm, char *err, size_t errlen)
{
	struct mptable_pci_irq pci[3];
	unsigned npci = 0;
	if (vm->cfg.balloon)
		pci[npci++] = (struct mptable_pci_irq){ BALLOON_PCI_SLOT, 1, BALLOON_IRQ };
	if (vm->cfg.net)
		pci[npci++] = (struct mptable_pci_irq){ NET_PCI_SLOT, 1, NET_IRQ };
	if (vm->cfg.blk)
		pci[npci++] = (struct mptable_pci_irq){ BLK_PCI_SLOT, 1, BLK_IRQ };
	size_t size = mptable__size(vm->nr_vcpus, npci);
	uint8_t *host = ram__gpa_to_host(&vm->ram, MPTABLE_GPA, size);
	long n = host ? mptable__build(host, size, MPTABLE_GPA, vm->nr_vcpus, pci, npci)
		      : -ERANGE;
	if (n < 0)
		snprintf(err, errlen, "cannot write the MP table: %s", strerror((int)-n));
	return n < 0 ? (int)n : 0;
}

/* COM1's interrupt line into the in-kernel irqchip (PIC and IOAPIC pin 4). */
static void vm__serial_irq(void *ctx, bool level)
{
	struct vm *vm = ctx;
	struct kvm_irq_level l = { .irq = SERIAL_IRQ, .level = level };
	if (ioctl(vm->vm_fd, KVM_IRQ_LINE, &l) < 0)
		log_debug("serial: KVM_IRQ_LINE %d: %s", level, strerror(errno));
}

/* The CMOS RTC's interrupt line (PIC and IOAPIC pin 8). */
static void vm__rtc_irq(void *ctx, bool level)
{
	struct vm *vm = ctx;
	struct kvm_irq_level l = { .irq = RTC_IRQ, .level = level };
	if (ioctl(vm->vm_fd, KVM_IRQ_LINE, &l) < 0)
		log_debug("rtc: KVM_IRQ_LINE %d: %s", level, strerror(errno));
}

/* Guest RAM: anonymous, or a memory-backend-file's shared file (booting
 * empties it; an incoming VM leaves it as it is, for a hand-over). */
static int vm__create_ram(struct vm *vm, char *err, size_t errlen)
{
	const struct vm_config *cfg = &vm->cfg;
	int rc, fd = -1;
	if (cfg->mem_path[0]) {
		if (!(vm->memfile = calloc(1, sizeof(*vm->memfile))))
			return -ENOMEM;
		rc = memfile__open(vm->memfile, cfg->mem_path, cfg->mem_size, !cfg->incoming, err,
				   errlen);
		if (rc) {
			free(vm->memfile);
			vm->memfile = NULL;
			return rc;
		}
		fd = vm->memfile->fd;
	}
	rc = ram__create_shared(&vm->ram, vm->vm_fd, cfg->mem_size, fd);
	if (rc) {
		snprintf(err, errlen, "cannot map %llu MiB of guest RAM%s%s: %s",
			 (unsigned long long)(cfg->mem_size >> 20), fd >= 0 ? " from " : "",
			 fd >= 0 ? cfg->mem_path : "", strerror(-rc));
		return rc;
	}
	rc = cfg->mem_prealloc ? ram__prealloc(&vm->ram) : 0;
	if (rc)
		snprintf(err, errlen, "--mem-prealloc: cannot map all %llu MiB of guest RAM: %s%s",
			 (unsigned long long)(cfg->mem_size >> 20), strerror(-rc),
			 rc == -EINVAL ? " (needs Linux 5.14's MADV_POPULATE_WRITE)" : "");
	return rc;
}

int vm__create(struct vm *vm, const struct vm_config *cfg, char *err, size_t errlen)
{
	memset(vm, 0, sizeof(*vm));
	vm->cfg = *cfg;
	vm->kvm_fd = vm->vm_fd = -1;
	vm->kstats.fd = -1;
	pthread_mutex_init(&vm->lock, NULL);
	time__cond_init(&vm->cond); /* vCPU throttle sleeps wait on it */
	serial__init(&vm->serial, cfg->console_fd);
	rtc__init(&vm->rtc);
	vm->status = VM_STATUS_PRELAUNCH;
	vm->autostart = true;
	int rc = vm__open_kvm(vm, err, errlen);
	if (!rc)
		rc = vm__setup_platform(vm, err, errlen);
	if (!rc)
		serial__connect_irq(&vm->serial, vm__serial_irq, vm);
	if (!rc && (rc = rtc__start(&vm->rtc, vm__rtc_irq, vm)))
		snprintf(err, errlen, "cannot start the RTC's thread: %s", strerror(-rc));
	if (!rc)
		rc = vm__create_ram(vm, err, errlen);
	if (!rc)
		rc = vm__create_vcpus(vm, err, errlen);
	if (!rc && !cfg->incoming) {
		struct boot_info bi;
		rc = boot__load(&vm->ram, cfg->kernel, cfg->initrd, cfg->cmdline, &bi, err, errlen);
		if (!rc)
			rc = vm__write_mptable(vm, err, errlen);
		if (!rc)
			rc = vcpu__setup_entry32(&vm->vcpus[0], bi.entry, bi.ebx, bi.esi);
	}
	if (!rc)
		rc = vm__create_tracker(vm, err, errlen);
	if (!rc && kvm_stats__open(&vm->kstats, vm->kvm_fd, vm->vm_fd))
		log_debug("KVM binary statistics unavailable");
	if (!rc && (cfg->balloon || cfg->net || cfg->blk) && !(vm->pci = calloc(1, sizeof(*vm->pci))))
		rc = -ENOMEM;
	if (vm->pci)
		pci__init(vm->pci);
	if (!rc && cfg->balloon)
		rc = vm_balloon__attach(vm, err, errlen);
	if (!rc && cfg->net)
		rc = vm_net__attach(vm, err, errlen);
	if (!rc && cfg->blk)
		rc = vm_blk__attach(vm, err, errlen);
	return rc;
}

/* The devices' ioevent threads (at most VM_IOEVENTS); their number. */
#define VM_IOEVENTS 3
static unsigned vm__ioevents(struct vm *vm, struct ioevent *io[VM_IOEVENTS])
{
	unsigned n = 0;
	if (vm->notify)
		io[n++] = vm->notify;
	if (vm->net_notify)
		io[n++] = vm->net_notify;
	if (vm->blk_notify)
		io[n++] = vm->blk_notify;
	return n;
}

int vm__start(struct vm *vm, enum vm_status status)
{
	bool start_paused = status != VM_STATUS_RUNNING;
	pthread_mutex_lock(&vm->lock);
	vm->pause_depth = start_paused ? 1 : 0;
	vm->status = status;
	pthread_mutex_unlock(&vm->lock);
	if (start_paused)
		rtc__hold(&vm->rtc);   /* released with that pause level */
	struct ioevent *io[VM_IOEVENTS];
	unsigned nio = vm__ioevents(vm, io);
	for (unsigned i = 0; i < nio; i++) {
		if (start_paused)
			(void)ioevent__hold(io[i], 0);   /* not running yet: at once */
		int rc = ioevent__start(io[i]);
		if (rc)
			return rc;
	}
	for (unsigned i = 0; i < vm->nr_vcpus; i++) {
		int rc = vcpu__start(&vm->vcpus[i]);
		if (rc)
			return rc;
	}
	dirtylimit__init(&vm->dirtylimit, vm);
	return throttle__start(&vm->throttle, vm);
}

void vm__request_quit(struct vm *vm)
{
	pthread_mutex_lock(&vm->lock);
	vm->quit = true;
	pthread_cond_broadcast(&vm->cond);
	for (unsigned i = 0; i < vm->nr_vcpus; i++)
		vcpu__signal(&vm->vcpus[i]);
	pthread_mutex_unlock(&vm->lock);
}

void vm__destroy(struct vm *vm)
{
	throttle__stop(&vm->throttle);
	if (vm->throttle.vm)
		dirtylimit__destroy(&vm->dirtylimit);
	vm__request_quit(vm);
	for (unsigned i = 0; i < vm->nr_vcpus; i++)
		if (vm->vcpus[i].thread_started)
			pthread_join(vm->vcpus[i].thread, NULL);
	vm_blk__detach(vm);
	vm_net__detach(vm);
	vm_balloon__detach(vm);
	if (vm->pci) {
		pci__destroy(vm->pci);
		free(vm->pci);
		vm->pci = NULL;
	}
	if (vm->dirty)
		dirty__destroy(vm->dirty);
	kvm_stats__close(&vm->kstats);
	for (unsigned i = 0; i < vm->nr_vcpus; i++)
		vcpu__destroy(&vm->vcpus[i]);
	free(vm->vcpus);
	free(vm->cpuid);
	ram__destroy(&vm->ram);
	if (vm->memfile)
		memfile__close(vm->memfile);
	free(vm->memfile);
	vm->memfile = NULL;
	serial__destroy(&vm->serial);
	rtc__stop(&vm->rtc);
	rtc__destroy(&vm->rtc);
	if (vm->vm_fd >= 0)
		close(vm->vm_fd);
	if (vm->kvm_fd >= 0)
		close(vm->kvm_fd);
}

static bool vm__all_parked(struct vm *vm)
{
	for (unsigned i = 0; i < vm->nr_vcpus; i++)
		if (vm->vcpus[i].thread_started && !vm->vcpus[i].parked)
			return false;
	return true;
}

static bool vm__sleeps_seen(struct vm *vm)
{
	for (unsigned i = 0; i < vm->nr_vcpus; i++) {
		struct vcpu *v = &vm->vcpus[i];
		bool throttled = atomic_load(&vm->throttle_pct) || atomic_load(&v->limit_sleep_ns);
		if (v->thread_started && !v->parked && throttled && !v->sleep_seen)
			return false;
	}
	return true;
}

/* How often vm__await_throttle_sleeps looks again by itself: the throttle
 * and the dirty limits end without a word on vm->cond. */
#define VM_SLEEP_RECHECK_NS 10000000ull

int vm__await_throttle_sleeps(struct vm *vm, uint64_t timeout_ns)
{
	uint64_t end = time__now_ns() + timeout_ns;
	int rc = 0;
	pthread_mutex_lock(&vm->lock);
	vm->sleep_watch = true;
	for (unsigned i = 0; i < vm->nr_vcpus; i++)
		vm->vcpus[i].sleep_seen = false;
	while (!vm__sleeps_seen(vm)) {
		uint64_t now = time__now_ns();
		if (now >= end) {
			rc = -ETIMEDOUT;
			break;
		}
		uint64_t wait = end - now < VM_SLEEP_RECHECK_NS ? end - now : VM_SLEEP_RECHECK_NS;
		struct timespec ts = time__deadline(wait);
		(void)pthread_cond_timedwait(&vm->cond, &vm->lock, &ts);
	}
	vm->sleep_watch = false;
	pthread_mutex_unlock(&vm->lock);
	return rc;
}

/* Lock held: one more pause level; waits for every vCPU to park, for
 * ever (wait_ns 0) or until the deadline.  Whether they all did. */
static bool vm__add_pause(struct vm *vm, uint64_t wait_ns)
{
	struct timespec ts = time__deadline(wait_ns);
	bool parked = true;
	vm->pause_depth++;
	pthread_cond_broadcast(&vm->cond); /* cuts throttle sleeps short */
	for (unsigned i = 0; i < vm->nr_vcpus; i++)
		vcpu__signal(&vm->vcpus[i]);
	while (!vm__all_parked(vm) && parked) {
		if (!wait_ns)
			pthread_cond_wait(&vm->cond, &vm->lock);
		else if (pthread_cond_timedwait(&vm->cond, &vm->lock, &ts) == ETIMEDOUT)
			parked = vm__all_parked(vm);
	}
	return parked;
}

/* Lock not held, after vm__add_pause: the level holds the ioevent threads.
 * One whose vCPUs did not all park, or whose thread stayed busy, holds
 * nothing and is counted in vm->unheld instead. */
static void vm__hold_devices(struct vm *vm, bool parked, uint64_t wait_ns)
{
	struct ioevent *io[VM_IOEVENTS];
	unsigned n = vm__ioevents(vm, io), held = 0;
	rtc__hold(&vm->rtc);   /* its line waits for the vCPUs (dev/rtc.h) */
	while (parked && held < n && ioevent__hold(io[held], wait_ns))
		held++;
	/* the disk's requests in flight complete (and are flushed) now,
	 * before anyone reads guest RAM or the image of a stopped VM */
	if (held == n && vm_blk__drain(vm, wait_ns))
		log_warn("pause: the disk's requests did not all complete or flush (a page not "
			 "here yet?)");
	/* the console file holds all the guest wrote, also a line it has not
	 * ended (after a migration the destination's console goes on with it) */
	if (parked)
		serial__flush(&vm->serial);
	if (held == n)
		return;
	while (held)
		ioevent__release(io[--held]);
	pthread_mutex_lock(&vm->lock);
	vm->unheld++;
	pthread_mutex_unlock(&vm->lock);
	log_warn("pause: %s; they stop when they come back", parked ?
		 "a device is still busy (on a page not here yet?)" :
		 "a vCPU is still in the kernel (on a page not here yet?)");
}

/* Lock not held, after a pause level went: its hold goes too. */
static void vm__release_devices(struct vm *vm)
{
	struct ioevent *io[VM_IOEVENTS];
	unsigned n = vm__ioevents(vm, io);
	rtc__release(&vm->rtc);
	if (!n)
		return;
	pthread_mutex_lock(&vm->lock);
	bool unheld = vm->unheld > 0;
	if (unheld)
		vm->unheld--;
	pthread_mutex_unlock(&vm->lock);
	for (unsigned i = 0; !unheld && i < n; i++)
		ioevent__release(io[i]);
}

/* Under vm->lock: the new status, told to on_run_change when it enters
 * or leaves running. */
static void vm__status_locked(struct vm *vm, enum vm_status s)
{
	bool was = vm->status == VM_STATUS_RUNNING, is = s == VM_STATUS_RUNNING;
	vm->status = s;
	if (was != is && vm->on_run_change)
		vm->on_run_change(vm->event_ctx, is);
}

void vm__pause_vcpus(struct vm *vm)
{
	pthread_mutex_lock(&vm->lock);
	bool parked = vm__add_pause(vm, 0);
	pthread_mutex_unlock(&vm->lock);
	vm__hold_devices(vm, parked, 0);
}

enum vm_status vm__pause_into(struct vm *vm, unsigned from, enum vm_status to,
			      uint64_t wait_ns, bool *done)
{
	pthread_mutex_lock(&vm->lock);
	enum vm_status prev = vm->status;
	bool parked = true;
	*done = (from & VM_STATUS_BIT(prev)) != 0;
	if (*done) {
		vm__status_locked(vm, to);
		parked = vm__add_pause(vm, wait_ns);
	}
	pthread_mutex_unlock(&vm->lock);
	if (*done)
		vm__hold_devices(vm, parked, wait_ns);
	return prev;
}

/* Under vm->lock: undoes one pause level, if any; whether it did. */
static bool vm__unpause_locked(struct vm *vm)
{
	bool resumed = vm->pause_depth > 0;
	if (resumed)
		vm->pause_depth--;
	pthread_cond_broadcast(&vm->cond);
	return resumed;
}

/* Takes vm->lock's place after vm__unpause_locked: drops the lock, lets
 * the devices go on (resumed) and, at the last level, the disk retry
 * what it kept. */
static void vm__unlock_unpaused(struct vm *vm, bool resumed)
{
	bool runs = resumed && !vm->pause_depth;
	pthread_mutex_unlock(&vm->lock);
	if (resumed)
		vm__release_devices(vm);
	if (runs)
		vm_blk__restart(vm);
}

bool vm__resume_from(struct vm *vm, unsigned from, enum vm_status to)
{
	pthread_mutex_lock(&vm->lock);
	bool ok = (from & VM_STATUS_BIT(vm->status)) != 0, resumed = false;
	if (ok) {
		vm__status_locked(vm, to);
		resumed = vm__unpause_locked(vm);
	}
	vm__unlock_unpaused(vm, resumed);
	return ok;
}

/* ---- QEMU's autostart: does an incoming guest run once it has arrived ---- */

bool vm__set_autostart(struct vm *vm, bool on)
{
	pthread_mutex_lock(&vm->lock);
	bool in = vm->status == VM_STATUS_INMIGRATE;
	if (in)
		vm->autostart = on;
	pthread_mutex_unlock(&vm->lock);
	return in;
}

enum vm_incoming_end vm__end_incoming(struct vm *vm, enum vm_run_permit permit,
				      enum vm_status stopped)
{
	enum vm_incoming_end end;
	bool resumed = false;
	pthread_mutex_lock(&vm->lock);
	bool run = vm->run_after_migration && vm->autostart;
	if (vm->status != VM_STATUS_INMIGRATE) {
		end = VM_INCOMING_LEFT;
	} else if (run && permit == VM_RUN_ASK) {
		end = VM_INCOMING_WANTS_RUN;
	} else if (run && permit == VM_RUN_ALLOWED) {
		vm__status_locked(vm, VM_STATUS_RUNNING);
		end = VM_INCOMING_RAN;
		resumed = vm__unpause_locked(vm);
	} else {
		vm__status_locked(vm, stopped);
		end = VM_INCOMING_STOPPED;
	}
	vm__unlock_unpaused(vm, resumed);
	return end;
}

void vm__resume_vcpus(struct vm *vm)
{
	pthread_mutex_lock(&vm->lock);
	vm__unlock_unpaused(vm, vm__unpause_locked(vm));
}

void vm__kick_all(struct vm *vm)
{
	pthread_mutex_lock(&vm->lock);
	for (unsigned i = 0; i < vm->nr_vcpus; i++) {
		vm->vcpus[i].kick_req++;
		vcpu__signal(&vm->vcpus[i]);
	}
	pthread_mutex_unlock(&vm->lock);
}

void vm__kick(struct vm *vm, unsigned i)
{
	pthread_mutex_lock(&vm->lock);
	if (i < vm->nr_vcpus) {
		vm->vcpus[i].kick_req++;
		vcpu__signal(&vm->vcpus[i]);
	}
	pthread_mutex_unlock(&vm->lock);
}

/* Kicks every vCPU and waits for each to take it, for ever (timeout_ns 0)
 * or until the deadline; false if one did not in time. */
static bool vm__kick_all_wait(struct vm *vm, uint64_t timeout_ns)
{
	uint64_t want[VM_MAX_VCPUS];
	struct timespec ts = time__deadline(timeout_ns);
	bool all = true;
	pthread_mutex_lock(&vm->lock);
	for (unsigned i = 0; i < vm->nr_vcpus; i++) {
		want[i] = ++vm->vcpus[i].kick_req;
		vcpu__signal(&vm->vcpus[i]);
	}
	for (unsigned i = 0; i < vm->nr_vcpus && all; i++) {
		struct vcpu *v = &vm->vcpus[i];
		while (v->thread_started && !v->parked && v->kick_ack < want[i] && !vm->quit && all) {
			if (!timeout_ns)
				pthread_cond_wait(&vm->cond, &vm->lock);
			else if (pthread_cond_timedwait(&vm->cond, &vm->lock, &ts) == ETIMEDOUT)
				all = false;
		}
	}
	pthread_mutex_unlock(&vm->lock);
	return all;
}

void vm__kick_all_sync(struct vm *vm)
{
	vm__kick_all_wait(vm, 0);
}

/* How long the halt probe waits for the vCPUs: one held in the kernel
 * (a post-copy page that has not arrived) is not halted, and the control
 * loop that asks must not wait with it. */
#define VM_PROBE_WAIT_NS 200000000ull

unsigned vm__vcpu_tids(struct vm *vm, int *tids, unsigned max)
{
	unsigned n = vm->nr_vcpus < max ? vm->nr_vcpus : max;
	for (unsigned i = 0; i < n; i++)
		tids[i] = atomic_load(&vm->vcpus[i].tid);
	return n;
}

bool vm__all_halted(struct vm *vm)
{
	uint64_t exits = 0;
	for (unsigned i = 0; i < vm->nr_vcpus; i++)
		exits += atomic_load(&vm->vcpus[i].exits);
	if (exits != vm->probe_exits || vm__status(vm) != VM_STATUS_RUNNING) {
		vm->probe_exits = exits;
		return false;
	}
	for (unsigned i = 0; i < vm->nr_vcpus; i++) {
		atomic_store(&vm->vcpus[i].dead_halted, false);
		atomic_store(&vm->vcpus[i].probe, true);
	}
	bool all = vm__kick_all_wait(vm, VM_PROBE_WAIT_NS);
	for (unsigned i = 0; i < vm->nr_vcpus; i++)
		all &= atomic_load(&vm->vcpus[i].dead_halted);
	return all && vm__status(vm) == VM_STATUS_RUNNING;
}

enum vm_status vm__status(struct vm *vm)
{
	pthread_mutex_lock(&vm->lock);
	enum vm_status s = vm->status;
	pthread_mutex_unlock(&vm->lock);
	return s;
}

void vm__set_status(struct vm *vm, enum vm_status s)
{
	pthread_mutex_lock(&vm->lock);
	vm__status_locked(vm, s);
	pthread_mutex_unlock(&vm->lock);
}

void vm__shutdown(struct vm *vm, int exit_code)
{
	pthread_mutex_lock(&vm->lock);
	bool first = vm->status != VM_STATUS_SHUTDOWN;
	vm->status = VM_STATUS_SHUTDOWN;
	vm->failed = true;
	atomic_store(&vm->exit_code, exit_code);
	pthread_cond_broadcast(&vm->cond);
	for (unsigned i = 0; i < vm->nr_vcpus; i++)
		vcpu__signal(&vm->vcpus[i]);
	pthread_mutex_unlock(&vm->lock);
	serial__flush(&vm->serial);
	if (first && vm->on_event)
		vm->on_event(vm->event_ctx, VM_EVENT_SHUTDOWN);
}

void vm__fail(struct vm *vm, enum vm_status why)
{
	pthread_mutex_lock(&vm->lock);
	bool first = !vm->failed, ran = vm->status == VM_STATUS_RUNNING;
	vm->failed = true;
	if (first)
		vm->status = why;
	pthread_cond_broadcast(&vm->cond);
	for (unsigned i = 0; i < vm->nr_vcpus; i++)
		vcpu__signal(&vm->vcpus[i]);
	pthread_mutex_unlock(&vm->lock);
	serial__flush(&vm->serial);
	if (first && vm->on_event)
		vm->on_event(vm->event_ctx, ran ? VM_EVENT_FAILED : VM_EVENT_FAILED_STOPPED);
}
