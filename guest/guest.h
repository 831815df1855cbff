/* Ring-3 side of the kmig test guest: shared declarations. */
#ifndef KMIG_GUEST_H
#define KMIG_GUEST_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include "layout.h"

typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;

#define PAGE_SIZE 4096UL
#define PAGES_PER_MIB 256UL
#define PAGES_PER_GIB 262144UL

/* ---- traps into ring 0 (see docs/guest.md, "Trap ABI") ---- */
static inline u64 trap(u64 fn, u64 a, u64 b)
{
	register u64 rax __asm__("rax") = KMIG_MAGIC;
	__asm__ volatile("ud2" : "+r"(rax), "+D"(fn), "+S"(a), "+d"(b) : : "rcx", "memory");
	return rax;
}

static inline u64 rdtsc(void)
{
	u32 lo, hi;
	__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
	return ((u64)hi << 32) | lo;
}

static inline void cpu_relax(void)
{
	__asm__ volatile("pause" ::: "memory");
}

static inline void cpuid(u32 leaf, u32 sub, u32 *a, u32 *b, u32 *c, u32 *d)
{
	__asm__ volatile("cpuid" : "=a"(*a), "=b"(*b), "=c"(*c), "=d"(*d) : "a"(leaf), "c"(sub));
}

__attribute__((noreturn)) static inline void halt_cpu(void)
{
	for (;;)
		trap(TRAP_HALT, 0, 0);
}

/* ---- configuration (command line) ---- */
enum workload { WL_STRESS, WL_IDLE, WL_FILL_FREE, WL_VERIFY };
enum crash { CRASH_NONE, CRASH_TRIPLE, CRASH_EMUL, CRASH_UD, CRASH_RESET };
enum balloon_test { BT_NONE, BT_NOKICK, BT_REBAR, BT_FLOOD };

struct cfg {
	enum workload workload;
	u64 mb;
	u64 cpus;
	u64 report_ms;
	u64 tsc_khz;		/* 0: not given */
	u64 exit_ms;		/* 0: never */
	u64 corrupt_round;	/* 0: never */
	enum crash crash;
	u64 balloon;		/* 1: bind a virtio-balloon device */
	u64 balloon_hint;	/* free page hinting (default 1) */
	u64 balloon_report;	/* free page reporting (default 0) */
	enum balloon_test balloon_test;	/* test hooks of the driver */
	u64 refill_ms;		/* fill-free: reuse freed memory every N ms (0: never) */
	u64 refill_mb;		/* fill-free: MiB per refill generation */
	u64 refill_keep;	/* fill-free: generations held (and re-checked), 1..8 */
	u64 corrupt_refill;	/* fill-free: skip one page's write in this generation */
	u64 verify_precheck;	/* verify: check each page before rewriting it (default 1) */
	u64 fill_check;		/* fill-free: fill all free memory; hinted pages must come back untouched */
	u64 fill_random;	/* fill-free: words that do not compress (a 64-bit mix) */
	u64 touch;		/* 1: a zero, 2: a one written to every free page first */
	u64 net;		/* 1: bind a virtio-net device */
	u32 ip;			/* the guest's IPv4 address, host byte order (default 10.77.0.10) */
	u64 udp_port;		/* the UDP echo responder's port (default 7777) */
	u64 net_send;		/* send numbered datagrams at this many per second (0: never) */
	u32 net_dst;		/* ... to this IPv4 address (host byte order) */
	u64 net_dport;		/* ... and UDP port (default 7777) */
	u64 disk;		/* 1: bind a virtio-blk device and run the disk workload */
	u64 disk_mb;		/* MiB of the disk the workload uses (0: 16, or the capacity) */
	u64 disk_rate;		/* blocks rewritten per second (0: as fast as possible) */
	u64 disk_bs;		/* block size in bytes (default 4096) */
	u64 disk_flush;		/* a FLUSH after every N writes (default 16; 0: never) */
};
extern struct cfg cfg;

