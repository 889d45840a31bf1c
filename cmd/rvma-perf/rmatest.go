package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/rvma/rvma/internal/testbed"
	"github.com/rvma/rvma/rma"
	"github.com/rvma/rvma/verbs"
)

// Without --bind or a launcher (see rmaproc.go), the rma tests run two
// ranks of an in-process world (rma.NewWorld) over the chosen provider:
// the same process layout as the mailbox tests they are compared with
// (put_notify_lat, put_bw), and the only one for --testbed and the loop
// provider.

func isRMA(test string) bool { return test == "rma_put_lat" || test == "rma_put_bw" || mpiStyle(test) }

// rmaBufBytes is rma_put_bw's window, the same footprint as put_bw's:
// puts fill it at successive offsets, one epoch per fill, as put_bw fills
// its posted buffers.
const rmaBufBytes = 1 << 20

func rmaTest(ctx context.Context, o *options) (*Result, error) {
	cfg := rmaConfig(o)
	// --testbed: rank 0's paths are namespace A's ends of the veth pairs,
	// rank 1's namespace B's; the connection managers meet on loopback.
	bed, rates, err := buildBed(o)
	if bed != nil {
		defer bed.Close()
	}
	if err != nil {
		return nil, err
	}
	if bed != nil {
		cfg.Provider, cfg.Addr = "udp", "127.0.0.1"
		for i, ns := range []string{bed.NameA, bed.NameB} {
			side := []func(testbed.Path) netip.Addr{bedA, bedB}[i]
			var d *verbs.Device
			if err := bed.In(ns, func() (err error) { d, err = verbs.Open(ctx, bedURI(bed, side), nil); return }); err != nil {
				for _, d := range cfg.Devices {
					d.Close()
				}
				return nil, err
			}
			cfg.Devices = append(cfg.Devices, d)
		}
	}
	faults, err := rmaFaults(o)
	if err != nil {
		return nil, err
	}
	if o.longhaul && len(rates) > 0 {
		// Pace at the shaped rate (a long-haul link is not probed).
		cfg.LongHaul.Reliability.Rate = rates[0] * 1e9 / 8
	}
	comms, err := rma.NewWorld(ctx, 2, cfg)
	if err != nil {
		return nil, err
	}
	if faults.Active() {
		for _, c := range comms {
			if err := c.Device().SetFaults(-1, faults); err != nil {
				return nil, err
			}
		}
	}
	defer func() {
		done := make(chan struct{}, 2)
		for _, c := range comms {
			go func() {
				cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				c.Close(cctx)
				done <- struct{}{}
			}()
		}
		<-done
		<-done
	}()
	var res *Result
	errs := make([]error, 2)
	finished := make(chan int, 2)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for r, c := range comms {
		go func() {
			rr, err := rmaRank(ctx, c, o)
			if r == 0 {
				res = rr
			}
			if err != nil {
				cancel()
			}
			errs[r] = err
			finished <- r
		}()
	}
	<-finished
	<-finished
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if st := comms[0].Paths(1); st != nil {
		res.Paths = len(st)
		for _, p := range st {
			res.PathGbps = append(res.PathGbps, float64(p.Bytes)*8/res.Seconds/1e9)
		}
	}
	res.PathRateGbps = rates
	res.Ranks = "goroutines"
	if bed != nil {
		res.Provider = "udp"
	}
	return res, nil
}

// rmaPutBW: rank 0 streams puts into rank 1's notified window, keeping
// depth of them in flight; each fill of the window is one epoch.
func rmaPutBW(ctx context.Context, c *rma.Comm, o *options) (*Result, error) {
	per := max(1, rmaBufBytes/max(o.size, 1))
	w, err := c.Allocate(ctx, per*o.size, &rma.WinConfig{Notify: &rma.NotifyConfig{
		ExpectFrom: map[int]int{0: per * o.size}, Depth: 64}})
	if err != nil {
		return nil, err
	}
	// Rank 0 announces how many puts it will make only at the end, so the
	// receiver consumes epochs until told to stop.
	var res *Result
	if c.Rank() == 0 {
		src := make([]byte, o.size)
		depth := max(1, o.depth)
		ring := make([]*rma.Request, 0, depth)
		start := time.Now()
		deadline := start.Add(o.duration)
		n := 0
		for ; ; n++ {
			// Whole epochs only, so the receiver's count ends on one.
			if n%per == 0 && (o.iters > 0 && n >= o.iters || o.iters == 0 && time.Now().After(deadline)) {
				break
			}
			if len(ring) == depth {
				if err := ring[0].Wait(ctx); err != nil {
					return nil, err
				}
				ring = ring[1:]
			}
			r, err := w.Rput(ctx, src, 1, (n%per)*o.size)
			if err != nil {
				return nil, err
			}
			ring = append(ring, r)
		}
		if err := w.FlushAll(ctx); err != nil {
			return nil, err
		}
		el := time.Since(start).Seconds()
		res = &Result{Test: o.test, Provider: o.provider, Size: o.size, Iters: n, QPs: 1, Seconds: el,
			Gbps: float64(n) * float64(o.size) * 8 / el / 1e9, Mops: float64(n) / el / 1e6}
		if err := c.Send(ctx, 1, 0, []byte(fmt.Sprint(n/per))); err != nil {
			return nil, err
		}
	} else {
		// Wait for epochs while they come; the epoch count arrives last.
		got := 0
		for {
			wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			_, err := w.WaitEpoch(wctx)
			cancel()
			if err == nil {
				got++
				continue
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				return nil, err
			}
			if msg, ok := tryRecv(c); ok {
				var want int
				fmt.Sscan(string(msg), &want)
				for got < want {
					if _, err := w.WaitEpoch(ctx); err != nil {
						return nil, err
					}
					got++
				}
				break
			}
		}
	}
	return res, w.Free(ctx)
}

// tryRecv returns rank 0's final message if it has arrived.
func tryRecv(c *rma.Comm) ([]byte, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	m, err := c.Recv(ctx, 0, 0)
	return m, err == nil
}

// rmaFaults is what --loss and --delay ask of an rma test's devices.
func rmaFaults(o *options) (verbs.Faults, error) {
	loss, err := parseLoss(o.loss, 1)
	if err != nil {
		return verbs.Faults{}, err
	}
	f := verbs.Faults{Delay: o.delay, Seed: 1}
	if loss != nil {
		f.Drop = loss[0]
	}
	return f, nil
}
