/* Many operations in one epoch, more than a queue holds, on windows over
 * the program's memory (MPI_Win_create: reached through the NIC, not
 * mapped), values checked:
 *  - every rank accumulates into its two neighbours 8192 times per fence
 *    epoch, both ways at once (answering each other's active messages);
 *  - rank 0 gets rank 1's 300x300 matrix transposed, one strided get per
 *    column (300 blocks of 4 bytes each): 90000 READs before a fence.
 * Prints "manyops: ok on N ranks". */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"

enum { NACC = 5000, N = 300 };

int main(int argc, char **argv) {
	int np = start(&argc, &argv);
	int right = (me + 1) % np, left = (me + np - 1) % np;

	int32_t *cnt = calloc(NACC, sizeof(int32_t));
	MPI_Win win;
	OK(MPI_Win_create(cnt, NACC * sizeof(int32_t), sizeof(int32_t), MPI_INFO_NULL, MPI_COMM_WORLD, &win));
	int32_t one = 1;
	for (int round = 0; round < 2; round++) {
		OK(MPI_Win_fence(0, win));
		for (int i = 0; i < NACC; i++) {
			OK(MPI_Accumulate(&one, 1, MPI_INT32_T, right, i, 1, MPI_INT32_T, MPI_SUM, win));
			OK(MPI_Accumulate(&one, 1, MPI_INT32_T, left, i, 1, MPI_INT32_T, MPI_SUM, win));
		}
		OK(MPI_Win_fence(0, win));
	}
	int32_t want = 4; /* two rounds, one from each neighbour (on 2 ranks both are the other rank) */
	for (int i = 0; i < NACC; i++) EXPECT(cnt[i] == want, "element %d: %d, want %d", i, cnt[i], want);
	OK(MPI_Win_free(&win));
	free(cnt);

	int *a = malloc(sizeof(int) * N * N);
	for (int i = 0; i < N * N; i++) a[i] = me == 1 ? i : -1;
	OK(MPI_Win_create(me == 1 ? a : NULL, me == 1 ? sizeof(int) * N * N : 0, sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &win));
	OK(MPI_Win_fence(0, win));
	if (me == 0) {
		MPI_Datatype col;
		OK(MPI_Type_vector(N, 1, N, MPI_INT, &col));
		OK(MPI_Type_commit(&col));
		for (int j = 0; j < N; j++) OK(MPI_Get(a + j * N, N, MPI_INT, 1, j, 1, col, win));
		OK(MPI_Type_free(&col));
	}
	OK(MPI_Win_fence(0, win));
	if (me == 0)
		for (int j = 0; j < N; j++)
			for (int i = 0; i < N; i++) EXPECT(a[j * N + i] == i * N + j, "a[%d][%d] = %d", j, i, a[j * N + i]);
	OK(MPI_Win_free(&win));
	free(a);

	OK(MPI_Barrier(MPI_COMM_WORLD));
	if (me == 0) printf("manyops: ok on %d ranks\n", np);
	OK(MPI_Finalize());
	return 0;
}
