/* DISK records (x-block-migration); see proto.h and docs/protocol.md. */
#include <errno.h>
#include <string.h>

#include "mig/wire/proto.h"
#include "mig/wire/proto_le.h"

/* Payload bytes after the 24 of the head. */
static uint64_t proto__disk_data_len(uint32_t kind, uint64_t length)
{
	return kind == PROTO_DISK_DATA ? length : kind == PROTO_DISK_SUM ? PROTO_DISK_SUM_LEN : 0;
}

static bool proto__disk_kind_ok(uint32_t kind)
{
	return kind <= PROTO_DISK_SUM;
}

/* The rules every DISK record keeps, for the encoder and the decoder. */
static const char *proto__disk_problem(uint32_t kind, uint64_t offset, uint64_t length)
{
	if (!proto__disk_kind_ok(kind))
		return "DISK record of an unknown kind";
	if (!length || length % PROTO_DISK_SECTOR || offset % PROTO_DISK_SECTOR)
		return "DISK range is empty or not a multiple of 512 bytes";
	if ((kind == PROTO_DISK_INFO || kind == PROTO_DISK_SUM) && offset)
		return "DISK INFO or SUM offset is not 0";
	if (kind == PROTO_DISK_DATA && length > PROTO_DISK_MAX_DATA)
		return "DISK DATA longer than 1 MiB";
	if (offset + length < offset)
		return "DISK range wraps around";
	return NULL;
}

static ssize_t proto__disk_head(void *buf, size_t cap, uint32_t flags, enum proto_disk_kind kind,
				uint64_t offset, uint64_t length)
{
	if (proto__disk_problem(kind, offset, length))
		return -EINVAL;
	uint64_t payload = PROTO_DISK_HDR + proto__disk_data_len(kind, length);
	size_t head = PROTO_HDR_SIZE + PROTO_DISK_HDR;
	if (cap < head)
		return -ENOSPC;
	uint8_t *b = buf;
	if (proto__encode_header(b, cap, PROTO_DISK, flags, payload))
		return -ENOSPC;
	uint8_t *p = b + PROTO_HDR_SIZE;
	le__put32(p, kind);
	le__put32(p + 4, 0);
	le__put64(p + 8, offset);
	le__put64(p + 16, length);
	return (ssize_t)head;
}

ssize_t proto__encode_disk_head(void *buf, size_t cap, enum proto_disk_kind kind,
				uint64_t offset, uint64_t length)
{
	return kind == PROTO_DISK_INFO ? -EINVAL : proto__disk_head(buf, cap, 0, kind, offset, length);
}

ssize_t proto__encode_disk_info(void *buf, size_t cap, uint64_t size, bool sum)
{
	return proto__disk_head(buf, cap, sum ? PROTO_F_HAS_CHECKSUM : 0, PROTO_DISK_INFO, 0, size);
}

int proto__decode_disk(const void *payload, size_t len, uint32_t flags, struct proto_disk *d,
		       const char **why)
{
	const uint8_t *p = payload;
	if (len < PROTO_DISK_HDR) {
		*why = "DISK record too short";
		return -EPROTO;
	}
	uint32_t kind = le__get32(p);
	d->drive = le__get32(p + 4);
	d->offset = le__get64(p + 8);
	d->length = le__get64(p + 16);
	const char *bad = proto__disk_problem(kind, d->offset, d->length);
	if (!bad && d->drive)
		bad = "DISK record for a drive other than 0";
	if (!bad && (flags & PROTO_F_HAS_CHECKSUM) && kind != PROTO_DISK_INFO)
		bad = "DISK checksum flag on a record other than INFO";
	if (!bad && len - PROTO_DISK_HDR != proto__disk_data_len(kind, d->length))
		bad = "DISK length does not match its kind and range";
	if (bad) {
		*why = bad;
		return -EPROTO;
	}
	d->kind = (enum proto_disk_kind)kind;
	d->data = proto__disk_data_len(kind, d->length) ? p + PROTO_DISK_HDR : NULL;
	d->sum_follows = flags & PROTO_F_HAS_CHECKSUM;
	return 0;
}
