/*
 * Ring-3 main program of the kmig test guest: reads the PVH start info,
 * parses the command line, finds the TSC frequency, carves the workload
 * memory, starts the APs and runs the workload on every CPU.
 */
#include "guest.h"

#define HVM_START_MAGIC 0x336ec578
#define E820_RAM 1

struct hvm_start_info {
	u32 magic, version, flags, nr_modules;
	u64 modlist_paddr, cmdline_paddr, rsdp_paddr, memmap_paddr;
	u32 memmap_entries, reserved;
};
struct hvm_memmap_entry {
	u64 addr, size;
	u32 type, reserved;
};

extern u32 pvh_start_info, ap_boot_cpu;
extern char __image_end[], tramp_start[], tramp_end[];

struct cfg cfg = { .workload = WL_STRESS, .mb = 64, .cpus = 1, .report_ms = 1000, .balloon_hint = 1,
		   .refill_mb = 32, .refill_keep = 1, .verify_precheck = 1,
		   .ip = 0x0a4d000a, .udp_port = 7777, .net_dport = 7777, .disk_bs = 4096,
		   .disk_flush = 16 };
u64 tsc_khz, tsc0;
struct range ram[MAX_RANGES];
int nram;
struct share shares[MAX_CPUS];
u64 ncpus = 1;
volatile int g_stop;
static volatile int cpu_online[MAX_CPUS];
static volatile int g_go;
static char cmdline[1024];
u64 usable_pages;

/* ---------------- command line ---------------- */

static int parse_u64(const char *s, u64 *out)
{
	u64 v = 0;
	if (!*s)
		return -1;
	for (; *s; s++) {
		if (*s < '0' || *s > '9')
			return -1;
		v = v * 10 + (u64)(*s - '0');
	}
	*out = v;
	return 0;
}

static int streq(const char *a, const char *b)
{
	while (*a && *a == *b)
		a++, b++;
	return *a == *b;
}

/* A.B.C.D, each 0..255, into host byte order. */
static int parse_ip(const char *s, u32 *out)
{
	u32 v = 0;
	for (int i = 0; i < 4; i++) {
		u32 part = 0;
		int digits = 0;
		for (; *s >= '0' && *s <= '9' && digits < 4; s++, digits++)
			part = part * 10 + (u32)(*s - '0');
		if (!digits || part > 255 || *s != (i < 3 ? '.' : 0))
			return -1;
		if (i < 3)
			s++;
		v = v << 8 | part;
	}
	*out = v;
	return 0;
}

