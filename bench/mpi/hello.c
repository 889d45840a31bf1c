/*
 * hello: the smallest MPI job, for launcher startup times against
 * rvmarun's (scripts/hosts-scale.sh): init, a barrier, finalize.
 *
 * Build: mpicc -O2 -o hello hello.c
 */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
	int rank, size;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0)
		printf("hello from %d ranks\n", size);
	MPI_Finalize();
	return 0;
}
