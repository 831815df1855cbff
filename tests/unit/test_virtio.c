/* PCI host bridge, virtio-pci transport, split virtqueues and the balloon
 * device, driven by a fake driver over fake guest RAM (no KVM). */
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/timeutil.h"
#include "dev/balloon.h"
#include "dev/balloon_impl.h"
#include "dev/pci.h"
#include "harness.h"
#include "vdrv.h"

#define RAM_SIZE (128ull << 20)
#define QBASE 0x100000ull
#define QSTRIDE 0x10000ull
#define QSIZE 64

struct drv {
	struct vdrv v;            /* RAM, bus, every queue, marks, the line */
	struct balloon *b;
	int changes;
	uint64_t last_actual;
};

static void on_change(void *ctx, uint64_t bytes)
{
	struct drv *d = ctx;
	d->changes++;
	d->last_actual = bytes;
}

/* Negotiates features and enables every queue; returns the status. */
static uint8_t drv_start(struct drv *d, uint64_t features)
{
	(void)vdrv__start(&d->v, features);
	return vdrv__status(&d->v);
}

#define ALL_FEATURES (1ull << 32 | 1ull << BALLOON_F_STATS_VQ | 1ull << BALLOON_F_FREE_PAGE_HINT | \
		      1ull << BALLOON_F_REPORTING)

static void drv_init_conf(struct drv *d, uint64_t ram_size, bool no_hint, bool no_reporting)
{
	memset(d, 0, sizeof(*d));
	const struct vdrv_conf vc = { .ram_size = ram_size, .bar = BALLOON_BAR_GPA, .qbase = QBASE,
				      .qstride = QSTRIDE, .nq = BALLOON_NR_VQS, .qsize = QSIZE };
	if (vdrv__init(&d->v, &vc))
		abort();
	struct balloon_conf c = { .ram = &d->v.ram, .mark = vdrv__mark, .mark_ctx = &d->v,
				  .irq = vdrv__irq, .irq_ctx = &d->v, .irq_line = BALLOON_IRQ,
				  .bar_gpa = BALLOON_BAR_GPA, .no_free_page_hint = no_hint,
				  .no_reporting = no_reporting };
	if (balloon__create(&d->b, &c) || vdrv__plug(&d->v, BALLOON_PCI_SLOT, balloon__pci(d->b)))
		abort();
	balloon__set_change_cb(d->b, on_change, d);
}

static void drv_init_size(struct drv *d, uint64_t ram_size)
{
	drv_init_conf(d, ram_size, false, false);
}

static void drv_init(struct drv *d)
{
	drv_init_size(d, RAM_SIZE);
}

static void drv_fini(struct drv *d)
{
	balloon__destroy(d->b);
	vdrv__fini(&d->v);
}

static uint32_t cfg32(struct drv *d, unsigned off)
{
	return (uint32_t)vdrv__read(&d->v, VIRTIO_PCI_DEVCFG + off, 4);
}

static void t_pci_config(struct t *t)
{
	struct drv d;
	drv_init(&d);
	T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 0, 0, 4), 0x12378086);
	T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 0, 0x0a, 2), 0x0600);
	T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 3, 0, 4), 0x10451af4);
	T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 3, PCI_REVISION, 1), 1);
	T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 3, 0x0b, 1), 0xff);
	T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 3, PCI_SUBSYS_VENDOR, 4), 0x11001af4);
	T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 3, PCI_INT_PIN, 1), 1);
	T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 3, PCI_INT_LINE, 1), BALLOON_IRQ);
	T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 5, 0, 4), 0xffffffffu);   /* empty slot */
	uint32_t a = 0x00001800; /* enable bit off */
	uint32_t v = 0;
	pci__pio(&d.v.bus, PCI_CONF_ADDR, true, &a, 4);
	pci__pio(&d.v.bus, PCI_CONF_DATA, false, &v, 4);
	T_CHECK_EQ(t, v, 0xffffffffu);
	/* BAR sizing */
	unsigned bar = PCI_BAR0 + 4 * VIRTIO_PCI_BAR;
	T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 3, bar, 4), (uint32_t)BALLOON_BAR_GPA | PCI_BAR_MEM_64);
	vdrv__cfg_write(&d.v, 3, bar, 0xffffffff, 4);
	vdrv__cfg_write(&d.v, 3, bar + 4, 0xffffffff, 4);
	T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 3, bar, 4), 0xffffc004u);
	T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 3, bar + 4, 4), 0xffffffffu);
	T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 3, PCI_BAR0, 4), 0); /* unused BAR */
	vdrv__cfg_write(&d.v, 3, PCI_BAR0, 0xffffffff, 4);
	T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 3, PCI_BAR0, 4), 0);
	vdrv__cfg_write(&d.v, 3, bar, (uint32_t)BALLOON_BAR_GPA, 4);
	vdrv__cfg_write(&d.v, 3, bar + 4, 0, 4);
	/* read-only identity */
	vdrv__cfg_write(&d.v, 3, 0, 0xdeadbeef, 4);
	T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 3, 0, 4), 0x10451af4);
	/* capability list: common, ISR, device, notify, all in BAR 4 */
	T_CHECK(t, vdrv__cfg_read(&d.v, 3, PCI_STATUS, 2) & PCI_STATUS_CAP_LIST);
	static const uint8_t want_type[] = { 1, 3, 4, 2 };
	static const uint32_t want_off[] = { 0, 0x1000, 0x2000, 0x3000 };
	unsigned p = vdrv__cfg_read(&d.v, 3, PCI_CAP_PTR, 1), n = 0;
	while (p && n < 8) {
		T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 3, p, 1), 0x09);
		if (n < 4) {
			T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 3, p + 3, 1), want_type[n]);
			T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 3, p + 4, 1), VIRTIO_PCI_BAR);
			T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 3, p + 8, 4), want_off[n]);
		}
		if (vdrv__cfg_read(&d.v, 3, p + 3, 1) == 2)
			T_CHECK_EQ(t, vdrv__cfg_read(&d.v, 3, p + 16, 4), 4);
		p = vdrv__cfg_read(&d.v, 3, p + 1, 1);
		n++;
	}
	T_CHECK_EQ(t, n, 4);
	drv_fini(&d);
}