static void parse_option(char *key)
{
	char *val = key;
	while (*val && *val != '=')
		val++;
	if (*val != '=') {
		kprintf("kmig-guest warning: ignoring option \"%s\" (no value)\n", key);
		return;
	}
	*val++ = 0;
	u64 *num = 0;
	if (streq(key, "workload")) {
		if (streq(val, "stress")) cfg.workload = WL_STRESS;
		else if (streq(val, "idle")) cfg.workload = WL_IDLE;
		else if (streq(val, "fill-free")) cfg.workload = WL_FILL_FREE;
		else if (streq(val, "verify")) cfg.workload = WL_VERIFY;
		else if (streq(val, "disk")) {	/* idle, with the disk workload */
			cfg.workload = WL_IDLE;
			cfg.disk = 1;
		}
		else kprintf("kmig-guest warning: unknown workload \"%s\", using stress\n", val);
		return;
	}
	if (streq(key, "crash")) {
		if (streq(val, "triple")) cfg.crash = CRASH_TRIPLE;
		else if (streq(val, "emul")) cfg.crash = CRASH_EMUL;
		else if (streq(val, "ud")) cfg.crash = CRASH_UD;
		else if (streq(val, "reset")) cfg.crash = CRASH_RESET;
		else kprintf("kmig-guest warning: unknown crash \"%s\", ignored\n", val);
		return;
	}
	if (streq(key, "balloon_test")) {
		if (streq(val, "nokick")) cfg.balloon_test = BT_NOKICK;
		else if (streq(val, "rebar")) cfg.balloon_test = BT_REBAR;
		else if (streq(val, "flood")) cfg.balloon_test = BT_FLOOD;
		else kprintf("kmig-guest warning: unknown balloon_test \"%s\", ignored\n", val);
		return;
	}
	if (streq(key, "ip") || streq(key, "net_dst")) {
		if (parse_ip(val, streq(key, "ip") ? &cfg.ip : &cfg.net_dst))
			kprintf("kmig-guest warning: bad address in %s=%s, ignored\n", key, val);
		return;
	}
	if (streq(key, "mb")) num = &cfg.mb;
	else if (streq(key, "cpus")) num = &cfg.cpus;
	else if (streq(key, "report_ms")) num = &cfg.report_ms;
	else if (streq(key, "tsc_khz")) num = &cfg.tsc_khz;
	else if (streq(key, "exit_ms")) num = &cfg.exit_ms;
	else if (streq(key, "corrupt_round")) num = &cfg.corrupt_round;
	else if (streq(key, "balloon")) num = &cfg.balloon;
	else if (streq(key, "balloon_hint")) num = &cfg.balloon_hint;
	else if (streq(key, "balloon_report")) num = &cfg.balloon_report;
	else if (streq(key, "refill_ms")) num = &cfg.refill_ms;
	else if (streq(key, "refill_mb")) num = &cfg.refill_mb;
	else if (streq(key, "refill_keep")) num = &cfg.refill_keep;
	else if (streq(key, "corrupt_refill")) num = &cfg.corrupt_refill;
	else if (streq(key, "fill_check")) num = &cfg.fill_check;
	else if (streq(key, "fill_random")) num = &cfg.fill_random;
	else if (streq(key, "touch")) num = &cfg.touch;
	else if (streq(key, "verify_precheck")) num = &cfg.verify_precheck;
	else if (streq(key, "net")) num = &cfg.net;
	else if (streq(key, "udp_port")) num = &cfg.udp_port;
	else if (streq(key, "net_send")) num = &cfg.net_send;
	else if (streq(key, "net_dport")) num = &cfg.net_dport;
	else if (streq(key, "disk")) num = &cfg.disk;
	else if (streq(key, "disk_mb")) num = &cfg.disk_mb;
	else if (streq(key, "disk_rate")) num = &cfg.disk_rate;
	else if (streq(key, "disk_bs")) num = &cfg.disk_bs;
	else if (streq(key, "disk_flush")) num = &cfg.disk_flush;
	if (!num) {
		kprintf("kmig-guest warning: unknown option \"%s\", ignored\n", key);
		return;
	}
	if (parse_u64(val, num))
		kprintf("kmig-guest warning: bad number in %s=%s, ignored\n", key, val);
}

static void parse_cmdline(void)
{
	char *p = cmdline;
	while (*p) {
		while (*p == ' ' || *p == '\t' || *p == '\n')
			p++;
		if (!*p)
			break;
		char *tok = p;
		while (*p && *p != ' ' && *p != '\t' && *p != '\n')
			p++;
		if (*p)
			*p++ = 0;
		parse_option(tok);
	}
	if (cfg.cpus < 1)
		cfg.cpus = 1;
	if (cfg.cpus > MAX_CPUS) {
		kprintf("kmig-guest warning: cpus=%lu > %d, using %d\n", cfg.cpus, MAX_CPUS, MAX_CPUS);
		cfg.cpus = MAX_CPUS;
	}
	if (cfg.report_ms < 1)
		cfg.report_ms = 1;
	if (cfg.udp_port > 65535 || cfg.net_dport > 65535) {
		kprintf("kmig-guest warning: udp_port/net_dport above 65535, using 7777\n");
		cfg.udp_port = cfg.udp_port > 65535 ? 7777 : cfg.udp_port;
		cfg.net_dport = cfg.net_dport > 65535 ? 7777 : cfg.net_dport;
	}
	if (cfg.net_send && !cfg.net_dst) {
		kprintf("kmig-guest warning: net_send without net_dst, not sending\n");
		cfg.net_send = 0;
	}
}

/* ---------------- TSC frequency ---------------- */

static u64 pit_calibrate(void)
{
	const u64 count = 59659;	/* 50 ms of the 1.193182 MHz PIT */
	u8 p61 = (u8)trap(TRAP_IN8, 0x61, 0);

	trap(TRAP_OUT8, 0x61, (p61 & ~0x02) | 0x01);	/* gate ch2 on, speaker off */
	trap(TRAP_OUT8, 0x43, 0xb0);			/* ch2, lo/hi, mode 0 */
	trap(TRAP_OUT8, 0x42, count & 0xff);
	trap(TRAP_OUT8, 0x42, count >> 8);
	u64 t0 = rdtsc(), t1;
	for (;;) {
		t1 = rdtsc();
		if (trap(TRAP_IN8, 0x61, 0) & 0x20)
			break;
		if (t1 - t0 > (1ULL << 32))	/* 50 ms would mean an 86 GHz TSC */
			return 0;
	}
	trap(TRAP_OUT8, 0x61, p61);
	return (t1 - t0) * 1193182ULL / (count * 1000ULL);
}

