#!/usr/bin/env bash
# rma-vs-mpi.sh [OUTDIR]: rvma's MPI-style rma tests (rvma-perf, ranks as two
# processes bound to cores 0 and 1) side by side with the same tests
# written against MPI (bench/mpi/rma_bench.c) under MPICH and, if
# installed, Open MPI, in one session. Every point runs RUNS times, the
# implementations alternating (their order rotating from run to run) and
# never two at once, so that other load on the machine hits them alike.
# Prints per test and transport the median (min-max) of each and the ratio
# rvma/MPI of the medians.
#
# Transports: shm (rvma --provider shm; MPICH's default ch4:ucx shared
# memory; Open MPI's default, btl vader with osc rdma) and the network
# path on loopback (rvma --provider udp; MPICH with UCX restricted to
# tcp,self; Open MPI with pml ob1, btl tcp,self, osc pt2pt).
#
# Environment: RUNS (default 5), DURATION seconds per point (0.5), POINTS
# (test:size list, below), RVMA_ONLY=1 or MPI_ONLY=1 to skip a side.
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
DURATION=${DURATION:-0.5}
LAT="rma_put_flush_lat:8 rma_get_lat:8 rma_acc_lat:8 rma_fop_lat:8 rma_cas_lat:8 rma_put_notify_lat:8 rma_notify_lat:8 rma_barrier_lat:8 rma_fence_lat:8"
POINTS_SHM=${POINTS:-"$LAT rma_put_rate:8 rma_put_rate:65536 rma_put_rate:4194304"}
POINTS_NET=${POINTS:-"$LAT rma_put_rate:8 rma_put_rate:1048576"}
RES=$OUT/results.tsv
: >"$RES"
echo "results in $OUT" >&2

go build -o "$OUT/rvma-perf" ./cmd/rvma-perf
impls=()
[ "${MPI_ONLY:-}" = 1 ] || impls+=(rvma)
if [ "${RVMA_ONLY:-}" != 1 ]; then
	mpicc.mpich -O2 -o "$OUT/rma_bench_mpich" bench/mpi/rma_bench.c
	impls+=(mpich)
	if command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null; then
		mpicc.openmpi -O2 -o "$OUT/rma_bench_ompi" bench/mpi/rma_bench.c
		impls+=(ompi)
	else
		echo "Open MPI not installed (apt-get install openmpi-bin libopenmpi-dev): MPICH only" >&2
	fi
fi
ROOT=()
[ "$(id -u)" = 0 ] && ROOT=(--allow-run-as-root)
# Every network transport on loopback.
export UCX_NET_DEVICES=lo

