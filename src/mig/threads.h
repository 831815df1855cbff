/* The migration's threads by name, for QMP's query-migrationthreads: a
 * management layer pins them to host CPUs by their thread ids.
 *
 * As QEMU 7.2 names them: "live_migration" (the outgoing migration's
 * thread) and "multifdsend_N" (multifd channel N, from 0).  A thread adds
 * itself as it starts and removes itself as it ends, so the list holds
 * only threads that run now.  Its own lock, a leaf: callable under any
 * other.  Every function takes NULL for "no list" and does nothing. */
#ifndef KMIG_MIG_THREADS_H
#define KMIG_MIG_THREADS_H

#include <jansson.h>
#include <pthread.h>
#include <sys/types.h>

#define MIG_THREADS_MAX  24     /* the migration thread and 16 channels fit */
#define MIG_THREAD_NAME  24     /* bytes of a name, with its NUL */

struct mig_threads {
	pthread_mutex_t lock;
	unsigned n;
	struct {
		char name[MIG_THREAD_NAME];
		pid_t tid;
	} t[MIG_THREADS_MAX];
};

void mig_threads__init(struct mig_threads *mt);
void mig_threads__destroy(struct mig_threads *mt);
/* Adds the thread tid under name (printf-style); -EINVAL for a name that
 * does not fit or a tid < 1, -ENOSPC when the list is full (the thread
 * runs all the same, unlisted), -EEXIST if tid is listed already. */
int mig_threads__add(struct mig_threads *mt, pid_t tid, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Removes tid if listed (order of the rest kept). */
void mig_threads__remove(struct mig_threads *mt, pid_t tid);
/* The list as QMP's [{"name": ..., "thread-id": ...}], oldest first. */
json_t *mig_threads__json(struct mig_threads *mt);
unsigned mig_threads__count(struct mig_threads *mt);

#endif
