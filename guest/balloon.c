/*
 * virtio-balloon driver of the test guest (cmdline balloon=1), all in ring
 * 3, on virtio.c's modern virtio-pci transport: PCI configuration space
 * through conf1 (ports 0xcf8/0xcfc) and the device's memory BAR through
 * traps (docs/guest.md, "Trap ABI").  No interrupts: cpu 0 calls
 * balloon_poll() from its workload loop, which polls the used rings and
 * the device configuration.
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
#include "virtio.h"

/* ---------------- constants ---------------- */

#define VIRTIO_BALLOON_DEVICE 0x1045

#define F_MUST_TELL_HOST 0
#define F_STATS_VQ 1
#define F_FREE_PAGE_HINT 3
#define F_PAGE_REPORTING 5

/* device configuration */
#define D_NUM_PAGES 0
#define D_ACTUAL 4
#define D_CMD_ID 8
#define CMD_ID_STOP 0
#define CMD_ID_DONE 1

#define PFNS_PER_BUF 256		/* PFNs per inflate/deflate buffer */
#define HINT_BLOCK (4ULL << 20)		/* largest free page hint */
#define REPORT_CHUNK (2ULL << 20)
#define REPORT_BATCH 32

#define MS(x) ((u64)(x) * tsc_khz)
#define OP_TIMEOUT_MS 3000		/* a queue buffer must be used within this */
#define CFG_POLL_MS 2			/* config generation read at most this often */
#define CFG_REFRESH_MS 100		/* full config read even without a new generation */
#define REPORT_PERIOD_MS 2000		/* idle time between two reporting passes */
#define POLL_BUDGET_MS 20		/* work done in one balloon_poll() call */
#define KICK_AGAIN_MS 20		/* re-notify a queue whose buffers sit unused */
#define HINT_KICK_AGAIN_MS 100

/* ---------------- driver state ---------------- */

int balloon_on;

static struct vq vq_inflate, vq_deflate, vq_hint, vq_report;

static struct vdev bdev = { .name = "balloon", .what = "virtio-balloon" };
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
	vdev_set_failed(&bdev);
	/* Everything handed to the device stays out of the allocator: a broken
	 * device might still write into it. */
}

/* One used buffer (vq_get); a corrupt used ring disables the driver. */
static int bget(struct vq *q, u64 *addr, u64 *len)
{
	int r = vq_get(q, addr, len, 0);
	if (r < 0) {
		fail(vq_strerror(r));
		return -1;
	}
	return r;
}

/* ---------------- init ---------------- */

static void bind(void)
{
	vq_inflate.idx = vq_deflate.idx = vq_hint.idx = vq_report.idx = -1;
	bdev.rebar = cfg.balloon_test == BT_REBAR;
	bdev.nokick = cfg.balloon_test == BT_NOKICK;
	if (vdev_bind(&bdev, VIRTIO_BALLOON_DEVICE))
		return;
	u64 want = (1ULL << F_VERSION_1) | (1ULL << F_MUST_TELL_HOST) | (1ULL << F_STATS_VQ) |
		   (1ULL << F_FREE_PAGE_HINT) | (1ULL << F_PAGE_REPORTING);
	features = bdev.offered & want;
	u32 cfg_need = (features & (1ULL << F_FREE_PAGE_HINT)) ? 12 : 8;
	if (bdev.devcfg_len < cfg_need) {
		fail("device configuration too short");
		return;
	}
	if (vdev_set_features(&bdev, features)) {
		fail("device refused the features");
		return;
	}
	int nq = (int)mr16(bdev.common + C_NUM_QUEUES), qi = 0;
	int q_infl = qi++, q_defl = qi++;
	int q_stats = (features & (1ULL << F_STATS_VQ)) ? qi++ : -1;
	int q_hint = (features & (1ULL << F_FREE_PAGE_HINT)) ? qi++ : -1;
	int q_rep = (features & (1ULL << F_PAGE_REPORTING)) ? qi++ : -1;
	(void)q_stats;
	if (nq < qi) {
		fail("device has fewer queues than its features need");
		return;
	}
	if (vq_setup(&bdev, &vq_inflate, q_infl, 64) || vq_setup(&bdev, &vq_deflate, q_defl, 64))
		goto qfail;
	hinting = q_hint >= 0 && cfg.balloon_hint;
	reporting = q_rep >= 0 && cfg.balloon_report;
	if (hinting && vq_setup(&bdev, &vq_hint, q_hint, QMAX))
		goto qfail;
	if (reporting && vq_setup(&bdev, &vq_report, q_rep, REPORT_BATCH))
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
	vdev_set_status(&bdev, S_DRIVER_OK);
	if (mr8(bdev.common + C_STATUS) & S_NEEDS_RESET) {
		fail("device needs reset after DRIVER_OK");
		return;
	}
	balloon_on = 1;
	kprintf("balloon bound dev=%02x:%02x.%x features=0x%lx offered=0x%lx\n", 0, bdev.devfn >> 3,
		bdev.devfn & 7, features, bdev.offered);
	u64 t = rdtsc();
	next_report_pass = t + MS(REPORT_PERIOD_MS);
	next_cfg_poll = t;
	return;
qfail:
	balloon_on = 0;
	vdev_set_failed(&bdev);
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
	u32 gen = mr8(bdev.common + C_GEN);
	if (gen == last_gen && t < next_cfg_refresh)
		return;
	for (int tries = 0; tries < 10; tries++) {
		target = mr32(bdev.devcfg + D_NUM_PAGES);
		if (features & (1ULL << F_FREE_PAGE_HINT))
			cmd_id = mr32(bdev.devcfg + D_CMD_ID);
		u32 g2 = mr8(bdev.common + C_GEN);
		if (g2 == gen)
			break;
		gen = g2;
	}
	last_gen = gen;
	next_cfg_refresh = t + MS(CFG_REFRESH_MS);
	if (mr8(bdev.common + C_STATUS) & S_NEEDS_RESET)
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
	int r = bget(q, &a, &l);
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
	mw32(bdev.devcfg + D_ACTUAL, (u32)nballoon);
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
	while ((r = bget(&vq_hint, &a, &l)) > 0)
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
	while ((r = bget(&vq_report, &a, &l)) > 0) {
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
		mw32(bdev.devcfg + D_ACTUAL, i);
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
