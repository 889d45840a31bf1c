/* Accumulates that rvma has no single atomic for, values checked:
 * long double with every operation, the value-and-index pairs with a gap
 * (MPI_SHORT_INT, MPI_LONG_INT, MPI_DOUBLE_INT, MPI_LONG_DOUBLE_INT) and
 * MINLOC and MAXLOC on every pair, the logical operations on integers and
 * MPI_C_BOOL; in accumulate, get_accumulate, fetch_and_op and their
 * request forms, under fence and lock_all, from every rank at once into
 * one place (a lost update shows in the sums); the reductions of the same
 * operations; the errors. Prints "accops: ok on N ranks". */
#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "check.h"

enum { K = 40 };

struct ldi {
	long double v;
	int i;
};
struct di {
	double v;
	int i;
};
struct li {
	long v;
	int i;
};
struct si {
	short v;
	int i;
};

/* The target: rank 0's window, laid out as C lays these out. */
struct area {
	long double sum, fop, rep;
	struct ldi ldi[2];
	struct di di[2];
	struct li li[2];
	struct si si[2];
	int ii[2][2];
	int land, lor, lxor;
	long long lxor64;
	char land8;
	bool b;
	int parity;
};

#define AT(f) ((MPI_Aint)offsetof(struct area, f))

int main(int argc, char **argv) {
	int np = start(&argc, &argv);
	struct area *a;
	MPI_Win win;
	OK(MPI_Win_allocate(sizeof *a, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &a, &win));
	OK(MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN));
	memset(a, 0, sizeof *a);
	/* The gaps of the pairs at the target hold a pattern that no
	 * accumulate may touch. */
	for (int k = 0; k < 2; k++) {
		memset(&a->di[k], 0x5a, sizeof a->di[k]);
		memset(&a->si[k], 0x5a, sizeof a->si[k]);
		a->di[k].v = -1e300, a->di[k].i = 1000;
		a->si[k].v = 32767, a->si[k].i = 1000;
		a->li[k].v = -1, a->li[k].i = 1000;
		a->ldi[k].v = -1, a->ldi[k].i = 1000;
	}
	a->ii[0][0] = -1, a->ii[0][1] = 1000, a->ii[1][0] = 1 << 30, a->ii[1][1] = 1000;
	a->land = 1, a->lor = 0, a->lxor = 0, a->lxor64 = 0, a->land8 = 1, a->b = true;
	OK(MPI_Barrier(MPI_COMM_WORLD));

	/* Every rank at once, K times, under lock_all: long double sums
	 * through accumulate, fetch_and_op and raccumulate. */
	OK(MPI_Win_lock_all(0, win));
	long double one = 1, two = 2, got;
	for (int k = 0; k < K; k++) {
		OK(MPI_Accumulate(&one, 1, MPI_LONG_DOUBLE, 0, AT(sum), 1, MPI_LONG_DOUBLE, MPI_SUM, win));
		OK(MPI_Fetch_and_op(&two, &got, MPI_LONG_DOUBLE, 0, AT(fop), MPI_SUM, win));
		EXPECT(got >= 0 && got <= 2.0L * (np * K - 1) && (long long)got % 2 == 0, "fetched %Lg", got);
		MPI_Request r;
		OK(MPI_Raccumulate(&one, 1, MPI_LONG_DOUBLE, 0, AT(sum), 1, MPI_LONG_DOUBLE, MPI_SUM, win, &r));
		OK(MPI_Wait(&r, MPI_STATUS_IGNORE));
		/* LXOR of 1 toggles: parity of every rank's toggles */
		int t = 1;
		OK(MPI_Accumulate(&t, 1, MPI_INT, 0, AT(parity), 1, MPI_INT, MPI_LXOR, win));
	}
	/* MAXLOC of the value me (ties: the lowest index, so rank 0's even
	 * ranks tie) and MINLOC of -me, on every pair type. */
	struct ldi ldi = {me / 2, me};
	struct di di = {me / 2, me};
	struct li li = {me / 2, me};
	struct si si = {(short)(-(me / 2)), me};
	int ii[2] = {me / 2, me};
	OK(MPI_Accumulate(&ldi, 1, MPI_LONG_DOUBLE_INT, 0, AT(ldi[0]), 1, MPI_LONG_DOUBLE_INT, MPI_MAXLOC, win));
	OK(MPI_Accumulate(&di, 1, MPI_DOUBLE_INT, 0, AT(di[0]), 1, MPI_DOUBLE_INT, MPI_MAXLOC, win));
	OK(MPI_Accumulate(&li, 1, MPI_LONG_INT, 0, AT(li[0]), 1, MPI_LONG_INT, MPI_MAXLOC, win));
	OK(MPI_Accumulate(&si, 1, MPI_SHORT_INT, 0, AT(si[0]), 1, MPI_SHORT_INT, MPI_MINLOC, win));
	OK(MPI_Accumulate(ii, 1, MPI_2INT, 0, AT(ii[0]), 1, MPI_2INT, MPI_MAXLOC, win));
	/* Logical operations: one rank's 0 makes LAND 0, one rank's 1 makes
	 * LOR and LXOR 1; every rank's 1 makes LXOR the parity of np. */
	int z = me != np - 1, o = me == np - 1;
	long long o64 = 1;
	char z8 = me != 0;
	bool bf = me != 0;
	OK(MPI_Accumulate(&z, 1, MPI_INT, 0, AT(land), 1, MPI_INT, MPI_LAND, win));
	OK(MPI_Accumulate(&o, 1, MPI_INT, 0, AT(lor), 1, MPI_INT, MPI_LOR, win));
	OK(MPI_Accumulate(&o, 1, MPI_INT, 0, AT(lxor), 1, MPI_INT, MPI_LXOR, win));
	OK(MPI_Accumulate(&o64, 1, MPI_LONG_LONG, 0, AT(lxor64), 1, MPI_LONG_LONG, MPI_LXOR, win));
	OK(MPI_Accumulate(&z8, 1, MPI_CHAR, 0, AT(land8), 1, MPI_CHAR, MPI_LAND, win));
	OK(MPI_Accumulate(&bf, 1, MPI_C_BOOL, 0, AT(b), 1, MPI_C_BOOL, MPI_LAND, win));
	OK(MPI_Win_unlock_all(win));
	OK(MPI_Barrier(MPI_COMM_WORLD));
	if (me == 0) {
		EXPECT(a->sum == 2.0L * np * K, "long double sum %Lg, want %d", a->sum, 2 * np * K);
		EXPECT(a->fop == 2.0L * np * K, "long double fetch_and_op sum %Lg, want %d", a->fop, 2 * np * K);
		EXPECT(a->parity == (np * K) % 2, "LXOR parity %d", a->parity);
		int hi = (np - 1) / 2, hiIdx = 2 * hi; /* the lowest rank with the highest value */
		EXPECT(a->ldi[0].v == hi && a->ldi[0].i == hiIdx, "LONG_DOUBLE_INT MAXLOC (%Lg, %d)", a->ldi[0].v,
		       a->ldi[0].i);
		EXPECT(a->di[0].v == hi && a->di[0].i == hiIdx, "DOUBLE_INT MAXLOC (%g, %d)", a->di[0].v, a->di[0].i);
		EXPECT(a->li[0].v == hi && a->li[0].i == hiIdx, "LONG_INT MAXLOC (%ld, %d)", a->li[0].v, a->li[0].i);
		EXPECT(a->si[0].v == -hi && a->si[0].i == hiIdx, "SHORT_INT MINLOC (%d, %d)", a->si[0].v, a->si[0].i);
		EXPECT(a->ii[0][0] == hi && a->ii[0][1] == hiIdx, "2INT MAXLOC (%d, %d)", a->ii[0][0], a->ii[0][1]);
		EXPECT(a->land == 0 && a->lor == 1 && a->lxor == 1, "LAND %d LOR %d LXOR %d", a->land,
		       a->lor, a->lxor);
		EXPECT(a->lxor64 == np % 2, "LXOR of long long: %lld", a->lxor64);
		EXPECT(a->land8 == 0, "LAND of char: %d", a->land8);
		EXPECT(!a->b, "LAND of C_BOOL: %d", a->b);
		/* The gaps are as they were. */
		unsigned char *g = (unsigned char *)&a->di[0] + offsetof(struct di, i) + sizeof(int);
		for (size_t k = 0; k < sizeof a->di[0] - offsetof(struct di, i) - sizeof(int); k++)
			EXPECT(g[k] == 0x5a, "DOUBLE_INT gap byte %zu: %x", k, g[k]);
		g = (unsigned char *)&a->si[0] + sizeof(short);
		for (size_t k = 0; k < offsetof(struct si, i) - sizeof(short); k++)
			EXPECT(g[k] == 0x5a, "SHORT_INT gap byte %zu: %x", k, g[k]);
	}
	OK(MPI_Barrier(MPI_COMM_WORLD));

	/* Under fence: get_accumulate and fetch_and_op return what was
	 * there; two pairs at once; replace and fetch whole. Rank r works on
	 * rank 0's second pairs in turn, so the values are known. */
	OK(MPI_Win_fence(0, win));
	for (int r = 0; r < np; r++) {
		if (me == r) {
			struct di in[2] = {{100 + r, r}, {-5, r}}, out[2];
			OK(MPI_Get_accumulate(in, 2, MPI_DOUBLE_INT, out, 2, MPI_DOUBLE_INT, 0, AT(di[0]), 2, MPI_DOUBLE_INT,
			                      MPI_MAXLOC, win));
			if (r == 0)
				EXPECT(out[0].v == (np - 1) / 2 && out[1].v == -1e300 && out[1].i == 1000,
				       "get_accumulate MAXLOC fetched (%g, %d) (%g, %d)", out[0].v, out[0].i, out[1].v, out[1].i);
			else
				EXPECT(out[0].v == 100 + r - 1 && out[0].i == r - 1 && out[1].v == -5 && out[1].i == 0,
				       "get_accumulate MAXLOC fetched (%g, %d) (%g, %d)", out[0].v, out[0].i, out[1].v, out[1].i);
			int in2[2] = {r, r}, out2[2];
			OK(MPI_Fetch_and_op(in2, out2, MPI_2INT, 0, AT(ii[1]), MPI_MINLOC, win));
			EXPECT(out2[0] == (r == 0 ? 1 << 30 : 0) && out2[1] == (r == 0 ? 1000 : 0), "2INT MINLOC fetched (%d, %d)",
			       out2[0], out2[1]);
			long double ld = 7 + r, old;
			OK(MPI_Fetch_and_op(&ld, &old, MPI_LONG_DOUBLE, 0, AT(rep), MPI_REPLACE, win));
			EXPECT(old == (r == 0 ? 0 : 7 + r - 1), "long double replace fetched %Lg", old);
			OK(MPI_Fetch_and_op(NULL, &old, MPI_LONG_DOUBLE, 0, AT(rep), MPI_NO_OP, win));
			EXPECT(old == 7 + r, "long double fetch %Lg", old);
			struct si s = {(short)r, r}, so;
			OK(MPI_Get_accumulate(&s, 1, MPI_SHORT_INT, &so, 1, MPI_SHORT_INT, 0, AT(si[1]), 1, MPI_SHORT_INT,
			                      MPI_REPLACE, win));
			EXPECT(so.v == (r == 0 ? 32767 : r - 1) && so.i == (r == 0 ? 1000 : r - 1), "SHORT_INT replace (%d, %d)",
			       so.v, so.i);
		}
		OK(MPI_Win_fence(0, win));
	}
	if (me == 0)
		EXPECT(a->di[0].v == 100 + np - 1 && a->di[0].i == np - 1 && a->di[1].v == -5 && a->di[1].i == 0,
		       "DOUBLE_INT pairs (%g, %d) (%g, %d)", a->di[0].v, a->di[0].i, a->di[1].v, a->di[1].i);

	/* Errors: what the operation does not apply to, and compare-and-swap
	 * of elements it does not take. */
	long double ld = 1, ldc = 0, ldr;
	EXPECT(MPI_Compare_and_swap(&ld, &ldc, &ldr, MPI_LONG_DOUBLE, 0, AT(rep), win) == MPI_ERR_TYPE,
	       "compare_and_swap of long double");
	EXPECT(MPI_Accumulate(&di, 1, MPI_DOUBLE_INT, 0, AT(di[0]), 1, MPI_DOUBLE_INT, MPI_SUM, win) == MPI_ERR_OP,
	       "SUM of pairs");
	EXPECT(MPI_Accumulate(&ld, 1, MPI_LONG_DOUBLE, 0, AT(sum), 1, MPI_LONG_DOUBLE, MPI_BXOR, win) == MPI_ERR_OP,
	       "BXOR of long double");
	double d = 1;
	EXPECT(MPI_Accumulate(&d, 1, MPI_DOUBLE, 0, 0, 1, MPI_DOUBLE, MPI_LAND, win) == MPI_ERR_OP, "LAND of double");
	EXPECT(MPI_Accumulate(&d, 1, MPI_DOUBLE, 0, 0, 1, MPI_DOUBLE, MPI_MAXLOC, win) == MPI_ERR_OP, "MAXLOC of double");
	EXPECT(MPI_Accumulate(&ld, 1, MPI_LONG_DOUBLE, 0, AT(sum), 1, MPI_DOUBLE, MPI_SUM, win) == MPI_ERR_TYPE,
	       "long double origin, double target");
	OK(MPI_Win_fence(0, win));
	OK(MPI_Win_free(&win));

	/* Reductions of the same operations. */
	struct di rd[2] = {{me % 3, me}, {-me, me}}, rdo[2];
	OK(MPI_Allreduce(rd, rdo, 2, MPI_DOUBLE_INT, MPI_MAXLOC, MPI_COMM_WORLD));
	int m3 = np < 3 ? np - 1 : 2;
	EXPECT(rdo[0].v == m3 && rdo[0].i == m3 && rdo[1].v == 0 && rdo[1].i == 0, "allreduce DOUBLE_INT MAXLOC");
	struct si rs = {(short)(me % 2), me}, rso;
	OK(MPI_Allreduce(&rs, &rso, 1, MPI_SHORT_INT, MPI_MINLOC, MPI_COMM_WORLD));
	EXPECT(rso.v == 0 && rso.i == 0, "allreduce SHORT_INT MINLOC (%d, %d)", rso.v, rso.i);
	struct ldi rl = {me, me}, rlo;
	OK(MPI_Reduce(&rl, &rlo, 1, MPI_LONG_DOUBLE_INT, MPI_MAXLOC, 0, MPI_COMM_WORLD));
	if (me == 0) EXPECT(rlo.v == np - 1 && rlo.i == np - 1, "reduce LONG_DOUBLE_INT MAXLOC");
	int p2[2] = {me, me}, p2o[2];
	OK(MPI_Allreduce(p2, p2o, 1, MPI_2INT, MPI_MINLOC, MPI_COMM_WORLD));
	EXPECT(p2o[0] == 0 && p2o[1] == 0, "allreduce 2INT MINLOC");
	long double sum = me + 0.5L, sumo;
	OK(MPI_Allreduce(&sum, &sumo, 1, MPI_LONG_DOUBLE, MPI_SUM, MPI_COMM_WORLD));
	EXPECT(sumo == np * (np - 1) / 2.0L + np * 0.5L, "allreduce long double sum %Lg", sumo);
	int lx = 1, lxo;
	OK(MPI_Allreduce(&lx, &lxo, 1, MPI_INT, MPI_LXOR, MPI_COMM_WORLD));
	EXPECT(lxo == np % 2, "allreduce LXOR %d", lxo);
	EXPECT(MPI_Allreduce(&lx, &lxo, 1, MPI_INT, MPI_MAXLOC, MPI_COMM_WORLD) == MPI_ERR_OP, "allreduce MAXLOC of int");

	OK(MPI_Finalize());
	if (me == 0) printf("accops: ok on %d ranks\n", np);
	return 0;
}
