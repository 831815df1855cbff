/*
 * virtio-blk driver of the test guest and its disk workload (cmdline
 * disk=1, or workload=disk), all in ring 3 on virtio.c's modern virtio-pci
 * transport, polled from cpu 0's workload loop like net.c (no interrupts;
 * VRING_AVAIL_F_NO_INTERRUPT on the queue).  Only the virtio 1.x spec is
 * relied on (section 5.2), so it runs the same on QEMU's virtio-blk-pci
 * and kmig's.
 *
 * The workload owns the first disk_mb MiB of the disk, cut into blocks of
 * disk_bs bytes (block i at byte i * disk_bs).  Every block, once written
 * by this driver, holds a self-describing stamp (block index, generation,
 * block size, a checksum over the block, a pattern of index and
 * generation; docs/guest.md, "disk block format").  The generation each
 * block must hold lives in guest RAM (exp[]), so it travels with the guest
 * in a migration.  At start a scan reads the region once: a block with a
 * valid stamp for its own index and block size (an earlier boot's work on
 * the same disk) is adopted at the generation it holds; an all-zero block
 * must stay zero until written; anything else is foreign and is not
 * checked before its first write.  Then rounds: each block is read and
 * checked against exp[], then rewritten with the next generation (every
 * ZERO_EVERY-th write is a WRITE_ZEROES instead, when offered), with up to
 * DEPTH_MAX requests in flight and a FLUSH after every disk_flush writes.
 * A round ends when every block was visited and nothing is in flight, so
 * no two requests ever touch the same block.
 *
 * Whatever the device hands back (used ids, used lengths, the status
 * byte) is checked against what was posted; every anomaly is counted in
 * errors= and named on a line (the first MAX_LINES of each kind a round).
 *
 * Memory: the ring, request headers, data buffers and exp[] come from the
 * boot-time bump allocator (blk_init() runs before the page allocator
 * takes the rest).
 */
#include "virtio.h"

#define VIRTIO_BLK_DEVICE 0x1042

#define BF_SIZE_MAX 1
#define BF_SEG_MAX 2
#define BF_RO 5
#define BF_BLK_SIZE 6
#define BF_FLUSH 9
#define BF_WRITE_ZEROES 14
#define BIT(n) (1ULL << (n))

/* device configuration */
#define BC_CAPACITY 0
#define BC_SIZE_MAX 8
#define BC_SEG_MAX 12
#define BC_BLK_SIZE 20
#define BC_MAX_WZ_SECTORS 48
#define BC_MAX_WZ_SEG 52
#define BC_WZ_END 56			/* config length that holds the write-zeroes limits */

#define T_IN 0
#define T_OUT 1
#define T_FLUSH 4
#define T_WRITE_ZEROES 13
#define ST_OK 0
#define ST_UNSET 0xff			/* what the status byte holds until the device writes it */

#define SECTOR 512
#define DEPTH_MAX 16
#define BS_MAX (64 * 1024)
#define DSEG_MAX 16			/* data descriptors per request (SIZE_MAX splits) */
#define QUEUE_WANT 128
#define ZERO_EVERY 32			/* every 32nd write is a WRITE_ZEROES, when offered */
#define MAX_LINES 8			/* BAD / error lines per round */
#define KICK_AGAIN_MS 20
#define MS(x) ((u64)(x) * tsc_khz)

/* block format (docs/guest.md) */
#define MAGIC 0x316b6c6267696d6bULL	/* "kmigblk1", little-endian */
#define K_SEED 0x9e3779b97f4a7c15ULL
#define K_WORD 0xd1b54a32d192ed03ULL

/* exp[i]: what block i must hold.  0: unknown (foreign at the scan, or a
 * failed write): not checked.  EXP_ZERO: all zero (the low bits keep the
 * last generation, so the next write continues from it).  Otherwise the
 * generation of its stamp. */
#define EXP_ZERO 0x80000000u
#define GEN_MASK 0x7fffffffu

enum { S_IDLE, S_READ, S_WRITE, S_ZERO, S_FLUSH };
static const char *const sname[] = { "idle", "read", "write", "zeroes", "flush" };

enum { W_OK, W_MAGIC, W_INDEX, W_SIZE, W_GEN, W_DATA, W_CHECKSUM, W_NOTZERO };
static const char *const why_name[] = { "ok", "magic", "index", "size", "gen", "data", "checksum",
					"notzero" };

/* one request's driver-readable and -writable bytes, 64 apart in one page */
struct rmeta {
	u32 type, reserved;
	u64 sector;
	u64 wz_sector;			/* WRITE_ZEROES segment: sector, num_sectors, flags */
	u32 wz_num, wz_flags;
	volatile u8 status;
	u8 pad[31];
};