/* KVM's pvclock: the host publishes tsc_to_system_mul/tsc_shift in a page
 * we name with MSR_KVM_SYSTEM_TIME_NEW; the page is released right after. */
#define MSR_KVM_SYSTEM_TIME_NEW 0x4b564d01
struct pvclock {
	u32 version, pad0;
	u64 tsc_timestamp, system_time;
	u32 mul;
	int8_t shift;
	u8 flags, pad[2];
};
static struct pvclock kvmclock __attribute__((aligned(64)));

static u64 kvmclock_khz(void)
{
	u32 a, b, c, d;
	cpuid(0x40000000, 0, &a, &b, &c, &d);
	if (a < 0x40000001 || b != 0x4b4d564b || c != 0x564b4d56 || d != 0x4d)	/* "KVMKVMKVM" */
		return 0;
	cpuid(0x40000001, 0, &a, &b, &c, &d);
	if (!(a & (1u << 3)))		/* KVM_FEATURE_CLOCKSOURCE2 */
		return 0;
	volatile struct pvclock *pv = &kvmclock;
	trap(TRAP_WRMSR, MSR_KVM_SYSTEM_TIME_NEW, (u64)&kvmclock | 1);
	u32 mul = 0, v;
	int shift = 0;
	for (int tries = 0; tries < 1000000 && !mul; tries++) {
		v = pv->version;
		if (v & 1)
			continue;
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		mul = pv->mul;
		shift = pv->shift;
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (pv->version != v)
			mul = 0;
	}
	trap(TRAP_WRMSR, MSR_KVM_SYSTEM_TIME_NEW, 0);
	if (!mul)
		return 0;
	u64 khz = (1000000ULL << 32) / mul;
	return shift < 0 ? khz << -shift : khz >> shift;
}

static void find_tsc_khz(void)
{
	u32 a, b, c, d, max;
	const char *src = "cmdline";

	tsc_khz = cfg.tsc_khz;
	cpuid(0, 0, &max, &b, &c, &d);
	if (!tsc_khz && max >= 0x15) {
		cpuid(0x15, 0, &a, &b, &c, &d);
		if (a && b && c) {
			tsc_khz = (u64)c * b / a / 1000;
			src = "cpuid15";
		}
	}
	if (!tsc_khz && max >= 0x16) {
		cpuid(0x16, 0, &a, &b, &c, &d);
		if (a) {
			tsc_khz = (u64)a * 1000;
			src = "cpuid16";
		}
	}
	if (!tsc_khz) {
		cpuid(0x40000000, 0, &a, &b, &c, &d);
		if (a >= 0x40000010 && a < 0x40010000) {
			cpuid(0x40000010, 0, &a, &b, &c, &d);
			if (a) {
				tsc_khz = a;
				src = "hypervisor";
			}
		}
	}
	if (!tsc_khz) {
		tsc_khz = kvmclock_khz();
		src = "kvmclock";
	}
	if (!tsc_khz) {
		kprintf("kmig-guest tsc: no frequency from cmdline, cpuid or kvmclock, calibrating against the PIT\n");
		tsc_khz = pit_calibrate();
		src = "pit";
		if (tsc_khz < 100000)		/* no PIT (port 0x61 reads garbage) */
			tsc_khz = 0;
	}
	if (!tsc_khz) {
		kprintf("kmig-guest tsc: PIT calibration failed, assuming 2 GHz\n");
		tsc_khz = 2000000;
		src = "default";
	}
	kprintf("kmig-guest tsc_khz=%lu source=%s\n", tsc_khz, src);
}

/* ---------------- memory ---------------- */

static int read_start_info(void)
{
	const struct hvm_start_info *si = (const void *)(u64)pvh_start_info;
	u64 lo = ((u64)__image_end + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1);

	if (!si || si->magic != HVM_START_MAGIC)
		return -1;
	if (si->cmdline_paddr) {
		const char *c = (const char *)si->cmdline_paddr;
		int i;
		for (i = 0; i < (int)sizeof(cmdline) - 1 && c[i]; i++)
			cmdline[i] = c[i];
		cmdline[i] = 0;
	}
	if (si->version < 1 || !si->memmap_paddr)
		return -2;
	const struct hvm_memmap_entry *e = (const void *)si->memmap_paddr;
	for (u32 i = 0; i < si->memmap_entries && nram < MAX_RANGES; i++) {
		if (e[i].type != E820_RAM)
			continue;
		u64 b = (e[i].addr + PAGE_SIZE - 1) & ~(PAGE_SIZE - 1);
		u64 end = (e[i].addr + e[i].size) & ~(PAGE_SIZE - 1);
		if (b < lo)
			b = lo;
		if (end > (64ULL << 30))	/* the identity map covers 64 GiB */
			end = 64ULL << 30;
		if (end <= b)
			continue;
		ram[nram].base = b;
		ram[nram].end = end;
		usable_pages += (end - b) / PAGE_SIZE;
		nram++;
	}
	return 0;
}

