package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func runJSON(t *testing.T, args ...string) Result {
	t.Helper()
	var out, errb bytes.Buffer
	require.NoError(t, run(context.Background(), append(args, "--json"), &out, &errb), errb.String())
	var r Result
	require.NoError(t, json.Unmarshal(out.Bytes(), &r), out.String())
	return r
}

func TestEveryTest(t *testing.T) {
	for _, test := range tests {
		if test == "write_lat" && raceEnabled {
			continue // polls memory the peer writes: a deliberate race, as in ib_write_lat
		}
		t.Run(test, func(t *testing.T) {
			r := runJSON(t, test, "--iters", "200", "--size", "4096")
			require.Equal(t, test, r.Test)
			require.Positive(t, r.Iters)
			require.Positive(t, r.Gbps)
			require.Positive(t, r.Mops)
			if isLat(test) {
				require.Positive(t, r.LatP50)
				require.GreaterOrEqual(t, r.LatP99, r.LatP50)
			}
			if test != "memcpy" {
				require.Equal(t, "loop", r.Provider)
			}
		})
	}
}

func TestMultipleQPs(t *testing.T) {
	r := runJSON(t, "write_bw", "--iters", "256", "--qps", "3", "--size", "1000")
	require.Equal(t, 3, r.QPs)
	require.GreaterOrEqual(t, r.Iters, 3*256)
}

func TestDurationMode(t *testing.T) {
	r := runJSON(t, "read_bw", "--duration", "50ms", "--size", "512")
	require.Positive(t, r.Iters)
	require.InDelta(t, 0.05, r.Seconds, 0.5)
}

func TestBadArguments(t *testing.T) {
	cases := map[string][]string{
		"unknown test":          {"nope"},
		"no test":               {"--size", "8"},
		"loop across processes": {"write_bw", "--server", "127.0.0.1:0"},
		"both sides":            {"write_bw", "--server", "a", "--connect", "b"},
		"bad size":              {"write_bw", "--size", "-1"},
		"bad provider":          {"write_bw", "--provider", "carrier-pigeon"},
		"zero-size write_lat":   {"write_lat", "--size", "0"},
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			var out, errb bytes.Buffer
			err := run(context.Background(), args, &out, &errb)
			require.Error(t, err)
			require.Empty(t, strings.TrimSpace(out.String()))
		})
	}
}

func TestVs(t *testing.T) {
	var out, errb bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"write_bw", "--vs", "memcpy", "--reps", "2", "--iters", "64", "--size", "4096", "--json"}, &out, &errb), errb.String())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 5, "two pairs of results and the ratio")
	var r Ratio
	require.NoError(t, json.Unmarshal([]byte(lines[4]), &r))
	require.Equal(t, "memcpy", r.Vs)
	require.Len(t, r.All, 2)
	require.Positive(t, r.Median)
	var errs bytes.Buffer
	require.Error(t, run(context.Background(), []string{"write_bw", "--vs", "write_lat"}, &out, &errs), "bandwidth vs latency")
}
