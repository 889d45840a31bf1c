#!/usr/bin/env bash
# recovery-time.sh: how long a job takes to come back after a rank is
# killed with SIGKILL. examples/rewind under rvmarun --restart 1, the rank
# killing itself mid-step (--fail-rank, so that the kill's time is known to
# the microsecond), at each rank count and provider; RUNS runs each, one at
# a time. Prints per cell the median (min-max) of: kill to the survivors'
# ErrPeer (detect), kill to the respawned process's start (respawn), kill
# to every rank computing again (total), and Recover's phases (the slowest
# rank's each: agree, quiet, reconnect, exchange, restore), in ms. Every
# run must end with the fault-free answer, byte for byte.
#
# Environment: RUNS (default 5), RANKS (default "4 8"), PROVIDERS (default
# "shm udp"), ARGS (rewind's, default "--steps 200 --fail-step 100 --pace
# 1ms --checkpoint 1").
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
RANKS=${RANKS:-"4 8"}
PROVIDERS=${PROVIDERS:-"shm udp"}
ARGS=${ARGS:-"--steps 200 --fail-step 100 --pace 1ms --checkpoint 1"}
go build -o bin/rvmarun ./cmd/rvmarun
go build -o bin/rewind ./examples/rewind
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for p in $PROVIDERS; do
	for n in $RANKS; do
		for i in $(seq "$RUNS"); do
			victim=$(( (i * 7) % n ))
			# shellcheck disable=SC2086
			line=$(bin/rvmarun -n "$n" --provider "$p" --restart 1 --tag-output=false bin/rewind $ARGS --fail-rank "$victim" --json 2>/dev/null)
			echo "$p $n $line" >>"$out"
		done
	done
done
python3 - "$out" <<'PY'
import json, statistics, sys
cells = {}
for l in open(sys.argv[1]):
    p, n, js = l.split(' ', 2)
    r = json.loads(js)
    if not r['ok'] or r['recoveries'] != 1:
        sys.exit(f"a run did not recover to the fault-free answer: {l}")
    cells.setdefault((p, int(n)), []).append(r)
keys = ['kill_to_detect_ms', 'kill_to_respawn_ms', 'kill_to_resume_ms', 'agree_ms', 'quiet_ms', 'reconnect_ms', 'exchange_ms', 'restore_ms']
names = ['detect', 'respawn', 'total', 'agree', 'quiet', 'reconnect', 'exchange', 'restore']
print('| provider | ranks | ' + ' | '.join(names) + ' |')
print('|---|---|' + '---|' * len(names))
for (p, n), rs in sorted(cells.items()):
    row = []
    for k in keys:
        v = [r[k] for r in rs]
        row.append(f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})")
    print(f"| {p} | {n} | " + ' | '.join(row) + ' |')
PY
