/* Dirty-tracking benchmark helper: boots the test guest in-process, waits
 * for a console line, then measures one thing and prints one JSON object.
 * Driven by bench/dirty/run.py, which parses the guest's console (the
 * JSON gives the console byte offsets of each measured window).
 *
 *   dirty_bench --mem 1G [--cpus N] [--ring N] [--reaper fixed|adaptive]
 *               --cmdline "workload=..." --console PATH [--ready STR]
 *               [--settle-ms N] --mode off|sync|startstop
 *               [--duration-ms N] [--interval-ms N] [--kick 0|1]
 *               [--reps N] [--hold-ms N] [--gap-ms N] [--throttle PCT]
 *
 * off:       no tracking for duration-ms (guest throughput baseline);
 * sync:      dirty__start, then a sync every interval-ms for duration-ms
 *            (each sync's duration and page count), dirty__stop;
 * startstop: reps x {dirty__start, hold-ms, dirty__stop, gap-ms}.
 * --throttle sets kmig's vCPU throttle once the guest is ready: a way to
 * lower the guest's write rate. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/bitmap.h"
#include "base/timeutil.h"
#include "base/units.h"
#include "kvm/vcpu.h"
#include "kvm/vm.h"
#include "mem/dirty.h"

#define GUEST_ELF "build/guest/kmig-guest.elf"
#define MAX_SAMPLES 200000

struct opts {
	struct vm_config vm;
	const char *console, *ready, *mode;
	unsigned settle_ms, duration_ms, interval_ms, reps, hold_ms, gap_ms, throttle;
	bool kick;
};

struct bench {
	struct opts o;
	struct vm vm;
	FILE *con;
	bool created;
	uint64_t *ns, *pages;        /* per sync */
	size_t n;
};

static void usage(void)
{
	fprintf(stderr, "usage: dirty_bench --mem SIZE --cmdline S --console PATH "
		"--mode off|sync|startstop [options]; see the comment in dirty_bench.c\n");
	exit(2);
}

static unsigned parse_uint(const char *s)
{
	uint64_t v;
	if (units__parse_u64(s, 0, 1u << 30, &v))
		usage();
	return (unsigned)v;
}

static void opts__parse(struct opts *o, int argc, char **argv)
{
	static const struct option lo[] = {
		{ "mem", 1, 0, 'm' }, { "cpus", 1, 0, 'c' }, { "ring", 1, 0, 'r' },
		{ "reaper", 1, 0, 'R' }, { "cmdline", 1, 0, 'l' }, { "console", 1, 0, 'o' },
		{ "ready", 1, 0, 'y' }, { "settle-ms", 1, 0, 's' }, { "mode", 1, 0, 'M' },
		{ "duration-ms", 1, 0, 'd' }, { "interval-ms", 1, 0, 'i' }, { "kick", 1, 0, 'k' },
		{ "reps", 1, 0, 'n' }, { "hold-ms", 1, 0, 'h' }, { "gap-ms", 1, 0, 'g' },
		{ "throttle", 1, 0, 't' },
		{ 0, 0, 0, 0 },
	};
	*o = (struct opts){ .vm = { .kernel = GUEST_ELF, .cpus = 1, .mem_size = 1ull << 30 },
			    .ready = "kmig-guest ready", .mode = "sync", .settle_ms = 1000,
			    .duration_ms = 3000, .interval_ms = 100, .kick = true, .reps = 3,
			    .hold_ms = 2000, .gap_ms = 1000 };
	int c;
	while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
		switch (c) {
		case 'm': if (units__parse_size(optarg, 1, &o->vm.mem_size)) usage(); break;
		case 'c': o->vm.cpus = parse_uint(optarg); break;
		case 'r': o->vm.dirty_ring = parse_uint(optarg); break;
		case 'R': o->vm.reaper_fixed = !strcmp(optarg, "fixed"); break;
		case 'l': o->vm.cmdline = optarg; break;
		case 'o': o->console = optarg; break;
		case 'y': o->ready = optarg; break;
		case 's': o->settle_ms = parse_uint(optarg); break;
		case 'M': o->mode = optarg; break;
		case 'd': o->duration_ms = parse_uint(optarg); break;
		case 'i': o->interval_ms = parse_uint(optarg); break;
		case 'k': o->kick = parse_uint(optarg) != 0; break;
		case 'n': o->reps = parse_uint(optarg); break;
		case 'h': o->hold_ms = parse_uint(optarg); break;
		case 'g': o->gap_ms = parse_uint(optarg); break;
		case 't': o->throttle = parse_uint(optarg); break;
		default: usage();
		}
	}
	if (!o->vm.cmdline || !o->console)
		usage();
}

