package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rvma/rvma/internal/testbed"
	"github.com/rvma/rvma/internal/units"
	"github.com/rvma/rvma/multipath"
	"github.com/rvma/rvma/verbs"
)

// mp_bw: one multipath.Conn over --paths paths, depth writes of --size in
// flight for --duration; the aggregate and each path's goodput. With
// --testbed the paths are real: a namespace testbed with one veth pair per
// path, shaped by --rate, built and removed by this run; otherwise the
// devices are loop or udp devices with one GID per path, in this process.

// parseRate turns a tc rate ("200mbit", "1gbit", "500kbit") into Gbit/s.
func parseRate(r string) (float64, error) {
	bits, err := units.ParseRate(r)
	if err != nil {
		return 0, fmt.Errorf("--rate: %w", err)
	}
	return bits / 1e9, nil
}

type mpSide struct {
	dev *verbs.Device
	pd  *verbs.PD
	mr  *verbs.MR
}

func openMP(ctx context.Context, uri string, size int) (*mpSide, error) {
	e, err := openEndpoint(ctx, uri, false) // testbed links: the MAC as by default
	if err != nil {
		return nil, err
	}
	mr, err := e.pd.RegisterMR(make([]byte, size), verbs.AccessAll)
	if err != nil {
		e.dev.Close()
		return nil, err
	}
	return &mpSide{dev: e.dev, pd: e.pd, mr: mr}, nil
}

// mpEnv is an mp test's two ends and the connection between them.
type mpEnv struct {
	a, b     *mpSide
	c        *multipath.Conn
	bed      *testbed.Bed // with --testbed
	provider string
	rates    []float64
	closers  []func()
}

func (e *mpEnv) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// buildBed builds the namespace testbed of --testbed (nil without it),
// one path per --paths, shaped to --rate; rates are the shaped rates in
// Gbit/s (nil without --rate). On error the caller closes what was built.
func buildBed(o *options) (*testbed.Bed, []float64, error) {
	var rates []float64
	var rateStr []string
	if o.rate != "" {
		rateStr = strings.Split(o.rate, ",")
		if len(rateStr) == 1 {
			for len(rateStr) < o.paths {
				rateStr = append(rateStr, rateStr[0])
			}
		}
		if len(rateStr) != o.paths {
			return nil, nil, fmt.Errorf("--rate: %d rates for %d paths", len(rateStr), o.paths)
		}
		for _, r := range rateStr {
			g, err := parseRate(r)
			if err != nil {
				return nil, nil, err
			}
			rates = append(rates, g)
		}
		if !o.testbed {
			return nil, nil, fmt.Errorf("--rate shapes the --testbed's paths; add --testbed")
		}
	}
	if !o.testbed {
		return nil, nil, nil
	}
	if err := testbed.Available(); err != nil {
		return nil, nil, err
	}
	bed, err := testbed.Build(testbed.Config{Paths: o.paths, Rates: rateStr})
	return bed, rates, err
}

func bedA(p testbed.Path) netip.Addr { return p.A }
func bedB(p testbed.Path) netip.Addr { return p.B }

// bedURI is a UDP device with one address per testbed path, on one side.
func bedURI(bed *testbed.Bed, side func(testbed.Path) netip.Addr) string {
	var parts []string
	for _, p := range bed.Paths {
		parts = append(parts, netip.AddrPortFrom(side(p), 0).String())
	}
	return "udp://" + strings.Join(parts, ",")
}

