/* x-block-migration on the source: the disk's pass before each RAM pass
 * (send_impl.h, disk_out.h; docs/protocol.md "DISK"). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "base/timeutil.h"
#include "dev/blkfile.h"
#include "kvm/vm.h"
#include "mig/send/send_impl.h"
#include "mig/wire/proto_le.h"

#define SENDER_DISK_POLL_CHUNKS 16

int sender__disk_setup(struct sender *s)
{
	struct migration *m = s->m;
	if (!m->params.cap_block_migration)
		return 0;
	struct blkfile *f = m->vm->blkfile;
	if (!f) {
		migration__set_error(m, "x-block-migration: this VM has no disk");
		return -EINVAL;
	}
	int rc = disk_out__start(&s->disk, f, m->params.cap_verify);
	if (rc) {
		migration__set_error(m, "x-block-migration: image %s: %s", blkfile__path(f),
				     strerror(-rc));
		return rc;
	}
	s->disk_on = true;
	ssize_t n = proto__encode_disk_info(s->rec, s->rec_cap, s->disk.size, s->disk.sum_on);
	rc = n < 0 ? (int)n : mig_stream__write(s->stream, s->rec, (size_t)n);
	if (!rc)
		s->disk_bytes += (uint64_t)n;
	pthread_mutex_lock(&m->lock);
	m->stats.disk = true;
	m->stats.disk_total = s->disk.size;
	pthread_mutex_unlock(&m->lock);
	log_info("migration: the disk goes in the stream (%llu MiB, %llu MiB to send first)",
		 (unsigned long long)(s->disk.size >> 20),
		 (unsigned long long)(disk_out__pending(&s->disk) >> 20));
	return rc;
}

void sender__disk_stop(struct sender *s)
{
	if (s->disk_on)
		disk_out__stop(&s->disk);
	s->disk_on = false;
}

uint64_t sender__disk_pending(const struct sender *s)
{
	return s->disk_on ? disk_out__pending(&s->disk) : 0;
}

uint64_t sender__disk_dirty(const struct sender *s)
{
	return s->disk_on ? disk_out__dirty_bytes(&s->disk) : 0;
}

static int sender__disk_chunk(struct sender *s, uint64_t off, uint64_t len, bool zero)
{
	ssize_t n = proto__encode_disk_head(s->rec, s->rec_cap,
					    zero ? PROTO_DISK_ZERO : PROTO_DISK_DATA, off, len);
	int rc = n < 0 ? (int)n : mig_stream__write(s->stream, s->rec, (size_t)n);
	if (!rc && !zero)
		rc = mig_stream__write(s->stream, s->disk.buf, (size_t)len);
	if (rc)
		return rc;
	s->disk_bytes += (uint64_t)n + (zero ? 0 : len);
	if (zero) {
		s->disk_zero++;
	} else {
		s->disk_data++;
		s->disk_data_bytes += len;
	}
	return 0;
}

/* Between chunks: a cancel, a destination that refused, fresh statistics. */
static int sender__disk_poll(struct sender *s, uint64_t n)
{
	return n % SENDER_DISK_POLL_CHUNKS ? 0 : sender__look(s);
}

int sender__disk_pass(struct sender *s)
{
	if (!s->disk_on)
		return 0;
	disk_out__collect(&s->disk);
	uint64_t block = 0, off, len, n = 0;
	bool zero = false;
	int rc;
	while ((rc = disk_out__take(&s->disk, &block, &off, &len, &zero)) == 0) {
		/* the fault leaves out a chunk with data: one the guest zeroed may
		 * be zero at the destination too, and its loss would show nowhere */
		bool skip = !zero && mig_fault__skip_disk(&s->fault, !s->bulk_done, s->paused);
		if (!skip && (rc = sender__disk_chunk(s, off, len, zero)) != 0)
			return rc;
		if ((rc = sender__disk_poll(s, ++n)) != 0)
			return rc;
	}
	if (rc != -ENOENT) {
		migration__set_error(s->m, "x-block-migration: reading image %s failed: %s",
				     blkfile__path(s->disk.file), strerror(-rc));
		return rc;
	}
	return 0;
}

int sender__disk_sum(struct sender *s)
{
	if (!s->disk_on || !s->disk.sum_on)
		return 0;
	uint64_t sum;
	int rc = disk_out__sum(&s->disk, &sum);
	if (rc) {
		migration__set_error(s->m, "x-verify: reading image %s failed: %s",
				     blkfile__path(s->disk.file), strerror(-rc));
		return rc;
	}
	uint8_t le[PROTO_DISK_SUM_LEN];
	le__put64(le, sum);
	ssize_t n = proto__encode_disk_head(s->rec, s->rec_cap, PROTO_DISK_SUM, 0, s->disk.size);
	rc = n < 0 ? (int)n : mig_stream__write(s->stream, s->rec, (size_t)n);
	if (!rc)
		rc = mig_stream__write(s->stream, le, sizeof(le));
	if (!rc)
		s->disk_bytes += (uint64_t)n + sizeof(le);
	return rc;
}
