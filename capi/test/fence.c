/* Active target (fence) epochs over both kinds of window: puts and gets
 * compared byte for byte (small, inline-sized, large, strided), the
 * accumulates, atomics and request variants with their values. */
#include "check.h"

#define SLOT 70000 /* bytes per origin: larger than any inline or packed path */

static void moves(rvma_win win, unsigned char *base) {
	int next = (me + 1) % np, prev = (me + np - 1) % np;
	size_t sizes[] = {1, 8, 256, 257, 4096, SLOT};
	unsigned char *src = malloc(SLOT), *dst = malloc(SLOT);
	for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
		size_t n = sizes[k];
		for (size_t i = 0; i < n; i++)
			src[i] = pat(me, next, i + k);
		/* Into slot me of next's window. */
		CHECK(rvma_win_fence(win, 0));
		CHECK(rvma_put(win, src, n, next, (int64_t)me * SLOT));
		CHECK(rvma_win_fence(win, 0));
		for (size_t i = 0; i < n; i++)
			EXPECT(base[(size_t)prev * SLOT + i] == pat(prev, me, i + k), "put of %zu: byte %zu", n, i);
		/* Read it back from next's window. */
		memset(dst, 0, n);
		CHECK(rvma_get(win, dst, n, next, (int64_t)me * SLOT));
		CHECK(rvma_win_fence(win, 0));
		EXPECT(memcmp(dst, src, n) == 0, "get of %zu differs", n);
	}

	/* Strided: 10 blocks of 3 bytes every 8 at the origin into 5 blocks
	 * of 6 bytes every 16 at the target, and back. */
	rvma_layout ol = {10, 3, 8}, tl = {5, 6, 16};
	for (size_t i = 0; i < 80; i++)
		src[i] = pat(me, next, i);
	CHECK(rvma_win_fence(win, 0));
	memset(base + (size_t)prev * SLOT, 0xee, 80);
	CHECK(rvma_win_fence(win, 0));
	CHECK(rvma_put_strided(win, src, &ol, next, (int64_t)me * SLOT, &tl));
	CHECK(rvma_win_fence(win, 0));
	for (int b = 0, o = 0; b < 5; b++) {
		for (int i = 0; i < 6; i++, o++)
			EXPECT(base[(size_t)prev * SLOT + b * 16 + i] == pat(prev, me, (o / 3) * 8 + o % 3),
			       "strided put: block %d byte %d", b, i);
		for (int i = 6; i < 16; i++)
			EXPECT(base[(size_t)prev * SLOT + b * 16 + i] == 0xee, "strided put wrote between blocks");
	}
	memset(dst, 0, 80);
	CHECK(rvma_get_strided(win, dst, &ol, next, (int64_t)me * SLOT, &tl));
	CHECK(rvma_win_fence(win, 0));
	for (int i = 0; i < 80; i++)
		EXPECT(dst[i] == (i % 8 < 3 ? src[i] : 0), "strided get: byte %d", i);
	rvma_layout bad = {2, 8, 4};
	EXPECT_ERR(RVMA_ERR_DATATYPE, rvma_put_strided(win, src, &bad, next, 0, &tl));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_put_strided(win, src, NULL, next, 0, &tl));
	rvma_layout ten = {1, 10, 10};
	EXPECT_ERR(RVMA_ERR_DATATYPE, rvma_put_strided(win, src, &ten, next, 0, &tl)); /* 10 bytes into 30 */
	CHECK(rvma_win_fence(win, 0));

	/* Indexed: pieces of 4 and 12 bytes (a struct's members), listed
	 * backwards, origin offsets relative to a pointer in the middle of
	 * src (some negative), one empty run among them; and back. */
	enum { NR = 40 };
	rvma_run runs[NR + 1];
	unsigned char *mid = src + 300;
	for (int r = 0, o = -300, t = 0; r < NR; r++) {
		int64_t len = r % 2 ? 12 : 4;
		runs[NR - 1 - r] = (rvma_run){o, t, len};
		o += (int)len + 5, t += (int)len + 1;
	}
	runs[NR] = (rvma_run){7, 3, 0};
	for (size_t i = 0; i < 1000; i++)
		src[i] = pat(me, next, i);
	CHECK(rvma_win_fence(win, 0));
	memset(base + (size_t)prev * SLOT, 0xee, 700);
	CHECK(rvma_win_fence(win, 0));
	CHECK(rvma_register_origin(win, src, 1000)); /* a hint: the runs find it */
	CHECK(rvma_register_origin(win, NULL, 0));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_register_origin(win, NULL, 8));
	CHECK(rvma_put_runs(win, mid, runs, NR + 1, next, (int64_t)me * SLOT));
	CHECK(rvma_win_fence(win, 0));
	unsigned char want[700];
	memset(want, 0xee, sizeof want);
	for (int r = 0; r < NR; r++)
		for (int64_t i = 0; i < runs[r].len; i++)
			want[runs[r].target_off + i] = pat(prev, me, (size_t)(300 + runs[r].origin_off + i));
	EXPECT(memcmp(base + (size_t)prev * SLOT, want, sizeof want) == 0, "put_runs: the target's bytes differ");
	memset(dst, 0, 1000);
	CHECK(rvma_get_runs(win, dst + 300, runs, NR + 1, next, (int64_t)me * SLOT));
	CHECK(rvma_win_fence(win, 0));
	for (int r = 0; r < NR; r++)
		EXPECT(memcmp(dst + 300 + runs[r].origin_off, src + 300 + runs[r].origin_off, (size_t)runs[r].len) == 0,
		       "get_runs: run %d differs", r);
	CHECK(rvma_put_runs(win, src, NULL, 0, next, 0)); /* nothing */
	EXPECT_ERR(RVMA_ERR_ARG, rvma_put_runs(win, src, NULL, 2, next, 0));
	rvma_run badr[2] = {{0, 0, 8}, {0, 8, -1}};
	EXPECT_ERR(RVMA_ERR_ARG, rvma_put_runs(win, src, badr, 2, next, 0));
	badr[1] = (rvma_run){0, SLOT * (int64_t)np, 8}; /* past the window */
	EXPECT_ERR(RVMA_ERR_BOUNDS, rvma_get_runs(win, dst, badr, 2, next, 0));
	badr[1] = (rvma_run){0, -8, 8};
	EXPECT_ERR(RVMA_ERR_BOUNDS, rvma_put_runs(win, src, badr, 2, next, 0));
	CHECK(rvma_win_fence(win, 0));
	EXPECT(memcmp(base + (size_t)prev * SLOT, want, sizeof want) == 0, "a refused put_runs moved bytes");
	CHECK(rvma_win_fence(win, 0)); /* checked before the next section's puts */

	/* Request variants. */
	rvma_request rq[2];
	for (size_t i = 0; i < 300; i++)
		src[i] = pat(me, next, i + 99);
	CHECK(rvma_rput(win, src, 300, next, (int64_t)me * SLOT, &rq[0]));
	CHECK(rvma_request_wait(&rq[0]));
	CHECK(rvma_rget(win, dst, 300, next, (int64_t)me * SLOT, &rq[1]));
	int flag = 0;
	while (!flag)
		CHECK(rvma_request_test(&rq[1], &flag));
	EXPECT(rq[1] == RVMA_REQUEST_NULL, "tested request not freed");
	EXPECT(memcmp(dst, src, 300) == 0, "rput then rget differ");
	CHECK(rvma_rput_strided(win, src, &ol, next, (int64_t)me * SLOT, &tl, &rq[0]));
	CHECK(rvma_rget_strided(win, dst, &tl, next, (int64_t)me * SLOT, &tl, &rq[1]));
	CHECK(rvma_request_waitall(2, rq));
	CHECK(rvma_win_fence(win, 0));
	free(src);
	free(dst);
}