struct slot {
	int state;
	u64 block;
	u32 next;			/* exp[block] once the write completes */
	u32 want_wlen;			/* bytes the device must say it wrote */
	u64 t0;				/* TSC at submission */
};

int blk_on;

static struct vdev bdev = { .name = "blk", .what = "virtio-blk" };
static struct vq q;
static u64 features, capacity;
static u32 blk_size, size_max, seg_max, wz_max_sectors, wz_max_seg;
static int ro, wz_ok;

static u64 bs, spb, nblocks;		/* block bytes, sectors per block, blocks in the region */
static u32 seg_len, nseg, depth;	/* data descriptor size and count per request, slots */
static u32 *exp;
static struct rmeta *meta;
static u8 *data;
static struct slot slots[DEPTH_MAX];

static int scanning = 1;
static u64 cursor, round, inflight, next_start, start_period, next_report;
static u64 since_flush, flush_inflight, writes_started;
static int posted;

static struct {
	u64 checked, writes, flushes, zeroes, max_lat;	/* since the last report */
	u64 bad, ioerr, proto;			/* since binding */
	u64 round_bad, round_err;		/* lines in this round */
	u64 adopted, zero, foreign, max_gen;	/* the scan */
} st;

/* ---------------- block format ---------------- */

static inline u64 mix64(u64 z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return z ^ (z >> 31);
}

static inline u64 body_word(u64 seed, u64 j)
{
	return mix64(seed + j * K_WORD);
}

static u64 block_checksum(const u64 *w)
{
	u64 c = 0;
	for (u64 j = 0; j < bs / 8; j++)
		if (j != 3)
			c += mix64(w[j] ^ (j * K_SEED));
	return c;
}

static void fill_block(u64 *w, u64 b, u32 g)
{
	u64 seed = mix64(b << 32 | g);
	w[0] = MAGIC;
	w[1] = b;
	w[2] = (u64)g | bs << 32;
	for (u64 j = 4; j < bs / 8; j++)
		w[j] = body_word(seed, j);
	w[3] = block_checksum(w);
}

/* Is block b (contents w) what e says?  W_OK, or why not; *got: the
 * generation its stamp names (0 without the magic), *word: the first word
 * found wrong. */
static int check_block(const u64 *w, u64 b, u32 e, u32 *got, u64 *word)
{
	*got = w[0] == MAGIC ? (u32)w[2] : 0;
	*word = 0;
	if (e & EXP_ZERO) {
		for (u64 j = 0; j < bs / 8; j++)
			if (w[j]) {
				*word = j;
				return W_NOTZERO;
			}
		return W_OK;
	}
	if (w[0] != MAGIC)
		return W_MAGIC;
	*word = 1;
	if (w[1] != b)
		return W_INDEX;
	*word = 2;
	if (w[2] >> 32 != bs)
		return W_SIZE;
	if ((u32)w[2] != e)
		return W_GEN;
	u64 seed = mix64(b << 32 | e);
	for (u64 j = 4; j < bs / 8; j++)
		if (w[j] != body_word(seed, j)) {
			*word = j;
			return W_DATA;
		}
	*word = 3;
	return w[3] == block_checksum(w) ? W_OK : W_CHECKSUM;
}

static int all_zero(const u64 *w)
{
	for (u64 j = 0; j < bs / 8; j++)
		if (w[j])
			return 0;
	return 1;
}

/* ---------------- requests ---------------- */

static inline u64 *buf(u32 k)
{
	return (u64 *)(data + (u64)k * bs);
}

static void fail(const char *what)
{
	kprintf("blk error %s; driver disabled\n", what);
	blk_on = 0;
	vdev_set_failed(&bdev);
}

static void submit(u32 k, int state, u64 block)
{
	static const u32 type_of[] = { 0, T_IN, T_OUT, T_WRITE_ZEROES, T_FLUSH };
	struct slot *s = &slots[k];
	struct rmeta *m = &meta[k];
	struct vseg seg[2 + DSEG_MAX];
	int n = 0;

	m->type = type_of[state];
	m->reserved = 0;
	m->sector = state == S_FLUSH ? 0 : block * spb;
	m->status = ST_UNSET;
	seg[n++] = (struct vseg){ (u64)m, 16, 0 };
	s->want_wlen = 1;
	if (state == S_READ || state == S_WRITE) {
		for (u64 off = 0; off < bs; off += seg_len)
			seg[n++] = (struct vseg){ (u64)buf(k) + off,
						  (u32)(bs - off < seg_len ? bs - off : seg_len),
						  state == S_READ };
		if (state == S_READ)
			s->want_wlen += (u32)bs;
	} else if (state == S_ZERO) {
		m->wz_sector = block * spb;
		m->wz_num = (u32)spb;
		m->wz_flags = 0;	/* no unmap: the block must read back as zeros */
		seg[n++] = (struct vseg){ (u64)&m->wz_sector, 16, 0 };
	}
	seg[n++] = (struct vseg){ (u64)&m->status, 1, 1 };
	if (vq_add_chain(&q, seg, n)) {	/* cannot happen: depth * descriptors <= queue size */
		fail("no free descriptors");
		return;
	}
	s->state = state;
	s->block = block;
	s->t0 = rdtsc();
	inflight++;
	posted = 1;
}

