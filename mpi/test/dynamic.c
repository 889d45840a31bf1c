/* Dynamic windows: each rank attaches memory after MPI_Win_create_dynamic,
 * the ranks exchange its address (MPI_Get_address, MPI_Aint_add), and
 * each puts (a vector too), gets, accumulates, fetch-and-ops and
 * compare-and-swaps into its neighbour's at those addresses under fence,
 * lock and lock_all epochs, values checked by the owners; attaches that
 * overlap, detaches of nothing, accesses past attached memory and
 * attaches to other windows fail with their classes; after a detach and
 * a new attach the neighbour reaches the new memory. Prints "dynamic: ok
 * on N ranks". */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define CLASS(want, call)                                                            \
	do {                                                                         \
		int cls_ = -1;                                                       \
		MPI_Error_class((call), &cls_);                                      \
		EXPECT(cls_ == (want), "%s: class %d, want %s", #call, cls_, #want); \
	} while (0)

int main(int argc, char **argv) {
	int np = start(&argc, &argv);
	int next = (me + 1) % np, prev = (me + np - 1) % np;
	MPI_Win win;
	OK(MPI_Win_create_dynamic(MPI_INFO_NULL, MPI_COMM_WORLD, &win));
	OK(MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN));
	int *flavor, flag;
	OK(MPI_Win_get_attr(win, MPI_WIN_CREATE_FLAVOR, &flavor, &flag));
	EXPECT(flag && *flavor == MPI_WIN_FLAVOR_DYNAMIC, "flavor %d", *flavor);

	int64_t *a = calloc(16, sizeof *a), *b = malloc(16 * sizeof *b);
	for (int i = 0; i < 16; i++) b[i] = me * 100 + i;
	OK(MPI_Win_attach(win, a, 16 * sizeof *a));
	OK(MPI_Win_attach(win, b, 16 * sizeof *b));
	CLASS(MPI_ERR_RMA_ATTACH, MPI_Win_attach(win, a + 4, 8));
	MPI_Aint mine[2], *all = malloc(2 * sizeof(MPI_Aint) * (size_t)np);
	OK(MPI_Get_address(a, &mine[0]));
	OK(MPI_Get_address(b, &mine[1]));
	EXPECT(MPI_Aint_diff(mine[0], MPI_Aint_add(mine[0], 24)) == -24, "MPI_Aint arithmetic");
	OK(MPI_Allgather(mine, 2 * (int)sizeof(MPI_Aint), MPI_BYTE, all, 2 * (int)sizeof(MPI_Aint), MPI_BYTE,
	                 MPI_COMM_WORLD));
	MPI_Aint na = all[2 * next], pb = all[2 * prev + 1];

	/* fence: a put, a get, a vector put */
	int64_t v = 4200 + me, got[3] = {0}, pair[2] = {-1, -2};
	MPI_Datatype every_other;
	OK(MPI_Type_vector(2, 1, 2, MPI_INT64_T, &every_other));
	OK(MPI_Type_commit(&every_other));
	OK(MPI_Win_fence(0, win));
	OK(MPI_Put(&v, 1, MPI_INT64_T, next, na, 1, MPI_INT64_T, win));
	OK(MPI_Get(got, 3, MPI_INT64_T, prev, MPI_Aint_add(pb, 8 * 5), 3, MPI_INT64_T, win));
	OK(MPI_Put(pair, 2, MPI_INT64_T, next, MPI_Aint_add(na, 8 * 10), 1, every_other, win));
	CLASS(MPI_ERR_RMA_RANGE, MPI_Put(&v, 1, MPI_INT64_T, next, MPI_Aint_add(all[2 * next + 1], 8 * 16), 1,
	                                  MPI_INT64_T, win));
	OK(MPI_Win_fence(0, win));
	EXPECT(a[0] == 4200 + prev, "put: %lld", (long long)a[0]);
	EXPECT(a[10] == -1 && a[11] == 0 && a[12] == -2, "vector put: %lld %lld %lld", (long long)a[10],
	       (long long)a[11], (long long)a[12]);
	for (int i = 0; i < 3; i++) EXPECT(got[i] == prev * 100 + 5 + i, "get[%d]: %lld", i, (long long)got[i]);

	/* lock_all: every rank adds to rank 0's a[1], fetch-and-ops a[2],
	 * and one compare-and-swap wins a[3] */
	int64_t one = 1, old = -1, cmp = 0, swp = me + 1, res = -1;
	MPI_Aint a0 = all[0];
	OK(MPI_Win_lock_all(0, win));
	OK(MPI_Accumulate(&one, 1, MPI_INT64_T, 0, MPI_Aint_add(a0, 8), 1, MPI_INT64_T, MPI_SUM, win));
	OK(MPI_Fetch_and_op(&one, &old, MPI_INT64_T, 0, MPI_Aint_add(a0, 16), MPI_SUM, win));
	OK(MPI_Compare_and_swap(&swp, &cmp, &res, MPI_INT64_T, 0, MPI_Aint_add(a0, 24), win));
	OK(MPI_Win_unlock_all(win));
	EXPECT(old >= 0 && old < np && (res == 0 || (res >= 1 && res <= np)), "fetched %lld, swapped out %lld",
	       (long long)old, (long long)res);
	OK(MPI_Barrier(MPI_COMM_WORLD));
	if (me == 0)
		EXPECT(a[1] == np && a[2] == np && a[3] >= 1 && a[3] <= np, "counters %lld %lld, swapped in %lld",
		       (long long)a[1], (long long)a[2], (long long)a[3]);

	/* lock: a get_accumulate of the neighbour's b */
	int64_t add[2] = {1000, 2000}, prevv[2] = {0, 0};
	OK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, next, 0, win));
	OK(MPI_Get_accumulate(add, 2, MPI_INT64_T, prevv, 2, MPI_INT64_T, next, all[2 * next + 1], 2, MPI_INT64_T,
	                      MPI_SUM, win));
	OK(MPI_Win_unlock(next, win));
	EXPECT(prevv[0] == next * 100 && prevv[1] == next * 100 + 1, "get_accumulate: %lld %lld", (long long)prevv[0],
	       (long long)prevv[1]);
	OK(MPI_Barrier(MPI_COMM_WORLD));
	EXPECT(b[0] == me * 100 + 1000 && b[1] == me * 100 + 1 + 2000, "accumulated: %lld %lld", (long long)b[0],
	       (long long)b[1]);

	/* detach b, attach c: reached at its address, b's refused */
	OK(MPI_Win_detach(win, b));
	CLASS(MPI_ERR_RMA_ATTACH, MPI_Win_detach(win, b));
	int64_t *c = calloc(4, sizeof *c);
	MPI_Aint ca, *cs = malloc(sizeof(MPI_Aint) * (size_t)np);
	OK(MPI_Win_attach(win, c, 4 * sizeof *c));
	OK(MPI_Get_address(c, &ca));
	OK(MPI_Allgather(&ca, (int)sizeof ca, MPI_BYTE, cs, (int)sizeof ca, MPI_BYTE, MPI_COMM_WORLD));
	OK(MPI_Win_fence(0, win));
	v = 5000 + me;
	OK(MPI_Put(&v, 1, MPI_INT64_T, next, MPI_Aint_add(cs[next], 8), 1, MPI_INT64_T, win));
	CLASS(MPI_ERR_RMA_RANGE, MPI_Get(got, 1, MPI_INT64_T, prev, pb, 1, MPI_INT64_T, win));
	OK(MPI_Win_fence(0, win));
	EXPECT(c[1] == 5000 + prev, "put into new memory: %lld", (long long)c[1]);

	OK(MPI_Type_free(&every_other));
	OK(MPI_Win_free(&win));
	free(a), free(b), free(c), free(all), free(cs);
	OK(MPI_Barrier(MPI_COMM_WORLD));
	if (me == 0) printf("dynamic: ok on %d ranks\n", np);
	OK(MPI_Finalize());
	return 0;
}
