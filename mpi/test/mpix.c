/* mpix_rvma.h: notified windows with per-origin and aggregate
 * expectations (MPI_Put into them, MPIX_Win_wait_epoch/test_epoch with the
 * data in place and no MPI synchronisation), rewind from the history, the
 * transport report, and their errors. argv[1], if given, is the provider
 * every other rank must be reached over. Prints "mpix: ok on N ranks". */
#include <mpi.h>
#include <mpix_rvma.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#define CLASS(want, call)                                                                          \
	do {                                                                                       \
		int cls_ = -1;                                                                     \
		MPI_Error_class((call), &cls_);                                                    \
		EXPECT(cls_ == (want), "%s: class %d, want %s", #call, cls_, #want);               \
	} while (0)

enum { EPOCHS = 10, N = 4 };

static int64_t val(int origin, int epoch, int i) { return origin * 1000000 + epoch * 1000 + i; }

int main(int argc, char **argv) {
	int np = start(&argc, &argv);
	int next = (me + 1) % np, prev = (me + np - 1) % np;

	/* Per origin: N int64 from prev complete an epoch; puts go round four
	 * slots (an origin runs at most depth = 2 epochs ahead of what its
	 * target has waited for, so it never overwrites the slot the target
	 * is reading). */
	MPI_Count expect = N * 8, ep = -1;
	MPIX_Notify nc = {0};
	nc.nfrom = 1, nc.from_ranks = &prev, nc.from_counts = &expect;
	int64_t *base, out[EPOCHS][N];
	MPI_Win win;
	OK(MPIX_Win_allocate_notified(4 * N * 8, 8, &nc, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win));
	OK(MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN));
	for (int e = 1; e <= EPOCHS; e++) {
		for (int i = 0; i < N; i++) out[e - 1][i] = val(me, e, i);
		OK(MPI_Put(out[e - 1], N, MPI_INT64_T, next, (e % 4) * N, N, MPI_INT64_T, win));
		if (e % 2) {
			OK(MPIX_Win_wait_epoch(win, &ep));
		} else {
			int flag = 0;
			while (!flag) OK(MPIX_Win_test_epoch(win, &flag, &ep));
		}
		EXPECT(ep == e, "epoch %lld, want %d", ep, e);
		for (int i = 0; i < N; i++)
			EXPECT(base[(e % 4) * N + i] == val(prev, e, i), "epoch %d word %d: %lld", e, i,
			       (long long)base[(e % 4) * N + i]);
	}
	OK(MPI_Win_flush_all(win));
	OK(MPIX_Win_epoch(win, &ep));
	EXPECT(ep == EPOCHS, "epochs %lld", ep);
	int flag = 1;
	OK(MPIX_Win_test_epoch(win, &flag, &ep));
	EXPECT(!flag, "an epoch completed with nothing put");
	if (np > 2) /* a rank the target does not expect */
		CLASS(MPI_ERR_RMA_SYNC, MPI_Put(out[0], 1, MPI_INT64_T, (me + 2) % np, 0, 1, MPI_INT64_T, win));
	CLASS(MPI_ERR_RMA_RANGE, MPIX_Win_rewind(win, 1, &ep)); /* no history */

	/* The transport report: the neighbours were reached over the
	 * provider (argv[1] when given), and the name fits. */
	char name[MPIX_MAX_TRANSPORT_NAME];
	int len = -1;
	OK(MPIX_Comm_transport(MPI_COMM_WORLD, next, name, &len));
	EXPECT(len == (int)strlen(name) && (!strcmp(name, "shm") || !strcmp(name, "udp")), "to %d: \"%s\"", next, name);
	if (argc > 1) EXPECT(!strcmp(name, argv[1]), "to %d over %s, want %s", next, name, argv[1]);
	CLASS(MPI_ERR_RANK, MPIX_Comm_transport(MPI_COMM_WORLD, np, name, &len));
	CLASS(MPI_ERR_COMM, MPIX_Comm_transport((MPI_Comm)999, 0, name, &len));
	OK(MPI_Barrier(MPI_COMM_WORLD));
	OK(MPI_Win_free(&win));

	/* Aggregate, counting puts, over the caller's memory: rank 0 expects
	 * one put from every other rank. */
	int64_t *words = calloc((size_t)np, 8);
	MPIX_Notify agg = {0};
	agg.expect = np - 1, agg.count = MPIX_NOTIFY_PUTS;
	OK(MPIX_Win_create_notified(words, np * 8, 8, &agg, MPI_INFO_NULL, MPI_COMM_WORLD, &win));
	if (me != 0) {
		int64_t v = 1000 + me;
		OK(MPI_Put(&v, 1, MPI_INT64_T, 0, me, 1, MPI_INT64_T, win));
		OK(MPI_Win_flush(0, win));
	} else {
		OK(MPIX_Win_wait_epoch(win, &ep));
		EXPECT(ep == 1, "aggregate epoch %lld", ep);
		for (int o = 1; o < np; o++) EXPECT(words[o] == 1000 + o, "word %d: %lld", o, (long long)words[o]);
	}
	OK(MPI_Barrier(MPI_COMM_WORLD));
	OK(MPI_Win_free(&win));
	free(words);

	/* History and rewind: three epochs of different data at one place;
	 * roll back two, find epoch 2's data, redo the third. */
	nc.history = 2;
	OK(MPIX_Win_allocate_notified(N * 8, 8, &nc, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win));
	OK(MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN));
	for (int e = 1; e <= 3; e++) {
		OK(MPI_Put(out[e - 1], N, MPI_INT64_T, next, 0, N, MPI_INT64_T, win));
		OK(MPIX_Win_wait_epoch(win, &ep));
		EXPECT(ep == e && base[N - 1] == val(prev, e, N - 1), "epoch %lld: %lld", ep, (long long)base[N - 1]);
		OK(MPI_Win_flush_all(win));
		OK(MPI_Barrier(MPI_COMM_WORLD));
	}
	CLASS(MPI_ERR_RMA_RANGE, MPIX_Win_rewind(win, 3, &ep));
	memset(base, 0, N * 8);
	OK(MPIX_Win_rewind(win, 2, &ep));
	EXPECT(ep == 2, "rewound to %lld", ep);
	for (int i = 0; i < N; i++) EXPECT(base[i] == val(prev, 2, i), "rewound word %d: %lld", i, (long long)base[i]);
	OK(MPIX_Win_epoch(win, &ep));
	EXPECT(ep == 2, "epoch after rewind %lld", ep);
	OK(MPI_Barrier(MPI_COMM_WORLD));
	OK(MPI_Put(out[7], N, MPI_INT64_T, next, 0, N, MPI_INT64_T, win));
	OK(MPIX_Win_wait_epoch(win, &ep));
	EXPECT(ep == 3 && base[0] == val(prev, 8, 0), "redone epoch %lld: %lld", ep, (long long)base[0]);
	OK(MPI_Win_flush_all(win));
	OK(MPI_Barrier(MPI_COMM_WORLD));
	OK(MPIX_Win_abandon_epoch(win));
	OK(MPI_Barrier(MPI_COMM_WORLD));
	OK(MPI_Win_free(&win));

	/* A plain window has no epochs; bad configurations. */
	OK(MPI_Win_allocate(8, 8, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win));
	OK(MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN));
	CLASS(MPI_ERR_RMA_SYNC, MPIX_Win_wait_epoch(win, &ep));
	CLASS(MPI_ERR_RMA_SYNC, MPIX_Win_rewind(win, 1, &ep));
	CLASS(MPI_ERR_WIN, MPIX_Win_wait_epoch((MPI_Win)4321, &ep));
	OK(MPI_Win_free(&win));
	CLASS(MPI_ERR_ARG, MPIX_Win_allocate_notified(8, 8, NULL, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win));
	int bad = np;
	MPIX_Notify nb = {0};
	nb.nfrom = 1, nb.from_ranks = &bad, nb.from_counts = &expect;
	CLASS(MPI_ERR_RANK, MPIX_Win_allocate_notified(8, 8, &nb, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win));

	OK(MPI_Barrier(MPI_COMM_WORLD));
	if (me == 0) printf("mpix: ok on %d ranks\n", np);
	OK(MPI_Finalize());
	return 0;
}
