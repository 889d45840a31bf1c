#!/usr/bin/env bash
# hosts-scale.sh [HOSTS] [PER_HOST]: jobs over network-namespace hosts
# (scripts/hostbed), rvma against Open MPI's mpirun on the same hosts.
#   1. startup: hello (putwin) at 2, 16 and HOSTS*PER_HOST ranks, whole
#      job timed, rvmarun against Open MPI's mpirun and MPICH's Hydra
#      (mpiexec.hydra) running a C MPI hello (bench/mpi/hello.c: init,
#      barrier, finalize), RUNS alternating runs;
#   2. halo3d at HOSTS*PER_HOST ranks: rvma (auto: shm within a host, udp
#      across) against Open MPI (pml ob1 over btl vader within a host and
#      tcp across, osc pt2pt: its rdma osc cannot make a window across
#      these hosts) running our bench/mpi/halo3d.c, with their checksums;
#   3. file descriptors and sockets per rank, sampled while halo3d runs;
#   4. rvma's halo3d launched by mpirun.openmpi itself (the ranks meet
#      through Open MPI's PMIx servers), whole job timed, its checksums
#      beside rvmarun's;
#   5. memory per rank (RSS and PSS) and of the launchers, sampled while
#      halo3d runs at HOSTS*PER_HOST ranks under rvmarun and, our
#      bench/mpi/halo3d.c, under mpirun.openmpi (scripts/hosts-mem.sh).
# Needs root, iproute2, go, mpicc.openmpi/mpirun.openmpi (skipped without).
# Environment: RUNS (default 3), HALO (halo3d's arguments), MEMHALO (step
# 5's, default HALO), ONLY=mem (step 5 alone).
set -euo pipefail
cd "$(dirname "$0")/.."
H=${1:-4}
P=${2:-16}
N=$((H * P))
RUNS=${RUNS:-3}
HALO=${HALO:-"-n 16 --iters 50 --warmup 5 --sync sendrecv,fence,pscw,lock"}
MEMHALO=${MEMHALO:-$HALO}
OUT=$(mktemp -d)
go build -o "$OUT/rvmarun" ./cmd/rvmarun
go build -o "$OUT/putwin" ./examples/putwin
go build -o "$OUT/halo3d" ./examples/halo3d
MPICH=
if command -v mpicc.mpich >/dev/null && command -v mpiexec.hydra >/dev/null; then
	mpicc.mpich -O2 -o "$OUT/hello_mpich" bench/mpi/hello.c
	MPICH=1
fi
OMPI=
if command -v mpicc.openmpi >/dev/null && command -v mpirun.openmpi >/dev/null; then
	mpicc.openmpi -O2 -o "$OUT/hello" bench/mpi/hello.c
	[ -f bench/mpi/halo3d.c ] && mpicc.openmpi -O2 -o "$OUT/halo3d_ompi" bench/mpi/halo3d.c -lm
	OMPI=1
fi
export OUT
cat >"$OUT/job.sh" <<'JOB'
#!/bin/sh
# job.sh rvma|ompi N PROG [ARGS...]: N ranks over the testbed's hosts
which=$1 n=$2; shift 2
if [ "$which" = rvma ]; then
	exec "$OUT/rvmarun" -n "$n" -H "$HOSTBED_HOSTS" --launch-agent "$HOSTBED_AGENT" --rendezvous-addr "$HOSTBED_ADDR0" "$@"
fi
if [ "$which" = mpich ]; then
	# Hydra's proxies connect back over the testbed's interface (same name in every host).
	IF=$(ip -o -4 addr show | awk '/10\.78\./ {print $2; exit}')
	UCX_NET_DEVICES=$IF exec mpiexec.hydra -launcher ssh -launcher-exec "$HOSTBED_AGENT" -iface "$IF" \
		-hosts "$(echo "$HOSTBED_HOSTS" | tr -d ' ')" -n "$n" -bind-to none "$@"
fi
exec mpirun.openmpi --allow-run-as-root -n "$n" --host "$HOSTBED_HOSTS" --mca plm_rsh_agent "$HOSTBED_AGENT" \
	--mca routed direct --mca pml ob1 --mca osc pt2pt --mca btl self,vader,tcp --mca oob_tcp_if_include 10.78.0.0/16 \
	--mca btl_tcp_if_include 10.78.0.0/16 --bind-to none "$@"
