#!/usr/bin/env bash
# ab.sh REV RUNS halo3d|perf ARGS...: side-by-side figures of two builds,
# the working tree (new) against git revision REV (old), run alternately
# RUNS times each, so that the machine's drift hits both alike.
#   scripts/ab.sh ae7533e 5 halo3d --iters 200 --exchange-only
#       rvmarun -n 4 halo3d --json --serial=false ARGS: us/iter per variant
#   scripts/ab.sh ae7533e 4 perf rma_put_lat --provider udp --size 8
#       rvma-perf ARGS --json: p50 latency (or Gbit/s for bandwidth tests)
# Prints each figure's median and range for both, and new/old.
set -euo pipefail
rev=$1 runs=$2 mode=$3
shift 3
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'git worktree remove --force "$tmp/src" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
git worktree add -q --detach "$tmp/src" "$rev"
for v in old new; do
	src=.
	[ $v = old ] && src=$tmp/src
	mkdir -p "$tmp/$v"
	for p in cmd/rvmarun examples/halo3d cmd/rvma-perf; do
		(cd "$src" && go build -o "$tmp/$v/$(basename $p)" ./$p)
	done
done
for i in $(seq 1 "$runs"); do
	for v in old new; do
		if [ "$mode" = halo3d ]; then
			"$tmp/$v/rvmarun" -n 4 "$tmp/$v/halo3d" --json --serial=false "$@" 2>/dev/null | sed 's/^\[0\] //' |
				python3 -c 'import sys,json
for l in sys.stdin:
    try: d=json.loads(l)
    except ValueError: continue
    print(sys.argv[1], d["sync"], d["us_per_iter"])' $v
		else
			"$tmp/$v/rvma-perf" "$@" --json 2>/dev/null |
				python3 -c 'import sys,json
for l in sys.stdin:
    try: d=json.loads(l)
    except ValueError: continue
    v=d.get("lat_us_p50") or d.get("gbps")
    print(sys.argv[1], d["test"], v)' $v
		fi
	done
done | python3 -c '
import sys, collections, statistics
d = collections.defaultdict(lambda: collections.defaultdict(list))
for l in sys.stdin:
    v, k, x = l.split(); d[k][v].append(float(x))
for k in d:
    o, n = d[k]["old"], d[k]["new"]
    if not o or not n: continue
    mo, mn = statistics.median(o), statistics.median(n)
    print(f"{k:14s} old {mo:9.3f} ({min(o):.3f}-{max(o):.3f})  new {mn:9.3f} ({min(n):.3f}-{max(n):.3f})  new/old {mn/mo:.3f}")'
