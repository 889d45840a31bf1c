/* The cost of a call through librvma, for comparison with the same loop in
 * Go (overhead/main.go): rank 0 times iters calls of one operation on rank
 * 1's window inside a lock_all epoch; rank 1 waits in a barrier.
 *
 *   rvmarun -n 2 --provider shm overhead OP ITERS
 *
 * OP: rank (rvma_comm_rank: the bare C-to-Go crossing), putflush (an 8-byte
 * rvma_put and rvma_win_flush), fopflush (an int64 rvma_fetch_and_op, sum,
 * and the flush that makes its result readable, as MPI codes do). Each
 * iteration is two calls but rank's.
 * Prints "OP ITERS NS ns/call". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rvma.h"

#define CHECK(call)                                                                                    \
	do {                                                                                           \
		int rc_ = (call);                                                                      \
		if (rc_) {                                                                             \
			fprintf(stderr, "%s: %s (%s)\n", #call, rvma_strerror(rc_), rvma_last_error_message()); \
			exit(1);                                                                       \
		}                                                                                      \
	} while (0)

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
	if (argc != 3) {
		fprintf(stderr, "usage: overhead rank|putflush|fopflush ITERS\n");
		return 2;
	}
	const char *op = argv[1];
	long iters = atol(argv[2]);
	rvma_comm world;
	int me, np;
	rvma_win win;
	CHECK(rvma_init(&world));
	CHECK(rvma_comm_rank(world, &me));
	CHECK(rvma_comm_size(world, &np));
	if (np != 2) {
		fprintf(stderr, "run it on 2 ranks\n");
		return 2;
	}
	CHECK(rvma_win_allocate(world, 1 << 16, 1, NULL, &win));
	if (me == 0) {
		CHECK(rvma_win_lock_all(win));
		int64_t data = 0, one = 1, old;
		int r;
		double t0 = 0;
		/* A tenth of the iterations to warm up (connection, caches). */
		for (long i = -iters / 10; i < iters; i++) {
			if (i == 0)
				t0 = now();
			if (strcmp(op, "rank") == 0) {
				CHECK(rvma_comm_rank(world, &r));
			} else if (strcmp(op, "putflush") == 0) {
				CHECK(rvma_put(win, &data, 8, 1, 0));
				CHECK(rvma_win_flush(win, 1));
			} else if (strcmp(op, "fopflush") == 0) {
				CHECK(rvma_fetch_and_op(win, &one, &old, RVMA_INT64, RVMA_SUM, 1, 0));
				CHECK(rvma_win_flush(win, 1));
			} else {
				fprintf(stderr, "unknown op %s\n", op);
				return 2;
			}
		}
		double ns = (now() - t0) / iters;
		CHECK(rvma_win_unlock_all(win));
		printf("%s %ld %.1f ns/iteration\n", op, iters, ns);
	}
	CHECK(rvma_barrier(world));
	CHECK(rvma_win_free(&win));
	CHECK(rvma_finalize());
	return 0;
}
