#!/usr/bin/env bash
# recovery-time.sh RUNS: how long recovery from a kill -9 takes, from the
# kill to every rank computing again, for examples/rewind and halo3d
# --sync notify --checkpoint 10, at 4 and 8 ranks ($RANKS), over shm and
# udp ($PROVIDERS), RUNS runs of each, one at a time. Rank 1 kills itself
# (--fail-rank, in the middle of the run; $EXAMPLES picks the examples);
# every rank prints wall-clock
# stamps (--trace), lined up here:
#   detect    kill -> a survivor's wait or operation fails with ErrPeer
#             (the first and the last survivor)
#   respawn   kill -> the respawned process starts (main), and leaves
#             rma.Init
#   recover   Comm.Recover's duration (agree, reconnect, restore), the
#             longest over the ranks (a survivor's from its ErrPeer, the
#             respawned rank's from its Init), and from the last rank's
#             call (the last ErrPeer or the respawned rank's Init) to the
#             last return: Recover's own cost, without waiting for ranks
#             still to notice
#   total     kill -> the last rank computing again (Recover returned,
#             the restored step redone)
# Prints the median and the range of each, in milliseconds.
set -euo pipefail
runs=$1
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for p in cmd/rvmarun examples/rewind examples/halo3d; do
	go build -o "$tmp/$(basename $p)" ./$p
done
for ex in ${EXAMPLES:-rewind halo3d}; do
	for n in ${RANKS:-4 8}; do
		for prov in ${PROVIDERS:-shm udp}; do
			for i in $(seq 1 "$runs"); do
				case $ex in
				rewind) args=(--steps 400 --cells 4096 --fail-step 200) ;;
				halo3d) args=(--sync notify -n 16 --iters 400 --warmup 10 --checkpoint 10 --serial=false --fail-step 200) ;;
				esac
				"$tmp/rvmarun" -n "$n" --provider "$prov" --restart 1 --tag-output=false "$tmp/$ex" "${args[@]}" --fail-rank 1 --trace \
					>/dev/null 2>"$tmp/run" || { echo "$ex -n $n $prov: run failed:" >&2; tail -5 "$tmp/run" >&2; continue; }
				grep ": trace " "$tmp/run" | sed "s/^/$ex $n $prov /" >>"$tmp/traces"
				echo "$ex $n $prov END" >>"$tmp/traces"
			done
		done
	done
done
python3 - "$tmp/traces" <<'EOF'
import statistics, sys
from collections import defaultdict
rows = defaultdict(lambda: defaultdict(list))
cur = []
def done(key, ev):
    kill = [t for (r, inc, e, t) in ev if e == "kill"]
    if not kill:
        return
    k = kill[0]
    ms = lambda t: (t - k) / 1e3
    det = [ms(t) for (r, inc, e, t) in ev if e == "errpeer" and inc == 0]
    start = [ms(t) for (r, inc, e, t) in ev if e == "start" and inc > 0]
    init = [ms(t) for (r, inc, e, t) in ev if e == "init" and inc > 0]
    rec = []
    for (r, inc, e, t) in ev:
        if e != "recovered":
            continue
        begin = [t2 for (r2, inc2, e2, t2) in ev if r2 == r and inc2 == inc and e2 == ("init" if inc > 0 else "errpeer")]
        if begin:
            rec.append((t - max(b for b in begin if b <= t)) / 1e3)
    comp = [ms(t) for (r, inc, e, t) in ev if e == "computing"]
    recd = [ms(t) for (r, inc, e, t) in ev if e == "recovered"]
    d = rows[key]
    if det: d["detect first"].append(min(det)); d["detect last"].append(max(det))
    if start: d["respawn: main"].append(start[0])
    if init: d["respawn: Init done"].append(init[0])
    if rec: d["recover (longest)"].append(max(rec))
    if recd and det and init: d["recover (last call on)"].append(max(recd) - max(det + init))
    if comp: d["total"].append(max(comp))
for line in open(sys.argv[1]):
    f = line.split()
    if f[3] == "END":
        done(tuple(f[:3]), cur); cur = []; continue
    # EX N PROV EX: trace RANK INC EVENT MICROS
    cur.append((int(f[5]), int(f[6]), f[7], int(f[8])))
for key, d in rows.items():
    print(f"{key[0]} -n {key[1]} {key[2]} ({len(d['total'])} runs), ms from the kill: median [min..max]")
    for name in ["detect first", "detect last", "respawn: main", "respawn: Init done", "recover (longest)", "recover (last call on)", "total"]:
        xs = sorted(d[name])
        if xs:
            print(f"  {name:20s} {statistics.median(xs):8.1f}  [{xs[0]:.1f}..{xs[-1]:.1f}]")
EOF
