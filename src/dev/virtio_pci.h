/* virtio-pci modern transport (virtio 1.x, section 4.1) for one device.
 *
 * PCI function: vendor 0x1af4, device 0x1040 + virtio id, revision 1,
 * subsystem 0x1af4:0x1100, INTA on the IRQ line given at creation.  One
 * 64-bit memory BAR (VIRTIO_PCI_BAR, 16 KiB), pre-assigned at the given
 * address with memory decoding on (the guest may move it), holds the four
 * regions the vendor capabilities (0x40, 0x50, 0x60, 0x70) point at:
 *   0x0000 common configuration (type 1)   0x1000 ISR status (type 3)
 *   0x2000 device configuration (type 4)   0x3000 notifications (type 2),
 *          queue q at 0x3000 + 4 * q (notify_off_multiplier 4).
 * No MSI-X (msix_config and queue_msix_vector read 0xffff) and no PCI
 * configuration access capability: drivers poll or take INTx.  A queue
 * notification is a write to the BAR, or whatever calls
 * virtio_pci__notify (an ioeventfd on the address notify_map reports).
 *
 * Feature negotiation: FEATURES_OK sticks only if the driver accepted a
 * subset of what is offered that includes VERSION_1.  Queues are used
 * only after DRIVER_OK.  A malformed ring (see virtqueue.h) or a queue
 * enabled with bad addresses sets DEVICE_NEEDS_RESET (0x40), raises a
 * configuration interrupt and stops all queue processing until the driver
 * resets the device (status 0).
 *
 * Locking: vp->lock covers the whole device, transport and device model
 * alike.  BAR accesses take it; the device callbacks run with it held,
 * and so must every virtio_pci__ call below that says "lock held".
 * A device's own API (QMP, migration thread) takes vp->lock itself. */
#ifndef KMIG_DEV_VIRTIO_PCI_H
#define KMIG_DEV_VIRTIO_PCI_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"
#include "dev/pci.h"
#include "dev/virtqueue.h"

#define VIRTIO_PCI_VENDOR 0x1af4
#define VIRTIO_PCI_DEVICE_BASE 0x1040
#define VIRTIO_PCI_SUBSYS_ID 0x1100
#define VIRTIO_PCI_BAR 4
#define VIRTIO_PCI_BAR_SIZE 0x4000
#define VIRTIO_PCI_COMMON 0x0000
#define VIRTIO_PCI_ISR 0x1000
#define VIRTIO_PCI_DEVCFG 0x2000
#define VIRTIO_PCI_NOTIFY 0x3000
#define VIRTIO_PCI_NOTIFY_MULT 4
#define VIRTIO_PCI_REGION_SIZE 0x1000
#define VIRTIO_MAX_QUEUES 8
#define VIRTIO_NO_VECTOR 0xffff

/* common configuration layout */
#define VIRTIO_PCI_DFSELECT 0x00
#define VIRTIO_PCI_DF 0x04
#define VIRTIO_PCI_GFSELECT 0x08
#define VIRTIO_PCI_GF 0x0c
#define VIRTIO_PCI_MSIX_CONFIG 0x10
#define VIRTIO_PCI_NUM_QUEUES 0x12
#define VIRTIO_PCI_STATUS 0x14
#define VIRTIO_PCI_CFG_GEN 0x15
#define VIRTIO_PCI_Q_SELECT 0x16
#define VIRTIO_PCI_Q_SIZE 0x18
#define VIRTIO_PCI_Q_MSIX 0x1a
#define VIRTIO_PCI_Q_ENABLE 0x1c
#define VIRTIO_PCI_Q_NOFF 0x1e
#define VIRTIO_PCI_Q_DESC 0x20
#define VIRTIO_PCI_Q_AVAIL 0x28
#define VIRTIO_PCI_Q_USED 0x30
#define VIRTIO_PCI_COMMON_LEN 0x38

#define VIRTIO_STATUS_ACKNOWLEDGE 0x01
#define VIRTIO_STATUS_DRIVER 0x02
#define VIRTIO_STATUS_DRIVER_OK 0x04
#define VIRTIO_STATUS_FEATURES_OK 0x08
#define VIRTIO_STATUS_NEEDS_RESET 0x40
#define VIRTIO_STATUS_FAILED 0x80
#define VIRTIO_F_VERSION_1 32

#define VIRTIO_ISR_QUEUE 0x1
#define VIRTIO_ISR_CONFIG 0x2

/* The device model behind the transport; every callback runs with the
 * device lock held. */
struct virtio_ops {
	/* off + len <= cfg_size */
	void (*cfg_read)(void *ctx, uint32_t off, uint8_t *data, unsigned len);
	void (*cfg_write)(void *ctx, uint32_t off, const uint8_t *data, unsigned len);
	/* The driver notified queue q (ready, device not failed, DRIVER_OK). */
	void (*queue_notify)(void *ctx, unsigned q);
	/* The driver reset the device (transport state is already reset). */
	void (*reset)(void *ctx);
	/* May be NULL.  The driver set DRIVER_OK (features are final), before
	 * the queues are first notified; also after a state load with
	 * DRIVER_OK set. */
	void (*driver_ok)(void *ctx);
};

