/* Error classes under MPI_ERRORS_RETURN: each bad call returns the class
 * a user expects, with a message (MPI_Error_string), and leaves the
 * window usable; then a put of a vector type and an accumulate check that
 * it is. Prints "errors: ok on N ranks" on rank 0. */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define EXPECT_CLASS(want, call)                                                                       \
	do {                                                                                           \
		int rc_ = (call), cls_ = -1, len_;                                                     \
		char s_[MPI_MAX_ERROR_STRING];                                                         \
		MPI_Error_class(rc_, &cls_);                                                           \
		MPI_Error_string(rc_, s_, &len_);                                                      \
		EXPECT(cls_ == (want), "%s: class %d, want %s (%d): %s", #call, cls_, #want, want, s_); \
		EXPECT(len_ > 0 && (size_t)len_ == strlen(s_), "%s: empty error string", #call);         \
	} while (0)

#undef OK /* here a call that fails names its error class */
#define OK(call) EXPECT_CLASS(MPI_SUCCESS, call)

int main(int argc, char **argv) {
	int np = start(&argc, &argv);
	int next = (me + 1) % np;

	int64_t *base;
	MPI_Win win;
	OK(MPI_Win_allocate(8 * 16, 8, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win));
	if (argc > 2 && !strcmp(argv[1], "fatal")) {
		/* A window's handler is its own (MPI_ERRORS_ARE_FATAL), not its
		 * communicator's: each of these aborts the job with the class's
		 * message (an invalid window handle has no window: the world's
		 * handler, made fatal again, applies). */
		int64_t v = 0;
		const char *c = argv[2];
		MPI_Datatype vec;
		OK(MPI_Type_vector(2, 1, 2, MPI_INT64_T, &vec));
		if (strcmp(c, "sync")) OK(MPI_Win_lock_all(0, win));
		if (!strcmp(c, "rank")) MPI_Put(&v, 1, MPI_INT64_T, np, 0, 1, MPI_INT64_T, win);
		if (!strcmp(c, "type")) MPI_Get(&v, 1, vec, next, 0, 1, vec, win); /* not committed */
		if (!strcmp(c, "disp")) MPI_Accumulate(&v, 1, MPI_INT64_T, next, -3, 1, MPI_INT64_T, MPI_SUM, win);
		if (!strcmp(c, "range")) MPI_Get(&v, 1, MPI_INT64_T, next, 16, 1, MPI_INT64_T, win);
		if (!strcmp(c, "sync")) MPI_Put(&v, 1, MPI_INT64_T, next, 0, 1, MPI_INT64_T, win);
		if (!strcmp(c, "win")) {
			OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL));
			MPI_Win_flush(next, win + 77);
		}
		if (!strcmp(c, "size")) {
			OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL));
			MPI_Win_allocate(-64, 8, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
		}
		printf("errors: not reached\n");
		return 0;
	}
	OK(MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN));
	MPI_Errhandler eh;
	OK(MPI_Win_get_errhandler(win, &eh));
	EXPECT(eh == MPI_ERRORS_RETURN, "errhandler %d", eh);
	int64_t buf[16] = {0}, buf0[8];

	/* Outside an epoch. */
	EXPECT_CLASS(MPI_ERR_RMA_SYNC, MPI_Put(buf, 1, MPI_INT64_T, next, 0, 1, MPI_INT64_T, win));
	EXPECT_CLASS(MPI_ERR_RMA_SYNC, MPI_Get(buf, 1, MPI_INT64_T, next, 0, 1, MPI_INT64_T, win));
	EXPECT_CLASS(MPI_ERR_RMA_SYNC, MPI_Accumulate(buf, 1, MPI_INT64_T, next, 0, 1, MPI_INT64_T, MPI_SUM, win));
	EXPECT_CLASS(MPI_ERR_RMA_SYNC, MPI_Win_unlock(next, win));
	EXPECT_CLASS(MPI_ERR_RMA_SYNC, MPI_Win_unlock_all(win));
	EXPECT_CLASS(MPI_ERR_RMA_SYNC, MPI_Win_complete(win));
	EXPECT_CLASS(MPI_ERR_RMA_SYNC, MPI_Win_wait(win));
	EXPECT_CLASS(MPI_ERR_RMA_SYNC, MPI_Win_flush(next, win));
	/* Window sizes and units (every rank passes the same bad value, so
	 * the collective call fails everywhere before it communicates). */
	MPI_Win bad = MPI_WIN_NULL;
	int64_t *bbase;
	EXPECT_CLASS(MPI_ERR_SIZE, MPI_Win_allocate(-8, 8, MPI_INFO_NULL, MPI_COMM_WORLD, &bbase, &bad));
	EXPECT_CLASS(MPI_ERR_SIZE, MPI_Win_create(buf0, -1, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &bad));
	EXPECT_CLASS(MPI_ERR_DISP, MPI_Win_create(buf0, 64, 0, MPI_INFO_NULL, MPI_COMM_WORLD, &bad));
	EXPECT_CLASS(MPI_ERR_DISP, MPI_Win_allocate(64, -8, MPI_INFO_NULL, MPI_COMM_WORLD, &bbase, &bad));
	EXPECT(bad == MPI_WIN_NULL, "a window from a failed call");
	OK(MPI_Win_lock_all(0, win));

	/* Ranks. */
	EXPECT_CLASS(MPI_ERR_RANK, MPI_Put(buf, 1, MPI_INT64_T, np, 0, 1, MPI_INT64_T, win));
	EXPECT_CLASS(MPI_ERR_RANK, MPI_Get(buf, 1, MPI_INT64_T, -5, 0, 1, MPI_INT64_T, win));
	EXPECT_CLASS(MPI_ERR_RANK, MPI_Accumulate(buf, 1, MPI_INT64_T, np + 3, 0, 1, MPI_INT64_T, MPI_SUM, win));
	EXPECT_CLASS(MPI_ERR_RANK, MPI_Send(buf, 1, MPI_INT, np, 0, MPI_COMM_WORLD));
	/* Displacements (in disp_unit 8: 16 elements). */
	EXPECT_CLASS(MPI_ERR_RMA_RANGE, MPI_Put(buf, 1, MPI_INT64_T, next, 16, 1, MPI_INT64_T, win));
	EXPECT_CLASS(MPI_ERR_RMA_RANGE, MPI_Put(buf, 2, MPI_INT64_T, next, 15, 2, MPI_INT64_T, win));
	EXPECT_CLASS(MPI_ERR_DISP, MPI_Get(buf, 1, MPI_INT64_T, next, -1, 1, MPI_INT64_T, win));
	EXPECT_CLASS(MPI_ERR_DISP, MPI_Put(buf, 1, MPI_INT64_T, next, -8, 1, MPI_INT64_T, win));
	EXPECT_CLASS(MPI_ERR_DISP, MPI_Compare_and_swap(buf, buf + 1, buf + 2, MPI_INT64_T, next, -1, win));
	EXPECT_CLASS(MPI_ERR_DISP, MPI_Get_accumulate(buf, 1, MPI_INT64_T, buf + 1, 1, MPI_INT64_T, next, -2, 1,
	                                              MPI_INT64_T, MPI_SUM, win));
	EXPECT_CLASS(MPI_ERR_RMA_RANGE, MPI_Accumulate(buf, 1, MPI_INT64_T, next, 16, 1, MPI_INT64_T, MPI_SUM, win));
	EXPECT_CLASS(MPI_ERR_RMA_RANGE, MPI_Compare_and_swap(buf, buf + 1, buf + 2, MPI_INT64_T, next, 16, win));
	EXPECT_CLASS(MPI_ERR_RMA_RANGE, MPI_Get_accumulate(buf, 2, MPI_INT64_T, buf + 2, 2, MPI_INT64_T, next, 15, 2,
	                                                   MPI_INT64_T, MPI_SUM, win));
	EXPECT_CLASS(MPI_ERR_RMA_RANGE, MPI_Get(buf, 1, MPI_INT64_T, next, INTPTR_MAX / 2, 1, MPI_INT64_T, win));
	EXPECT_CLASS(MPI_ERR_RMA_RANGE, MPI_Fetch_and_op(buf, buf + 1, MPI_INT64_T, next, 16, MPI_SUM, win));
	/* Window handles: made up, null, freed below. */
	EXPECT_CLASS(MPI_ERR_WIN, MPI_Put(buf, 1, MPI_INT64_T, next, 0, 1, MPI_INT64_T, win + 1000));
	EXPECT_CLASS(MPI_ERR_WIN, MPI_Win_flush(next, MPI_WIN_NULL));
	EXPECT_CLASS(MPI_ERR_WIN, MPI_Get(buf, 1, MPI_INT64_T, next, 0, 1, MPI_INT64_T, -3));
	EXPECT_CLASS(MPI_ERR_WIN, MPI_Accumulate(buf, 1, MPI_INT64_T, next, 0, 1, MPI_INT64_T, MPI_SUM, 999999));
	EXPECT_CLASS(MPI_ERR_WIN, MPI_Fetch_and_op(buf, buf + 1, MPI_INT64_T, next, 0, MPI_SUM, win + 1));
	EXPECT_CLASS(MPI_ERR_WIN, MPI_Win_lock(MPI_LOCK_SHARED, next, 0, win + 1));
	EXPECT_CLASS(MPI_ERR_WIN, MPI_Win_get_attr(win + 1, MPI_WIN_BASE, &(void *){0}, &(int){0}));
	EXPECT_CLASS(MPI_ERR_WIN, MPI_Win_free(&(MPI_Win){win + 5}));
	/* More ranks: atomics, synchronisation calls. */
	EXPECT_CLASS(MPI_ERR_RANK, MPI_Fetch_and_op(buf, buf + 1, MPI_INT64_T, np, 0, MPI_SUM, win));
	EXPECT_CLASS(MPI_ERR_RANK, MPI_Compare_and_swap(buf, buf + 1, buf + 2, MPI_INT64_T, -2, 0, win));
	EXPECT_CLASS(MPI_ERR_RANK, MPI_Get_accumulate(buf, 1, MPI_INT64_T, buf + 1, 1, MPI_INT64_T, np, 0, 1, MPI_INT64_T,
	                                              MPI_SUM, win));
	EXPECT_CLASS(MPI_ERR_RANK, MPI_Win_flush(np + 1, win));
	/* Datatypes, operations, lock types, tags, communicators. */
	EXPECT_CLASS(MPI_ERR_TYPE, MPI_Put(buf, 1, (MPI_Datatype)12345, next, 0, 1, MPI_INT64_T, win));
	EXPECT_CLASS(MPI_ERR_TYPE, MPI_Get(buf, 1, MPI_INT64_T, next, 0, 1, (MPI_Datatype)-4, win));
	EXPECT_CLASS(MPI_ERR_TYPE, MPI_Fetch_and_op(buf, buf + 1, (MPI_Datatype)777, next, 0, MPI_SUM, win));
	EXPECT_CLASS(MPI_ERR_TYPE, MPI_Compare_and_swap(buf, buf + 1, buf + 2, MPI_DATATYPE_NULL, next, 0, win));
	EXPECT_CLASS(MPI_ERR_TYPE, MPI_Type_free(&(MPI_Datatype){MPI_INT}));
	EXPECT_CLASS(MPI_ERR_TYPE, MPI_Put(buf, 2, MPI_INT, next, 0, 1, MPI_INT, win));
	EXPECT_CLASS(MPI_ERR_TYPE, MPI_Accumulate(buf, 1, MPI_BYTE, next, 0, 1, MPI_BYTE, MPI_SUM, win));
	EXPECT_CLASS(MPI_ERR_OP, MPI_Accumulate(buf, 1, MPI_INT64_T, next, 0, 1, MPI_INT64_T, MPI_MAXLOC, win));
	EXPECT_CLASS(MPI_ERR_OP, MPI_Accumulate(buf, 1, MPI_INT64_T, next, 0, 1, MPI_INT64_T, (MPI_Op)99, win));
	EXPECT_CLASS(MPI_ERR_COUNT, MPI_Put(buf, -1, MPI_INT64_T, next, 0, -1, MPI_INT64_T, win));
	MPI_Datatype vec;
	OK(MPI_Type_vector(4, 1, 2, MPI_INT64_T, &vec));
	EXPECT_CLASS(MPI_ERR_TYPE, MPI_Put(buf, 1, vec, next, 0, 1, vec, win)); /* not committed */
	OK(MPI_Type_commit(&vec));
	EXPECT_CLASS(MPI_ERR_LOCKTYPE, MPI_Win_lock(99, next, 0, win));
	EXPECT_CLASS(MPI_ERR_TAG, MPI_Send(buf, 1, MPI_INT, next, -7, MPI_COMM_WORLD));
	EXPECT_CLASS(MPI_ERR_COMM, MPI_Barrier((MPI_Comm)999));
	EXPECT_CLASS(MPI_ERR_RANK, MPI_Recv(buf, 1, MPI_INT, np, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
	EXPECT_CLASS(MPI_ERR_RANK, MPI_Irecv(buf, 1, MPI_INT, -5, 0, MPI_COMM_WORLD, &(MPI_Request){0}));
	EXPECT_CLASS(MPI_ERR_TAG, MPI_Recv(buf, 1, MPI_INT, MPI_ANY_SOURCE, -7, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
	EXPECT_CLASS(MPI_ERR_TYPE, MPI_Recv(buf, 1, (MPI_Datatype)4321, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
	EXPECT_CLASS(MPI_ERR_RMA_FLAVOR, MPI_Win_attach(win, buf, 8)); /* not a dynamic window */
	EXPECT_CLASS(MPI_ERR_RMA_FLAVOR, MPI_Win_detach(win, buf));
	EXPECT_CLASS(MPI_ERR_REQUEST, MPI_Wait(&(MPI_Request){4242}, MPI_STATUS_IGNORE));
	EXPECT_CLASS(MPI_ERR_ROOT, MPI_Bcast(buf, 1, MPI_INT, np, MPI_COMM_WORLD));
	EXPECT_CLASS(MPI_ERR_GROUP, MPI_Group_free(&(MPI_Group){777}));

	/* The window still works: a vector put (every other element) and
	 * an accumulate from every rank. */
	OK(MPI_Barrier(MPI_COMM_WORLD));
	int64_t src[8];
	for (int i = 0; i < 8; i++) src[i] = 100 * me + i;
	OK(MPI_Put(src, 1, vec, next, 0, 1, vec, win));
	OK(MPI_Win_flush(next, win));
	int64_t one = 1;
	OK(MPI_Accumulate(&one, 1, MPI_INT64_T, 0, 15, 1, MPI_INT64_T, MPI_SUM, win));
	OK(MPI_Win_flush_all(win));
	OK(MPI_Barrier(MPI_COMM_WORLD));
	OK(MPI_Win_sync(win));
	int prev = (me + np - 1) % np;
	for (int i = 0; i < 8; i++)
		EXPECT(base[i] == (i % 2 ? 0 : 100 * prev + i), "base[%d] = %lld", i, (long long)base[i]);
	if (me == 0) EXPECT(base[15] == np, "counter %lld, want %d", (long long)base[15], np);
	int64_t got = -1;
	OK(MPI_Fetch_and_op(NULL, &got, MPI_INT64_T, 0, 15, MPI_NO_OP, win));
	OK(MPI_Win_flush(0, win));
	EXPECT(got == np, "fetched %lld, want %d", (long long)got, np);
	OK(MPI_Win_unlock_all(win));

	/* Attributes. */
	void *b;
	MPI_Aint *size;
	int *unit, *model, flag;
	OK(MPI_Win_get_attr(win, MPI_WIN_BASE, &b, &flag));
	EXPECT(flag && b == base, "base");
	OK(MPI_Win_get_attr(win, MPI_WIN_SIZE, &size, &flag));
	EXPECT(flag && *size == 128, "size");
	OK(MPI_Win_get_attr(win, MPI_WIN_DISP_UNIT, &unit, &flag));
	EXPECT(flag && *unit == 8, "disp_unit");
	OK(MPI_Win_get_attr(win, MPI_WIN_MODEL, &model, &flag));
	EXPECT(flag && *model == MPI_WIN_UNIFIED, "model");

	OK(MPI_Type_free(&vec));
	MPI_Win old = win;
	OK(MPI_Win_free(&win));
	EXPECT(win == MPI_WIN_NULL, "freed window not null");
	EXPECT_CLASS(MPI_ERR_WIN, MPI_Win_fence(0, old));

	/* Windows whose size differs by rank: rank r has r+1 elements, so the
	 * last one of next's is at next, and next+1 is past its end. */
	OK(MPI_Win_allocate(8 * (me + 1), 8, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win));
	OK(MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN));
	for (int i = 0; i <= me; i++) base[i] = -1;
	OK(MPI_Barrier(MPI_COMM_WORLD));
	OK(MPI_Win_lock_all(0, win));
	int64_t mark = 7000 + me;
	EXPECT_CLASS(MPI_ERR_RMA_RANGE, MPI_Put(&mark, 1, MPI_INT64_T, next, next + 1, 1, MPI_INT64_T, win));
	EXPECT_CLASS(MPI_ERR_RMA_RANGE, MPI_Put(buf, 2, MPI_INT64_T, next, next, 2, MPI_INT64_T, win));
	OK(MPI_Put(&mark, 1, MPI_INT64_T, next, next, 1, MPI_INT64_T, win));
	OK(MPI_Win_unlock_all(win));
	OK(MPI_Barrier(MPI_COMM_WORLD));
	EXPECT(base[me] == 7000 + prev, "last element %lld, want %d", (long long)base[me], 7000 + prev);
	for (int i = 0; i < me; i++) EXPECT(base[i] == -1, "element %d written: %lld", i, (long long)base[i]);
	OK(MPI_Win_free(&win));

	/* Reductions the library does itself: int, float and PROD. */
	int iv = me + 1, isum;
	OK(MPI_Allreduce(&iv, &isum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD));
	EXPECT(isum == np * (np + 1) / 2, "int sum %d", isum);
	double dv = me + 1;
	OK(MPI_Allreduce(MPI_IN_PLACE, &dv, 1, MPI_DOUBLE, MPI_PROD, MPI_COMM_WORLD));
	double fact = 1;
	for (int r = 1; r <= np; r++) fact *= r;
	EXPECT(dv == fact, "double prod %g", dv);

	OK(MPI_Barrier(MPI_COMM_WORLD));
	if (me == 0) printf("errors: ok on %d ranks\n", np);
	OK(MPI_Finalize());
	return 0;
}
