package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/rvma/rvma/rma"
)

// The MPI-style rma tests measure what an OSU-style MPI one-sided benchmark
// measures, with the scheme bench/mpi/rma_bench.c follows too, so that
// rvma and MPI can be compared result by result:
//
//   - rank 0 is the origin, rank 1 the target (which waits in a barrier
//     during one-sided tests, as an MPI target sits in MPI_Barrier);
//   - warm-up: --warmup operations (default 1000; rounds of 64 puts for
//     rma_put_rate: 10), untimed;
//   - then operations are timed in batches of latBatch (rounds of
//     rma_put_rate one by one) until the batches add up to --duration, or
//     --iters operations have run. A batch's time over its size is one
//     sample: a clock read costs about 20 ns, as much as a shared-memory
//     put, so timing each operation alone would measure the clock. p50 and
//     p99 are over these samples, avg over all;
//   - ping-pong tests report half a round trip; rank 0 tells rank 1 every
//     agreeEvery batches, untimed, whether to go on.

// latBatch is the number of operations (or round trips) timed together.
const latBatch = 10

// rateWindow is how many puts rma_put_rate issues before each flush, as
// osu_put_bw's window.
const rateWindow = 64

// Tags of the point-to-point messages of the ping-pong tests.
const (
	tagNote = 7 // put_notify_lat's 1-byte notification
	tagStop = 8 // rank 0 tells rank 1 whether the timed phase goes on
)

// mpiStyle reports whether test is one of the tests mirrored by
// bench/mpi/rma_bench.c (rma_notify_lat only on rvma's side: MPI has no
// notified windows); rma_put_lat, its old name, and rma_put_bw are not.
func mpiStyle(test string) bool {
	switch test {
	case "rma_put_flush_lat", "rma_get_lat", "rma_put_notify_lat", "rma_notify_lat", "rma_put_rate",
		"rma_acc_lat", "rma_fop_lat", "rma_cas_lat", "rma_barrier_lat", "rma_fence_lat":
		return true
	}
	return false
}

// isAtomic: tests on one 8-byte integer whatever --size says.
func isAtomic(test string) bool {
	return test == "rma_acc_lat" || test == "rma_fop_lat" || test == "rma_cas_lat"
}

// warmOps is the warm-up count: --warmup, else 1000 operations (10 rounds
// for rma_put_rate), fewer when --iters asks for a short run.
func warmOps(o *options) int {
	if o.warmup > 0 {
		return o.warmup
	}
	w := 1000
	if o.test == "rma_put_rate" {
		w = 10
	}
	if o.iters > 0 {
		w = min(w, max(o.iters/10, 2))
	}
	return w
}

// warmUp runs op n times.
func warmUp(n int, op func(i int) error) error {
	for i := range n {
		if err := op(i); err != nil {
			return err
		}
	}
	return nil
}