static void t_bar_move(struct t *t)
{
	struct drv d;
	drv_init(&d);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_NUM_QUEUES, 2), BALLOON_NR_VQS);
	unsigned bar = PCI_BAR0 + 4 * VIRTIO_PCI_BAR;
	vdrv__cfg_write(&d.v, 3, bar, 0xd0000000u, 4);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_NUM_QUEUES, 2), ~0ull); /* old place: nothing */
	d.v.bar = 0xd0000000u;
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_NUM_QUEUES, 2), BALLOON_NR_VQS);
	/* memory decoding off */
	vdrv__cfg_write(&d.v, 3, PCI_COMMAND, 0, 2);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_NUM_QUEUES, 2), ~0ull);
	vdrv__cfg_write(&d.v, 3, PCI_COMMAND, PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER, 2);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_NUM_QUEUES, 2), BALLOON_NR_VQS);
	/* an access that runs past the end of the BAR is not decoded */
	T_CHECK(t, !pci__mmio(&d.v.bus, d.v.bar + VIRTIO_PCI_BAR_SIZE - 2, false, &(uint64_t){ 0 },
			      4));
	drv_fini(&d);
}

static void t_features(struct t *t)
{
	struct drv d;
	drv_init(&d);
	vdrv__write(&d.v, VIRTIO_PCI_DFSELECT, 0, 4);
	uint32_t lo = (uint32_t)vdrv__read(&d.v, VIRTIO_PCI_DF, 4);
	vdrv__write(&d.v, VIRTIO_PCI_DFSELECT, 1, 4);
	uint32_t hi = (uint32_t)vdrv__read(&d.v, VIRTIO_PCI_DF, 4);
	T_CHECK_EQ(t, lo, 1u << BALLOON_F_STATS_VQ | 1u << BALLOON_F_FREE_PAGE_HINT | 1u << BALLOON_F_REPORTING);
	T_CHECK_EQ(t, hi, 1);
	T_CHECK(t, !(drv_start(&d, 1ull << BALLOON_F_STATS_VQ) & VIRTIO_STATUS_FEATURES_OK)); /* no VERSION_1 */
	T_CHECK(t, !(drv_start(&d, ALL_FEATURES | 1ull << BALLOON_F_PAGE_POISON) & VIRTIO_STATUS_FEATURES_OK));
	T_CHECK_EQ(t, drv_start(&d, ALL_FEATURES), 0x0f);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_MSIX_CONFIG, 2), VIRTIO_NO_VECTOR);
	vdrv__write(&d.v, VIRTIO_PCI_Q_SELECT, 3, 2);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_Q_NOFF, 2), 3);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_Q_ENABLE, 2), 1);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_Q_DESC, 8), vdrv__desc_gpa(&d.v, 3));
	vdrv__write(&d.v, VIRTIO_PCI_Q_SELECT, 9, 2);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_Q_SIZE, 2), 0);
	T_CHECK(t, balloon__hint_ready(d.b));
	drv_fini(&d);
}

static void t_inflate_deflate(struct t *t)
{
	struct drv d;
	drv_init(&d);
	T_CHECK_EQ(t, drv_start(&d, ALL_FEATURES), 0x0f);
	uint64_t pfns_at = 0x200000;
	uint32_t pfns[4] = { 0x400, 0x401, 0x403, (uint32_t)(RAM_SIZE >> 12) + 5 };
	memcpy(vdrv__host(&d.v, pfns_at), pfns, sizeof(pfns));
	memset(vdrv__host(&d.v, 0x400000), 0xab, 4 * 4096);
	struct vdrv_seg s = { pfns_at, sizeof(pfns), false };
	uint16_t head = vdrv__add_chain(&d.v, BALLOON_VQ_INFLATE, &s, 1);
	uint64_t marks0 = d.v.mark_calls;
	vdrv__kick(&d.v, BALLOON_VQ_INFLATE);
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, BALLOON_VQ_INFLATE), 1);
	T_CHECK_EQ(t, vdrv__used_id(&d.v, BALLOON_VQ_INFLATE, 0), head);
	T_CHECK(t, d.v.mark_calls > marks0);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x400), BALLOON_SKIP_BALLOONED);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x401), BALLOON_SKIP_BALLOONED);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x402), BALLOON_SKIP_NONE);
	T_CHECK_EQ(t, vdrv__host(&d.v, 0x400000)[0], 0);          /* discarded */
	T_CHECK_EQ(t, vdrv__host(&d.v, 0x402000)[0], 0xab);       /* not ballooned */
	struct balloon_stats st;
	balloon__get_stats(d.b, &st);
	T_CHECK_EQ(t, st.inflated, 3);
	T_CHECK_EQ(t, st.bad_pfns, 1);
	/* the driver reports actual; QMP sees RAM minus it */
	vdrv__write(&d.v, VIRTIO_PCI_DEVCFG + 4, 3, 4);
	T_CHECK_EQ(t, balloon__actual_bytes(d.b), RAM_SIZE - 3 * 4096);
	T_CHECK_EQ(t, d.changes, 1);
	T_CHECK_EQ(t, d.last_actual, RAM_SIZE - 3 * 4096);
	/* deflate one */
	uint32_t one = 0x401;
	memcpy(vdrv__host(&d.v, pfns_at), &one, 4);
	s.len = 4;
	vdrv__add_chain(&d.v, BALLOON_VQ_DEFLATE, &s, 1);
	vdrv__kick(&d.v, BALLOON_VQ_DEFLATE);
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, BALLOON_VQ_DEFLATE), 1);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x401), BALLOON_SKIP_NONE);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x400), BALLOON_SKIP_BALLOONED);
	/* QMP balloon target */
	uint8_t gen = (uint8_t)vdrv__read(&d.v, VIRTIO_PCI_CFG_GEN, 1);
	T_CHECK_EQ(t, balloon__set_target(d.b, RAM_SIZE - (8 << 20)), 0);
	T_CHECK_EQ(t, cfg32(&d, 0), (8 << 20) / 4096);
	T_CHECK_EQ(t, (uint8_t)vdrv__read(&d.v, VIRTIO_PCI_CFG_GEN, 1), (uint8_t)(gen + 1));
	T_CHECK_EQ(t, balloon__set_target(d.b, 0), -EINVAL);
	T_CHECK_EQ(t, balloon__set_target(d.b, RAM_SIZE * 2), 0);
	T_CHECK_EQ(t, cfg32(&d, 0), 0);
	/* interrupts: ISR is read-to-clear and drops the line */
	T_CHECK(t, d.v.irq_level);
	uint8_t isr = (uint8_t)vdrv__read(&d.v, VIRTIO_PCI_ISR, 1);
	T_CHECK(t, isr & VIRTIO_ISR_CONFIG);
	T_CHECK(t, isr & VIRTIO_ISR_QUEUE);
	T_CHECK(t, !d.v.irq_level);
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_ISR, 1), 0);
	/* reset deflates everything */
	vdrv__write(&d.v, VIRTIO_PCI_STATUS, 0, 1);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x400), BALLOON_SKIP_NONE);
	T_CHECK_EQ(t, balloon__actual_bytes(d.b), RAM_SIZE);
	T_CHECK_EQ(t, d.v.mark_outside, 0);
	drv_fini(&d);
}

