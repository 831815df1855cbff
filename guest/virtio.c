/*
 * Modern virtio-pci transport for the test guest's ring-3 drivers (see
 * virtio.h): the device on PCI bus 0, its vendor capabilities and memory
 * BARs, feature negotiation and split virtqueues.
 */
#include "virtio.h"

#define PCI_CMD_MEM 0x2
#define PCI_CMD_MASTER 0x4
#define PCI_STATUS_CAPS 0x10
#define PCI_CAP_VENDOR 0x09

#define VCAP_COMMON 1
#define VCAP_NOTIFY 2
#define VCAP_ISR 3
#define VCAP_DEVICE 4

#define MS(x) ((u64)(x) * tsc_khz)

static inline void mw64_split(u64 a, u64 v)	/* spec: 64-bit fields as two 32-bit halves */
{
	mw32(a, (u32)v);
	mw32(a + 4, (u32)(v >> 32));
}

/* ---------------- PCI configuration space (conf1) ---------------- */

u32 pci_rd(u32 devfn, u32 reg)
{
	trap(TRAP_OUT32, 0xcf8, 0x80000000u | (devfn << 8) | (reg & 0xfc));
	return (u32)trap(TRAP_IN32, 0xcfc, 0);
}

void pci_wr(u32 devfn, u32 reg, u32 v)
{
	trap(TRAP_OUT32, 0xcf8, 0x80000000u | (devfn << 8) | (reg & 0xfc));
	trap(TRAP_OUT32, 0xcfc, v);
}

static u32 pci_rd8(u32 devfn, u32 reg)
{
	return (pci_rd(devfn, reg) >> (8 * (reg & 3))) & 0xff;
}

/* ---------------- split virtqueues ---------------- */

static u32 pow2_floor(u32 n)
{
	u32 p = 1;
	while (p * 2 <= n)
		p *= 2;
	return p;
}

int vq_setup(struct vdev *d, struct vq *q, int idx, u32 want)
{
	u64 common = d->common;
	q->idx = -1;
	q->dev = d;
	mw16(common + C_Q_SELECT, (u32)idx);
	u32 max = mr16(common + C_Q_SIZE);
	if (!max) {
		kprintf("%s error queue %d not available; driver disabled\n", d->name, idx);
		return -1;
	}
	if (want > QMAX)
		want = QMAX;
	u32 n = pow2_floor(max < want ? max : want);
	u64 desc_b = 16ULL * n, avail_b = 6 + 2ULL * n, used_b = 6 + 8ULL * n;
	u64 used_off = (desc_b + avail_b + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1);
	u64 pages = (used_off + used_b + PAGE_SIZE - 1) / PAGE_SIZE;
	u8 *mem = take_contig(pages);
	if (!mem) {
		kprintf("%s error no memory for queue %d; driver disabled\n", d->name, idx);
		return -1;
	}
	memset(mem, 0, pages * PAGE_SIZE);
	q->size = n;
	((volatile u16 *)(mem + desc_b))[0] = 1;	/* VRING_AVAIL_F_NO_INTERRUPT: we poll */
	q->desc = (volatile u64 *)mem;
	q->avail = (volatile u16 *)(mem + desc_b);
	q->used = (volatile u32 *)(mem + used_off);
	q->avail_idx = q->last_used = 0;
	q->nfree = n;
	q->free_head = 0;
	for (u32 i = 0; i < n; i++) {
		q->next_free[i] = (u16)(i + 1);
		q->ndesc[i] = 0;
	}
	mw16(common + C_Q_SIZE, n);
	mw64_split(common + C_Q_DESC, (u64)q->desc);
	mw64_split(common + C_Q_AVAIL, (u64)q->avail);
	mw64_split(common + C_Q_USED, (u64)q->used);
	q->notify = d->notify_base + (u64)mr16(common + C_Q_NOFF) * d->notify_mult;
	mw16(common + C_Q_ENABLE, 1);
	q->idx = idx;
	return 0;
}

int vq_add_chain(struct vq *q, const struct vseg *seg, int n)
{
	if (n < 1 || (u32)n > q->nfree)
		return -1;
	u32 head = q->free_head, d = head;
	for (int i = 0; i < n; i++) {
		u32 next = q->next_free[d];
		u64 flags = (seg[i].device_writes ? DESC_F_WRITE : 0) | (i + 1 < n ? DESC_F_NEXT : 0);
		q->desc[2 * d] = seg[i].addr;
		q->desc[2 * d + 1] = seg[i].len | (flags << 32) | ((u64)(i + 1 < n ? next : 0) << 48);
		if (i + 1 < n)
			d = next;
	}
	q->free_head = q->next_free[d];	/* the chain keeps its free-list links */
	q->nfree -= (u32)n;
	q->ndesc[head] = (u8)n;
	q->tok_addr[head] = seg[0].addr;
	q->tok_len[head] = seg[0].len;
	q->avail[2 + q->avail_idx % q->size] = (u16)head;
	__atomic_thread_fence(__ATOMIC_RELEASE);
	q->avail_idx++;
	q->avail[1] = q->avail_idx;
	if (q->nfree + (u32)n == q->size)
		q->last_progress = rdtsc();
	return 0;
}