JOB
chmod +x "$OUT/job.sh"
cat >"$OUT/bench.sh" <<'BENCH'
#!/bin/bash
# Runs inside the testbed's first host.
set -euo pipefail
N=$1 RUNS=$2 HALO=$3 MEMHALO=$4
mem() {
	echo "== memory while halo3d runs, $N ranks: $MEMHALO"
	echo "| processes | count | RSS MiB min / median / max | RSS total | PSS MiB min / median / max | PSS total |"
	echo "|---|---|---|---|---|---|"
	"$MEM" "rvma halo3d" "$OUT/halo3d" "$OUT/job.sh" rvma "$N" "$OUT/halo3d" $MEMHALO
	if [ -n "${OMPI:-}" ] && [ -x "$OUT/halo3d_ompi" ]; then
		"$MEM" "Open MPI halo3d" "$OUT/halo3d_ompi" "$OUT/job.sh" ompi "$N" "$OUT/halo3d_ompi" \
			$(echo "$MEMHALO" | sed 's/,notify//; s/notify,//')
	fi
}
if [ "${ONLY:-}" = mem ]; then
	mem
	exit
fi
ms() {
	local t0 t1
	t0=$(date +%s%N)
	"$@" >"$OUT/last.log" 2>&1 || { echo "FAILED: $*" >&2; tail -5 "$OUT/last.log" >&2; }
	t1=$(date +%s%N)
	echo $(((t1 - t0) / 1000000))
}
echo "== startup (ms, whole job; $RUNS alternating runs)"
for n in 2 16 "$N"; do
	r=() o=() m=()
	for _ in $(seq "$RUNS"); do
		r+=("$(ms "$OUT/job.sh" rvma "$n" "$OUT/putwin")")
		[ -n "${OMPI:-}" ] && o+=("$(ms "$OUT/job.sh" ompi "$n" "$OUT/hello")")
		[ -n "${MPICH:-}" ] && m+=("$(ms "$OUT/job.sh" mpich "$n" "$OUT/hello_mpich")")
	done
	echo "ranks $n: rvmarun putwin ${r[*]}; mpirun.openmpi hello ${o[*]:-skipped}; mpiexec.hydra hello ${m[*]:-skipped}"
done
echo "== halo3d, $N ranks: $HALO"
"$OUT/job.sh" rvma "$N" "$OUT/halo3d" $HALO 2>&1 | grep -E '^\[0@' &
# Sample once every rank runs (connections are made as neighbours are
# first used, during the warmup).
for _ in $(seq 100); do [ "$(pgrep -fc "^$OUT/halo3d")" -ge "$N" ] && break; sleep 0.1; done
sleep 1
echo "fds per rank (min/median/max), sockets per rank, while halo3d runs:"
for p in $(pgrep -f "^$OUT/halo3d"); do
	echo "$(ls /proc/$p/fd 2>/dev/null | wc -l) $(ls -l /proc/$p/fd 2>/dev/null | grep -c socket)"
done | sort -n | awk '{f[NR]=$1; s[NR]=$2} END {if (NR) printf "  fds %d/%d/%d, sockets %d/%d/%d over %d ranks\n", f[1], f[int((NR+1)/2)], f[NR], s[1], s[int((NR+1)/2)], s[NR], NR}'
wait
if [ -n "${OMPI:-}" ]; then
	echo "== rvma's halo3d, $N ranks, launched by mpirun.openmpi (PMIx bootstrap): $HALO"
	t0=$(date +%s%N)
	"$OUT/job.sh" ompi "$N" "$OUT/halo3d" $HALO 2>&1 | grep -E '^ *(halo3d|sendrecv|fence|pscw|lock|notify|serial)' | tail -8
	echo "whole job $((($(date +%s%N) - t0) / 1000000)) ms"
fi
if [ -n "${OMPI:-}" ] && [ -x "$OUT/halo3d_ompi" ]; then
	# MPI has no notified windows: the same run without that variant.
	"$OUT/job.sh" ompi "$N" "$OUT/halo3d_ompi" $(echo "$HALO" | sed 's/,notify//; s/notify,//') 2>&1 | grep -E '^ *(halo3d|sendrecv|fence|pscw|lock|serial)' | tail -8
fi
mem
BENCH
chmod +x "$OUT/bench.sh"
go run ./scripts/hostbed -hosts "$H" -slots "$P" -- env OUT="$OUT" OMPI="$OMPI" MPICH="$MPICH" MEM="$PWD/scripts/hosts-mem.sh" \
	ONLY="${ONLY:-}" "$OUT/bench.sh" "$N" "$RUNS" "$HALO" "$MEMHALO"
rm -rf "$OUT"