/* Each case breaks the ring in one way; the device must flag NEEDS_RESET,
 * write nothing outside RAM, and work again after a reset. */
enum bad_case { BAD_HEAD, BAD_LOOP, BAD_ADDR, BAD_CROSS, BAD_IDX, BAD_INDIRECT, BAD_ORDER,
		BAD_RING, BAD_SIZE, BAD_LONG, BAD_NCASES };

static void break_ring(struct drv *d, enum bad_case c)
{
	unsigned q = BALLOON_VQ_INFLATE;
	struct vdrv_seg ok = { 0x200000, 4, false };
	uint16_t v;
	switch (c) {
	case BAD_HEAD:
		vdrv__add_chain(&d->v, q, &ok, 1);
		v = QSIZE + 3;
		memcpy(vdrv__host(&d->v, vdrv__avail_gpa(&d->v, q) + 4), &v, 2);
		break;
	case BAD_LOOP: {
		vdrv__add_chain(&d->v, q, &ok, 1);
		uint16_t f = VIRTQ_DESC_F_NEXT, next = 0;
		memcpy(vdrv__host(&d->v, vdrv__desc_gpa(&d->v, q) + 12), &f, 2);
		memcpy(vdrv__host(&d->v, vdrv__desc_gpa(&d->v, q) + 14), &next, 2);
		break;
	}
	case BAD_ADDR: {
		struct vdrv_seg s = { RAM_SIZE + 0x1000, 4, false };
		vdrv__add_chain(&d->v, q, &s, 1);
		break;
	}
	case BAD_CROSS: {
		struct vdrv_seg s = { RAM_SIZE - 2, 4, false };
		vdrv__add_chain(&d->v, q, &s, 1);
		break;
	}
	case BAD_IDX:
		vdrv__add_chain(&d->v, q, &ok, 1);
		v = QSIZE + 2;
		memcpy(vdrv__host(&d->v, vdrv__avail_gpa(&d->v, q) + 2), &v, 2);
		break;
	case BAD_INDIRECT: {
		vdrv__add_chain(&d->v, q, &ok, 1);
		uint16_t f = VIRTQ_DESC_F_INDIRECT;
		memcpy(vdrv__host(&d->v, vdrv__desc_gpa(&d->v, q) + 12), &f, 2);
		break;
	}
	case BAD_ORDER: {
		struct vdrv_seg s[2] = { { 0x200000, 4, true }, { 0x201000, 4, false } };
		vdrv__add_chain(&d->v, q, s, 2);
		break;
	}
	case BAD_RING:
		vdrv__write(&d->v, VIRTIO_PCI_STATUS, 0, 1);
		vdrv__write(&d->v, VIRTIO_PCI_Q_SELECT, 0, 2);
		vdrv__write(&d->v, VIRTIO_PCI_Q_DESC, RAM_SIZE - 16, 8);
		vdrv__write(&d->v, VIRTIO_PCI_Q_ENABLE, 1, 2);
		return;
	case BAD_SIZE:
		vdrv__write(&d->v, VIRTIO_PCI_STATUS, 0, 1);
		vdrv__write(&d->v, VIRTIO_PCI_Q_SELECT, 0, 2);
		vdrv__write(&d->v, VIRTIO_PCI_Q_SIZE, 48, 2);
		vdrv__write(&d->v, VIRTIO_PCI_Q_ENABLE, 1, 2);
		return;
	case BAD_LONG: {
		/* every descriptor chained to the next one, the last back to 0 */
		vdrv__add_chain(&d->v, q, &ok, 1);
		for (unsigned i = 0; i < QSIZE; i++) {
			uint16_t f = VIRTQ_DESC_F_NEXT, next = (uint16_t)((i + 1) % QSIZE);
			uint64_t a = 0x200000;
			uint32_t l = 4;
			memcpy(vdrv__host(&d->v, vdrv__desc_gpa(&d->v, q) + 16 * i), &a, 8);
			memcpy(vdrv__host(&d->v, vdrv__desc_gpa(&d->v, q) + 16 * i + 8), &l, 4);
			memcpy(vdrv__host(&d->v, vdrv__desc_gpa(&d->v, q) + 16 * i + 12), &f, 2);
			memcpy(vdrv__host(&d->v, vdrv__desc_gpa(&d->v, q) + 16 * i + 14), &next, 2);
		}
		break;
	}
	default:
		break;
	}
	vdrv__kick(&d->v, q);
}

