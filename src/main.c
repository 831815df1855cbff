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
#include "ctl/client.h"
#include "ctl/control.h"
#include "kvm/vm.h"
#include "mig/migration.h"

struct run_opts {
	struct vm_config vm;
	const char *qmp;
	const char *console;
	const char *incoming;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kmig run --kernel FILE [--cmdline S] [--memory SIZE] [--cpus N]\n"
		"                [--console stdio|file:PATH|none] [--qmp unix:PATH]\n"
		"                [--dirty-ring ENTRIES] [--reaper fixed|adaptive] [--balloon]\n"
		"                [--incoming tcp:HOST:PORT|unix:PATH|defer]\n"
		"       kmig migrate --qmp unix:PATH URI [--bandwidth MB/s] [--downtime MS]\n"
		"                    [--auto-converge step|computed] [--dirty-limit MB/s] [--multifd N]\n"
		"                    [--compression none|zstd|lz4]\n"
		"                    [--verify] [--json]\n"
		"       kmig version\n");
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

static void parse_run(int argc, char **argv, struct run_opts *o)
{
	static const struct option longopts[] = {
		{ "kernel", required_argument, 0, 'k' }, { "cmdline", required_argument, 0, 'c' },
		{ "memory", required_argument, 0, 'm' }, { "cpus", required_argument, 0, 'n' },
		{ "console", required_argument, 0, 'o' }, { "qmp", required_argument, 0, 'q' },
		{ "dirty-ring", required_argument, 0, 'r' }, { "incoming", required_argument, 0, 'i' },
		{ "reaper", required_argument, 0, 'R' }, { "balloon", no_argument, 0, 'B' },
		{ "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
	};
	uint64_t v;
	int c;
	memset(o, 0, sizeof(*o));
	o->vm.mem_size = 1ull << 30;
	o->vm.cpus = 1;
	o->console = "stdio";
	while ((c = getopt_long(argc, argv, ":", longopts, NULL)) != -1) {
		switch (c) {
		case 'k': o->vm.kernel = optarg; break;
		case 'c': o->vm.cmdline = optarg; break;
		case 'm':
			if (units__parse_size(optarg, MiB, &v))
				die("--memory %s: not a size (e.g. 512M, 2G)", optarg);
			if (v < RAM_MIN_SIZE || v > RAM_MAX_SIZE || v % (2 * MiB))
				die("--memory %s: must be a multiple of 2 MiB from 128M to 16G", optarg);
			o->vm.mem_size = v;
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
			if (units__parse_u64(optarg, 0, 65536, &v) || (v & (v - 1)) ||
			    (v && v < 256))
				die("--dirty-ring %s: 0 (bitmap) or a power of two from 256 to 65536", optarg);
			o->vm.dirty_ring = (uint32_t)v;
			break;
		case 'i': o->incoming = optarg; break;
		case 'R':
			if (strcmp(optarg, "fixed") && strcmp(optarg, "adaptive"))
				die("--reaper %s: expected fixed or adaptive", optarg);
			o->vm.reaper_fixed = !strcmp(optarg, "fixed");
			break;
		case 'B': o->vm.balloon = true; break;
		case 'h': usage(stdout); exit(0);
		case ':': die("%s: missing argument", argv[optind - 1]);
		default: die("unknown option: %s (see kmig run --help)", argv[optind - 1]);
		}
	}
	if (optind < argc)
		die("unexpected argument: %s", argv[optind]);
	if (!o->vm.kernel && !o->incoming)
		die("--kernel FILE is required");
	o->vm.incoming = o->incoming != NULL;
	open_console(o->console, &o->vm.console_fd);
}

static int cmd_run(int argc, char **argv)
{
	struct run_opts o;
	parse_run(argc, argv, &o);
	if (access("/dev/kvm", R_OK | W_OK))
		die("/dev/kvm: %s", strerror(errno));
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
	ctl->mig = mig;
	if (ctl->qmp && migration__register_qmp(mig))
		die("cannot register the migration commands");
	if (vm__start(vm, o.incoming != NULL))
		die("cannot start vCPU threads");
	if (o.incoming) {
		vm__set_status(vm, VM_STATUS_INMIGRATE);
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
	if (!strcmp(argv[1], "version")) {
		printf("kmig 0.1.0\n");
		return 0;
	}
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	fprintf(stderr, "kmig: unknown command '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
