#!/bin/bash
# make demo-haul: a 64 MiB file through linkem (25 ms RTT, 500 Mbit/s, 1%
# loss each way), haul choosing the repair scheme.
set -euo pipefail
cd "$(dirname "$0")/.."
go build -o bin/haul ./cmd/haul
go build -o bin/linkem ./cmd/linkem
tmp=$(mktemp -d)
cleanup() { kill "$lp" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
head -c 67108864 /dev/urandom > "$tmp/in"
bin/linkem --a 127.0.0.1:7591 --b 127.0.0.1:7592 --delay 12.5ms --rate 500mbit --loss 0.01 &
lp=$!
trap cleanup EXIT
bin/haul recv --listen 127.0.0.1:7590 --via 127.0.0.1:7592 --out "$tmp/out" &
rp=$!
sleep 0.3
bin/haul send --to 127.0.0.1:7590 --via 127.0.0.1:7591 --rate 500mbit "$tmp/in"
wait "$rp"
kill -INT "$lp"