/* While discards are held (a background snapshot), an inflated frame is
 * marked but keeps its data; the end of the hold discards it, and a frame
 * deflated meanwhile is left as it is. */
static void t_hold_discards(struct t *t)
{
	struct drv d;
	drv_init(&d);
	T_CHECK_EQ(t, drv_start(&d, ALL_FEATURES), 0x0f);
	uint64_t pfns_at = 0x200000;
	uint32_t pfns[2] = { 0x400, 0x401 };
	memcpy(vdrv__host(&d.v, pfns_at), pfns, sizeof(pfns));
	memset(vdrv__host(&d.v, 0x400000), 0xab, 2 * 4096);
	balloon__hold_discards(d.b, true);
	struct vdrv_seg s = { pfns_at, sizeof(pfns), false };
	vdrv__add_chain(&d.v, BALLOON_VQ_INFLATE, &s, 1);
	vdrv__kick(&d.v, BALLOON_VQ_INFLATE);
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, BALLOON_VQ_INFLATE), 1);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x400), BALLOON_SKIP_BALLOONED);
	T_CHECK_EQ(t, vdrv__host(&d.v, 0x400000)[0], 0xab);       /* held: kept */
	T_CHECK_EQ(t, vdrv__host(&d.v, 0x401000)[0], 0xab);
	uint32_t one = 0x401;
	memcpy(vdrv__host(&d.v, pfns_at), &one, 4);
	s.len = 4;
	vdrv__add_chain(&d.v, BALLOON_VQ_DEFLATE, &s, 1);
	vdrv__kick(&d.v, BALLOON_VQ_DEFLATE);
	balloon__hold_discards(d.b, false);
	T_CHECK_EQ(t, vdrv__host(&d.v, 0x400000)[0], 0);          /* ballooned: discarded */
	T_CHECK_EQ(t, vdrv__host(&d.v, 0x401000)[0], 0xab);       /* the guest's again */
	drv_fini(&d);
}

static void t_malformed(struct t *t)
{
	for (int c = 0; c < BAD_NCASES; c++) {
		struct drv d;
		drv_init(&d);
		T_CHECK_EQ(t, drv_start(&d, ALL_FEATURES), 0x0f);
		uint32_t pfn = 0x500;
		memcpy(vdrv__host(&d.v, 0x200000), &pfn, 4);
		break_ring(&d, (enum bad_case)c);
		if (!(vdrv__status(&d.v) & VIRTIO_STATUS_NEEDS_RESET))
			printf("#   case %d: no NEEDS_RESET\n", c);
		T_CHECK(t, vdrv__status(&d.v) & VIRTIO_STATUS_NEEDS_RESET);
		T_CHECK_EQ(t, vdrv__used_idx(&d.v, BALLOON_VQ_INFLATE), 0);
		T_CHECK_EQ(t, balloon__skip(d.b, 0x500), BALLOON_SKIP_NONE);
		/* stopped: a good buffer is not taken until reset */
		vdrv__kick(&d.v, BALLOON_VQ_INFLATE);
		T_CHECK_EQ(t, vdrv__used_idx(&d.v, BALLOON_VQ_INFLATE), 0);
		/* a reset and a fresh start recover */
		T_CHECK_EQ(t, drv_start(&d, ALL_FEATURES), 0x0f);
		struct vdrv_seg s = { 0x200000, 4, false };
		vdrv__add_chain(&d.v, BALLOON_VQ_INFLATE, &s, 1);
		vdrv__kick(&d.v, BALLOON_VQ_INFLATE);
		T_CHECK_EQ(t, vdrv__used_idx(&d.v, BALLOON_VQ_INFLATE), 1);
		T_CHECK_EQ(t, balloon__skip(d.b, 0x500), BALLOON_SKIP_BALLOONED);
		T_CHECK_EQ(t, d.v.mark_outside, 0);
		drv_fini(&d);
	}
}

static void send_id(struct drv *d, uint32_t id)
{
	memcpy(vdrv__host(&d->v, 0x300000), &id, 4);
	struct vdrv_seg s = { 0x300000, 4, false };
	vdrv__add_chain(&d->v, BALLOON_VQ_FREE_PAGE, &s, 1);
	vdrv__kick(&d->v, BALLOON_VQ_FREE_PAGE);
}

static void send_range(struct drv *d, uint64_t gpa, uint32_t len)
{
	struct vdrv_seg s = { gpa, len, true };
	vdrv__add_chain(&d->v, BALLOON_VQ_FREE_PAGE, &s, 1);
	vdrv__kick(&d->v, BALLOON_VQ_FREE_PAGE);
}

