/* Point to point with wildcards and testable requests: MPI_ANY_SOURCE and
 * MPI_ANY_TAG with their status (MPI_SOURCE, MPI_TAG, MPI_Get_count),
 * MPI's matching order (each sender's messages in order; a message goes to
 * the first posted receive that matches), MPI_Test on an MPI_Irecv that
 * completes only later, MPI_Waitany, MPI_Testany, MPI_Testall,
 * MPI_Waitsome and MPI_Testsome over receives and sends, a truncated
 * receive, a strided datatype received from any source, and MPI_PROC_NULL.
 * Prints "p2p: ok on N ranks" on rank 0. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

int main(int argc, char **argv) {
	int np = start(&argc, &argv);
	MPI_Status st;
	int go = 1;

	/* 1. Every other rank sends 0 three ints with tags 100..102; rank 0
	 * takes them from any source with any tag. */
	if (me != 0) {
		for (int i = 0; i < 3; i++) {
			int v = me * 10 + i;
			OK(MPI_Send(&v, 1, MPI_INT, 0, 100 + i, MPI_COMM_WORLD));
		}
	} else {
		int next[256] = {0};
		for (int k = 0; k < 3 * (np - 1); k++) {
			int v = -1, n = -1;
			OK(MPI_Recv(&v, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st));
			int s = st.MPI_SOURCE, i = next[s]++;
			EXPECT(s > 0 && s < np, "source %d", s);
			EXPECT(st.MPI_TAG == 100 + i && v == s * 10 + i, "from %d: tag %d value %d, want %d and %d", s,
			       st.MPI_TAG, v, 100 + i, s * 10 + i);
			OK(MPI_Get_count(&st, MPI_INT, &n));
			EXPECT(n == 1, "count %d", n);
			OK(MPI_Get_count(&st, MPI_BYTE, &n));
			EXPECT(n == 4, "bytes %d", n);
			OK(MPI_Get_count(&st, MPI_INT64_T, &n));
			EXPECT(n == MPI_UNDEFINED, "int64 count %d", n);
		}
		for (int s = 1; s < np; s++) EXPECT(next[s] == 3, "%d messages from %d", next[s], s);
	}
	OK(MPI_Barrier(MPI_COMM_WORLD));

	/* 2. MPI_Test on an MPI_Irecv: false until rank 1 sends, which it does
	 * only when rank 0 says so. */
	if (me == 0) {
		int v = -1, flag = 1;
		MPI_Request r;
		OK(MPI_Irecv(&v, 1, MPI_INT, 1, 7, MPI_COMM_WORLD, &r));
		for (int i = 0; i < 20; i++) {
			OK(MPI_Test(&r, &flag, &st));
			EXPECT(!flag && r != MPI_REQUEST_NULL, "done before the message was sent");
		}
		OK(MPI_Send(&go, 1, MPI_INT, 1, 1, MPI_COMM_WORLD));
		long tries = 0;
		for (flag = 0; !flag; tries++) OK(MPI_Test(&r, &flag, &st));
		EXPECT(r == MPI_REQUEST_NULL && v == 4242 && st.MPI_SOURCE == 1 && st.MPI_TAG == 7,
		       "value %d source %d tag %d after %ld tests", v, st.MPI_SOURCE, st.MPI_TAG, tries);
		/* a null request tests true with an empty status */
		OK(MPI_Test(&r, &flag, &st));
		EXPECT(flag && st.MPI_SOURCE == MPI_ANY_SOURCE && st.MPI_TAG == MPI_ANY_TAG, "null request");
	} else if (me == 1) {
		int v = 4242;
		OK(MPI_Recv(&go, 1, MPI_INT, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
		OK(MPI_Send(&v, 1, MPI_INT, 0, 7, MPI_COMM_WORLD));
	}

	/* 3. Posting order: a wildcard receive posted first gets rank 1's
	 * first message even when the exact one posted after it is waited for
	 * first; then MPI_ANY_TAG from a given source. */
	if (me == 0) {
		int a = 0, b = 0, c = 0;
		MPI_Request r[3];
		OK(MPI_Irecv(&a, 1, MPI_INT, MPI_ANY_SOURCE, 8, MPI_COMM_WORLD, &r[0]));
		OK(MPI_Irecv(&b, 1, MPI_INT, 1, 8, MPI_COMM_WORLD, &r[1]));
		OK(MPI_Irecv(&c, 1, MPI_INT, 1, MPI_ANY_TAG, MPI_COMM_WORLD, &r[2]));
		OK(MPI_Send(&go, 1, MPI_INT, 1, 2, MPI_COMM_WORLD));
		OK(MPI_Wait(&r[1], &st));
		EXPECT(b == 2 && st.MPI_SOURCE == 1 && st.MPI_TAG == 8, "second: %d", b);
		OK(MPI_Wait(&r[2], &st));
		EXPECT(c == 3 && st.MPI_TAG == 9, "third: %d tag %d", c, st.MPI_TAG);
		OK(MPI_Wait(&r[0], &st));
		EXPECT(a == 1 && st.MPI_SOURCE == 1 && st.MPI_TAG == 8, "first: %d from %d", a, st.MPI_SOURCE);
	} else if (me == 1) {
		OK(MPI_Recv(&go, 1, MPI_INT, 0, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
		for (int v = 1; v <= 3; v++) OK(MPI_Send(&v, 1, MPI_INT, 0, v == 3 ? 9 : 8, MPI_COMM_WORLD));
	}
	OK(MPI_Barrier(MPI_COMM_WORLD));

	/* 4. A ring: receives from both neighbours and sends to both, finished
	 * by MPI_Waitany, then MPI_Testany, MPI_Testall, MPI_Waitsome and
	 * MPI_Testsome. */
	int left = (me + np - 1) % np, right = (me + 1) % np;
	for (int round = 0; round < 5; round++) {
		int in[2] = {-1, -1}, out[2] = {me * 100 + round, me * 100 + 50 + round};
		MPI_Request r[4];
		OK(MPI_Irecv(&in[0], 1, MPI_INT, left, 20, MPI_COMM_WORLD, &r[0]));  /* left's out[0] */
		OK(MPI_Irecv(&in[1], 1, MPI_INT, right, 21, MPI_COMM_WORLD, &r[1])); /* right's out[1] */
		OK(MPI_Isend(&out[0], 1, MPI_INT, right, 20, MPI_COMM_WORLD, &r[2]));
		OK(MPI_Isend(&out[1], 1, MPI_INT, left, 21, MPI_COMM_WORLD, &r[3]));
		int done = 0, seen[4] = {0}, idx[4], n, flag;
		MPI_Status sts[4];
		switch (round) {
		case 0:
			while (done < 4) {
				OK(MPI_Waitany(4, r, &n, &st));
				EXPECT(n >= 0 && n < 4 && !seen[n] && r[n] == MPI_REQUEST_NULL, "index %d", n);
				if (n < 2) EXPECT(st.MPI_SOURCE == (n ? right : left) && st.MPI_TAG == 20 + n, "status of %d", n);
				seen[n] = 1, done++;
			}
			OK(MPI_Waitany(4, r, &n, &st));
			EXPECT(n == MPI_UNDEFINED, "all null: index %d", n);
			break;
		case 1:
			while (done < 4) {
				OK(MPI_Testany(4, r, &n, &flag, &st));
				if (!flag) continue;
				EXPECT(n >= 0 && n < 4 && !seen[n], "index %d", n);
				seen[n] = 1, done++;
			}
			break;
		case 2:
			for (flag = 0; !flag;) OK(MPI_Testall(4, r, &flag, sts));
			EXPECT(sts[0].MPI_SOURCE == left && sts[1].MPI_SOURCE == right, "statuses %d %d", sts[0].MPI_SOURCE,
			       sts[1].MPI_SOURCE);
			for (int i = 0; i < 4; i++) EXPECT(r[i] == MPI_REQUEST_NULL, "request %d left", i);
			break;
		case 3:
		case 4:
			while (done < 4) {
				if (round == 3)
					OK(MPI_Waitsome(4, r, &n, idx, sts));
				else
					OK(MPI_Testsome(4, r, &n, idx, sts));
				EXPECT(n >= 0 && n <= 4 - done, "outcount %d", n);
				for (int i = 0; i < n; i++) {
					EXPECT(!seen[idx[i]] && r[idx[i]] == MPI_REQUEST_NULL, "index %d", idx[i]);
					if (idx[i] < 2) EXPECT(sts[i].MPI_TAG == 20 + idx[i], "tag %d", sts[i].MPI_TAG);
					seen[idx[i]] = 1, done++;
				}
			}
			OK(MPI_Testsome(4, r, &n, idx, sts));
			EXPECT(n == MPI_UNDEFINED, "all null: outcount %d", n);
			break;
		}
		EXPECT(in[0] == left * 100 + round && in[1] == right * 100 + 50 + round, "round %d: got %d %d", round,
		       in[0], in[1]);
	}

	/* 5. A message longer than the receive: MPI_ERR_TRUNCATE, with what
	 * fits. 6. A strided datatype from any source. 7. MPI_PROC_NULL. */
	if (me == 1) {
		int two[2] = {11, 22}, six[6] = {1, 2, 3, 4, 5, 6};
		OK(MPI_Send(two, 2, MPI_INT, 0, 30, MPI_COMM_WORLD));
		OK(MPI_Send(six, 3, MPI_INT, 0, 31, MPI_COMM_WORLD));
	} else if (me == 0) {
		int one[2] = {0, -1}, n;
		int rc = MPI_Recv(one, 1, MPI_INT, 1, 30, MPI_COMM_WORLD, &st), cls;
		MPI_Error_class(rc, &cls);
		EXPECT(cls == MPI_ERR_TRUNCATE && one[0] == 11 && one[1] == -1, "class %d, %d %d", cls, one[0], one[1]);
		MPI_Datatype every_other;
		OK(MPI_Type_vector(3, 1, 2, MPI_INT, &every_other));
		OK(MPI_Type_commit(&every_other));
		int got[6] = {0};
		OK(MPI_Recv(got, 1, every_other, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st));
		EXPECT(got[0] == 1 && got[1] == 0 && got[2] == 2 && got[4] == 3 && got[5] == 0, "strided: %d %d %d %d %d",
		       got[0], got[1], got[2], got[4], got[5]);
		OK(MPI_Get_count(&st, MPI_INT, &n));
		EXPECT(n == 3 && st.MPI_TAG == 31, "count %d tag %d", n, st.MPI_TAG);
		OK(MPI_Type_free(&every_other));
	}
	OK(MPI_Recv(&go, 1, MPI_INT, MPI_PROC_NULL, 5, MPI_COMM_WORLD, &st));
	int n = -1;
	OK(MPI_Get_count(&st, MPI_INT, &n));
	EXPECT(st.MPI_SOURCE == MPI_PROC_NULL && st.MPI_TAG == MPI_ANY_TAG && n == 0, "PROC_NULL");

	OK(MPI_Barrier(MPI_COMM_WORLD));
	if (me == 0) printf("p2p: ok on %d ranks\n", np);
	OK(MPI_Finalize());
	return 0;
}