// mpSetup builds the devices (and the testbed) and connects paths of them.
func mpSetup(ctx context.Context, o *options, paths, size int) (_ *mpEnv, err error) {
	env := &mpEnv{}
	defer func() {
		if err != nil {
			env.close() // what was built before the failure
		}
	}()
	if o.paths < 1 || o.paths > 16 {
		return nil, fmt.Errorf("--paths %d: want 1..16", o.paths)
	}
	bed, rates, err := buildBed(o)
	if bed != nil {
		env.closers = append(env.closers, bed.Close)
		env.bed = bed
	}
	if err != nil {
		return nil, err
	}
	var a, b *mpSide
	inA := func(f func() error) error { return f() }
	inB := inA
	provider := o.provider
	lnAddr := "127.0.0.1:0"
	switch {
	case bed != nil:
		provider = "udp"
		lnAddr = netip.AddrPortFrom(bed.Paths[0].B, 0).String()
		inA = func(f func() error) error { return bed.In(bed.NameA, f) }
		inB = func(f func() error) error { return bed.In(bed.NameB, f) }
		if err := inA(func() (err error) {
			a, err = openMP(ctx, bedURI(bed, bedA), size)
			return
		}); err != nil {
			return nil, err
		}
		if err := inB(func() (err error) {
			b, err = openMP(ctx, bedURI(bed, bedB), size)
			return
		}); err != nil {
			a.dev.Close()
			return nil, err
		}
	case o.provider == "loop":
		uri := fmt.Sprintf("loop://rvma-perf-mp-%d?gids=%d", time.Now().UnixNano(), o.paths)
		if a, err = openMP(ctx, uri, size); err == nil {
			b, err = openMP(ctx, uri, size)
		}
	default: // udp: one loopback address per path
		var parts []string
		for i := range o.paths {
			parts = append(parts, fmt.Sprintf("127.0.0.%d:0", i+1))
		}
		uri := "udp://" + strings.Join(parts, ",")
		if a, err = openMP(ctx, uri, size); err == nil {
			b, err = openMP(ctx, uri, size)
		}
	}
	if err != nil {
		return nil, err
	}
	env.closers = append(env.closers, func() { a.dev.Close() }, func() { b.dev.Close() })

	var ln *multipath.Listener
	if err := inB(func() (err error) { ln, err = multipath.Listen(ctx, b.pd, lnAddr, nil); return }); err != nil {
		return nil, err
	}
	env.closers = append(env.closers, func() { ln.Close() })
	acc := make(chan *multipath.Conn, 1)
	go func() {
		c, _ := ln.Accept(ctx)
		acc <- c
	}()
	cfg := &multipath.Config{Paths: paths, Revive: -1}
	if o.chunk > 0 { // a fixed chunk size, for comparison with the adaptive one
		cfg.MinChunk, cfg.MaxChunk = o.chunk, o.chunk
	}
	var c *multipath.Conn
	if err := inA(func() (err error) { c, err = multipath.Dial(ctx, a.pd, ln.Addr(), cfg); return }); err != nil {
		return nil, err
	}
	env.closers = append(env.closers, func() { c.Close() })
	if peer := <-acc; peer != nil {
		env.closers = append(env.closers, func() { peer.Close() })
	}
	env.a, env.b, env.c, env.provider, env.rates = a, b, c, provider, rates
	return env, nil
}