/* An error line (the first MAX_LINES of a round); the count is the caller's. */
static void err_line(const struct slot *s, const char *what, u64 got, u64 want)
{
	if (st.round_err++ < MAX_LINES)
		kprintf("disk error %s=%lu want=%lu op=%s block=%lu round=%lu t_ms=%lu\n", what, got,
			want, sname[s->state], s->block, round, now_ms());
}

static void read_checked(u32 k)
{
	struct slot *s = &slots[k];
	u64 b = s->block, *w = buf(k);
	u32 e = exp[b], got;
	u64 word;

	if (scanning) {
		u32 g = w[0] == MAGIC ? (u32)w[2] & GEN_MASK : 0;
		if (g && check_block(w, b, g, &got, &word) == W_OK) {
			exp[b] = g;
			st.adopted++;
			if (g > st.max_gen)
				st.max_gen = g;
		} else if (all_zero(w)) {
			exp[b] = EXP_ZERO;
			st.zero++;
		} else {
			exp[b] = 0;
			st.foreign++;
		}
		s->state = S_IDLE;
		return;
	}
	if (e) {
		int why = check_block(w, b, e, &got, &word);
		if (why != W_OK) {
			st.bad++;
			if (st.round_bad++ < MAX_LINES)
				kprintf("disk BAD block=%lu want_gen=%u got_gen=%u why=%s word=%lu sector=%lu round=%lu t_ms=%lu\n",
					b, e & EXP_ZERO ? 0 : e, got, why_name[why], word, b * spb,
					round, now_ms());
		}
	}
	st.checked++;
	if (ro) {
		s->state = S_IDLE;
		return;
	}
	u32 g = (e & GEN_MASK) >= GEN_MASK ? 1 : (e & GEN_MASK) + 1;
	if (wz_ok && ++writes_started % ZERO_EVERY == 0) {
		s->next = EXP_ZERO | (e & GEN_MASK);
		submit(k, S_ZERO, b);
		return;
	}
	fill_block(w, b, g);
	s->next = g;
	submit(k, S_WRITE, b);
}

static void complete(u32 k, u32 wlen)
{
	struct slot *s = &slots[k];
	u32 status = meta[k].status;
	u64 t = rdtsc();	/* the device may finish a request posted after this poll began */
	int ok = 1;

	inflight--;
	if (t - s->t0 > st.max_lat)
		st.max_lat = t - s->t0;
	if (wlen != s->want_wlen) {
		st.proto++;
		err_line(s, "used_len", wlen, s->want_wlen);
		ok = 0;
	}
	if (status != ST_OK) {
		st.ioerr++;
		err_line(s, "status", status, ST_OK);
		ok = 0;
	}
	switch (s->state) {
	case S_READ:
		if (ok) {
			read_checked(k);
			return;
		}
		break;
	case S_WRITE:
	case S_ZERO:
		/* a failed write leaves the block unknown: not checked until rewritten */
		exp[s->block] = ok ? s->next : 0;
		st.writes++;
		since_flush++;
		if (s->state == S_ZERO)
			st.zeroes++;
		break;
	case S_FLUSH:
		st.flushes++;
		flush_inflight = 0;
		break;
	}
	s->state = S_IDLE;
}

static void harvest(void)
{
	u64 a, l;
	u32 wl;
	int r;
	while ((r = vq_get(&q, &a, &l, &wl)) != 0) {
		if (r < 0)
			continue;		/* counted in q.bad */
		u64 k = (a - (u64)meta) / sizeof(struct rmeta);
		if (a < (u64)meta || k >= depth || a != (u64)&meta[k] || slots[k].state == S_IDLE) {
			st.proto++;		/* posted by us, yet no request of ours: cannot be */
			continue;
		}
		complete((u32)k, wl);
		if (!blk_on)
			return;
	}
}