/* Bump allocation over ram[]: cursor = (range index, next free address). */
static int cur_r;
static u64 cur_a;

int take_pages(u64 npages, struct share *s)
{
	while (npages) {
		if (cur_r >= nram || s->nseg >= MAX_SEGS)
			return -1;
		if (cur_a < ram[cur_r].base)
			cur_a = ram[cur_r].base;
		u64 avail = (ram[cur_r].end - cur_a) / PAGE_SIZE;
		if (!avail) {
			cur_r++;
			continue;
		}
		u64 n = npages < avail ? npages : avail;
		s->seg[s->nseg].base = cur_a;
		s->seg[s->nseg].npages = n;
		s->nseg++;
		s->npages += n;
		cur_a += n * PAGE_SIZE;
		npages -= n;
	}
	return 0;
}

void *take_contig(u64 npages)
{
	for (; cur_r < nram; cur_r++) {
		if (cur_a < ram[cur_r].base)
			cur_a = ram[cur_r].base;
		if ((ram[cur_r].end - cur_a) / PAGE_SIZE >= npages) {
			void *p = (void *)cur_a;
			cur_a += npages * PAGE_SIZE;
			return p;
		}
	}
	return 0;
}

/* Everything not yet taken, as ranges (for the page allocator); the bump
 * allocator is empty afterwards.  Returns the number of ranges. */
int take_rest(struct range *out, int max)
{
	int n = 0;
	for (; cur_r < nram && n < max; cur_r++) {
		if (cur_a < ram[cur_r].base)
			cur_a = ram[cur_r].base;
		if (cur_a < ram[cur_r].end) {
			out[n].base = cur_a;
			out[n].end = ram[cur_r].end;
			n++;
		}
	}
	cur_r = nram;
	return n;
}

/* Pages the workload needs (besides its own); -1 if it cannot be placed. */
static u64 needed_pages(void)
{
	u64 p = cfg.mb * PAGES_PER_MIB;
	if (cfg.workload == WL_VERIFY)	/* 4-byte expectation per page, per CPU */
		p += (p * 4 + PAGE_SIZE - 1) / PAGE_SIZE + cfg.cpus + nram;
	if (cfg.workload == WL_IDLE)
		p = 0;
	return p;
}

static int carve_shares(void)
{
	u64 total = cfg.mb * PAGES_PER_MIB;

	if (cfg.workload == WL_IDLE || cfg.workload == WL_FILL_FREE)
		return 0;
	for (u64 i = 0; i < ncpus; i++) {
		u64 n = total * (i + 1) / ncpus - total * i / ncpus;
		if (take_pages(n, &shares[i]))
			return -1;
	}
	if (cfg.workload == WL_VERIFY)
		return verify_prepare();
	return 0;
}

/* ---------------- SMP ---------------- */

#define LAPIC_ICR_LO 0xfee00300ULL
#define LAPIC_ICR_HI 0xfee00310ULL

static int start_ap(u64 cpu)
{
	ap_boot_cpu = (u32)cpu;
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	trap(TRAP_MMIO_W32, LAPIC_ICR_HI, cpu << 24);	/* APIC ID = cpu index */
	trap(TRAP_MMIO_W32, LAPIC_ICR_LO, 0x4500);	/* INIT, assert */
	delay_us(10000);
	for (int sipi = 0; sipi < 2 && !cpu_online[cpu]; sipi++) {
		trap(TRAP_MMIO_W32, LAPIC_ICR_HI, cpu << 24);
		trap(TRAP_MMIO_W32, LAPIC_ICR_LO, 0x4600 | SIPI_VECTOR);
		delay_us(sipi ? 1000 : 200);
	}
	u64 deadline = rdtsc() + 5000 * tsc_khz;	/* real mode is slow under kvm_pvm */
	while (!cpu_online[cpu]) {
		if (rdtsc() > deadline)
			return -1;
		cpu_relax();
	}
	return 0;
}

static void start_aps(void)
{
	if (cfg.cpus < 2)
		return;
	memcpy((void *)TRAMP_ADDR, tramp_start, tramp_end - tramp_start);
	for (u64 i = 1; i < cfg.cpus; i++) {
		if (start_ap(i)) {
			kprintf("kmig-guest warning: cpu %lu did not start (is the VM smaller than cpus=%lu?)\n",
				i, cfg.cpus);
			break;
		}
		ncpus = i + 1;
		kprintf("kmig-guest cpu %lu up t_ms=%lu\n", i, now_ms());
	}
}