func mpBW(ctx context.Context, o *options) (*Result, error) {
	size := max(o.size, 1)
	depth := max(1, min(o.depth, 8))
	if o.iters > 0 {
		depth = min(depth, o.iters)
	}
	// Each request in flight writes its own slot of the destination: two
	// requests' sub-flows must not write the same bytes at once.
	env, err := mpSetup(ctx, o, o.paths, size*depth)
	if err != nil {
		return nil, err
	}
	defer env.close()
	a, b, c, provider, rates := env.a, env.b, env.c, env.provider, env.rates
	loss, err := parseLoss(o.loss, o.paths)
	if err != nil {
		return nil, err
	}
	for i, p := range loss {
		// Seeded drops on the sender's path i (both ends share no port,
		// so only data packets are lost; ACKs come back).
		if err := a.dev.SetFaults(i, verbs.Faults{Drop: p, Seed: uint64(i + 1)}); err != nil {
			return nil, err
		}
	}
	if err := c.Probe(ctx); err != nil {
		return nil, err
	}
	before := c.Paths()
	failPath, failAt, err := parseFail(o.fail, o.paths)
	if err != nil {
		return nil, err
	}
	if failPath >= 0 {
		if env.bed == nil {
			return nil, fmt.Errorf("--fail takes a testbed path down; add --testbed")
		}
		rand.Read(a.mr.Bytes()[:size]) // the data is checked at the end
		t := time.AfterFunc(failAt, func() { env.bed.SetDown(failPath, true) })
		defer t.Stop()
	}
	var inflight []*multipath.Request
	var done []time.Duration // completion times, for the failover's goodput over time
	var plot *sampler
	if o.plot != "" {
		plot = startSampler(o.paths, func() []uint64 {
			var b []uint64
			for _, p := range c.Paths() {
				b = append(b, p.Bytes)
			}
			return b
		}, 100*time.Millisecond)
	}
	cpu0 := cpuTime()
	start := time.Now()
	n := 0
	for ; o.iters > 0 && n < o.iters || o.iters == 0 && time.Since(start) < o.duration; n++ {
		if len(inflight) == depth {
			if err := inflight[0].Wait(ctx); err != nil {
				return nil, err
			}
			inflight = inflight[1:]
			done = append(done, time.Since(start))
		}
		slot := uint64(n%depth) * uint64(size)
		r, err := c.Write(a.mr, 0, size, b.mr.Addr()+slot, b.mr.RKey())
		if err != nil {
			return nil, err
		}
		inflight = append(inflight, r)
	}
	for _, r := range inflight {
		if err := r.Wait(ctx); err != nil {
			return nil, err
		}
		done = append(done, time.Since(start))
	}
	el := time.Since(start).Seconds()
	cpu := (cpuTime() - cpu0).Seconds()
	if plot != nil {
		title := fmt.Sprintf("mp_bw: %d paths, %d-byte writes", o.paths, size)
		if failPath >= 0 {
			title += fmt.Sprintf(", path %d down at %v", failPath, failAt)
		}
		if err := savePlot(o.plot, title, plot.finish()); err != nil {
			return nil, err
		}
	}
	after := c.Paths()
	res := &Result{Test: o.test, Provider: provider, Size: size, Iters: n, QPs: o.paths, Seconds: el,
		Gbps: float64(n) * float64(size) * 8 / el / 1e9, Mops: float64(n) / el / 1e6, Paths: o.paths, PathRateGbps: rates,
		CPUSecPerGiB: cpu / (float64(n) * float64(size) / (1 << 30)), PathLoss: loss}
	for _, p := range after {
		res.PathChunk = append(res.PathChunk, p.Chunk)
	}
	for i := range after {
		res.PathGbps = append(res.PathGbps, float64(after[i].Bytes-before[i].Bytes)*8/el/1e9)
	}
	if failPath >= 0 {
		for k := range min(n, depth) {
			if !bytes.Equal(a.mr.Bytes()[:size], b.mr.Bytes()[k*size:(k+1)*size]) {
				return nil, fmt.Errorf("mp_bw: data differs after the failover")
			}
		}
		survivors := 0.0
		for i, r := range rates {
			if i != failPath {
				survivors += r
			}
		}
		res.RecoveryS = recovery(done, size, failAt, 0.85*survivors)
	}
	return res, nil
}

// cpuTime is the process's user and system time: both ends run in it.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// parseLoss parses --loss P[,P...] (per-path drop probabilities; one
// value applies to every path).
func parseLoss(s string, paths int) ([]float64, error) {
	if s == "" {
		return nil, nil
	}
	f := strings.Split(s, ",")
	if len(f) == 1 {
		for len(f) < paths {
			f = append(f, f[0])
		}
	}
	if len(f) != paths {
		return nil, fmt.Errorf("--loss: %d values for %d paths", len(f), paths)
	}
	var out []float64
	for _, v := range f {
		p, err := strconv.ParseFloat(v, 64)
		if err != nil || p < 0 || p >= 1 {
			return nil, fmt.Errorf("--loss %q: want probabilities in [0, 1)", s)
		}
		out = append(out, p)
	}
	return out, nil
}

