/* Post-copy, destination side: userfaultfd over guest RAM; see postcopy.h. */
#include "mig/postcopy.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/timeutil.h"
#include "mem/ram.h"
#include "mig/wire/proto.h"

#define PC_FAULT_BATCH 32

int postcopy_dst__init(struct postcopy_dst *d, struct ram *ram, struct mig_stream *s,
		       struct bitmap *valid)
{
	memset(d, 0, sizeof(*d));
	d->ram = ram;
	d->stream = s;
	d->valid = valid;
	d->uffd = d->stop_fd = -1;
	pthread_mutex_init(&d->wlock, NULL);
	pthread_mutex_init(&d->place_lock, NULL);
	d->req_ns = calloc(ram->npages, sizeof(*d->req_ns));
	if (!d->req_ns || bitmap__init(&d->requested, ram->npages)) {
		free(d->req_ns);
		d->req_ns = NULL;
		pthread_mutex_destroy(&d->wlock);
		pthread_mutex_destroy(&d->place_lock);
		return -ENOMEM;
	}
	return 0;
}

static unsigned pc__bucket(uint64_t us)
{
	/* floor(4 * log2(us)), from the top bit and the next two */
	if (us < 1)
		return 0;
	unsigned top = 63 - (unsigned)__builtin_clzll(us);
	unsigned frac = top >= 2 ? (unsigned)((us >> (top - 2)) & 3) : (unsigned)((us << (2 - top)) & 3);
	unsigned b = top * 4 + frac;
	return b < PC_LAT_BUCKETS ? b : PC_LAT_BUCKETS - 1;
}

static uint64_t pc__bucket_floor_us(unsigned b)
{
	unsigned top = b / 4, frac = b % 4;
	return top >= 2 ? ((4ull + frac) << (top - 2)) : (4ull + frac) >> (2 - top);
}

uint64_t postcopy_dst__latency_us(const struct postcopy_dst *d, unsigned pct)
{
	uint64_t n = 0, seen = 0;
	for (unsigned b = 0; b < PC_LAT_BUCKETS; b++)
		n += atomic_load(&d->lat_hist[b]);
	if (!n)
		return 0;
	uint64_t want = (n * pct + 99) / 100;
	for (unsigned b = 0; b < PC_LAT_BUCKETS; b++) {
		seen += atomic_load(&d->lat_hist[b]);
		if (seen >= (want ? want : 1))
			return pc__bucket_floor_us(b);
	}
	return pc__bucket_floor_us(PC_LAT_BUCKETS - 1);
}

/* A page placed: the time since it was asked for, if it was. */
static void pc__answered(struct postcopy_dst *d, uint64_t page)
{
	if (d->bt)
		blocktime__placed(d->bt, page, time__now_ns());
	uint64_t t = atomic_exchange(&d->req_ns[page], 0);
	if (t) {
		uint64_t us = (time__now_ns() - t) / 1000;
		atomic_fetch_add(&d->lat_hist[pc__bucket(us)], 1);
	}
}

static uint8_t *pc__host(const struct ram *ram, uint64_t page)
{
	return ram__gpa_to_host(ram, ram__page_gpa(ram, page), RAM_PAGE_SIZE);
}

static int pc__flush_discard(struct postcopy_dst *d)
{
	if (!d->run_len)
		return 0;
	uint8_t *h = pc__host(d->ram, d->run_start);
	int rc = ram__discard(d->ram, h, d->run_len * RAM_PAGE_SIZE);
	d->run_len = 0;
	return rc;
}

int postcopy_dst__discard(struct postcopy_dst *d, uint64_t page)
{
	/* every page named, filled here or not: a page never written may be
	 * present anyway (zeroed, or part of a huge page another filled) */
	bitmap__clear_bit(d->valid, page);
	/* one madvise per run of pages inside one block */
	bool next = d->run_len && page == d->run_start + d->run_len &&
		    ram__block_of(d->ram, ram__page_gpa(d->ram, page)) ==
		    ram__block_of(d->ram, ram__page_gpa(d->ram, d->run_start));
	if (next) {
		d->run_len++;
		return 0;
	}
	int rc = pc__flush_discard(d);
	d->run_start = page;
	d->run_len = 1;
	return rc;
}

/* Page index of a faulting host address, or UINT64_MAX. */
static uint64_t pc__page_of(const struct ram *ram, uint64_t addr)
{
	for (unsigned i = 0; i < ram->nr_blocks; i++) {
		const struct ram_block *b = &ram->blocks[i];
		uint64_t base = (uint64_t)(uintptr_t)b->host;
		if (addr >= base && addr - base < b->size)
			return b->first_page + (addr - base) / RAM_PAGE_SIZE;
	}
	return UINT64_MAX;
}

