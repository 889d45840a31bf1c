#!/bin/bash
# haul over one path and over two, through linkem instances at 25 ms RTT
# and the given loss: SIZE bytes, paths of RATE1 and RATE2 (default
# 128 MiB, 250mbit and 250mbit, loss 1e-3). One JSON report per run.
#   scripts/haul-paths.sh [SIZE_MIB] [RATE1] [RATE2] [LOSS]
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-128}; r1=${2:-250mbit}; r2=${3:-250mbit}; loss=${4:-0.001}
go build -o bin/haul ./cmd/haul
go build -o bin/linkem ./cmd/linkem
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
head -c $((size << 20)) /dev/urandom > "$tmp/in"
run() { # paths via_recv via_send rate
	# Fresh links per run: linkem learns each side's address from its
	# first packet.
	pids=()
	bin/linkem --a 127.0.0.1:7691 --b 127.0.0.1:7692 --delay 12.5ms --rate "$r1" --loss "$loss" --seed 1 2>/dev/null & pids+=($!)
	bin/linkem --a 127.0.0.1:7693 --b 127.0.0.1:7694 --delay 12.5ms --rate "$r2" --loss "$loss" --seed 2 2>/dev/null & pids+=($!)
	sleep 0.3
	bin/haul recv --listen 127.0.0.1:7690 --via "$2" --out "$tmp/out" --json >/dev/null &
	local rp=$!
	sleep 0.3
	bin/haul send --to 127.0.0.1:7690 --paths "$1" --via "$3" --rate "$4" --json "$tmp/in"
	wait "$rp"
	kill "${pids[@]}"; wait "${pids[@]}" 2>/dev/null || true
	rm -f "$tmp/out"
}
run 1 127.0.0.1:7692 127.0.0.1:7691 "$r1"
run 2 127.0.0.1:7692,127.0.0.1:7694 127.0.0.1:7691,127.0.0.1:7693 "$r1,$r2"
