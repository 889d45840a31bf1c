/* Passive target: exclusive and shared locks, lock_all, the flushes and
 * sync. Read-modify-write under an exclusive lock loses no update; atomics
 * under shared locks count exactly. */
#include "check.h"

#define ROUNDS 50

int main(void) {
	setup();
	rvma_win win;
	int64_t *base;
	CHECK(rvma_win_allocate(world, 8 * (size_t)(np + 4), 8, (void **)&base, &win));
	CHECK(rvma_barrier(world));

	/* A counter at rank 0 that every rank increments with a get and a put
	 * under an exclusive lock: any overlap of two epochs loses updates. */
	for (int i = 0; i < ROUNDS; i++) {
		CHECK(rvma_win_lock(win, RVMA_LOCK_EXCLUSIVE, 0));
		int64_t v = -1;
		CHECK(rvma_get(win, &v, 8, 0, 0));
		CHECK(rvma_win_flush(win, 0));
		v++;
		CHECK(rvma_put(win, &v, 8, 0, 0));
		CHECK(rvma_win_unlock(win, 0));
	}
	CHECK(rvma_barrier(world));
	if (me == 0) {
		CHECK(rvma_win_sync(win));
		EXPECT(base[0] == (int64_t)np * ROUNDS, "exclusive counter %" PRId64 ", want %d", base[0], np * ROUNDS);
	}

	/* Shared locks: fetch-and-add tickets are distinct and dense. */
	int64_t mine[ROUNDS];
	CHECK(rvma_win_lock(win, RVMA_LOCK_SHARED, np - 1));
	for (int i = 0; i < ROUNDS; i++) {
		int64_t one = 1;
		CHECK(rvma_fetch_and_op(win, &one, &mine[i], RVMA_INT64, RVMA_SUM, np - 1, 1));
		CHECK(rvma_win_flush_local(win, np - 1));
	}
	CHECK(rvma_win_unlock(win, np - 1));
	int64_t sum = 0;
	for (int i = 0; i < ROUNDS; i++)
		sum += mine[i];
	for (int i = 1; i < ROUNDS; i++)
		EXPECT(mine[i] > mine[i - 1], "tickets not increasing");
	CHECK(rvma_allreduce_int64(world, RVMA_SUM, &sum, 1));
	int64_t total = (int64_t)np * ROUNDS;
	EXPECT(sum == total * (total - 1) / 2, "tickets sum to %" PRId64, sum);

	/* lock_all: every rank puts its rank into word 2+me of every rank,
	 * flushing one target, then all. */
	CHECK(rvma_win_lock_all(win));
	EXPECT_ERR(RVMA_ERR_SYNC, rvma_win_lock(win, RVMA_LOCK_SHARED, 0));
	for (int t = 0; t < np; t++) {
		int64_t v = 100 + me;
		CHECK(rvma_put(win, &v, 8, t, 2 + me));
		if (t == 0)
			CHECK(rvma_win_flush(win, t));
	}
	CHECK(rvma_win_flush_all(win));
	CHECK(rvma_win_flush_local_all(win));
	CHECK(rvma_win_unlock_all(win));
	CHECK(rvma_barrier(world));
	CHECK(rvma_win_sync(win));
	for (int o = 0; o < np; o++)
		EXPECT(base[2 + o] == 100 + o, "lock_all put from %d: %" PRId64, o, base[2 + o]);

	/* Out of order and bad arguments. */
	EXPECT_ERR(RVMA_ERR_SYNC, rvma_win_unlock(win, 0));
	EXPECT_ERR(RVMA_ERR_SYNC, rvma_win_unlock_all(win));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_win_lock(win, 3, 0));
	EXPECT_ERR(RVMA_ERR_RANK, rvma_win_lock(win, RVMA_LOCK_SHARED, np));
	EXPECT_ERR(RVMA_ERR_RANK, rvma_win_flush(win, -1));
	CHECK(rvma_win_lock(win, RVMA_LOCK_SHARED, 0));
	EXPECT_ERR(RVMA_ERR_SYNC, rvma_win_lock(win, RVMA_LOCK_SHARED, 0));
	CHECK(rvma_win_unlock(win, 0));
	CHECK(rvma_win_free(&win));
	finish("lock");
	return 0;
}
