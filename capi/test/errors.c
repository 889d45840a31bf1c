/* Bad arguments get their error codes and messages, never a crash, and
 * leave the window usable. */
#include <stdint.h>

#include "check.h"

int main(void) {
	setup();
	int next = (me + 1) % np;
	rvma_win win;
	unsigned char *base;
	CHECK(rvma_win_allocate(world, 64, 1, (void **)&base, &win));
	unsigned char buf[64] = {0};
	int64_t one = 1, res = 0;

	/* No epoch yet. */
	EXPECT_ERR(RVMA_ERR_EPOCH, rvma_put(win, buf, 8, next, 0));
	EXPECT_ERR(RVMA_ERR_EPOCH, rvma_get(win, buf, 8, next, 0));
	EXPECT_ERR(RVMA_ERR_EPOCH, rvma_accumulate(win, &one, 1, RVMA_INT64, RVMA_SUM, next, 0));
	EXPECT_ERR(RVMA_ERR_EPOCH, rvma_fetch_and_op(win, &one, &res, RVMA_INT64, RVMA_SUM, next, 0));
	CHECK(rvma_win_lock_all(win));

	/* Ranks. */
	EXPECT_ERR(RVMA_ERR_RANK, rvma_put(win, buf, 8, np, 0));
	EXPECT_ERR(RVMA_ERR_RANK, rvma_put(win, buf, 8, -1, 0));
	EXPECT_ERR(RVMA_ERR_RANK, rvma_get(win, buf, 8, np + 100, 0));
	EXPECT_ERR(RVMA_ERR_RANK, rvma_fetch_and_op(win, &one, &res, RVMA_INT64, RVMA_SUM, np, 0));

	/* Displacements: past the end, straddling it, negative, huge. */
	EXPECT_ERR(RVMA_ERR_BOUNDS, rvma_put(win, buf, 8, next, 64));
	EXPECT_ERR(RVMA_ERR_BOUNDS, rvma_put(win, buf, 8, next, 60));
	EXPECT_ERR(RVMA_ERR_BOUNDS, rvma_put(win, buf, 65 > sizeof buf ? 64 : 65, next, 1));
	EXPECT_ERR(RVMA_ERR_BOUNDS, rvma_get(win, buf, 1, next, -1));
	EXPECT_ERR(RVMA_ERR_BOUNDS, rvma_get(win, buf, 1, next, INT64_MAX));
	EXPECT_ERR(RVMA_ERR_BOUNDS, rvma_get(win, buf, 1, next, INT64_MIN));
	EXPECT_ERR(RVMA_ERR_BOUNDS, rvma_accumulate(win, &one, 1, RVMA_INT64, RVMA_SUM, next, 57));
	EXPECT_ERR(RVMA_ERR_BOUNDS, rvma_compare_and_swap(win, &one, &one, &res, RVMA_INT64, next, 64));
	rvma_layout l8 = {8, 8, 16};
	EXPECT_ERR(RVMA_ERR_BOUNDS, rvma_put_strided(win, buf + 0, &(rvma_layout){1, 64, 64}, next, 0, &l8));
	/* The message names the operation and the rank. */
	EXPECT_ERR(RVMA_ERR_BOUNDS, rvma_put(win, buf, 8, next, 100));
	EXPECT(strstr(rvma_last_error_message(), "put") != NULL, "message: %s", rvma_last_error_message());

	/* NULL buffers and lengths that cannot be. */
	EXPECT_ERR(RVMA_ERR_ARG, rvma_put(win, NULL, 8, next, 0));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_get(win, NULL, 1, next, 0));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_put(win, buf, SIZE_MAX, next, 0));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_put(win, buf, (size_t)-8, next, 0));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_get(win, (void *)(UINTPTR_MAX - 4), 16, next, 0));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_accumulate(win, NULL, 1, RVMA_INT64, RVMA_SUM, next, 0));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_accumulate(win, &one, SIZE_MAX / 4, RVMA_INT64, RVMA_SUM, next, 0));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_get_accumulate(win, &one, NULL, 1, RVMA_INT64, RVMA_SUM, next, 0));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_fetch_and_op(win, &one, NULL, RVMA_INT64, RVMA_SUM, next, 0));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_fetch_and_op(win, NULL, &res, RVMA_INT64, RVMA_SUM, next, 0));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_compare_and_swap(win, &one, NULL, &res, RVMA_INT64, next, 0));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_put_strided(win, buf, &l8, next, 0, NULL));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_put_strided(win, NULL, &l8, next, 0, &l8));
	EXPECT_ERR(RVMA_ERR_DATATYPE, rvma_put_strided(win, buf, &(rvma_layout){-1, 8, 8}, next, 0, &l8));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_put_strided(win, buf, &(rvma_layout){INT64_MAX, 8, INT64_MAX}, next, 0, &l8));
	rvma_request rq = 12345;
	EXPECT_ERR(RVMA_ERR_ARG, rvma_rput(win, buf, 8, next, 0, NULL));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_rget(win, NULL, 8, next, 0, &rq));
	EXPECT(rq == 12345, "a failed call wrote its request");
	/* Zero bytes from NULL is nothing, and allowed. */
	CHECK(rvma_put(win, NULL, 0, next, 0));
	CHECK(rvma_get(win, NULL, 0, next, 64));

	/* Datatypes and operations. */
	EXPECT_ERR(RVMA_ERR_ARG, rvma_accumulate(win, &one, 1, (rvma_datatype)0, RVMA_SUM, next, 0));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_accumulate(win, &one, 1, (rvma_datatype)11, RVMA_SUM, next, 0));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_accumulate(win, &one, 1, RVMA_INT64, (rvma_op)0, next, 0));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_accumulate(win, &one, 1, RVMA_INT64, (rvma_op)10, next, 0));
	double d = 1;
	EXPECT_ERR(RVMA_ERR_DATATYPE, rvma_accumulate(win, &d, 1, RVMA_DOUBLE, RVMA_BXOR, next, 0));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_win_lock(win, 0, next));

	/* Handles: null, made up, of another kind, freed. */
	EXPECT_ERR(RVMA_ERR_HANDLE, rvma_put(RVMA_WIN_NULL, buf, 8, next, 0));
	EXPECT_ERR(RVMA_ERR_HANDLE, rvma_put(win + 1, buf, 8, next, 0));
	EXPECT_ERR(RVMA_ERR_HANDLE, rvma_put((rvma_win)world, buf, 8, next, 0));
	EXPECT_ERR(RVMA_ERR_HANDLE, rvma_win_flush_all(0xdeadbeefcafeULL));
	EXPECT_ERR(RVMA_ERR_HANDLE, rvma_barrier((rvma_comm)win));
	rvma_request bogus = (rvma_request)win;
	EXPECT_ERR(RVMA_ERR_HANDLE, rvma_request_wait(&bogus));
	int flag;
	EXPECT_ERR(RVMA_ERR_HANDLE, rvma_request_test(&bogus, &flag));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_request_wait(NULL));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_request_waitall(2, NULL));
	rvma_request done = RVMA_REQUEST_NULL;
	CHECK(rvma_request_wait(&done));
	CHECK(rvma_request_test(&done, &flag));
	EXPECT(flag == 1, "a null request is complete");
	CHECK(rvma_rput(win, buf, 8, next, 0, &rq));
	rvma_request copy = rq;
	CHECK(rvma_request_wait(&rq));
	EXPECT_ERR(RVMA_ERR_HANDLE, rvma_request_wait(&copy));

	/* The window still works after all that. */
	for (int i = 0; i < 8; i++)
		buf[i] = pat(me, next, i);
	CHECK(rvma_put(win, buf, 8, next, 8));
	CHECK(rvma_win_flush(win, next));
	CHECK(rvma_win_unlock_all(win));
	CHECK(rvma_barrier(world));
	int prev = (me + np - 1) % np;
	for (int i = 0; i < 8; i++)
		EXPECT(base[8 + i] == pat(prev, me, i), "byte %d after the errors", i);

	rvma_win stale = win;
	CHECK(rvma_win_free(&win));
	EXPECT_ERR(RVMA_ERR_HANDLE, rvma_win_free(&stale));
	EXPECT_ERR(RVMA_ERR_HANDLE, rvma_put(stale, buf, 8, next, 0));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_win_free(NULL));

	/* Window creation that fails on one rank fails on all, none waits. */
	rvma_win w2 = RVMA_WIN_NULL;
	if (me == 0)
		EXPECT_ERR(RVMA_ERR_ARG, rvma_win_create(world, NULL, 64, 1, &w2));
	else
		EXPECT_ERR(RVMA_ERR_REMOTE, rvma_win_create(world, buf, 64, 1, &w2));
	EXPECT(w2 == RVMA_WIN_NULL, "a failed creation gave a handle");
	rvma_notify_config nc = {0}, good = {0};
	nc.nexpect_from = -1;
	good.expect = 8;
	EXPECT_ERR(me == np - 1 ? RVMA_ERR_ARG : RVMA_ERR_REMOTE,
	           rvma_win_allocate_notified(world, 64, 1, me == np - 1 ? &nc : &good, NULL, &w2));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_win_allocate_notified(world, 64, 1, NULL, NULL, &w2));
	nc.nexpect_from = 1; /* with NULL arrays */
	EXPECT_ERR(RVMA_ERR_ARG, rvma_win_allocate_notified(world, 64, 1, &nc, NULL, &w2));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_win_allocate(world, 64, 1, NULL, NULL));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_win_allocate(world, 64, -1, NULL, &w2));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_win_allocate(world, SIZE_MAX, 1, NULL, &w2));
	/* ... and the next creation works. */
	CHECK(rvma_win_allocate(world, 8, 1, NULL, &w2));
	CHECK(rvma_win_free(&w2));

	/* Error strings. */
	EXPECT(strstr(rvma_strerror(RVMA_ERR_BOUNDS), "RVMA_ERR_BOUNDS") != NULL, "strerror");
	EXPECT(rvma_strerror(-7) != NULL && rvma_strerror(1000) != NULL, "strerror of unknown codes");
	finish("errors");
	return 0;
}
