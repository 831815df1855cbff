/*
 * virtio-balloon driver of the test guest (cmdline balloon=1), all in ring
 * 3: PCI configuration space through conf1 (ports 0xcf8/0xcfc) and the
 * device's memory BAR through traps (docs/guest.md, "Trap ABI").  No
 * interrupts: cpu 0 calls balloon_poll() from its workload loop, which
 * polls the used rings and the device configuration.
 *
 * Modern virtio-pci only (virtio 1.x, split rings).  Queues, in the order
 * the spec gives them (each present only when its feature is negotiated):
 * inflateq, deflateq, statsq (F_STATS_VQ, 1), free_page_vq
 * (F_FREE_PAGE_HINT, 3), reporting_vq (F_PAGE_REPORTING, 5).  Every one of
 * these features the device offers is accepted, so the indices are the
 * same whether a device numbers its queues by offered features (QEMU
 * always creates statsq, and free_page_vq/reporting_vq when offered) or by
 * negotiated ones; the stats queue is never enabled and no stats buffer is
 * ever posted.  balloon_hint=0 / balloon_report=0 only keep the driver
 * from using the corresponding queue.
 *
 * Memory: the rings, the inflated-PFN list and the hint block list come
 * from the boot-time bump allocator; inflated, hinted and reported pages
 * come from (and go back to) the page allocator (palloc.c).
 */
#include "guest.h"

/* ---------------- constants ---------------- */

#define VIRTIO_VENDOR 0x1af4
#define VIRTIO_BALLOON_DEVICE 0x1045

#define PCI_CMD_MEM 0x2
#define PCI_CMD_MASTER 0x4
#define PCI_STATUS_CAPS 0x10
#define PCI_CAP_VENDOR 0x09

#define VCAP_COMMON 1
#define VCAP_NOTIFY 2
#define VCAP_ISR 3
#define VCAP_DEVICE 4

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

#define F_MUST_TELL_HOST 0
#define F_STATS_VQ 1
#define F_FREE_PAGE_HINT 3
#define F_PAGE_REPORTING 5
#define F_VERSION_1 32

/* device configuration */
#define D_NUM_PAGES 0
#define D_ACTUAL 4
#define D_CMD_ID 8
#define CMD_ID_STOP 0
#define CMD_ID_DONE 1

#define DESC_F_WRITE 2
#define USED_F_NO_NOTIFY 1

#define PFNS_PER_BUF 256		/* PFNs per inflate/deflate buffer */
#define HINT_BLOCK (4ULL << 20)		/* largest free page hint */
#define REPORT_CHUNK (2ULL << 20)
#define REPORT_BATCH 32
#define QMAX 1024

#define MS(x) ((u64)(x) * tsc_khz)
#define OP_TIMEOUT_MS 3000		/* a queue buffer must be used within this */
#define CFG_POLL_MS 2			/* config generation read at most this often */
#define CFG_REFRESH_MS 100		/* full config read even without a new generation */
#define REPORT_PERIOD_MS 2000		/* idle time between two reporting passes */
#define POLL_BUDGET_MS 20		/* work done in one balloon_poll() call */
#define KICK_AGAIN_MS 20		/* re-notify a queue whose buffers sit unused */
#define HINT_KICK_AGAIN_MS 100

/* ---------------- MMIO and PCI configuration space ---------------- */

static inline u32 mr8(u64 a) { return (u32)trap(TRAP_MMIO_R8, a, 0); }
static inline u32 mr16(u64 a) { return (u32)trap(TRAP_MMIO_R16, a, 0); }
static inline u32 mr32(u64 a) { return (u32)trap(TRAP_MMIO_R32, a, 0); }
static inline void mw8(u64 a, u32 v) { trap(TRAP_MMIO_W8, a, v & 0xff); }
static inline void mw16(u64 a, u32 v) { trap(TRAP_MMIO_W16, a, v & 0xffff); }
static inline void mw32(u64 a, u32 v) { trap(TRAP_MMIO_W32, a, v); }
static inline void mw64_split(u64 a, u64 v)	/* spec: 64-bit fields as two 32-bit halves */
{
	mw32(a, (u32)v);
	mw32(a + 4, (u32)(v >> 32));
}

