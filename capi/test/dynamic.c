/* Dynamic windows: each rank attaches memory after creating the window,
 * the ranks exchange its address, and each puts, gets, accumulates,
 * fetch-and-adds and compare-and-swaps into its neighbour's at those
 * addresses, values checked by the owners; an access outside attached
 * memory, an overlapping attach and a detach of nothing are refused; after
 * a detach and a new attach the neighbour reaches the new memory. */
#include "check.h"

int main(void) {
	setup();
	int next = (me + 1) % np, prev = (me + np - 1) % np;
	rvma_win w;
	CHECK(rvma_win_create_dynamic(world, &w));
	int64_t *a = calloc(8, sizeof *a), *b = calloc(8, sizeof *b);
	for (int i = 0; i < 8; i++) b[i] = me * 100 + i;
	CHECK(rvma_win_attach(w, a, 8 * sizeof *a));
	CHECK(rvma_win_attach(w, b, 8 * sizeof *b));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_win_attach(w, a + 2, 8));
	int64_t mine[2] = {(int64_t)(intptr_t)a, (int64_t)(intptr_t)b}, *all = malloc(16 * (size_t)np);
	CHECK(rvma_allgather(world, mine, sizeof mine, all));
	int64_t na = all[2 * next], pb = all[2 * prev + 1];

	CHECK(rvma_win_lock_all(w));
	int64_t v = 4242, got[2] = {0, 0}, one = 1, old = -1, cmp = 0, swp = 77, res = -1;
	CHECK(rvma_put(w, &v, 8, next, na));
	CHECK(rvma_get(w, got, 16, prev, pb + 8));
	CHECK(rvma_accumulate(w, &one, 1, RVMA_INT64, RVMA_SUM, next, na + 8));
	CHECK(rvma_win_flush_all(w));
	CHECK(rvma_fetch_and_op(w, &one, &old, RVMA_INT64, RVMA_SUM, next, na + 8));
	CHECK(rvma_compare_and_swap(w, &swp, &cmp, &res, RVMA_INT64, next, na + 16));
	EXPECT_ERR(RVMA_ERR_BOUNDS, rvma_put(w, &v, 8, next, all[2 * next + 1] + 64));
	CHECK(rvma_win_unlock_all(w));
	EXPECT(got[0] == prev * 100 + 1 && got[1] == prev * 100 + 2, "get: %" PRId64 " %" PRId64, got[0], got[1]);
	EXPECT(old == 1 && res == 0, "fetched %" PRId64 ", swapped out %" PRId64, old, res);
	CHECK(rvma_barrier(world));
	EXPECT(a[0] == 4242 && a[1] == 2 && a[2] == 77, "own memory: %" PRId64 " %" PRId64 " %" PRId64, a[0], a[1], a[2]);

	/* detach b, attach c: the neighbour reaches c */
	CHECK(rvma_barrier(world));
	CHECK(rvma_win_detach(w, b));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_win_detach(w, b));
	int64_t *c = calloc(4, sizeof *c), ca = (int64_t)(intptr_t)c, *cs = malloc(8 * (size_t)np);
	CHECK(rvma_win_attach(w, c, 4 * sizeof *c));
	CHECK(rvma_allgather(world, &ca, 8, cs));
	CHECK(rvma_win_fence(w, 0));
	v = 5000 + me;
	CHECK(rvma_put(w, &v, 8, next, cs[next] + 8));
	EXPECT_ERR(RVMA_ERR_BOUNDS, rvma_get(w, got, 8, prev, pb));
	CHECK(rvma_win_fence(w, 0));
	EXPECT(c[1] == 5000 + prev, "put into new memory: %" PRId64, c[1]);
	CHECK(rvma_win_free(&w));
	free(a), free(b), free(c), free(all), free(cs);
	finish("dynamic");
	return 0;
}
