/*
 * Modern virtio-pci transport of the test guest's ring-3 drivers
 * (balloon.c, net.c, blk.c): PCI configuration space through conf1, the device's
 * memory BARs through the MMIO traps, split virtqueues in guest RAM.
 * Everything runs on cpu 0 (the drivers are polled from its workload loop),
 * so nothing here takes a lock.
 */
#ifndef KMIG_GUEST_VIRTIO_H
#define KMIG_GUEST_VIRTIO_H

#include "guest.h"

#define VIRTIO_VENDOR 0x1af4

/* common configuration */
#define C_DFSELECT 0x00
#define C_DF 0x04
#define C_GFSELECT 0x08
#define C_GF 0x0c
#define C_NUM_QUEUES 0x12
#define C_STATUS 0x14
#define C_GEN 0x15
#define C_Q_SELECT 0x16
#define C_Q_SIZE 0x18
#define C_Q_ENABLE 0x1c
#define C_Q_NOFF 0x1e
#define C_Q_DESC 0x20
#define C_Q_AVAIL 0x28
#define C_Q_USED 0x30

#define S_ACK 0x01
#define S_DRIVER 0x02
#define S_DRIVER_OK 0x04
#define S_FEATURES_OK 0x08
#define S_NEEDS_RESET 0x40
#define S_FAILED 0x80

#define F_VERSION_1 32

#define DESC_F_NEXT 1
#define DESC_F_WRITE 2
#define USED_F_NO_NOTIFY 1

#define QMAX 1024

static inline u32 mr8(u64 a) { return (u32)trap(TRAP_MMIO_R8, a, 0); }
static inline u32 mr16(u64 a) { return (u32)trap(TRAP_MMIO_R16, a, 0); }
static inline u32 mr32(u64 a) { return (u32)trap(TRAP_MMIO_R32, a, 0); }
static inline void mw8(u64 a, u32 v) { trap(TRAP_MMIO_W8, a, v & 0xff); }
static inline void mw16(u64 a, u32 v) { trap(TRAP_MMIO_W16, a, v & 0xffff); }
static inline void mw32(u64 a, u32 v) { trap(TRAP_MMIO_W32, a, v); }

struct vbar {
	u64 addr, size;
	int is64, valid, assigned;
};

/* One bound device.  name prefixes its console lines ("balloon", "net"),
 * what names it in the "no device" error ("virtio-balloon"). */
struct vdev {
	const char *name, *what;
	u32 devfn, pci_id;		/* pci_id: device_id, or a transitional id */
	u64 common, devcfg, notify_base, isr;
	u32 notify_mult, devcfg_len;
	u64 offered;			/* the device's 64 feature bits */
	struct vbar bars[6];
	int rebar;			/* test: ignore the firmware's BAR assignment */
	int nokick;			/* test: never notify the device */
};

/* A split virtqueue.  Descriptors are handed out from a free list; a
 * buffer is a chain of one or more of them, named by its head.  The
 * driver's own shadow of each chain (next_desc, ndesc, tok_*) is what it
 * trusts: nothing the device writes is used as an index before it is
 * checked against it. */
struct vq {
	struct vdev *dev;
	int idx;			/* queue index, -1: not in use */
	u32 size;
	volatile u64 *desc;		/* 16-byte descriptors: addr, len | flags << 32 | next << 48 */
	volatile u16 *avail;		/* flags, idx, ring[size] */
	volatile u32 *used;		/* flags | idx << 16, then (id, len) pairs */
	u64 notify;			/* notify address */
	u16 avail_idx, last_used;
	u32 nfree, free_head;
	u16 next_free[QMAX];
	u8 ndesc[QMAX];			/* descriptors in the chain headed here; 0: not posted */
	u64 tok_addr[QMAX], tok_len[QMAX];	/* the chain's first segment */
	u64 last_progress;		/* TSC of the last used buffer or first post */
	int lenient;			/* a used index running ahead is counted, not an error */
	u64 bad;			/* malformed used entries seen (ids, overruns) */
};

struct vseg {
	u64 addr;
	u32 len;
	int device_writes;
};

#define VQ_OVERRUN (-1)			/* more used than posted (strict queues) */
#define VQ_BADID (-2)			/* an id not posted: the entry is skipped */

u32 pci_rd(u32 devfn, u32 reg);
void pci_wr(u32 devfn, u32 reg, u32 v);

/* Finds the first device_id (or its transitional twin) on bus 0, its capabilities and BARs (assigning
 * unassigned BARs), resets it and sets ACKNOWLEDGE | DRIVER; VERSION_1
 * must be offered.  0, or -1 after a "<name> error ...; driver disabled"
 * line. */
int vdev_bind(struct vdev *d, u32 device_id);
/* Writes the features and FEATURES_OK; 0 if the device keeps FEATURES_OK. */
int vdev_set_features(struct vdev *d, u64 features);
void vdev_set_status(struct vdev *d, u32 bits);	/* ORs bits into the status */
void vdev_set_failed(struct vdev *d);

/* Sets up queue idx with min(device maximum, want) entries (a power of
 * two), rings from the boot-time bump allocator; 0 or -1 (line printed). */
int vq_setup(struct vdev *d, struct vq *q, int idx, u32 want);
int vq_add(struct vq *q, u64 addr, u64 len, int device_writes);
int vq_add_chain(struct vq *q, const struct vseg *seg, int n);
void vq_kick(struct vq *q, int force);
/* One used buffer: 1 (its first segment in *addr, *len; the length the
 * device wrote in *wlen, unchecked), 0 none, VQ_OVERRUN or VQ_BADID. */
int vq_get(struct vq *q, u64 *addr, u64 *len, u32 *wlen);
const char *vq_strerror(int r);
static inline int vq_outstanding(const struct vq *q)
{
	return q->idx >= 0 && q->nfree < q->size;
}

#endif