int vq_add(struct vq *q, u64 addr, u64 len, int device_writes)
{
	struct vseg s = { addr, (u32)len, device_writes };
	return vq_add_chain(q, &s, 1);
}

void vq_kick(struct vq *q, int force)
{
	if (q->dev->nokick)
		return;		/* test: the device never hears of any buffer */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (force || !(q->used[0] & USED_F_NO_NOTIFY))
		mw16(q->notify, (u32)q->idx);
}

int vq_get(struct vq *q, u64 *addr, u64 *len, u32 *wlen)
{
	u16 uidx = (u16)(q->used[0] >> 16);
	if (uidx == q->last_used)
		return 0;
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	if ((u16)(uidx - q->last_used) > q->size - q->nfree) {
		q->bad++;
		if (!q->lenient)
			return VQ_OVERRUN;
		/* each entry is still checked against what is posted below */
	}
	u32 slot = q->last_used % q->size;
	u32 id = q->used[1 + 2 * slot];		/* after flags, idx: (id, len) */
	u32 wl = q->used[2 + 2 * slot];
	if (id >= q->size || !q->ndesc[id]) {
		q->bad++;
		if (q->lenient)
			q->last_used++;		/* skip it: nothing of ours is named */
		return VQ_BADID;
	}
	q->last_used++;
	/* the chain's descriptors go back to the free list through our own
	 * links (next_free kept its order when the chain was taken) */
	u32 tail = id;
	for (u32 i = 1; i < q->ndesc[id]; i++)
		tail = q->next_free[tail];
	q->next_free[tail] = (u16)q->free_head;
	q->free_head = id;
	q->nfree += q->ndesc[id];
	q->ndesc[id] = 0;
	q->last_progress = rdtsc();
	*addr = q->tok_addr[id];
	*len = q->tok_len[id];
	if (wlen)
		*wlen = wl;
	return 1;
}

const char *vq_strerror(int r)
{
	return r == VQ_OVERRUN ? "device used more buffers than were posted" :
	       "device returned a descriptor that was not posted";
}

/* ---------------- PCI: find the device, its BARs and capabilities ---------------- */

/* Sizes BAR i of devfn fn (memory decoding must be off); 0 for I/O or none. */
static u64 bar_size(u32 fn, int i, int *is64)
{
	u32 reg = 0x10 + 4 * i, lo = pci_rd(fn, reg), hi = 0;
	*is64 = 0;
	if (lo & 1)
		return 0;
	if (((lo >> 1) & 3) == 2 && i < 5) {
		*is64 = 1;
		hi = pci_rd(fn, reg + 4);
	}
	pci_wr(fn, reg, 0xffffffffu);
	u64 m = pci_rd(fn, reg) & ~0xfu;
	pci_wr(fn, reg, lo);
	if (*is64) {
		pci_wr(fn, reg + 4, 0xffffffffu);
		m |= (u64)pci_rd(fn, reg + 4) << 32;
		pci_wr(fn, reg + 4, hi);
	} else {
		m |= 0xffffffff00000000ULL;
	}
	return m ? ~m + 1 : 0;
}

#define WIN_LO 0xe0000000ULL
#define WIN_HI 0xfec00000ULL		/* the IOAPIC */

/* Is [a, a + sz) free of every assigned memory BAR on bus 0 (ours excluded)? */
static int window_free(u32 self, u64 a, u64 sz)
{
	for (u32 dev = 0; dev < 32; dev++) {
		u32 fn = dev << 3;
		if (fn == self || (pci_rd(fn, 0) & 0xffff) == 0xffff)
			continue;
		u32 cmd = pci_rd(fn, 4) & 0xffff;
		for (int i = 0; i < 6; i++) {
			u32 lo = pci_rd(fn, 0x10 + 4 * i);
			int is64 = ((lo >> 1) & 3) == 2;
			u64 base = lo & ~0xfULL;
			if (!(lo & 1) && is64 && i < 5)
				base |= (u64)pci_rd(fn, 0x14 + 4 * i) << 32;
			if (!(lo & 1) && base) {
				pci_wr(fn, 4, cmd & ~PCI_CMD_MEM);
				int x;
				u64 s = bar_size(fn, i, &x);
				pci_wr(fn, 4, cmd);
				if (s && base < a + sz && a < base + s)
					return 0;
			}
			if (is64 && !(lo & 1))
				i++;
		}
	}
	return 1;
}

