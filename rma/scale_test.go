package rma

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// TestManyRanks runs a job of many ranks as goroutines of this process:
// every rank creates a window, puts to its neighbours in a fence epoch and
// in a notified window, and the results are checked. make test runs 128
// ranks (about a minute on 2 cores under the race detector is the budget);
// RVMA_RANKS sets another count (1024: make perf-scale).
func TestManyRanks(t *testing.T) {
	n := 128
	if s := os.Getenv("RVMA_RANKS"); s != "" {
		n, _ = strconv.Atoi(s)
	}
	if testing.Short() {
		n = 32
	}
	t0 := time.Now()
	comms := newWorld(t, n, nil)
	t.Logf("%d ranks up in %v", n, time.Since(t0))
	each(t, comms, func(ctx context.Context, c *Comm) error {
		me, right, left := c.Rank(), (c.Rank()+1)%n, (c.Rank()+n-1)%n
		w, err := c.Allocate(ctx, 16, nil)
		if err != nil {
			return err
		}
		if err := w.Fence(ctx, ModeNoPrecede); err != nil {
			return err
		}
		if err := w.Put(ctx, u64(uint64(me)), right, 0); err != nil {
			return err
		}
		if err := w.Put(ctx, u64(uint64(me)), left, 8); err != nil {
			return err
		}
		if err := w.Fence(ctx, ModeNoSucceed); err != nil {
			return err
		}
		if got, got2 := i64(w.Bytes()), i64(w.Bytes()[8:]); got != int64(left) || got2 != int64(right) {
			return fmt.Errorf("fence window holds %d, %d; want %d, %d", got, got2, left, right)
		}
		// Three slots: with Depth 2, an origin may put epoch e+2 while
		// this rank reads epoch e.
		nw, err := c.Allocate(ctx, 24, &WinConfig{Notify: &NotifyConfig{ExpectFrom: map[int]int{left: 8}}})
		if err != nil {
			return err
		}
		for e := 1; e <= 3; e++ {
			if err := nw.Put(ctx, u64(uint64(1000*e+me)), right, 8*(e%3)); err != nil {
				return err
			}
			if _, err := nw.WaitEpoch(ctx); err != nil {
				return err
			}
			if got := i64(nw.Bytes()[8*(e%3):]); got != int64(1000*e+left) {
				return fmt.Errorf("epoch %d: %d, want %d", e, got, 1000*e+left)
			}
		}
		sum := []int64{int64(me)}
		if err := c.AllreduceInt64(ctx, ReduceSum, sum); err != nil {
			return err
		}
		if sum[0] != int64(n*(n-1)/2) {
			return fmt.Errorf("allreduce %d", sum[0])
		}
		// Every rank puts to rank 0 at once: most dial it now, all
		// together, as LockAll toward one target does.
		all, err := c.Allocate(ctx, 8*n, nil)
		if err != nil {
			return err
		}
		if err := all.Fence(ctx, ModeNoPrecede); err != nil {
			return err
		}
		if err := all.Put(ctx, u64(uint64(me+1)), 0, 8*me); err != nil {
			return err
		}
		if err := all.Fence(ctx, ModeNoSucceed); err != nil {
			return err
		}
		if me == 0 {
			for r := range n {
				if got := i64(all.Bytes()[8*r:]); got != int64(r+1) {
					return fmt.Errorf("rank %d's put to rank 0: %d", r, got)
				}
			}
		}
		if err := all.Free(ctx); err != nil {
			return err
		}
		if err := nw.Free(ctx); err != nil {
			return err
		}
		return w.Free(ctx)
	})
	t.Logf("%d ranks: the job took %v", n, time.Since(t0))
}
