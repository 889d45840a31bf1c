/* Accumulates and atomics on 1- and 2-byte integers (MPI_CHAR,
 * MPI_UNSIGNED_CHAR, MPI_SHORT, MPI_INT8_T, MPI_UINT16_T), as osu_acc_latency
 * uses: every rank adds into rank 0's window, values checked byte by byte,
 * including the bytes around each element (updated through the 4-byte word
 * that holds it). Prints "narrow: ok on N ranks". */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

enum { N = 64 };

int main(int argc, char **argv) {
	int np = start(&argc, &argv);
	/* Bytes 0..N-1: chars; N..3N-1: N/... shorts; the rest a guard. */
	uint8_t *base;
	MPI_Win win;
	OK(MPI_Win_allocate(4 * N, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win));
	memset(base, 0xa5, 4 * N);
	for (int i = 0; i < N; i++) base[i] = (uint8_t)i;
	int16_t *shorts = (int16_t *)(base + N);
	for (int i = 0; i < N; i++) shorts[i] = (int16_t)(-1000 + i);
	OK(MPI_Barrier(MPI_COMM_WORLD));

	char add[N];
	int16_t mx[N];
	for (int i = 0; i < N; i++) {
		add[i] = (char)(me + 1);
		mx[i] = (int16_t)(i * 10 - me);
	}
	OK(MPI_Win_lock_all(0, win));
	/* Every other char: a sum from every rank; the chars between stay. */
	MPI_Datatype every2;
	OK(MPI_Type_vector(N / 2, 1, 2, MPI_CHAR, &every2));
	OK(MPI_Type_commit(&every2));
	OK(MPI_Accumulate(add, N / 2, MPI_CHAR, 0, 0, 1, every2, MPI_SUM, win));
	OK(MPI_Accumulate(mx, N, MPI_SHORT, 0, N, N, MPI_SHORT, MPI_MAX, win));
	OK(MPI_Win_flush_all(win));
	OK(MPI_Win_unlock_all(win));
	OK(MPI_Barrier(MPI_COMM_WORLD));

	if (me == 0) {
		int total = np * (np + 1) / 2;
		OK(MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win));
		for (int i = 0; i < N; i++) {
			uint8_t want = (uint8_t)(i % 2 == 0 ? i + total : i);
			EXPECT(base[i] == want, "char %d: %d, want %d", i, base[i], want);
			int16_t w = (int16_t)(i * 10 > -1000 + i ? i * 10 : -1000 + i);
			EXPECT(shorts[i] == w, "short %d: %d, want %d", i, shorts[i], w);
		}
		for (int i = 3 * N; i < 4 * N; i++) EXPECT(base[i] == 0xa5, "guard byte %d: %#x", i, base[i]);
		OK(MPI_Win_unlock(0, win));
	}
	OK(MPI_Barrier(MPI_COMM_WORLD));

	/* Fetch-and-op and compare-and-swap on one byte and one short of the
	 * last rank's window, from rank 0; every rank checks its own after. */
	if (me == 0) {
		int t = np - 1;
		uint8_t one = 7, old8;
		uint16_t cmp = 0xa5a5, swap = 0x1234, old16;
		int8_t neg = -3, oldi;
		OK(MPI_Win_lock(MPI_LOCK_EXCLUSIVE, t, 0, win));
		OK(MPI_Fetch_and_op(&one, &old8, MPI_UNSIGNED_CHAR, t, 5, MPI_SUM, win));
		OK(MPI_Fetch_and_op(&neg, &oldi, MPI_INT8_T, t, 6, MPI_SUM, win));
		OK(MPI_Compare_and_swap(&swap, &cmp, &old16, MPI_UINT16_T, t, 3 * N + 2, win));
		OK(MPI_Win_unlock(t, win));
		EXPECT(old8 == (t == 0 ? 5 + np * (np + 1) / 2 : 5), "fetched %d", old8);
		EXPECT(oldi == (t == 0 ? 6 : 6), "fetched %d", oldi);
		EXPECT(old16 == 0xa5a5, "compare_and_swap fetched %#x", old16);
	}
	OK(MPI_Barrier(MPI_COMM_WORLD));
	if (me == np - 1) {
		uint8_t w5 = (uint8_t)((me == 0 ? 5 + np * (np + 1) / 2 : 5) + 7);
		EXPECT(base[5] == w5, "byte 5: %d, want %d", base[5], w5);
		EXPECT(base[6] == 3, "byte 6: %d, want 3", base[6]);
		EXPECT(base[3 * N + 2] == 0x34 && base[3 * N + 3] == 0x12, "short swapped: %#x %#x", base[3 * N + 2], base[3 * N + 3]);
		EXPECT(base[3 * N + 1] == 0xa5 && base[3 * N + 4] == 0xa5, "bytes beside the short changed");
	}
	OK(MPI_Type_free(&every2));
	OK(MPI_Win_free(&win));
	if (me == 0) printf("narrow: ok on %d ranks\n", np);
	OK(MPI_Finalize());
	return 0;
}