static u32 pci_rd(u32 devfn, u32 reg)
{
	trap(TRAP_OUT32, 0xcf8, 0x80000000u | (devfn << 8) | (reg & 0xfc));
	return (u32)trap(TRAP_IN32, 0xcfc, 0);
}

static void pci_wr(u32 devfn, u32 reg, u32 v)
{
	trap(TRAP_OUT32, 0xcf8, 0x80000000u | (devfn << 8) | (reg & 0xfc));
	trap(TRAP_OUT32, 0xcfc, v);
}

static u32 pci_rd8(u32 devfn, u32 reg)
{
	return (pci_rd(devfn, reg) >> (8 * (reg & 3))) & 0xff;
}

/* ---------------- driver state ---------------- */

int balloon_on;

struct vq {
	int idx;			/* queue index, -1: not in use */
	u32 size;
	volatile u64 *desc;		/* 16-byte descriptors: addr, len | flags << 32 | next << 48 */
	volatile u16 *avail;		/* flags, idx, ring[size] */
	volatile u32 *used;		/* flags | idx << 16, then (id, len) pairs */
	u64 notify;			/* notify address */
	u16 avail_idx, last_used;
	u32 nfree, free_head;
	u16 next_free[QMAX];
	u8 busy[QMAX];
	u64 tok_addr[QMAX], tok_len[QMAX];
	u64 last_progress;		/* TSC of the last used buffer or first post */
};

static struct vq vq_inflate, vq_deflate, vq_hint, vq_report;

static u32 devfn;
static u64 common, devcfg, notify_base, isr;
static u32 notify_mult;
static u64 features;			/* negotiated */

/* balloon */
static u32 *bpfn;			/* PFNs in the balloon */
static u64 bcap, nballoon;
static u32 target, shown_actual, shown_target;
static u32 pfnbuf[PFNS_PER_BUF] __attribute__((aligned(64)));
static int op_kind;			/* 0 none, 1 inflate, 2 deflate in flight */
static u32 op_count;
static u64 op_deadline, blocked_until;

/* free page hinting */
static int hinting;			/* the driver uses free_page_vq */
static u32 cmd_id = CMD_ID_STOP, hint_id;	/* last read; the one being served */
static int hint_running;
static struct range *held;		/* blocks out of the allocator for hints */
static u64 nheld, held_cap, round_blocks, round_bytes;
static u32 cmdbuf[8] __attribute__((aligned(64)));
static int cmdbuf_next;

/* free page reporting */
static int reporting;
static u64 report_pending, report_deadline, next_report_pass, pass_bytes, total_reported;

/* configuration polling */
static u32 last_gen = ~0u;
static u64 next_cfg_poll, next_cfg_refresh;

/* ---------------- errors ---------------- */

static void fail(const char *what)
{
	kprintf("balloon error %s; driver disabled\n", what);
	balloon_on = 0;
	if (common)
		mw8(common + C_STATUS, mr8(common + C_STATUS) | S_FAILED);
	/* Everything handed to the device stays out of the allocator: a broken
	 * device might still write into it. */
}

/* ---------------- split virtqueues ---------------- */

static u32 pow2_floor(u32 n)
{
	u32 p = 1;
	while (p * 2 <= n)
		p *= 2;
	return p;
}

static int vq_setup(struct vq *q, int idx, u32 want)
{
	q->idx = -1;
	mw16(common + C_Q_SELECT, (u32)idx);
	u32 max = mr16(common + C_Q_SIZE);
	if (!max) {
		kprintf("balloon error queue %d not available; driver disabled\n", idx);
		return -1;
	}
	u32 n = pow2_floor(max < want ? max : want);
	u64 desc_b = 16ULL * n, avail_b = 6 + 2ULL * n, used_b = 6 + 8ULL * n;
	u64 used_off = (desc_b + avail_b + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1);
	u64 pages = (used_off + used_b + PAGE_SIZE - 1) / PAGE_SIZE;
	u8 *mem = take_contig(pages);
	if (!mem) {
		kprintf("balloon error no memory for queue %d; driver disabled\n", idx);
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
		q->busy[i] = 0;
	}
	mw16(common + C_Q_SIZE, n);
	mw64_split(common + C_Q_DESC, (u64)q->desc);
	mw64_split(common + C_Q_AVAIL, (u64)q->avail);
	mw64_split(common + C_Q_USED, (u64)q->used);
	q->notify = notify_base + (u64)mr16(common + C_Q_NOFF) * notify_mult;
	mw16(common + C_Q_ENABLE, 1);
	q->idx = idx;
	return 0;
}

