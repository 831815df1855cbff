/* The virtual machine: owns the KVM fds, guest RAM, vCPU threads and
 * devices.  One struct vm per process; nothing here is global.
 *
 * Threads: vm__start creates one thread per vCPU.  Every other function
 * may be called from any thread except where noted; the vm lock guards
 * the run state, pause depth and per-vCPU request counters.
 *
 * Pausing: vm__pause_vcpus() returns once every vCPU thread is parked
 * outside KVM_RUN; pauses nest (a QMP `stop` and a migration can both
 * hold the VM); vm__resume_vcpus() undoes one.  Each pause level also
 * holds the devices' ioeventfd thread (kvm/ioevent.h), so that no device
 * works on a queue while the VM is stopped.  A guest failure parks all
 * vCPUs until the VM is destroyed (the control socket stays up). */
#ifndef KMIG_KVM_VM_H
#define KMIG_KVM_VM_H

#include <linux/kvm.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/log.h"
#include "dev/rtc.h"
#include "dev/serial.h"
#include "kvm/dirtylimit.h"
#include "kvm/kvm_stats.h"
#include "kvm/throttle.h"
#include "mem/ram.h"

#define VM_MAX_VCPUS 64
#define VM_POWEROFF_PORT 0xf4

/* QMP's RunState names, in query-status order. */
enum vm_status {
	VM_STATUS_PRELAUNCH,
	VM_STATUS_RUNNING,
	VM_STATUS_PAUSED,
	VM_STATUS_INMIGRATE,
	VM_STATUS_FINISH_MIGRATE,
	VM_STATUS_POSTMIGRATE,
	VM_STATUS_GUEST_PANICKED,
	VM_STATUS_INTERNAL_ERROR,
	VM_STATUS_SHUTDOWN,
	VM_STATUS_IO_ERROR,      /* "io-error": a disk error whose action is stop */
};
const char *vm_status__name(enum vm_status s);

#define VM_NAME_MAX 256

struct vm_config {
	const char *kernel;          /* PVH ELF or bzImage (x86/boot.h) */
	const char *initrd;          /* NULL: none */
	const char *cmdline;
	uint64_t mem_size;
	char mem_path[1024];     /* memory-backend-file's mem-path (mem/memfile.h); "": anonymous */
	char mem_id[32];         /* that backend's id */
	unsigned cpus;
	bool has_uuid;           /* --uuid (ctl/ident_opts.h) */
	uint8_t uuid[16];
	char name[VM_NAME_MAX];  /* --name; "": none */
	int console_fd;          /* -1: console discarded */
	uint32_t dirty_ring;     /* entries per vCPU ring; 0 = bitmap tracking;
				  * VM_DIRTY_RING_AUTO = VM_DIRTY_RING_DEFAULT entries where
				  * KVM has the acquire/release ring, else the bitmap
				  * (vm__create sets the one it chose) */
	bool incoming;           /* do not load a kernel: RAM and state arrive by migration */
	bool mem_prealloc;       /* --mem-prealloc: every page of RAM mapped at start */
	bool reaper_fixed;       /* ring reaper every 1 s (QEMU's way) instead of adaptive */
	bool balloon;            /* PCI bus with a virtio-balloon (kvm/vm_balloon.h) */
	bool balloon_no_hint;    /* ... that does not offer free page hinting */
	bool balloon_no_reporting; /* ... nor free page reporting */
	bool balloon_no_ioeventfd; /* its queue notifications exit to kmig */
	uint64_t clear_chunk_pages; /* dirty tracker's deferred-clear chunk; 0 = default */
	bool kvmclock;           /* CPUID says "hypervisor": Linux finds KVM's leaves, uses kvm-clock */
	bool net;                /* a virtio-net-pci on a tap (kvm/vm_net.h) */
	struct vm_net_config {
		char netdev_id[32];  /* --netdev ...,id= */
		char device_id[32];  /* --device ...,id= (may be empty) */
		char ifname[16];     /* the tap */
		uint8_t mac[6];
		uint16_t mtu;        /* 0: MTU not offered */
		bool no_offloads;    /* csum=off: no checksum or TSO offloads */
	} netc;
	bool blk;                /* a virtio-blk-pci on an image (kvm/vm_blk.h) */
	struct vm_blk_config {
		char node_name[32];  /* --blockdev node-name= / --drive id= */
		char device_id[32];  /* --device ...,id= (may be empty) */
		char path[1024];     /* the image */
		char serial[21];     /* GET_ID's answer (may be empty) */
		bool read_only;      /* read-only=on / readonly=on */
		bool direct;         /* cache.direct=on / cache=none */
		bool writeback;      /* write-cache=on (the default) */
		bool discard;        /* discard=unmap */
		uint32_t lbs;        /* logical_block_size (512 by default) */
		bool legacy_drive;   /* given as --drive (QMP's device is its id) */
		int werror, rerror;  /* enum blk_on_error (dev/blk.h) */
	} blkc;
};

