/* `kmig migrate --qmp unix:PATH URI [--bandwidth MB/s] [--downtime MS] [--tls-creds ID]
 *  [--auto-converge step|computed|off] [--dirty-limit MB/s] [--postcopy auto|after-pass|off]
 *  [--preempt] [--dest-qmp unix:PATH] [--disk] [--xbzrle MIB] [--background-snapshot]
 *  [--ignore-shared] [--zero-copy]
 *  [--verify] [--json]`: drives a
 * migration through the source's QMP socket (and, for post-copy, sets the destination's
 * capability through its own) and shows its progress.  With --resume a
 * paused post-copy goes on over a new link to URI (migrate-recover at the
 * destination, through --dest-qmp, then migrate resume=true).
 *
 * A pre-copy migration given no convergence option gets one, so that a
 * busy guest's migration ends with the source holding a whole copy until
 * the switchover: dirty-limit at MIGRATE_DEFAULT_LIMIT MB/s per vCPU (at
 * most a sixth of --bandwidth over the vCPUs) where the source tracks
 * with the dirty ring, else the computed throttle (the figures that chose
 * them: docs/usage.md, "kmig migrate").  Post-copy stays opt-in; a
 * pre-copy that goes on round after round suggests it. */
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/units.h"
#include "ctl/cliopt.h"
#include "ctl/client.h"
#include "mig/comp.h"

enum pc_mode { PC_OFF, PC_AFTER_PASS, PC_AUTO };

/* the default dirty limit: 20 MB/s per vCPU, bench/converge's, where it
 * ended 512 and 1536 MiB of stress at 125 MB/s (1 vCPU); at most a sixth
 * of a --bandwidth cap shared by the vCPUs, as bench/converge sets it */
#define MIGRATE_DEFAULT_LIMIT 20
#define MIGRATE_LIMIT_SHARE 6
#define MIGRATE_HINT_ROUNDS 10      /* pre-copy rounds before post-copy is suggested */

struct migrate_opts {
	const char *qmp, *uri, *policy, *compression, *tls_creds, *tls_hostname, *dest_qmp;
	enum pc_mode postcopy;
	uint64_t bandwidth_mbs, downtime_ms, dirty_limit;
	bool have_bw, have_dt, json, verify, resume, disk;
	bool preempt;                /* --preempt: postcopy-preempt on both sides */
	bool policy_off;             /* --auto-converge off */
	bool by_default;             /* the policy is kmig migrate's choice */
	uint64_t multifd;            /* channels; 0 = off */
	uint64_t xbzrle_mib;         /* --xbzrle: the cache in MiB; 0 = off */
	bool snapshot;               /* --background-snapshot */
	bool ignore_shared;          /* --ignore-shared: x-ignore-shared */
	bool zero_copy;              /* --zero-copy: zero-copy-send (with --multifd) */
};

static void migrate__usage(FILE *f)
{
	fprintf(f,
		"usage: kmig migrate --qmp unix:PATH URI [OPTIONS]\n"
		"  migrates the VM whose QMP socket is PATH to the destination listening on URI\n"
		"  (tcp:HOST:PORT or unix:PATH; start it with kmig run --incoming URI), or saves\n"
		"  it into a file (file:PATH) or a command's input (exec:CMD), which a VM started\n"
		"  with --incoming file:PATH or exec:CMD restores\n"
		"  --bandwidth MB/s              cap (0: unlimited)\n"
		"  --downtime MS                 the longest pause allowed at the switchover\n"
		"  --auto-converge step|computed|off  throttle the guest's vCPUs when it dirties too\n"
		"                                fast (off: no convergence help at all)\n"
		"  --dirty-limit MB/s            cap each vCPU's dirty rate instead\n"
		"                                (neither given, pre-copy: dirty-limit 20 on the\n"
		"                                dirty ring, else auto-converge computed)\n"
		"  --multifd N                   N parallel channels (1 to 16)\n"
		"  --zero-copy                   with --multifd, tcp: and no compression: the\n"
		"                                channels send pages with MSG_ZEROCOPY (zero-copy-send)\n"
		"  --compression C               compress page records: none, zstd, lz4, zlib\n"
		"  --xbzrle MIB                  after the bulk pass, send the pages the destination\n"
		"                                holds as what changed, against a cache of MIB MiB\n"
		"                                (a power of two; QEMU's default is 64) (xbzrle)\n"
		"  --postcopy auto|after-pass|off  switch to post-copy when pre-copy cannot end\n"
		"  --preempt                     with --postcopy: the pages the destination asks\n"
		"                                for on a connection of their own (postcopy-preempt)\n"
		"  --dest-qmp unix:PATH          the destination's QMP (post-copy, --resume)\n"
		"  --resume                      resume a paused post-copy migration\n"
		"  --tls-creds ID [--tls-hostname NAME]  TLS with the source's --object ID\n"
		"  --disk                        carry the disk image in the stream, for a\n"
		"                                destination with an image of its own (x-block-migration)\n"
		"  --background-snapshot         save the VM as it is now while it runs on\n"
		"                                (file:, exec:; no convergence policy needed)\n"
		"  --ignore-shared               RAM in a shared memory file is handed over, not\n"
		"                                sent (x-ignore-shared: to a kmig on this host\n"
		"                                mapping the same file, or a state-only save)\n"
		"  --verify                      check every page at the destination (x-verify)\n"
		"  --json                        the final statistics as JSON\n");
}