static void t_hints(struct t *t)
{
	struct drv d;
	drv_init(&d);
	T_CHECK_EQ(t, balloon__hint_start(d.b), -ENOTSUP); /* no driver yet */
	T_CHECK_EQ(t, drv_start(&d, ALL_FEATURES & ~(1ull << BALLOON_F_FREE_PAGE_HINT)), 0x0f);
	T_CHECK(t, !balloon__hint_ready(d.b));
	T_CHECK_EQ(t, balloon__hint_start(d.b), -ENOTSUP);
	/* negotiated, but the hint queue left disabled: not ready */
	vdrv__write(&d.v, VIRTIO_PCI_STATUS, 0, 1);
	vdrv__write(&d.v, VIRTIO_PCI_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER, 1);
	vdrv__write(&d.v, VIRTIO_PCI_GF, ALL_FEATURES & 0xffffffff, 4);
	vdrv__write(&d.v, VIRTIO_PCI_GFSELECT, 1, 4);
	vdrv__write(&d.v, VIRTIO_PCI_GF, 1, 4);
	vdrv__write(&d.v, VIRTIO_PCI_STATUS, 0x0b, 1);
	vdrv__enable_queue(&d.v, BALLOON_VQ_INFLATE);
	vdrv__write(&d.v, VIRTIO_PCI_STATUS, 0x0f, 1);
	T_CHECK_EQ(t, vdrv__status(&d.v), 0x0f);
	T_CHECK(t, !balloon__hint_ready(d.b));
	T_CHECK_EQ(t, balloon__hint_start(d.b), -ENOTSUP);
	T_CHECK_EQ(t, drv_start(&d, ALL_FEATURES), 0x0f);
	uint8_t gen = (uint8_t)vdrv__read(&d.v, VIRTIO_PCI_CFG_GEN, 1);
	T_CHECK_EQ(t, balloon__hint_start(d.b), 0);
	uint32_t id = cfg32(&d, 8);
	T_CHECK(t, id >= BALLOON_CMD_ID_MIN);
	T_CHECK_EQ(t, (uint8_t)vdrv__read(&d.v, VIRTIO_PCI_CFG_GEN, 1), (uint8_t)(gen + 1));
	/* a range before the driver echoed the id is ignored */
	send_range(&d, 0x1000000, 0x10000);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x1000), BALLOON_SKIP_NONE);
	/* a stale id does not open the round */
	send_id(&d, id - 1);
	send_range(&d, 0x1000000, 0x10000);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x1000), BALLOON_SKIP_NONE);
	/* the current id does; partial pages at the edges are not hinted */
	send_id(&d, id);
	send_range(&d, 0x1000800, 0x4000);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x1000), BALLOON_SKIP_NONE);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x1001), BALLOON_SKIP_FREE);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x1003), BALLOON_SKIP_FREE);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x1004), BALLOON_SKIP_NONE);
	send_range(&d, 0x2000000, 0x400000);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x2000), BALLOON_SKIP_FREE);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x23ff), BALLOON_SKIP_FREE);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x2400), BALLOON_SKIP_NONE);
	T_CHECK_EQ(t, vdrv__host(&d.v, 0x2000000)[0], 0); /* untouched, not discarded: zero anyway */
	send_id(&d, BALLOON_CMD_ID_STOP);
	T_CHECK_EQ(t, balloon__hint_wait(d.b, 2000, 100, 2000), 3 + 1024);
	send_range(&d, 0x3000000, 0x1000); /* after STOP: ignored */
	T_CHECK_EQ(t, balloon__skip(d.b, 0x3000), BALLOON_SKIP_NONE);
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, BALLOON_VQ_FREE_PAGE), 8);
	balloon__hint_done(d.b);
	T_CHECK_EQ(t, cfg32(&d, 8), BALLOON_CMD_ID_DONE);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x2000), BALLOON_SKIP_NONE);
	/* the next round has a larger id; the old one is stale */
	T_CHECK_EQ(t, balloon__hint_start(d.b), 0);
	T_CHECK(t, cfg32(&d, 8) > id);
	send_id(&d, id);
	send_range(&d, 0x1000000, 0x1000);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x1000), BALLOON_SKIP_NONE);
	/* a hinted page keeps its content and is not marked written */
	send_id(&d, cfg32(&d, 8));
	memset(vdrv__host(&d.v, 0x1000000), 0x5a, 0x2000);
	uint64_t marks0 = d.v.mark_calls;
	send_range(&d, 0x1000000, 0x2000);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x1000), BALLOON_SKIP_FREE);
	T_CHECK_EQ(t, vdrv__host(&d.v, 0x1000000)[0], 0x5a);
	T_CHECK(t, d.v.mark_calls <= marks0 + 2); /* the used ring's entry and index only */
	/* a range outside RAM breaks the ring */
	send_range(&d, RAM_SIZE - 0x1000, 0x2000);
	T_CHECK(t, vdrv__status(&d.v) & VIRTIO_STATUS_NEEDS_RESET);
	balloon__hint_stop(d.b);
	T_CHECK_EQ(t, cfg32(&d, 8), BALLOON_CMD_ID_STOP);
	/* without an answer the wait ends after ack_ms; an echo and silence
	 * end it after quiet_ms */
	T_CHECK_EQ(t, drv_start(&d, ALL_FEATURES), 0x0f);
	T_CHECK_EQ(t, balloon__hint_start(d.b), 0);
	uint64_t t0 = time__now_ms();
	T_CHECK_EQ(t, balloon__hint_wait(d.b, 50, 1000, 5000), 0);
	T_CHECK(t, time__now_ms() - t0 < 1000);
	send_id(&d, cfg32(&d, 8));
	t0 = time__now_ms();
	T_CHECK_EQ(t, balloon__hint_wait(d.b, 5000, 50, 5000), 0);
	T_CHECK(t, time__now_ms() - t0 < 1000);
	T_CHECK_EQ(t, d.v.mark_outside, 0);
	drv_fini(&d);
}