// parseFail parses --fail PATH@TIME (e.g. 1@2s); path -1 without it.
func parseFail(s string, paths int) (int, time.Duration, error) {
	if s == "" {
		return -1, 0, nil
	}
	p, t, ok := strings.Cut(s, "@")
	path, err1 := strconv.Atoi(p)
	at, err2 := time.ParseDuration(t)
	if !ok || err1 != nil || err2 != nil || path < 0 || path >= paths || at <= 0 {
		return 0, 0, fmt.Errorf("--fail %q: want PATH@TIME, such as 1@2s", s)
	}
	return path, at, nil
}

// recovery returns how long after failAt the goodput over a 500 ms
// window first reached want Gbit/s again (-1 if it never did), from the
// completion times of size-byte writes.
func recovery(done []time.Duration, size int, failAt time.Duration, want float64) float64 {
	const window = 500 * time.Millisecond
	for i, t := range done {
		if t < failAt {
			continue
		}
		n := 0
		for _, u := range done[i:] {
			if u <= t+window {
				n++
			}
		}
		if t+window <= done[len(done)-1] && float64(n*size)*8/window.Seconds()/1e9 >= want {
			return (t - failAt).Seconds()
		}
	}
	return -1
}

// mp_fct: Virtuoso's figure 7. An elephant (4 MiB writes, two in flight)
// runs for --duration while a 256 KiB mouse is written every 100 ms; the
// result's latencies are the mice's flow completion times. With
// --paths N > 1 the elephant is split over the paths and the mice go whole
// on the path the balancer picks; run it with --paths 1 for the unsplit
// case (everything on one path, a plain RC connection) and compare.
func mpFCT(ctx context.Context, o *options) (*Result, error) {
	const elephant, mouse = 4 << 20, 256 << 10
	// Two elephant slots (two in flight must not write the same bytes at
	// once), then the mice's.
	env, err := mpSetup(ctx, o, o.paths, 2*elephant+mouse)
	if err != nil {
		return nil, err
	}
	defer env.close()
	a, b, c := env.a, env.b, env.c
	if err := c.Probe(ctx); err != nil {
		return nil, err
	}
	ectx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	var eBytes int64
	go func() { // the elephant
		var inflight []*multipath.Request
		slot := 0
		for ectx.Err() == nil {
			if len(inflight) == 2 {
				if err := inflight[0].Wait(ctx); err != nil {
					done <- err
					return
				}
				inflight = inflight[1:]
				eBytes += elephant
			}
			slot = 1 - slot
			r, err := c.Write(a.mr, 0, elephant, b.mr.Addr()+uint64(slot*elephant), b.mr.RKey())
			if err != nil {
				done <- err
				return
			}
			inflight = append(inflight, r)
		}
		for _, r := range inflight {
			r.Wait(ctx)
		}
		done <- nil
	}()
	var fct []time.Duration
	start := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for time.Since(start) < o.duration {
		<-tick.C
		t0 := time.Now()
		r, err := c.Write(a.mr, 2*elephant, mouse, b.mr.Addr()+2*elephant, b.mr.RKey())
		if err != nil {
			return nil, err
		}
		if err := r.Wait(ctx); err != nil {
			return nil, err
		}
		fct = append(fct, time.Since(t0))
	}
	el := time.Since(start).Seconds()
	stop()
	if err := <-done; err != nil {
		return nil, err
	}
	if len(fct) == 0 {
		return nil, fmt.Errorf("mp_fct: no mice in %v", o.duration)
	}
	r, err := latencyResult(o.test, mouse, fct, el)
	if err != nil {
		return nil, err
	}
	// The bandwidth is the elephant's; the latencies are the mice's.
	r.Provider, r.QPs, r.Gbps, r.Paths, r.PathRateGbps = env.provider, o.paths, float64(eBytes)*8/el/1e9, o.paths, env.rates
	return r, nil
}
