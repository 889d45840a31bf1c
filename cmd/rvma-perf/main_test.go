package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMain lets the test binary serve as the processes rvma-perf starts
// (shm_pingpong's child, the shm server side), as the binary does.
func TestMain(m *testing.M) {
	if child, err := childRole(); child {
		if err != nil {
			os.Exit(1)
		}
		return
	}
	os.Exit(m.Run())
}

func runJSON(t *testing.T, args ...string) Result {
	t.Helper()
	var out, errb bytes.Buffer
	require.NoError(t, run(context.Background(), append(args, "--json"), &out, &errb), errb.String())
	var r Result
	require.NoError(t, json.Unmarshal(out.Bytes(), &r), out.String())
	return r
}

func TestEveryTest(t *testing.T) {
	for _, provider := range []string{"loop", "udp", "shm"} {
		for _, test := range tests {
			if test == "write_lat" && raceEnabled {
				continue // polls memory the peer writes: a deliberate race, as in ib_write_lat
			}
			if local(test) && provider == "udp" {
				continue // baselines do not depend on the provider
			}
			t.Run(provider+"/"+test, func(t *testing.T) {
				r := runJSON(t, test, "--provider", provider, "--iters", "200", "--size", "4096")
				require.Equal(t, test, r.Test)
				require.Positive(t, r.Iters)
				require.Positive(t, r.Gbps)
				require.Positive(t, r.Mops)
				if isLat(test) {
					require.Positive(t, r.LatP50)
					require.GreaterOrEqual(t, r.LatP99, r.LatP50)
				}
				switch test {
				case "memcpy":
					require.Equal(t, "cpu", r.Provider)
				case "udp_raw", "udp_pingpong":
					require.Equal(t, "udp", r.Provider)
				case "shm_pingpong":
					require.Equal(t, "shm", r.Provider)
				default:
					require.Equal(t, provider, r.Provider)
				}
			})
		}
	}
}

// TestTwoProcesses runs every verbs test as two processes, server and
// client, over the udp provider on loopback and over shared memory.
func TestTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := filepath.Join(t.TempDir(), "rvma-perf")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, string(out))
	for _, provider := range []string{"udp", "shm"} {
		for _, test := range tests {
			if local(test) || isRMA(test) || isMP(test) {
				continue // both ends in one process by design
			}
			twoProcesses(t, bin, provider, test)
		}
	}
}

func twoProcesses(t *testing.T, bin, provider, test string) {
	{
		t.Run(provider+"/"+test, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			port := freePort(t)
			srv := exec.CommandContext(ctx, bin, test, "--provider", provider, "--server", port)
			var srvOut bytes.Buffer
			srv.Stdout, srv.Stderr = &srvOut, &srvOut
			require.NoError(t, srv.Start())
			var res []byte
			var cerr error
			for try := 0; try < 50; try++ { // until the server listens
				res, cerr = exec.CommandContext(ctx, bin, test, "--provider", provider, "--connect", port,
					"--iters", "300", "--size", "2048", "--json").Output()
				if cerr == nil || !strings.Contains(string(res)+errText(cerr), "refused") {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			require.NoError(t, cerr, "client: %s %s", res, errText(cerr))
			require.NoError(t, srv.Wait(), "server: %s", srvOut.String())
			var r Result
			require.NoError(t, json.Unmarshal(res, &r), string(res))
			require.Equal(t, test, r.Test)
			require.Equal(t, provider, r.Provider)
			require.GreaterOrEqual(t, r.Iters, 300)
		})
	}
}

func errText(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return string(ee.Stderr)
	}
	if err != nil {
		return err.Error()
	}
	return ""
}

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
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
		"rma ranks on loop":     {"rma_put_flush_lat", "--bind", "--provider", "loop"},
		"rma testbed and bind":  {"rma_put_bw", "--bind", "--testbed", "--provider", "udp"},
		"negative warm-up":      {"rma_get_lat", "--warmup", "-1"},
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

