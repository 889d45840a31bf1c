/* The process and communicator calls, collectives and messages. */
#include "check.h"

int main(void) {
	int flag = -1;
	CHECK(rvma_initialized(&flag));
	EXPECT(flag == 0, "initialized before rvma_init");
	setup();
	CHECK(rvma_initialized(&flag));
	EXPECT(flag == 1, "not initialized after rvma_init");
	CHECK(rvma_finalized(&flag));
	EXPECT(flag == 0, "finalized early");
	rvma_comm again;
	EXPECT_ERR(RVMA_ERR_STATE, rvma_init(&again));
	EXPECT(np >= 2 && me >= 0 && me < np, "rank %d of %d", me, np);
	CHECK(rvma_barrier(world));

	/* This process alone: one rank, the same handle each time, windows
	 * that only this rank makes and frees. */
	rvma_comm self, self2;
	int sr = -1, sn = -1;
	EXPECT_ERR(RVMA_ERR_ARG, rvma_comm_self(NULL));
	CHECK(rvma_comm_self(&self));
	CHECK(rvma_comm_self(&self2));
	CHECK(rvma_comm_rank(self, &sr));
	CHECK(rvma_comm_size(self, &sn));
	EXPECT(self == self2 && self != world && sr == 0 && sn == 1, "self: handles %d %d, rank %d of %d", (int)self,
	       (int)self2, sr, sn);
	if (me == 0) {
		int64_t *sb, one = 5, old = -1;
		rvma_win sw;
		CHECK(rvma_win_allocate(self, 16, 1, (void **)&sb, &sw));
		sb[0] = 1;
		CHECK(rvma_win_lock_all(sw));
		CHECK(rvma_fetch_and_op(sw, &one, &old, RVMA_INT64, RVMA_SUM, 0, 0));
		CHECK(rvma_win_flush(sw, 0));
		CHECK(rvma_win_unlock_all(sw));
		EXPECT(old == 1 && sb[0] == 6, "self window: fetched %" PRId64 ", now %" PRId64, old, sb[0]);
		CHECK(rvma_win_free(&sw));
	}
	CHECK(rvma_barrier(world));

	/* Allreduce: sum, min and max of int64 and double. */
	int64_t iv[3] = {me + 1, -(int64_t)me * 1000000007LL, me};
	CHECK(rvma_allreduce_int64(world, RVMA_SUM, iv, 1));
	EXPECT(iv[0] == (int64_t)np * (np + 1) / 2, "sum %" PRId64, iv[0]);
	CHECK(rvma_allreduce_int64(world, RVMA_MIN, iv + 1, 1));
	EXPECT(iv[1] == -(int64_t)(np - 1) * 1000000007LL, "min %" PRId64, iv[1]);
	CHECK(rvma_allreduce_int64(world, RVMA_MAX, iv + 2, 1));
	EXPECT(iv[2] == np - 1, "max %" PRId64, iv[2]);
	double dv[2] = {0.5 * me, 1.0 / (me + 1)};
	CHECK(rvma_allreduce_double(world, RVMA_SUM, dv, 2));
	double want = 0, want2 = 0;
	for (int r = 0; r < np; r++)
		want += 0.5 * r, want2 += 1.0 / (r + 1);
	EXPECT(dv[0] == want && dv[1] == want2, "double sum %g %g, want %g %g", dv[0], dv[1], want, want2);
	double dm = me == 1 ? -2.5 : me;
	CHECK(rvma_allreduce_double(world, RVMA_MIN, &dm, 1));
	EXPECT(dm == -2.5, "double min %g", dm);
	CHECK(rvma_allreduce_double(world, RVMA_MAX, &dm, 1));
	EXPECT(dm == -2.5, "double max of equal values %g", dm);
	CHECK(rvma_allreduce_int64(world, RVMA_SUM, NULL, 0));
	EXPECT_ERR(RVMA_ERR_UNSUPPORTED, rvma_allreduce_int64(world, RVMA_PROD, iv, 1));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_allreduce_int64(world, (rvma_op)99, iv, 1));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_allreduce_double(world, RVMA_SUM, NULL, 3));

	/* Bcast from the last rank. */
	char msg[64] = {0};
	if (me == np - 1)
		snprintf(msg, sizeof msg, "from rank %d", me);
	CHECK(rvma_bcast(world, np - 1, msg, sizeof msg));
	char wantmsg[64] = {0};
	snprintf(wantmsg, sizeof wantmsg, "from rank %d", np - 1);
	EXPECT(memcmp(msg, wantmsg, sizeof msg) == 0, "bcast gave %s", msg);
	EXPECT_ERR(RVMA_ERR_RANK, rvma_bcast(world, np, msg, sizeof msg));

	/* Allgather: every rank's 12 bytes in rank order. */
	unsigned char mine[12], all[12 * 64];
	for (int i = 0; i < 12; i++)
		mine[i] = pat(me, 0, i);
	CHECK(rvma_allgather(world, mine, sizeof mine, all));
	for (int r = 0; r < np; r++)
		for (int i = 0; i < 12; i++)
			EXPECT(all[12 * r + i] == pat(r, 0, i), "allgather byte %d of rank %d", i, r);
	EXPECT_ERR(RVMA_ERR_ARG, rvma_allgather(world, mine, sizeof mine, NULL));

	/* Messages around a ring: send, isend, recv, truncation. */
	int next = (me + 1) % np, prev = (me + np - 1) % np;
	char out[100], in[100];
	size_t n = 0;
	for (int i = 0; i < 100; i++)
		out[i] = (char)pat(me, next, i);
	rvma_request sreq;
	CHECK(rvma_isend(world, next, 7, out, sizeof out, &sreq));
	memset(out, 0, sizeof out); /* isend copied it */
	CHECK(rvma_recv(world, prev, 7, in, sizeof in, &n));
	EXPECT(n == 100, "received %zu bytes", n);
	for (int i = 0; i < 100; i++)
		EXPECT(in[i] == (char)pat(prev, me, i), "message byte %d", i);
	CHECK(rvma_request_wait(&sreq));
	EXPECT(sreq == RVMA_REQUEST_NULL, "request not freed");
	CHECK(rvma_send(world, next, RVMA_TAG_UB, "0123456789", 10));
	char small[4];
	EXPECT_ERR(RVMA_ERR_TRUNCATE, rvma_recv(world, prev, RVMA_TAG_UB, small, sizeof small, &n));
	EXPECT(n == 10 && memcmp(small, "0123", 4) == 0, "truncated to %zu: %.4s", n, small);
	EXPECT_ERR(RVMA_ERR_ARG, rvma_send(world, next, -1, out, 1));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_send(world, next, RVMA_TAG_UB + 1, out, 1));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_send(world, next, 0, NULL, 1));
	EXPECT_ERR(RVMA_ERR_RANK, rvma_send(world, np, 0, out, 1));

	/* The connection to next is up: its transport has a name. */
	const char *tr = NULL;
	CHECK(rvma_comm_transport(world, next, &tr));
	EXPECT(strcmp(tr, "shm") == 0 || strcmp(tr, "udp") == 0, "transport %s", tr);
	EXPECT_ERR(RVMA_ERR_RANK, rvma_comm_transport(world, -1, &tr));

	/* Handles of the wrong kind or made up. */
	int x;
	EXPECT_ERR(RVMA_ERR_HANDLE, rvma_comm_rank(self + 1000, &x));
	EXPECT_ERR(RVMA_ERR_HANDLE, rvma_comm_rank(RVMA_COMM_NULL, &x));
	EXPECT_ERR(RVMA_ERR_HANDLE, rvma_barrier(~(rvma_comm)0));
	EXPECT_ERR(RVMA_ERR_ARG, rvma_comm_rank(world, NULL));

	finish("basic");
	CHECK(rvma_finalized(&flag));
	EXPECT(flag == 1, "not finalized");
	EXPECT_ERR(RVMA_ERR_STATE, rvma_finalize());
	EXPECT_ERR(RVMA_ERR_HANDLE, rvma_comm_rank(world, &x));
	EXPECT_ERR(RVMA_ERR_STATE, rvma_init(&again));
	return 0;
}
