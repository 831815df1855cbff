#include "ctl/mem_opts.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/units.h"
#include "ctl/kvopts.h"
#include "mem/ram.h"

#define MEM_OBJ "--object memory-backend-file"

bool mem_opts__is_object(const char *spec)
{
	return !strncmp(spec, "memory-backend-", 15);
}

static int mem_opts__object_kv(void *ctx, const char *key, const char *val, char *err,
			       size_t errlen)
{
	struct mem_opts *o = ctx;
	if (!strcmp(key, "id"))
		return kvopts__copy(o->id, sizeof(o->id), MEM_OBJ, key, val, err, errlen);
	if (!strcmp(key, "mem-path"))
		return kvopts__copy(o->path, sizeof(o->path), MEM_OBJ, key, val, err, errlen);
	if (!strcmp(key, "share"))
		return kvopts__onoff(MEM_OBJ, key, val, &o->share, err, errlen);
	if (!strcmp(key, "size")) {
		if (units__parse_size(val, 1, &o->size) || o->size < RAM_MIN_SIZE ||
		    o->size > RAM_MAX_SIZE || o->size % (2ull << 20)) {
			snprintf(err, errlen, MEM_OBJ ": size=%s: a multiple of 2 MiB from 128M to 16G",
				 val);
			return -EINVAL;
		}
		return 0;
	}
	snprintf(err, errlen, MEM_OBJ ": unknown key '%s' (id, size, mem-path, share)", key);
	return -EINVAL;
}

int mem_opts__object(struct mem_opts *o, const char *spec, char *err, size_t errlen)
{
	const char *rest = kvopts__after_driver(spec, "memory-backend-file");
	if (!rest) {
		snprintf(err, errlen, "--object %s: kmig's memory backend is memory-backend-file "
			 "(share=on)", spec);
		return -EINVAL;
	}
	if (o->have_object) {
		snprintf(err, errlen, MEM_OBJ ": one memory backend per VM");
		return -EINVAL;
	}
	int rc = kvopts__split(MEM_OBJ, rest, mem_opts__object_kv, o, err, errlen);
	if (rc)
		return rc;
	const char *miss = !o->id[0] ? "id" : !o->size ? "size" : !o->path[0] ? "mem-path" : NULL;
	if (miss) {
		snprintf(err, errlen, MEM_OBJ ": %s= is required", miss);
		return -EINVAL;
	}
	if (!o->share) {
		snprintf(err, errlen, MEM_OBJ ",id=%s: share=on is required (kmig maps the file "
			 "shared; a private copy of a file is not kept)", o->id);
		return -EINVAL;
	}
	o->have_object = true;
	return 0;
}

static int mem_opts__machine_kv(void *ctx, const char *key, const char *val, char *err,
				size_t errlen)
{
	struct mem_opts *o = ctx;
	if (!strcmp(key, "memory-backend"))
		return kvopts__copy(o->machine_backend, sizeof(o->machine_backend), "--machine", key,
				    val, err, errlen);
	snprintf(err, errlen, "--machine: unknown key '%s' (memory-backend)", key);
	return -EINVAL;
}

int mem_opts__machine(struct mem_opts *o, const char *spec, char *err, size_t errlen)
{
	if (o->have_machine) {
		snprintf(err, errlen, "--machine: given twice");
		return -EINVAL;
	}
	int rc = kvopts__split("--machine", spec, mem_opts__machine_kv, o, err, errlen);
	if (!rc && !o->machine_backend[0]) {
		snprintf(err, errlen, "--machine %s: memory-backend=ID is required", spec);
		rc = -EINVAL;
	}
	o->have_machine = !rc;
	return rc;
}

int mem_opts__finish(const struct mem_opts *o, uint64_t memory, struct vm_config *c, char *err,
		     size_t errlen)
{
	if (!o->have_object && !o->have_machine)
		return 0;
	if (!o->have_machine) {
		snprintf(err, errlen, MEM_OBJ ",id=%s: not used: add --machine memory-backend=%s",
			 o->id, o->id);
		return -EINVAL;
	}
	if (!o->have_object || strcmp(o->id, o->machine_backend)) {
		snprintf(err, errlen, "--machine memory-backend=%s: no memory-backend-file with "
			 "that id (--object)", o->machine_backend);
		return -EINVAL;
	}
	if (memory && memory != o->size) {
		snprintf(err, errlen, "--memory is %llu MiB but memory backend %s has size=%llu MiB",
			 (unsigned long long)(memory >> 20), o->id,
			 (unsigned long long)(o->size >> 20));
		return -EINVAL;
	}
	c->mem_size = o->size;
	snprintf(c->mem_path, sizeof(c->mem_path), "%s", o->path);
	snprintf(c->mem_id, sizeof(c->mem_id), "%s", o->id);
	return 0;
}