func TestMPBW(t *testing.T) {
	r := runJSON(t, "mp_bw", "--provider", "loop", "--paths", "3", "--iters", "20", "--size", "1048576")
	require.Equal(t, 3, r.Paths)
	require.Len(t, r.PathGbps, 3)
	require.Positive(t, r.Gbps)
	_, err := parse([]string{"mp_bw", "--rate", "fast", "--testbed"}, io.Discard)
	require.NoError(t, err) // parsed; the rate is checked when the test runs
	_, err = parseRate("fast")
	require.Error(t, err)
	g, err := parseRate("200mbit")
	require.NoError(t, err)
	require.InDelta(t, 0.2, g, 1e-12)
}

// rma_put_bw over paths: the puts are split, every path carries some.
func TestRMAOverPaths(t *testing.T) {
	r := runJSON(t, "rma_put_bw", "--provider", "loop", "--paths", "3", "--iters", "20", "--size", "262144")
	require.Equal(t, 3, r.Paths)
	require.Len(t, r.PathGbps, 3)
	for i, g := range r.PathGbps {
		require.Positive(t, g, "path %d carried nothing", i)
	}
	r = runJSON(t, "rma_put_bw", "--provider", "loop", "--iters", "20", "--size", "262144")
	require.Zero(t, r.Paths, "an rma connection has one path unless --paths is given")
}

// rma_put_bw over the reliability layer through an emulated lossy, long
// link.
func TestRMALongHaul(t *testing.T) {
	r := runJSON(t, "rma_put_bw", "--provider", "loop", "--longhaul", "--delay", "2ms", "--loss", "0.01",
		"--iters", "16", "--size", "262144")
	require.Equal(t, 16, r.Iters)
	require.Positive(t, r.Gbps)
}

// The MPI-style rma tests with --bind: rvma-perf starts the two ranks as
// processes bound to cores, rank 0's result comes back through the
// parent; and the same binary as a rank of a job rvmarun starts.
func TestRMAProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dir := t.TempDir()
	bin, rvmarun := filepath.Join(dir, "rvma-perf"), filepath.Join(dir, "rvmarun")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, string(out))
	out, err = exec.Command("go", "build", "-o", rvmarun, "../rvmarun").CombinedOutput()
	require.NoError(t, err, string(out))
	check := func(t *testing.T, res []byte, test, provider string) {
		var r Result
		require.NoError(t, json.Unmarshal(res, &r), string(res))
		require.Equal(t, test, r.Test)
		require.Equal(t, provider, r.Provider)
		require.Equal(t, "processes", r.Ranks)
		require.GreaterOrEqual(t, r.Iters, 200)
		if test == "rma_put_rate" {
			require.Positive(t, r.MBps)
		} else {
			require.Positive(t, r.LatP50)
			require.GreaterOrEqual(t, r.LatP99, r.LatP50)
		}
	}
	for _, provider := range []string{"shm", "udp"} {
		for _, test := range tests {
			if !mpiStyle(test) {
				continue
			}
			t.Run(provider+"/"+test, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				res, err := exec.CommandContext(ctx, bin, test, "--provider", provider, "--bind",
					"--iters", "200", "--size", "256", "--json").Output()
				require.NoError(t, err, errText(err))
				check(t, res, test, provider)
			})
		}
	}
	t.Run("rvmarun", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		res, err := exec.CommandContext(ctx, rvmarun, "-n", "2", "--tag-output=false", bin, "rma_fop_lat",
			"--provider", "shm", "--iters", "200", "--json").Output()
		require.NoError(t, err, errText(err))
		check(t, bytes.TrimSpace(res), "rma_fop_lat", "shm")
	})
}

func TestPlotSVG(t *testing.T) {
	var b strings.Builder
	s := series{t: []float64{0.1, 0.2, 0.3}, gbps: [][]float64{{1, 2, 1}, {0, 0.5, 0}}, names: []string{"path 0", "path <1>"}}
	require.NoError(t, writeSVG(&b, "a & b", s))
	out := b.String()
	require.Equal(t, 2, strings.Count(out, "<polyline"))
	require.Contains(t, out, "a &amp; b")
	require.Contains(t, out, "path &lt;1&gt;")
	require.NoError(t, xml.Unmarshal([]byte(out), new(struct{})))
	require.Error(t, savePlot(filepath.Join(t.TempDir(), "x.png"), "", s), "only SVG is written")
}