#define VM_DIRTY_RING_AUTO    UINT32_MAX
#define VM_DIRTY_RING_DEFAULT 4096u

struct dirty;                    /* mem/dirty.h */
struct memfile;                  /* mem/memfile.h */
struct pci_bus;                  /* dev/pci.h */
struct balloon;                  /* dev/balloon.h */
struct net;                      /* dev/net.h */
struct tap;                      /* dev/tap.h */
struct announcer;                /* dev/announce.h */
struct blk;                      /* dev/blk.h */
struct blkfile;                  /* dev/blkfile.h */
struct blk_io_error;             /* dev/blk.h */
struct vcpu;

/* Events the VM reports to whoever drives it (the control loop). */
enum vm_event {
	VM_EVENT_SHUTDOWN,
	VM_EVENT_FAILED,            /* the guest failed while it ran: it stopped */
	VM_EVENT_FAILED_STOPPED,    /* it failed while not running (a vCPU still in the
				     * kernel as it was being stopped) */
};
typedef void (*vm_event_fn)(void *ctx, enum vm_event ev);

struct vm {
	struct vm_config cfg;
	int kvm_fd, vm_fd;
	int run_size;                /* mmap size of struct kvm_run */
	uint32_t tsc_khz;
	struct kvm_cpuid2 *cpuid;    /* supported table, adjusted per vCPU */
	struct ram ram;
	struct memfile *memfile;     /* RAM's shared file; NULL: anonymous RAM */
	struct serial serial;
	struct rtc rtc;
	struct dirty *dirty;         /* NULL until the tracker is created */
	struct kvm_stats kstats;     /* fd -1 where KVM has no binary statistics */
	struct pci_bus *pci;         /* NULL without a PCI device */
	struct balloon *balloon;     /* NULL without --balloon */
	struct ioevent *notify;      /* the balloon's ioeventfds; NULL without */
	struct net *net;             /* NULL without a virtio-net-pci */
	struct tap *tap;             /* its backend */
	struct ioevent *net_notify;  /* its ioeventfds and tap reader; NULL without */
	struct announcer *announce;  /* its self-announcements; NULL without */
	struct blk *blk;             /* NULL without a virtio-blk-pci */
	struct blkfile *blkfile;     /* its image */
	struct ioevent *blk_notify;  /* its ioeventfds; NULL without */
	unsigned nr_vcpus;
	struct vcpu *vcpus;

	pthread_mutex_t lock;
	pthread_cond_t cond;
	enum vm_status status;       /* under lock */
	unsigned pause_depth;        /* under lock: >0 parks every vCPU */
	unsigned unheld;             /* under lock: pause levels that hold no ioevent thread */
	bool failed;                 /* under lock: a guest failure parked the VM */
	bool quit;                   /* under lock: vCPU threads exit */
	bool sleep_watch;            /* under lock: vCPUs note a throttle sleep's start */
	atomic_int exit_code;        /* process exit status once shut down */
	atomic_bool device_marks_off; /* test builds' KMIG_FAULT=no-device-marks (mig/send/fault.h) */
	bool run_after_migration;    /* source: was running at switchover; destination: resume */
	bool never_ran;              /* source: prelaunch (-S, no `cont` yet) at switchover;
				      * destination: the guest arrives so, and stays so */
	bool autostart;              /* under lock: an incoming guest whose source ran it runs
				      * once the migration ends (QEMU's autostart: -S clears
				      * it, stop and cont in inmigrate set it) */
	struct vm_tsc_in {           /* destination: the source's TSC sample (state_tsc.c) */
		bool valid;          /* a STATE_VM_TSC section arrived */
		bool offset_known;   /* offset computed (with the TSC attribute) */
		uint64_t tsc;        /* guest TSC of vCPU 0 at realtime_ns */
		uint64_t realtime_ns;
		uint32_t khz;        /* the source's guest TSC frequency */
		int64_t offset;      /* the TSC offset every vCPU gets */
	} tsc_in;
	uint64_t probe_exits;        /* vm__all_halted: exits seen at the previous call */
	atomic_uint throttle_pct;    /* 0..99: share of time vCPUs sleep (set via throttle) */
	struct throttle throttle;
	struct dirtylimit dirtylimit;

	vm_event_fn on_event;
	void *event_ctx;
	/* The disk failed a request (dev/blk.h): on a disk worker, any
	 * time; event_ctx is its ctx.  Set before vm__start; may be NULL. */
	void (*on_io_error)(void *ctx, const struct blk_io_error *e);
	/* The status entered (running) or left running: under vm->lock, in
	 * the same step as the change, so what a client hears comes in the
	 * order the changes were made; it must neither block nor take
	 * vm->lock.  Not at vm__start, nor for a shutdown or a guest failure
	 * (on_event reports those).  event_ctx is its ctx; may be NULL. */
	void (*on_run_change)(void *ctx, bool running);
};

/* Opens /dev/kvm, creates the VM, RAM, irqchip, PIT, devices and vCPUs
 * (threads not started) and, unless cfg->incoming, loads the kernel.
 * On failure writes a one-line reason into err and returns -errno. */
