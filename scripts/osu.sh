#!/bin/sh
# osu.sh: the OSU Micro-Benchmarks' one-sided tests built from an OSU
# source tree (not part of this repository: e.g. the mvapich tarball,
# osu-micro-benchmarks-5.x) with rvmacc, and with mpicc.mpich and
# mpicc.openmpi when they are installed, run on 2 ranks under rvmarun,
# mpiexec.hydra and mpirun.openmpi, one run at a time, printed as one table:
# each test, window creation (-w) and synchronisation (-s), and per message
# size the median over RUNS runs of each implementation's figure.
#
#   scripts/osu.sh OSU_DIR
#
# OSU_DIR is the tree's root (with mpi/one-sided/) or that folder itself.
# Environment (defaults in brackets):
#   IMPLS     implementations [rvma, then mpich and ompi if installed]
#   TESTS     tests [put_latency get_latency put_bw get_bw put_bibw
#             acc_latency get_acc_latency fop_latency cas_latency]
#   WINS      window creations [create allocate dynamic]
#   SYNCS     synchronisations [each test's own: lock pscw fence flush
#             flush_local lock_all; put_bibw: pscw fence]
#   SIZES     message sizes to print, space separated [all]
#   ITERS     -i (iterations of the small sizes) [1000]; SKIP: -x [100]
#   RUNS      runs per cell, median printed [1]
#   PROVIDER  rvmarun --provider [auto]
#   NETWORK   1: every implementation over the loopback network instead of
#             shared memory: rvma over udp, MPICH's UCX over tcp on lo,
#             Open MPI's ob1/tcp with osc pt2pt [0]
#   OUT       build and log directory [a new temporary one]
#   TIMEOUT   seconds per run [300]
# A cell is a number, "unsup" when the implementation refused the
# configuration with MPI_ERR_UNSUPPORTED_OPERATION (rvma: dynamic windows,
# 1-byte accumulates; the message is in OUT/log), or "FAIL" (then the
# script exits 1 at the end, the command and output in OUT/log); a number
# with "*" is the median of the runs that did not fail when some did.
set -u
[ $# -ge 1 ] || { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
SRC=$1
[ -d "$SRC/mpi/one-sided" ] && SRC=$SRC/mpi/one-sided
[ -f "$SRC/osu_1sc.c" ] || { echo "osu.sh: no osu_1sc.c in $SRC" >&2; exit 2; }
SRC=$(cd "$SRC" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$(mktemp -d /tmp/osu.XXXXXX)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
LOG=$OUT/log
: >"$LOG"
TESTS=${TESTS:-put_latency get_latency put_bw get_bw put_bibw acc_latency get_acc_latency fop_latency cas_latency}
WINS=${WINS:-create allocate dynamic}
ITERS=${ITERS:-1000}
SKIP=${SKIP:-100}
RUNS=${RUNS:-1}
PROVIDER=${PROVIDER:-auto}
TIMEOUT=${TIMEOUT:-300}
if [ -z "${IMPLS:-}" ]; then
	IMPLS=rvma
	command -v mpicc.mpich >/dev/null && command -v mpiexec.hydra >/dev/null && IMPLS="$IMPLS mpich"
	command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null && IMPLS="$IMPLS ompi"
fi
echo "osu.sh: sources $SRC, output $OUT, implementations: $IMPLS" >&2

# ---- build ----
cc_of() {
	case $1 in
	rvma) echo "$ROOT/mpi/rvmacc" ;;
	mpich) echo mpicc.mpich ;;
	ompi) echo mpicc.openmpi ;;
	esac
}
if echo " $IMPLS " | grep -q " rvma "; then
	(cd "$ROOT" && make -s lib >>"$LOG" 2>&1 && go build -o bin/rvmarun ./cmd/rvmarun >>"$LOG" 2>&1) ||
		{ echo "osu.sh: make lib or building rvmarun failed (see $LOG)" >&2; exit 1; }
fi
for impl in $IMPLS; do
	mkdir -p "$OUT/$impl"
	for t in $TESTS; do
		# the tests that include osu_1sc.h share osu_1sc.c (OSU 5.x's
		# osu_get_acc_latency.c stands alone)
		extra=
		grep -q '"osu_1sc.h"' "$SRC/osu_$t.c" && extra=$SRC/osu_1sc.c
		echo "== build $impl osu_$t" >>"$LOG"
		$(cc_of "$impl") -O2 -I"$SRC" -o "$OUT/$impl/osu_$t" "$SRC/osu_$t.c" $extra >>"$LOG" 2>&1 ||
			{ echo "osu.sh: building osu_$t with $impl failed (see $LOG)" >&2; exit 1; }
	done
