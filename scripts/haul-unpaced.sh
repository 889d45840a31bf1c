#!/bin/bash
# haul over loopback with nothing between the ends: unpaced (--rate
# 100gbit, far above what two processes move) and --rate auto, each with
# one worker and two. The table gives goodput, the wire overhead and the
# repeats, what the receiver's flow control did (window cuts, datagrams
# the kernel dropped), and the CPU seconds per GiB of each end from
# /usr/bin/time (user + system: robust to a shared machine, unlike the
# goodput, which is the machine's to give). The sender's CPU includes
# hashing the file (BLAKE3, before its clock starts), the receiver's
# checking each region as it lands.
# Usage: scripts/haul-unpaced.sh [SIZE_MiB] [REPS] [OUT.jsonl]
set -euo pipefail
MIB=${1:-1024}
REPS=${2:-1}
OUT=${3:-}
. "$(dirname "$0")/haul-lib.sh"
haul_setup
head -c $((MIB << 20)) /dev/urandom >"$tmp/in"
port=9500
for rep in $(seq 1 "$REPS"); do
	for mode in "100gbit 1" "100gbit 2" "auto 1" "auto 2"; do
		read -r rate workers <<<"$mode"
		port=$((port + 3))
		/usr/bin/time -f '%U %S' -o "$tmp/recv.time" bin/haul recv --listen 127.0.0.1:$port --out "$tmp/out" --json >"$tmp/recv.json" 2>"$tmp/recv.log" &
		rp=$!
		sleep 0.3
		/usr/bin/time -f '%U %S' -o "$tmp/send.time" bin/haul send --to 127.0.0.1:$port --rate "$rate" --workers "$workers" --json "$tmp/in" \
			>"$tmp/send.json" 2>"$tmp/send.log" || echo '{"ok":false}' >"$tmp/send.json"
		wait $rp || true
		read -r su ss <"$tmp/send.time"
		read -r ru rs <"$tmp/recv.time"
		echo "{\"rate\":\"$rate\",\"workers\":$workers,\"mib\":$MIB,\"rep\":$rep,\"send_cpu\":[$su,$ss],\"recv_cpu\":[$ru,$rs],\"recv\":$(cat "$tmp/recv.json" || echo '{}'),\"run\":$(cat "$tmp/send.json")}" >>"$results"
		rm -f "$tmp/out"
	done
done
jq -rs '
  def median: sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  def r2: . * 100 | round / 100;
  group_by([.rate, .workers]) | .[] |
  . as $cell | ($cell[0].mib / 1024) as $gib |
  "| \($cell[0].rate) | \($cell[0].workers) | \([$cell[] | .run.gbps // 0] | median | r2) | \([$cell[] | .run.wire_overhead // 0] | median | . - 1 | . * 100 | r2)% | \([$cell[] | .run.repeat_overhead // 0] | median | . * 100 | r2)% | \([$cell[] | .recv.window_cuts // 0] | median) | \([$cell[] | .recv.socket_drops // 0] | median) | \([$cell[] | (.send_cpu | add) / $gib] | median | r2) | \([$cell[] | (.recv_cpu | add) / $gib] | median | r2) | \([$cell[] | ((.send_cpu | add) + (.recv_cpu | add)) / $gib] | median | r2) | \([$cell[] | .run.ok] | all) |"
' "$results" | {
	echo "| --rate | workers | Gbit/s | wire overhead | repeats | window cuts | socket drops | send CPU s/GiB | recv CPU s/GiB | total s/GiB | all ok |"
	echo "|---|---|---|---|---|---|---|---|---|---|---|"
	cat
}