static uint64_t console_size(struct bench *b)
{
	struct stat st;
	fflush(b->con);
	return fstat(fileno(b->con), &st) ? 0 : (uint64_t)st.st_size;
}

static bool console_has(struct bench *b, const char *what)
{
	static char buf[1 << 20];
	ssize_t n = pread(fileno(b->con), buf, sizeof(buf) - 1, 0);
	if (n <= 0)
		return false;
	buf[n] = 0;
	return strstr(buf, what) != NULL;
}

static int bench__boot(struct bench *b)
{
	char err[256] = "";
	b->con = fopen(b->o.console, "w+");
	if (!b->con)
		return -errno;
	b->o.vm.console_fd = fileno(b->con);
	int rc = vm__create(&b->vm, &b->o.vm, err, sizeof(err));
	b->created = true;
	if (!rc)
		rc = vm__start(&b->vm, VM_STATUS_RUNNING);
	if (rc) {
		fprintf(stderr, "dirty_bench: %s\n", err[0] ? err : strerror(-rc));
		return rc;
	}
	uint64_t end = time__now_ms() + 120000;
	while (!console_has(b, b->o.ready)) {
		if (time__now_ms() > end) {
			fprintf(stderr, "dirty_bench: no \"%s\" on the console\n", b->o.ready);
			return -ETIMEDOUT;
		}
		time__sleep_ns(10 * 1000000ull);
	}
	if (b->o.throttle)
		throttle__set(&b->vm.throttle, b->o.throttle);
	time__sleep_ns((uint64_t)b->o.settle_ms * 1000000ull);
	return 0;
}

static uint64_t ring_full_exits(struct bench *b)
{
	struct dirty_stats st;
	dirty__get_stats(b->vm.dirty, &st);
	return st.ring_full_exits;
}

static void print_list(const char *name, const uint64_t *v, size_t n)
{
	printf(", \"%s\": [", name);
	for (size_t i = 0; i < n; i++)
		printf("%s%" PRIu64, i ? ", " : "", v[i]);
	printf("]");
}

static int bench__off(struct bench *b)
{
	uint64_t c0 = console_size(b), t0 = time__now_ns();
	time__sleep_ns((uint64_t)b->o.duration_ms * 1000000ull);
	printf("{\"mode\": \"off\", \"console_from\": %" PRIu64 ", \"console_to\": %" PRIu64
	       ", \"elapsed_ns\": %" PRIu64 "}\n", c0, console_size(b), time__now_ns() - t0);
	return 0;
}

static int bench__sync_loop(struct bench *b, struct bitmap *bm)
{
	uint64_t end = time__now_ns() + (uint64_t)b->o.duration_ms * 1000000ull;
	while (time__now_ns() < end && b->n < MAX_SAMPLES) {
		if (b->o.interval_ms)
			time__sleep_ns((uint64_t)b->o.interval_ms * 1000000ull);
		uint64_t t0 = time__now_ns();
		int64_t got = dirty__sync(b->vm.dirty, bm, b->o.kick ? DIRTY_SYNC_KICK : 0);
		uint64_t t1 = time__now_ns();
		if (got < 0)
			return (int)got;
		b->ns[b->n] = t1 - t0;
		b->pages[b->n++] = (uint64_t)got;
		bitmap__clear_all(bm);
	}
	return 0;
}

