// Command rvma-perf measures rvma's soft verbs the way perftest measures an
// RDMA NIC: bandwidth and latency of WRITE, READ, SEND and atomics between
// two QPs, plus the memory-copy ceiling on the same machine in the same
// run.
//
// Usage:
//
//	rvma-perf TEST [flags]
//
// Tests: write_bw, write_lat (half a ping-pong, the target polling memory,
// as ib_write_lat), write_ack_lat (a signaled WRITE until its completion:
// the round trip of MPI put + flush), read_bw, read_lat, send_bw, send_lat,
// atomic_lat, put_bw (mailbox puts into a window, one epoch per put),
// put_notify_lat (an RVMA put the target learns of by waiting on its
// window, replied the same way) and write_send_lat (a WRITE then a 1-byte
// SEND the target waits on: the RDMA specification's way, both posted
// together), write_flush_send_lat (a WRITE, its completion, then the SEND:
// put + flush + notify as MPI and libfabric applications do it), and the
// baselines memcpy (copy bandwidth), udp_raw (the raw
// UDP ceiling on the same sockets) and udp_pingpong (raw UDP round trip / 2).
// Both sides run in one process unless --server or --connect is given; the
// two sides then run as two processes that meet through the connection
// manager (the loop provider is in-process only, so two-process runs need a
// network provider).
//
// The rma tests measure package rma between two ranks: rma_put_lat (the
// same as rma_notify_lat: a ping-pong of puts into notified windows, one
// way), rma_put_bw (puts streamed into a notified window), and the tests
// that bench/mpi/rma_bench.c runs with MPI: rma_put_flush_lat (Put + Flush
// under a shared lock), rma_get_lat, rma_acc_lat (Accumulate sum of 8 B +
// Flush), rma_fop_lat (FetchAndOp sum), rma_cas_lat (CompareAndSwap),
// rma_put_notify_lat (Put + Flush + a 1-byte Send, ping-pong, one way),
// rma_put_rate (64 puts + Flush, in MB/s and Mops), rma_barrier_lat
// (Barrier) and rma_fence_lat (Fence on a window). Their ranks are
// goroutines of this process, or two processes bound to cores 0 and 1 with
// --bind, or the processes of a job (rvmarun -n 2, mpiexec -n 2).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rvma/rvma/internal/spin"
)

// Result is one measurement; --json prints it as one line.
type Result struct {
	Test     string  `json:"test"`
	Provider string  `json:"provider"`
	Size     int     `json:"size"`
	Iters    int     `json:"iters"`
	QPs      int     `json:"qps"`
	Seconds  float64 `json:"seconds"`
	Gbps     float64 `json:"gbps"`
	Mops     float64 `json:"mops"`
	LatP50   float64 `json:"lat_us_p50"`
	LatP99   float64 `json:"lat_us_p99"`
	LatAvg   float64 `json:"lat_us_avg"`
	Chunk    int     `json:"chunk,omitempty"` // memcpy: piece size
	// rma_put_rate: bytes put per second, in 10^6 (MPI benchmarks' MB/s).
	MBps float64 `json:"mb_per_s,omitempty"`
	// rma tests: whether the two ranks were "processes" or "goroutines".
	Ranks string `json:"ranks,omitempty"`
	// shm: the operations this side executed through shared memory
	// without a packet for the data, and how ordinary (registered caller)
	// memory is reached: cross-memory attach, or the rings and why.
	Direct    uint64 `json:"direct_ops,omitempty"`
	CallerMem string `json:"caller_memory,omitempty"`
	// mp_bw: the number of paths, each path's measured goodput and, on
	// the testbed, its shaped rate.
	Paths        int       `json:"paths,omitempty"`
	PathGbps     []float64 `json:"path_gbps,omitempty"`
	PathRateGbps []float64 `json:"path_rate_gbps,omitempty"`
	// mp_bw --fail: seconds after the failure until the goodput over
	// 500 ms was back to 0.85 of the surviving paths' rates (-1: never).
	RecoveryS float64 `json:"recovery_s,omitempty"`
	// mp_bw: CPU seconds (both ends, this process) per GiB moved.
	CPUSecPerGiB float64 `json:"cpu_s_per_gib,omitempty"`
	// mp_bw: injected drop probability and final chunk size, per path.
	PathLoss  []float64 `json:"path_loss,omitempty"`
	PathChunk []int     `json:"path_chunk,omitempty"`
}