// timePhase runs op in batches of batch operations, first index from,
// until --iters operations have run or the batches have taken --duration
// (on rank 0's clock), and returns one sample per batch (its time over
// batch) and the seconds the batches took. With agree, both ranks run the
// phase: every agreeEvery batches, untimed, rank 0 says whether to go on
// and agree returns its word on both.
func timePhase(ctx context.Context, o *options, batch, from int, op func(i int) error, agree func(stop bool) (bool, error)) ([]time.Duration, float64, error) {
	var samples []time.Duration
	var total time.Duration
	for i := from; ; i += batch {
		t0 := time.Now()
		for k := range batch {
			if err := op(i + k); err != nil {
				return nil, 0, err
			}
		}
		d := time.Since(t0)
		samples = append(samples, d/time.Duration(batch))
		total += d
		stop := ctx.Err() != nil || o.iters > 0 && len(samples)*batch >= o.iters || o.iters == 0 && total >= o.duration
		if agree != nil {
			if len(samples)%agreeEvery != 0 {
				continue
			}
			var err error
			if stop, err = agree(stop); err != nil {
				return nil, 0, err
			}
		}
		if stop {
			break
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	return samples, total.Seconds(), nil
}

// agreeEvery is how many batches of round trips the ping-pong ranks run
// between two agreements on whether to stop.
const agreeEvery = 10

// opsResult summarises a run of ops operations of size bytes over el
// seconds, with per-operation samples (divided by div: 2 for half round
// trips).
func opsResult(o *options, ops int, samples []time.Duration, el float64, div int) *Result {
	slices.Sort(samples)
	us := func(d time.Duration) float64 { return float64(d) / 1e3 / float64(div) }
	n := len(samples)
	r := &Result{Test: o.test, Provider: o.provider, Size: o.size, Iters: ops, QPs: 1, Seconds: el,
		Gbps: float64(ops) * float64(o.size) * 8 / el / 1e9, Mops: float64(ops) / el / 1e6,
		LatAvg: el * 1e6 / float64(ops) / float64(div)}
	if n > 0 {
		r.LatP50, r.LatP99 = us(samples[n/2]), us(samples[n*99/100])
	}
	return r
}

// rmaRank runs rank c.Rank()'s part of an rma test; rank 0 returns the
// result, rank 1 nil.
func rmaRank(ctx context.Context, c *rma.Comm, o *options) (*Result, error) {
	switch o.test {
	case "rma_put_lat", "rma_notify_lat":
		return rmaNotifyLat(ctx, c, o)
	case "rma_put_bw":
		return rmaPutBW(ctx, c, o)
	case "rma_put_notify_lat":
		return rmaPutNotifyLat(ctx, c, o)
	case "rma_put_rate":
		return rmaPutRate(ctx, c, o)
	case "rma_barrier_lat", "rma_fence_lat":
		return rmaCollLat(ctx, c, o)
	}
	return rmaOneSided(ctx, c, o)
}

// rmaCollLat: both ranks in a loop of Barrier (rma_barrier_lat) or of
// Fence on a window (rma_fence_lat), as MPI_Barrier and MPI_Win_fence(0);
// one barrier or fence is one operation.
func rmaCollLat(ctx context.Context, c *rma.Comm, o *options) (*Result, error) {
	w, err := c.Allocate(ctx, 8, nil)
	if err != nil {
		return nil, err
	}
	round := func() error { return c.Barrier(ctx) }
	if o.test == "rma_fence_lat" {
		round = func() error { return w.Fence(ctx, 0) }
	}
	n, samples, el, err := pingPong2(ctx, c, o, round)
	var res *Result
	if err == nil && c.Rank() == 0 {
		res = opsResult(o, n, samples, el, 1)
	}
	return res, finish(ctx, c, w, err)
}

// rmaOneSided: rank 0 takes a shared lock on rank 1 once, then times one
// operation and its flush at a time (MPI_Win_lock shared; MPI_Put or Get
// or Accumulate or Fetch_and_op or Compare_and_swap; MPI_Win_flush).
func rmaOneSided(ctx context.Context, c *rma.Comm, o *options) (*Result, error) {
	w, err := c.Allocate(ctx, max(o.size, 8), nil)
	if err != nil {
		return nil, err
	}
	const target = 1
	var res *Result
	if c.Rank() == 0 {
		res, err = func() (*Result, error) {
			if err := w.Lock(ctx, rma.LockShared, target); err != nil {
				return nil, err
			}
			buf, one, result, cmp := make([]byte, o.size), make([]byte, 8), make([]byte, 8), make([]byte, 8)
			binary.LittleEndian.PutUint64(one, 1)
			misses := 0
			var op func(i int) error
			switch o.test {
			case "rma_put_flush_lat":
				op = func(int) error {
					if err := w.Put(ctx, buf, target, 0); err != nil {
						return err
					}
					return w.Flush(ctx, target)
				}
			case "rma_get_lat":
				op = func(int) error {
					if err := w.Get(ctx, buf, target, 0); err != nil {
						return err
					}
					return w.Flush(ctx, target)
				}
			case "rma_acc_lat":
				dt := rma.Int64
				if o.accFloat {
					dt = rma.Float64
				}
				op = func(int) error {
					if err := w.Accumulate(ctx, one, dt, rma.Sum, target, 0); err != nil {
						return err
					}
					return w.Flush(ctx, target)
				}
			case "rma_fop_lat":
				op = func(int) error {
					if err := w.FetchAndOp(ctx, one, result, rma.Int64, rma.Sum, target, 0); err != nil {
						return err
					}
					return w.Flush(ctx, target)
				}
			case "rma_cas_lat":
				// The i-th swap expects i and leaves i+1, so every one
				// succeeds (a failed compare is cheaper on some paths).
				op = func(i int) error {
					binary.LittleEndian.PutUint64(cmp, uint64(i))
					binary.LittleEndian.PutUint64(buf, uint64(i+1))
					if err := w.CompareAndSwap(ctx, buf, cmp, result, rma.Int64, target, 0); err != nil {
						return err
					}
					if err := w.Flush(ctx, target); err != nil {
						return err
					}
					if binary.LittleEndian.Uint64(result) != uint64(i) {
						misses++
					}
					return nil
				}
			default:
				return nil, fmt.Errorf("%s: not an rma test", o.test)
			}
			warm := warmOps(o)
			if err := warmUp(warm, op); err != nil {
				return nil, err
			}
			samples, el, err := timePhase(ctx, o, latBatch, warm, op, nil)
			if err != nil {
				return nil, err
			}
			n := len(samples) * latBatch
			// The atomics leave a count of themselves in the word: a
			// benchmark that moved nothing would be caught here.
			if isAtomic(o.test) {
				if err := w.Get(ctx, result, target, 0); err != nil {
					return nil, err
				}
				if err := w.Flush(ctx, target); err != nil {
					return nil, err
				}
				if got := binary.LittleEndian.Uint64(result); got != uint64(warm+n) || misses > 0 {
					return nil, fmt.Errorf("%s: the target word is %d after %d operations (%d failed compares)", o.test, got, warm+n, misses)
				}
			}
			if err := w.Unlock(ctx, target); err != nil {
				return nil, err
			}
			return opsResult(o, n, samples, el, 1), nil
		}()
	}
	return res, finish(ctx, c, w, err)
}

// finish ends a test on both ranks: a barrier (the target waits in it while
// the origin measures), then the collective Free. A failed rank skips the
// barrier; its peer then fails too, which is what should happen.
func finish(ctx context.Context, c *rma.Comm, w *rma.Win, err error) error {
	if err != nil {
		return err
	}
	if err := c.Barrier(ctx); err != nil {
		return err
	}
	return w.Free(ctx)
}

// rmaPutRate: rank 0 issues 64 puts of --size to successive offsets of
// rank 1's window, then one flush, per round (osu_put_bw -s flush style).
func rmaPutRate(ctx context.Context, c *rma.Comm, o *options) (*Result, error) {
	w, err := c.Allocate(ctx, rateWindow*max(o.size, 1), nil)
	if err != nil {
		return nil, err
	}
	const target = 1
	var res *Result
	if c.Rank() == 0 {
		res, err = func() (*Result, error) {
			if err := w.Lock(ctx, rma.LockShared, target); err != nil {
				return nil, err
			}
			// Distinct origin buffers too, as an application streaming
			// data reads it from different memory.
			src := make([]byte, rateWindow*o.size)
			round := func(int) error {
				for j := range rateWindow {
					if err := w.Put(ctx, src[j*o.size:(j+1)*o.size], target, j*o.size); err != nil {
						return err
					}
				}
				return w.Flush(ctx, target)
			}
			if err := warmUp(warmOps(o), round); err != nil {
				return nil, err
			}
			samples, el, err := timePhase(ctx, o, 1, 0, round, nil)
			if err != nil {
				return nil, err
			}
			n := len(samples)
			if err := w.Unlock(ctx, target); err != nil {
				return nil, err
			}
			puts := n * rateWindow
			r := opsResult(o, puts, samples, el, rateWindow)
			r.MBps = float64(puts) * float64(o.size) / el / 1e6
			return r, nil
		}()
	}
	return res, finish(ctx, c, w, err)
}

// pingPong2 runs round on both ranks, a warm-up then a timed phase;
// rank 0 decides when it ends and tells rank 1 (see timePhase). It returns
// the round trips timed, the samples and the seconds.
func pingPong2(ctx context.Context, c *rma.Comm, o *options, round func() error) (int, []time.Duration, float64, error) {
	one := func(int) error { return round() }
	if err := warmUp(warmOps(o), one); err != nil {
		return 0, nil, 0, err
	}
	agree := func(stop bool) (bool, error) {
		if c.Rank() == 0 {
			word := []byte{0}
			if stop {
				word[0] = 1
			}
			return stop, c.Send(ctx, 1, tagStop, word)
		}
		m, err := c.Recv(ctx, 0, tagStop)
		if err != nil {
			return false, err
		}
		if len(m) != 1 {
			return false, errors.New("ping-pong: a malformed stop message")
		}
		return m[0] == 1, nil
	}
	samples, el, err := timePhase(ctx, o, latBatch, 0, one, agree)
	return len(samples) * latBatch, samples, el, err
}

// rmaPutNotifyLat: a put, its flush, then a 1-byte message the target
// receives (MPI's way of telling a target that data has landed), answered
// the same way; under LockAll on both ranks. One way = half the round trip.
func rmaPutNotifyLat(ctx context.Context, c *rma.Comm, o *options) (*Result, error) {
	w, err := c.Allocate(ctx, max(o.size, 1), nil)
	if err != nil {
		return nil, err
	}
	peer := 1 - c.Rank()
	var res *Result
	err = func() error {
		if err := w.LockAll(ctx); err != nil {
			return err
		}
		src, note := make([]byte, o.size), []byte{1}
		put := func() error {
			if err := w.Put(ctx, src, peer, 0); err != nil {
				return err
			}
			if err := w.Flush(ctx, peer); err != nil {
				return err
			}
			return c.Send(ctx, peer, tagNote, note)
		}
		wait := func() error {
			_, err := c.Recv(ctx, peer, tagNote)
			return err
		}
		round := func() error {
			if c.Rank() == 0 {
				if err := put(); err != nil {
					return err
				}
				return wait()
			}
			if err := wait(); err != nil {
				return err
			}
			return put()
		}
		n, samples, el, err := pingPong2(ctx, c, o, round)
		if err != nil {
			return err
		}
		if c.Rank() == 0 {
			res = opsResult(o, n, samples, el, 2)
		}
		return w.UnlockAll(ctx)
	}()
	return res, finish(ctx, c, w, err)
}

// rmaNotifyLat: rank 0 puts into rank 1's notified window, rank 1 waits
// for the epoch and puts back the same way: RVMA's notified put, which
// needs neither a flush nor a message. One way = half the round trip.
func rmaNotifyLat(ctx context.Context, c *rma.Comm, o *options) (*Result, error) {
	peer := 1 - c.Rank()
	w, err := c.Allocate(ctx, max(o.size, 1), &rma.WinConfig{Notify: &rma.NotifyConfig{ExpectFrom: map[int]int{peer: o.size}}})
	if err != nil {
		return nil, err
	}
	src := make([]byte, o.size)
	round := func() error {
		if c.Rank() == 0 {
			if err := w.Put(ctx, src, peer, 0); err != nil {
				return err
			}
			_, err := w.WaitEpoch(ctx)
			return err
		}
		if _, err := w.WaitEpoch(ctx); err != nil {
			return err
		}
		return w.Put(ctx, src, peer, 0)
	}
	n, samples, el, err := pingPong2(ctx, c, o, round)
	var res *Result
	if err == nil && c.Rank() == 0 {
		res = opsResult(o, n, samples, el, 2)
	}
	return res, finish(ctx, c, w, err)
}
