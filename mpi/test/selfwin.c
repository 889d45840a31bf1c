/* Windows over MPI_COMM_SELF in a world of several ranks: each rank's own,
 * made and freed when that rank alone decides (rank 0 makes one more, and
 * before any window of the world exists), with values checked: put and
 * get under fence, lock, lock_all and post/start/complete/wait;
 * accumulates, including emulated ones (long double, MAXLOC); fetch-and-op
 * and compare-and-swap; a shared window and its query; the window's
 * group; a rank outside it. Then a window of the world still works.
 * Prints "selfwin: ok on N ranks". */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

struct di {
	double v;
	int i;
};

static void exercise(MPI_Win w, int *mem) {
	int v[4] = {1, 2, 3, 4}, got[4] = {0};
	OK(MPI_Win_fence(0, w));
	OK(MPI_Put(v, 4, MPI_INT, 0, 0, 4, MPI_INT, w));
	OK(MPI_Win_fence(0, w));
	OK(MPI_Get(got, 4, MPI_INT, 0, 0, 4, MPI_INT, w));
	OK(MPI_Win_fence(0, w));
	EXPECT(memcmp(got, v, sizeof v) == 0 && mem[3] == 4, "fence: got %d %d %d %d", got[0], got[1], got[2], got[3]);

	OK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, w));
	int add = 10, old = -1, cmp = 12, swap = 99;
	OK(MPI_Accumulate(&add, 1, MPI_INT, 0, 1, 1, MPI_INT, MPI_SUM, w));
	OK(MPI_Win_flush(0, w));
	OK(MPI_Fetch_and_op(&add, &old, MPI_INT, 0, 1, MPI_SUM, w));
	OK(MPI_Win_flush(0, w));
	EXPECT(old == 12, "fetch_and_op fetched %d", old);
	OK(MPI_Compare_and_swap(&swap, &cmp, &old, MPI_INT, 0, 2, w)); /* 3 != 12: no swap */
	OK(MPI_Win_unlock(0, w));
	EXPECT(old == 3 && mem[1] == 22 && mem[2] == 3, "atomics: old %d, mem %d %d", old, mem[1], mem[2]);

	MPI_Group g;
	OK(MPI_Win_get_group(w, &g));
	int n = -1;
	OK(MPI_Group_size(g, &n));
	EXPECT(n == 1, "the window's group has %d ranks", n);
	OK(MPI_Win_post(g, 0, w));
	OK(MPI_Win_start(g, 0, w));
	OK(MPI_Put(&swap, 1, MPI_INT, 0, 0, 1, MPI_INT, w));
	OK(MPI_Win_complete(w));
	OK(MPI_Win_wait(w));
	OK(MPI_Group_free(&g));
	EXPECT(mem[0] == 99, "pscw put: %d", mem[0]);

	OK(MPI_Win_lock_all(0, w));
	EXPECT(MPI_Put(v, 1, MPI_INT, 1, 0, 1, MPI_INT, w) == MPI_ERR_RANK, "rank 1 of a window over MPI_COMM_SELF");
	OK(MPI_Win_unlock_all(w));
}

