/* Subarray datatypes and Cartesian grids: faces of a 3-D array (the
 * z-face is one double per row, 2-D strided, which no single rvma layout
 * describes) put, got and rput into a neighbour's ghost planes, values
 * checked element by element; MPI_Cart_* on the world's grid. Prints
 * "subarray: ok on N ranks". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

#include "check.h"

enum { NX = 5, NY = 7, NZ = 6 }; /* interior; the array has a ghost layer on every face */
#define AX (NX + 2)
#define AY (NY + 2)
#define AZ (NZ + 2)
#define IDX(i, j, k) (((long)(i) * AY + (j)) * AZ + (k))

static double val(int rank, long idx) { return rank * 100000.0 + (double)idx; }

int main(int argc, char **argv) {
	int np = start(&argc, &argv);

	/* A periodic 1-D grid of every rank, then a 3-D one. */
	MPI_Comm ring, grid;
	int dims1[1] = {np}, per1[1] = {1}, src, dst, c[3];
	OK(MPI_Cart_create(MPI_COMM_WORLD, 1, dims1, per1, 0, &ring));
	OK(MPI_Cart_shift(ring, 0, 1, &src, &dst));
	EXPECT(src == (me + np - 1) % np && dst == (me + 1) % np, "ring shift %d %d", src, dst);
	int dims[3] = {0, 0, 0}, per[3] = {0, 0, 0}, nd = -1, r = -1;
	OK(MPI_Dims_create(np, 3, dims));
	OK(MPI_Cart_create(MPI_COMM_WORLD, 3, dims, per, 0, &grid));
	OK(MPI_Cartdim_get(grid, &nd));
	OK(MPI_Cart_coords(grid, me, 3, c));
	OK(MPI_Cart_rank(grid, c, &r));
	EXPECT(nd == 3 && r == me && dims[0] * dims[1] * dims[2] == np, "grid %dx%dx%d, rank %d", dims[0], dims[1], dims[2], r);
	EXPECT(c[2] == me % dims[2] && c[0] == me / (dims[1] * dims[2]), "coords %d %d %d", c[0], c[1], c[2]);
	OK(MPI_Cart_shift(grid, 0, 1, &src, &dst));
	EXPECT(src == (c[0] > 0 ? me - dims[1] * dims[2] : MPI_PROC_NULL) &&
	           dst == (c[0] < dims[0] - 1 ? me + dims[1] * dims[2] : MPI_PROC_NULL),
	       "x shift %d %d", src, dst);
	int topo = -1;
	OK(MPI_Topo_test(grid, &topo));
	EXPECT(topo == MPI_CART, "topology %d", topo);
	OK(MPI_Topo_test(MPI_COMM_WORLD, &topo));
	EXPECT(topo == MPI_UNDEFINED, "world's topology %d", topo);

	/* Faces: my interior plane k = 1 (z low) and x low, into next's ghost
	 * planes k = 0 and i = 0; then the y-face back with MPI_Get. */
	int sizes[3] = {AX, AY, AZ}, zsub[3] = {NX, NY, 1}, zin[3] = {1, 1, 1}, zgh[3] = {1, 1, 0};
	int xsub[3] = {1, NY, NZ}, xin[3] = {1, 1, 1}, xgh[3] = {0, 1, 1};
	int ysub[3] = {NX, 1, NZ}, yin[3] = {1, NY, 1}, ygh[3] = {1, NY + 1, 1};
	MPI_Datatype zf, zg, xf, xg, yf, yg;
	OK(MPI_Type_create_subarray(3, sizes, zsub, zin, MPI_ORDER_C, MPI_DOUBLE, &zf));
	OK(MPI_Type_create_subarray(3, sizes, zsub, zgh, MPI_ORDER_C, MPI_DOUBLE, &zg));
	OK(MPI_Type_create_subarray(3, sizes, xsub, xin, MPI_ORDER_C, MPI_DOUBLE, &xf));
	OK(MPI_Type_create_subarray(3, sizes, xsub, xgh, MPI_ORDER_C, MPI_DOUBLE, &xg));
	OK(MPI_Type_create_subarray(3, sizes, ysub, yin, MPI_ORDER_C, MPI_DOUBLE, &yf));
	OK(MPI_Type_create_subarray(3, sizes, ysub, ygh, MPI_ORDER_C, MPI_DOUBLE, &yg));
	MPI_Datatype *all[] = {&zf, &zg, &xf, &xg, &yf, &yg};
	for (int i = 0; i < 6; i++) OK(MPI_Type_commit(all[i]));
	int size = -1;
	MPI_Aint lb, ext;
	OK(MPI_Type_size(zf, &size));
	OK(MPI_Type_get_extent(zf, &lb, &ext));
	EXPECT(size == NX * NY * 8 && lb == 0 && ext == (MPI_Aint)AX * AY * AZ * 8, "size %d extent %ld", size, (long)ext);
	/* Fortran order: the same plane seen with the dimensions reversed. */
	MPI_Datatype ff;
	int fsizes[3] = {AZ, AY, AX}, fsub[3] = {1, NY, NX}, fst[3] = {1, 1, 1};
	OK(MPI_Type_create_subarray(3, fsizes, fsub, fst, MPI_ORDER_FORTRAN, MPI_DOUBLE, &ff));
	OK(MPI_Type_commit(&ff));

	double *base, *back = calloc((size_t)AX * AY * AZ, sizeof(double));
	MPI_Win win;
	OK(MPI_Win_allocate((MPI_Aint)AX * AY * AZ * 8, 8, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win));
	for (long i = 0; i < (long)AX * AY * AZ; i++) base[i] = val(me, i);
	int next = (me + 1) % np, prev = (me + np - 1) % np;
	OK(MPI_Win_fence(0, win));
	OK(MPI_Put(base, 1, zf, next, 0, 1, zg, win));
	MPI_Request rq;
	OK(MPI_Rput(base, 1, xf, next, 0, 1, xg, win, &rq));
	OK(MPI_Wait(&rq, MPI_STATUS_IGNORE));
	OK(MPI_Get(back, 1, yg, next, 0, 1, yf, win)); /* next's y interior plane into my y ghost place */
	OK(MPI_Win_fence(0, win));
	for (int i = 1; i <= NX; i++)
		for (int j = 1; j <= NY; j++) {
			EXPECT(base[IDX(i, j, 0)] == val(prev, IDX(i, j, 1)), "z ghost (%d,%d): %g", i, j, base[IDX(i, j, 0)]);
			EXPECT(base[IDX(i, j, NZ + 1)] == val(me, IDX(i, j, NZ + 1)), "z ghost high touched");
		}
	for (int j = 1; j <= NY; j++)
		for (int k = 1; k <= NZ; k++)
			EXPECT(base[IDX(0, j, k)] == val(prev, IDX(1, j, k)), "x ghost (%d,%d): %g", j, k, base[IDX(0, j, k)]);
	for (int i = 1; i <= NX; i++)
		for (int k = 1; k <= NZ; k++)
			EXPECT(back[IDX(i, NY + 1, k)] == val(next, IDX(i, NY, k)), "y got (%d,%d): %g", i, k,
			       back[IDX(i, NY + 1, k)]);
	EXPECT(back[IDX(1, 1, 1)] == 0, "get wrote outside its type");
	/* The Fortran-order type is the z = 1 plane, j fastest. */
	OK(MPI_Win_fence(0, win));
	double plane[NX * NY];
	OK(MPI_Get(plane, NX * NY, MPI_DOUBLE, next, 0, 1, ff, win));
	OK(MPI_Win_fence(0, win));
	for (int i = 0; i < NX; i++)
		for (int j = 0; j < NY; j++)
			EXPECT(plane[i * NY + j] == val(next, IDX(i + 1, j + 1, 1)), "fortran (%d,%d): %g", i, j, plane[i * NY + j]);

	OK(MPI_Win_free(&win));
	for (int i = 0; i < 6; i++) OK(MPI_Type_free(all[i]));
	OK(MPI_Type_free(&ff));
	OK(MPI_Comm_free(&grid));
	OK(MPI_Comm_free(&ring));
	free(back);
	OK(MPI_Barrier(MPI_COMM_WORLD));
	if (me == 0) printf("subarray: ok on %d ranks\n", np);
	OK(MPI_Finalize());
	return 0;
}