/* The next block to visit, or -1: the scan's, or the round's (a new round
 * only when nothing is in flight; the rate paces the rounds' blocks). */
static long next_block(u64 t)
{
	if (cursor == nblocks) {
		if (inflight)
			return -1;
		if (scanning) {
			scanning = 0;
			kprintf("disk scan blocks=%lu adopted=%lu zero=%lu foreign=%lu max_gen=%lu t_ms=%lu\n",
				nblocks, st.adopted, st.zero, st.foreign, st.max_gen, now_ms());
			next_start = t;
		} else if (st.round_bad > MAX_LINES || st.round_err > MAX_LINES) {
			kprintf("disk bad_blocks=%lu errors=%lu round=%lu (first %d of each shown)\n",
				st.round_bad, st.round_err, round, MAX_LINES);
		}
		round++;
		cursor = 0;
		st.round_bad = st.round_err = 0;
	}
	if (!scanning && start_period) {
		if (t < next_start)
			return -1;
		next_start += start_period;
		if (next_start <= t)		/* late (a pause): no burst to catch up */
			next_start = t + start_period;
	}
	return (long)cursor++;
}

static void start_work(u64 t)
{
	for (u32 k = 0; k < depth && blk_on; k++) {
		if (slots[k].state != S_IDLE)
			continue;
		if (!ro && (features & BIT(BF_FLUSH)) && cfg.disk_flush &&
		    since_flush >= cfg.disk_flush && !flush_inflight) {
			since_flush = 0;	/* the flush covers every write completed so far */
			flush_inflight = 1;
			submit(k, S_FLUSH, 0);
			continue;
		}
		long b = next_block(t);
		if (b < 0)
			break;
		submit(k, S_READ, (u64)b);
	}
}

/* ---------------- binding ---------------- */

static u64 cfg_read64(u32 off)
{
	u32 gen, lo, hi;
	for (int tries = 0; tries < 10; tries++) {
		gen = mr8(bdev.common + C_GEN);
		lo = mr32(bdev.devcfg + off);
		hi = mr32(bdev.devcfg + off + 4);
		if (mr8(bdev.common + C_GEN) == gen)
			break;
	}
	return (u64)hi << 32 | lo;
}

static int bind(void)
{
	q.idx = -1;
	if (vdev_bind(&bdev, VIRTIO_BLK_DEVICE))
		return -1;
	u64 want = BIT(F_VERSION_1) | BIT(BF_FLUSH) | BIT(BF_RO);
	if (bdev.devcfg_len >= BC_SEG_MAX + 4)
		want |= BIT(BF_SIZE_MAX) | BIT(BF_SEG_MAX);
	if (bdev.devcfg_len >= BC_BLK_SIZE + 4)
		want |= BIT(BF_BLK_SIZE);
	if (bdev.devcfg_len >= BC_WZ_END)
		want |= BIT(BF_WRITE_ZEROES);
	features = bdev.offered & want;
	if (bdev.devcfg_len < 8 || vdev_set_features(&bdev, features)) {
		fail(bdev.devcfg_len < 8 ? "no capacity in the device configuration" :
		     "device refused the features");
		return -1;
	}
	capacity = cfg_read64(BC_CAPACITY);
	size_max = (features & BIT(BF_SIZE_MAX)) ? mr32(bdev.devcfg + BC_SIZE_MAX) : 0;
	seg_max = (features & BIT(BF_SEG_MAX)) ? mr32(bdev.devcfg + BC_SEG_MAX) : 0;
	blk_size = (features & BIT(BF_BLK_SIZE)) ? mr32(bdev.devcfg + BC_BLK_SIZE) : SECTOR;
	if (features & BIT(BF_WRITE_ZEROES)) {
		wz_max_sectors = mr32(bdev.devcfg + BC_MAX_WZ_SECTORS);
		wz_max_seg = mr32(bdev.devcfg + BC_MAX_WZ_SEG);
	}
	ro = !!(features & BIT(BF_RO));
	if (vq_setup(&bdev, &q, 0, QUEUE_WANT)) {
		blk_on = 0;
		vdev_set_failed(&bdev);
		return -1;
	}
	q.lenient = 1;		/* a used index running ahead is counted, each entry still checked */
	vdev_set_status(&bdev, S_DRIVER_OK);
	if (mr8(bdev.common + C_STATUS) & S_NEEDS_RESET) {
		fail("device needs reset after DRIVER_OK");
		return -1;
	}
	kprintf("blk bound dev=%02x:%02x.%x id=1af4:%04x features=0x%lx capacity=%lu blk_size=%u offered=0x%lx size_max=%u seg_max=%u queue=%u ro=%d\n",
		0, bdev.devfn >> 3, bdev.devfn & 7, bdev.pci_id, features, capacity, blk_size,
		bdev.offered, size_max, seg_max, q.size, ro);
	return 0;
}

