/* mig/threads.h: the list behind query-migrationthreads. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "mig/threads.h"

static void t_add_remove(struct t *t)
{
	struct mig_threads mt;
	mig_threads__init(&mt);
	T_CHECK_EQ(t, mig_threads__add(&mt, 100, "live_migration"), 0);
	T_CHECK_EQ(t, mig_threads__add(&mt, 101, "multifdsend_%u", 0u), 0);
	T_CHECK_EQ(t, mig_threads__add(&mt, 102, "multifdsend_%u", 1u), 0);
	T_CHECK_EQ(t, mig_threads__add(&mt, 101, "again"), -EEXIST);
	mig_threads__remove(&mt, 101);
	mig_threads__remove(&mt, 999);            /* not listed: nothing */
	json_t *j = mig_threads__json(&mt);
	char *s = json_dumps(j, JSON_COMPACT);
	T_CHECK(t, s && !strcmp(s, "[{\"name\":\"live_migration\",\"thread-id\":100},"
				  "{\"name\":\"multifdsend_1\",\"thread-id\":102}]"));
	free(s);
	json_decref(j);
	mig_threads__remove(&mt, 100);
	mig_threads__remove(&mt, 102);
	T_CHECK_EQ(t, mig_threads__count(&mt), 0);
	j = mig_threads__json(&mt);
	T_CHECK(t, json_is_array(j) && json_array_size(j) == 0);
	json_decref(j);
	mig_threads__destroy(&mt);
}

static void t_limits(struct t *t)
{
	struct mig_threads mt;
	mig_threads__init(&mt);
	T_CHECK_EQ(t, mig_threads__add(&mt, 0, "x"), -EINVAL);
	T_CHECK_EQ(t, mig_threads__add(&mt, -5, "x"), -EINVAL);
	T_CHECK_EQ(t, mig_threads__add(&mt, 7, "%s", ""), -EINVAL);
	T_CHECK_EQ(t, mig_threads__add(&mt, 7, "%s", "a-name-of-twenty-four-ch"), -EINVAL);
	T_CHECK_EQ(t, mig_threads__add(&mt, 7, "%s", "a-name-of-twenty-three-"), 0);
	mig_threads__remove(&mt, 7);
	for (int i = 0; i < MIG_THREADS_MAX; i++)
		T_CHECK_EQ(t, mig_threads__add(&mt, 10 + i, "multifdsend_%d", i), 0);
	T_CHECK_EQ(t, mig_threads__add(&mt, 1000, "one_more"), -ENOSPC);
	T_CHECK_EQ(t, mig_threads__count(&mt), MIG_THREADS_MAX);
	/* no list: nothing done, nothing fails */
	T_CHECK_EQ(t, mig_threads__add(NULL, 1, "x"), 0);
	mig_threads__remove(NULL, 1);
	T_CHECK_EQ(t, mig_threads__count(NULL), 0);
	json_t *j = mig_threads__json(NULL);
	T_CHECK(t, json_is_array(j) && json_array_size(j) == 0);
	json_decref(j);
	mig_threads__destroy(&mt);
}

/* Threads that list and unlist themselves while another reads the list
 * (ThreadSanitizer's build checks the locking). */
struct worker {
	struct mig_threads *mt;
	int index;
	int fails;
};

static void *worker(void *arg)
{
	struct worker *w = arg;
	pid_t tid = gettid();
	for (int i = 0; i < 2000; i++) {
		if (mig_threads__add(w->mt, tid, "multifdsend_%d", w->index))
			w->fails++;
		mig_threads__remove(w->mt, tid);
	}
	return NULL;
}

static void t_concurrent(struct t *t)
{
	struct mig_threads mt;
	struct worker w[4];
	pthread_t th[4];
	mig_threads__init(&mt);
	for (int i = 0; i < 4; i++) {
		w[i] = (struct worker){ &mt, i, 0 };
		T_CHECK_EQ(t, pthread_create(&th[i], NULL, worker, &w[i]), 0);
	}
	for (int i = 0; i < 500; i++) {
		json_t *j = mig_threads__json(&mt);
		T_CHECK(t, json_array_size(j) <= 4);
		json_decref(j);
	}
	for (int i = 0; i < 4; i++) {
		pthread_join(th[i], NULL);
		T_CHECK_EQ(t, w[i].fails, 0);
	}
	T_CHECK_EQ(t, mig_threads__count(&mt), 0);
	mig_threads__destroy(&mt);
}

int main(void)
{
	struct t t = { 0 };
	T_RUN(&t, t_add_remove);
	T_RUN(&t, t_limits);
	T_RUN(&t, t_concurrent);
	return T_DONE(&t);
}
