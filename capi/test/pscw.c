/* General active target (post/start/complete/wait and test): each rank
 * exposes its window to its left neighbour and accesses its right one,
 * rounds in a row; a value arrives only inside the epochs. */
#include "check.h"

int main(void) {
	setup();
	int next = (me + 1) % np, prev = (me + np - 1) % np;
	rvma_win win;
	int64_t *base;
	CHECK(rvma_win_allocate(world, 64, 8, (void **)&base, &win));
	int64_t v = 0;

	/* Outside an epoch a put is refused. */
	EXPECT_ERR(RVMA_ERR_EPOCH, rvma_put(win, &v, 8, next, 0));
	EXPECT_ERR(RVMA_ERR_SYNC, rvma_win_complete(win));
	EXPECT_ERR(RVMA_ERR_SYNC, rvma_win_wait(win));
	int flag;
	EXPECT_ERR(RVMA_ERR_SYNC, rvma_win_test(win, &flag));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_win_post(win, NULL, 1, 0));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_win_start(win, &next, -1, 0));
	int bad = np;
	EXPECT_ERR(RVMA_ERR_RANK, rvma_win_post(win, &bad, 1, 0));

	for (int round = 1; round <= 20; round++) {
		CHECK(rvma_win_post(win, &prev, 1, RVMA_MODE_NOCHECK));
		CHECK(rvma_win_start(win, &next, 1, 0));
		v = (int64_t)me * 1000 + round;
		CHECK(rvma_put(win, &v, 8, next, 0));
		int64_t acc = round;
		CHECK(rvma_accumulate(win, &acc, 1, RVMA_INT64, RVMA_SUM, next, 1));
		int64_t got = -1;
		CHECK(rvma_get(win, &got, 8, next, 2));
		CHECK(rvma_win_complete(win));
		EXPECT(got == (round == 1 ? 0 : (int64_t)me * 7 + round - 1), "round %d: got %" PRId64, round, got);
		if (round % 2) {
			CHECK(rvma_win_wait(win));
		} else {
			/* Test until the origin has completed. */
			flag = 0;
			while (!flag)
				CHECK(rvma_win_test(win, &flag));
		}
		EXPECT(base[0] == (int64_t)prev * 1000 + round, "round %d: slot %" PRId64, round, base[0]);
		EXPECT(base[1] == (int64_t)round * (round + 1) / 2, "round %d: sum %" PRId64, round, base[1]);
		/* What next reads in the next round. */
		base[2] = (int64_t)prev * 7 + round;
		CHECK(rvma_barrier(world));
	}
	/* Two epochs at once are out of order. */
	CHECK(rvma_win_post(win, &prev, 1, 0));
	EXPECT_ERR(RVMA_ERR_SYNC, rvma_win_post(win, &prev, 1, 0));
	CHECK(rvma_win_start(win, &next, 1, 0));
	EXPECT_ERR(RVMA_ERR_SYNC, rvma_win_start(win, &next, 1, 0));
	CHECK(rvma_win_complete(win));
	CHECK(rvma_win_wait(win));
	CHECK(rvma_win_free(&win));
	finish("pscw");
	return 0;
}
