/* Derived datatypes in one-sided and point-to-point calls, values checked
 * element by element: indexed, hindexed, indexed_block, struct and resized
 * types and their bounds; blocks that go backwards (decreasing
 * displacements) and copies that interleave (a resized extent), which no
 * strided layout describes; get_accumulate with non-contiguous origin,
 * result and target; MPI_BOTTOM buffers (absolute addresses); accumulates
 * and atomics on MPI_BYTE; accumulates of no data whatever their types.
 * Prints "dtypes: ok on N ranks". */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

enum { N = 64 };

static int *win_buf; /* N ints */
static MPI_Win win;
static int next, prev;

static void reset(int v0) {
	OK(MPI_Win_fence(0, win));
	for (int i = 0; i < N; i++) win_buf[i] = v0 + i;
	OK(MPI_Win_fence(0, win));
}

static void bounds(MPI_Datatype t, MPI_Aint lb, MPI_Aint extent, int size, const char *what) {
	MPI_Aint l = -1, e = -1;
	int s = -1;
	OK(MPI_Type_get_extent(t, &l, &e));
	OK(MPI_Type_size(t, &s));
	EXPECT(l == lb && e == extent && s == size, "%s: lb %ld extent %ld size %d, want %ld %ld %d", what, (long)l, (long)e,
	       s, (long)lb, (long)extent, size);
}

