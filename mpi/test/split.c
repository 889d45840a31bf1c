/* MPI_Comm_split: the splits this library has (every rank one colour,
 * keys in rank order: a communicator of every rank; every rank
 * MPI_UNDEFINED: MPI_COMM_NULL), the ones it has not
 * (MPI_ERR_UNSUPPORTED_OPERATION on every rank, never a wrong
 * communicator), and MPI_Alloc_mem. Prints "split: ok on N ranks". */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>

#include "check.h"

int main(int argc, char **argv) {
	int np = start(&argc, &argv);
	MPI_Comm c = MPI_COMM_NULL;
	int r = -1, n = -1, cmp = -1;
	OK(MPI_Comm_split(MPI_COMM_WORLD, 3, me, &c));
	OK(MPI_Comm_rank(c, &r));
	OK(MPI_Comm_size(c, &n));
	OK(MPI_Comm_compare(c, MPI_COMM_WORLD, &cmp));
	EXPECT(r == me && n == np && cmp == MPI_CONGRUENT, "split of one colour: rank %d size %d compare %d", r, n, cmp);
	/* its messages are its own */
	int v = -1, w = -1;
	OK(MPI_Sendrecv(&me, 1, MPI_INT, (me + 1) % np, 0, &v, 1, MPI_INT, (me + np - 1) % np, 0, c, MPI_STATUS_IGNORE));
	OK(MPI_Allreduce(&me, &w, 1, MPI_INT, MPI_SUM, c));
	EXPECT(v == (me + np - 1) % np && w == np * (np - 1) / 2, "messages on the split: %d %d", v, w);
	OK(MPI_Comm_free(&c));
	/* equal keys keep rank order */
	OK(MPI_Comm_split(MPI_COMM_WORLD, 0, 0, &c));
	OK(MPI_Comm_rank(c, &r));
	EXPECT(r == me, "equal keys: rank %d", r);
	OK(MPI_Comm_free(&c));
	c = 12345;
	OK(MPI_Comm_split(MPI_COMM_WORLD, MPI_UNDEFINED, me, &c));
	EXPECT(c == MPI_COMM_NULL, "every rank MPI_UNDEFINED: %d", c);
	if (np > 1) {
		c = 12345;
		EXPECT(MPI_Comm_split(MPI_COMM_WORLD, me < 1, me, &c) == MPI_ERR_UNSUPPORTED_OPERATION && c == MPI_COMM_NULL,
		       "two colours");
		c = 12345;
		EXPECT(MPI_Comm_split(MPI_COMM_WORLD, me < 1 ? 0 : MPI_UNDEFINED, me, &c) == MPI_ERR_UNSUPPORTED_OPERATION &&
		           c == MPI_COMM_NULL,
		       "some MPI_UNDEFINED");
		c = 12345;
		EXPECT(MPI_Comm_split(MPI_COMM_WORLD, 0, -me, &c) == MPI_ERR_UNSUPPORTED_OPERATION && c == MPI_COMM_NULL,
		       "reversed keys");
	}
	if (np == 1) {
		/* Alone, MPI_COMM_SELF is a communicator like the world. */
		int b[4] = {0, 0, 0, 0}, x = 42, y = -1;
		MPI_Win w;
		OK(MPI_Win_create(b, sizeof b, sizeof(int), MPI_INFO_NULL, MPI_COMM_SELF, &w));
		OK(MPI_Win_fence(0, w));
		OK(MPI_Put(&x, 1, MPI_INT, 0, 2, 1, MPI_INT, w));
		OK(MPI_Win_fence(0, w));
		OK(MPI_Get(&y, 1, MPI_INT, 0, 2, 1, MPI_INT, w));
		OK(MPI_Win_fence(0, w));
		EXPECT(b[2] == 42 && y == 42, "window over MPI_COMM_SELF: %d %d", b[2], y);
		OK(MPI_Win_free(&w));
		OK(MPI_Barrier(MPI_COMM_SELF));
		OK(MPI_Comm_dup(MPI_COMM_SELF, &c));
		OK(MPI_Comm_free(&c));
	}
	/* MPI_Alloc_mem: aligned, usable, freed */
	double *p = NULL;
	OK(MPI_Alloc_mem(1000 * sizeof(double), MPI_INFO_NULL, &p));
	EXPECT(p && (uintptr_t)p % 16 == 0, "MPI_Alloc_mem %p", (void *)p);
	for (int i = 0; i < 1000; i++) p[i] = i;
	EXPECT(p[999] == 999, "memory");
	OK(MPI_Free_mem(p));
	OK(MPI_Barrier(MPI_COMM_WORLD));
	if (me == 0) printf("split: ok on %d ranks\n", np);
	OK(MPI_Finalize());
	return 0;
}
