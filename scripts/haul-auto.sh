#!/bin/bash
# Side by side: haul with --rate auto (no --rate) against --rate set to
# the link's rate, through linkem, at each loss rate. Each cell runs REPS
# times (a different linkem seed each time; fixed and auto in turn) and
# the table gives median seconds and x ideal (size / link rate + RTT),
# the rate auto found (mean of its estimate), its wire overhead and
# repeats.
# Usage: scripts/haul-auto.sh [REPS] [OUT.jsonl]
set -euo pipefail
REPS=${1:-3}
OUT=${2:-}
. "$(dirname "$0")/haul-lib.sh"
haul_setup
port=8300
# one-way delay, rate in Mbit/s, size in MiB
cells=("12.5ms 500 64" "50ms 500 128" "5ms 100 32")
for cell in "${cells[@]}"; do
  read -r delay mbit mib <<<"$cell"
  [ -f "$tmp/in$mib" ] || head -c $((mib << 20)) /dev/urandom > "$tmp/in$mib"
  for loss in 0 1e-3 1e-2; do
    for rep in $(seq 1 "$REPS"); do
      for mode in fixed auto; do
        port=$((port + 3))
        rate=(--rate "${mbit}mbit")
        [ $mode = auto ] && rate=()
        line=$(haul_through $port "$delay" "${mbit}mbit" "$loss" $((rep * 7919)) "$tmp/in$mib" "${rate[@]}")
        echo "{\"delay\":\"$delay\",\"mbit\":$mbit,\"mib\":$mib,\"loss\":$loss,\"rep\":$rep,\"mode\":\"$mode\",\"run\":$line}" >> "$results"
      done
    done
  done
done
jq -rs '
  def median: sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  def r3: . * 1000 | round / 1000;
  group_by([.delay, .mbit, .mib, .loss]) | .[] |
  . as $cell |
  ($cell[0].mib * 1048576 * 8 / ($cell[0].mbit * 1e6) + ($cell[0].delay | rtrimstr("ms") | tonumber) * 2 / 1000) as $ideal |
  ([ "fixed", "auto" ] | map(. as $m | [$cell[] | select(.mode == $m) | .run.seconds // 1e9] | median)) as $t |
  ([$cell[] | select(.mode == "auto") | .run.rate.ideal_mbps // 0] | median) as $found |
  ([$cell[] | select(.mode == "auto") | .run.wire_overhead // 0] | median) as $ovh |
  ([$cell[] | select(.mode == "auto") | .run.repeat_overhead // 0] | median) as $rep |
  ([$cell[] | .run.ok] | all) as $ok |
  "| \($cell[0].delay) \($cell[0].mbit) Mbit/s | \($cell[0].mib) MiB | \($cell[0].loss) | \($t[0] | r3) (\($t[0] / $ideal | r3)x) | \($t[1] | r3) (\($t[1] / $ideal | r3)x) | \($found | round) | \(($ovh - 1) * 100 | r3)% | \($rep * 100 | r3)% | \($ok) |"
' "$results" | sort -t'|' -k2,2 -k3,3n -k4,4g | {
  echo "| one-way delay, link | size | loss | --rate = link: s (x ideal) | auto: s (x ideal) | auto found Mbit/s | auto wire overhead | auto repeats | all ok |"
  echo "|---|---|---|---|---|---|---|---|---|"
  cat
}