int main(int argc, char **argv) {
	int np = start(&argc, &argv);
	next = (me + 1) % np, prev = (me + np - 1) % np;
	OK(MPI_Alloc_mem(N * sizeof(int), MPI_INFO_NULL, &win_buf));
	OK(MPI_Win_create(win_buf, N * sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &win));
	OK(MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN));

	/* Constructors and their bounds. */
	MPI_Datatype idx, back, hidx, st, st2, rs, rs8;
	int bl[2] = {2, 1}, di[2] = {3, 0}, bd[3] = {5, 2, 0};
	MPI_Aint hd[2] = {8, 20};
	OK(MPI_Type_indexed(2, bl, di, MPI_INT, &idx)); /* ints 3, 4, 0 */
	OK(MPI_Type_create_indexed_block(3, 1, bd, MPI_INT, &back)); /* ints 5, 2, 0: backwards */
	int one[2] = {1, 1};
	OK(MPI_Type_create_hindexed(2, one, hd, MPI_INT, &hidx)); /* bytes 8 and 20 */
	struct pair {
		int i;
		double d;
	};
	MPI_Aint sd[2] = {offsetof(struct pair, i), offsetof(struct pair, d)};
	MPI_Datatype stt[2] = {MPI_INT, MPI_DOUBLE};
	OK(MPI_Type_create_struct(2, one, sd, stt, &st));
	struct ci {
		char c;
		int i;
	};
	MPI_Aint sd2[2] = {offsetof(struct ci, c), offsetof(struct ci, i)};
	MPI_Datatype stt2[2] = {MPI_CHAR, MPI_INT};
	OK(MPI_Type_create_struct(2, one, sd2, stt2, &st2));
	OK(MPI_Type_create_resized(MPI_INT, -4, 12, &rs));
	OK(MPI_Type_create_resized(MPI_INT, 0, 8, &rs8)); /* every other int */
	MPI_Datatype *all[] = {&idx, &back, &hidx, &st, &st2, &rs, &rs8};
	for (int i = 0; i < 7; i++) OK(MPI_Type_commit(all[i]));
	bounds(idx, 0, 20, 12, "indexed");
	bounds(back, 0, 24, 12, "indexed_block backwards");
	bounds(hidx, 8, 16, 8, "hindexed");
	bounds(st, 0, sizeof(struct pair), 12, "struct {int, double}");
	bounds(st2, 0, sizeof(struct ci), 5, "struct {char, int}");
	bounds(rs, -4, 12, 4, "resized");
	MPI_Aint tl = -1, te = -1;
	OK(MPI_Type_get_true_extent(hidx, &tl, &te));
	EXPECT(tl == 8 && te == 16, "hindexed true extent %ld %ld", (long)tl, (long)te);

	/* Put into a backwards target type: origin ints a, b, c land at 5, 2, 0. */
	reset(-1000);
	int src[8];
	for (int i = 0; i < 8; i++) src[i] = 100 * me + i;
	OK(MPI_Win_fence(0, win));
	OK(MPI_Put(src, 3, MPI_INT, next, 1, 1, back, win));
	OK(MPI_Win_fence(0, win));
	for (int i = 0; i < N; i++) {
		int want = i == 6 ? 100 * prev : i == 3 ? 100 * prev + 1 : i == 1 ? 100 * prev + 2 : -1000 + i;
		EXPECT(win_buf[i] == want, "put backwards: [%d] = %d, want %d", i, win_buf[i], want);
	}

	/* Get into a backwards origin type, two copies (extent 6 ints). */
	int got[12];
	for (int i = 0; i < 12; i++) got[i] = -1;
	OK(MPI_Get(got, 2, back, next, 10, 6, MPI_INT, win));
	OK(MPI_Win_fence(0, win));
	int gw[12] = {12, -1, 11, -1, -1, 10, 15, -1, 14, -1, -1, 13}; /* target ints 10..15 */
	for (int i = 0; i < 12; i++) {
		int want = gw[i] < 0 ? -1 : -1000 + gw[i];
		EXPECT(got[i] == want, "get backwards: [%d] = %d, want %d", i, got[i], want);
	}

	/* Accumulate into interleaved copies (resized to 8 bytes: ints 0, 2,
	 * 4 of disp 20) and into an indexed type with two copies. */
	reset(0);
	OK(MPI_Win_fence(0, win));
	OK(MPI_Accumulate(src, 3, MPI_INT, next, 20, 3, rs8, MPI_SUM, win));
	OK(MPI_Accumulate(src, 6, MPI_INT, next, 40, 2, idx, MPI_SUM, win)); /* ints 43 44 40 48 49 45 */
	OK(MPI_Win_fence(0, win));
	for (int i = 0; i < N; i++) {
		int add = 0;
		if (i == 20 || i == 22 || i == 24) add = 100 * prev + (i - 20) / 2;
		int map[6] = {43, 44, 40, 48, 49, 45};
		for (int k = 0; k < 6; k++)
			if (i == map[k]) add = 100 * prev + k;
		EXPECT(win_buf[i] == i + add, "accumulate: [%d] = %d, want %d", i, win_buf[i], i + add);
	}

	/* Get_accumulate with all three sides non-contiguous: origin a vector
	 * (every other int), result backwards, target indexed. */
	reset(1000);
	MPI_Datatype vec;
	OK(MPI_Type_vector(3, 1, 2, MPI_INT, &vec));
	OK(MPI_Type_commit(&vec));
	int res[6];
	for (int i = 0; i < 6; i++) res[i] = -7;
	OK(MPI_Win_fence(0, win));
	OK(MPI_Get_accumulate(src, 1, vec, res, 1, back, next, 30, 1, idx, MPI_SUM, win)); /* target 33 34 30 */
	OK(MPI_Win_fence(0, win));
	/* target elements in order 33, 34, 30 get src 0, 2, 4; result back: 5, 2, 0 */
	EXPECT(res[5] == 1033 && res[2] == 1034 && res[0] == 1030 && res[1] == -7 && res[3] == -7 && res[4] == -7,
	       "get_accumulate result %d %d %d %d %d %d", res[0], res[1], res[2], res[3], res[4], res[5]);
	EXPECT(win_buf[33] == 1033 + 100 * prev && win_buf[34] == 1034 + 100 * prev + 2 && win_buf[30] == 1030 + 100 * prev + 4 &&
	           win_buf[31] == 1031 && win_buf[32] == 1032 && win_buf[35] == 1035,
	       "get_accumulate target %d %d %d %d %d %d", win_buf[30], win_buf[31], win_buf[32], win_buf[33], win_buf[34],
	       win_buf[35]);

	/* Negative strides and displacements: blocks below the buffer's
	 * start, several separate runs (none merged with its neighbour). */
	MPI_Datatype down, downs;
	int negd[3] = {0, -2, -4};
	OK(MPI_Type_vector(5, 1, -2, MPI_INT, &down)); /* ints 0, -2, -4, -6, -8 */
	int ones[3] = {1, 1, 1};
	OK(MPI_Type_indexed(3, ones, negd, MPI_INT, &downs)); /* ints 0, -2, -4 */
	OK(MPI_Type_commit(&down));
	OK(MPI_Type_commit(&downs));
	bounds(down, -32, 36, 20, "vector of stride -2");
	bounds(downs, -16, 20, 12, "indexed, negative displacements");
	int nb[12];
	for (int i = 0; i < 12; i++) nb[i] = 1000 * me + i;
	reset(0);
	OK(MPI_Win_fence(0, win));
	OK(MPI_Put(nb + 8, 1, down, next, 50, 5, MPI_INT, win)); /* nb 8, 6, 4, 2, 0 -> 50..54 */
	OK(MPI_Accumulate(nb + 4, 2, downs, next, 40, 6, MPI_INT, MPI_SUM, win)); /* nb 4 2 0, then 9 7 5 */
	OK(MPI_Win_fence(0, win));
	for (int k = 0; k < 5; k++)
		EXPECT(win_buf[50 + k] == 1000 * prev + 8 - 2 * k, "negative stride put: [%d] = %d", 50 + k, win_buf[50 + k]);
	for (int k = 0; k < 6; k++) { /* the second copy starts an extent (5 ints) above the first */
		int src_i = 4 + (k / 3) * 5 - 2 * (k % 3), want = 40 + k + 1000 * prev + src_i;
		EXPECT(win_buf[40 + k] == want, "negative indexed accumulate: [%d] = %d, want %d", 40 + k, win_buf[40 + k], want);
	}
	int gn[12];
	for (int i = 0; i < 12; i++) gn[i] = -1;
	OK(MPI_Get(gn + 8, 1, down, next, 50, 5, MPI_INT, win));
	OK(MPI_Win_fence(0, win));
	for (int k = 0; k < 5; k++) EXPECT(gn[8 - 2 * k] == 1000 * me + 8 - 2 * k, "negative stride get: [%d] = %d", 8 - 2 * k, gn[8 - 2 * k]);
	EXPECT(gn[1] == -1 && gn[3] == -1 && gn[5] == -1 && gn[7] == -1, "negative stride get: gaps written");
	for (int i = 0; i < 12; i++) gn[i] = -1;
	OK(MPI_Sendrecv(nb + 8, 1, down, next, 8, gn + 8, 1, down, prev, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
	for (int k = 0; k < 5; k++) EXPECT(gn[8 - 2 * k] == 1000 * prev + 8 - 2 * k, "negative stride sendrecv: [%d] = %d", 8 - 2 * k, gn[8 - 2 * k]);
	/* Many copies (the origin's span registered once, ahead of the runs):
	 * 6 copies of the negative indexed type from the middle of an array
	 * into 18 contiguous ints, and back. */
	int many[40], mg[40];
	for (int i = 0; i < 40; i++) many[i] = 500 * me + i, mg[i] = -1;
	reset(0);
	OK(MPI_Win_fence(0, win));
	OK(MPI_Put(many + 4, 6, downs, next, 20, 18, MPI_INT, win));
	OK(MPI_Win_fence(0, win));
	for (int k = 0; k < 18; k++) { /* copy c's ints 4+5c, 2+5c, 5c */
		int want = 500 * prev + 4 + 5 * (k / 3) - 2 * (k % 3);
		EXPECT(win_buf[20 + k] == want, "many copies put: [%d] = %d, want %d", 20 + k, win_buf[20 + k], want);
	}
	OK(MPI_Get(mg + 4, 6, downs, next, 20, 18, MPI_INT, win));
	OK(MPI_Win_fence(0, win));
	for (int i = 0; i < 40; i++) {
		int hit = i < 30 && i % 5 % 2 == 0; /* copy c: 5c, 5c + 2, 5c + 4 */
		int want = hit ? 500 * me + i : -1;
		EXPECT(mg[i] == want, "many copies get: [%d] = %d, want %d", i, mg[i], want);
	}
	OK(MPI_Type_free(&down));
	OK(MPI_Type_free(&downs));

	/* MPI_BOTTOM: a type of absolute addresses of two variables. */
	reset(0);
	int x = 7000 + me, y = 8000 + me, gx = -1, gy = -1;
	MPI_Aint ad[2], ad2[2];
	OK(MPI_Get_address(&x, &ad[0]));
	OK(MPI_Get_address(&y, &ad[1]));
	OK(MPI_Get_address(&gx, &ad2[0]));
	OK(MPI_Get_address(&gy, &ad2[1]));
	MPI_Datatype absolute, absolute2;
	OK(MPI_Type_create_hindexed(2, one, ad, MPI_INT, &absolute));
	OK(MPI_Type_create_hindexed(2, one, ad2, MPI_INT, &absolute2));
	OK(MPI_Type_commit(&absolute));
	OK(MPI_Type_commit(&absolute2));
	OK(MPI_Win_fence(0, win));
	OK(MPI_Put(MPI_BOTTOM, 1, absolute, next, 2, 2, MPI_INT, win));
	OK(MPI_Accumulate(MPI_BOTTOM, 1, absolute, next, 4, 2, MPI_INT, MPI_SUM, win));
	OK(MPI_Win_fence(0, win));
	EXPECT(win_buf[2] == 7000 + prev && win_buf[3] == 8000 + prev && win_buf[4] == 4 + 7000 + prev &&
	           win_buf[5] == 5 + 8000 + prev,
	       "MPI_BOTTOM put/accumulate: %d %d %d %d", win_buf[2], win_buf[3], win_buf[4], win_buf[5]);
	OK(MPI_Get(MPI_BOTTOM, 1, absolute2, next, 2, 2, MPI_INT, win));
	OK(MPI_Win_fence(0, win));
	EXPECT(gx == 7000 + me && gy == 8000 + me, "MPI_BOTTOM get: %d %d", gx, gy);
	gx = gy = -1;
	OK(MPI_Sendrecv(MPI_BOTTOM, 1, absolute, next, 5, MPI_BOTTOM, 1, absolute2, prev, 5, MPI_COMM_WORLD,
	                MPI_STATUS_IGNORE));
	EXPECT(gx == 7000 + prev && gy == 8000 + prev, "MPI_BOTTOM sendrecv: %d %d", gx, gy);

	/* A struct moves by messages and puts; it has no single element type
	 * to accumulate. */
	struct pair ps[2] = {{me, me + 0.5}, {-me, -me - 0.25}}, pr[2];
	memset(pr, 0, sizeof pr);
	OK(MPI_Sendrecv(ps, 2, st, next, 6, pr, 2, st, prev, 6, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
	EXPECT(pr[0].i == prev && pr[0].d == prev + 0.5 && pr[1].i == -prev && pr[1].d == -prev - 0.25, "struct sendrecv");
	OK(MPI_Win_fence(0, win));
	EXPECT(MPI_Accumulate(ps, 1, st, next, 0, 1, st, MPI_SUM, win) == MPI_ERR_TYPE, "accumulate of a mixed struct");
	OK(MPI_Win_fence(0, win));

	/* MPI_BYTE: replace, fetch, combine bits, compare and swap. */
	reset(0);
	unsigned char *wb = (unsigned char *)win_buf, bytes[4] = {0x11, 0x22, 0x33, 0x44}, fetched[4] = {0}, old = 0;
	unsigned char mask = 0xf0, cmp = 0, nv = 0x5a;
	OK(MPI_Win_fence(0, win));
	OK(MPI_Accumulate(bytes, 4, MPI_BYTE, next, 1, 4, MPI_BYTE, MPI_REPLACE, win)); /* bytes 4..7 */
	OK(MPI_Win_fence(0, win));
	EXPECT(wb[4] == 0x11 && wb[5] == 0x22 && wb[6] == 0x33 && wb[7] == 0x44, "byte replace %x %x %x %x", wb[4], wb[5], wb[6],
	       wb[7]);
	OK(MPI_Get_accumulate(NULL, 0, MPI_DATATYPE_NULL, fetched, 4, MPI_BYTE, next, 1, 4, MPI_BYTE, MPI_NO_OP, win));
	OK(MPI_Accumulate(&mask, 1, MPI_BYTE, next, 2, 1, MPI_BYTE, MPI_BXOR, win)); /* byte 8: int 2's first byte */
	OK(MPI_Win_fence(0, win));
	EXPECT(fetched[0] == 0x11 && fetched[3] == 0x44, "byte fetch %x %x", fetched[0], fetched[3]);
	unsigned char b8 = ((unsigned char *)&(int){2})[0];
	EXPECT(wb[8] == (b8 ^ 0xf0), "byte bxor %x", wb[8]);
	OK(MPI_Win_fence(MPI_MODE_NOSUCCEED, win));
	OK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, next, 0, win));
	cmp = ((unsigned char *)&(int){12})[0]; /* byte 48: int 12's first byte */
	OK(MPI_Compare_and_swap(&nv, &cmp, &old, MPI_BYTE, next, 12, win));
	OK(MPI_Fetch_and_op(NULL, &fetched[0], MPI_BYTE, next, 12, MPI_NO_OP, win));
	OK(MPI_Win_unlock(next, win));
	EXPECT(old == cmp && fetched[0] == nv, "byte compare and swap: old %x, now %x", old, fetched[0]);

	/* Value-and-index pairs: their bounds, moved with their gaps kept;
	 * MPI_2INT replaced and fetched whole (accops.c has the rest). */
	struct {
		short v;
		int i;
	} si[2] = {{(short)(10 + me), 100 + me}, {(short)(20 + me), 200 + me}}, sr[2];
	bounds(MPI_SHORT_INT, 0, sizeof si[0], sizeof(short) + sizeof(int), "MPI_SHORT_INT");
	bounds(MPI_2INT, 0, 2 * sizeof(int), 2 * sizeof(int), "MPI_2INT");
	bounds(MPI_DOUBLE_INT, 0, sizeof(struct {
		       double v;
		       int i;
	       }),
	       sizeof(double) + sizeof(int), "MPI_DOUBLE_INT");
	memset(sr, 0x7f, sizeof sr);
	OK(MPI_Sendrecv(si, 2, MPI_SHORT_INT, next, 7, sr, 2, MPI_SHORT_INT, prev, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
	EXPECT(sr[0].v == 10 + prev && sr[0].i == 100 + prev && sr[1].v == 20 + prev && sr[1].i == 200 + prev,
	       "MPI_SHORT_INT sendrecv");
	reset(0);
	int pr2[4] = {-1, -1, -1, -1}, mine2[2] = {300 + me, 400 + me};
	OK(MPI_Win_fence(0, win));
	OK(MPI_Accumulate(mine2, 1, MPI_2INT, next, 8, 1, MPI_2INT, MPI_REPLACE, win));
	OK(MPI_Win_fence(0, win));
	OK(MPI_Get_accumulate(NULL, 0, MPI_2INT, pr2, 2, MPI_2INT, next, 8, 2, MPI_2INT, MPI_NO_OP, win));
	OK(MPI_Win_fence(0, win));
	EXPECT(win_buf[8] == 300 + prev && win_buf[9] == 400 + prev && win_buf[10] == 10, "MPI_2INT replace: %d %d %d",
	       win_buf[8], win_buf[9], win_buf[10]);
	EXPECT(pr2[0] == 300 + me && pr2[1] == 400 + me && pr2[2] == 10 && pr2[3] == 11, "MPI_2INT fetch: %d %d %d %d",
	       pr2[0], pr2[1], pr2[2], pr2[3]);
	/* MAXLOC and MINLOC of every rank into rank 0's pairs at ints 12 and
	 * 14 (a tie: the lowest index wins), under fence and under a lock. */
	OK(MPI_Win_fence(0, win));
	if (me == 0) win_buf[12] = -1, win_buf[13] = 99, win_buf[14] = 0, win_buf[15] = 99;
	OK(MPI_Win_fence(0, win));
	int mx[2] = {me, me}, mn[2] = {0, me};
	OK(MPI_Accumulate(mx, 1, MPI_2INT, 0, 12, 1, MPI_2INT, MPI_MAXLOC, win));
	OK(MPI_Win_fence(0, win));
	OK(MPI_Win_fence(MPI_MODE_NOSUCCEED, win));
	OK(MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win));
	OK(MPI_Accumulate(mn, 1, MPI_2INT, 0, 14, 1, MPI_2INT, MPI_MINLOC, win));
	OK(MPI_Win_unlock(0, win));
	OK(MPI_Barrier(MPI_COMM_WORLD));
	if (me == 0)
		EXPECT(win_buf[12] == np - 1 && win_buf[13] == np - 1 && win_buf[14] == 0 && win_buf[15] == 0,
		       "MAXLOC (%d, %d), MINLOC (%d, %d)", win_buf[12], win_buf[13], win_buf[14], win_buf[15]);
	OK(MPI_Win_fence(MPI_MODE_NOPRECEDE, win));
	OK(MPI_Win_fence(0, win));

	/* Accumulates of no data are no-ops, whatever their datatypes. */
	MPI_Datatype empty;
	OK(MPI_Type_contiguous(0, MPI_INT, &empty));
	OK(MPI_Type_commit(&empty));
	OK(MPI_Win_fence(MPI_MODE_NOPRECEDE, win));
	OK(MPI_Accumulate(src, 0, MPI_INT, next, 0, 0, MPI_DOUBLE, MPI_SUM, win));
	OK(MPI_Accumulate(NULL, 1, empty, next, 0, 0, MPI_DOUBLE, MPI_SUM, win));
	OK(MPI_Get_accumulate(NULL, 0, MPI_INT, NULL, 0, MPI_DOUBLE, next, 0, 1, empty, MPI_SUM, win));
	OK(MPI_Win_fence(0, win));

	for (int i = 0; i < 7; i++) OK(MPI_Type_free(all[i]));
	OK(MPI_Type_free(&vec));
	OK(MPI_Type_free(&absolute));
	OK(MPI_Type_free(&absolute2));
	OK(MPI_Type_free(&empty));
	OK(MPI_Win_free(&win));
	OK(MPI_Free_mem(win_buf));
	if (me == 0) printf("dtypes: ok on %d ranks\n", np);
	OK(MPI_Finalize());
	return 0;
}
