#!/usr/bin/env bash
# halo3d-vs-mpi.sh [OUTDIR]: examples/halo3d under rvmarun (the default
# provider, auto: shared memory between the ranks of this host) side by side
# with the same program written against MPI (bench/mpi/halo3d.c) under MPICH
# and, if installed, Open MPI, in one session. Every rank count runs RUNS
# rounds, the implementations alternating (their order rotating from round
# to round) and never two at once, so that other load on the machine hits
# them alike. Prints per rank count and variant the median (min-max) us per
# iteration of each and the ratio rvma/MPI of the medians, and the fastest
# variant of each against the others'.
#
# Not only timing: every variant of every run must print the same checksum
# (the global sum of the grid after the iterations, bit for bit: both
# programs add the ranks' sums in rank order) under every implementation,
# and report ok (equal to its own sendrecv run); the script fails otherwise,
# or if a run fails.
#
# Environment: RUNS (default 5), RANKS (rank counts, default "4"), ARGS
# (halo3d's problem and iterations, default "-n 64 --iters 100 --warmup
# 10", as in docs/PERFORMANCE.md), SYNC (rvma's variants, default all five;
# MPI runs them less notify, rvma's notified window, which MPI has not),
# TIMEOUT seconds per run (600), RVMA_ONLY=1 or MPI_ONLY=1 to skip a side.
# A short check that all agree: RUNS=1 RANKS="1 4" ARGS="-n 16 --iters 20
# --warmup 2" scripts/halo3d-vs-mpi.sh
# Needs: go, python3, mpicc.mpich and mpiexec.hydra (Debian: mpich
# libmpich-dev); optional mpicc.openmpi and mpirun.openmpi (openmpi-bin
# libopenmpi-dev). Installing Open MPI next to MPICH makes Open MPI the
# default mpicc/mpirun alternative; this script names each explicitly.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-$(mktemp -d)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
RUNS=${RUNS:-5}
RANKS=${RANKS:-4}
ARGS=${ARGS:-"-n 64 --iters 100 --warmup 10"}
SYNC=${SYNC:-sendrecv,fence,pscw,lock,notify}
TIMEOUT=${TIMEOUT:-600}
MPISYNC=$(printf '%s\n' "${SYNC//,/$'\n'}" | grep -vx notify | paste -sd, || true)
RES=$OUT/results.tsv
: >"$RES"
echo "results in $OUT" >&2

impls=()
if [ "${MPI_ONLY:-}" != 1 ]; then
	go build -o "$OUT/rvmarun" ./cmd/rvmarun
	go build -o "$OUT/halo3d" ./examples/halo3d
	impls+=(rvma)
fi
if [ "${RVMA_ONLY:-}" != 1 ] && [ -n "$MPISYNC" ]; then
	mpicc.mpich -O2 -o "$OUT/halo3d_mpich" bench/mpi/halo3d.c
	impls+=(mpich)
	if command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null; then
		mpicc.openmpi -O2 -o "$OUT/halo3d_ompi" bench/mpi/halo3d.c
		impls+=(ompi)
	else
		echo "Open MPI not installed (apt-get install openmpi-bin libopenmpi-dev): MPICH only" >&2
	fi
