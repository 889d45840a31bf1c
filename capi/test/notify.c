/* Notified windows: per-origin and aggregate expectations, wait_epoch and
 * test_epoch completing with the data in place and no fence, and rewind
 * from the history. */
#include "check.h"

#define EPOCHS 12
#define MSG 16

static void fill(unsigned char *b, int origin, int epoch) {
	for (int i = 0; i < MSG; i++)
		b[i] = pat(origin, epoch, i);
}

static void check_msg(const unsigned char *b, int origin, int epoch) {
	for (int i = 0; i < MSG; i++)
		EXPECT(b[i] == pat(origin, epoch, i), "epoch %d: byte %d from %d is %d", epoch, i, origin, b[i]);
}

int main(void) {
	setup();
	int next = (me + 1) % np, prev = (me + np - 1) % np;

	/* Each rank expects MSG bytes per epoch from prev, and puts into a
	 * different quarter each epoch: an origin runs at most depth (2)
	 * epochs ahead of what its target has consumed. */
	int64_t expect = MSG;
	rvma_notify_config nc = {0};
	nc.expect_from_ranks = &prev;
	nc.expect_from_counts = &expect;
	nc.nexpect_from = 1;
	rvma_win win;
	unsigned char *base;
	CHECK(rvma_win_allocate_notified(world, 4 * MSG, 1, &nc, (void **)&base, &win));
	unsigned char buf[EPOCHS][MSG];
	for (int e = 1; e <= EPOCHS; e++) {
		fill(buf[e - 1], me, e);
		CHECK(rvma_put(win, buf[e - 1], MSG, next, (e % 4) * MSG));
		uint64_t got = 0;
		if (e % 2) {
			CHECK(rvma_win_wait_epoch(win, &got));
		} else {
			int flag = 0;
			while (!flag)
				CHECK(rvma_win_test_epoch(win, &flag, &got));
		}
		EXPECT(got == (uint64_t)e, "epoch %" PRIu64 ", want %d", got, e);
		check_msg(base + (e % 4) * MSG, prev, e);
	}
	CHECK(rvma_win_flush_all(win));
	uint64_t ep;
	CHECK(rvma_win_epoch(win, &ep));
	EXPECT(ep == EPOCHS, "epoch count %" PRIu64, ep);
	/* A rank the target does not expect is refused at the call. */
	if (np > 2) {
		unsigned char b[MSG] = {0};
		EXPECT_ERR(RVMA_ERR_EPOCH, rvma_put(win, b, MSG, (me + 2) % np, 0));
	}
	int flag = 1;
	CHECK(rvma_win_test_epoch(win, &flag, &ep));
	EXPECT(flag == 0, "an epoch completed with nothing put");
	CHECK(rvma_barrier(world));
	CHECK(rvma_win_free(&win));

	/* Aggregate, counting puts: rank 0 expects one put from every other
	 * rank, over its own memory. */
	int64_t *words = calloc((size_t)np, 8);
	rvma_notify_config agg = {0};
	agg.expect = np - 1;
	agg.count = RVMA_COUNT_OPS;
	CHECK(rvma_win_create_notified(world, words, (size_t)np * 8, 8, &agg, &win));
	if (me != 0) {
		int64_t v = 1000 + me;
		CHECK(rvma_put(win, &v, 8, 0, me));
		CHECK(rvma_win_flush(win, 0));
	} else {
		CHECK(rvma_win_wait_epoch(win, &ep));
		EXPECT(ep == 1, "aggregate epoch %" PRIu64, ep);
		for (int o = 1; o < np; o++)
			EXPECT(words[o] == 1000 + o, "aggregate word %d is %" PRId64, o, words[o]);
	}
	CHECK(rvma_barrier(world));
	CHECK(rvma_win_free(&win));
	free(words);

	/* History and rewind: three epochs of different data at one place,
	 * one at a time; roll back two and redo the third. */
	nc.history = 2;
	CHECK(rvma_win_allocate_notified(world, MSG, 1, &nc, (void **)&base, &win));
	for (int e = 1; e <= 3; e++) {
		fill(buf[e - 1], me, e);
		CHECK(rvma_put(win, buf[e - 1], MSG, next, 0));
		CHECK(rvma_win_wait_epoch(win, &ep));
		check_msg(base, prev, e);
		CHECK(rvma_win_flush_all(win));
		CHECK(rvma_barrier(world));
	}
	EXPECT_ERR(RVMA_ERR_NOT_RETAINED, rvma_win_rewind(win, 3, &ep));
	EXPECT_ERR(RVMA_ERR_NOT_RETAINED, rvma_win_rewind(win, 0, &ep));
	memset(base, 0, MSG);
	CHECK(rvma_win_rewind(win, 2, &ep));
	EXPECT(ep == 2, "rewound to epoch %" PRIu64, ep);
	check_msg(base, prev, 2);
	CHECK(rvma_win_epoch(win, &ep));
	EXPECT(ep == 2, "epoch after rewind %" PRIu64, ep);
	CHECK(rvma_barrier(world));
	fill(buf[0], me, 33);
	CHECK(rvma_put(win, buf[0], MSG, next, 0));
	CHECK(rvma_win_wait_epoch(win, &ep));
	EXPECT(ep == 3, "redone epoch %" PRIu64, ep);
	check_msg(base, prev, 33);
	CHECK(rvma_win_flush_all(win));
	CHECK(rvma_barrier(world));
	CHECK(rvma_win_abandon_epoch(win));
	CHECK(rvma_barrier(world));
	CHECK(rvma_win_free(&win));

	/* A plain window has no epochs to wait for. */
	CHECK(rvma_win_allocate(world, 8, 1, NULL, &win));
	EXPECT_ERR(RVMA_ERR_SYNC, rvma_win_wait_epoch(win, &ep));
	EXPECT_ERR(RVMA_ERR_SYNC, rvma_win_rewind(win, 1, &ep));
	CHECK(rvma_win_free(&win));
	finish("notify");
	return 0;
}