static int pc__zeropage(struct postcopy_dst *d, uint64_t page)
{
	struct uffdio_zeropage z = {
		.range = { (uint64_t)(uintptr_t)pc__host(d->ram, page), RAM_PAGE_SIZE } };
	while (ioctl(d->uffd, UFFDIO_ZEROPAGE, &z) < 0) {
		if (errno == EEXIST)
			return 0;       /* placed meanwhile */
		if (errno != EAGAIN)
			return -errno;
		z.zeropage = 0;
	}
	return 0;
}

/* Writes one RP_REQ; the caller holds wlock and the link is up. */
static int pc__put_request(struct postcopy_dst *d, uint64_t page)
{
	uint8_t rec[PROTO_HDR_SIZE + 16];
	int b = ram__block_of(d->ram, ram__page_gpa(d->ram, page));
	uint64_t off = (page - d->ram->blocks[b].first_page) * RAM_PAGE_SIZE;
	ssize_t n = proto__encode_rp_req(rec, sizeof(rec), (uint32_t)b, off);
	if (n < 0)
		return (int)n;
	atomic_fetch_add(&d->requests, 1);
	return mig_stream__write(d->stream, rec, (size_t)n);
}

static int pc__put_ack(struct postcopy_dst *d, uint64_t consumed)
{
	uint8_t rec[PROTO_HDR_SIZE + 8];
	ssize_t n = proto__encode_rp_ack(rec, sizeof(rec), consumed);
	int rc = n < 0 ? (int)n : mig_stream__write(d->stream, rec, (size_t)n);
	if (!rc)
		d->acked = consumed;
	return rc;
}

int postcopy_dst__ack(struct postcopy_dst *d, uint64_t consumed, bool now)
{
	if (!now && consumed - d->acked < PC_ACK_BYTES)
		return 0;
	pthread_mutex_lock(&d->wlock);
	int rc = d->paused ? -ENOTCONN : pc__put_ack(d, consumed);
	rc = rc ? rc : mig_stream__flush(d->stream);
	pthread_mutex_unlock(&d->wlock);
	return rc;
}

/* A request that cannot go out because the link broke is not an error:
 * the page stays in `requested` and is asked for again after a recovery
 * (postcopy_dst__resume); the stream is shut down so the incoming thread
 * notices and pauses. */
static int pc__request(struct postcopy_dst *d, uint64_t page)
{
	pthread_mutex_lock(&d->wlock);
	int rc = 0;
	if (!d->paused) {
		rc = pc__put_request(d, page);
		rc = rc ? rc : mig_stream__flush(d->stream);
		if (rc) {
			d->paused = true;
			mig_stream__shutdown(d->stream);
			log_warn("post-copy: a page request could not go out: %s", strerror(-rc));
		}
	}
	pthread_mutex_unlock(&d->wlock);
	return 0;
}

/* One fault: a page received as zero is mapped here; any other is asked
 * for (once: the UFFDIO_COPY of its arrival wakes every waiter). */
static int pc__fault(struct postcopy_dst *d, uint64_t addr, int tid)
{
	uint64_t page = pc__page_of(d->ram, addr);
	if (page == UINT64_MAX)
		return -EFAULT;
	atomic_fetch_add(&d->faults, 1);
	if (bitmap__test(d->valid, page)) {
		atomic_fetch_add(&d->zero_mapped, 1);
		return pc__zeropage(d, page);
	}
	/* blocked until placed; a page placed since the test above (valid is
	 * set before its placement looks for waiters) ends the wait at once */
	if (d->bt && blocktime__fault(d->bt, tid, page, time__now_ns()) >= 0 &&
	    bitmap__test(d->valid, page))
		blocktime__placed(d->bt, page, time__now_ns());
	if (!bitmap__test_and_set(&d->requested, page))
		return 0;
	atomic_store(&d->req_ns[page], time__now_ns());
	return pc__request(d, page);
}

/* The fault thread cannot go on (a request that did not go out, or
 * userfaultfd failing): the stream is shut down, so the incoming thread
 * fails the migration rather than leave vCPUs waiting for nothing. */
static void pc__fault_failed(struct postcopy_dst *d, int rc)
{
	int none = 0;
	atomic_compare_exchange_strong(&d->error, &none, rc);
	log_err("post-copy: the fault thread stops: %s", strerror(-rc));
	mig_stream__shutdown(d->stream);
}

