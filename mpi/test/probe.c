/* MPI_Probe, MPI_Iprobe, MPI_Cancel and MPI_Test_cancelled: probes from
 * any source with any tag whose status (source, tag, MPI_Get_count) sizes
 * the receive that follows; a probe leaves the message in place, and does
 * not report one that an earlier posted receive takes; cancelled receives
 * take nothing, also when another thread waits for them
 * (MPI_THREAD_MULTIPLE), and a cancelled send still arrives. Prints
 * "probe: ok on N ranks" on rank 0. */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

static void sleep_ms(int ms) {
	struct timespec ts = {0, ms * 1000000L};
	nanosleep(&ts, NULL);
}

/* A thread waiting for a receive that the main thread cancels. */
struct waiter {
	MPI_Request r;
	MPI_Status st;
	int rc;
};

static void *wait_for(void *p) {
	struct waiter *w = p;
	w->rc = MPI_Wait(&w->r, &w->st);
	return NULL;
}

int main(int argc, char **argv) {
	int np, provided, go = 1, flag, n;
	MPI_Status st;
	(void)start; /* MPI_Init_thread instead: threads wait below */
	OK(MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided));
	OK(MPI_Comm_rank(MPI_COMM_WORLD, &me));
	OK(MPI_Comm_size(MPI_COMM_WORLD, &np));
	OK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
	EXPECT(provided == MPI_THREAD_MULTIPLE, "provided %d", provided);

	/* 1. Every other rank r sends 0 r+1 ints with tag 10+r, then 2
	 * doubles with tag 50; rank 0 probes any source, any tag, and sizes
	 * each receive from the status. */
	if (me != 0) {
		int v[64];
		for (int i = 0; i <= me; i++) v[i] = me * 100 + i;
		double d[2] = {me + 0.5, me + 0.25};
		OK(MPI_Send(v, me + 1, MPI_INT, 0, 10 + me, MPI_COMM_WORLD));
		OK(MPI_Send(d, 2, MPI_DOUBLE, 0, 50, MPI_COMM_WORLD));
	} else {
		int next[64] = {0};
		for (int k = 0; k < 2 * (np - 1); k++) {
			OK(MPI_Probe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st));
			int s = st.MPI_SOURCE;
			EXPECT(s > 0 && s < np, "source %d", s);
			if (next[s]++ == 0) {
				EXPECT(st.MPI_TAG == 10 + s, "from %d: tag %d first, want %d", s, st.MPI_TAG, 10 + s);
				OK(MPI_Get_count(&st, MPI_INT, &n));
				EXPECT(n == s + 1, "from %d: count %d, want %d", s, n, s + 1);
				OK(MPI_Get_count(&st, MPI_BYTE, &n));
				EXPECT(n == 4 * (s + 1), "from %d: %d bytes", s, n);
				/* a second probe, exact this time, sees the same message */
				MPI_Status st2;
				OK(MPI_Probe(s, 10 + s, MPI_COMM_WORLD, &st2));
				EXPECT(st2.MPI_SOURCE == s && st2.MPI_TAG == 10 + s, "second probe: %d %d", st2.MPI_SOURCE,
				       st2.MPI_TAG);
				int *v = malloc(sizeof(int) * (size_t)(s + 1));
				OK(MPI_Recv(v, s + 1, MPI_INT, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, &st2));
				for (int i = 0; i <= s; i++) EXPECT(v[i] == s * 100 + i, "from %d: v[%d] = %d", s, i, v[i]);
				free(v);
			} else {
				EXPECT(st.MPI_TAG == 50, "from %d: tag %d second", s, st.MPI_TAG);
				OK(MPI_Get_count(&st, MPI_DOUBLE, &n));
				EXPECT(n == 2, "from %d: %d doubles", s, n);
				OK(MPI_Get_count(&st, MPI_INT64_T, &n));
				EXPECT(n == 2, "as int64: %d", n);
				OK(MPI_Get_count(&st, MPI_INT, &n));
				EXPECT(n == 4, "as int: %d", n);
				double d[2] = {0, 0};
				OK(MPI_Recv(d, n / 2, MPI_DOUBLE, s, 50, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
				EXPECT(d[0] == s + 0.5 && d[1] == s + 0.25, "from %d: %g %g", s, d[0], d[1]);
			}
		}
		for (int s = 1; s < np; s++) EXPECT(next[s] == 2, "%d probes of %d", next[s], s);
		OK(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st));
		EXPECT(!flag, "a message left over");
	}
	OK(MPI_Barrier(MPI_COMM_WORLD));

	/* 2. MPI_Iprobe is false until rank 1 sends, which it does when told;
	 * then true with the status, until a wildcard receive takes it. */
	if (me == 0) {
		for (int i = 0; i < 20; i++) {
			OK(MPI_Iprobe(1, 77, MPI_COMM_WORLD, &flag, &st));
			EXPECT(!flag, "a message before it was sent");
		}
		OK(MPI_Send(&go, 1, MPI_INT, 1, 1, MPI_COMM_WORLD));
		for (flag = 0; !flag;) OK(MPI_Iprobe(MPI_ANY_SOURCE, 77, MPI_COMM_WORLD, &flag, &st));
		OK(MPI_Get_count(&st, MPI_INT, &n));
		EXPECT(st.MPI_SOURCE == 1 && st.MPI_TAG == 77 && n == 3, "source %d tag %d count %d", st.MPI_SOURCE,
		       st.MPI_TAG, n);
		OK(MPI_Iprobe(1, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, &st));
		EXPECT(flag && st.MPI_TAG == 77, "again: flag %d tag %d", flag, st.MPI_TAG);
		int v[3] = {0};
		OK(MPI_Recv(v, 3, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st));
		EXPECT(v[0] == 7 && v[1] == 8 && v[2] == 9 && st.MPI_TAG == 77, "received %d %d %d", v[0], v[1], v[2]);
		OK(MPI_Iprobe(1, 77, MPI_COMM_WORLD, &flag, &st));
		EXPECT(!flag, "probed after it was received");
		/* MPI_PROC_NULL: at once, empty */
		OK(MPI_Probe(MPI_PROC_NULL, 3, MPI_COMM_WORLD, &st));
		OK(MPI_Get_count(&st, MPI_INT, &n));
		EXPECT(st.MPI_SOURCE == MPI_PROC_NULL && n == 0, "PROC_NULL: %d %d", st.MPI_SOURCE, n);
	} else if (me == 1) {
		int v[3] = {7, 8, 9};
		OK(MPI_Recv(&go, 1, MPI_INT, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
		OK(MPI_Send(v, 3, MPI_INT, 0, 77, MPI_COMM_WORLD));
	}
	OK(MPI_Barrier(MPI_COMM_WORLD));

	/* 3. A probe does not report the message an earlier posted receive
	 * takes: rank 1 sends 1 int then 2 with tag 88, and rank 0's probe,
	 * after its MPI_Irecv, sees the second. */
	if (me == 0) {
		int a = 0, b[2] = {0, 0};
		MPI_Request r;
		OK(MPI_Irecv(&a, 1, MPI_INT, 1, 88, MPI_COMM_WORLD, &r));
		OK(MPI_Send(&go, 1, MPI_INT, 1, 2, MPI_COMM_WORLD));
		OK(MPI_Probe(1, 88, MPI_COMM_WORLD, &st));
		OK(MPI_Get_count(&st, MPI_INT, &n));
		EXPECT(n == 2, "probe saw %d ints: the posted receive's message", n);
		OK(MPI_Wait(&r, &st));
		EXPECT(a == 31, "posted receive: %d", a);
		OK(MPI_Recv(b, 2, MPI_INT, 1, 88, MPI_COMM_WORLD, &st));
		EXPECT(b[0] == 32 && b[1] == 33, "second: %d %d", b[0], b[1]);
	} else if (me == 1) {
		int a = 31, b[2] = {32, 33};
		OK(MPI_Recv(&go, 1, MPI_INT, 0, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
		OK(MPI_Send(&a, 1, MPI_INT, 0, 88, MPI_COMM_WORLD));
		OK(MPI_Send(b, 2, MPI_INT, 0, 88, MPI_COMM_WORLD));
	}
	OK(MPI_Barrier(MPI_COMM_WORLD));

	/* 4. Cancelling: a pending receive is cancelled and takes nothing (the
	 * message sent afterwards goes to the next receive); a cancelled send
	 * still arrives (MPI lets the cancel fail); a receive from
	 * MPI_PROC_NULL is done, not cancelled. */
	if (me == 0) {
		int v = -1;
		MPI_Request r;
		OK(MPI_Irecv(&v, 1, MPI_INT, 1, 99, MPI_COMM_WORLD, &r));
		OK(MPI_Cancel(&r));
		OK(MPI_Wait(&r, &st));
		OK(MPI_Test_cancelled(&st, &flag));
		EXPECT(flag && r == MPI_REQUEST_NULL && v == -1, "cancelled: flag %d value %d", flag, v);
		OK(MPI_Irecv(&v, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &r));
		OK(MPI_Cancel(&r));
		for (flag = 0; !flag;) OK(MPI_Test(&r, &flag, &st));
		OK(MPI_Test_cancelled(&st, &flag));
		EXPECT(flag, "wildcard receive not cancelled");
		OK(MPI_Send(&go, 1, MPI_INT, 1, 3, MPI_COMM_WORLD));
		OK(MPI_Recv(&v, 1, MPI_INT, 1, 99, MPI_COMM_WORLD, &st));
		OK(MPI_Test_cancelled(&st, &flag));
		EXPECT(v == 555 && !flag, "after the cancel: %d, cancelled %d", v, flag);
		OK(MPI_Recv(&v, 1, MPI_INT, 1, 98, MPI_COMM_WORLD, &st));
		EXPECT(v == 556, "the cancelled send: %d", v);
		OK(MPI_Irecv(&v, 1, MPI_INT, MPI_PROC_NULL, 1, MPI_COMM_WORLD, &r));
		OK(MPI_Cancel(&r));
		OK(MPI_Wait(&r, &st));
		OK(MPI_Test_cancelled(&st, &flag));
		EXPECT(!flag, "a PROC_NULL receive cancelled");
		int bad = 12345, rc = MPI_Cancel(&bad), cls;
		MPI_Error_class(rc, &cls);
		EXPECT(cls == MPI_ERR_REQUEST, "invalid request: class %d", cls);
	} else if (me == 1) {
		int v = 555, w = 556;
		MPI_Request r;
		OK(MPI_Recv(&go, 1, MPI_INT, 0, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
		OK(MPI_Send(&v, 1, MPI_INT, 0, 99, MPI_COMM_WORLD));
		OK(MPI_Isend(&w, 1, MPI_INT, 0, 98, MPI_COMM_WORLD, &r));
		OK(MPI_Cancel(&r));
		OK(MPI_Wait(&r, &st));
		OK(MPI_Test_cancelled(&st, &flag));
		EXPECT(!flag, "a send reported cancelled");
	}
	OK(MPI_Barrier(MPI_COMM_WORLD));

	/* 5. Another thread waits for a receive whose message never comes:
	 * first the receive first in line (blocked in rvma's matching
	 * receive), then one behind another pending receive (between passes);
	 * MPI_Cancel from this thread ends each wait, cancelled. */
	for (int behind = 0; behind < 2; behind++) {
		MPI_Request first = MPI_REQUEST_NULL;
		int v = -1, u = -1;
		if (behind) OK(MPI_Irecv(&u, 1, MPI_INT, MPI_ANY_SOURCE, 200, MPI_COMM_WORLD, &first));
		struct waiter w = {.rc = -1};
		OK(MPI_Irecv(&v, 1, MPI_INT, MPI_ANY_SOURCE, 201, MPI_COMM_WORLD, &w.r));
		MPI_Request h = w.r;
		pthread_t t;
		EXPECT(pthread_create(&t, NULL, wait_for, &w) == 0, "pthread_create");
		sleep_ms(50); /* the thread is in MPI_Wait by now */
		OK(MPI_Cancel(&h));
		EXPECT(pthread_join(t, NULL) == 0, "pthread_join");
		EXPECT(w.rc == MPI_SUCCESS && w.r == MPI_REQUEST_NULL && v == -1, "behind %d: rc %d value %d", behind, w.rc,
		       v);
		OK(MPI_Test_cancelled(&w.st, &flag));
		EXPECT(flag, "behind %d: the waited-for receive not cancelled", behind);
		if (behind) {
			OK(MPI_Cancel(&first));
			OK(MPI_Wait(&first, &st));
			OK(MPI_Test_cancelled(&st, &flag));
			EXPECT(flag && u == -1, "the first receive: cancelled %d value %d", flag, u);
		}
	}

	OK(MPI_Barrier(MPI_COMM_WORLD));
	if (me == 0) printf("probe: ok on %d ranks\n", np);
	OK(MPI_Finalize());
	return 0;
}
