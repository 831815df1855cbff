/* QEMU's command-line options for guest RAM in a file, as kmig run takes
 * them:
 *   --object memory-backend-file,id=ID,size=SIZE,mem-path=PATH,share=on
 *   --machine memory-backend=ID
 * (mem/memfile.h says what the file holds).  share=on is required: kmig
 * maps a file only shared, which is what lets a second kmig on the host
 * take the guest over without copying its RAM (x-ignore-shared).  --memory,
 * when given too, must say the backend's size.  Every error names the
 * option and the value it refuses. */
#ifndef KMIG_CTL_MEM_OPTS_H
#define KMIG_CTL_MEM_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"
#include "kvm/vm.h"

struct mem_opts {
	bool have_object, have_machine;
	char id[32], path[1024], machine_backend[32];
	uint64_t size;
	bool share;
};

/* Whether an --object SPEC is a memory backend (this module's). */
bool mem_opts__is_object(const char *spec);
int mem_opts__object(struct mem_opts *o, const char *spec, char *err,
		     size_t errlen) KMIG_MUST_CHECK;
int mem_opts__machine(struct mem_opts *o, const char *spec, char *err,
		      size_t errlen) KMIG_MUST_CHECK;
/* Checks the pair and --memory (memory: the size given there, 0 if none)
 * and fills c's mem_size, mem_path and mem_id. */
int mem_opts__finish(const struct mem_opts *o, uint64_t memory, struct vm_config *c, char *err,
		     size_t errlen) KMIG_MUST_CHECK;

#endif