static void *pc__fault_thread(void *arg)
{
	struct postcopy_dst *d = arg;
	struct uffd_msg msg[PC_FAULT_BATCH];
	pthread_setname_np(pthread_self(), "pc-fault");
	for (;;) {
		struct pollfd p[2] = { { d->uffd, POLLIN, 0 }, { d->stop_fd, POLLIN, 0 } };
		if (poll(p, 2, -1) < 0 && errno != EINTR)
			break;
		if (p[1].revents)
			return NULL;    /* postcopy_dst__finish or __release */
		ssize_t n = read(d->uffd, msg, sizeof(msg));
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			continue;
		if (n <= 0)
			break;
		for (size_t i = 0; i < (size_t)n / sizeof(msg[0]); i++) {
			if (msg[i].event != UFFD_EVENT_PAGEFAULT)
				continue;
			int rc = pc__fault(d, msg[i].arg.pagefault.address,
					   (int)msg[i].arg.pagefault.feat.ptid);
			if (rc) {
				pc__fault_failed(d, rc);
				return NULL;
			}
		}
	}
	pc__fault_failed(d, -EIO);
	return NULL;
}

/* A userfaultfd over every block of ram for missing pages; *uffd gets it
 * (-1 when it could not be made). */
static int pc__register_ram(const struct ram *ram, bool thread_ids, int *uffd, char *err,
			    size_t errlen)
{
	*uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	if (*uffd < 0) {
		int e = errno;
		snprintf(err, errlen, "post-copy needs userfaultfd: %s", strerror(e));
		return -e;
	}
	/* the faulting thread's id tells blocktime which vCPU waits */
	struct uffdio_api api = { .api = UFFD_API,
				  .features = thread_ids ? UFFD_FEATURE_THREAD_ID : 0 };
	if (ioctl(*uffd, UFFDIO_API, &api) < 0) {
		int e = errno;
		snprintf(err, errlen, "userfaultfd API%s: %s",
			 thread_ids ? " with thread ids (postcopy-blocktime)" : "", strerror(e));
		return -e;
	}
	for (unsigned i = 0; i < ram->nr_blocks; i++) {
		const struct ram_block *b = &ram->blocks[i];
		struct uffdio_register reg = {
			.range = { (uint64_t)(uintptr_t)b->host, b->size },
			.mode = UFFDIO_REGISTER_MODE_MISSING };
		if (ioctl(*uffd, UFFDIO_REGISTER, &reg) < 0) {
			int e = errno;
			snprintf(err, errlen, "userfaultfd cannot register guest RAM%s: %s",
				 ram->shared ? " (a memory file: post-copy needs it on tmpfs)" : "",
				 strerror(e));
			return -e;
		}
		uint64_t need = 1ull << _UFFDIO_COPY | 1ull << _UFFDIO_ZEROPAGE | 1ull << _UFFDIO_WAKE;
		if ((reg.ioctls & need) != need) {
			snprintf(err, errlen, "userfaultfd cannot copy or zero pages in guest RAM");
			return -ENOTSUP;
		}
	}
	return 0;
}

static int pc__register(struct postcopy_dst *d, char *err, size_t errlen)
{
	return pc__register_ram(d->ram, d->bt != NULL, &d->uffd, err, errlen);
}

int postcopy_dst__probe(const struct ram *ram, char *err, size_t errlen)
{
	int uffd;
	int rc = pc__register_ram(ram, false, &uffd, err, errlen);
	if (uffd >= 0)
		close(uffd);            /* closing it unregisters the RAM */
	return rc;
}

/* verify: the pages held at the switch, as the source sent them (the
 * guest has not run here; RAM is not registered yet, so a page never
 * touched reads as zero without a fault). */
static void pc__sum_held(struct postcopy_dst *d)
{
	for (size_t p = bitmap__next_set(d->valid, 0); p < d->valid->nbits;
	     p = bitmap__next_set(d->valid, p + 1))
		proto__page_sum_add(d->sum, p, pc__host(d->ram, p));
}

/* Guest RAM as post-copy needs it before it is registered.  No
 * transparent huge page may form from here on: khugepaged, collapsing a
 * 2 MiB range, fills the 4 KiB pages missing in it with zeros, so a page
 * just discarded or never received would be present (the guest would
 * read zeros without a fault, and the page, when it comes, be refused as
 * present).  A registered range is never collapsed with pages missing,
 * but until then it may be: so every page not received is dropped again
 * here, after huge pages are off, whatever a collapse did before. */
