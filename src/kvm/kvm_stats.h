/* KVM's binary statistics of a VM (KVM_GET_STATS_FD, Linux 5.14+): e.g.
 * pages_4k / pages_2m / pages_1g on x86, the guest memory KVM maps with
 * each page size, which shows whether huge pages came back after dirty
 * logging was switched off.
 *
 * The header and descriptors are read once at open and checked against
 * the size of what KVM returned (names NUL-terminated inside their field,
 * every value inside the data block); each read returns current values.
 * Only statistics with one value are kept (histograms are skipped).
 * Not thread-safe: one owner (the control thread). */
#ifndef KMIG_KVM_KVM_STATS_H
#define KMIG_KVM_KVM_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"

#define KVM_STATS_NAME_MAX 64
#define KVM_STATS_MAX 512

struct kvm_stat_desc {
	char name[KVM_STATS_NAME_MAX];
	uint32_t offset;             /* of the value, from the data block's start */
	bool instant;                /* a current value (else cumulative or peak) */
};

struct kvm_stats {
	int fd;                      /* -1: none */
	uint32_t n;
	struct kvm_stat_desc *desc;
	uint32_t data_offset, data_size;
};

/* Parses the header and descriptor block KVM returned (buf: the stats fd's
 * bytes from offset 0, len of them) into s->desc.  Pure: unit-tested.
 * Returns 0, -EPROTO for a malformed block, -ENOMEM. */
int kvm_stats__parse(struct kvm_stats *s, const uint8_t *buf, size_t len) KMIG_MUST_CHECK;
/* Opens the VM's stats fd and parses it.  -ENOTSUP without the capability. */
int kvm_stats__open(struct kvm_stats *s, int kvm_fd, int vm_fd) KMIG_MUST_CHECK;
void kvm_stats__close(struct kvm_stats *s);
/* Reads the current values; values[i] belongs to s->desc[i] (s->n of them). */
int kvm_stats__read(const struct kvm_stats *s, uint64_t *values) KMIG_MUST_CHECK;
/* The value of the statistic called name at the last read, or -ENOENT. */
int kvm_stats__find(const struct kvm_stats *s, const uint64_t *values, const char *name,
		    uint64_t *out) KMIG_MUST_CHECK;

#endif