/* Gives BAR i an address in [WIN_LO, WIN_HI), as firmware would. */
static int assign_bar(struct vdev *d, int i, u64 used_lo, u64 used_hi)
{
	struct vbar *b = &d->bars[i];
	u64 sz = b->size;
	for (u64 a = (WIN_LO + sz - 1) & ~(sz - 1); a + sz <= WIN_HI; a += sz) {
		if (a < used_hi && used_lo < a + sz)
			continue;		/* another BAR of ours */
		if (!window_free(d->devfn, a, sz))
			continue;
		pci_wr(d->devfn, 0x10 + 4 * i, (u32)a);
		if (b->is64)
			pci_wr(d->devfn, 0x14 + 4 * i, 0);
		b->addr = a;
		b->assigned = 1;
		return 0;
	}
	return -1;
}

/* The first device_id (0x1040 + virtio device type) on bus 0, or a
 * transitional device of that type (0x1000..0x103f with the type as its
 * subsystem device id: QEMU's default; only its modern interface is used). */
static int find_device(struct vdev *d, u32 device_id)
{
	for (u32 dev = 0; dev < 32; dev++) {
		u32 id = pci_rd(dev << 3, 0);
		if ((id & 0xffff) != VIRTIO_VENDOR)
			continue;
		u32 did = id >> 16;
		if (did == device_id || (did >= 0x1000 && did <= 0x103f &&
					 (pci_rd(dev << 3, 0x2c) >> 16) == device_id - 0x1040)) {
			d->devfn = dev << 3;
			d->pci_id = did;
			return 0;
		}
	}
	return -1;
}

static void note_used(const struct vbar *b, u64 *lo, u64 *hi)
{
	if (b->addr < *lo)
		*lo = b->addr;
	if (b->addr + b->size > *hi)
		*hi = b->addr + b->size;
}

/* Reads the BARs the capabilities use, assigning unassigned ones. */
static int setup_bars(struct vdev *d, u32 need)
{
	u32 fn = d->devfn, cmd = pci_rd(fn, 4) & 0xffff;
	pci_wr(fn, 4, cmd & ~(PCI_CMD_MEM | PCI_CMD_MASTER));
	u64 used_lo = ~0ULL, used_hi = 0;
	for (int i = 0; i < 6; i++) {
		struct vbar *b = &d->bars[i];
		if (!(need & (1u << i)))
			continue;
		u32 lo = pci_rd(fn, 0x10 + 4 * i);
		if (lo & 1) {
			pci_wr(fn, 4, cmd);
			return -1;		/* an I/O BAR: not for the modern interface */
		}
		b->size = bar_size(fn, i, &b->is64);
		b->addr = lo & ~0xfULL;
		if (b->is64)
			b->addr |= (u64)pci_rd(fn, 0x14 + 4 * i) << 32;
		if (!b->size || (b->size & (b->size - 1))) {
			pci_wr(fn, 4, cmd);
			return -1;
		}
		/* outside the identity map, or overlapping RAM: move it */
		int bad = !b->addr || b->addr + b->size > (64ULL << 30) || d->rebar;
		for (int r = 0; r < nram && !bad; r++)
			if (b->addr < ram[r].end && ram[r].base < b->addr + b->size)
				bad = 1;
		if (bad)
			b->addr = 0;
		b->valid = 1;
		if (b->addr)
			note_used(b, &used_lo, &used_hi);
	}
	for (int i = 0; i < 6; i++) {
		if (!(need & (1u << i)) || d->bars[i].addr)
			continue;
		if (assign_bar(d, i, used_lo, used_hi)) {
			pci_wr(fn, 4, cmd);
			return -1;
		}
		note_used(&d->bars[i], &used_lo, &used_hi);
	}
	pci_wr(fn, 4, cmd | PCI_CMD_MEM | PCI_CMD_MASTER);
	for (int i = 0; i < 6; i++)
		if (need & (1u << i))
			kprintf("%s bar=%d addr=0x%lx size=0x%lx assigned_by=%s\n", d->name, i,
				d->bars[i].addr, d->bars[i].size,
				d->bars[i].assigned ? "driver" : "firmware");
	return 0;
}

struct vcap {
	int found, bar;
	u32 off, len, mult;
};

