#!/usr/bin/env bash
# halo3d-lock-race.sh [PEERS_DIR]: shows that the lock variant of the
# halo3d MPI program in PEERS_DIR (default ../shared/peers, where this
# project's peer measurements live) depends on timing, under every MPI.
#
# Its passive-target variant counts the neighbours' notifications in one
# counter per rank and proceeds once it reaches (neighbours x iteration).
# A neighbour that is already one iteration ahead adds its next
# notification, so the count is reached while another neighbour has not
# yet put this iteration's face: the rank then computes on stale ghosts.
# Nothing in MPI orders those ranks; how often it happens depends on the
# scheduling of the ranks (4 ranks on fewer cores makes it frequent).
#
# The script builds a copy of the program (in a temporary directory; the
# program is not ours and is never copied into the repository) that keeps
# the same waiting logic but also counts each neighbour's notifications
# on its own, and prints "RACE" when a rank proceeds although some
# neighbour's count is behind. It runs it RUNS times (default 10) under
# rvmarun and, when installed, Open MPI and MPICH, 4 ranks, and prints per
# implementation: runs, runs with a race, runs whose checksum was wrong,
# and wrong runs without a race (always 0 if the program's race is the
# only cause). Then the same copy with the wait made per neighbour (the
# race removed): every run must be right.
set -euo pipefail
cd "$(dirname "$0")/.."
PEERS=${1:-../shared/peers}
SRC=$PEERS/mpi_halo3d.c
if [ ! -f "$SRC" ]; then
	echo "halo3d-lock-race: $SRC not found: nothing to check" >&2
	exit 0
fi
RUNS=${RUNS:-10}
ARGS=${ARGS:-"-n 16 -i 20 -w 2 -s sendrecv,lock"}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# detect: the same waits, plus one counter per side (window slots 2V+1..6).
sed -e 's|MPI_Accumulate(&one, 1, MPI_INT64_T, nbr\[d\]\[s\], 2 \* V, 1, MPI_INT64_T, MPI_SUM, win);|{ & MPI_Accumulate(\&one, 1, MPI_INT64_T, nbr[d][s], 2 * V + 1 + 2 * d + (1 - s), 1, MPI_INT64_T, MPI_SUM, win); }|' \
	-e 's|^\( *\)MPI_Win_sync(win); // remote puts visible.*|\1for (int k = 0; k < 6; k++) { if (nbr[k / 2][k % 2] == MPI_PROC_NULL) continue; int64_t g2; MPI_Fetch_and_op(NULL, \&g2, MPI_INT64_T, rank, 2 * V + 1 + k, MPI_NO_OP, win); MPI_Win_flush(rank, win); if (g2 < iter) fprintf(stderr, "RACE rank %d iter %ld side %d\\n", rank, iter, k); }\n&|' \
	-e 's|\*(int64_t \*)(base + 2 \* V) = 0;|for (int k = 0; k < 7; k++) *(int64_t *)(base + 2 * V + k) = 0;|' \
	-e 's|(MPI_Aint)(2 \* V + 1) \* sizeof(double)|(MPI_Aint)(2 * V + 7) * sizeof(double)|' \
	"$SRC" >"$OUT/detect.c"
# fixed: wait until every neighbour's own count reaches the iteration.
sed -e 's|} while (got < want);|} while (got < want);\n        for (int k = 0; k < 6; k++) { if (nbr[k / 2][k % 2] == MPI_PROC_NULL) continue; do { MPI_Fetch_and_op(NULL, \&got, MPI_INT64_T, rank, 2 * V + 1 + k, MPI_NO_OP, win); MPI_Win_flush(rank, win); } while (got < iter); }|' \
	"$OUT/detect.c" >"$OUT/fixed.c"
for f in detect fixed; do
	grep -q 'RACE rank' "$OUT/$f.c" && grep -q '2 \* V + 7' "$OUT/$f.c" || {
		echo "halo3d-lock-race: $SRC changed; the script's edits no longer apply" >&2
		exit 1
	}
done

make -s lib libmpi build >/dev/null
impls=(rvma)
mpi/rvmacc -O2 -o "$OUT/detect_rvma" "$OUT/detect.c" -lm
mpi/rvmacc -O2 -o "$OUT/fixed_rvma" "$OUT/fixed.c" -lm
if command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null; then
	mpicc.openmpi -O2 -o "$OUT/detect_ompi" "$OUT/detect.c" -lm
	mpicc.openmpi -O2 -o "$OUT/fixed_ompi" "$OUT/fixed.c" -lm
	impls+=(ompi)
fi
if command -v mpicc.mpich >/dev/null && command -v mpirun.mpich >/dev/null; then
	mpicc.mpich -O2 -o "$OUT/detect_mpich" "$OUT/detect.c" -lm
	mpicc.mpich -O2 -o "$OUT/fixed_mpich" "$OUT/fixed.c" -lm
	impls+=(mpich)
fi

launch() {
	case $1 in
	rvma) echo "bin/rvmarun -n 4" ;;
	ompi) echo "mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to none --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo -n 4" ;;
	mpich) echo "mpirun.mpich -iface lo -bind-to none -n 4" ;;
	esac
}

printf '%-8s %-7s %5s %6s %6s %14s\n' program impl runs races wrong wrong-no-race
for prog in detect fixed; do
	for impl in "${impls[@]}"; do
		races=0 wrong=0 silent=0
		for _ in $(seq "$RUNS"); do
			# shellcheck disable=SC2046,SC2086
			out=$(timeout -k 5 60 $(launch "$impl") "$OUT/${prog}_$impl" $ARGS 2>&1 || true)
			r=0
			if grep -q 'RACE rank' <<<"$out"; then r=1; fi
			races=$((races + r))
			if ! grep '"sync":"lock"' <<<"$out" | grep -q '"ok":true'; then
				wrong=$((wrong + 1))
				silent=$((silent + 1 - r))
			fi
		done
		printf '%-8s %-7s %5d %6d %6d %14d\n' "$prog" "$impl" "$RUNS" "$races" "$wrong" "$silent"
	done
done
