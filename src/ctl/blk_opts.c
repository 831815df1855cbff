#include "ctl/blk_opts.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl/kvopts.h"
#include "dev/blk.h"

void blk_opts__init(struct blk_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->write_cache = -1;
	o->discard = -1;
	o->drive_werror = o->drive_rerror = o->device_werror = o->device_rerror = -1;
}

bool blk_opts__is_device(const char *spec)
{
	return kvopts__after_driver(spec, "virtio-blk-pci") != NULL;
}

static int blk_opts__discard(struct blk_opts *o, const char *opt, const char *val, char *err,
			     size_t errlen)
{
	if (strcmp(val, "unmap") && strcmp(val, "ignore")) {
		snprintf(err, errlen, "%s: discard=%s: expected unmap or ignore", opt, val);
		return -EINVAL;
	}
	o->discard = !strcmp(val, "unmap");
	return 0;
}

/* werror= / rerror= into *out (enum blk_on_error; auto, where allowed:
 * -1).  0, or -EINVAL with err set. */
static int blk_opts__on_error(const char *opt, const char *key, const char *val, bool with_auto,
			      int *out, char *err, size_t errlen)
{
	static const struct { const char *name; int v; } acts[] = {
		{ "report", BLK_ON_ERR_REPORT }, { "ignore", BLK_ON_ERR_IGNORE },
		{ "stop", BLK_ON_ERR_STOP }, { "enospc", BLK_ON_ERR_ENOSPC }, { "auto", -1 },
	};
	bool rd = !strcmp(key, "rerror");
	for (size_t i = 0; i < sizeof(acts) / sizeof(acts[0]); i++) {
		if (strcmp(val, acts[i].name) || (rd && acts[i].v == BLK_ON_ERR_ENOSPC) ||
		    (!with_auto && acts[i].v < 0))
			continue;
		*out = acts[i].v;
		return 0;
	}
	snprintf(err, errlen, "%s: %s=%s: invalid %s error action (expected %s%s)", opt, key, val,
		 rd ? "read" : "write", with_auto ? "auto, " : "",
		 rd ? "report, ignore or stop" : "enospc, report, ignore or stop");
	return -EINVAL;
}

static int blk_opts__blockdev_kv(void *ctx, const char *key, const char *val, char *err,
				 size_t errlen)
{
	struct blk_opts *o = ctx;
	const char *opt = "--blockdev";
	if (!strcmp(key, "driver")) {
		if (!strcmp(val, "file") || !strcmp(val, "host_device"))
			return 0;
		snprintf(err, errlen, "%s: driver=%s: kmig has driver=file (raw images) only", opt, val);
		return -EINVAL;
	}
	if (!strcmp(key, "filename"))
		return kvopts__copy(o->dev.path, sizeof(o->dev.path), opt, key, val, err, errlen);
	if (!strcmp(key, "node-name"))
		return kvopts__copy(o->dev.node_name, sizeof(o->dev.node_name), opt, key, val, err,
				      errlen);
	if (!strcmp(key, "cache.direct"))
		return kvopts__onoff(opt, key, val, &o->dev.direct, err, errlen);
	if (!strcmp(key, "read-only"))
		return kvopts__onoff(opt, key, val, &o->dev.read_only, err, errlen);
	if (!strcmp(key, "discard"))
		return blk_opts__discard(o, opt, val, err, errlen);
	snprintf(err, errlen, "%s: unknown or unsupported property %s=%s (driver, filename, "
		 "node-name, cache.direct, read-only, discard)", opt, key, val);
	return -EINVAL;
}

static int blk_opts__cache(struct blk_opts *o, const char *val, char *err, size_t errlen)
{
	static const struct { const char *name; bool direct, wb; } modes[] = {
		{ "writeback", false, true }, { "none", true, true },
		{ "writethrough", false, false }, { "directsync", true, false },
	};
	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
		if (strcmp(val, modes[i].name))
			continue;
		o->dev.direct = modes[i].direct;
		if (o->write_cache < 0)
			o->write_cache = modes[i].wb;
		return 0;
	}
	snprintf(err, errlen, "--drive: cache=%s: expected writeback, none, writethrough or "
		 "directsync", val);
	return -EINVAL;
}

static int blk_opts__drive_kv(void *ctx, const char *key, const char *val, char *err,
			      size_t errlen)
{
	struct blk_opts *o = ctx;
	const char *opt = "--drive";
	if (!strcmp(key, "file"))
		return kvopts__copy(o->dev.path, sizeof(o->dev.path), opt, key, val, err, errlen);
	if (!strcmp(key, "id"))
		return kvopts__copy(o->dev.node_name, sizeof(o->dev.node_name), opt, key, val, err,
				      errlen);
	if (!strcmp(key, "format") || !strcmp(key, "if")) {
		if (!strcmp(val, !strcmp(key, "format") ? "raw" : "none"))
			return 0;
		snprintf(err, errlen, "%s: %s=%s: kmig takes %s", opt, key, val,
			 !strcmp(key, "format") ? "format=raw (raw images only)" :
			 "if=none with --device virtio-blk-pci,drive=ID");
		return -EINVAL;
	}
	if (!strcmp(key, "readonly"))
		return kvopts__onoff(opt, key, val, &o->dev.read_only, err, errlen);
	if (!strcmp(key, "cache"))
		return blk_opts__cache(o, val, err, errlen);
	if (!strcmp(key, "discard"))
		return blk_opts__discard(o, opt, val, err, errlen);
	if (!strcmp(key, "werror") || !strcmp(key, "rerror"))
		return blk_opts__on_error(opt, key, val, false, key[0] == 'w' ? &o->drive_werror :
					  &o->drive_rerror, err, errlen);
	snprintf(err, errlen, "%s: unknown or unsupported property %s=%s (file, format=raw, if=none, "
		 "id, readonly, cache, discard, werror, rerror)", opt, key, val);
	return -EINVAL;
}

