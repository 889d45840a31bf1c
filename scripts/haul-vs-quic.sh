#!/bin/bash
# Side by side: haul (--rate auto, and --rate set to the link's) against
# a QUIC transfer of the same file (tools/quicpeer: quic-go, one stream)
# through the same linkem link, by default at 25 and 100 ms RTT,
# 500 Mbit/s, loss 0 and 1e-3 (DELAYS, one-way; RATES; LOSSES override
# them). Each cell runs REPS times (a different linkem seed each time, the
# three in turn); the table gives median seconds and x ideal (size / link
# rate + RTT, the same ideal for all three). A run that fails or takes
# over TIMEOUT seconds (QUIC's; haul ends on its own) counts as TIMEOUT.
# Usage: [DELAYS=...] [RATES=...] [LOSSES=...] scripts/haul-vs-quic.sh [REPS] [SIZE_MiB] [OUT.jsonl]
set -euo pipefail
REPS=${1:-1}
MIB=${2:-32}
OUT=${3:-}
TIMEOUT=${TIMEOUT:-60}
DELAYS=${DELAYS:-12.5ms 50ms}
RATES=${RATES:-500mbit}
LOSSES=${LOSSES:-0 1e-3}
. "$(dirname "$0")/haul-lib.sh"
haul_setup
(cd tools/quicpeer && go build -o ../../bin/quicpeer .)
head -c $((MIB << 20)) /dev/urandom > "$tmp/in"

# quic_through PORT DELAY RATE LOSS SEED: one QUIC transfer of $tmp/in
# through linkem; prints the sender's JSON line, or {"ok":false}. linkem
# is told the receiver's address (--peer-b): a QUIC server speaks only
# when spoken to, so linkem could not learn it.
quic_through() {
	local port=$1 delay=$2 rate=$3 loss=$4 seed=$5
	bin/linkem --a 127.0.0.1:$((port + 1)) --b 127.0.0.1:$((port + 2)) --peer-b 127.0.0.1:"$port" --delay "$delay" \
		--rate "$rate" --loss "$loss" --seed "$seed" >"$tmp/linkem.log" 2>&1 &
	local lp=$!
	timeout "$TIMEOUT" bin/quicpeer recv --listen 127.0.0.1:"$port" --out "$tmp/out" >/dev/null 2>&1 &
	local rp=$!
	sleep 0.3
	timeout "$TIMEOUT" bin/quicpeer send --to 127.0.0.1:"$port" --via 127.0.0.1:$((port + 1)) --json "$tmp/in" 2>/dev/null || echo '{"ok":false}'
	wait $rp || true
	kill -INT $lp
	wait $lp || true
	rm -f "$tmp/out"
}

port=8700
for rate in $RATES; do
	case $rate in
	*gbit) mbit=$(awk "BEGIN { print ${rate%gbit} * 1000 }") ;;
	*mbit) mbit=${rate%mbit} ;;
	*) echo "RATES: want rates such as 500mbit or 2gbit, not $rate" >&2 && exit 1 ;;
	esac
	for delay in $DELAYS; do
		for loss in $LOSSES; do
			for rep in $(seq 1 "$REPS"); do
				seed=$((rep * 7919))
				for peer in haul-auto haul-rate quic; do
					port=$((port + 3))
					case $peer in
					haul-auto) line=$(haul_through $port "$delay" "$rate" "$loss" $seed "$tmp/in") ;;
					haul-rate) line=$(haul_through $port "$delay" "$rate" "$loss" $seed "$tmp/in" --rate "$rate") ;;
					quic) line=$(quic_through $port "$delay" "$rate" "$loss" $seed) ;;
					esac
					echo "{\"delay\":\"$delay\",\"mbit\":$mbit,\"mib\":$MIB,\"loss\":$loss,\"rep\":$rep,\"peer\":\"$peer\",\"run\":$line}" >>"$results"
				done
			done
		done
	done
done
jq -rs --argjson timeout "$TIMEOUT" '
  def median: sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  def r3: . * 1000 | round / 1000;
  group_by([.mbit, .delay, .loss]) | .[] |
  . as $cell |
  ($cell[0].mib * 1048576 * 8 / ($cell[0].mbit * 1e6) + ($cell[0].delay | rtrimstr("ms") | tonumber) * 2 / 1000) as $ideal |
  ([ "haul-auto", "haul-rate", "quic" ] | map(. as $p | [$cell[] | select(.peer == $p) | if .run.ok then .run.seconds else $timeout end] | median)) as $t |
  ([$cell[] | .run.ok] | all) as $ok |
  "| \($cell[0].mbit) Mbit/s | \(($cell[0].delay | rtrimstr("ms") | tonumber) * 2) ms | \($cell[0].loss) | \($cell[0].mib) MiB | \($ideal | r3) | \($t[0] | r3) (\($t[0] / $ideal | r3)x) | \($t[1] | r3) (\($t[1] / $ideal | r3)x) | \($t[2] | r3) (\($t[2] / $ideal | r3)x) | \($t[2] / $t[0] | r3) | \($ok) |"
' "$results" | sort -t'|' -k2,2n -k3,3n -k4,4g | {
	echo "| link | RTT | loss | size | ideal s | haul auto s (x ideal) | haul --rate s (x ideal) | QUIC s (x ideal) | QUIC / haul auto | all ok |"
	echo "|---|---|---|---|---|---|---|---|---|---|"
	cat
}
