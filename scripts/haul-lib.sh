# Shared by the haul-*.sh side-by-side scripts (sourced, not run): builds
# haul and linkem, makes $tmp (removed at exit, with any process left) and
# $results, and runs one transfer through linkem.

haul_setup() {
	cd "$(dirname "$0")/.."
	go build -o bin/haul ./cmd/haul
	go build -o bin/linkem ./cmd/linkem
	tmp=$(mktemp -d)
	trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
	results=${OUT:-$tmp/results.jsonl}
	: >"$results"
}

# haul_through PORT DELAY RATE LOSS SEED FILE [SEND ARGS...]: one transfer
# of FILE through linkem (one-way DELAY, RATE, LOSS, SEED); prints haul
# send's JSON line, or {"ok":false}.
haul_through() {
	local port=$1 delay=$2 rate=$3 loss=$4 seed=$5 file=$6
	shift 6
	bin/linkem --a 127.0.0.1:$((port + 1)) --b 127.0.0.1:$((port + 2)) --delay "$delay" --rate "$rate" \
		--loss "$loss" --seed "$seed" >"$tmp/linkem.log" 2>&1 &
	local lp=$!
	bin/haul recv --listen 127.0.0.1:"$port" --via 127.0.0.1:$((port + 2)) --out "$tmp/out" >"$tmp/recv.log" 2>&1 &
	local rp=$!
	sleep 0.3
	bin/haul send --to 127.0.0.1:"$port" --via 127.0.0.1:$((port + 1)) "$@" --json "$file" 2>/dev/null || echo '{"ok":false}'
	wait $rp || true
	kill -INT $lp
	wait $lp || true
	rm -f "$tmp/out"
}