static void t_reporting(struct t *t)
{
	struct drv d;
	drv_init(&d);
	T_CHECK_EQ(t, drv_start(&d, ALL_FEATURES), 0x0f);
	memset(vdrv__host(&d.v, 0x4000000), 0x77, 0x10000);
	struct vdrv_seg s[2] = { { 0x4000000, 0x8000, true }, { 0x4008000, 0x8000, true } };
	uint64_t marks0 = d.v.mark_calls;
	vdrv__add_chain(&d.v, BALLOON_VQ_REPORTING, s, 2);
	vdrv__kick(&d.v, BALLOON_VQ_REPORTING);
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, BALLOON_VQ_REPORTING), 1);
	T_CHECK_EQ(t, vdrv__host(&d.v, 0x4000000)[0], 0);
	T_CHECK_EQ(t, vdrv__host(&d.v, 0x400ffff)[0], 0);
	T_CHECK(t, d.v.mark_calls >= marks0 + 4);
	struct balloon_stats st;
	balloon__get_stats(d.b, &st);
	T_CHECK_EQ(t, st.reported_pages, 16);
	T_CHECK_EQ(t, d.v.mark_outside, 0);
	drv_fini(&d);
}

/* Queue numbers follow the negotiated features with no gap: reporting is
 * queue 3 without hinting, 2 without statsq and hinting; a device that
 * does not offer a feature refuses it.  Each reported range is dropped
 * on the queue its layout gives, and a kick of a queue past the layout
 * does nothing. */
static void t_queue_layout(struct t *t)
{
	const struct { bool no_hint, no_rep; uint64_t feat; int rep_q, hint_q; } c[] = {
		{ false, false, ALL_FEATURES, 4, 3 },
		{ true, false, 1ull << 32 | 1ull << BALLOON_F_STATS_VQ | 1ull << BALLOON_F_REPORTING, 3, -1 },
		{ false, false, 1ull << 32 | 1ull << BALLOON_F_REPORTING, 2, -1 },
		{ false, true, 1ull << 32 | 1ull << BALLOON_F_STATS_VQ | 1ull << BALLOON_F_FREE_PAGE_HINT,
		  -1, 3 },
	};
	for (unsigned i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		struct drv d;
		drv_init_conf(&d, RAM_SIZE, c[i].no_hint, c[i].no_rep);
		T_CHECK_EQ(t, drv_start(&d, c[i].feat), 0x0f);
		T_CHECK_EQ(t, balloon__queue(d.b, BALLOON_VQ_REPORTING), c[i].rep_q);
		T_CHECK_EQ(t, balloon__queue(d.b, BALLOON_VQ_FREE_PAGE), c[i].hint_q);
		T_CHECK_EQ(t, balloon__role(d.b, 1), BALLOON_VQ_DEFLATE);
		if (c[i].rep_q >= 0) {
			memset(vdrv__host(&d.v, 0x4000000), 0x77, 0x8000);
			struct vdrv_seg s = { 0x4000000, 0x8000, true };
			vdrv__add_chain(&d.v, (unsigned)c[i].rep_q, &s, 1);
			vdrv__kick(&d.v, (unsigned)c[i].rep_q);
			T_CHECK_EQ(t, vdrv__used_idx(&d.v, (unsigned)c[i].rep_q), 1);
			T_CHECK_EQ(t, vdrv__host(&d.v, 0x4000000)[0], 0);
			T_CHECK_EQ(t, balloon__role(d.b, (unsigned)c[i].rep_q), BALLOON_VQ_REPORTING);
		}
		/* a queue past the layout: its buffers stay with the device */
		unsigned past = (unsigned)(c[i].rep_q > c[i].hint_q ? c[i].rep_q : c[i].hint_q) + 1;
		if (past < BALLOON_NR_VQS) {
			struct vdrv_seg s = { 0x4000000, 0x1000, true };
			vdrv__add_chain(&d.v, past, &s, 1);
			vdrv__kick(&d.v, past);
			T_CHECK_EQ(t, vdrv__used_idx(&d.v, past), 0);
			T_CHECK_EQ(t, balloon__role(d.b, past), -1);
		}
		drv_fini(&d);
	}
	/* not offered: refused at FEATURES_OK */
	struct drv d;
	drv_init_conf(&d, RAM_SIZE, true, true);
	T_CHECK(t, !(drv_start(&d, ALL_FEATURES) & VIRTIO_STATUS_FEATURES_OK));
	drv_fini(&d);
}

struct saved {
	uint8_t buf[256 << 10];
	size_t len;
	uint32_t id;
};

static int put(void *ctx, uint32_t id, uint32_t version, uint32_t instance, const void *data, size_t len)
{
	struct saved *s = ctx;
	if (version != STATE_VERSION || instance || len > sizeof(s->buf))
		return -EINVAL;
	memcpy(s->buf, data, len);
	s->len = len;
	s->id = id;
	return 0;
}

