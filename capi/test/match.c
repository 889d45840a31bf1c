/* Matching receives: rank 0 takes every other rank's messages from any
 * source and with any tag of a context (mask), in each sender's order,
 * with their source and tag; a non-blocking try over a snapshot; a
 * truncated match; probes, which leave the message; waits ended by
 * rvma_msg_cancel; and the arguments' errors. */
#include "check.h"

int main(void) {
	setup();
	const int ctx = 5 << 24, n = 4;
	if (me != 0) {
		for (int i = 0; i < n; i++) {
			int64_t v = me * 100 + i;
			CHECK(rvma_send(world, 0, ctx | (i % 2 ? 9 : 3), &v, sizeof v));
		}
		/* one for the exact match below, one for the truncation */
		int64_t v = -me;
		CHECK(rvma_send(world, 0, 77, &v, sizeof v));
		CHECK(rvma_send(world, 0, 78, &v, sizeof v));
		/* 3*me bytes to probe */
		char p[64];
		memset(p, 'a' + me, sizeof p);
		CHECK(rvma_send(world, 0, 79, p, 3 * (size_t)me));
	} else {
		int next[64] = {0};
		for (int k = 0; k < n * (np - 1); k++) {
			int64_t v = 0;
			size_t len = 0;
			int src = -1, tag = -1;
			if (k % 2) {
				CHECK(rvma_recv_match(world, RVMA_ANY_SOURCE, ctx, (int)0xff000000u, &v, sizeof v, &len, &src, &tag));
			} else {
				/* try over a snapshot, else wait for the next arrival */
				for (;;) {
					uint64_t at;
					int flag = -1;
					CHECK(rvma_msg_arrived(world, &at));
					CHECK(rvma_try_recv_match(world, RVMA_ANY_SOURCE, ctx, (int)0xff000000u, at, &v, sizeof v, &len,
					                          &src, &tag, &flag));
					EXPECT(flag == 0 || flag == 1, "flag %d", flag);
					if (flag) break;
					CHECK(rvma_msg_wait(world, at));
				}
			}
			EXPECT(src >= 1 && src < np, "source %d", src);
			int i = next[src]++;
			EXPECT(len == sizeof v && v == src * 100 + i, "from %d: %zu bytes, %" PRId64 ", want %d", src, len, v,
			       src * 100 + i);
			EXPECT(tag == (ctx | (i % 2 ? 9 : 3)), "from %d: tag %#x", src, tag);
		}
		for (int r = 1; r < np; r++) EXPECT(next[r] == n, "%d messages from %d", next[r], r);
		/* Exact tag, any source; then rank 1's by source. */
		for (int r = 1; r < np; r++) {
			int64_t v = 0;
			size_t len = 0;
			int src = -1;
			CHECK(rvma_recv_match(world, r == 1 ? 1 : RVMA_ANY_SOURCE, 77, -1, &v, sizeof v, &len, &src, NULL));
			EXPECT(v == -src && len == sizeof v, "77 from %d: %" PRId64, src, v);
		}
		/* A message longer than the buffer: consumed, truncated, its length said. */
		for (int r = 1; r < np; r++) {
			int32_t small = 0;
			size_t len = 0;
			int src = -1;
			EXPECT_ERR(RVMA_ERR_TRUNCATE, rvma_recv_match(world, RVMA_ANY_SOURCE, 78, -1, &small, sizeof small, &len,
			                                              &src, NULL));
			EXPECT(len == 8 && src >= 1, "truncated: %zu bytes from %d", len, src);
		}
		/* Probes describe the message a matching receive then takes. */
		for (int r = 1; r < np; r++) {
			int src = -1, tag = -1, flag = -1;
			size_t len = 0;
			CHECK(rvma_probe_match(world, RVMA_ANY_SOURCE, 79, -1, &src, &tag, &len));
			EXPECT(src >= 1 && src < np && tag == 79 && len == 3 * (size_t)src, "probe: %d %d %zu", src, tag, len);
			int src2 = -1;
			size_t len2 = 0;
			CHECK(rvma_try_probe_match(world, src, 0, 0, 0, &src2, NULL, &len2, &flag));
			EXPECT(flag == 1 && src2 == src && len2 == len, "try probe: %d %d %zu", flag, src2, len2);
			char b[64];
			CHECK(rvma_recv_match(world, src, 79, -1, b, sizeof b, &len2, NULL, NULL));
			EXPECT(len2 == len && b[0] == 'a' + src, "received %zu bytes %c", len2, b[0]);
		}
		/* A cancelled key ends its wait at once, taking nothing, also
		 * when the cancel comes first. */
		size_t got = 0;
		char c[8];
		CHECK(rvma_msg_cancel(world, 41));
		EXPECT_ERR(RVMA_ERR_CANCELLED, rvma_recv_match_key(world, RVMA_ANY_SOURCE, 0, 0, c, sizeof c, &got, NULL, NULL, 41));
		CHECK(rvma_msg_cancel(world, 42));
		uint64_t at;
		CHECK(rvma_msg_arrived(world, &at));
		EXPECT_ERR(RVMA_ERR_CANCELLED, rvma_msg_wait_key(world, at, 42));
		EXPECT_ERR(RVMA_ERR_ARG, rvma_msg_cancel(world, 0));
		int flag = -1;
		size_t len;
		char b[8];
		EXPECT_ERR(RVMA_ERR_RANK, rvma_try_probe_match(world, np, 0, -1, 0, NULL, NULL, NULL, &flag));
		EXPECT_ERR(RVMA_ERR_ARG, rvma_try_probe_match(world, 0, 0, -1, 0, NULL, NULL, NULL, NULL));
		CHECK(rvma_try_recv_match(world, RVMA_ANY_SOURCE, 0, 0, 0, b, sizeof b, &len, NULL, NULL, &flag));
		EXPECT(flag == 0, "a message left: %d", flag);
		EXPECT_ERR(RVMA_ERR_RANK, rvma_try_recv_match(world, np, 0, -1, 0, b, sizeof b, &len, NULL, NULL, &flag));
		EXPECT_ERR(RVMA_ERR_ARG, rvma_try_recv_match(world, 0, -1, -1, 0, b, sizeof b, &len, NULL, NULL, &flag));
		EXPECT_ERR(RVMA_ERR_ARG, rvma_try_recv_match(world, 0, 0, -1, 0, b, sizeof b, &len, NULL, NULL, NULL));
		EXPECT_ERR(RVMA_ERR_ARG, rvma_recv_match(world, 0, 0, -1, NULL, 4, &len, NULL, NULL));
		EXPECT_ERR(RVMA_ERR_HANDLE, rvma_msg_arrived(RVMA_COMM_NULL, &(uint64_t){0}));
	}
	finish("match");
	return 0;
}