static int bench__sync(struct bench *b)
{
	struct bitmap bm;
	if (bitmap__init(&bm, b->vm.ram.npages))
		return -ENOMEM;
	uint64_t c0 = console_size(b), full0 = ring_full_exits(b);
	uint64_t t0 = time__now_ns();
	int rc = dirty__start(b->vm.dirty);
	uint64_t t1 = time__now_ns();
	if (!rc)
		rc = bench__sync_loop(b, &bm);
	struct dirty_stats st;
	dirty__get_stats(b->vm.dirty, &st);
	uint64_t t2 = time__now_ns();
	int rc2 = dirty__stop(b->vm.dirty);
	uint64_t t3 = time__now_ns();
	bitmap__free(&bm);
	if (rc || rc2)
		return rc ? rc : rc2;
	printf("{\"mode\": \"sync\", \"start_ns\": %" PRIu64 ", \"stop_ns\": %" PRIu64
	       ", \"elapsed_ns\": %" PRIu64 ", \"ring_full_exits\": %" PRIu64
	       ", \"harvested\": %" PRIu64 ", \"reaper_runs\": %" PRIu64
	       ", \"console_from\": %" PRIu64 ", \"console_to\": %" PRIu64,
	       t1 - t0, t3 - t2, t2 - t1, ring_full_exits(b) - full0, st.harvested,
	       st.reaper_runs, c0, console_size(b));
	print_list("sync_ns", b->ns, b->n);
	print_list("pages", b->pages, b->n);
	printf("}\n");
	return 0;
}

static int bench__startstop(struct bench *b)
{
	uint64_t start[64], stop[64], c_start[64], c_started[64], c_stopping[64], c_end[64];
	unsigned reps = b->o.reps < 64 ? b->o.reps : 64;
	for (unsigned r = 0; r < reps; r++) {
		c_start[r] = console_size(b);
		uint64_t t0 = time__now_ns();
		int rc = dirty__start(b->vm.dirty);
		start[r] = time__now_ns() - t0;
		if (rc)
			return rc;
		c_started[r] = console_size(b);
		time__sleep_ns((uint64_t)b->o.hold_ms * 1000000ull);
		c_stopping[r] = console_size(b);
		t0 = time__now_ns();
		rc = dirty__stop(b->vm.dirty);
		stop[r] = time__now_ns() - t0;
		if (rc)
			return rc;
		time__sleep_ns((uint64_t)b->o.gap_ms * 1000000ull);
		c_end[r] = console_size(b);
	}
	printf("{\"mode\": \"startstop\"");
	print_list("start_ns", start, reps);
	print_list("stop_ns", stop, reps);
	print_list("console_from", c_start, reps);
	print_list("console_started", c_started, reps);
	print_list("console_stopping", c_stopping, reps);
	print_list("console_to", c_end, reps);
	printf("}\n");
	return 0;
}

int main(int argc, char **argv)
{
	static struct bench b;
	opts__parse(&b.o, argc, argv);
	b.ns = calloc(MAX_SAMPLES, sizeof(uint64_t));
	b.pages = calloc(MAX_SAMPLES, sizeof(uint64_t));
	if (!b.ns || !b.pages)
		return 1;
	int rc = bench__boot(&b);
	if (!rc) {
		if (!strcmp(b.o.mode, "off"))
			rc = bench__off(&b);
		else if (!strcmp(b.o.mode, "sync"))
			rc = bench__sync(&b);
		else if (!strcmp(b.o.mode, "startstop"))
			rc = bench__startstop(&b);
		else
			usage();
	}
	fflush(stdout);
	if (rc)
		fprintf(stderr, "dirty_bench: %s\n", strerror(-rc));
	if (b.created)
		vm__destroy(&b.vm);
	if (b.con)
		fclose(b.con);
	free(b.ns);
	free(b.pages);
	return rc ? 1 : 0;
}
