#!/bin/bash
# hosts-mem.sh LABEL RANK_EXE CMD [ARGS...]: memory of a job while it runs.
# Starts CMD (a launcher), samples every process under it every 0.5 s until
# it ends, keeps each process's peak, and prints markdown table rows: the
# ranks (processes of RANK_EXE) and each kind of launcher process (the
# launcher, its per-host daemons, the launch agent's shells), RSS and PSS
# in MiB, min/median/max and total.
# Peaks over the whole run rather than one sample: halo3d's variants each
# make their windows, and one sample would depend on which variant it hit.
# PSS as well as RSS because shared-memory segments and shared libraries
# count in full in every rank's RSS but are split among the ranks in PSS;
# the PSS total is what the job costs the host.
# hosts-scale.sh runs it inside the testbed's first host.
set -euo pipefail
label=$1 exe=$2
shift 2
log=$(mktemp)
t0=$(date +%s%N)
"$@" >"$log" 2>&1 &
root=$!

# descendants: the launcher and the pids under it. Found through the
# process tree, not by name, so that other jobs on this machine are not
# counted: the namespaces share this host's PID space, so every testbed
# host's daemons and ranks are the launcher's descendants here.
descendants() {
	ps -e -o pid=,ppid= | awk -v root="$root" '
		{ kids[$2] = kids[$2] " " $1 }
		END { q[1] = root; t = 1; print root; for (i = 1; i <= t; i++) { m = split(kids[q[i]], k, " ")
			for (j = 1; j <= m; j++) { q[++t] = k[j]; print k[j] } } }'
}
# kind: pid -> what it is, decided again only when its name changes (an
# exec: the launch agent's shells, and ranks, which are their daemon until
# they exec), so that the samples stay cheap.
declare -A kind comm
classify() {
	local p=$1 c=$2 argv
	comm[$p]=$c
	if [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$exe" ]; then
		kind[$p]="$label ranks"
		return
	fi
	mapfile -d '' argv <"/proc/$p/cmdline" 2>/dev/null || true
	# rvmarun's per-host daemons are rvmarun too, run as "rvmarun --daemon".
	[ "${argv[1]:-}" = --daemon ] && c="$c --daemon"
	kind[$p]=$c
}
# Every 0.5 s: rvma's whole run at 64 ranks takes about 8 s, a variant 1-4 s.
# Reading smaps_rollup walks page tables, so this costs system time (about a
# third of a core here); the jobs' wall times moved by under 5 %.
samples=0
while sleep 0.5 && kill -0 "$root" 2>/dev/null; do
	files=()
	for p in $(descendants); do
		read -r c <"/proc/$p/comm" 2>/dev/null || continue
		[ "${comm[$p]:-}" = "$c" ] || classify "$p" "$c"
		files+=("/proc/$p/status" "/proc/$p/smaps_rollup")
	done
	# "/proc/PID/status:VmRSS: N kB"; processes gone meanwhile are skipped.
	grep -H -E '^(VmRSS|Pss):' "${files[@]}" 2>/dev/null >>"$log.mem" || true
	samples=$((samples + 1))
done
st=0
wait "$root" || st=$?
# Each process's peaks, by kind.
for p in "${!kind[@]}"; do echo "$p	${kind[$p]}"; done >"$log.kind"
awk -F '\t' 'NR == FNR { k[$1] = $2; next }
	{ split($0, f, "[/:]"); v = $0; sub(/.*:[ \t]*/, "", v); v += 0; p = f[3]
	  if (!(p in k)) next
	  if (f[5] == "VmRSS" && v > r[p]) r[p] = v
	  if (f[5] == "Pss" && v > s[p]) s[p] = v }
	END { for (p in r) if (p in s) print k[p] "\t" r[p] "\t" s[p] }' "$log.kind" "$log.mem" >"$log.peak"
# stats: min / median / max | total of KiB on stdin, in MiB.
stats() {
	sort -n | awk '{ v[NR] = $1; t += $1 }
		END { printf "%.1f / %.1f / %.1f | %.1f", v[1] / 1024, v[int((NR + 1) / 2)] / 1024, v[NR] / 1024, t / 1024 }'
}
# Ranks first, then launcher processes by name.
{ echo "$label ranks"; cut -f1 "$log.peak" | grep -v -x "$label ranks" | sort -u; } | while read -r k; do
	grep -q "^$k	" "$log.peak" || continue
	echo "| $k | $(grep -c "^$k	" "$log.peak") | $(grep "^$k	" "$log.peak" | cut -f2 | stats) | $(grep "^$k	" "$log.peak" | cut -f3 | stats) |"
done
echo "($label: $samples samples; job $((($(date +%s%N) - t0) / 1000000)) ms, exit $st)"
[ "$st" = 0 ] || tail -5 "$log" >&2
rm -f "$log" "$log.mem" "$log.kind" "$log.peak"
