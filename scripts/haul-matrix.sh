#!/bin/bash
# Runs haul through linkem at 25 ms RTT and 500 Mbit/s for each loss rate
# and scheme, one JSON line per run, then prints the table and draws the
# plot. Usage: scripts/haul-matrix.sh [SIZE_MiB] [OUT.svg]
set -euo pipefail
SIZE=${1:-256}
SVG=${2:-docs/img/haul_loss.svg}
cd "$(dirname "$0")/.."
go build -o bin/haul ./cmd/haul
go build -o bin/linkem ./cmd/linkem
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
head -c $((SIZE << 20)) /dev/urandom > "$tmp/in"
results="$tmp/results.jsonl"
port=7600
for loss in 0 1e-4 1e-3 1e-2; do
  for scheme in auto sr ec; do
    port=$((port + 3))
    bin/linkem --a 127.0.0.1:$((port+1)) --b 127.0.0.1:$((port+2)) --delay 12.5ms --rate 500mbit \
      --loss "$loss" --seed $port > "$tmp/linkem.log" &
    lp=$!
    bin/haul recv --listen 127.0.0.1:$port --via 127.0.0.1:$((port+2)) --out "$tmp/out" > "$tmp/recv.log" 2>&1 &
    rp=$!
    sleep 0.3
    line=$(bin/haul send --to 127.0.0.1:$port --via 127.0.0.1:$((port+1)) --rate 500mbit \
      --scheme "$scheme" --json "$tmp/in" 2>/dev/null)
    wait $rp
    kill -INT $lp; wait $lp || true
    echo "{\"loss\":$loss,\"forced\":\"$scheme\",\"run\":$line}" | tee -a "$results"
    rm -f "$tmp/out"
  done
done
go run ./scripts/plotmatrix "$results" "$SVG"
