#include "ctl/blk_cmds.h"

#include <errno.h>
#include <string.h>

#include "ctl/control.h"
#include "dev/blk.h"
#include "dev/blkfile.h"

#define BLK_DEV_DEFAULT_NAME "virtio-blk-pci.0"

static json_t *blk_cmds__counters(struct vm *vm)
{
	struct blk_stats s;
	struct blkfile_stats f;
	blk__get_stats(vm->blk, &s);
	blkfile__get_stats(vm->blkfile, &f);
	return json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}",
			 "rd-operations", (json_int_t)s.rd_ops, "rd-bytes", (json_int_t)s.rd_bytes,
			 "wr-operations", (json_int_t)s.wr_ops, "wr-bytes", (json_int_t)s.wr_bytes,
			 "flush-operations", (json_int_t)s.flush_ops,
			 "discard-operations", (json_int_t)s.discard_ops,
			 "write-zeroes-operations", (json_int_t)s.write_zeroes_ops,
			 "get-id-operations", (json_int_t)s.get_id_ops,
			 "io-errors", (json_int_t)s.io_errors,
			 "bad-requests", (json_int_t)s.bad_requests,
			 "unsupported", (json_int_t)s.unsupported,
			 "no-status", (json_int_t)s.no_status,
			 "in-flight", (json_int_t)s.inflight,
			 "kept", (json_int_t)s.kept,
			 "fdatasyncs", (json_int_t)f.flushes);
}

static json_t *blk_cmds__inserted(struct vm *vm)
{
	const struct vm_blk_config *bc = &vm->cfg.blkc;
	const char *path = blkfile__path(vm->blkfile);
	json_t *image = json_pack("{s:s,s:s,s:I}", "filename", path, "format", "raw",
				  "virtual-size", (json_int_t)blkfile__size(vm->blkfile));
	json_t *cache = json_pack("{s:b,s:b,s:b}", "writeback", bc->writeback, "direct", bc->direct,
				  "no-flush", 0);
	json_t *in = json_pack("{s:s,s:s,s:b,s:s,s:b,s:s,s:o,s:o,s:i,s:i,s:i,s:i,s:i,s:i,s:i}",
			       "file", path, "node-name", bc->node_name, "ro", bc->read_only,
			       "drv", "raw", "encrypted", 0, "detect_zeroes", "off",
			       "cache", cache, "image", image, "bps", 0, "bps_rd", 0, "bps_wr", 0,
			       "iops", 0, "iops_rd", 0, "iops_wr", 0, "write_threshold", 0);
	return in;
}

static json_t *blk_cmds__info(struct vm *vm)
{
	const struct vm_blk_config *bc = &vm->cfg.blkc;
	return json_pack("{s:s,s:s,s:b,s:b,s:s,s:o,s:s,s:b,s:o}",
			 "device", bc->legacy_drive ? bc->node_name : "",
			 "qdev", bc->device_id[0] ? bc->device_id : BLK_DEV_DEFAULT_NAME,
			 "locked", 0, "removable", 0,
			 "io-status", blk_io_status__name(blk__io_status(vm->blk)),
			 "inserted", blk_cmds__inserted(vm),
			 "x-image-lock", blkfile__lock_name(vm->blkfile),
			 "x-active", blkfile__active(vm->blkfile),
			 "x-counters", blk_cmds__counters(vm));
}

static json_t *cmd_query_block(void *ctx, json_t *args, struct qmp_error *err)
{
	static const char *const known[] = { "flat", NULL };
	struct control *c = ctx;
	if (qmp_arg__check_known(args, known, err))
		return NULL;
	json_t *list = json_array();
	if (list && c->vm->blk)
		json_array_append_new(list, blk_cmds__info(c->vm));
	return list;
}

int control__register_blk(struct control *c)
{
	return qmp__register(c->qmp, "query-block", cmd_query_block, c);
}

void control__on_io_error(void *ctx, const struct blk_io_error *e)
{
	struct control *c = ctx;
	const struct vm_blk_config *bc = &c->vm->cfg.blkc;
	char reason[128];
	const char *r = strerror_r(e->error, reason, sizeof(reason));   /* GNU's */
	control__event(c, "BLOCK_IO_ERROR",
		       json_pack("{s:s,s:s,s:s,s:s,s:b,s:s}",
				 "device", bc->legacy_drive ? bc->node_name : "",
				 "node-name", bc->node_name, "operation", e->write ? "write" : "read",
				 "action", blk_err_action__name(e->action), "nospace", e->error == ENOSPC,
				 "reason", r));
	if (e->action == BLK_ACT_STOP) {
		atomic_store(&c->io_error_stop, true);
		control__wake(c);
	}
}
