/* Shared windows: each rank stores into its part of a
 * rvma_win_allocate_shared window, and after a fence reads every rank's
 * part through rvma_win_shared_query (contiguous, in rank order), stores
 * into its neighbour's and puts into it, values checked by the owner; a
 * peer's part of an rvma_win_allocate window through the query; and,
 * where the ranks do not share memory (udp), RVMA_ERR_UNSUPPORTED on
 * every rank rather than memory that is not shared. */
#include "check.h"

int main(void) {
	setup();
	int next = (me + 1) % np, prev = (me + np - 1) % np;
	const char *via = "shm";
	if (np > 1) {
		/* connect to the neighbour, whose transport then says */
		char b;
		size_t len;
		CHECK(rvma_send(world, next, 1, "x", 1));
		CHECK(rvma_recv(world, prev, 1, &b, 1, &len));
		CHECK(rvma_comm_transport(world, next, &via));
	}
	int shared = strcmp(via, "shm") == 0;
	/* rank r's part: r+1 words */
	size_t n = (size_t)me + 1;
	int64_t *mine = NULL;
	rvma_win w = RVMA_WIN_NULL;
	if (!shared) {
		EXPECT_ERR(RVMA_ERR_UNSUPPORTED, rvma_win_allocate_shared(world, 8 * n, 8, (void **)&mine, &w));
		EXPECT(w == RVMA_WIN_NULL, "a window after the failure");
	} else {
		CHECK(rvma_win_allocate_shared(world, 8 * n, 8, (void **)&mine, &w));
		for (size_t i = 0; i < n; i++) {
			EXPECT(mine[i] == 0, "not zeroed: %" PRId64, mine[i]);
			mine[i] = me * 100 + (int64_t)i;
		}
		CHECK(rvma_win_fence(w, 0));
		int64_t *base0 = NULL;
		size_t size = 0;
		CHECK(rvma_win_shared_query(w, 0, &size, (void **)&base0));
		EXPECT(size == 8 && base0 != NULL, "rank 0: %zu bytes at %p", size, (void *)base0);
		for (int r = 0, off = 0; r < np; off += r + 1, r++) {
			int64_t *p = NULL;
			CHECK(rvma_win_shared_query(w, r, &size, (void **)&p));
			EXPECT(size == 8 * ((size_t)r + 1) && p == base0 + off, "rank %d: %zu bytes at word %td, want %d", r,
			       size, p - base0, off);
			for (int i = 0; i <= r; i++) EXPECT(p[i] == r * 100 + i, "rank %d word %d: %" PRId64, r, i, p[i]);
		}
		EXPECT(base0 + me * (me + 1) / 2 == mine, "own part not where the query says");
		CHECK(rvma_win_fence(w, 0)); /* everyone has read */
		/* a store into the neighbour's part, and a put into it */
		int64_t *theirs = NULL;
		CHECK(rvma_win_shared_query(w, next, &size, (void **)&theirs));
		theirs[0] = -1000 - me;
		CHECK(rvma_win_fence(w, 0));
		int64_t v = -2000 - me;
		if (next != 0) CHECK(rvma_put(w, &v, 8, next, 1)); /* word 1: rank 0 has one word */
		CHECK(rvma_win_fence(w, 0));
		EXPECT(mine[0] == -1000 - prev, "stored by %d: %" PRId64, prev, mine[0]);
		if (me != 0) EXPECT(mine[1] == -2000 - prev, "put by %d: %" PRId64, prev, mine[1]);
		EXPECT_ERR(RVMA_ERR_RANK, rvma_win_shared_query(w, np, &size, (void **)&theirs));
		EXPECT_ERR(RVMA_ERR_ARG, rvma_win_shared_query(w, 0, NULL, (void **)&theirs));
		CHECK(rvma_win_free(&w));
	}

	/* An allocated window: a peer's part where it is mapped here. */
	int64_t *base = NULL;
	CHECK(rvma_win_allocate(world, 64, 8, (void **)&base, &w));
	base[0] = 7000 + me;
	CHECK(rvma_win_fence(w, 0));
	int64_t *p = NULL;
	size_t size = 0;
	CHECK(rvma_win_shared_query(w, me, &size, (void **)&p));
	EXPECT(p == base && size == 64, "own part: %p %zu", (void *)p, size);
	if (np > 1) {
		if (shared) {
			CHECK(rvma_win_shared_query(w, next, &size, (void **)&p));
			EXPECT(size == 64 && p[0] == 7000 + next, "rank %d's part: %zu bytes, %" PRId64, next, size, p[0]);
		} else {
			EXPECT_ERR(RVMA_ERR_UNSUPPORTED, rvma_win_shared_query(w, next, &size, (void **)&p));
		}
	}
	CHECK(rvma_win_fence(w, 0));
	CHECK(rvma_win_free(&w));
	finish("shared");
	return 0;
}