static int find_caps(u32 fn, struct vcap caps[5])
{
	if (!((pci_rd(fn, 4) >> 16) & PCI_STATUS_CAPS))
		return -1;
	u32 p = pci_rd8(fn, 0x34) & 0xfc;
	for (int n = 0; p >= 0x40 && n < 48; n++) {
		u32 w0 = pci_rd(fn, p);
		if ((w0 & 0xff) == PCI_CAP_VENDOR) {
			u32 type = (w0 >> 24) & 0xff, bar = pci_rd8(fn, p + 4);
			if (type >= 1 && type <= 4 && bar < 6 && !caps[type].found) {
				caps[type].found = 1;
				caps[type].bar = (int)bar;
				caps[type].off = pci_rd(fn, p + 8);
				caps[type].len = pci_rd(fn, p + 12);
				if (type == VCAP_NOTIFY)
					caps[type].mult = pci_rd(fn, p + 16);
			}
		}
		p = (w0 >> 8) & 0xfc;
	}
	for (int t = 1; t <= 4; t++)
		if (!caps[t].found)
			return -1;
	return 0;
}

/* ---------------- status and features ---------------- */

static int wait_status_zero(u64 common)
{
	u64 end = rdtsc() + MS(1000);
	while (mr8(common + C_STATUS)) {
		if (rdtsc() > end)
			return -1;
		delay_us(100);
	}
	return 0;
}

void vdev_set_status(struct vdev *d, u32 bits)
{
	mw8(d->common + C_STATUS, mr8(d->common + C_STATUS) | bits);
}

void vdev_set_failed(struct vdev *d)
{
	if (d->common)
		vdev_set_status(d, S_FAILED);
}

int vdev_bind(struct vdev *d, u32 device_id)
{
	struct vcap caps[5];

	memset(caps, 0, sizeof(caps));
	if (find_device(d, device_id)) {
		kprintf("%s error no %s device (1af4:%04x) on PCI bus 0; driver disabled\n", d->name,
			d->what, device_id);
		return -1;
	}
	if (find_caps(d->devfn, caps)) {
		kprintf("%s error no modern virtio-pci capabilities; driver disabled\n", d->name);
		return -1;
	}
	u32 need = 0;
	for (int t = 1; t <= 4; t++)
		need |= 1u << caps[t].bar;
	if (setup_bars(d, need)) {
		kprintf("%s error cannot map the device's memory BAR; driver disabled\n", d->name);
		return -1;
	}
	for (int t = 1; t <= 4; t++) {
		if ((u64)caps[t].off + caps[t].len > d->bars[caps[t].bar].size) {
			kprintf("%s error capability %d outside its BAR; driver disabled\n", d->name, t);
			return -1;
		}
	}
	d->common = d->bars[caps[VCAP_COMMON].bar].addr + caps[VCAP_COMMON].off;
	d->notify_base = d->bars[caps[VCAP_NOTIFY].bar].addr + caps[VCAP_NOTIFY].off;
	d->notify_mult = caps[VCAP_NOTIFY].mult;
	d->isr = d->bars[caps[VCAP_ISR].bar].addr + caps[VCAP_ISR].off;
	d->devcfg = d->bars[caps[VCAP_DEVICE].bar].addr + caps[VCAP_DEVICE].off;
	d->devcfg_len = caps[VCAP_DEVICE].len;

	mw8(d->common + C_STATUS, 0);
	if (wait_status_zero(d->common)) {
		d->common = 0;
		kprintf("%s error device does not reset; driver disabled\n", d->name);
		return -1;
	}
	mw8(d->common + C_STATUS, S_ACK);
	mw8(d->common + C_STATUS, S_ACK | S_DRIVER);
	mw32(d->common + C_DFSELECT, 0);
	d->offered = mr32(d->common + C_DF);
	mw32(d->common + C_DFSELECT, 1);
	d->offered |= (u64)mr32(d->common + C_DF) << 32;
	if (!(d->offered & (1ULL << F_VERSION_1))) {
		kprintf("%s error device does not offer VIRTIO_F_VERSION_1; driver disabled\n", d->name);
		vdev_set_failed(d);
		return -1;
	}
	return 0;
}

int vdev_set_features(struct vdev *d, u64 features)
{
	mw32(d->common + C_GFSELECT, 0);
	mw32(d->common + C_GF, (u32)features);
	mw32(d->common + C_GFSELECT, 1);
	mw32(d->common + C_GF, (u32)(features >> 32));
	mw8(d->common + C_STATUS, S_ACK | S_DRIVER | S_FEATURES_OK);
	return (mr8(d->common + C_STATUS) & S_FEATURES_OK) ? 0 : -1;
}