static void t_state(struct t *t)
{
	struct drv a, b;
	drv_init(&a);
	drv_init(&b);
	T_CHECK_EQ(t, drv_start(&a, ALL_FEATURES), 0x0f);
	uint32_t pfns[3] = { 0x600, 0x601, 0x700 };
	memcpy(vdrv__host(&a.v, 0x200000), pfns, sizeof(pfns));
	struct vdrv_seg s = { 0x200000, sizeof(pfns), false };
	vdrv__add_chain(&a.v, BALLOON_VQ_INFLATE, &s, 1);
	vdrv__kick(&a.v, BALLOON_VQ_INFLATE);
	vdrv__write(&a.v, VIRTIO_PCI_DEVCFG + 4, 3, 4);
	T_CHECK_EQ(t, balloon__set_target(a.b, RAM_SIZE - 3 * 4096), 0);
	struct saved *sv = calloc(1, sizeof(*sv));
	T_CHECK_EQ(t, balloon__save(a.b, put, sv), 0);
	T_CHECK_EQ(t, sv->id, STATE_DEV_VIRTIO);
	/* the destination's RAM carries the rings (migration copies it) */
	memcpy(vdrv__host(&b.v, QBASE), vdrv__host(&a.v, QBASE), BALLOON_NR_VQS * QSTRIDE);
	char why[128] = "";
	T_CHECK_EQ(t, balloon__load(b.b, sv->buf, sv->len, why, sizeof(why)), 0);
	T_CHECK_EQ(t, balloon__skip(b.b, 0x600), BALLOON_SKIP_BALLOONED);
	T_CHECK_EQ(t, balloon__skip(b.b, 0x601), BALLOON_SKIP_BALLOONED);
	T_CHECK_EQ(t, balloon__skip(b.b, 0x602), BALLOON_SKIP_NONE);
	T_CHECK_EQ(t, balloon__skip(b.b, 0x700), BALLOON_SKIP_BALLOONED);
	T_CHECK_EQ(t, balloon__actual_bytes(b.b), RAM_SIZE - 3 * 4096);
	T_CHECK_EQ(t, vdrv__status(&b.v), 0x0f);
	T_CHECK_EQ(t, cfg32(&b, 0), 3);
	/* the destination continues the rings where the source stopped */
	b.v.avail_idx[BALLOON_VQ_DEFLATE] = a.v.avail_idx[BALLOON_VQ_DEFLATE];
	b.v.next_desc[BALLOON_VQ_DEFLATE] = a.v.next_desc[BALLOON_VQ_DEFLATE];
	uint32_t pfn = 0x700;
	memcpy(vdrv__host(&b.v, 0x200000), &pfn, 4);
	s.len = 4;
	vdrv__add_chain(&b.v, BALLOON_VQ_DEFLATE, &s, 1);
	vdrv__kick(&b.v, BALLOON_VQ_DEFLATE);
	T_CHECK_EQ(t, vdrv__used_idx(&b.v, BALLOON_VQ_DEFLATE), 1);
	T_CHECK_EQ(t, balloon__skip(b.b, 0x700), BALLOON_SKIP_NONE);
	/* corrupted sections are refused */
	T_CHECK(t, balloon__load(b.b, sv->buf, sv->len - 1, why, sizeof(why)) < 0);
	T_CHECK(t, balloon__load(b.b, sv->buf, 10, why, sizeof(why)) < 0);
	uint8_t *bad = malloc(sv->len);
	for (size_t off = 0; off < sv->len; off += 7) {
		memcpy(bad, sv->buf, sv->len);
		bad[off] ^= 0xa5;
		int rc = balloon__load(b.b, bad, sv->len, why, sizeof(why));
		(void)rc; /* may be accepted (a harmless byte) or refused; never a crash */
	}
	free(bad);
	free(sv);
	T_CHECK_EQ(t, a.v.mark_outside + b.v.mark_outside, 0);
	drv_fini(&a);
	drv_fini(&b);
}

/* A balloon fragmented into 40,000 one-page ranges (a guest's doing): its
 * state goes as a bitmap, small, and comes back frame for frame.  (As a
 * range list it was 320 KB, over the old fixed cap: every migration of
 * such a guest failed at switchover.) */
static void t_state_fragmented(struct t *t)
{
	struct drv a, b;
	const size_t n = 40000, first = 1024;
	drv_init_size(&a, 512ull << 20);
	drv_init_size(&b, 512ull << 20);
	T_CHECK_EQ(t, drv_start(&a, ALL_FEATURES), 0x0f);
	for (size_t i = 0; i < n; i++)
		bitmap__set(&a.b->ballooned, first + 2 * i);
	a.b->stats.ballooned = n;
	struct saved *sv = calloc(1, sizeof(*sv));
	T_CHECK_EQ(t, balloon__save(a.b, put, sv), 0);
	size_t bitmap_bytes = a.b->ballooned.nbits / 8;
	T_CHECK(t, sv->len > bitmap_bytes && sv->len < bitmap_bytes + 1024);
	memcpy(vdrv__host(&b.v, QBASE), vdrv__host(&a.v, QBASE), BALLOON_NR_VQS * QSTRIDE);
	char why[128] = "";
	T_CHECK_EQ(t, balloon__load(b.b, sv->buf, sv->len, why, sizeof(why)), 0);
	size_t differ = 0;
	for (size_t i = 0; i < a.b->ballooned.nbits; i++)
		differ += bitmap__test(&a.b->ballooned, i) != bitmap__test(&b.b->ballooned, i);
	T_CHECK_EQ(t, differ, 0);
	T_CHECK_EQ(t, b.b->stats.ballooned, n);
	T_CHECK_EQ(t, balloon__skip(b.b, first), BALLOON_SKIP_BALLOONED);
	T_CHECK_EQ(t, balloon__skip(b.b, first + 1), BALLOON_SKIP_NONE);
	/* a bitmap of the wrong size is refused */
	T_CHECK(t, balloon__load(b.b, sv->buf, sv->len - 8, why, sizeof(why)) < 0);
	T_CHECK(t, strstr(why, "bitmap") != NULL);
	free(sv);
	drv_fini(&a);
	drv_fini(&b);
}

/* A driver that wrote feature bits the device does not offer (refused at
 * FEATURES_OK) is still migratable: its state loads back.  (Found by
 * tests/fuzz/fuzz_virtio.c: the loader refused any such state.) */
static void t_state_refused_features(struct t *t)
{
	struct drv a, b;
	drv_init(&a);
	drv_init(&b);
	T_CHECK(t, !(drv_start(&a, ALL_FEATURES | 1ull << 40) & VIRTIO_STATUS_FEATURES_OK));
	struct saved *sv = calloc(1, sizeof(*sv));
	T_CHECK_EQ(t, balloon__save(a.b, put, sv), 0);
	char why[128] = "";
	T_CHECK_EQ(t, balloon__load(b.b, sv->buf, sv->len, why, sizeof(why)), 0);
	T_CHECK(t, !(vdrv__status(&b.v) & VIRTIO_STATUS_FEATURES_OK));
	/* with FEATURES_OK, bits the device does not offer are refused */
	T_CHECK_EQ(t, drv_start(&a, ALL_FEATURES), 0x0f);
	T_CHECK_EQ(t, balloon__save(a.b, put, sv), 0);
	sv->buf[8 + 5] |= 1;    /* driver features (the transport's first u64) bit 40 */
	T_CHECK(t, balloon__load(b.b, sv->buf, sv->len, why, sizeof(why)) < 0);
	T_CHECK(t, strstr(why, "features") != NULL);
	free(sv);
	drv_fini(&a);
	drv_fini(&b);
}