type options struct {
	accFloat  bool // rma_acc_lat: a Float64 sum, which the target's engine applies
	bind      bool
	test      string
	provider  string
	device    string
	size      int
	iters     int
	warmup    int
	duration  time.Duration
	qps       int
	depth     int
	mtu       int
	json      bool
	server    string
	connect   string
	chunk     int
	vs        string
	reps      int
	addr      string
	cpuprof   string
	paths     int
	pathsFlag string
	pathList  []int
	testbed   bool
	rate      string
	fail      string
	plot      string
	loss      string
	delay     time.Duration
	longhaul  bool
	noMAC     bool
}

var tests = []string{"write_bw", "write_lat", "write_ack_lat", "read_bw", "read_lat", "send_bw", "send_lat", "atomic_lat",
	"put_bw", "put_notify_lat", "write_send_lat", "write_flush_send_lat", "rma_put_lat", "rma_put_bw",
	"rma_put_flush_lat", "rma_get_lat", "rma_put_notify_lat", "rma_notify_lat", "rma_put_rate", "rma_acc_lat", "rma_fop_lat", "rma_cas_lat",
	"rma_barrier_lat", "rma_fence_lat",
	"mp_bw", "mp_fct",
	"memcpy", "udp_raw", "udp_pingpong", "shm_pingpong"}

// local reports whether a test is a baseline that runs without verbs.
func local(test string) bool {
	return test == "memcpy" || test == "udp_raw" || test == "udp_pingpong" || test == "shm_pingpong"
}

func isLat(test string) bool {
	return strings.HasSuffix(test, "_lat") || strings.HasSuffix(test, "_pingpong") || test == "mp_fct"
}

func isMP(test string) bool { return test == "mp_bw" || test == "mp_fct" }

// latencyResult summarises one-way times (or flow completion times) of a
// latency test measured over el seconds, size bytes each. It sorts lat.
func latencyResult(test string, size int, lat []time.Duration, el float64) (*Result, error) {
	n := len(lat)
	if n == 0 {
		return nil, fmt.Errorf("%s: no measurements", test)
	}
	slices.Sort(lat)
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	us := func(d time.Duration) float64 { return float64(d) / 1e3 }
	return &Result{Test: test, Size: size, Iters: n, QPs: 1, Seconds: el,
		Gbps: float64(n) * float64(size) * 8 / el / 1e9, Mops: float64(n) / el / 1e6,
		LatP50: us(lat[n/2]), LatP99: us(lat[n*99/100]), LatAvg: us(sum / time.Duration(n))}, nil
}

// pingPong times round trips of round after a warm-up (1000, or a tenth
// of --iters) for --iters rounds or --duration, and returns the one-way
// times (half a round trip) and the measured seconds; it stops early, with
// what it has, when ctx ends.
func pingPong(ctx context.Context, o *options, round func() error) ([]time.Duration, float64, error) {
	warm := 1000
	if o.iters > 0 {
		warm = min(1000, max(o.iters/10, 10))
	}
	var lat []time.Duration
	var begin time.Time
	deadline := time.Now().Add(24 * time.Hour)
	for i := 0; ; i++ {
		if i == warm {
			begin = time.Now()
			deadline = begin.Add(o.duration)
		}
		if i >= warm && (o.iters > 0 && len(lat) >= o.iters || o.iters == 0 && time.Now().After(deadline)) || ctx.Err() != nil {
			break
		}
		t0 := time.Now()
		if err := round(); err != nil {
			return nil, 0, err
		}
		if i >= warm {
			lat = append(lat, time.Since(t0)/2)
		}
	}
	return lat, time.Since(begin).Seconds(), nil
}