static void accumulates(rvma_win win, unsigned char *base) {
	/* Every rank adds to rank 0's counters, as int64, double and int32. */
	int64_t *c64 = (int64_t *)base;
	double *cd = (double *)(base + 64);
	int32_t *c32 = (int32_t *)(base + 128);
	CHECK(rvma_win_fence(win, 0));
	if (me == 0) {
		memset(base, 0, 256);
		c32[1] = 1000;
	}
	CHECK(rvma_win_fence(win, 0));
	int64_t v64[2] = {me + 1, 100};
	double vd[2] = {0.25, me};
	int32_t v32[2] = {me, me};
	CHECK(rvma_accumulate(win, v64, 2, RVMA_INT64, RVMA_SUM, 0, 0));
	CHECK(rvma_accumulate(win, vd, 2, RVMA_DOUBLE, RVMA_SUM, 0, 64));
	CHECK(rvma_accumulate(win, v32, 1, RVMA_INT32, RVMA_MAX, 0, 128));
	CHECK(rvma_accumulate(win, v32 + 1, 1, RVMA_INT32, RVMA_MIN, 0, 132));
	rvma_request r;
	CHECK(rvma_raccumulate(win, v64, 1, RVMA_INT64, RVMA_SUM, 0, 16, &r));
	CHECK(rvma_request_wait(&r));
	CHECK(rvma_win_fence(win, 0));
	if (me == 0) {
		int64_t tri = (int64_t)np * (np + 1) / 2;
		EXPECT(c64[0] == tri && c64[1] == 100 * np && c64[2] == tri, "int64 sums %" PRId64 " %" PRId64 " %" PRId64,
		       c64[0], c64[1], c64[2]);
		double s = 0;
		for (int q = 0; q < np; q++)
			s += q;
		EXPECT(cd[0] == 0.25 * np && cd[1] == s, "double sums %g %g", cd[0], cd[1]);
		EXPECT(c32[0] == np - 1 && c32[1] == 0, "int32 max %d min %d", c32[0], c32[1]);
	}
	CHECK(rvma_win_fence(win, 0));

	/* Fetch-and-op tickets, one rank at a time so they are predictable. */
	if (me == 0)
		c64[4] = 0, c64[5] = 7;
	CHECK(rvma_win_fence(win, 0));
	for (int q = 0; q < np; q++) {
		if (q == me) {
			int64_t one = 1, old = -1, seen = -1;
			CHECK(rvma_fetch_and_op(win, &one, &old, RVMA_INT64, RVMA_SUM, 0, 32));
			CHECK(rvma_fetch_and_op(win, NULL, &seen, RVMA_INT64, RVMA_NO_OP, 0, 40));
			CHECK(rvma_win_fence(win, 0));
			EXPECT(old == q, "ticket %" PRId64 ", want %d", old, q);
			EXPECT(seen == 7 + q, "no-op fetched %" PRId64 ", want %d", seen, 7 + q);
			/* Compare-and-swap: swaps only when the value matches. */
			int64_t cmp = 7 + q, swp = 8 + q, prev = -1;
			CHECK(rvma_compare_and_swap(win, &swp, &cmp, &prev, RVMA_INT64, 0, 40));
			CHECK(rvma_win_fence(win, 0));
			EXPECT(prev == 7 + q, "cas saw %" PRId64 ", want %d", prev, 7 + q);
			int64_t wrong = -5;
			CHECK(rvma_compare_and_swap(win, &wrong, &wrong, &prev, RVMA_INT64, 0, 40));
			CHECK(rvma_win_fence(win, 0));
			EXPECT(prev == 8 + q, "failed cas saw %" PRId64, prev);
		} else {
			CHECK(rvma_win_fence(win, 0));
			CHECK(rvma_win_fence(win, 0));
			CHECK(rvma_win_fence(win, 0));
		}
	}
	if (me == 0)
		EXPECT(c64[4] == np && c64[5] == 7 + np, "counter %" PRId64 ", cas word %" PRId64, c64[4], c64[5]);

	/* Get-accumulate, fetch-and-op and cas on doubles and int32, request
	 * variants. */
	CHECK(rvma_win_fence(win, 0));
	if (me == 0)
		cd[2] = 1.5, c32[4] = 40;
	CHECK(rvma_win_fence(win, 0));
	if (me == np - 1) {
		double add[1] = {2.0}, oldd[1] = {0};
		CHECK(rvma_get_accumulate(win, add, oldd, 1, RVMA_DOUBLE, RVMA_SUM, 0, 80));
		int32_t two = 2, old32 = 0, rep = 9, cmp32 = 80, prev32 = 0;
		CHECK(rvma_rfetch_and_op(win, &two, &old32, RVMA_INT32, RVMA_PROD, 0, 144, &r));
		CHECK(rvma_request_wait(&r));
		EXPECT(old32 == 40, "int32 fetch_and_op saw %d", old32);
		CHECK(rvma_rcompare_and_swap(win, &rep, &cmp32, &prev32, RVMA_INT32, 0, 144, &r));
		CHECK(rvma_request_wait(&r));
		EXPECT(prev32 == 80, "int32 cas saw %d", prev32);
		double got[1] = {-1};
		CHECK(rvma_rget_accumulate(win, NULL, got, 1, RVMA_DOUBLE, RVMA_NO_OP, 0, 80, &r));
		CHECK(rvma_request_wait(&r));
		EXPECT(got[0] == 3.5, "get_accumulate no-op saw %g", got[0]);
		CHECK(rvma_win_fence(win, 0));
		EXPECT(oldd[0] == 1.5, "get_accumulate saw %g", oldd[0]);
	} else {
		CHECK(rvma_win_fence(win, 0));
	}
	if (me == 0)
		EXPECT(cd[2] == 3.5 && c32[4] == 9, "after: %g %d", cd[2], c32[4]);
	CHECK(rvma_win_fence(win, RVMA_MODE_NOSUCCEED));
}