fi
[ ${#impls[@]} -gt 0 ] || { echo "nothing to run" >&2; exit 2; }
ROOT=()
[ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
# MPICH's UCX on loopback only.
export UCX_NET_DEVICES=lo

# one IMPL RANKS: one run of every variant; its JSON lines go to RES.
fails=0
one() {
	local impl=$1 n=$2 rc=0 out
	# shellcheck disable=SC2086 # ARGS is a list of arguments
	case $impl in
	rvma) out=$(timeout "$TIMEOUT" "$OUT/rvmarun" -n "$n" --tag-output=false "$OUT/halo3d" $ARGS \
		--sync "$SYNC" --serial=false --json 2>>"$OUT/stderr") || rc=$? ;;
	mpich) out=$(timeout "$TIMEOUT" mpiexec.hydra -iface lo -bind-to none -n "$n" "$OUT/halo3d_mpich" $ARGS \
		--sync "$MPISYNC" --serial=false --json 2>>"$OUT/stderr") || rc=$? ;;
	ompi) out=$(timeout "$TIMEOUT" mpirun.openmpi "${ROOT[@]}" --oversubscribe --bind-to none \
		--mca btl self,vader,tcp --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo \
		-n "$n" "$OUT/halo3d_ompi" $ARGS --sync "$MPISYNC" --serial=false --json 2>>"$OUT/stderr") || rc=$? ;;
	esac
	# A checksum that is not ok makes the program exit 1: the summary
	# reports it; any other failure is the run's.
	if { [ $rc -ne 0 ] && [ $rc -ne 1 ]; } || ! printf '%s\n' "$out" | grep -q '^{'; then
		echo "$impl, $n ranks: failed (status $rc; see $OUT/stderr)" >&2
		fails=$((fails + 1))
		return
	fi
	printf '%s\n' "$out" | grep '^{' | sed "s/^/$impl\t$n\t/" >>"$RES"
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/load"
for run in $(seq 1 "$RUNS"); do
	echo "run $run of $RUNS" >&2
	# Rotate the order of the implementations from run to run.
	order=("${impls[@]:$(((run - 1) % ${#impls[@]}))}" "${impls[@]:0:$(((run - 1) % ${#impls[@]}))}")
	for n in $RANKS; do
		for impl in "${order[@]}"; do
			one "$impl" "$n"
		done
	done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/load"

status=0
python3 - "$RES" "$ARGS" <<'EOF' || status=$?
import json, statistics, sys
times, sums, bad = {}, {}, []
for l in open(sys.argv[1]):
    impl, n, js = l.rstrip("\n").split("\t")
    r = json.loads(js)
    key = (int(n), r["sync"])
    times.setdefault(key, {}).setdefault(impl, []).append(r["us_per_iter"])
    sums.setdefault(key, set()).add((impl, r["checksum"]))
    if not r["ok"]:
        bad.append(f"{impl}, {n} ranks, {r['sync']}: checksum {r['checksum']!r} differs from its sendrecv run's")
impls = [i for i in ("rvma", "mpich", "ompi") if any(i in d for d in times.values())]
names = {"rvma": "rvma", "mpich": "MPICH", "ompi": "Open MPI"}
variants = ["sendrecv", "fence", "pscw", "lock", "notify"]
def num(v):
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"
def fmt(vs):
    return f"{num(statistics.median(vs))} ({num(min(vs))}-{num(max(vs))})" if vs else "-"
def ratio(a, b):
    return f"{statistics.median(a) / statistics.median(b):.2f}" if a and b else "-"
print(f"\nhalo3d {sys.argv[2]}: us per iteration, median of runs (min-max); "
      "rvma: rvmarun (auto: shm); MPICH: ch4:ucx; Open MPI: btl self,vader,tcp")
for n in sorted({k[0] for k in times}):
    print(f"\n{n} ranks")
    head = ["variant"] + [names[i] for i in impls] + [f"rvma/{names[i]}" for i in impls if i != "rvma"] + ["checksum"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    best = {}
    for v in variants:
        d = times.get((n, v))
        if not d:
            continue
        for i, vs in d.items():
            if i not in best or statistics.median(vs) < statistics.median(best[i][1]):
                best[i] = (v, vs)
        got = {c for _, c in sums[(n, v)]}
        if len(got) > 1:
            bad.append(f"{n} ranks, {v}: checksums differ: " +
                       ", ".join(f"{names[i]} {c!r}" for i, c in sorted(sums[(n, v)])))
        cells = [v] + [fmt(d.get(i, [])) for i in impls]
        cells += [ratio(d.get("rvma"), d.get(i)) for i in impls if i != "rvma"]
        cells.append(f"{next(iter(got))!r}, equal" if len(got) == 1 else "DIFFER")
        print("| " + " | ".join(cells) + " |")
    cells = ["fastest"] + [f"{fmt(best[i][1])} {best[i][0]}" if i in best else "-" for i in impls]
    cells += [ratio(best.get("rvma", (0, []))[1], best.get(i, (0, []))[1]) for i in impls if i != "rvma"]
    print("| " + " | ".join(cells + [""]) + " |")
print("\nrvma/MPI: below 1 is rvma faster.")
for b in bad:
    print("FAIL:", b, file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
if [ "$fails" -gt 0 ]; then
	echo "FAIL: $fails run(s) failed" >&2
	status=1
fi
exit $status
