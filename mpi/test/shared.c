/* MPI_Win_allocate_shared and MPI_Win_shared_query: each rank stores into
 * its part with plain stores, and after a fence reads every rank's part
 * through the query (the parts contiguous in rank order, each with its
 * disp_unit; MPI_PROC_NULL the block's start); a rank stores into its
 * neighbour's part (a fence, then a passive epoch with MPI_Win_sync and a
 * barrier, as shared-memory codes do) and puts into it, values checked by
 * the owner; the query on an MPI_Win_allocate window; and where the ranks
 * do not share memory (udp), MPI_ERR_RMA_SHARED on every rank. argv[1] is
 * the provider every other rank is reached over. MPI_Comm_split_type
 * gives the window's communicator. Prints "shared: ok on N
 * ranks". */
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
	int shm = argc < 2 || strcmp(argv[1], "shm") == 0;
	int next = (me + 1) % np, prev = (me + np - 1) % np;
	MPI_Win win = MPI_WIN_NULL;
	int *mine = NULL;
	MPI_Aint size;
	int unit;

	/* The node's communicator, as shared-memory codes get it: every rank
	 * over shm; refused elsewhere, and for what would drop or reorder
	 * ranks. */
	MPI_Comm node = MPI_COMM_WORLD;
	if (shm) {
		int n = -1, r = -1;
		OK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &node));
		OK(MPI_Comm_size(node, &n));
		OK(MPI_Comm_rank(node, &r));
		EXPECT(node != MPI_COMM_WORLD && node != MPI_COMM_NULL && n == np && r == me, "node: %d of %d", r, n);
	} else {
		MPI_Comm none = MPI_COMM_WORLD;
		CLASS(MPI_ERR_UNSUPPORTED_OPERATION,
		      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &none));
		EXPECT(none == MPI_COMM_NULL, "a communicator after the failure");
	}
	MPI_Comm undef = MPI_COMM_WORLD;
	OK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_UNDEFINED, 0, MPI_INFO_NULL, &undef));
	EXPECT(undef == MPI_COMM_NULL, "MPI_UNDEFINED: %d", (int)undef);
	if (np > 1)
		CLASS(MPI_ERR_UNSUPPORTED_OPERATION,
		      MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, -me, MPI_INFO_NULL, &undef));

	/* rank r's part: r+1 ints */
	if (!shm) {
		CLASS(MPI_ERR_RMA_SHARED,
		      MPI_Win_allocate_shared((me + 1) * (MPI_Aint)sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD,
		                              &mine, &win));
		EXPECT(win == MPI_WIN_NULL, "a window after the failure");
	} else {
		OK(MPI_Win_allocate_shared((me + 1) * (MPI_Aint)sizeof(int), sizeof(int), MPI_INFO_NULL, node, &mine,
		                           &win));
		OK(MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN));
		int *flavor, flag;
		OK(MPI_Win_get_attr(win, MPI_WIN_CREATE_FLAVOR, &flavor, &flag));
		EXPECT(flag && *flavor == MPI_WIN_FLAVOR_SHARED, "flavor %d", *flavor);
		for (int i = 0; i <= me; i++) {
			EXPECT(mine[i] == 0, "not zeroed: %d", mine[i]);
			mine[i] = me * 100 + i;
		}
		OK(MPI_Win_fence(0, win));
		int *base0 = NULL, *any = NULL;
		OK(MPI_Win_shared_query(win, 0, &size, &unit, &base0));
		EXPECT(size == sizeof(int) && unit == sizeof(int) && base0, "rank 0: %ld bytes, unit %d", (long)size, unit);
		OK(MPI_Win_shared_query(win, MPI_PROC_NULL, &size, &unit, &any));
		EXPECT(any == base0 && size == sizeof(int), "MPI_PROC_NULL: %p, %ld bytes", (void *)any, (long)size);
		for (int r = 0, off = 0; r < np; off += r + 1, r++) {
			int *p = NULL;
			OK(MPI_Win_shared_query(win, r, &size, &unit, &p));
			EXPECT(size == (MPI_Aint)sizeof(int) * (r + 1) && p == base0 + off && unit == sizeof(int),
			       "rank %d: %ld bytes at int %td, want %d", r, (long)size, p - base0, off);
			for (int i = 0; i <= r; i++) EXPECT(p[i] == r * 100 + i, "rank %d int %d: %d", r, i, p[i]);
		}
		/* past its own part, a rank reads the next rank's (contiguous) */
		if (me + 1 < np) EXPECT(mine[me + 1] == (me + 1) * 100, "past the part: %d", mine[me + 1]);
		OK(MPI_Win_fence(0, win)); /* every rank has read */

		int *theirs = NULL;
		OK(MPI_Win_shared_query(win, next, &size, &unit, &theirs));
		theirs[0] = -1000 - me;
		OK(MPI_Win_fence(0, win));
		EXPECT(mine[0] == -1000 - prev, "stored by %d under fence: %d", prev, mine[0]);
		OK(MPI_Barrier(MPI_COMM_WORLD)); /* every rank has checked */

		OK(MPI_Win_lock_all(MPI_MODE_NOCHECK, win));
		theirs[0] = -3000 - me;
		OK(MPI_Win_sync(win));
		OK(MPI_Barrier(MPI_COMM_WORLD));
		OK(MPI_Win_sync(win));
		EXPECT(mine[0] == -3000 - prev, "stored by %d in a passive epoch: %d", prev, mine[0]);
		OK(MPI_Win_unlock_all(win));
		OK(MPI_Barrier(MPI_COMM_WORLD));

		int v = -2000 - me;
		OK(MPI_Win_fence(0, win));
		if (next != 0) OK(MPI_Put(&v, 1, MPI_INT, next, 1, 1, MPI_INT, win)); /* rank 0 has one int */
		OK(MPI_Win_fence(0, win));
		if (me != 0) EXPECT(mine[1] == -2000 - prev, "put by %d: %d", prev, mine[1]);

		CLASS(MPI_ERR_RANK, MPI_Win_shared_query(win, np, &size, &unit, &theirs));
		CLASS(MPI_ERR_ARG, MPI_Win_shared_query(win, 0, NULL, &unit, &theirs));
		OK(MPI_Win_free(&win));

		/* Odd ranks' parts are empty: size 0 and no address (MPICH's
		 * answer, which its tests assert), the others' contiguous. */
		OK(MPI_Win_allocate_shared(me % 2 ? 0 : 4 * sizeof(int), sizeof(int), MPI_INFO_NULL, node, &mine, &win));
		for (int r = 0; r < np; r++) {
			int *p = (int *)&size;
			OK(MPI_Win_shared_query(win, r, &size, &unit, &p));
			if (r % 2)
				EXPECT(size == 0 && p == NULL, "rank %d's empty part: %ld bytes at %p", r, (long)size, (void *)p);
			else
				EXPECT(size == 4 * sizeof(int) && p, "rank %d's part: %ld bytes at %p", r, (long)size, (void *)p);
		}
		OK(MPI_Win_free(&win));
	}

	/* MPI_Win_allocate's window: a peer's part where it is mapped here,
	 * else size 0 and NULL (MPI-4). */
	int *base = NULL, *p = NULL;
	OK(MPI_Win_allocate(16 * sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win));
	base[0] = 7000 + me;
	OK(MPI_Win_fence(0, win));
	OK(MPI_Win_shared_query(win, me, &size, &unit, &p));
	EXPECT(p == base && size == 16 * sizeof(int) && unit == sizeof(int), "own part: %p %ld", (void *)p, (long)size);
	OK(MPI_Win_shared_query(win, next, &size, &unit, &p));
	if (shm)
		EXPECT(p && size == 16 * sizeof(int) && p[0] == 7000 + next, "rank %d's part: %ld bytes", next, (long)size);
	else
		EXPECT(!p && size == 0, "rank %d's part over udp: %p, %ld bytes", next, (void *)p, (long)size);
	OK(MPI_Win_fence(0, win));
	OK(MPI_Win_free(&win));

	if (node != MPI_COMM_WORLD) OK(MPI_Comm_free(&node));
	OK(MPI_Barrier(MPI_COMM_WORLD));
	if (me == 0) printf("shared: ok on %d ranks\n", np);
	OK(MPI_Finalize());
	return 0;
}