/* ---------------- workloads ---------------- */

u64 exit_at = ~0ULL;

void poll_exit(int cpu)
{
	if (g_stop)
		halt_cpu();
	if (rdtsc() >= exit_at && cpu == 0) {
		g_stop = 1;
		kprintf("kmig-guest exit t_ms=%lu\n", now_ms());
		for (;;)
			trap(TRAP_POWEROFF, 0, 0);
	}
}

static void run_workload(int cpu)
{
	if (cfg.touch && cpu == 0)
		touch_free();
	switch (cfg.workload) {
	case WL_STRESS: stress_run(cpu); break;
	case WL_IDLE: idle_run(cpu); break;
	case WL_FILL_FREE: fill_free_run(cpu); break;
	case WL_VERIFY: verify_run(cpu); break;
	}
	halt_cpu();
}

static void crash_now(void)
{
	switch (cfg.crash) {
	case CRASH_NONE:
		return;
	case CRASH_TRIPLE:
		kprintf("kmig-guest crash=triple: empty IDT + exception in ring 0\n");
		trap(TRAP_CRASH_TRIPLE, 0, 0);
		break;
	case CRASH_EMUL:
		kprintf("kmig-guest crash=emul: popcnt from gpa 0x%x (no memory) in ring 0\n",
			CRASH_EMUL_GPA);
		trap(TRAP_CRASH_EMUL, 0, 0);
		break;
	case CRASH_RESET:
		kprintf("kmig-guest crash=reset: 0xfe to port 0x64 (keyboard controller reset)\n");
		trap(TRAP_OUT8, 0x64, 0xfe);
		kprintf("kmig-guest crash=reset: still running after the reset request\n");
		break;
	case CRASH_UD:
		kprintf("kmig-guest crash=ud: ud2 in ring 3 without the magic\n");
		__asm__ volatile("xorl %%eax, %%eax; ud2" ::: "rax", "memory");
		break;
	}
	halt_cpu();
}

static void bsp_main(void)
{
	tsc0 = rdtsc();
	int err = read_start_info();
	if (err == -1) {
		kprintf("kmig-guest error: no hvm_start_info (ebx=0x%x)\n", pvh_start_info);
		halt_cpu();
	}
	kprintf("kmig-guest boot cmdline=\"%s\"\n", cmdline);
	if (err) {
		kprintf("kmig-guest error: hvm_start_info has no memory map\n");
		halt_cpu();
	}
	parse_cmdline();
	find_tsc_khz();
	if (cfg.exit_ms)
		exit_at = tsc0 + cfg.exit_ms * tsc_khz;
	crash_now();

	u64 usable_mb = usable_pages / PAGES_PER_MIB;
	if (needed_pages() > usable_pages) {
		kprintf("kmig-guest error: mb=%lu does not fit (usable %lu MiB)\n", cfg.mb, usable_mb);
		halt_cpu();
	}
	start_aps();
	if (carve_shares()) {
		kprintf("kmig-guest error: mb=%lu does not fit (usable %lu MiB)\n", cfg.mb, usable_mb);
		g_stop = 1;
		halt_cpu();
	}
	for (u64 i = 0; i < ncpus; i++)
		for (int k = 0; k < shares[i].nseg; k++)
			kprintf("kmig-guest share cpu=%lu base=0x%lx pages=%lu\n", i,
				shares[i].seg[k].base, shares[i].seg[k].npages);
	if (cfg.net)
		net_init();	/* before the balloon: it hands the rest of RAM to the allocator */
	if (cfg.disk)
		blk_init();
	if (cfg.balloon)
		balloon_init();
	kprintf("kmig-guest ready cpus=%lu mem_mb=%lu\n", ncpus, usable_mb);
	__atomic_store_n(&g_go, 1, __ATOMIC_RELEASE);
	run_workload(0);
}

static void ap_main(int cpu)
{
	cpu_online[cpu] = 1;
	while (!__atomic_load_n(&g_go, __ATOMIC_ACQUIRE)) {
		if (g_stop)
			halt_cpu();
		cpu_relax();
	}
	if ((u64)cpu >= ncpus)		/* came up after the BSP gave up on it */
		halt_cpu();
	run_workload(cpu);
}

void r3_main(u64 cpu);
void r3_main(u64 cpu)
{
	if (cpu == 0)
		bsp_main();
	else
		ap_main((int)cpu);
	halt_cpu();
}
