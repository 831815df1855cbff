#include "mig/disksum.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "mig/wire/proto.h"

int disksum__init(struct disksum *s, uint64_t nsectors, bool zero)
{
	memset(s, 0, sizeof(*s));
	s->nsectors = nsectors;
	s->dig = calloc(nsectors ? nsectors : 1, sizeof(*s->dig));
	if (!s->dig || bitmap__init(&s->known, nsectors)) {
		disksum__free(s);
		return -ENOMEM;
	}
	if (zero)
		disksum__set(s, 0, nsectors, NULL, 0);
	return 0;
}

void disksum__free(struct disksum *s)
{
	free(s->dig);
	s->dig = NULL;
	bitmap__free(&s->known);
}

static void disksum__put(struct disksum *s, uint64_t i, uint64_t d)
{
	if (bitmap__test(&s->known, i))
		s->sum -= s->dig[i];
	s->dig[i] = d;
	s->sum += d;
	bitmap__set(&s->known, i);
}

/* The next 512 bytes of the iovecs from (*k, *pos) on, into out. */
static void disksum__gather(const struct iovec *iov, unsigned niov, unsigned *k, size_t *pos,
			    uint8_t *out)
{
	size_t got = 0;
	while (got < PROTO_DISK_SECTOR && *k < niov) {
		size_t left = iov[*k].iov_len - *pos;
		size_t take = left < PROTO_DISK_SECTOR - got ? left : PROTO_DISK_SECTOR - got;
		memcpy(out + got, (const uint8_t *)iov[*k].iov_base + *pos, take);
		got += take;
		*pos += take;
		if (*pos == iov[*k].iov_len) {
			(*k)++;
			*pos = 0;
		}
	}
	memset(out + got, 0, PROTO_DISK_SECTOR - got);
}

void disksum__set(struct disksum *s, uint64_t first, uint64_t n, const struct iovec *iov,
		  unsigned niov)
{
	uint8_t sec[PROTO_DISK_SECTOR];
	unsigned k = 0;
	size_t pos = 0;
	for (uint64_t i = first; i < first + n && i < s->nsectors; i++) {
		if (!iov) {
			disksum__put(s, i, proto__zero_sector_digest(i));
			continue;
		}
		disksum__gather(iov, niov, &k, &pos, sec);
		disksum__put(s, i, proto__sector_digest(i, sec));
	}
}

void disksum__forget(struct disksum *s, uint64_t first, uint64_t n)
{
	for (uint64_t i = first; i < first + n && i < s->nsectors; i++) {
		if (!bitmap__test(&s->known, i))
			continue;
		s->sum -= s->dig[i];
		s->dig[i] = 0;
		bitmap__clear_bit(&s->known, i);
	}
}

void disksum__learn(struct disksum *s, uint64_t first, uint64_t n, const uint8_t *data)
{
	for (uint64_t i = first; i < first + n && i < s->nsectors; i++)
		if (!bitmap__test(&s->known, i))
			disksum__put(s, i, proto__sector_digest(i, data + (i - first) * PROTO_DISK_SECTOR));
}

uint64_t disksum__unknown(const struct disksum *s)
{
	return s->nsectors - bitmap__count(&s->known);
}
