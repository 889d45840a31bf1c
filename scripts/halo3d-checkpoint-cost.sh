#!/usr/bin/env bash
# halo3d-checkpoint-cost.sh RUNS [HALO3D ARGS...]: the cost of replicated
# snapshots, halo3d --sync notify with --checkpoint 0 (off) and 10 (or
# each of $CHECKPOINTS), 4 ranks (or $RANKS) over $PROVIDER (default shm),
# run alternately RUNS times each so that the machine's drift hits all
# alike; one run at a time (never time two at once on a shared machine).
#   scripts/halo3d-checkpoint-cost.sh 7
#   CHECKPOINTS="0 10 20" scripts/halo3d-checkpoint-cost.sh 5 --iters 300
# Prints each setting's median us/iter, its range, median/median of the
# first setting, and the median of the ratios of the runs of one round
# (neighbours in time: the machine's drift cancels). $HALO3D runs another
# build of halo3d.
set -euo pipefail
runs=$1
shift
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
go build -o "$tmp/rvmarun" ./cmd/rvmarun
halo=${HALO3D:-}
if [ -z "$halo" ]; then
	go build -o "$tmp/halo3d" ./examples/halo3d
	halo=$tmp/halo3d
fi
cks=${CHECKPOINTS:-0 10}
for i in $(seq 1 "$runs"); do
	for c in $cks; do
		"$tmp/rvmarun" -n "${RANKS:-4}" --provider "${PROVIDER:-shm}" --tag-output=false "$halo" --sync notify --json --serial=false \
			--checkpoint "$c" "$@" 2>/dev/null |
			python3 -c 'import sys,json
for l in sys.stdin:
    r=json.loads(l)
    if r["sync"]=="notify": print(r["us_per_iter"])' >>"$tmp/ck$c"
	done
done
python3 - "$tmp" $cks <<'EOF'
import statistics, sys
d, cks = sys.argv[1], sys.argv[2:]
runs = {c: [float(l) for l in open(f"{d}/ck{c}")] for c in cks}
first = runs[cks[0]]
for c in cks:
    xs = sorted(runs[c])
    m = statistics.median(xs)
    pair = statistics.median(x / y for x, y in zip(runs[c], first))
    print(f"--checkpoint {c:>3}: median {m:8.1f} us/iter  range {xs[0]:.1f}..{xs[-1]:.1f}  ({len(xs)} runs)  "
          f"{m/statistics.median(first):.3f}x; per round {pair:.3f}x")
EOF
