/* Micro-benchmark behind the choice of virtio-blk's backend (dev/blkfile.h):
 * 4 KiB random reads or writes on one file at a queue depth, served either
 * by a small pool of threads doing preadv/pwritev (the model kmig uses:
 * one submitter, a mutex+condvar queue, completions handed back) or by
 * io_uring (liburing, one ring, the submitter reaps).  Prints requests/s.
 *
 *   cc -O2 -D_GNU_SOURCE -pthread -o blkio_bench blkio_bench.c -luring
 *   blkio_bench FILE SIZE_MIB pool|uring read|write QD SECONDS [direct] */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BS 4096
#ifndef WORKERS
#define WORKERS 4
#endif

static int fd, qd, is_write;
static unsigned long long nblocks;
static char *bufs;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static unsigned long long rnd(unsigned long long *s)
{
	*s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
	return *s;
}

/* ---- pool ---- */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER, done_cv = PTHREAD_COND_INITIALIZER;
static int *queue, qhead, qtail, done_count, stop;
static unsigned long long *offs;

static void *worker(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&mu);
	for (;;) {
		while (qhead == qtail && !stop)
			pthread_cond_wait(&work_cv, &mu);
		if (stop)
			break;
		int slot = queue[qhead++ % (qd + 1)];
		pthread_mutex_unlock(&mu);
		ssize_t r = is_write ? pwrite(fd, bufs + (size_t)slot * BS, BS, (off_t)offs[slot])
				     : pread(fd, bufs + (size_t)slot * BS, BS, (off_t)offs[slot]);
		if (r != BS)
			perror("io"), exit(1);
		pthread_mutex_lock(&mu);
		done_count++;
		pthread_cond_signal(&done_cv);
	}
	pthread_mutex_unlock(&mu);
	return NULL;
}

static unsigned long long run_pool(double secs)
{
	pthread_t t[WORKERS];
	unsigned long long seed = 88172645463325252ull, n = 0;
	queue = calloc(qd + 1, sizeof(int));
	offs = calloc(qd, sizeof(*offs));
	int nw = qd < WORKERS ? qd : WORKERS;
	for (int i = 0; i < nw; i++)
		pthread_create(&t[i], NULL, worker, NULL);
	double end = now() + secs;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < qd; i++) {
		offs[i] = rnd(&seed) % nblocks * BS;
		queue[qtail++ % (qd + 1)] = i;
	}
	pthread_cond_broadcast(&work_cv);
	int slot = 0;
	while (now() < end) {
		while (!done_count)
			pthread_cond_wait(&done_cv, &mu);
		done_count--;
		n++;
		slot = (slot + 1) % qd;   /* any free slot: reuse round-robin */
		offs[slot] = rnd(&seed) % nblocks * BS;
		queue[qtail++ % (qd + 1)] = slot;
		pthread_cond_signal(&work_cv);
	}
	stop = 1;
	pthread_cond_broadcast(&work_cv);
	pthread_mutex_unlock(&mu);
	for (int i = 0; i < nw; i++)
		pthread_join(t[i], NULL);
	return n;
}

/* ---- io_uring ---- */
static unsigned long long run_uring(double secs)
{
	struct io_uring ring;
	unsigned long long seed = 88172645463325252ull, n = 0;
	if (io_uring_queue_init((unsigned)qd, &ring, 0))
		perror("io_uring_queue_init"), exit(1);
	for (int i = 0; i < qd; i++) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
		char *b = bufs + (size_t)i * BS;
		off_t o = (off_t)(rnd(&seed) % nblocks * BS);
		if (is_write)
			io_uring_prep_write(sqe, fd, b, BS, o);
		else
			io_uring_prep_read(sqe, fd, b, BS, o);
		io_uring_sqe_set_data64(sqe, (unsigned)i);
	}
	io_uring_submit(&ring);
	double end = now() + secs;
	while (now() < end) {
		struct io_uring_cqe *cqe;
		if (io_uring_wait_cqe(&ring, &cqe))
			perror("wait"), exit(1);
		if (cqe->res != BS)
			fprintf(stderr, "io: %d\n", cqe->res), exit(1);
		unsigned i = (unsigned)io_uring_cqe_get_data64(cqe);
		io_uring_cqe_seen(&ring, cqe);
		n++;
		struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
		char *b = bufs + (size_t)i * BS;
		off_t o = (off_t)(rnd(&seed) % nblocks * BS);
		if (is_write)
			io_uring_prep_write(sqe, fd, b, BS, o);
		else
			io_uring_prep_read(sqe, fd, b, BS, o);
		io_uring_sqe_set_data64(sqe, i);
		io_uring_submit(&ring);
	}
	io_uring_queue_exit(&ring);
	return n;
}

int main(int argc, char **argv)
{
	if (argc < 7)
		return fprintf(stderr, "usage: %s FILE SIZE_MIB pool|uring read|write QD SECONDS [direct]\n",
			       argv[0]), 2;
	unsigned long long size = strtoull(argv[2], NULL, 10) << 20;
	int direct = argc > 7 && !strcmp(argv[7], "direct");
	is_write = !strcmp(argv[4], "write");
	qd = atoi(argv[5]);
	double secs = atof(argv[6]);
	fd = open(argv[1], O_RDWR | O_CREAT | (direct ? O_DIRECT : 0), 0600);
	if (fd < 0 || ftruncate(fd, (off_t)size))
		perror(argv[1]), exit(1);
	nblocks = size / BS;
	if (posix_memalign((void **)&bufs, BS, (size_t)qd * BS))
		return 1;
	memset(bufs, 0xa5, (size_t)qd * BS);
	double t0 = now();
	unsigned long long n = !strcmp(argv[3], "uring") ? run_uring(secs) : run_pool(secs);
	printf("%s %s qd=%d %s: %.0f req/s\n", argv[3], argv[4], qd, direct ? "direct" : "buffered",
	       n / (now() - t0));
	return 0;
}
