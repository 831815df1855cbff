/* kmig command line: parse, build the configuration, call into the rest. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/units.h"
#include "ctl/cliopt.h"
#include "ctl/client.h"
#include "ctl/control.h"
#include "ctl/blk_opts.h"
#include "ctl/ident_opts.h"
#include "ctl/kvopts.h"
#include "ctl/mem_opts.h"
#include "ctl/net_opts.h"
#include "kvm/vm.h"
#include "mig/migration.h"

struct run_opts {
	struct vm_config vm;
	const char *qmp;
	const char *console;
	const char *incoming;
	const char *objects[2 * TLS_MAX_OBJECTS];  /* --object SPEC */
	unsigned nobjects;
	const char *tls_creds, *tls_authz, *tls_hostname;
	struct net_opts net;
	struct blk_opts blk;
	struct mem_opts mem;
	uint64_t memory;     /* --memory's, 0 when not given */
	bool paused;         /* -S: the guest waits for `cont` */
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kmig run --kernel FILE [--initrd FILE] [--cmdline S] [--memory SIZE] [--cpus N]\n"
		"                [--console stdio|file:PATH|none] [--qmp unix:PATH]\n"
		"                [--dirty-ring ENTRIES|auto] [--reaper fixed|adaptive] [--kvmclock on|off]\n"
		"                [--balloon[=free-page-hint=on|off,free-page-reporting=on|off,\n"
	"                            ioeventfd=on|off]]\n"
		"                [--netdev tap,id=ID,ifname=TAP[,script=no]]\n"
		"                [--device virtio-net-pci,netdev=ID[,id=ID][,mac=MAC][,mtu=N][,csum=on|off]]\n"
		"                [--blockdev driver=file,filename=PATH,node-name=ID[,cache.direct=on]\n"
		"                            [,read-only=on][,discard=unmap]]\n"
		"                [--drive file=PATH,format=raw,if=none,id=ID[,readonly=on][,cache=none]\n"
		"                         [,werror=enospc|report|ignore|stop][,rerror=report|ignore|stop]]\n"
		"                [--device virtio-blk-pci,drive=ID[,id=ID][,serial=S][,write-cache=on|off]\n"
		"                          [,logical_block_size=N][,discard=unmap|ignore]\n"
		"                          [,werror=ACTION][,rerror=ACTION]]\n"
		"                [--incoming tcp:HOST:PORT|unix:PATH|exec:CMD|file:PATH|fd:N|defer]\n"
		"                [--object memory-backend-file,id=ID,size=SIZE,mem-path=PATH,share=on\n"
		"                 --machine memory-backend=ID] [--mem-prealloc]\n"
		"                [--object tls-creds-psk,id=ID,dir=DIR[,username=NAME]]\n"
		"                [--object tls-creds-x509,id=ID,dir=DIR[,verify-peer=on|off]]\n"
		"                [--object authz-simple,id=ID,identity=NAME]\n"
		"                [--tls-creds ID] [--tls-authz ID] [--tls-hostname NAME]\n"
		"                [-S] [--uuid UUID] [--name NAME]\n"
		"       kmig migrate --qmp unix:PATH URI [OPTIONS]   (kmig migrate --help lists them)\n"
		"       kmig version | --version | --help\n");
}

static int open_console(const char *spec, int *fd)
{
	if (!strcmp(spec, "stdio")) {
		*fd = STDOUT_FILENO;
	} else if (!strcmp(spec, "none")) {
		*fd = -1;
	} else if (!strncmp(spec, "file:", 5) && spec[5]) {
		*fd = open(spec + 5, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND, 0600);
		if (*fd < 0)
			die("--console %s: %s", spec, strerror(errno));
	} else {
		die("--console %s: expected stdio, none or file:PATH", spec);
	}
	return 0;
}

static int balloon_kv(void *ctx, const char *key, const char *val, char *err, size_t errlen)
{
	struct vm_config *c = ctx;
	bool *off = !strcmp(key, "free-page-hint") ? &c->balloon_no_hint :
		    !strcmp(key, "free-page-reporting") ? &c->balloon_no_reporting :
		    !strcmp(key, "ioeventfd") ? &c->balloon_no_ioeventfd : NULL;
	if (!off) {
		snprintf(err, errlen, "--balloon: unknown property %s (free-page-hint, "
			 "free-page-reporting, ioeventfd)", key);
		return -EINVAL;
	}
	if (strcmp(val, "on") && strcmp(val, "off")) {
		snprintf(err, errlen, "--balloon: %s=%s: expected %s=on|off", key, val, key);
		return -EINVAL;
	}
	*off = !strcmp(val, "off");
	return 0;
}