static int pc__prepare_ram(struct postcopy_dst *d)
{
	for (unsigned i = 0; i < d->ram->nr_blocks; i++) {
		const struct ram_block *b = &d->ram->blocks[i];
		if (madvise(b->host, b->size, MADV_NOHUGEPAGE))
			return -errno;
	}
	for (size_t p = 0; p < d->valid->nbits; p++) {
		if (bitmap__test(d->valid, p))
			continue;
		int rc = postcopy_dst__discard(d, p);
		if (rc)
			return rc;
	}
	return pc__flush_discard(d);
}

static int pc__start(struct postcopy_dst *d, char *err, size_t errlen)
{
	int rc = pc__flush_discard(d);
	rc = rc ? rc : pc__prepare_ram(d);
	if (rc) {
		snprintf(err, errlen, "cannot discard stale pages: %s", strerror(-rc));
		return rc;
	}
	if (d->verify)
		pc__sum_held(d);
	rc = pc__register(d, err, errlen);
	if (rc)
		return rc;
	d->stop_fd = eventfd(0, EFD_CLOEXEC);
	if (d->stop_fd < 0) {
		rc = -errno;
		snprintf(err, errlen, "eventfd: %s", strerror(-rc));
		return rc;
	}
	rc = -pthread_create(&d->thread, NULL, pc__fault_thread, d);
	if (rc) {
		snprintf(err, errlen, "cannot start the post-copy fault thread");
		return rc;
	}
	d->thread_started = true;
	return 0;
}

int postcopy_dst__start(struct postcopy_dst *d, char *err, size_t errlen)
{
	/* held while uffd is set up: a place on another thread comes after */
	pthread_mutex_lock(&d->place_lock);
	int rc = pc__start(d, err, errlen);
	if (rc && d->uffd >= 0) {
		/* the guest has not run here: nothing waits on the registration */
		close(d->uffd);
		d->uffd = -1;
	}
	pthread_mutex_unlock(&d->place_lock);
	return rc;
}

int postcopy_dst__reply(struct postcopy_dst *d, const void *rec, size_t len)
{
	pthread_mutex_lock(&d->wlock);
	int rc = d->paused ? -ENOTCONN : mig_stream__write(d->stream, rec, len);
	if (!rc)
		rc = mig_stream__flush(d->stream);
	pthread_mutex_unlock(&d->wlock);
	return rc;
}

void postcopy_dst__pause(struct postcopy_dst *d)
{
	pthread_mutex_lock(&d->wlock);
	d->paused = true;
	pthread_mutex_unlock(&d->wlock);
}

static int pc__send_bitmap(struct postcopy_dst *d, struct mig_stream *s)
{
	uint8_t *rec = malloc(PROTO_HDR_SIZE + 16 + 8 * PROTO_MAX_BITMAP_WORDS);
	if (!rec)
		return -ENOMEM;
	uint64_t words = (d->valid->nbits + 63) / 64, w = 0;
	int rc = 0;
	do {
		uint64_t n = words - w < PROTO_MAX_BITMAP_WORDS ? words - w : PROTO_MAX_BITMAP_WORDS;
		ssize_t len = proto__encode_rp_bitmap(rec, PROTO_HDR_SIZE + 16 +
						      8 * PROTO_MAX_BITMAP_WORDS, d->valid, w,
						      (uint32_t)n);
		rc = len < 0 ? (int)len : mig_stream__write(s, rec, (size_t)len);
		w += n;
	} while (!rc && w < words);
	free(rec);
	return rc;
}

int postcopy_dst__resume(struct postcopy_dst *d, struct mig_stream *s)
{
	pthread_mutex_lock(&d->wlock);
	d->stream = s;
	int rc = pc__send_bitmap(d, s);
	uint64_t again = 0;
	for (size_t p = bitmap__next_set(&d->requested, 0); !rc && p < d->requested.nbits;
	     p = bitmap__next_set(&d->requested, p + 1)) {
		if (bitmap__test(d->valid, p))
			continue;
		rc = pc__put_request(d, p);
		again++;
	}
	rc = rc ? rc : pc__put_ack(d, mig_stream__consumed(s));
	rc = rc ? rc : mig_stream__flush(s);
	d->paused = rc != 0;
	pthread_mutex_unlock(&d->wlock);
	if (!rc)
		log_info("post-copy: resumed; %llu pages asked for again",
			 (unsigned long long)again);
	return rc;
}