int main(void) {
	setup();
	size_t size = (size_t)np * SLOT;

	/* A window the library allocates. */
	rvma_win win;
	unsigned char *base = NULL;
	CHECK(rvma_win_allocate(world, size, 1, (void **)&base, &win));
	EXPECT(base != NULL, "no base");
	for (size_t i = 0; i < size; i++)
		EXPECT(base[i] == 0, "allocated memory not zeroed at %zu", i);
	EXPECT(((uintptr_t)base & 4095) == 0, "allocated memory not page-aligned: %p", (void *)base);
	void *b2;
	size_t s2;
	int u2;
	CHECK(rvma_win_get_info(win, &b2, &s2, &u2));
	EXPECT(b2 == base && s2 == size && u2 == 1, "info %p %zu %d", b2, s2, u2);
	moves(win, base);
	accumulates(win, base);
	CHECK(rvma_win_free(&win));
	EXPECT(win == RVMA_WIN_NULL, "freed handle not cleared");

	/* A window over this program's memory. */
	unsigned char *mem = calloc(size + 8, 1);
	rvma_win cw;
	CHECK(rvma_win_create(world, mem, size, 1, &cw));
	moves(cw, mem);
	accumulates(cw, mem);
	CHECK(rvma_win_free(&cw));
	free(mem);

	/* With a displacement unit of 8 bytes: displacements count words. */
	int64_t *words = calloc((size_t)np, 8);
	CHECK(rvma_win_create(world, words, (size_t)np * 8, 8, &cw));
	CHECK(rvma_win_fence(cw, RVMA_MODE_NOPRECEDE));
	for (int t = 0; t < np; t++) {
		int64_t v = me * 100 + t;
		CHECK(rvma_put(cw, &v, 8, t, me)); /* unit 8: word me */
	}
	CHECK(rvma_win_fence(cw, RVMA_MODE_NOSUCCEED));
	for (int o = 0; o < np; o++)
		EXPECT(words[o] == o * 100 + me, "word %d is %" PRId64, o, words[o]);
	CHECK(rvma_win_free(&cw));
	free(words);

	/* An empty window is a window. */
	CHECK(rvma_win_allocate(world, 0, 1, (void **)&base, &win));
	EXPECT(base == NULL, "empty window has base %p", (void *)base);
	CHECK(rvma_win_free(&win));
	finish("fence");
	return 0;
}