/* ---- memory: usable RAM ranges above the image, page aligned ---- */
#define MAX_RANGES 32
struct range {
	u64 base, end;
};
struct seg {			/* pages [base, base + npages * 4096) */
	u64 base, npages;
};
#define MAX_SEGS 8
struct share {			/* one vCPU's part of the workload memory */
	struct seg seg[MAX_SEGS];
	int nseg;
	u64 npages;
	u32 *gen;		/* verify: expected generation per page */
};

extern struct range ram[MAX_RANGES];
extern int nram;
extern struct share shares[MAX_CPUS];
extern u64 ncpus;		/* CPUs running */

int take_pages(u64 npages, struct share *s);
void *take_contig(u64 npages);
int take_rest(struct range *out, int max);	/* all RAM not yet taken */
extern u64 usable_pages;

/* ---- time ---- */
extern u64 tsc_khz, tsc0;
static inline u64 cycles_to_ms(u64 c) { return c / tsc_khz; }
static inline u64 now_ms(void) { return cycles_to_ms(rdtsc() - tsc0); }
void delay_us(u64 us);

/* ---- console ---- */
void con_write(const char *s, u64 n);
void kprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int kvsnprintf(char *buf, int size, const char *fmt, va_list ap);

/* ---- misc ---- */
void *memset(void *d, int c, size_t n);
void *memcpy(void *d, const void *s, size_t n);
void *memmove(void *d, const void *s, size_t n);
int memcmp(const void *a, const void *b, size_t n);
size_t strlen(const char *s);

/* stop flag: set by exit_ms; workloads poll it and halt */
extern volatile int g_stop;
extern u64 exit_at;		/* TSC value of exit_ms, ~0 if none */
void poll_exit(int cpu);	/* halts if stopping; cpu 0 powers off at exit_at */

/* workloads (each runs forever on its CPU) */
void stress_run(int cpu);
void idle_run(int cpu);
void fill_free_run(int cpu);
void verify_run(int cpu);
int verify_prepare(void);	/* carves expectation tables; 0 or -1 */

/* page allocator over the RAM the workload did not take (fill-free, the
 * balloon driver) */
void palloc_init(void);		/* once; later calls do nothing */
u64 palloc_alloc(void);		/* one 4 KiB page, 0 when empty */
u64 palloc_alloc_block(u64 max, u64 *len);	/* up to max contiguous bytes */
void palloc_free(u64 page);
void palloc_free_range(u64 base, u64 len);
u64 palloc_take_unreported_chunk(void);	/* a free 2 MiB chunk, 2 MiB aligned */
void palloc_free_reported_chunk(u64 base);
u64 palloc_free_pages(void);
void palloc_mark_hinted(u64 base, u64 len);	/* the balloon hinted this block */
int palloc_was_hinted(u64 addr);
int fill_free_intact(u64 page, u64 *word, u64 *got);	/* page still holds fill-free's fill */	/* addr's 2 MiB chunk was wholly hinted since boot */
int palloc_extents(struct range *out, int max);
void touch_free(void);

/* virtio-balloon driver (balloon=1), run from cpu 0's loops */
void balloon_init(void);
void balloon_poll(void);
extern int balloon_on;

/* virtio-net driver (net=1), run from cpu 0's loops: net_init() before the
 * page allocator takes the rest of RAM, net_poll() as often as the
 * workload can (it only reads memory unless there is work), net_report()
 * on the workload's periodic report (one "net rx=..." line) */
void net_init(void);
void net_poll(void);
void net_report(void);
extern int net_on;

/* virtio-blk driver and the disk workload (disk=1), run from cpu 0's loops
 * like net: blk_init() before the page allocator takes the rest of RAM,
 * blk_poll() as often as the workload can (it prints its own "disk ..."
 * report every report_ms) */
void blk_init(void);
void blk_poll(void);
extern int blk_on;

/* every polled driver of cpu 0 (each only reads memory unless it has work) */
static inline void drivers_poll(void)
{
	net_poll();
	blk_poll();
}

#endif