int main(int argc, char **argv) {
	int np = start(&argc, &argv);

	/* Rank 0 alone, before any window of the world: a window over its
	 * own memory with an emulated accumulate (its mutex is its own). */
	if (me == 0) {
		long double ld[2] = {1, 0}, one = 1;
		MPI_Win w;
		OK(MPI_Win_create(ld, sizeof ld, 1, MPI_INFO_NULL, MPI_COMM_SELF, &w));
		OK(MPI_Win_set_errhandler(w, MPI_ERRORS_RETURN));
		OK(MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, w));
		for (int k = 0; k < 5; k++)
			OK(MPI_Accumulate(&one, 1, MPI_LONG_DOUBLE, 0, 0, 1, MPI_LONG_DOUBLE, MPI_SUM, w));
		OK(MPI_Win_unlock(0, w));
		OK(MPI_Win_free(&w));
		EXPECT(ld[0] == 6, "long double sum %Lg", ld[0]);
	}
	OK(MPI_Barrier(MPI_COMM_WORLD));

	/* Every rank: allocated and created windows over MPI_COMM_SELF. */
	int *mem;
	MPI_Win wa, wc;
	OK(MPI_Win_allocate(16 * sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_SELF, &mem, &wa));
	OK(MPI_Win_set_errhandler(wa, MPI_ERRORS_RETURN));
	memset(mem, 0, 16 * sizeof(int));
	exercise(wa, mem);
	int buf[16] = {0};
	OK(MPI_Win_create(buf, sizeof buf, sizeof(int), MPI_INFO_NULL, MPI_COMM_SELF, &wc));
	OK(MPI_Win_set_errhandler(wc, MPI_ERRORS_RETURN));
	exercise(wc, buf);
	/* MAXLOC of pairs with a gap: the emulated path, under the self mutex. */
	struct di pr[2] = {{1.5, 7}, {-1, 3}}, in[2] = {{1.5, 2}, {-2, 1}};
	MPI_Win wp;
	OK(MPI_Win_create(pr, sizeof pr, sizeof pr[0], MPI_INFO_NULL, MPI_COMM_SELF, &wp));
	OK(MPI_Win_fence(0, wp));
	OK(MPI_Accumulate(in, 2, MPI_DOUBLE_INT, 0, 0, 2, MPI_DOUBLE_INT, MPI_MAXLOC, wp));
	OK(MPI_Win_fence(0, wp));
	EXPECT(pr[0].v == 1.5 && pr[0].i == 2 && pr[1].v == -1 && pr[1].i == 3, "MAXLOC (%g, %d) (%g, %d)", pr[0].v,
	       pr[0].i, pr[1].v, pr[1].i);
	OK(MPI_Win_free(&wp));

	/* A shared window over MPI_COMM_SELF: its rank 0 is this process. */
	int *sh = NULL, *q = NULL, du = 0;
	MPI_Aint sz = 0;
	MPI_Win ws;
	OK(MPI_Win_allocate_shared(8 * sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_SELF, &sh, &ws));
	OK(MPI_Win_shared_query(ws, 0, &sz, &du, &q));
	EXPECT(q == sh && sz == 8 * sizeof(int) && du == sizeof(int), "shared query: %p %p %ld %d", (void *)q, (void *)sh,
	       (long)sz, du);
	OK(MPI_Win_shared_query(ws, MPI_PROC_NULL, &sz, &du, &q));
	EXPECT(q == sh, "shared query of MPI_PROC_NULL");
	OK(MPI_Win_free(&ws));

	/* Freed in a different order on different ranks: nothing collective. */
	if (me % 2) {
		OK(MPI_Win_free(&wa));
		OK(MPI_Win_free(&wc));
	} else {
		OK(MPI_Win_free(&wc));
		OK(MPI_Win_free(&wa));
	}

	/* The world's windows, and its emulated accumulates, still work. */
	long double *ld;
	MPI_Win ww;
	OK(MPI_Win_allocate(sizeof(long double), 1, MPI_INFO_NULL, MPI_COMM_WORLD, &ld, &ww));
	*ld = 0;
	OK(MPI_Win_fence(0, ww));
	long double one = 1;
	OK(MPI_Accumulate(&one, 1, MPI_LONG_DOUBLE, 0, 0, 1, MPI_LONG_DOUBLE, MPI_SUM, ww));
	OK(MPI_Win_fence(0, ww));
	if (me == 0) EXPECT(*ld == np, "world long double sum %Lg", *ld);
	OK(MPI_Win_free(&ww));

	OK(MPI_Finalize());
	if (me == 0) printf("selfwin: ok on %d ranks\n", np);
	return 0;
}