static int vq_add(struct vq *q, u64 addr, u64 len, int device_writes)
{
	if (!q->nfree)
		return -1;
	u32 d = q->free_head;
	q->free_head = q->next_free[d];
	q->nfree--;
	q->busy[d] = 1;
	q->tok_addr[d] = addr;
	q->tok_len[d] = len;
	q->desc[2 * d] = addr;
	q->desc[2 * d + 1] = (u32)len | ((u64)(device_writes ? DESC_F_WRITE : 0) << 32);
	q->avail[2 + q->avail_idx % q->size] = (u16)d;
	__atomic_thread_fence(__ATOMIC_RELEASE);
	q->avail_idx++;
	q->avail[1] = q->avail_idx;
	if (q->nfree + 1 == q->size)
		q->last_progress = rdtsc();
	return 0;
}

static void vq_kick(struct vq *q, int force)
{
	if (cfg.balloon_test == BT_NOKICK)
		return;		/* test: the device never hears of any buffer */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (force || !(q->used[0] & USED_F_NO_NOTIFY))
		mw16(q->notify, (u32)q->idx);
}

/* One used buffer: 1 (its address/length in *addr, *len), 0 none, -1 the
 * device broke the ring (driver disabled). */
static int vq_get(struct vq *q, u64 *addr, u64 *len)
{
	u16 uidx = (u16)(q->used[0] >> 16);
	if (uidx == q->last_used)
		return 0;
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	if ((u16)(uidx - q->last_used) > q->size - q->nfree) {
		fail("device used more buffers than were posted");
		return -1;
	}
	u32 id = q->used[1 + 2 * (q->last_used % q->size)];	/* after flags, idx: (id, len) */
	if (id >= q->size || !q->busy[id]) {
		fail("device returned a descriptor that was not posted");
		return -1;
	}
	q->last_used++;
	q->busy[id] = 0;
	q->next_free[id] = (u16)q->free_head;
	q->free_head = id;
	q->nfree++;
	q->last_progress = rdtsc();
	*addr = q->tok_addr[id];
	*len = q->tok_len[id];
	return 1;
}

static int vq_outstanding(const struct vq *q)
{
	return q->idx >= 0 && q->nfree < q->size;
}

/* ---------------- PCI: find the device, its BARs and capabilities ---------------- */

