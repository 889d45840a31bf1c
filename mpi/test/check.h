/* What the MPI C tests share: this rank (set it after MPI_Comm_rank), a
 * check that exits naming the rank, the file, the line and the condition,
 * and OK for calls that must succeed. */
#ifndef MPI_TEST_CHECK_H
#define MPI_TEST_CHECK_H
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static int me = -1;

#define EXPECT(cond, ...)                                                                  \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "[%d] %s:%d: %s: ", me, __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                                      \
			fprintf(stderr, "\n");                                             \
			exit(1);                                                           \
		}                                                                          \
	} while (0)
#define OK(call) EXPECT((call) == MPI_SUCCESS, "%s failed", #call)

/* start initialises MPI, sets me, and returns the number of ranks; errors
 * on MPI_COMM_WORLD are returned to the tests, which check each. */
static int start(int *argc, char ***argv) {
	int np;
	OK(MPI_Init(argc, argv));
	OK(MPI_Comm_rank(MPI_COMM_WORLD, &me));
	OK(MPI_Comm_size(MPI_COMM_WORLD, &np));
	OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
	return np;
}

#endif