static int blk_opts__drive_common(struct blk_opts *o, const char *opt, const char *spec,
				  kvopts_fn fn, char *err, size_t errlen)
{
	if (o->have_drive) {
		snprintf(err, errlen, "%s %s: kmig has one disk", opt, spec);
		return -EINVAL;
	}
	int rc = kvopts__split(opt, spec, fn, o, err, errlen);
	if (!rc && (!o->dev.path[0] || !o->dev.node_name[0])) {
		snprintf(err, errlen, "%s %s: %s are required", opt, spec,
			 !strcmp(opt, "--drive") ? "file= and id=" : "filename= and node-name=");
		rc = -EINVAL;
	}
	snprintf(o->drive_opt, sizeof(o->drive_opt), "%s", opt);
	o->have_drive = rc == 0;
	return rc;
}

int blk_opts__blockdev(struct blk_opts *o, const char *spec, char *err, size_t errlen)
{
	return blk_opts__drive_common(o, "--blockdev", spec, blk_opts__blockdev_kv, err, errlen);
}

int blk_opts__drive(struct blk_opts *o, const char *spec, char *err, size_t errlen)
{
	return blk_opts__drive_common(o, "--drive", spec, blk_opts__drive_kv, err, errlen);
}

static int blk_opts__lbs(struct blk_opts *o, const char *val, char *err, size_t errlen)
{
	char *end;
	unsigned long v = strtoul(val, &end, 10);
	if (*end || !*val || v < 512 || v > 65536 || (v & (v - 1))) {
		snprintf(err, errlen, "--device: logical_block_size=%s: expected a power of two "
			 "from 512 to 65536", val);
		return -EINVAL;
	}
	o->dev.lbs = (uint32_t)v;
	return 0;
}

static int blk_opts__device_kv(void *ctx, const char *key, const char *val, char *err,
			       size_t errlen)
{
	struct blk_opts *o = ctx;
	const char *opt = "--device";
	if (!strcmp(key, "drive"))
		return kvopts__copy(o->device_drive, sizeof(o->device_drive), opt, key, val, err,
				      errlen);
	if (!strcmp(key, "id"))
		return kvopts__copy(o->dev.device_id, sizeof(o->dev.device_id), opt, key, val, err,
				      errlen);
	if (!strcmp(key, "serial")) {
		if (strlen(val) > 20) {
			snprintf(err, errlen, "%s: serial=%s: at most 20 bytes (virtio-blk's ID)", opt, val);
			return -EINVAL;
		}
		memcpy(o->dev.serial, val, strlen(val) + 1);
		return 0;
	}
	if (!strcmp(key, "write-cache")) {
		bool on;
		int rc = kvopts__onoff(opt, key, val, &on, err, errlen);
		o->write_cache = rc ? o->write_cache : on;
		return rc;
	}
	if (!strcmp(key, "logical_block_size"))
		return blk_opts__lbs(o, val, err, errlen);
	if (!strcmp(key, "discard"))
		return blk_opts__discard(o, opt, val, err, errlen);
	if (!strcmp(key, "werror") || !strcmp(key, "rerror"))
		return blk_opts__on_error(opt, key, val, true, key[0] == 'w' ? &o->device_werror :
					  &o->device_rerror, err, errlen);
	snprintf(err, errlen, "%s: unknown or unsupported property %s=%s (drive, id, serial, "
		 "write-cache, logical_block_size, discard, werror, rerror)", opt, key, val);
	return -EINVAL;
}

int blk_opts__device(struct blk_opts *o, const char *spec, char *err, size_t errlen)
{
	if (o->have_device) {
		snprintf(err, errlen, "--device %s: kmig has one virtio-blk-pci device", spec);
		return -EINVAL;
	}
	const char *rest = kvopts__after_driver(spec, "virtio-blk-pci");
	if (!rest) {
		snprintf(err, errlen, "--device %s: not virtio-blk-pci", spec);
		return -EINVAL;
	}
	int rc = kvopts__split("--device", rest, blk_opts__device_kv, o, err, errlen);
	if (!rc && !o->device_drive[0]) {
		snprintf(err, errlen, "--device %s: drive= is required", spec);
		rc = -EINVAL;
	}
	o->have_device = rc == 0;
	return rc;
}

int blk_opts__finish(const struct blk_opts *o, struct vm_blk_config *out, bool *on, char *err,
		     size_t errlen)
{
	*on = false;
	if (!o->have_drive && !o->have_device)
		return 0;
	if (!o->have_device) {
		snprintf(err, errlen, "%s %s: no --device virtio-blk-pci,drive=%s uses it",
			 o->drive_opt, o->dev.node_name, o->dev.node_name);
		return -EINVAL;
	}
	if (!o->have_drive || strcmp(o->dev.node_name, o->device_drive)) {
		snprintf(err, errlen, "--device virtio-blk-pci: drive=%s names no --blockdev "
			 "node-name or --drive id", o->device_drive);
		return -EINVAL;
	}
	*out = o->dev;
	out->writeback = o->write_cache != 0;       /* on unless said off */
	out->discard = o->discard == 1;
	if (!out->lbs)
		out->lbs = 512;
	out->legacy_drive = !strcmp(o->drive_opt, "--drive");
	out->werror = o->device_werror >= 0 ? o->device_werror :
		      o->drive_werror >= 0 ? o->drive_werror : BLK_ON_ERR_ENOSPC;
	out->rerror = o->device_rerror >= 0 ? o->device_rerror :
		      o->drive_rerror >= 0 ? o->drive_rerror : BLK_ON_ERR_REPORT;
	*on = true;
	return 0;
}
