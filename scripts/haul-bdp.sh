#!/bin/bash
# Side by side: haul --scheme auto against forced sr and ec through linkem,
# for transfers of about 0.5 to 2 bandwidth-delay products (where the
# choice matters most) and some far larger, at each loss rate. Each cell
# runs REPS times (a different linkem seed each time; auto, sr and ec in
# turn) and the table gives median seconds, x ideal (size / rate + RTT)
# and auto / the better forced scheme.
# Usage: scripts/haul-bdp.sh [REPS] [OUT.jsonl]
set -euo pipefail
REPS=${1:-3}
OUT=${2:-}
. "$(dirname "$0")/haul-lib.sh"
haul_setup
port=7900
# one-way delay, rate, sizes in MiB (BDP: 100 ms x 2 Gbit/s = 24 MiB,
# 25 ms x 500 Mbit/s = 1.5 MiB): 0.5, 1 and 2 BDP, 0.67, 1.33 and 2 BDP,
# and one far larger each
cells=("50ms 2000mbit 12 24 48 128" "12.5ms 500mbit 1 2 3 32")
for cell in "${cells[@]}"; do
  read -r delay rate sizes <<<"${cell%% *} $(echo "$cell" | cut -d' ' -f2) $(echo "$cell" | cut -d' ' -f3-)"
  for mib in $sizes; do
    [ -f "$tmp/in$mib" ] || head -c $((mib << 20)) /dev/urandom > "$tmp/in$mib"
    for loss in 0 1e-3 1e-2; do
      for rep in $(seq 1 "$REPS"); do
        for scheme in auto sr ec; do
          port=$((port + 3))
          line=$(haul_through $port "$delay" "$rate" "$loss" $((rep * 7919)) "$tmp/in$mib" --rate "$rate" --scheme "$scheme")
          echo "{\"delay\":\"$delay\",\"rate\":\"$rate\",\"mib\":$mib,\"loss\":$loss,\"rep\":$rep,\"forced\":\"$scheme\",\"run\":$line}" >> "$results"
        done
      done
    done
  done
done
# The table: medians per cell and scheme; auto against the better forced.
jq -rs '
  def median: sort | if length == 0 then null else .[(length - 1) / 2 | floor] end;
  def r3: . * 1000 | round / 1000;
  group_by([.delay, .rate, .mib, .loss]) | .[] |
  . as $cell |
  ([ "auto", "sr", "ec" ] | map(. as $s | [$cell[] | select(.forced == $s) | .run.seconds // 1e9] | median)) as $t |
  ([$cell[] | select(.forced == "auto") | .run.ideal_seconds] | median) as $ideal |
  ([$cell[] | select(.forced == "auto") | .run.scheme] | unique | join("/")) as $chose |
  ([$cell[] | .run.ok] | all) as $ok |
  "| \($cell[0].delay) \($cell[0].rate) | \($cell[0].mib) MiB | \($cell[0].loss) | \($t[0] | r3) (\($t[0] / $ideal | r3)x) | \($t[1] | r3) (\($t[1] / $ideal | r3)x) | \($t[2] | r3) (\($t[2] / $ideal | r3)x) | \($t[0] / ([$t[1], $t[2]] | min) | r3) | \($chose) | \($ok) |"
' "$results" | sort -t'|' -k2,2 -k3,3n -k4,4g | {
  echo "| one-way delay, rate | size | loss | auto s (x ideal) | sr s | ec s | auto / best forced | auto chose (most bytes) | all ok |"
  echo "|---|---|---|---|---|---|---|---|---|"
  cat
}
