#!/usr/bin/env bash
# haul-crypt.sh [SIZE_MIB] [RUNS]: what haul's --encrypt costs, side by
# side: one keyed transfer of SIZE_MIB (default 1024) over loopback at
# 2 Gbit/s with the payload encrypted (A) and without (B), alternately,
# RUNS times each (default 5), timed whole by farm-bench. Each run's
# per-side CPU (/usr/bin/time) and haul's own crypto figures go to
# $OUT/A.log and $OUT/B.log.
set -euo pipefail
size=${1:-1024} runs=${2:-5}
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
go build -o "$OUT/haul" ./cmd/haul
cd "$OUT"
[ -f k ] || ./haul keygen k >/dev/null
[ -f in ] || head -c $((size << 20)) /dev/urandom >in
# run LOG PORT [flags]: one transfer, the receiver started first.
cat >run.sh <<'RUN'
#!/usr/bin/env bash
set -euo pipefail
log=$1 port=$2
shift 2
cd "$(dirname "$0")"
rm -f out
/usr/bin/time -f "recv cpu %U %S wall %e" -a -o "$log" ./haul recv --listen 127.0.0.1:$port --out out --key-file k --json "$@" >>"$log" 2>&1 &
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.05; done
/usr/bin/time -f "send cpu %U %S wall %e" -a -o "$log" ./haul send --to 127.0.0.1:$port --key-file k --rate 2gbit --json "$@" in >>"$log" 2>&1
wait
cmp -s in out
RUN
chmod +x run.sh
echo "logs in $OUT"
farm-bench -n "$runs" --warmup 1 --timeout 1200 --vs "$OUT/run.sh $OUT/B.log 7812" -- "$OUT/run.sh" "$OUT/A.log" 7811 --encrypt