static int pc__place(struct postcopy_dst *d, uint64_t page, const void *data)
{
	struct uffdio_copy c = { .dst = (uint64_t)(uintptr_t)pc__host(d->ram, page),
				 .src = (uint64_t)(uintptr_t)data, .len = RAM_PAGE_SIZE };
	while (ioctl(d->uffd, UFFDIO_COPY, &c) < 0) {
		if (errno == EEXIST && bitmap__test(d->valid, page))
			return 0;       /* sent twice (pushed and asked for): the first stands */
		if (errno == EEXIST)
			return -EEXIST; /* present but never received: its content would be lost */
		if (errno != EAGAIN)
			return -errno;
		c.copy = 0;
	}
	if (d->verify)
		proto__page_sum_add(d->sum, page, data);
	bitmap__set(d->valid, page);
	atomic_fetch_add(&d->placed, 1);
	pc__answered(d, page);
	return 0;
}

int postcopy_dst__place(struct postcopy_dst *d, uint64_t page, const void *data)
{
	pthread_mutex_lock(&d->place_lock);
	int rc = pc__place(d, page, data);
	pthread_mutex_unlock(&d->place_lock);
	return rc;
}

static const uint8_t pc_zero_page[RAM_PAGE_SIZE];
static int pc__place_zero(struct postcopy_dst *d, uint64_t page);

int postcopy_dst__check(struct postcopy_dst *d, const uint8_t hash[PROTO_HASH_LEN])
{
	uint64_t sum[4];
	uint8_t ours[PROTO_HASH_LEN];
	pthread_mutex_lock(&d->place_lock);
	memcpy(sum, d->sum, sizeof(sum));
	pthread_mutex_unlock(&d->place_lock);
	for (size_t p = 0; p < d->valid->nbits; p++)
		if (!bitmap__test(d->valid, p))
			proto__page_sum_add(sum, p, pc_zero_page);
	proto__page_sum_out(sum, ours);
	return memcmp(ours, hash, PROTO_HASH_LEN) ? -EBADMSG : 0;
}

int postcopy_dst__place_zero(struct postcopy_dst *d, uint64_t page)
{
	pthread_mutex_lock(&d->place_lock);
	int rc = pc__place_zero(d, page);
	pthread_mutex_unlock(&d->place_lock);
	return rc;
}

static int pc__place_zero(struct postcopy_dst *d, uint64_t page)
{
	bool had = bitmap__test(d->valid, page);
	int rc = pc__zeropage(d, page);
	if (!rc && d->verify && !had)
		proto__page_sum_add(d->sum, page, pc_zero_page);
	if (!rc) {
		bitmap__set(d->valid, page);
		atomic_fetch_add(&d->placed, 1);
		pc__answered(d, page);
	}
	return rc;
}

static void pc__stop_thread(struct postcopy_dst *d)
{
	if (!d->thread_started)
		return;
	uint64_t one = 1;
	if (write(d->stop_fd, &one, sizeof(one)) != sizeof(one))
		log_warn("post-copy: cannot stop the fault thread");
	pthread_join(d->thread, NULL);
	d->thread_started = false;
}

void postcopy_dst__finish(struct postcopy_dst *d)
{
	pc__stop_thread(d);
	if (d->uffd < 0)
		return;
	/* every page the source held has arrived; what is still missing was
	 * never sent (free or zero at the source): normal memory from now on,
	 * and any vCPU still waiting is woken to fault it in */
	for (unsigned i = 0; i < d->ram->nr_blocks; i++) {
		const struct ram_block *b = &d->ram->blocks[i];
		struct uffdio_range r = { (uint64_t)(uintptr_t)b->host, b->size };
		if (ioctl(d->uffd, UFFDIO_UNREGISTER, &r) < 0)
			log_warn("post-copy: cannot unregister guest RAM: %s", strerror(errno));
		if (madvise(b->host, b->size, MADV_HUGEPAGE))   /* off since pc__prepare_ram */
			log_debug("post-copy: huge pages not back: %s", strerror(errno));
	}
	close(d->uffd);
	d->uffd = -1;
}

int postcopy_dst__release(struct postcopy_dst *d)
{
	pc__stop_thread(d);
	int fd = d->uffd;
	d->uffd = -1;
	return fd;
}

void postcopy_dst__free(struct postcopy_dst *d)
{
	pc__stop_thread(d);
	if (d->stop_fd >= 0)
		close(d->stop_fd);
	d->stop_fd = -1;
	/* a uffd still open here means post-copy did not finish: keep it, so
	 * missing pages are never filled with zeros (the process ends first) */
	bitmap__free(&d->requested);
	free(d->req_ns);
	d->req_ns = NULL;
	pthread_mutex_destroy(&d->wlock);
	pthread_mutex_destroy(&d->place_lock);
}
