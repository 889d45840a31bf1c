package main

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/rvma/rvma/internal/testbed"
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
	units := []struct {
		suffix string
		gbps   float64
	}{{"gbit", 1}, {"mbit", 1e-3}, {"kbit", 1e-6}}
	for _, u := range units {
		if v, ok := strings.CutSuffix(r, u.suffix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f <= 0 {
				break
			}
			return f * u.gbps, nil
		}
	}
	return 0, fmt.Errorf("--rate %q: want a tc rate such as 200mbit or 1gbit", r)
}

type mpSide struct {
	dev *verbs.Device
	pd  *verbs.PD
	mr  *verbs.MR
}

func openMP(ctx context.Context, uri string, size int) (*mpSide, error) {
	dev, err := verbs.Open(ctx, uri, nil)
	if err != nil {
		return nil, err
	}
	pd, err := dev.AllocPD()
	if err != nil {
		dev.Close()
		return nil, err
	}
	mr, err := pd.RegisterMR(make([]byte, size), verbs.AccessAll)
	if err != nil {
		dev.Close()
		return nil, err
	}
	return &mpSide{dev: dev, pd: pd, mr: mr}, nil
}

func mpBW(ctx context.Context, o *options) (*Result, error) {
	if o.paths < 1 || o.paths > 16 {
		return nil, fmt.Errorf("--paths %d: want 1..16", o.paths)
	}
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
			return nil, fmt.Errorf("--rate: %d rates for %d paths", len(rateStr), o.paths)
		}
		for _, r := range rateStr {
			g, err := parseRate(r)
			if err != nil {
				return nil, err
			}
			rates = append(rates, g)
		}
		if !o.testbed {
			return nil, fmt.Errorf("--rate shapes the --testbed's paths; add --testbed")
		}
	}
	size := max(o.size, 1)
	var a, b *mpSide
	var err error
	inA := func(f func() error) error { return f() }
	inB := inA
	provider := o.provider
	lnAddr := "127.0.0.1:0"
	switch {
	case o.testbed:
		if err := testbed.Available(); err != nil {
			return nil, err
		}
		bed, err := testbed.Build(testbed.Config{Paths: o.paths, Rates: rateStr})
		if bed != nil {
			defer bed.Close()
		}
		if err != nil {
			return nil, err
		}
		provider = "udp"
		lnAddr = netip.AddrPortFrom(bed.Paths[0].B, 0).String()
		inA = func(f func() error) error { return bed.In(bed.NameA, f) }
		inB = func(f func() error) error { return bed.In(bed.NameB, f) }
		uri := func(addr func(testbed.Path) netip.Addr) string {
			var parts []string
			for _, p := range bed.Paths {
				parts = append(parts, netip.AddrPortFrom(addr(p), 0).String())
			}
			return "udp://" + strings.Join(parts, ",")
		}
		if err := inA(func() (err error) {
			a, err = openMP(ctx, uri(func(p testbed.Path) netip.Addr { return p.A }), size)
			return
		}); err != nil {
			return nil, err
		}
		if err := inB(func() (err error) {
			b, err = openMP(ctx, uri(func(p testbed.Path) netip.Addr { return p.B }), size)
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
	defer a.dev.Close()
	defer b.dev.Close()

	var ln *multipath.Listener
	if err := inB(func() (err error) { ln, err = multipath.Listen(ctx, b.pd, lnAddr, nil); return }); err != nil {
		return nil, err
	}
	defer ln.Close()
	acc := make(chan *multipath.Conn, 1)
	go func() {
		c, _ := ln.Accept(ctx)
		acc <- c
	}()
	cfg := &multipath.Config{Paths: o.paths, Revive: -1}
	var c *multipath.Conn
	if err := inA(func() (err error) { c, err = multipath.Dial(ctx, a.pd, ln.Addr(), cfg); return }); err != nil {
		return nil, err
	}
	defer c.Close()
	if peer := <-acc; peer != nil {
		defer peer.Close()
	}
	if err := c.Probe(ctx); err != nil {
		return nil, err
	}
	before := c.Paths()
	depth := max(1, min(o.depth, 8))
	var inflight []*multipath.Request
	start := time.Now()
	n := 0
	for ; o.iters > 0 && n < o.iters || o.iters == 0 && time.Since(start) < o.duration; n++ {
		if len(inflight) == depth {
			if err := inflight[0].Wait(ctx); err != nil {
				return nil, err
			}
			inflight = inflight[1:]
		}
		r, err := c.Write(a.mr, 0, size, b.mr.Addr(), b.mr.RKey())
		if err != nil {
			return nil, err
		}
		inflight = append(inflight, r)
	}
	for _, r := range inflight {
		if err := r.Wait(ctx); err != nil {
			return nil, err
		}
	}
	el := time.Since(start).Seconds()
	after := c.Paths()
	res := &Result{Test: o.test, Provider: provider, Size: size, Iters: n, QPs: o.paths, Seconds: el,
		Gbps: float64(n) * float64(size) * 8 / el / 1e9, Mops: float64(n) / el / 1e6, Paths: o.paths, PathRateGbps: rates}
	for i := range after {
		res.PathGbps = append(res.PathGbps, float64(after[i].Bytes-before[i].Bytes)*8/el/1e9)
	}
	return res, nil
}