int vm__create(struct vm *vm, const struct vm_config *cfg, char *err, size_t errlen) KMIG_MUST_CHECK;
/* Starts the vCPU threads.  status VM_STATUS_RUNNING runs the guest; any
 * other (prelaunch for QEMU's -S, inmigrate for --incoming) starts it
 * paused (depth 1) with that status. */
int vm__start(struct vm *vm, enum vm_status status) KMIG_MUST_CHECK;
/* Tells every vCPU thread to exit (kicked out of KVM_RUN); for the end of
 * the process only: nothing runs the guest after it. */
void vm__request_quit(struct vm *vm);
/* Stops and joins vCPU threads, frees everything. */
void vm__destroy(struct vm *vm);

void vm__pause_vcpus(struct vm *vm);
/* Undoes one pause level; the last one also lets the disk retry the
 * requests it kept after an I/O error (vm_blk__restart). */
void vm__resume_vcpus(struct vm *vm);
/* Waits, at most timeout_ns, until every throttled vCPU that runs has
 * just begun a throttle sleep (it then sleeps on, so a pause that follows
 * at once starts where the guest last ran, not part-way into a sleep).
 * Returns at once when no vCPU is throttled; -ETIMEDOUT when some vCPU
 * did not get there in time (nothing is changed either way). */
int vm__await_throttle_sleeps(struct vm *vm, uint64_t timeout_ns);
/* Every running vCPU leaves KVM_RUN at least once before this returns
 * (pending dirty-ring entries are then visible); parked vCPUs count. */
void vm__kick_all_sync(struct vm *vm);
/* Interrupts KVM_RUN of every vCPU without waiting. */
void vm__kick_all(struct vm *vm);
/* Kicks vCPU i out of KVM_RUN without waiting (any thread). */
void vm__kick(struct vm *vm, unsigned i);

enum vm_status vm__status(struct vm *vm);
void vm__set_status(struct vm *vm, enum vm_status s);
#define VM_STATUS_BIT(s) (1u << (s))
/* In one step under the lock: when the status is in `from` (a mask of
 * VM_STATUS_BIT), pauses the vCPUs (one level, as vm__pause_vcpus), sets
 * the status to `to` and sets *done; else changes nothing.  Returns the
 * status before.  So a `stop` and the switchover cannot interleave between
 * reading the status and pausing.  The wait for the vCPUs to park (and
 * the devices' thread to stop) is for ever with wait_ns 0; else it ends
 * at the deadline, the pause level taken all the same: a vCPU still in
 * the kernel (a post-copy destination's vCPU waiting for a page that has
 * not come) parks when it returns from KVM_RUN. */
enum vm_status vm__pause_into(struct vm *vm, unsigned from, enum vm_status to,
			      uint64_t wait_ns, bool *done);
/* In one step: when the status is in `from`, sets it to `to` and resumes
 * one pause level; returns whether it did. */
bool vm__resume_from(struct vm *vm, unsigned from, enum vm_status to);
/* In inmigrate only: sets whether the guest runs once its incoming
 * migration ends (QEMU's `stop` and `cont` there) and returns true; in any
 * other status changes nothing and returns false. */
bool vm__set_autostart(struct vm *vm, bool on);
/* What vm__end_incoming may do with a guest that would run (its source
 * ran it, run_after_migration, and autostart is set). */
enum vm_run_permit {
	VM_RUN_ALLOWED,          /* run it */
	VM_RUN_ASK,              /* leave inmigrate as it is, return WANTS_RUN */
};
enum vm_incoming_end {
	VM_INCOMING_RAN,         /* the guest runs here */
	VM_INCOMING_STOPPED,     /* it stays stopped (status `stopped`) */
	VM_INCOMING_WANTS_RUN,   /* VM_RUN_ASK and it would run: still inmigrate */
	VM_INCOMING_LEFT,        /* no longer inmigrate: nothing changed */
};
/* Ends inmigrate in one step under the lock, so a `stop` or `cont` comes
 * before or after, never between: a guest that would run runs (one pause
 * level undone) as `permit` says; one that stays stopped gets status
 * `stopped` (paused or io-error) and keeps its pause level. */
enum vm_incoming_end vm__end_incoming(struct vm *vm, enum vm_run_permit permit,
				      enum vm_status stopped);
/* True when no vCPU has exited to kmig since the previous call and a probe
 * finds every vCPU halted with interrupts off (or never started): nothing
 * can wake the guest again.  Control loop, about once a second. */
bool vm__all_halted(struct vm *vm);
/* The vCPU threads' ids (0 for one not started) into tids[max]; the count. */
unsigned vm__vcpu_tids(struct vm *vm, int *tids, unsigned max);
/* Called from a vCPU thread: the guest powered off (exit code 0). */
void vm__shutdown(struct vm *vm, int exit_code);
/* Called from a vCPU thread on a guest failure: parks every vCPU. */
void vm__fail(struct vm *vm, enum vm_status why);

#endif