struct bar {
	u64 addr, size;
	int is64, valid, assigned;
};
static struct bar bars[6];

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
static int window_free(u64 a, u64 sz)
{
	for (u32 dev = 0; dev < 32; dev++) {
		u32 fn = dev << 3;
		if (fn == devfn || (pci_rd(fn, 0) & 0xffff) == 0xffff)
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
static int assign_bar(int i, u64 used_lo, u64 used_hi)
{
	u64 sz = bars[i].size;
	for (u64 a = (WIN_LO + sz - 1) & ~(sz - 1); a + sz <= WIN_HI; a += sz) {
		if (a < used_hi && used_lo < a + sz)
			continue;		/* another BAR of ours */
		if (!window_free(a, sz))
			continue;
		pci_wr(devfn, 0x10 + 4 * i, (u32)a);
		if (bars[i].is64)
			pci_wr(devfn, 0x14 + 4 * i, 0);
		bars[i].addr = a;
		bars[i].assigned = 1;
		return 0;
	}
	return -1;
}

static int find_device(void)
{
	for (u32 dev = 0; dev < 32; dev++) {
		u32 id = pci_rd(dev << 3, 0);
		if ((id & 0xffff) == VIRTIO_VENDOR && (id >> 16) == VIRTIO_BALLOON_DEVICE) {
			devfn = dev << 3;
			return 0;
		}
	}
	return -1;
}

/* Reads the BARs the capabilities use, assigning unassigned ones. */
static int setup_bars(u32 need)
{
	u32 cmd = pci_rd(devfn, 4) & 0xffff;
	pci_wr(devfn, 4, cmd & ~(PCI_CMD_MEM | PCI_CMD_MASTER));
	u64 used_lo = ~0ULL, used_hi = 0;
	for (int i = 0; i < 6; i++) {
		if (!(need & (1u << i)))
			continue;
		u32 lo = pci_rd(devfn, 0x10 + 4 * i);
		if (lo & 1) {
			pci_wr(devfn, 4, cmd);
			return -1;		/* an I/O BAR: not for the modern interface */
		}
		bars[i].size = bar_size(devfn, i, &bars[i].is64);
		bars[i].addr = lo & ~0xfULL;
		if (bars[i].is64)
			bars[i].addr |= (u64)pci_rd(devfn, 0x14 + 4 * i) << 32;
		if (!bars[i].size || (bars[i].size & (bars[i].size - 1))) {
			pci_wr(devfn, 4, cmd);
			return -1;
		}
		/* outside the identity map, or overlapping RAM: move it */
		int bad = !bars[i].addr || bars[i].addr + bars[i].size > (64ULL << 30) ||
			  cfg.balloon_test == BT_REBAR;
		for (int r = 0; r < nram && !bad; r++)
			if (bars[i].addr < ram[r].end && ram[r].base < bars[i].addr + bars[i].size)
				bad = 1;
		if (bad)
			bars[i].addr = 0;
		bars[i].valid = 1;
		if (bars[i].addr) {
			if (bars[i].addr < used_lo)
				used_lo = bars[i].addr;
			if (bars[i].addr + bars[i].size > used_hi)
				used_hi = bars[i].addr + bars[i].size;
		}
	}
	for (int i = 0; i < 6; i++) {
		if (!(need & (1u << i)) || bars[i].addr)
			continue;
		if (assign_bar(i, used_lo, used_hi)) {
			pci_wr(devfn, 4, cmd);
			return -1;
		}
		if (bars[i].addr < used_lo)
			used_lo = bars[i].addr;
		if (bars[i].addr + bars[i].size > used_hi)
			used_hi = bars[i].addr + bars[i].size;
	}
	pci_wr(devfn, 4, cmd | PCI_CMD_MEM | PCI_CMD_MASTER);
	for (int i = 0; i < 6; i++)
		if (need & (1u << i))
			kprintf("balloon bar=%d addr=0x%lx size=0x%lx assigned_by=%s\n", i, bars[i].addr,
				bars[i].size, bars[i].assigned ? "driver" : "firmware");
	return 0;
}

struct vcap {
	int found, bar;
	u32 off, len, mult;
};

static int find_caps(struct vcap caps[5])
{
	if (!((pci_rd(devfn, 4) >> 16) & PCI_STATUS_CAPS))
		return -1;
	u32 p = pci_rd8(devfn, 0x34) & 0xfc;
	for (int n = 0; p >= 0x40 && n < 48; n++) {
		u32 w0 = pci_rd(devfn, p);
		if ((w0 & 0xff) == PCI_CAP_VENDOR) {
			u32 type = (w0 >> 24) & 0xff, bar = pci_rd8(devfn, p + 4);
			if (type >= 1 && type <= 4 && bar < 6 && !caps[type].found) {
				caps[type].found = 1;
				caps[type].bar = (int)bar;
				caps[type].off = pci_rd(devfn, p + 8);
				caps[type].len = pci_rd(devfn, p + 12);
				if (type == VCAP_NOTIFY)
					caps[type].mult = pci_rd(devfn, p + 16);
			}
		}
		p = (w0 >> 8) & 0xfc;
	}
	for (int t = 1; t <= 4; t++)
		if (!caps[t].found)
			return -1;
	return 0;
}

/* ---------------- init ---------------- */

static int wait_status_zero(void)
{
	u64 end = rdtsc() + MS(1000);
	while (mr8(common + C_STATUS)) {
		if (rdtsc() > end)
			return -1;
		delay_us(100);
	}
	return 0;
}

static void bind(void)
{
	struct vcap caps[5];

	memset(caps, 0, sizeof(caps));
	vq_inflate.idx = vq_deflate.idx = vq_hint.idx = vq_report.idx = -1;
	if (find_device()) {
		kprintf("balloon error no virtio-balloon device (1af4:1045) on PCI bus 0; driver disabled\n");
		return;
	}
	if (find_caps(caps)) {
		kprintf("balloon error no modern virtio-pci capabilities; driver disabled\n");
		return;
	}
	u32 need = 0;
	for (int t = 1; t <= 4; t++)
		need |= 1u << caps[t].bar;
	if (setup_bars(need)) {
		kprintf("balloon error cannot map the device's memory BAR; driver disabled\n");
		return;
	}
	for (int t = 1; t <= 4; t++) {
		if ((u64)caps[t].off + caps[t].len > bars[caps[t].bar].size) {
			kprintf("balloon error capability %d outside its BAR; driver disabled\n", t);
			return;
		}
	}
	common = bars[caps[VCAP_COMMON].bar].addr + caps[VCAP_COMMON].off;
	notify_base = bars[caps[VCAP_NOTIFY].bar].addr + caps[VCAP_NOTIFY].off;
	notify_mult = caps[VCAP_NOTIFY].mult;
	isr = bars[caps[VCAP_ISR].bar].addr + caps[VCAP_ISR].off;
	devcfg = bars[caps[VCAP_DEVICE].bar].addr + caps[VCAP_DEVICE].off;

	mw8(common + C_STATUS, 0);
	if (wait_status_zero()) {
		common = 0;
		kprintf("balloon error device does not reset; driver disabled\n");
		return;
	}
	mw8(common + C_STATUS, S_ACK);
	mw8(common + C_STATUS, S_ACK | S_DRIVER);
	mw32(common + C_DFSELECT, 0);
	u64 offered = mr32(common + C_DF);
	mw32(common + C_DFSELECT, 1);
	offered |= (u64)mr32(common + C_DF) << 32;
	if (!(offered & (1ULL << F_VERSION_1))) {
		fail("device does not offer VIRTIO_F_VERSION_1");
		return;
	}
	u64 want = (1ULL << F_VERSION_1) | (1ULL << F_MUST_TELL_HOST) | (1ULL << F_STATS_VQ) |
		   (1ULL << F_FREE_PAGE_HINT) | (1ULL << F_PAGE_REPORTING);
	features = offered & want;
	u32 cfg_need = (features & (1ULL << F_FREE_PAGE_HINT)) ? 12 : 8;
	if (caps[VCAP_DEVICE].len < cfg_need) {
		fail("device configuration too short");
		return;
	}
	mw32(common + C_GFSELECT, 0);
	mw32(common + C_GF, (u32)features);
	mw32(common + C_GFSELECT, 1);
	mw32(common + C_GF, (u32)(features >> 32));
	mw8(common + C_STATUS, S_ACK | S_DRIVER | S_FEATURES_OK);
	if (!(mr8(common + C_STATUS) & S_FEATURES_OK)) {
		fail("device refused the features");
		return;
	}
	int nq = (int)mr16(common + C_NUM_QUEUES), qi = 0;
	int q_infl = qi++, q_defl = qi++;
	int q_stats = (features & (1ULL << F_STATS_VQ)) ? qi++ : -1;
	int q_hint = (features & (1ULL << F_FREE_PAGE_HINT)) ? qi++ : -1;
	int q_rep = (features & (1ULL << F_PAGE_REPORTING)) ? qi++ : -1;
	(void)q_stats;
	if (nq < qi) {
		fail("device has fewer queues than its features need");
		return;
	}
	if (vq_setup(&vq_inflate, q_infl, 64) || vq_setup(&vq_deflate, q_defl, 64))
		goto qfail;
	hinting = q_hint >= 0 && cfg.balloon_hint;
	reporting = q_rep >= 0 && cfg.balloon_report;
	if (hinting && vq_setup(&vq_hint, q_hint, QMAX))
		goto qfail;
	if (reporting && vq_setup(&vq_report, q_rep, REPORT_BATCH))
		goto qfail;

	/* the balloon's PFN list and the hint block list */
	bcap = usable_pages;
	bpfn = take_contig((bcap * 4 + PAGE_SIZE - 1) / PAGE_SIZE);
	held_cap = usable_pages / (HINT_BLOCK / PAGE_SIZE) + 4096 + 16;
	held = hinting ? take_contig((held_cap * sizeof(*held) + PAGE_SIZE - 1) / PAGE_SIZE) : 0;
	if (!bpfn || (hinting && !held)) {
		fail("no memory for the driver's lists");
		return;
	}
	mw8(common + C_STATUS, S_ACK | S_DRIVER | S_FEATURES_OK | S_DRIVER_OK);
	if (mr8(common + C_STATUS) & S_NEEDS_RESET) {
		fail("device needs reset after DRIVER_OK");
		return;
	}
	balloon_on = 1;
	kprintf("balloon bound dev=%02x:%02x.%x features=0x%lx offered=0x%lx\n", 0, devfn >> 3, devfn & 7,
		features, offered);
	u64 t = rdtsc();
	next_report_pass = t + MS(REPORT_PERIOD_MS);
	next_cfg_poll = t;
	return;
qfail:
	balloon_on = 0;
	mw8(common + C_STATUS, mr8(common + C_STATUS) | S_FAILED);
}

/* Binds the device (its rings and lists come from the bump allocator), then
 * hands all remaining RAM to the page allocator. */
void balloon_init(void)
{
	bind();
	palloc_init();
}

/* ---------------- configuration ---------------- */

static void read_config(u64 t)
{
	u32 gen = mr8(common + C_GEN);
	if (gen == last_gen && t < next_cfg_refresh)
		return;
	for (int tries = 0; tries < 10; tries++) {
		target = mr32(devcfg + D_NUM_PAGES);
		if (features & (1ULL << F_FREE_PAGE_HINT))
			cmd_id = mr32(devcfg + D_CMD_ID);
		u32 g2 = mr8(common + C_GEN);
		if (g2 == gen)
			break;
		gen = g2;
	}
	last_gen = gen;
	next_cfg_refresh = t + MS(CFG_REFRESH_MS);
	if (mr8(common + C_STATUS) & S_NEEDS_RESET)
		fail("device needs reset");
}

/* ---------------- inflate / deflate ---------------- */

static void show_actual(void)
{
	if ((u32)nballoon != shown_actual || target != shown_target) {
		kprintf("balloon actual=%lu target=%u\n", nballoon, target);
		shown_actual = (u32)nballoon;
		shown_target = target;
	}
}

/* Completes the operation in flight; 0 when none is left in flight. */
static int op_complete(u64 t)
{
	struct vq *q = op_kind == 1 ? &vq_inflate : &vq_deflate;
	u64 a, l;
	int r = vq_get(q, &a, &l);
	if (r < 0)
		return -1;
	if (!r) {
		if (t > op_deadline) {
			fail(op_kind == 1 ? "inflate queue: device did not answer" :
					    "deflate queue: device did not answer");
			return -1;
		}
		if (t - q->last_progress > MS(KICK_AGAIN_MS)) {
			vq_kick(q, 1);
			q->last_progress = t;
		}
		return 1;
	}
	if (op_kind == 1) {
		nballoon += op_count;
	} else {
		nballoon -= op_count;
		for (u32 i = 0; i < op_count; i++)	/* the host knows: the pages are ours again */
			palloc_free((u64)bpfn[nballoon + i] << 12);
	}
	op_kind = 0;
	mw32(devcfg + D_ACTUAL, (u32)nballoon);
	return 0;
}

static void op_start(u64 t)
{
	u32 n = 0;
	if (nballoon < target && t >= blocked_until) {
		while (n < PFNS_PER_BUF && nballoon + n < target && nballoon + n < bcap) {
			u64 pg = palloc_alloc();
			if (!pg)
				break;
			bpfn[nballoon + n] = (u32)(pg >> 12);
			pfnbuf[n++] = (u32)(pg >> 12);
		}
		if (!n) {		/* no free memory: try again later */
			blocked_until = t + MS(1000);
			show_actual();
			return;
		}
		op_kind = 1;
	} else if (nballoon > target) {
		while (n < PFNS_PER_BUF && nballoon - n > target) {
			pfnbuf[n] = bpfn[nballoon - n - 1];
			n++;
		}
		op_kind = 2;
	} else {
		show_actual();
		return;
	}
	struct vq *q = op_kind == 1 ? &vq_inflate : &vq_deflate;
	op_count = n;
	op_deadline = t + MS(OP_TIMEOUT_MS);
	vq_add(q, (u64)pfnbuf, 4ULL * n, 0);
	vq_kick(q, 0);
}

/* ---------------- free page hinting ---------------- */

static void post_cmd(u32 id)
{
	u32 *b = &cmdbuf[cmdbuf_next++ % 8];
	*b = id;
	if (vq_add(&vq_hint, (u64)b, 4, 0) == 0)
		vq_kick(&vq_hint, 0);
}

static void hint_end_round(void)
{
	hint_running = 0;
	post_cmd(CMD_ID_STOP);
	kprintf("balloon hint done id=%u blocks=%lu mb=%lu\n", hint_id, round_blocks, round_bytes >> 20);
}

/* fill_check=1: every page of the blocks the driver held for hints must
 * still hold fill-free's fill (the host only reads hinted pages). */
static void hint_check_fill(void)
{
	u64 pages = 0, bad = 0;
	for (u64 i = 0; i < nheld; i++) {
		for (u64 a = held[i].base; a < held[i].end; a += PAGE_SIZE, pages++) {
			u64 word, got;
			if (fill_free_intact(a, &word, &got))
				continue;
			if (bad++ < 8)
				kprintf("fill-check BAD page=0x%lx word=%lu got=0x%lx\n", a, word, got);
		}
	}
	if (bad)
		kprintf("fill-check bad_pages=%lu pages=%lu\n", bad, pages);
	else
		kprintf("fill-check ok pages=%lu\n", pages);
}

static void hint_return_all(void)
{
	u64 bytes = 0;
	if (cfg.fill_check && nheld)
		hint_check_fill();
	for (u64 i = 0; i < nheld; i++) {
		palloc_free_range(held[i].base, held[i].end - held[i].base);
		bytes += held[i].end - held[i].base;
	}
	if (nheld)
		kprintf("balloon hint returned blocks=%lu mb=%lu\n", nheld, bytes >> 20);
	nheld = 0;
}

static void hint_step(u64 t)
{
	u64 a, l;
	int r;
	while ((r = vq_get(&vq_hint, &a, &l)) > 0)
		;			/* the blocks stay held until DONE */
	if (r < 0)
		return;
	if (vq_outstanding(&vq_hint) && t - vq_hint.last_progress > MS(HINT_KICK_AGAIN_MS)) {
		vq_kick(&vq_hint, 1);	/* in case the device stopped polling just before our post */
		vq_hint.last_progress = t;
	}
	if (cmd_id == CMD_ID_DONE) {
		if (hint_running)
			hint_end_round();
		hint_return_all();
		return;
	}
	if (cmd_id == CMD_ID_STOP) {
		if (hint_running)
			hint_end_round();
		return;
	}
	if (cmd_id != hint_id) {
		if (hint_running)
			hint_end_round();
		hint_id = cmd_id;
		hint_running = 1;
		round_blocks = round_bytes = 0;
		kprintf("balloon hint start id=%u\n", hint_id);
		post_cmd(hint_id);
	}
	if (!hint_running)
		return;
	int posted = 0;
	while (vq_hint.nfree > 1) {	/* one descriptor stays free for the stop id */
		u64 len, b;
		if (nheld >= held_cap || !(b = palloc_alloc_block(HINT_BLOCK, &len))) {
			if (posted)
				vq_kick(&vq_hint, 0);
			hint_end_round();	/* free memory exhausted */
			return;
		}
		held[nheld].base = b;
		held[nheld].end = b + len;
		nheld++;
		vq_add(&vq_hint, b, len, 1);
		palloc_mark_hinted(b, len);
		round_blocks++;
		round_bytes += len;
		posted++;
	}
	if (posted)
		vq_kick(&vq_hint, 0);
}

/* ---------------- free page reporting ---------------- */

static void report_step(u64 t)
{
	u64 a, l;
	int r;
	while ((r = vq_get(&vq_report, &a, &l)) > 0) {
		palloc_free_reported_chunk(a);
		report_pending--;
		pass_bytes += l;
		total_reported += l;
	}
	if (r < 0)
		return;
	if (report_pending) {
		if (t > report_deadline) {
			fail("reporting queue: device did not answer");
		} else if (t - vq_report.last_progress > MS(KICK_AGAIN_MS)) {
			vq_kick(&vq_report, 1);
			vq_report.last_progress = t;
		}
		return;
	}
	if (t < next_report_pass)
		return;
	while (vq_report.nfree) {
		u64 c = palloc_take_unreported_chunk();
		if (!c)
			break;
		vq_add(&vq_report, c, REPORT_CHUNK, 1);
		report_pending++;
	}
	if (report_pending) {
		report_deadline = t + MS(OP_TIMEOUT_MS);
		vq_kick(&vq_report, 0);
		return;
	}
	/* nothing (more) to report: the pass is over */
	if (pass_bytes)
		kprintf("balloon reported mb=%lu total_mb=%lu\n", pass_bytes >> 20, total_reported >> 20);
	pass_bytes = 0;
	next_report_pass = t + MS(REPORT_PERIOD_MS);
}

/* ---------------- the driver loop ---------------- */

/* balloon_test=flood: one second after binding, write `actual` FLOOD_WRITES
 * times (1, 2, ... FLOOD_WRITES), as fast as MMIO goes: a guest trying to
 * flood the host's QMP clients with BALLOON_CHANGE events. */
#define FLOOD_WRITES 20000
static u64 flood_at;

static void flood_step(u64 t)
{
	if (!flood_at) {
		flood_at = t + MS(1000);
		return;
	}
	if (t < flood_at || flood_at == ~0ull)
		return;
	flood_at = ~0ull;
	for (u32 i = 1; i <= FLOOD_WRITES; i++)
		mw32(devcfg + D_ACTUAL, i);
	kprintf("balloon flood writes=%u last=%u\n", FLOOD_WRITES, FLOOD_WRITES);
}

void balloon_poll(void)
{
	if (!balloon_on)
		return;
	u64 t0 = rdtsc(), t = t0;
	if (cfg.balloon_test == BT_FLOOD) {
		flood_step(t);
		return;           /* the flood's `actual` stays: no inflate/deflate */
	}
	if (t >= next_cfg_poll) {
		read_config(t);
		next_cfg_poll = t + MS(CFG_POLL_MS);
		if (!balloon_on)
			return;
	}
	if (hinting && (hint_running || cmd_id != hint_id || vq_outstanding(&vq_hint) || nheld))
		hint_step(t);
	/* inflate/deflate: whole buffers, for up to POLL_BUDGET_MS */
	while (balloon_on) {
		if (op_kind) {
			int r = op_complete(t);
			if (r)
				break;	/* still in flight, or failed */
		}
		if (nballoon == target || (nballoon < target && t < blocked_until)) {
			show_actual();
			break;
		}
		op_start(t);
		if (!op_kind)
			break;
		while (balloon_on && op_kind && rdtsc() - t0 < MS(POLL_BUDGET_MS)) {
			if (op_complete(rdtsc()) <= 0)
				break;
			cpu_relax();
		}
		t = rdtsc();
		if (t - t0 >= MS(POLL_BUDGET_MS))
			break;
	}
	if (balloon_on && reporting)
		report_step(rdtsc());
}