/* Fills o from the command line; a mistake ends the process (die: status
 * 1, die_usage: 2). */
static void migrate__parse(int argc, char **argv, struct migrate_opts *o)
{
	static const struct option longopts[] = {
		{ "qmp", required_argument, 0, 'q' }, { "bandwidth", required_argument, 0, 'b' },
		{ "downtime", required_argument, 0, 'd' }, { "json", no_argument, 0, 'j' },
		{ "auto-converge", required_argument, 0, 'a' }, { "verify", no_argument, 0, 'v' },
		{ "compression", required_argument, 0, 'c' },
		{ "dirty-limit", required_argument, 0, 'l' }, { "multifd", required_argument, 0, 'm' },
		{ "tls-creds", required_argument, 0, 't' }, { "tls-hostname", required_argument, 0, 'H' },
		{ "postcopy", required_argument, 0, 'p' }, { "dest-qmp", required_argument, 0, 'D' },
		{ "resume", no_argument, 0, 'r' }, { "help", no_argument, 0, 'h' },
		{ "disk", no_argument, 0, 'B' }, { "preempt", no_argument, 0, 'P' },
		{ "xbzrle", required_argument, 0, 'x' },
		{ "background-snapshot", no_argument, 0, 'S' },
		{ "ignore-shared", no_argument, 0, 'G' },
		{ "zero-copy", no_argument, 0, 'Z' },
		{ 0, 0, 0, 0 },
	};
	int c;
	memset(o, 0, sizeof(*o));
	char why[160];
	/* ':' first: getopt prints nothing (cliopt__why says it) */
	while ((c = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
		switch (c) {
		case 'q':
			if (strncmp(optarg, "unix:", 5) || !optarg[5])
				die("--qmp %s: expected unix:PATH", optarg);
			o->qmp = optarg + 5;
			break;
		case 'b':
			if (units__parse_u64(optarg, 0, 1000000, &o->bandwidth_mbs))
				die("--bandwidth %s: MB/s from 0 (unlimited) to 1000000", optarg);
			o->have_bw = true;
			break;
		case 'd':
			if (units__parse_u64(optarg, 0, 2000000, &o->downtime_ms))
				die("--downtime %s: milliseconds from 0 to 2000000", optarg);
			o->have_dt = true;
			break;
		case 'a':
			if (strcmp(optarg, "step") && strcmp(optarg, "computed") && strcmp(optarg, "off"))
				die("--auto-converge %s: expected step, computed or off", optarg);
			o->policy_off = !strcmp(optarg, "off");
			o->policy = o->policy_off ? NULL : optarg;
			break;
		case 'v': o->verify = true; break;
		case 'l':
			if (units__parse_u64(optarg, 1, 1000000, &o->dirty_limit))
				die("--dirty-limit %s: MB/s per vCPU, at least 1", optarg);
			break;
		case 'm':
			if (units__parse_u64(optarg, 1, 16, &o->multifd))
				die("--multifd %s: 1 to 16 channels", optarg);
			break;
		case 'c':
			if (mig_comp__parse(optarg, false, &(enum proto_comp){ 0 }))
				die("--compression %s: expected none, zstd, lz4 or zlib", optarg);
			o->compression = optarg;
			break;
		case 'p':
			if (!strcmp(optarg, "auto"))
				o->postcopy = PC_AUTO;
			else if (!strcmp(optarg, "after-pass"))
				o->postcopy = PC_AFTER_PASS;
			else if (strcmp(optarg, "off"))
				die("--postcopy %s: expected auto, after-pass or off", optarg);
			break;
		case 'D':
			if (strncmp(optarg, "unix:", 5) || !optarg[5])
				die("--dest-qmp %s: expected unix:PATH", optarg);
			o->dest_qmp = optarg + 5;
			break;
		case 'j': o->json = true; break;
		case 'r': o->resume = true; break;
		case 'B': o->disk = true; break;
		case 'P': o->preempt = true; break;
		case 'S': o->snapshot = true; break;
		case 'G': o->ignore_shared = true; break;
		case 'Z': o->zero_copy = true; break;
		case 'x':
			if (units__parse_u64(optarg, 1, 1ull << 20, &o->xbzrle_mib) ||
			    (o->xbzrle_mib & (o->xbzrle_mib - 1)))
				die("--xbzrle %s: the cache in MiB, a power of two (1, 2, 4 ... 1048576)",
				    optarg);
			break;
		case 't': o->tls_creds = optarg; break;
		case 'H': o->tls_hostname = optarg; break;
		case 'h':
			migrate__usage(stdout);
			exit(0);
		default:
			die_usage("%s (kmig migrate --help)",
				  cliopt__why(c, argc, argv, longopts, why, sizeof(why)));
		}
	}
	if (!o->qmp)
		die_usage("migrate: --qmp unix:PATH (the source VM's QMP socket) is required "
			  "(kmig migrate --help)");
	if (optind != argc - 1)
		die_usage("migrate: %s (kmig migrate --help)", optind == argc ?
			  "the destination URI (tcp:HOST:PORT or unix:PATH) is missing" :
			  "more than one destination URI");
	if (o->preempt && o->postcopy == PC_OFF)
		die("--preempt needs --postcopy auto or after-pass (postcopy-preempt needs postcopy-ram)");
	if (o->disk && o->postcopy != PC_OFF)
		die("--disk with --postcopy: post-copy cannot carry the disk (leave one out)");
	if (o->zero_copy && !o->multifd)
		die("--zero-copy needs --multifd N (zero-copy-send: the channels' pages)");
	if (o->xbzrle_mib && o->multifd)
		die("--xbzrle with --multifd: multifd is not compatible with xbzrle (leave one out)");
	if (o->dirty_limit && (o->policy || o->policy_off))
		die("--dirty-limit with --auto-converge: give one of them");
	if (o->snapshot && (o->postcopy != PC_OFF || o->multifd || o->xbzrle_mib || o->disk ||
			    o->dirty_limit || o->policy || o->resume))
		die("--background-snapshot takes none of --postcopy, --multifd, --xbzrle, --disk, "
		    "--dirty-limit, --auto-converge, --resume (it sends each page once, as it was "
		    "when it began)");
	if (o->ignore_shared && (o->postcopy != PC_OFF || o->multifd || o->disk || o->snapshot ||
				 o->resume || o->xbzrle_mib))
		die("--ignore-shared takes none of --postcopy, --multifd, --disk, --xbzrle, "
		    "--background-snapshot, --resume (the RAM in its memory file is handed over, "
		    "not sent)");
	if (o->resume && !o->dest_qmp)
		die("--resume needs --dest-qmp unix:PATH (the destination listens on URI first)");
	o->uri = argv[optind];
}

static int migrate__setup(struct qmp_client *c, const struct migrate_opts *o, char *err, size_t n)
{
	json_t *params = json_object();
	if (o->have_bw)
		json_object_set_new(params, "max-bandwidth", json_integer(o->bandwidth_mbs * 1000000));
	if (o->have_dt)
		json_object_set_new(params, "downtime-limit", json_integer(o->downtime_ms));
	if (o->policy)
		json_object_set_new(params, "x-cpu-throttle-policy", json_string(o->policy));
	if (o->compression)
		json_object_set_new(params, "x-compression", json_string(o->compression));
	if (o->dirty_limit)
		json_object_set_new(params, "vcpu-dirty-limit", json_integer(o->dirty_limit));
	if (o->multifd)
		json_object_set_new(params, "multifd-channels", json_integer(o->multifd));
	if (o->tls_creds)
		json_object_set_new(params, "tls-creds", json_string(o->tls_creds));
	if (o->tls_hostname)
		json_object_set_new(params, "tls-hostname", json_string(o->tls_hostname));
	if (o->xbzrle_mib)
		json_object_set_new(params, "xbzrle-cache-size", json_integer(o->xbzrle_mib << 20));
	json_t *r = qmp_client__call(c, "migrate-set-parameters", params, err, n);
	if (!r)
		return -1;
	json_decref(r);
	/* pause-before-switchover off: this client never sends migrate-continue */
	json_t *caps = json_pack("{s:[{s:s,s:b},{s:s,s:b},{s:s,s:b},{s:s,s:b},{s:s,s:b},"
				 "{s:s,s:b},{s:s,s:b},{s:s,s:b},{s:s,s:b},{s:s,s:b},{s:s,s:b},"
				 "{s:s,s:b},{s:s,s:b}]}",
				 "capabilities",
				 "capability", "auto-converge", "state", o->policy != NULL,
				 "capability", "x-verify", "state", o->verify,
				 "capability", "dirty-limit", "state", o->dirty_limit != 0,
				 "capability", "multifd", "state", o->multifd != 0,
				 "capability", "pause-before-switchover", "state", 0,
				 "capability", "postcopy-ram", "state", o->postcopy != PC_OFF,
				 "capability", "x-postcopy-auto", "state", o->postcopy == PC_AUTO,
				 "capability", "postcopy-preempt", "state", o->preempt,
				 "capability", "x-block-migration", "state", o->disk,
				 "capability", "xbzrle", "state", o->xbzrle_mib != 0,
				 "capability", "background-snapshot", "state", o->snapshot,
				 "capability", "x-ignore-shared", "state", o->ignore_shared,
				 "capability", "zero-copy-send", "state", o->zero_copy);
	r = qmp_client__call(c, "migrate-set-capabilities", caps, err, n);
	if (!r)
		return -1;
	json_decref(r);
	r = qmp_client__call(c, "migrate", json_pack("{s:s}", "uri", o->uri), err, n);
	if (!r)
		return -1;
	json_decref(r);
	return 0;
}

static json_int_t jint(json_t *o, const char *k)
{
	return json_integer_value(json_object_get(o, k));
}

/* A pre-copy migration with no convergence option: dirty-limit on the
 * dirty ring, the computed throttle on the bitmap (dirty-limit needs the
 * ring's per-vCPU rates). */
static int migrate__default_policy(struct qmp_client *c, struct migrate_opts *o, char *err,
				   size_t n)
{
	if (o->resume || o->policy || o->policy_off || o->dirty_limit || o->postcopy != PC_OFF ||
	    o->snapshot)
		return 0;
	o->by_default = true;
	/* a VMM that cannot say (not kmig's) gets the throttle, which needs no ring */
	json_t *r = qmp_client__call(c, "x-query-dirty-tracking", NULL, err, n);
	const char *backend = json_string_value(json_object_get(r, "backend"));
	if (!backend || strcmp(backend, "ring")) {
		if (!backend)
			fprintf(stderr, "kmig migrate: the source did not tell its dirty tracking "
				"(%s): auto-converge computed\n", r ? "no backend" : err);
		o->policy = "computed";
		json_decref(r);
		return 0;
	}
	json_decref(r);
	json_t *cpus = qmp_client__call(c, "query-cpus-fast", NULL, err, n);
	uint64_t ncpus = json_array_size(cpus);
	if (!ncpus)
		fprintf(stderr, "kmig migrate: query-cpus-fast: %s: the dirty limit is set as for "
			"one vCPU\n", cpus ? "no vCPUs" : err);
	json_decref(cpus);
	/* a sixth of a capped link (MB of 10^6 there, 2^20 here: near
	 * enough), shared by the vCPUs */
	uint64_t share = o->have_bw && o->bandwidth_mbs ?
			 o->bandwidth_mbs / MIGRATE_LIMIT_SHARE / (ncpus ? ncpus : 1) :
			 MIGRATE_DEFAULT_LIMIT;
	o->dirty_limit = share < 1 ? 1 : share > MIGRATE_DEFAULT_LIMIT ? MIGRATE_DEFAULT_LIMIT :
			 share;
	return 0;
}

/* dirty-limit, step, computed or none */
static const char *migrate__policy_name(const struct migrate_opts *o)
{
	return o->dirty_limit ? "dirty-limit" : o->policy ? o->policy : "none";
}

static void migrate__print_policy(const struct migrate_opts *o, FILE *f)
{
	if ((o->postcopy != PC_OFF && !o->policy && !o->dirty_limit) || o->snapshot)
		return;
	if (o->dirty_limit)
		fprintf(f, "policy: dirty-limit %llu MB/s per vCPU", (unsigned long long)o->dirty_limit);
	else if (o->policy)
		fprintf(f, "policy: auto-converge %s", migrate__policy_name(o));
	else
		fprintf(f, "policy: none (--auto-converge off)");
	fprintf(f, "%s\n", !o->by_default ? "" : o->dirty_limit ?
		" (kmig migrate's default with the dirty ring; --auto-converge off for none)" :
		" (kmig migrate's default without the dirty ring; --auto-converge off for none)");
}

/* Once, when pre-copy goes on round after round. */
static void migrate__hint(const struct migrate_opts *o, json_t *q, bool *hinted)
{
	const char *st = json_string_value(json_object_get(q, "status"));
	if (*hinted || o->postcopy != PC_OFF || strcmp(st, "active") ||
	    jint(json_object_get(q, "ram"), "dirty-sync-count") < MIGRATE_HINT_ROUNDS)
		return;
	*hinted = true;
	if (!strncmp(o->uri, "file:", 5) || !strncmp(o->uri, "exec:", 5)) {
		/* no return path: post-copy cannot help a save */
		fprintf(stderr, "\nkmig migrate: the save is in round %lld and has not ended; "
			"a guest stopped first (QMP stop) is saved in one pass, and "
			"--background-snapshot saves it in one pass while it runs\n",
			jint(json_object_get(q, "ram"), "dirty-sync-count"));
		return;
	}
	fprintf(stderr, "\nkmig migrate: pre-copy is in round %lld and has not ended; --postcopy "
		"auto would end it (the guest then runs at the destination before all its pages "
		"are there, and the source no longer holds a whole copy of it)\n",
		jint(json_object_get(q, "ram"), "dirty-sync-count"));
}

/* Post-copy needs the capability at the destination too. */
static int migrate__dest_caps(const struct migrate_opts *o, char *err, size_t n)
{
	struct qmp_client d;
	if (o->postcopy == PC_OFF || !o->dest_qmp)
		return 0;
	if (qmp_client__connect(&d, o->dest_qmp, err, n))
		return -1;
	json_t *r = qmp_client__call(&d, "migrate-set-capabilities",
				     json_pack("{s:[{s:s,s:b},{s:s,s:b}]}", "capabilities",
					       "capability", "postcopy-ram", "state", 1,
					       "capability", "postcopy-preempt", "state", o->preempt),
				     err, n);
	qmp_client__close(&d);
	if (!r)
		return -1;
	json_decref(r);
	return 0;
}

/* --resume: the destination listens on the new URI (postcopy-recover),
 * then the source connects to it. */
static int migrate__resume(struct qmp_client *c, const struct migrate_opts *o, char *err, size_t n)
{
	struct qmp_client d;
	if (qmp_client__connect(&d, o->dest_qmp, err, n))
		return -1;
	json_t *r = qmp_client__call(&d, "migrate-recover", json_pack("{s:s}", "uri", o->uri), err, n);
	for (int i = 0; r && i < 500; i++) {     /* 10 s at most */
		json_t *q = qmp_client__call(&d, "query-migrate", NULL, err, n);
		const char *st = q ? json_string_value(json_object_get(q, "status")) : NULL;
		bool done = !q || (st && !strcmp(st, "postcopy-recover"));   /* listening */
		json_decref(q);
		if (done)
			break;
		usleep(20000);
	}
	qmp_client__close(&d);
	if (!r)
		return -1;
	json_decref(r);
	r = qmp_client__call(c, "migrate", json_pack("{s:s,s:b}", "uri", o->uri, "resume", 1), err, n);
	json_decref(r);
	return r ? 0 : -1;
}

static void migrate__progress(json_t *q, bool tty)
{
	json_t *ram = json_object_get(q, "ram");
	json_t *limit = json_object_get(q, "dirty-limit-throttle-time-per-round");
	json_int_t total = jint(ram, "total"), rem = jint(ram, "remaining");
	double pct = total ? 100.0 * (double)(jint(ram, "transferred")) / (double)total : 0;
	char slow[48];
	if (limit) { /* sleep per 1 s period of running, as a share of the time */
		double us = (double)json_integer_value(limit);
		snprintf(slow, sizeof(slow), "dirty-limit %2.0f%% asleep", 100.0 * us / (us + 1e6));
	}
	else
		snprintf(slow, sizeof(slow), "throttle %2lld%%", jint(q, "cpu-throttle-percentage"));
	const char *st = json_string_value(json_object_get(q, "status"));
	if (!strncmp(st, "postcopy-", 9)) {   /* the guest runs there: no rates here */
		fprintf(stderr, "%s%-16s %7.1f%% of RAM sent  %6.0f Mbit/s  "
			"remaining %6lld MiB  pages asked for %7lld%s", tty ? "\r" : "", st, pct,
			json_real_value(json_object_get(ram, "mbps")), rem >> 20,
			jint(ram, "postcopy-requests"), tty ? "          " : "\n");
		return;
	}
	fprintf(stderr, "%s%-9s %7.1f%% of RAM sent  %6.0f Mbit/s  dirty %7lld pages/s  "
		"expected downtime %5lld ms  remaining %6lld MiB  %s%s",
		tty ? "\r" : "", st, pct,
		json_real_value(json_object_get(ram, "mbps")), jint(ram, "dirty-pages-rate"),
		jint(q, "expected-downtime"), rem >> 20, slow, tty ? "" : "\n");
}

static void migrate__summary(json_t *q)
{
	json_t *ram = json_object_get(q, "ram");
	printf("status %s: total %lld ms, downtime %lld ms, setup %lld ms\n",
	       json_string_value(json_object_get(q, "status")), jint(q, "total-time"),
	       jint(q, "downtime"), jint(q, "setup-time"));
	printf("sent %lld MiB (%lld pages, %lld zero pages), %lld dirty syncs, %.0f Mbit/s\n",
	       jint(ram, "transferred") >> 20, jint(ram, "normal"), jint(ram, "duplicate"),
	       jint(ram, "dirty-sync-count"), json_real_value(json_object_get(ram, "mbps")));
	json_t *xb = json_object_get(q, "xbzrle-cache");
	if (xb)
		printf("xbzrle: %lld pages sent as deltas in %lld KiB, %lld cache misses, "
		       "%lld overflows, %lld pages unchanged\n", jint(xb, "pages"),
		       jint(xb, "bytes") >> 10, jint(xb, "cache-miss"), jint(xb, "overflow"),
		       jint(xb, "x-unchanged"));
	json_t *bg = json_object_get(q, "x-background-snapshot");
	if (bg)
		printf("background snapshot: the guest ran on; %lld of its writes waited for their "
		       "page, %lld pages sent ahead of the scan for them\n", jint(bg, "write-faults"),
		       jint(bg, "pages-ahead"));
	json_t *sh = json_object_get(q, "x-ignore-shared");
	if (sh)
		printf("RAM: %s in %s, not sent (x-ignore-shared)\n",
		       json_is_true(json_object_get(sh, "handed-over")) ? "handed over" : "left",
		       json_string_value(json_object_get(sh, "mem-path")));
	if (jint(ram, "dirty-sync-missed-zero-copy"))
		printf("zero-copy: the kernel copied after all in %lld channel passes (for "
		       "example, a receiver on this host)\n", jint(ram, "dirty-sync-missed-zero-copy"));
	json_t *sw = json_object_get(q, "x-postcopy-switch");
	if (jint(ram, "postcopy-bytes"))
		printf("post-copy: %lld MiB after the switch, %lld pages asked for by the destination\n",
		       jint(ram, "postcopy-bytes") >> 20, jint(ram, "postcopy-requests"));
	json_t *pre = json_object_get(q, "x-postcopy-preempt");
	if (pre)
		printf("postcopy-preempt: %lld pages asked for went on its channel\n",
		       jint(pre, "pages"));
	if (sw) {
		printf("switched by %s at %lld ms, %s the bulk pass",
		       json_string_value(json_object_get(sw, "by")), jint(sw, "at-ms"),
		       json_is_true(json_object_get(sw, "in-bulk-pass")) ? "during" : "after");
		if (jint(sw, "bandwidth")) /* the hybrid's own decision */
			printf(" (dirty rate %lld MB/s, bandwidth %lld MB/s)",
			       jint(sw, "dirty-rate") / 1000000, jint(sw, "bandwidth") / 1000000);
		printf("\n");
	}
	const char *e = json_string_value(json_object_get(q, "error-desc"));
	if (e)
		printf("error: %s\n", e);
}

int client__migrate_main(int argc, char **argv)
{
	struct migrate_opts o;
	struct qmp_client c;
	char err[512];
	migrate__parse(argc, argv, &o);
	if (migrate__dest_caps(&o, err, sizeof(err)))
		die("destination: %s", err);
	if (qmp_client__connect(&c, o.qmp, err, sizeof(err)) ||
	    migrate__default_policy(&c, &o, err, sizeof(err)) ||
	    (o.resume ? migrate__resume(&c, &o, err, sizeof(err))
		      : migrate__setup(&c, &o, err, sizeof(err))))
		die("%s", err);
	bool tty = isatty(STDERR_FILENO), asked = false, hinted = false;
	json_t *q = NULL;
	for (;;) {
		json_decref(q);
		q = qmp_client__call(&c, "query-migrate", NULL, err, sizeof(err));
		if (!q)
			die("%s", err);
		const char *st = json_string_value(json_object_get(q, "status"));
		if (!strcmp(st, "completed") || !strcmp(st, "failed") || !strcmp(st, "cancelled") ||
		    !strcmp(st, "postcopy-paused"))
			break;
		/* after-pass: post-copy once the bulk pass is over */
		if (o.postcopy == PC_AFTER_PASS && !asked &&
		    jint(json_object_get(q, "ram"), "dirty-sync-count") >= 1) {
			json_t *r = qmp_client__call(&c, "migrate-start-postcopy", NULL, err, sizeof(err));
			if (!r)
				die("migrate-start-postcopy: %s", err);
			json_decref(r);
			asked = true;
		}
		if (!o.json)
			migrate__progress(q, tty);
		migrate__hint(&o, q, &hinted);
		usleep(250000);
	}
	if (tty && !o.json)
		fputc('\n', stderr);
	if (o.json) {
		if (!o.resume)    /* what this command chose, beside query-migrate's answer */
			json_object_set_new(q, "x-kmig-migrate", json_pack("{s:s, s:I, s:b}",
				"policy", migrate__policy_name(&o),
				"vcpu-dirty-limit", (json_int_t)o.dirty_limit, "by-default", o.by_default));
		json_dumpf(q, stdout, JSON_INDENT(2));
		putchar('\n');
	} else {
		migrate__summary(q);
		if (!o.resume)
			migrate__print_policy(&o, stdout);
	}
	const char *st = json_string_value(json_object_get(q, "status"));
	int rc = !strcmp(st, "completed") ? 0 : !strcmp(st, "postcopy-paused") ? 3 : 1;
	if (rc == 3 && !o.json)
		fprintf(stderr, "post-copy is paused: the guest runs at the destination and waits for "
			"pages only this side has; go on with\n  kmig migrate --qmp unix:%s --resume "
			"--dest-qmp unix:DEST-QMP NEW-URI\n", o.qmp);
	json_decref(q);
	qmp_client__close(&c);
	return rc;
}