# one IMPL TRANSPORT TEST SIZE: one measurement, one line of RES.
one() {
	local impl=$1 tr=$2 test=$3 size=$4 line rc=0
	local args=("$test" --size "$size" --json)
	case $impl/$tr in
	rvma/shm) line=$("$OUT/rvma-perf" "${args[@]}" --provider shm --bind --duration "${DURATION}s" 2>>"$OUT/stderr") || rc=$? ;;
	rvma/net) line=$("$OUT/rvma-perf" "${args[@]}" --provider udp --bind --duration "${DURATION}s" 2>>"$OUT/stderr") || rc=$? ;;
	mpich/shm)
		line=$(mpiexec.hydra -bind-to core -n 2 "$OUT/rma_bench_mpich" "${args[@]}" --duration "$DURATION" --provider mpich-shm 2>>"$OUT/stderr") || rc=$? ;;
	mpich/net)
		line=$(UCX_TLS=tcp,self mpiexec.hydra -iface lo -bind-to core -n 2 "$OUT/rma_bench_mpich" "${args[@]}" --duration "$DURATION" --provider mpich-tcp 2>>"$OUT/stderr") || rc=$? ;;
	ompi/shm)
		line=$(mpirun.openmpi "${ROOT[@]}" --bind-to core -n 2 --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo \
			"$OUT/rma_bench_ompi" "${args[@]}" --duration "$DURATION" --provider ompi-vader 2>>"$OUT/stderr") || rc=$? ;;
	ompi/net)
		line=$(mpirun.openmpi "${ROOT[@]}" --bind-to core -n 2 --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo \
			--mca pml ob1 --mca btl tcp,self --mca osc pt2pt \
			"$OUT/rma_bench_ompi" "${args[@]}" --duration "$DURATION" --provider ompi-tcp 2>>"$OUT/stderr") || rc=$? ;;
	esac
	line=$(printf '%s\n' "$line" | grep '^{' | tail -1 || true)
	if [ $rc -ne 0 ] || [ -z "$line" ]; then
		echo "$impl $tr $test $size: failed (status $rc; see $OUT/stderr)" >&2
		line='{"failed":true}'
	fi
	printf '%s\t%s\t%s\t%s\t%s\n' "$impl" "$tr" "$test" "$size" "$line" >>"$RES"
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" | tee "$OUT/load"
for run in $(seq 1 "$RUNS"); do
	echo "run $run of $RUNS" >&2
	# Rotate the order of the implementations from run to run.
	order=("${impls[@]:$(((run - 1) % ${#impls[@]}))}" "${impls[@]:0:$(((run - 1) % ${#impls[@]}))}")
	for tr in shm net; do
		points=$POINTS_SHM
		[ $tr = net ] && points=$POINTS_NET
		for p in $points; do
			test=${p%%:*} size=${p##*:}
			for impl in "${order[@]}"; do
				# A notified window is rvma's; Open MPI 4.1's vader crashes on
				# MPI_Compare_and_swap (open-mpi/ompi#11349).
				[ "$test" = rma_notify_lat ] && [ "$impl" != rvma ] && continue
				[ "$impl/$tr/$test" = ompi/shm/rma_cas_lat ] && continue
				one "$impl" "$tr" "$test" "$size"
			done
		done
	done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/load"

python3 - "$RES" <<'EOF'
import json, statistics, sys
rows = {}
for l in open(sys.argv[1]):
    impl, tr, test, size, js = l.rstrip("\n").split("\t")
    r = json.loads(js)
    if r.get("failed"):
        continue
    rate = test == "rma_put_rate"
    v = r["mb_per_s"] if rate else r["lat_us_p50"]
    rows.setdefault((tr, test, int(size)), {}).setdefault(impl, []).append(v)
impls = [i for i in ("rvma", "mpich", "ompi") if any(i in d for d in rows.values())]
names = {"rvma": "rvma", "mpich": "MPICH", "ompi": "Open MPI"}
trn = {"shm": "shared memory (rvma shm; MPICH ch4:ucx shm; Open MPI vader)",
       "net": "network path on loopback (rvma udp; MPICH ucx tcp; Open MPI tcp)"}
def num(v):
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}" if v >= 1 else f"{v:.3f}"
def fmt(vs):
    if not vs:
        return "-"
    return f"{num(statistics.median(vs))} ({num(min(vs))}-{num(max(vs))})"
for tr in ("shm", "net"):
    keys = [k for k in rows if k[0] == tr]
    if not keys:
        continue
    print(f"\n{trn[tr]}: median of runs (min-max); latency p50 in us, rate in MB/s")
    head = ["test", "size"] + [names[i] for i in impls] + [f"rvma/{names[i]}" for i in impls if i != "rvma"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for k in keys:
        _, test, size = k
        d = rows[k]
        # rvma's notified put against MPI's put + flush + notify.
        if test == "rma_notify_lat":
            d = dict(d)
            for i in impls:
                if i != "rvma":
                    d[i] = rows.get((tr, "rma_put_notify_lat", size), {}).get(i, [])
            test = "rma_notify_lat (MPI: put_notify)"
        cells = [test, str(size)] + [fmt(d.get(i, [])) for i in impls]
        for i in impls:
            if i == "rvma":
                continue
            a, b = d.get("rvma"), d.get(i)
            cells.append(f"{statistics.median(a) / statistics.median(b):.2f}" if a and b else "-")
        print("| " + " | ".join(cells) + " |")
print("\nrvma/MPI: above 1 is rvma slower for latencies, faster for rates.")
EOF
