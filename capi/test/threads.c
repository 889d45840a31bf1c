/* Several threads of each rank share a window inside one lock_all epoch:
 * their atomics all count, and each thread's last error message is its
 * own. */
#include <pthread.h>

#include "check.h"

#define THREADS 4
#define OPS 200

static rvma_win win;

static void *worker(void *arg) {
	int t = (int)(intptr_t)arg;
	int target = (me + t) % np;
	char want[64];
	for (int i = 0; i < OPS; i++) {
		int64_t one = 1, old;
		CHECK(rvma_fetch_and_op(win, &one, &old, RVMA_INT64, RVMA_SUM, target, 0));
		CHECK(rvma_accumulate(win, &one, 1, RVMA_INT64, RVMA_SUM, target, 1));
		/* A different bad displacement per thread: its message must
		 * survive the other threads' failures. */
		int64_t disp = 1000 + t;
		EXPECT_ERR(RVMA_ERR_BOUNDS, rvma_put(win, &one, 8, target, disp));
		snprintf(want, sizeof want, "displacement %d ", 1000 + t);
		sched_yield();
		EXPECT(strstr(rvma_last_error_message(), want) != NULL, "thread %d sees \"%s\"", t,
		       rvma_last_error_message());
	}
	CHECK(rvma_win_flush_all(win));
	return NULL;
}

int main(void) {
	setup();
	int64_t *base;
	CHECK(rvma_win_allocate(world, 16, 8, (void **)&base, &win));
	CHECK(rvma_win_lock_all(win));
	pthread_t th[THREADS];
	for (int t = 0; t < THREADS; t++)
		EXPECT(pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t) == 0, "pthread_create");
	for (int t = 0; t < THREADS; t++)
		pthread_join(th[t], NULL);
	CHECK(rvma_win_unlock_all(win));
	CHECK(rvma_barrier(world));
	/* Thread t of rank r targets r+t: each rank is the target of THREADS
	 * threads in all. */
	EXPECT(base[0] == THREADS * OPS && base[1] == THREADS * OPS, "counters %" PRId64 " %" PRId64, base[0], base[1]);
	CHECK(rvma_win_free(&win));
	finish("threads");
	return 0;
}
