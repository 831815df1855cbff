#include "mem/ram.h"

#include <errno.h>
#include <linux/kvm.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>

static int ram__register(struct ram *r, const struct ram_block *b, bool log)
{
	struct kvm_userspace_memory_region reg = {
		.slot = b->slot,
		.flags = log ? KVM_MEM_LOG_DIRTY_PAGES : 0,
		.guest_phys_addr = b->gpa,
		.memory_size = b->size,
		.userspace_addr = (uint64_t)(uintptr_t)b->host,
	};
	if (r->vm_fd < 0)
		return 0;
	if (ioctl(r->vm_fd, KVM_SET_USER_MEMORY_REGION, &reg) < 0)
		return -errno;
	return 0;
}

/* A mapping whose start is 2 MiB aligned, so every 2 MiB of
 * guest-physical memory (blocks start at multiples of 2 MiB) lies in one
 * 2 MiB of host memory: a transparent huge page can back it and KVM can
 * map it with one 2 MiB entry.  Anonymous (fd -1) or the first size bytes
 * of file fd, shared.  NULL with errno set on failure. */
static void *ram__map_aligned(uint64_t size, int fd)
{
	const uint64_t huge = 2ull << 20;
	uint8_t *p = mmap(NULL, size + huge, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	uint64_t head = (huge - ((uintptr_t)p & (huge - 1))) & (huge - 1);
	if (head)
		munmap(p, head);
	if (huge - head)
		munmap(p + head + size, huge - head);
	if (fd >= 0 && mmap(p + head, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd,
			    0) == MAP_FAILED) {
		int e = errno;
		munmap(p + head, size);
		errno = e;
		return NULL;
	}
	return p + head;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

int ram__prealloc(const struct ram *r)
{
	return madvise(r->base, r->size, MADV_POPULATE_WRITE) ? -errno : 0;
}

int ram__create(struct ram *r, int vm_fd, uint64_t size)
{
	return ram__create_shared(r, vm_fd, size, -1);
}

int ram__create_shared(struct ram *r, int vm_fd, uint64_t size, int fd)
{
	memset(r, 0, sizeof(*r));
	if (size < RAM_MIN_SIZE || size > RAM_MAX_SIZE || size % (2ull << 20))
		return -EINVAL;
	void *p = ram__map_aligned(size, fd);
	if (!p)
		return -errno;
	madvise(p, size, MADV_HUGEPAGE);
	r->shared = fd >= 0;
	r->vm_fd = vm_fd;
	r->base = p;
	r->size = size;
	r->npages = size / RAM_PAGE_SIZE;
	uint64_t low = size > RAM_LOW_LIMIT ? RAM_LOW_LIMIT : size;
	r->blocks[0] = (struct ram_block){ .gpa = 0, .size = low, .host = r->base, .slot = 0 };
	r->nr_blocks = 1;
	if (size > low) {
		r->blocks[1] = (struct ram_block){
			.gpa = RAM_HIGH_BASE, .size = size - low, .host = r->base + low,
			.slot = 1, .first_page = low / RAM_PAGE_SIZE };
		r->nr_blocks = 2;
	}
	for (unsigned i = 0; i < r->nr_blocks; i++) {
		int rc = ram__register(r, &r->blocks[i], false);
		if (rc) {
			munmap(r->base, r->size);
			r->base = NULL;
			return rc;
		}
	}
	return 0;
}

void ram__destroy(struct ram *r)
{
	if (r->base)
		munmap(r->base, r->size);
	r->base = NULL;
}

int ram__block_of(const struct ram *r, uint64_t gpa)
{
	for (unsigned i = 0; i < r->nr_blocks; i++)
		if (gpa >= r->blocks[i].gpa && gpa - r->blocks[i].gpa < r->blocks[i].size)
			return (int)i;
	return -1;
}

void *ram__gpa_to_host(const struct ram *r, uint64_t gpa, uint64_t len)
{
	int i = ram__block_of(r, gpa);
	if (i < 0)
		return NULL;
	const struct ram_block *b = &r->blocks[i];
	uint64_t off = gpa - b->gpa;
	if (len > b->size - off)
		return NULL;
	return b->host + off;
}

uint64_t ram__page_gpa(const struct ram *r, uint64_t page)
{
	if (page >= r->npages)
		return UINT64_MAX;
	for (unsigned i = r->nr_blocks; i-- > 0;)
		if (page >= r->blocks[i].first_page)
			return r->blocks[i].gpa + (page - r->blocks[i].first_page) * RAM_PAGE_SIZE;
	return UINT64_MAX;
}

uint8_t *ram__page_host(const struct ram *r, uint64_t page)
{
	return r->base + page * RAM_PAGE_SIZE;
}

int ram__set_logging(struct ram *r, bool on)
{
	for (unsigned i = 0; i < r->nr_blocks; i++) {
		int rc = ram__register(r, &r->blocks[i], on);
		if (rc)
			return rc;
	}
	__atomic_store_n(&r->logging, on, __ATOMIC_RELEASE);
	return 0;
}

int ram__discard(const struct ram *r, void *host, uint64_t len)
{
	/* a shared file's pages stay in the file unless its range is punched */
	return madvise(host, len, r->shared ? MADV_REMOVE : MADV_DONTNEED) ? -errno : 0;
}

bool ram__logging(const struct ram *r)
{
	return __atomic_load_n(&r->logging, __ATOMIC_ACQUIRE);
}