/* A post-copy destination whose link broke: a thread serving the inflate
 * queue holds the device lock while it waits, in userfaultfd, for the
 * used ring's page.  QMP's balloon calls (query-balloon's reads and
 * `balloon`) must return at once, and the config change must reach the
 * driver's interrupt line; the queue completes once the page is there. */
struct qmp_calls {
	struct drv *d;
	struct balloon_stats st;
	uint64_t actual;
	int rc;
	atomic_bool done;
};

static void *kick_inflate(void *arg)
{
	struct drv *d = arg;
	vdrv__kick(&d->v, BALLOON_VQ_INFLATE);
	return NULL;
}

static void *qmp_calls(void *arg)
{
	struct qmp_calls *c = arg;
	balloon__get_stats(c->d->b, &c->st);
	c->actual = balloon__actual_bytes(c->d->b);
	c->rc = balloon__set_target(c->d->b, RAM_SIZE / 2);
	atomic_store(&c->done, true);
	return NULL;
}

/* Registers the page at gpa as missing; waits (5 s at most) for the first
 * fault on it.  The userfaultfd, or -1. */
static int missing_page_fault(struct drv *d, uint64_t gpa, pthread_t *th, void *(*fn)(void *))
{
	uint8_t *h = vdrv__host(&d->v, gpa);
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	struct uffdio_api api = { .api = UFFD_API };
	struct uffdio_register reg = { .range = { (uint64_t)(uintptr_t)h, 4096 },
				       .mode = UFFDIO_REGISTER_MODE_MISSING };
	if (fd < 0 || ioctl(fd, UFFDIO_API, &api) || madvise(h, 4096, MADV_DONTNEED) ||
	    ioctl(fd, UFFDIO_REGISTER, &reg) || pthread_create(th, NULL, fn, d)) {
		fprintf(stderr, "# userfaultfd: %s\n", strerror(errno));
		abort();
	}
	struct pollfd p = { fd, POLLIN, 0 };
	struct uffd_msg msg;
	if (poll(&p, 1, 5000) != 1 || read(fd, &msg, sizeof(msg)) != sizeof(msg) ||
	    msg.event != UFFD_EVENT_PAGEFAULT ||
	    (msg.arg.pagefault.address & ~4095ull) != (uint64_t)(uintptr_t)h) {
		fprintf(stderr, "# no fault on the page at 0x%llx\n", (unsigned long long)gpa);
		abort();
	}
	return fd;
}

static void t_qmp_never_waits(struct t *t)
{
	struct drv d;
	drv_init(&d);
	T_CHECK_EQ(t, drv_start(&d, ALL_FEATURES), 0x0f);
	uint32_t pfn = 0x400;
	memcpy(vdrv__host(&d.v, 0x200000), &pfn, 4);
	struct vdrv_seg s = { 0x200000, 4, false };
	vdrv__add_chain(&d.v, BALLOON_VQ_INFLATE, &s, 1);
	pthread_t kicker, q;
	int fd = missing_page_fault(&d, vdrv__used_gpa(&d.v, BALLOON_VQ_INFLATE), &kicker,
				    kick_inflate);
	struct qmp_calls c = { .d = &d };
	if (pthread_create(&q, NULL, qmp_calls, &c))
		abort();
	for (int i = 0; i < 200 && !atomic_load(&c.done); i++)
		usleep(10000);
	bool done = atomic_load(&c.done);
	int level = d.v.irq_level;
	/* the page arrives: the queue's work completes */
	uint8_t *used = vdrv__host(&d.v, vdrv__used_gpa(&d.v, BALLOON_VQ_INFLATE));
	struct uffdio_zeropage z = { .range = { (uint64_t)(uintptr_t)used, 4096 } };
	T_CHECK_EQ(t, ioctl(fd, UFFDIO_ZEROPAGE, &z), 0);
	pthread_join(kicker, NULL);
	pthread_join(q, NULL);
	close(fd);
	T_CHECK(t, done);                   /* returned within 2 s, lock still held */
	T_CHECK_EQ(t, c.rc, 0);
	T_CHECK_EQ(t, c.actual, RAM_SIZE);
	T_CHECK_EQ(t, level, 1);            /* config interrupt while the lock was held */
	T_CHECK_EQ(t, vdrv__used_idx(&d.v, BALLOON_VQ_INFLATE), 1);
	T_CHECK_EQ(t, cfg32(&d, 0), (uint32_t)((RAM_SIZE / 2) >> 12));
	T_CHECK_EQ(t, vdrv__read(&d.v, VIRTIO_PCI_ISR, 1) & VIRTIO_ISR_CONFIG, VIRTIO_ISR_CONFIG);
	T_CHECK_EQ(t, balloon__skip(d.b, 0x400), BALLOON_SKIP_BALLOONED);
	drv_fini(&d);
}

int main(void)
{
	struct t t = { 0 };
	T_RUN(&t, t_pci_config);
	T_RUN(&t, t_bar_move);
	T_RUN(&t, t_features);
	T_RUN(&t, t_inflate_deflate);
	T_RUN(&t, t_hold_discards);
	T_RUN(&t, t_malformed);
	T_RUN(&t, t_hints);
	T_RUN(&t, t_reporting);
	T_RUN(&t, t_state);
	T_RUN(&t, t_state_fragmented);
	T_RUN(&t, t_state_refused_features);
	T_RUN(&t, t_queue_layout);
	T_RUN(&t, t_qmp_never_waits);
	return T_DONE(&t);
}