done

# ---- run ----
NETWORK=${NETWORK:-0}
[ "$NETWORK" = 1 ] && PROVIDER=udp
launcher() {
	case $1/$NETWORK in
	rvma/*) echo "$ROOT/bin/rvmarun -n 2 --provider $PROVIDER --tag-output=false" ;;
	mpich/1) echo "env UCX_TLS=tcp,self UCX_NET_DEVICES=lo mpiexec.hydra -iface lo -n 2" ;;
	mpich/*) echo "mpiexec.hydra -n 2" ;;
	ompi/1) echo "mpirun.openmpi --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl tcp,self --mca btl_tcp_if_include lo --mca osc pt2pt -n 2" ;;
	ompi/*) echo "mpirun.openmpi --allow-run-as-root --oversubscribe -n 2" ;;
	esac
}
syncs_of() {
	if [ -n "${SYNCS:-}" ]; then echo "$SYNCS"; return; fi
	case $1 in
	put_bibw) echo "pscw fence" ;;
	*) echo "lock pscw fence flush flush_local lock_all" ;;
	esac
}
RES=$OUT/results # test win sync impl size value, one line each
: >"$RES"
fail=0
for t in $TESTS; do
	for w in $WINS; do
		for s in $(syncs_of "$t"); do
			for run in $(seq "$RUNS"); do
				for impl in $IMPLS; do
					cmd="$(launcher "$impl") $OUT/$impl/osu_$t -w $w -s $s -i $ITERS -x $SKIP"
					echo "== $cmd" >>"$LOG"
					timeout -k 5 "$TIMEOUT" $cmd >"$OUT/.out" 2>"$OUT/.err"
					rc=$?
					cat "$OUT/.out" "$OUT/.err" >>"$LOG"
					if [ $rc -eq 0 ] && grep -q '^[0-9]' "$OUT/.out"; then
						grep '^[0-9]' "$OUT/.out" | awk -v k="$t $w $s $impl" '{print k, $1, $2}' >>"$RES"
					elif grep -q 'MPI_ERR_UNSUPPORTED_OPERATION' "$OUT/.err"; then
						echo "$t $w $s $impl - unsup" >>"$RES"
					else
						echo "$t $w $s $impl - FAIL" >>"$RES"
						echo "osu.sh: FAIL (exit $rc): $cmd" >&2
						fail=1
					fi
				done
			done
		done
	done
done

# ---- table: one row per (test, window, sync, size), medians ----
awk -v impls="$IMPLS" -v sizes="${SIZES:-}" '
function median(list,   a, n, i, j, t) {
	n = split(list, a, " ")
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
	return n % 2 ? a[(n + 1) / 2] : sprintf("%.2f", (a[n / 2] + a[n / 2 + 1]) / 2)
}
BEGIN { ni = split(impls, im, " "); if (sizes != "") for (i = split(sizes, sz, " "); i > 0; i--) want[sz[i]] = 1 }
{
	key = $1 " " $2 " " $3
	if ($5 == "-") { special[key, $4] = $6; if (!(key in seenk)) { seenk[key] = 1; keys[++nk] = key } ; next }
	if (sizes != "" && !($5 in want)) next
	if (!(key in seenk)) { seenk[key] = 1; keys[++nk] = key }
	if (!((key, $5) in seens)) { seens[key, $5] = 1; ks[key] = ks[key] " " $5 }
	v[key, $5, $4] = v[key, $5, $4] " " $6
}
END {
	printf "%-16s %-9s %-12s %9s", "test", "window", "sync", "size"
	for (i = 1; i <= ni; i++) printf " %12s", im[i]
	printf "\n"
	for (k = 1; k <= nk; k++) {
		key = keys[k]; split(key, f, " ")
		n = split(ks[key], s, " ")
		if (n == 0) { n = 1; s[1] = "-" }
		for (j = 1; j <= n; j++) {
			printf "%-16s %-9s %-12s %9s", f[1], f[2], f[3], s[j]
			for (i = 1; i <= ni; i++) {
				if ((key, s[j], im[i]) in v)
					c = median(v[key, s[j], im[i]]) (((key, im[i]) in special) ? "*" : "")
				else
					c = (key, im[i]) in special ? special[key, im[i]] : "-"
				printf " %12s", c
			}
			printf "\n"
		}
	}
}' "$RES"
echo "osu.sh: latencies in us, bandwidths in MB/s (OSU's units); log in $LOG" >&2
exit $fail