/* The region, the block size and the per-request layout; 0 or -1 (line printed). */
static int size_workload(void)
{
	bs = cfg.disk_bs;
	if (bs < SECTOR || bs > BS_MAX || bs % SECTOR || (blk_size >= SECTOR && bs % blk_size)) {
		kprintf("disk error disk_bs=%lu is not a multiple of %u between 512 and %d; driver disabled\n",
			bs, blk_size, BS_MAX);
		return -1;
	}
	spb = bs / SECTOR;
	u64 region = (cfg.disk_mb ? cfg.disk_mb : 16) << 20;
	if (region > capacity * SECTOR)
		region = capacity * SECTOR;
	nblocks = region / bs;
	seg_len = size_max && size_max < bs ? size_max & ~(SECTOR - 1u) : (u32)bs;
	nseg = seg_len ? (u32)((bs + seg_len - 1) / seg_len) : 0;
	if (!nblocks || !nseg || nseg > DSEG_MAX || (seg_max && nseg > seg_max)) {
		kprintf("disk error no room: blocks=%lu bs=%lu size_max=%u seg_max=%u; driver disabled\n",
			nblocks, bs, size_max, seg_max);
		return -1;
	}
	depth = q.size / (nseg + 2);
	if (depth > DEPTH_MAX)
		depth = DEPTH_MAX;
	if (depth > nblocks)
		depth = (u32)nblocks;
	wz_ok = !ro && (features & BIT(BF_WRITE_ZEROES)) && wz_max_sectors >= spb && wz_max_seg >= 1;
	u64 exp_pages = (nblocks * 4 + PAGE_SIZE - 1) / PAGE_SIZE;
	exp = take_contig(exp_pages);
	meta = take_contig(1);
	data = take_contig((depth * bs + PAGE_SIZE - 1) / PAGE_SIZE);
	if (!exp || !meta || !data) {
		kprintf("disk error no memory for %lu blocks; driver disabled\n", nblocks);
		return -1;
	}
	memset(exp, 0, exp_pages * PAGE_SIZE);
	memset(meta, 0, PAGE_SIZE);
	return 0;
}

/* ---------------- init, poll, report ---------------- */

void blk_init(void)
{
	if (bind())
		return;
	if (size_workload()) {
		vdev_set_failed(&bdev);
		return;
	}
	start_period = cfg.disk_rate ? tsc_khz * 1000 / cfg.disk_rate : 0;
	next_report = rdtsc() + MS(cfg.report_ms);
	blk_on = 1;
	kprintf("disk start blocks=%lu bs=%lu depth=%u segs=%u rate=%lu flush=%lu zeroes=%d ro=%d\n",
		nblocks, bs, depth, nseg, cfg.disk_rate,
		(features & BIT(BF_FLUSH)) && !ro ? cfg.disk_flush : 0, wz_ok, ro);
}

static void report(void)
{
	u64 errors = st.bad + st.ioerr + st.proto + q.bad;
	kprintf("disk %s round=%lu blocks=%lu writes=%lu flushes=%lu max_lat_us=%lu errors=%lu t_ms=%lu zeroes=%lu bad=%lu ioerr=%lu proto=%lu\n",
		errors ? "bad" : "ok", round, st.checked, st.writes, st.flushes,
		st.max_lat * 1000 / tsc_khz, errors, now_ms(), st.zeroes, st.bad, st.ioerr,
		st.proto + q.bad);
	st.checked = st.writes = st.flushes = st.zeroes = st.max_lat = 0;
}

void blk_poll(void)
{
	if (!blk_on)
		return;
	u64 t = rdtsc();
	if (inflight && (u16)(q.used[0] >> 16) != q.last_used)
		harvest();
	if (blk_on)
		start_work(t);
	if (!blk_on)
		return;
	if (posted) {
		vq_kick(&q, 0);
		posted = 0;
	} else if (inflight && t - q.last_progress > MS(KICK_AGAIN_MS)) {
		vq_kick(&q, 1);		/* cheap insurance against a lost notification */
		q.last_progress = t;
	}
	if (t >= next_report) {
		if (!scanning)
			report();
		if (mr8(bdev.common + C_STATUS) & S_NEEDS_RESET)
			fail("device needs reset");
		next_report += MS(cfg.report_ms);
		if (next_report <= t)
			next_report = t + MS(cfg.report_ms);
	}
}
