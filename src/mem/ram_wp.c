#include "mem/ram_wp.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Newer than Debian 12's headers (Linux 6.4 and 5.14). */
#ifndef UFFD_FEATURE_WP_HUGETLBFS_SHMEM
#define UFFD_FEATURE_WP_HUGETLBFS_SHMEM (1 << 12)
#endif
#ifndef UFFD_FEATURE_WP_UNPOPULATED
#define UFFD_FEATURE_WP_UNPOPULATED (1 << 13)
#endif
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

void ram_wp__init(struct ram_wp *w)
{
	memset(w, 0, sizeof(*w));
	w->uffd = -1;
}

int ram_wp__fd(const struct ram_wp *w)
{
	return w->uffd;
}

/* The features this kernel's userfaultfd offers (a descriptor of its own:
 * the API handshake is made once per descriptor). */
static int ram_wp__offered(uint64_t *features)
{
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return -errno;
	struct uffdio_api api = { .api = UFFD_API };
	int rc = ioctl(fd, UFFDIO_API, &api) < 0 ? -errno : 0;
	close(fd);
	*features = api.features;
	return rc;
}

static int ram_wp__protect(struct ram_wp *w, uint64_t first, uint64_t n, bool on)
{
	struct uffdio_writeprotect wp = {
		.range = { (uint64_t)(uintptr_t)(w->ram->base + first * RAM_PAGE_SIZE),
			   n * RAM_PAGE_SIZE },
		.mode = on ? UFFDIO_WRITEPROTECT_MODE_WP : 0 };
	return ioctl(w->uffd, UFFDIO_WRITEPROTECT, &wp) < 0 ? -errno : 0;
}

/* Maps every page that is not for reading, so the kernel has an entry
 * to protect (the shared zero page where nothing was written). */
static int ram_wp__populate(struct ram_wp *w)
{
	const struct ram *r = w->ram;
	w->populated = true;
	if (!madvise(r->base, r->size, MADV_POPULATE_READ))
		return 0;
	if (errno != EINVAL)
		return -errno;
	for (uint64_t p = 0; p < r->npages; p++)   /* before Linux 5.14 */
		(void)*(volatile const uint8_t *)(r->base + p * RAM_PAGE_SIZE);
	return 0;
}

static int ram_wp__open(struct ram_wp *w, unsigned flags, char *err, size_t errlen)
{
	uint64_t offered = 0;
	int rc = ram_wp__offered(&offered);
	if (rc) {
		snprintf(err, errlen, "userfaultfd: %s", strerror(-rc));
		return rc;
	}
	if (!(offered & UFFD_FEATURE_PAGEFAULT_FLAG_WP)) {
		snprintf(err, errlen, "Background-snapshot is not supported by host kernel "
			 "(userfaultfd has no write-protect mode)");
		return -ENOTSUP;
	}
	bool shared = w->ram->shared;  /* a memory file's: shared memory */
	if (shared && !(offered & UFFD_FEATURE_WP_HUGETLBFS_SHMEM)) {
		snprintf(err, errlen, "Background-snapshot is not supported with current memory "
			 "configuration (guest RAM in a memory file needs userfaultfd's "
			 "write-protect of shared memory, Linux 5.19 or later)");
		return -ENOTSUP;
	}
	w->uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (flags & RAM_WP_POPULATE)
		offered &= ~(uint64_t)UFFD_FEATURE_WP_UNPOPULATED;
	/* shared memory: the kernel marks unmapped pages protected itself */
	uint64_t want = UFFD_FEATURE_PAGEFAULT_FLAG_WP |
			(shared ? UFFD_FEATURE_WP_HUGETLBFS_SHMEM :
				  offered & UFFD_FEATURE_WP_UNPOPULATED);
	struct uffdio_api api = { .api = UFFD_API, .features = want };
	if (w->uffd < 0 || ioctl(w->uffd, UFFDIO_API, &api) < 0) {
		rc = -errno;
		snprintf(err, errlen, "userfaultfd: %s", strerror(-rc));
		return rc;
	}
	struct uffdio_register reg = {
		.range = { (uint64_t)(uintptr_t)w->ram->base, w->ram->size },
		.mode = UFFDIO_REGISTER_MODE_WP };
	if (ioctl(w->uffd, UFFDIO_REGISTER, &reg) < 0) {
		rc = -errno;
		snprintf(err, errlen, "Background-snapshot is not supported with current memory "
			 "configuration (userfaultfd write-protect: %s)", strerror(-rc));
		return rc;
	}
	w->registered = true;
	if (!(reg.ioctls & (1ull << _UFFDIO_WRITEPROTECT))) {
		snprintf(err, errlen, "Background-snapshot is not supported with current memory "
			 "configuration (no write-protect ioctl for guest RAM)");
		return -ENOTSUP;
	}
	/* what was asked for: UFFDIO_API answers with every feature offered */
	rc = shared || (want & UFFD_FEATURE_WP_UNPOPULATED) ? 0 : ram_wp__populate(w);
	if (rc)
		snprintf(err, errlen, "cannot map guest RAM for write protection: %s",
			 strerror(-rc));
	return rc;
}

int ram_wp__start(struct ram_wp *w, const struct ram *ram, unsigned flags, char *err,
		  size_t errlen)
{
	ram_wp__init(w);
	w->ram = ram;
	int rc = ram_wp__open(w, flags, err, errlen);
	if (!rc) {
		rc = ram_wp__protect(w, 0, ram->npages, true);
		if (rc)
			snprintf(err, errlen, "cannot write-protect guest RAM: %s", strerror(-rc));
	}
	if (rc)
		ram_wp__stop(w);
	return rc;
}

int ram_wp__fault(struct ram_wp *w, uint64_t *page)
{
	struct uffd_msg msg;
	for (;;) {
		ssize_t n = read(w->uffd, &msg, sizeof(msg));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno == EAGAIN ? 0 : -errno;
		if (n != (ssize_t)sizeof(msg))
			return -EIO;
		if (msg.event != UFFD_EVENT_PAGEFAULT)
			continue;       /* none asked for: nothing to answer */
		uint64_t addr = msg.arg.pagefault.address, base = (uintptr_t)w->ram->base;
		if (addr < base || addr - base >= w->ram->size)
			return -EFAULT;
		*page = (addr - base) / RAM_PAGE_SIZE;
		w->faults++;
		return 1;
	}
}

int ram_wp__release(struct ram_wp *w, uint64_t first, uint64_t n)
{
	if (first > w->ram->npages || n > w->ram->npages - first)
		return -EINVAL;
	return n ? ram_wp__protect(w, first, n, false) : 0;
}

void ram_wp__stop(struct ram_wp *w)
{
	if (w->uffd < 0)
		return;
	if (w->registered) {
		if (ram_wp__protect(w, 0, w->ram->npages, false))
			log_warn("background snapshot: guest RAM not released from write "
				 "protection: %s", strerror(errno));
		struct uffdio_range range = { (uint64_t)(uintptr_t)w->ram->base, w->ram->size };
		if (ioctl(w->uffd, UFFDIO_UNREGISTER, &range) < 0)
			log_warn("background snapshot: userfaultfd unregister: %s", strerror(errno));
	}
	close(w->uffd);
	w->uffd = -1;
	w->registered = false;
}