/* --balloon=KEY=on|off[,...]: which free page features the device offers,
 * and whether its queue notifications go through ioeventfds. */
static void parse_balloon(const char *spec, struct vm_config *c)
{
	char err[512];
	if (kvopts__split("--balloon", spec, balloon_kv, c, err, sizeof(err)))
		die("%s", err);
}

static void parse_run(int argc, char **argv, struct run_opts *o)
{
	static const struct option longopts[] = {
		{ "kernel", required_argument, 0, 'k' }, { "cmdline", required_argument, 0, 'c' },
		{ "initrd", required_argument, 0, 'I' },
		{ "memory", required_argument, 0, 'm' }, { "cpus", required_argument, 0, 'n' },
		{ "console", required_argument, 0, 'o' }, { "qmp", required_argument, 0, 'q' },
		{ "dirty-ring", required_argument, 0, 'r' }, { "incoming", required_argument, 0, 'i' },
		{ "reaper", required_argument, 0, 'R' }, { "balloon", optional_argument, 0, 'B' },
		{ "object", required_argument, 0, 'O' }, { "tls-creds", required_argument, 0, 'T' },
		{ "tls-authz", required_argument, 0, 'A' },
		{ "tls-hostname", required_argument, 0, 'H' },
		{ "kvmclock", required_argument, 0, 'K' },
		{ "netdev", required_argument, 0, 'N' }, { "device", required_argument, 0, 'D' },
		{ "blockdev", required_argument, 0, 'b' }, { "drive", required_argument, 0, 'd' },
		{ "machine", required_argument, 0, 'M' },
		{ "mem-prealloc", no_argument, 0, 'P' },
		{ "uuid", required_argument, 0, 'U' }, { "name", required_argument, 0, 'E' },
		{ "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	uint64_t v;
	int c;
	char err[512];
	memset(o, 0, sizeof(*o));
	net_opts__init(&o->net);
	blk_opts__init(&o->blk);
	o->vm.mem_size = 1ull << 30;
	o->vm.cpus = 1;
	o->vm.dirty_ring = VM_DIRTY_RING_AUTO;
	o->console = "stdio";
	char why[160];
	while ((c = getopt_long(argc, argv, ":S", longopts, NULL)) != -1) {
		switch (c) {
		case 'k': o->vm.kernel = optarg; break;
		case 'c': o->vm.cmdline = optarg; break;
		case 'I': o->vm.initrd = optarg; break;
		case 'm':
			if (units__parse_size(optarg, MiB, &v))
				die("--memory %s: not a size (e.g. 512M, 2G)", optarg);
			if (v < RAM_MIN_SIZE || v > RAM_MAX_SIZE || v % (2 * MiB))
				die("--memory %s: must be a multiple of 2 MiB from 128M to 16G", optarg);
			o->vm.mem_size = o->memory = v;
			break;
		case 'n':
			if (units__parse_u64(optarg, 1, VM_MAX_VCPUS, &v))
				die("--cpus %s: must be a number from 1 to %d", optarg, VM_MAX_VCPUS);
			o->vm.cpus = (unsigned)v;
			break;
		case 'o': o->console = optarg; break;
		case 'q':
			if (strncmp(optarg, "unix:", 5) || !optarg[5])
				die("--qmp %s: expected unix:PATH", optarg);
			o->qmp = optarg + 5;
			break;
		case 'r':
			if (!strcmp(optarg, "auto")) {
				o->vm.dirty_ring = VM_DIRTY_RING_AUTO;
				break;
			}
			if (units__parse_u64(optarg, 0, 65536, &v) || (v & (v - 1)) ||
			    (v && v < 256))
				die("--dirty-ring %s: auto, 0 (bitmap) or a power of two from 256 to 65536",
				    optarg);
			o->vm.dirty_ring = (uint32_t)v;
			break;
		case 'i': o->incoming = optarg; break;
		case 'R':
			if (strcmp(optarg, "fixed") && strcmp(optarg, "adaptive"))
				die("--reaper %s: expected fixed or adaptive", optarg);
			o->vm.reaper_fixed = !strcmp(optarg, "fixed");
			break;
		case 'B':
			o->vm.balloon = true;
			if (optarg)
				parse_balloon(optarg, &o->vm);
			break;
		case 'O':
			if (mem_opts__is_object(optarg)) {
				if (mem_opts__object(&o->mem, optarg, err, sizeof(err)))
					die("%s", err);
				break;
			}
			if (o->nobjects == sizeof(o->objects) / sizeof(o->objects[0]))
				die("--object: at most %zu", sizeof(o->objects) / sizeof(o->objects[0]));
			o->objects[o->nobjects++] = optarg;
			break;
		case 'K':
			if (strcmp(optarg, "on") && strcmp(optarg, "off"))
				die("--kvmclock %s: expected on or off", optarg);
			o->vm.kvmclock = !strcmp(optarg, "on");
			break;
		case 'N':
			if (net_opts__netdev(&o->net, optarg, err, sizeof(err)))
				die("%s", err);
			break;
		case 'D':
			if (blk_opts__is_device(optarg) ? blk_opts__device(&o->blk, optarg, err, sizeof(err))
							: net_opts__device(&o->net, optarg, err, sizeof(err)))
				die("%s", err);
			break;
		case 'b':
			if (blk_opts__blockdev(&o->blk, optarg, err, sizeof(err)))
				die("%s", err);
			break;
		case 'd':
			if (blk_opts__drive(&o->blk, optarg, err, sizeof(err)))
				die("%s", err);
			break;
		case 'M':
			if (mem_opts__machine(&o->mem, optarg, err, sizeof(err)))
				die("%s", err);
			break;
		case 'U':
			if (ident_opts__uuid(&o->vm, optarg, err, sizeof(err)))
				die("%s", err);
			break;
		case 'E':
			if (ident_opts__name(&o->vm, optarg, err, sizeof(err)))
				die("%s", err);
			break;
		case 'S': o->paused = true; break;
		case 'P': o->vm.mem_prealloc = true; break;
		case 'T': o->tls_creds = optarg; break;
		case 'A': o->tls_authz = optarg; break;
		case 'H': o->tls_hostname = optarg; break;
		case 'h': usage(stdout); exit(0);
		default:
			die_usage("%s (kmig run --help)",
				  cliopt__why(c, argc, argv, longopts, why, sizeof(why)));
		}
	}
	if (optind < argc)
		die_usage("unexpected argument: %s", argv[optind]);
	if (!o->vm.kernel && !o->incoming)
		die_usage("--kernel FILE is required (kmig run --help)");
	if (o->paused && !o->qmp)
		die("-S needs --qmp: nothing else could send the `cont` that starts the guest");
	if (o->vm.initrd && !o->vm.kernel)
		die("--initrd needs --kernel (an incoming VM gets its RAM by migration)");
	if (o->vm.kernel && access(o->vm.kernel, R_OK))
		die("--kernel %s: %s", o->vm.kernel, strerror(errno));
	if (o->vm.initrd && access(o->vm.initrd, R_OK))
		die("--initrd %s: %s", o->vm.initrd, strerror(errno));
	if (net_opts__finish(&o->net, &o->vm.netc, &o->vm.net, err, sizeof(err)))
		die("%s", err);
	if (blk_opts__finish(&o->blk, &o->vm.blkc, &o->vm.blk, err, sizeof(err)))
		die("%s", err);
	if (mem_opts__finish(&o->mem, o->memory, &o->vm, err, sizeof(err)))
		die("%s", err);
	o->vm.incoming = o->incoming != NULL;
	open_console(o->console, &o->vm.console_fd);
}

/* --object and the initial tls-creds / tls-authz / tls-hostname. */
static void run_tls(const struct run_opts *o, struct migration *mig)
{
	char err[512];
	struct mig_params *p = &mig->params;
	for (unsigned i = 0; i < o->nobjects; i++)
		if (tls_objects__add(&mig->tls, o->objects[i], err, sizeof(err)))
			die("--object %s: %s", o->objects[i], err);
	if (o->tls_creds && !tls_objects__creds(&mig->tls, o->tls_creds))
		die("--tls-creds %s: no tls-creds object with that id (--object)", o->tls_creds);
	if (o->tls_authz && !tls_objects__authz(&mig->tls, o->tls_authz))
		die("--tls-authz %s: no authz-simple object with that id (--object)", o->tls_authz);
	if (o->tls_hostname && strlen(o->tls_hostname) >= sizeof(p->tls_hostname))
		die("--tls-hostname: longer than %zu bytes", sizeof(p->tls_hostname) - 1);
	snprintf(p->tls_creds, sizeof(p->tls_creds), "%s", o->tls_creds ? o->tls_creds : "");
	snprintf(p->tls_authz, sizeof(p->tls_authz), "%s", o->tls_authz ? o->tls_authz : "");
	snprintf(p->tls_hostname, sizeof(p->tls_hostname), "%s",
		 o->tls_hostname ? o->tls_hostname : "");
}

/* --incoming fd:N: N must be open when kmig starts (close-on-exec from
 * now on); N, or -1 for another URI. */
static int inherited_fd(const char *uri)
{
	if (strncmp(uri, "fd:", 3) || uri[3] < '0' || uri[3] > '9')
		return -1;
	char *end;
	long n = strtol(uri + 3, &end, 10);
	if (*end || n < 3 || n > INT32_MAX || fcntl((int)n, F_SETFD, FD_CLOEXEC) < 0)
		die("--incoming %s: not a descriptor this process was started with (3 or above)",
		    uri);
	return (int)n;
}

static int cmd_run(int argc, char **argv)
{
	struct run_opts o;
	parse_run(argc, argv, &o);
	if (access("/dev/kvm", R_OK | W_OK)) {
		int e = errno;
		die("/dev/kvm: %s%s", strerror(e),
		    e == ENOENT ? " (this host has no KVM; scripts/kvm-vm -- COMMAND runs a "
				  "command inside a VM that has one, under emulation)" : "");
	}
	/* before kmig opens a descriptor of its own: fd:N must be one it was
	 * given, never one of kmig's that took a free number */
	int inherited = o.incoming ? inherited_fd(o.incoming) : -1;
	struct vm *vm = calloc(1, sizeof(*vm));
	struct control *ctl = calloc(1, sizeof(*ctl));
	struct migration *mig = calloc(1, sizeof(*mig));
	char err[512];
	if (!vm || !ctl || !mig)
		die("out of memory");
	if (vm__create(vm, &o.vm, err, sizeof(err)))
		die("%s", err);
	if (control__init(ctl, vm, o.qmp, err, sizeof(err)))
		die("%s", err);
	migration__init(mig, vm, ctl);
	mig->inherited_fd = inherited;
	ctl->mig = mig;
	run_tls(&o, mig);
	if (ctl->qmp && migration__register_qmp(mig))
		die("cannot register the migration commands");
	vm->autostart = !o.paused;   /* before any thread reads it */
	if (vm__start(vm, o.incoming ? VM_STATUS_INMIGRATE :
			  o.paused ? VM_STATUS_PRELAUNCH : VM_STATUS_RUNNING))
		die("cannot start vCPU threads");
	if (o.incoming) {
		if (strcmp(o.incoming, "defer") && migration__incoming(mig, o.incoming, err, sizeof(err)))
			die("--incoming %s: %s", o.incoming, err);
	}
	int status = control__run(ctl);
	migration__stop_threads(mig); /* they use the VM: stop them first */
	vm__destroy(vm);
	migration__destroy(mig);
	control__destroy(ctl);
	free(mig);
	free(vm);
	free(ctl);
	return status;
}

int main(int argc, char **argv)
{
	if (getenv("KMIG_DEBUG"))
		log__set_level(LOG_DEBUG);
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "run"))
		return cmd_run(argc - 1, argv + 1);
	if (!strcmp(argv[1], "migrate"))
		return client__migrate_main(argc - 1, argv + 1);
	bool version = !strcmp(argv[1], "version") || !strcmp(argv[1], "--version") ||
		       !strcmp(argv[1], "-V");
	bool help = !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help");
	if ((version || help) && argc > 2)
		die_usage("%s takes no arguments (unexpected: %s)", argv[1], argv[2]);
	if (version) {
		printf("kmig 0.1.0\n");
		return 0;
	}
	if (help) {
		usage(stdout);
		return 0;
	}
	die_usage("unknown command '%s' (run, migrate, version; kmig --help)", argv[1]);
}
