#include "kvm/kvm_stats.h"

#include <errno.h>
#include <linux/kvm.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define STATS_NAME_SIZE_MAX 256u
#define STATS_DESC_MAX 4096u
#define STATS_DATA_MAX (1u << 20)

static uint32_t le32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return v;
}

static uint16_t le16(const uint8_t *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return v;
}

/* Checks one descriptor; keeps it when it has a single value. */
static int kvm_stats__take(struct kvm_stats *s, const uint8_t *d, uint32_t name_size)
{
	uint32_t flags = le32(d), offset = le32(d + 8);
	uint16_t size = le16(d + 6);
	const char *name = (const char *)d + sizeof(struct kvm_stats_desc);
	size_t nlen = strnlen(name, name_size);
	if (nlen == name_size || !nlen)
		return -EPROTO;
	uint64_t end = (uint64_t)offset + (uint64_t)size * 8;
	if (offset % 8 || end > STATS_DATA_MAX)
		return -EPROTO;
	if (end > s->data_size)
		s->data_size = (uint32_t)end;
	if (size != 1 || nlen >= KVM_STATS_NAME_MAX || s->n >= KVM_STATS_MAX)
		return 0;
	struct kvm_stat_desc *k = &s->desc[s->n++];
	memcpy(k->name, name, nlen);
	k->name[nlen] = 0;
	k->offset = offset;
	k->instant = (flags & KVM_STATS_TYPE_MASK) == KVM_STATS_TYPE_INSTANT;
	return 0;
}

int kvm_stats__parse(struct kvm_stats *s, const uint8_t *buf, size_t len)
{
	if (len < sizeof(struct kvm_stats_header))
		return -EPROTO;
	uint32_t name_size = le32(buf + 4), num = le32(buf + 8);
	uint32_t desc_off = le32(buf + 16), data_off = le32(buf + 20);
	uint64_t dsize = sizeof(struct kvm_stats_desc) + (uint64_t)name_size;
	if (!name_size || name_size > STATS_NAME_SIZE_MAX || num > STATS_DESC_MAX ||
	    desc_off < sizeof(struct kvm_stats_header) || desc_off + dsize * num > len)
		return -EPROTO;
	s->desc = calloc(num < KVM_STATS_MAX ? (num ? num : 1) : KVM_STATS_MAX, sizeof(*s->desc));
	if (!s->desc)
		return -ENOMEM;
	s->n = 0;
	s->data_size = 0;
	s->data_offset = data_off;
	for (uint32_t i = 0; i < num; i++) {
		int rc = kvm_stats__take(s, buf + desc_off + dsize * i, name_size);
		if (rc) {
			free(s->desc);
			s->desc = NULL;
			s->n = 0;
			return rc;
		}
	}
	return 0;
}

/* The header, then everything up to the end of the descriptor block. */
static int kvm_stats__load(struct kvm_stats *s)
{
	struct kvm_stats_header h;
	if (pread(s->fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h))
		return -EPROTO;
	if (h.name_size > STATS_NAME_SIZE_MAX || h.num_desc > STATS_DESC_MAX ||
	    h.desc_offset > STATS_DATA_MAX)
		return -EPROTO;
	size_t len = h.desc_offset + (sizeof(struct kvm_stats_desc) + h.name_size) * h.num_desc;
	uint8_t *buf = malloc(len);
	if (!buf)
		return -ENOMEM;
	int rc = pread(s->fd, buf, len, 0) == (ssize_t)len ? kvm_stats__parse(s, buf, len) : -EPROTO;
	free(buf);
	return rc;
}

int kvm_stats__open(struct kvm_stats *s, int kvm_fd, int vm_fd)
{
	memset(s, 0, sizeof(*s));
	s->fd = -1;
	if (ioctl(kvm_fd, KVM_CHECK_EXTENSION, KVM_CAP_BINARY_STATS_FD) <= 0)
		return -ENOTSUP;
	s->fd = ioctl(vm_fd, KVM_GET_STATS_FD, NULL);
	if (s->fd < 0) {
		s->fd = -1;
		return -errno;
	}
	int rc = kvm_stats__load(s);
	if (rc)
		kvm_stats__close(s);
	return rc;
}

void kvm_stats__close(struct kvm_stats *s)
{
	if (s->fd >= 0)
		close(s->fd);
	free(s->desc);
	memset(s, 0, sizeof(*s));
	s->fd = -1;
}

int kvm_stats__read(const struct kvm_stats *s, uint64_t *values)
{
	if (s->fd < 0)
		return -EBADF;
	uint8_t *data = malloc(s->data_size ? s->data_size : 1);
	if (!data)
		return -ENOMEM;
	int rc = 0;
	if (pread(s->fd, data, s->data_size, s->data_offset) != (ssize_t)s->data_size)
		rc = -EIO;
	for (uint32_t i = 0; !rc && i < s->n; i++)
		memcpy(&values[i], data + s->desc[i].offset, 8);
	free(data);
	return rc;
}

int kvm_stats__find(const struct kvm_stats *s, const uint64_t *values, const char *name,
		    uint64_t *out)
{
	for (uint32_t i = 0; i < s->n; i++) {
		if (!strcmp(s->desc[i].name, name)) {
			*out = values[i];
			return 0;
		}
	}
	return -ENOENT;
}
