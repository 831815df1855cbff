/* Guest RAM: one mapping (transparent huge pages advised), anonymous or
 * a shared file's (mem/memfile.h), cut into blocks around the hole below
 * 4 GiB, each block one KVM memslot.
 *
 * Layout for a guest of S bytes:
 *   S <= 3 GiB: block 0 = [0, S)
 *   S >  3 GiB: block 0 = [0, 3 GiB), block 1 = [4 GiB, 4 GiB + S - 3 GiB)
 * The hole [3 GiB, 4 GiB) holds the LAPIC, IOAPIC and device MMIO.
 *
 * The mapping starts on a 2 MiB boundary, so huge pages can back it (and
 * KVM map it with 2 MiB entries) once dirty logging is off.
 *
 * Blocks never change after ram__create; any thread may read the layout.
 * ram__set_logging toggles KVM_MEM_LOG_DIRTY_PAGES on every slot and must
 * not race with itself (the dirty tracker serialises it). */
#ifndef KMIG_MEM_RAM_H
#define KMIG_MEM_RAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/log.h"

#define RAM_PAGE_SIZE 4096ull
#define RAM_PAGE_SHIFT 12
#define RAM_MAX_BLOCKS 2
#define RAM_MIN_SIZE (128ull << 20)
#define RAM_MAX_SIZE (16ull << 30)
#define RAM_LOW_LIMIT (3ull << 30)
#define RAM_HIGH_BASE (4ull << 30)

struct ram_block {
	uint64_t gpa;      /* guest-physical base */
	uint64_t size;     /* bytes, multiple of 2 MiB */
	uint8_t *host;     /* host mapping of the block */
	uint32_t slot;     /* KVM memslot id */
	uint64_t first_page; /* index of the block's first page in the VM-wide page numbering */
};

struct ram {
	int vm_fd;
	uint8_t *base;     /* the whole mapping */
	uint64_t size;     /* total guest RAM bytes */
	uint64_t npages;   /* size / RAM_PAGE_SIZE */
	unsigned nr_blocks;
	struct ram_block blocks[RAM_MAX_BLOCKS];
	bool logging;
	bool shared;       /* a file's pages, mapped shared (not private memory) */
};

/* Maps size bytes and registers the memslots on vm_fd (-1: no KVM, for
 * tests).  size must be a multiple of 2 MiB within [RAM_MIN_SIZE, RAM_MAX_SIZE]. */
int ram__create(struct ram *r, int vm_fd, uint64_t size) KMIG_MUST_CHECK;
/* The same over the first size bytes of file fd, mapped shared (fd stays
 * the caller's; the mapping holds the file). */
int ram__create_shared(struct ram *r, int vm_fd, uint64_t size, int fd) KMIG_MUST_CHECK;
void ram__destroy(struct ram *r);
/* Gives [host, host + len) (page-aligned, inside RAM) back to the host:
 * it reads as zero afterwards.  Anonymous memory is dropped
 * (MADV_DONTNEED), a shared file's range punched (MADV_REMOVE). */
int ram__discard(const struct ram *r, void *host, uint64_t len) KMIG_MUST_CHECK;
/* Maps every page of guest RAM now, writable (MADV_POPULATE_WRITE, Linux
 * 5.14), without changing what it holds: the first touch of each page is
 * paid here, not by the guest or an incoming migration (QEMU's
 * -mem-prealloc).  -EINVAL where the kernel lacks it, -ENOMEM, ... */
int ram__prealloc(const struct ram *r) KMIG_MUST_CHECK;

/* Host pointer for [gpa, gpa + len) if it lies inside one block, else NULL. */
void *ram__gpa_to_host(const struct ram *r, uint64_t gpa, uint64_t len);
/* Block index holding gpa, or -1. */
int ram__block_of(const struct ram *r, uint64_t gpa);
/* Guest-physical address of VM-wide page index, or UINT64_MAX if out of range. */
uint64_t ram__page_gpa(const struct ram *r, uint64_t page);
/* Host pointer of VM-wide page index (must be < npages). */
uint8_t *ram__page_host(const struct ram *r, uint64_t page);

/* Turns KVM dirty logging on or off for every memslot (re-registers the
 * slots with or without KVM_MEM_LOG_DIRTY_PAGES). */
int ram__set_logging(struct ram *r, bool on) KMIG_MUST_CHECK;
/* Whether every memslot was last registered, with KVM's success, with
 * KVM_MEM_LOG_DIRTY_PAGES. */
bool ram__logging(const struct ram *r);

#endif