struct virtio_pci_conf {
	uint16_t virtio_id;          /* device type, e.g. 5 = balloon */
	uint32_t class_code;         /* PCI class << 16 | subclass << 8 | prog-if */
	uint64_t features;           /* offered (VERSION_1 is added) */
	unsigned nqueues;
	uint16_t queue_max;          /* power of two */
	uint32_t cfg_size;           /* device configuration bytes */
	uint8_t irq_line;            /* GSI of INTA; 0 = no interrupt */
	uint64_t bar_gpa;            /* pre-assigned BAR address (16 KiB aligned) */
};

/* Raises (true) or lowers the INTx line. */
typedef void (*virtio_irq_fn)(void *ctx, bool level);
/* The notification region now decodes at gpa (queue q at gpa + 4 * q),
 * or nowhere (gpa 0).  Runs with the PCI bus lock held, or from
 * virtio_pci__set_notify_map and virtio_pci__load. */
typedef void (*virtio_notify_map_fn)(void *ctx, uint64_t gpa);

struct virtio_pci {
	pthread_mutex_t lock;
	struct pci_dev pci;
	struct virtio_pci_conf conf;
	const struct virtio_ops *ops;
	void *ctx;
	struct virtio_mem mem;
	virtio_irq_fn irq;
	void *irq_ctx;
	/* transport state (under lock) */
	uint64_t device_features, driver_features;
	uint32_t dfselect, gfselect;
	uint16_t queue_select;
	uint8_t status;
	bool broken;                 /* NEEDS_RESET set: queues stopped */
	/* under irq_lock, a leaf taken with or without lock and never held
	 * while guest memory is touched: a config change can be signalled
	 * while lock is held by a thread waiting on a missing page */
	pthread_mutex_t irq_lock;
	uint8_t cfg_gen, isr;
	bool irq_level;
	uint64_t notify_exits;       /* notifications written through the BAR (atomic) */
	uint64_t notify_events;      /* ... and through virtio_pci__notify (atomic) */
	virtio_notify_map_fn notify_map;
	void *notify_map_ctx;
	struct virtq vqs[VIRTIO_MAX_QUEUES];
};

int virtio_pci__init(struct virtio_pci *vp, const struct virtio_pci_conf *conf,
		     const struct virtio_ops *ops, void *ctx, const struct virtio_mem *mem,
		     virtio_irq_fn irq, void *irq_ctx) KMIG_MUST_CHECK;
void virtio_pci__destroy(struct virtio_pci *vp);

/* With or without the lock (it takes only irq_lock).  The device changed
 * its configuration: bump the generation, ISR bit 1, interrupt. */
void virtio_pci__config_changed(struct virtio_pci *vp);
/* Without the lock: the notification counters. */
void virtio_pci__notify_counts(struct virtio_pci *vp, uint64_t *exits, uint64_t *events);
/* Lock held.  Buffers were returned on queue q: ISR bit 0 and an
 * interrupt unless the driver suppressed it. */
void virtio_pci__queue_used(struct virtio_pci *vp, unsigned q);
/* Lock held.  The driver broke the protocol: NEEDS_RESET, queues stop. */
void virtio_pci__fail(struct virtio_pci *vp, const char *why);
/* Lock held.  Feature bit negotiated (FEATURES_OK set with it). */
bool virtio_pci__has(const struct virtio_pci *vp, unsigned bit);
/* Lock held.  DRIVER_OK set and no NEEDS_RESET. */
bool virtio_pci__running(const struct virtio_pci *vp);

/* Tells fn where the notification region decodes, now (before it
 * returns) and whenever that changes; during start-up only. */
void virtio_pci__set_notify_map(struct virtio_pci *vp, virtio_notify_map_fn fn, void *ctx);
/* Tells notify_map again where the region decodes (after a state load). */
void virtio_pci__remap_notify(struct virtio_pci *vp);
/* Takes the lock.  A notification of queue q that came another way than
 * a write to the BAR (an ioeventfd): handled as that write would be. */
void virtio_pci__notify(struct virtio_pci *vp, unsigned q);

/* Serialised transport state (features, status, ISR, generation, the
 * function's writable configuration bytes, every queue) for migration.
 * Lock held or the VM paused.  save returns bytes written or -ENOSPC;
 * load checks every value (queue sizes, ring addresses against guest
 * RAM) and returns -EINVAL with *why set. */
#define VIRTIO_PCI_STATE_MAX (64 + PCI_CFG_SIZE + VIRTIO_MAX_QUEUES * 40)
long virtio_pci__save(struct virtio_pci *vp, uint8_t *buf, size_t cap) KMIG_MUST_CHECK;
long virtio_pci__load(struct virtio_pci *vp, const uint8_t *buf, size_t len,
		      const char **why) KMIG_MUST_CHECK;

#endif