func main() {
	if c := os.Getenv(envCPU); c != "" {
		cpu, _ := strconv.Atoi(c)
		if err := pinTo(cpu); err != nil {
			fmt.Fprintln(os.Stderr, "rvma-perf:", err)
			os.Exit(1)
		}
	}
	if child, err := childRole(); child {
		if err != nil {
			fmt.Fprintln(os.Stderr, "rvma-perf:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "rvma-perf:", err)
		os.Exit(1)
	}
}

func parse(args []string, stderr io.Writer) (*options, error) {
	fs := flag.NewFlagSet("rvma-perf", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: rvma-perf TEST [flags]\ntests: %s\n", strings.Join(tests, " "))
		fs.PrintDefaults()
	}
	o := &options{}
	fs.StringVar(&o.provider, "provider", "loop", "provider: loop (in-process), udp, or shm (shared memory between processes of a host)")
	fs.StringVar(&o.addr, "addr", "127.0.0.1", "udp: the local IP address of the device")
	fs.StringVar(&o.cpuprof, "cpuprofile", "", "write a CPU profile of the run to this file")
	fs.StringVar(&o.device, "device", "", "device URI (default: chosen from --provider)")
	fs.BoolVar(&o.accFloat, "acc-float", false, "rma_acc_lat: accumulate a float64 (an active message the target's progress engine applies off shm) instead of an int64 (the NIC's fetch-and-add)")
	fs.IntVar(&o.size, "size", 0, "message size in bytes (default 8 for latency tests, 65536 otherwise)")
	fs.IntVar(&o.iters, "iters", 0, "iterations (default: run for --duration)")
	fs.IntVar(&o.warmup, "warmup", 0, "MPI-style rma tests: warm-up operations (default 1000; rma_put_rate: 10 rounds)")
	fs.DurationVar(&o.duration, "duration", 2*time.Second, "how long to run when --iters is not given")
	fs.IntVar(&o.qps, "qps", 1, "queue pairs (bandwidth tests run them in parallel)")
	fs.IntVar(&o.depth, "depth", 128, "outstanding requests per QP in bandwidth tests")
	fs.IntVar(&o.mtu, "mtu", 0, "cap on the path MTU (default: the provider's)")
	fs.BoolVar(&o.json, "json", false, "print one JSON object per result")
	fs.BoolVar(&o.noMAC, "no-mac", false, "udp: packets carry the keyed checksum instead of a MAC (verbs.DeviceConfig.NoMAC), for trusted fabrics")
	fs.BoolVar(&o.bind, "bind", false, "shm tests: pin this process to CPU 0 and the process it starts to CPU 1 (MPI's -bind-to core); rma tests: run the two ranks as two processes, rank r on CPU r")
	fs.StringVar(&o.server, "server", "", "run only the server side, listening on this TCP address")
	fs.StringVar(&o.connect, "connect", "", "run only the client side, connecting to this TCP address")
	fs.IntVar(&o.chunk, "chunk", 0, "memcpy: copy each message in pieces of this size (default: one copy); mp_bw: a fixed chunk size instead of the adaptive one")
	fs.StringVar(&o.vs, "vs", "", "also run this test with the same flags, alternating, and report the ratio")
	fs.IntVar(&o.reps, "reps", 1, "with --vs: number of alternating pairs; the median ratio is reported")
	fs.StringVar(&o.pathsFlag, "paths", "2", "mp_bw, mp_fct, rma_put_bw, rma_put_lat: number of paths, or a comma-separated list to run one after another (1,2,4,8); rma tests default to 1")
	fs.BoolVar(&o.testbed, "testbed", false, "mp_bw, rma_put_bw: run over a namespace testbed with one veth path per --paths (root)")
	fs.StringVar(&o.rate, "rate", "", "--testbed: tc rate per path, comma-separated (one value for all), e.g. 200mbit")
	fs.StringVar(&o.loss, "loss", "", "mp_bw: seeded drop probability per path on the sender, comma-separated (one value for all); rma tests: per packet, both directions")
	fs.DurationVar(&o.delay, "delay", 0, "rma tests: one-way delay added to every packet, both directions (an emulated long link)")
	fs.BoolVar(&o.longhaul, "longhaul", false, "rma tests: notified puts over the reliability layer (rma.Config.LongHaul) instead of RC")
	fs.StringVar(&o.plot, "plot", "", "mp_bw: draw per-path throughput over time into this .svg file")
	fs.StringVar(&o.fail, "fail", "", "mp_bw --testbed: take path P down at time T into the run (P@T, e.g. 1@2s)")
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fs.Usage()
		return nil, errors.New("missing TEST")
	}
	o.test = args[0]
	if err := fs.Parse(args[1:]); err != nil {
		return nil, err
	}
	if !slices.Contains(tests, o.test) {
		return nil, fmt.Errorf("unknown test %q (tests: %s)", o.test, strings.Join(tests, " "))
	}
	// The library reads no environment below rma.Init: RVMA_SPIN is ours
	// to apply.
	if err := spin.Set(os.Getenv(spin.EnvSpin)); err != nil {
		return nil, err
	}
	for _, f := range strings.Split(o.pathsFlag, ",") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 || n > 16 {
			return nil, fmt.Errorf("--paths %q: want numbers in 1..16, comma-separated", o.pathsFlag)
		}
		o.pathList = append(o.pathList, n)
	}
	pathsSet := false
	fs.Visit(func(f *flag.Flag) { pathsSet = pathsSet || f.Name == "paths" })
	if isRMA(o.test) && !pathsSet {
		o.pathList = []int{1} // an rma connection has one path unless asked
	}
	o.paths = o.pathList[0]
	sizeSet := false
	fs.Visit(func(f *flag.Flag) { sizeSet = sizeSet || f.Name == "size" })
	if !sizeSet {
		o.size = 65536
		if isLat(o.test) {
			o.size = 8
		}
	}
	switch {
	case o.size < 0 || o.size > 1<<30:
		return nil, fmt.Errorf("--size %d: want 0..1GiB", o.size)
	case o.test == "write_lat" && o.size < 1:
		return nil, errors.New("write_lat needs --size >= 1 (it polls the last byte)")
	case (o.test == "atomic_lat" || isAtomic(o.test)) && o.size != 8:
		o.size = 8
	case o.warmup < 0:
		return nil, errors.New("--warmup must be positive")
	case isRMA(o.test) && o.testbed && (o.bind || rankEnv()):
		return nil, errors.New("--testbed runs both ranks in one process: drop --bind")
	case isRMA(o.test) && rankEnv() && (o.vs != "" || len(o.pathList) > 1):
		return nil, errors.New("a rank of a job measures one test once: no --vs, one --paths")
	case o.qps < 1 || o.qps > 256:
		return nil, fmt.Errorf("--qps %d: want 1..256", o.qps)
	case o.depth < 1 || o.depth > 4096:
		return nil, fmt.Errorf("--depth %d: want 1..4096", o.depth)
	case o.server != "" && o.connect != "":
		return nil, errors.New("--server and --connect exclude each other")
	case o.iters < 0 || o.duration <= 0:
		return nil, errors.New("--iters and --duration must be positive")
	case o.vs != "" && !slices.Contains(tests, o.vs):
		return nil, fmt.Errorf("--vs: unknown test %q", o.vs)
	case o.vs != "" && isLat(o.vs) != isLat(o.test):
		return nil, errors.New("--vs compares a bandwidth test with a bandwidth test, a latency test with a latency test")
	case o.reps < 1 || o.reps > 100:
		return nil, fmt.Errorf("--reps %d: want 1..100", o.reps)
	case (local(o.test) || isRMA(o.test) || isMP(o.test)) && (o.server != "" || o.connect != ""):
		return nil, fmt.Errorf("%s runs both ends in one process", o.test)
	}
	if o.device == "" {
		switch o.provider {
		case "loop":
			if o.server != "" || o.connect != "" {
				return nil, errors.New("the loop provider is in-process: --server/--connect need a network provider")
			}
			o.device = fmt.Sprintf("loop://rvma-perf-%d", os.Getpid())
		case "udp":
			ip, err := netip.ParseAddr(o.addr)
			if err != nil {
				return nil, fmt.Errorf("--addr: %w", err)
			}
			o.device = "udp://" + netip.AddrPortFrom(ip, 0).String()
			if o.mtu > 0 {
				o.device += fmt.Sprintf("?mtu=%d", o.mtu)
			}
		case "shm":
			// One name for the server and the client: ports of other
			// names refuse each other.
			o.device = "shm://rvma-perf"
			if o.mtu > 0 {
				o.device += fmt.Sprintf("?mtu=%d", o.mtu)
			}
		default:
			return nil, fmt.Errorf("unknown provider %q", o.provider)
		}
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	// The rma tests place their ranks themselves (rmaproc.go).
	if o.bind && !isRMA(o.test) {
		if err := pinTo(0); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	if o.cpuprof != "" {
		f, err := os.Create(o.cpuprof)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if o.server != "" {
		return serve(ctx, o, stderr)
	}
	if (isMP(o.test) || isRMA(o.test)) && len(o.pathList) > 1 {
		for _, n := range o.pathList {
			one := *o
			one.paths = n
			res, err := measureOne(ctx, &one)
			if err != nil {
				return err
			}
			print(stdout, o, res)
		}
		return nil
	}
	if o.vs == "" {
		res, err := measureOne(ctx, o)
		if err != nil {
			return err
		}
		print(stdout, o, res)
		return nil
	}
	// Alternate the two tests so that both see the same machine, and
	// report the median ratio: these machines are shared and noisy.
	other := *o
	other.test = o.vs
	var ratios []float64
	for i := 0; i < o.reps; i++ {
		a, err := measureOne(ctx, o)
		if err != nil {
			return err
		}
		b, err := measureOne(ctx, &other)
		if err != nil {
			return err
		}
		print(stdout, o, a)
		print(stdout, o, b)
		if isLat(o.test) {
			ratios = append(ratios, a.LatP50/b.LatP50)
		} else {
			ratios = append(ratios, a.Gbps/b.Gbps)
		}
	}
	printRatio(stdout, o, ratios)
	return nil
}

func measureOne(ctx context.Context, o *options) (*Result, error) {
	switch o.test {
	case "memcpy":
		return memcpyTest(o), nil
	case "udp_raw":
		return udpRaw(ctx, o)
	case "udp_pingpong":
		return udpPingPong(ctx, o)
	case "shm_pingpong":
		return shmPingPong(ctx, o)
	case "rma_put_lat", "rma_put_bw", "rma_put_flush_lat", "rma_get_lat", "rma_put_notify_lat", "rma_notify_lat",
		"rma_put_rate", "rma_acc_lat", "rma_fop_lat", "rma_cas_lat", "rma_barrier_lat", "rma_fence_lat":
		if rankEnv() {
			return rmaAsRank(ctx, o)
		}
		if o.bind {
			return rmaSpawn(ctx, o)
		}
		return rmaTest(ctx, o)
	case "mp_bw":
		return mpBW(ctx, o)
	case "mp_fct":
		return mpFCT(ctx, o)
	}
	return client(ctx, o)
}

// Ratio is the --vs summary line.
type Ratio struct {
	Test   string    `json:"test"`
	Vs     string    `json:"vs"`
	Metric string    `json:"metric"`
	Size   int       `json:"size"`
	Median float64   `json:"ratio"`
	All    []float64 `json:"ratios"`
}

func printRatio(w io.Writer, o *options, ratios []float64) {
	r := Ratio{Test: o.test, Vs: o.vs, Metric: "gbps", Size: o.size, All: ratios}
	if isLat(o.test) {
		r.Metric = "lat_us_p50"
	}
	s := slices.Clone(ratios)
	slices.Sort(s)
	r.Median = s[len(s)/2]
	if o.json {
		b, _ := json.Marshal(r)
		fmt.Fprintln(w, string(b))
		return
	}
	fmt.Fprintf(w, "ratio %s/%s (%s) at %d bytes: median %.3f of %v\n", r.Test, r.Vs, r.Metric, r.Size, r.Median, ratios)
}

func print(w io.Writer, o *options, r *Result) {
	if r == nil {
		return // a rank other than 0 of an rma test
	}
	if o.json {
		b, _ := json.Marshal(r)
		fmt.Fprintln(w, string(b))
		return
	}
	fmt.Fprintf(w, "%-11s %-5s size %8d  iters %9d  qps %3d  %8.3f Gbit/s  %8.4f Mops", r.Test, r.Provider, r.Size, r.Iters, r.QPs, r.Gbps, r.Mops)
	if r.Paths > 0 {
		fmt.Fprintf(w, "  paths %d  per path Gbit/s %.3f", r.Paths, r.PathGbps)
		if r.PathRateGbps != nil {
			fmt.Fprintf(w, " (shaped %.3f)", r.PathRateGbps)
		}
	}
	if r.MBps > 0 {
		fmt.Fprintf(w, "  %.1f MB/s", r.MBps)
	}
	if isLat(r.Test) {
		fmt.Fprintf(w, "  lat p50 %.2f us  p99 %.2f us  avg %.2f us", r.LatP50, r.LatP99, r.LatAvg)
	}
	if r.CallerMem != "" {
		fmt.Fprintf(w, "  direct %d  caller memory: %s", r.Direct, r.CallerMem)
	}
	fmt.Fprintln(w)
}

// memcpyTest copies size bytes between two buffers for the duration (or
// iterations): the copy-bandwidth ceiling, measured the way a NIC moves the
// bytes here.
func memcpyTest(o *options) *Result {
	src, dst := make([]byte, o.size), make([]byte, o.size)
	for i := range src {
		src[i] = byte(i)
	}
	chunk := o.size
	if o.chunk > 0 && o.chunk < o.size {
		chunk = o.chunk
	}
	n := 0
	start := time.Now()
	for {
		for k := 0; k < 16; k++ {
			// Large copies use non-temporal stores in Go's memmove; a NIC
			// copies packet by packet, so --chunk measures that shape too.
			for off := 0; off < len(src); off += chunk {
				end := min(off+chunk, len(src))
				copy(dst[off:end], src[off:end])
			}
		}
		n += 16
		if o.iters > 0 && n >= o.iters || o.iters == 0 && time.Since(start) >= o.duration {
			break
		}
	}
	el := time.Since(start).Seconds()
	return &Result{Test: "memcpy", Provider: "cpu", Size: o.size, Chunk: chunk, Iters: n, QPs: 1, Seconds: el,
		Gbps: float64(n) * float64(o.size) * 8 / el / 1e9, Mops: float64(n) / el / 1e6}
}
