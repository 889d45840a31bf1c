package rma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func newWorld(t *testing.T, n int, cfg *Config) []*Comm {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	comms, err := NewWorld(ctx, n, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		// Short: after a failed test the ranks disagree and Close's
		// barrier cannot complete.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for _, c := range comms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.Close(ctx)
			}()
		}
		wg.Wait()
	})
	return comms
}

// each runs f on every rank concurrently and fails the test on any error.
func each(t *testing.T, comms []*Comm, f func(ctx context.Context, c *Comm) error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for i, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if errs[i] = f(ctx, c); errs[i] != nil {
				cancel() // the others would wait for this rank forever
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			require.NoError(t, err, "rank %d", i)
		}
	}
	for i, err := range errs {
		require.NoError(t, err, "rank %d", i)
	}
}

func u64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }
func i64(b []byte) int64  { return int64(binary.LittleEndian.Uint64(b)) }

func TestCollectives(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			comms := newWorld(t, n, nil)
			each(t, comms, func(ctx context.Context, c *Comm) error {
				for range 3 {
					if err := c.Barrier(ctx); err != nil {
						return err
					}
				}
				buf := make([]byte, 100_000) // fragments
				if c.Rank() == n-1 {
					for i := range buf {
						buf[i] = byte(i * 7)
					}
				}
				if err := c.Bcast(ctx, n-1, buf); err != nil {
					return err
				}
				for i := range buf {
					if buf[i] != byte(i*7) {
						return fmt.Errorf("bcast byte %d = %d", i, buf[i])
					}
				}
				all, err := c.Allgather(ctx, []byte(fmt.Sprintf("rank-%d", c.Rank())))
				if err != nil {
					return err
				}
				for r := range n {
					if string(all[r]) != fmt.Sprintf("rank-%d", r) {
						return fmt.Errorf("allgather[%d] = %q", r, all[r])
					}
				}
				iv := []int64{int64(c.Rank()), -int64(c.Rank()), 7}
				if err := c.AllreduceInt64(ctx, ReduceSum, iv); err != nil {
					return err
				}
				want := int64(n * (n - 1) / 2)
				if iv[0] != want || iv[1] != -want || iv[2] != 7*int64(n) {
					return fmt.Errorf("allreduce sum = %v", iv)
				}
				fv := []float64{float64(c.Rank()) + 0.5}
				if err := c.AllreduceFloat64(ctx, ReduceMax, fv); err != nil {
					return err
				}
				if fv[0] != float64(n-1)+0.5 {
					return fmt.Errorf("allreduce max = %v", fv)
				}
				mv := []int64{int64(c.Rank()) + 3}
				if err := c.AllreduceInt64(ctx, ReduceMin, mv); err != nil {
					return err
				}
				if mv[0] != 3 {
					return fmt.Errorf("allreduce min = %v", mv)
				}
				return nil
			})
		})
	}
}

func TestSendRecv(t *testing.T) {
	comms := newWorld(t, 2, nil)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		peer := 1 - c.Rank()
		big := make([]byte, 200_000)
		for i := range big {
			big[i] = byte(i + c.Rank())
		}
		r1, err := c.Isend(ctx, peer, 5, big)
		if err != nil {
			return err
		}
		r2, err := c.Isend(ctx, peer, 6, []byte("small"))
		if err != nil {
			return err
		}
		small, err := c.Recv(ctx, peer, 6) // tags match independently of order
		if err != nil {
			return err
		}
		got, err := c.Recv(ctx, peer, 5)
		if err != nil {
			return err
		}
		if string(small) != "small" || len(got) != len(big) {
			return fmt.Errorf("got %q and %d bytes", small, len(got))
		}
		for i := range got {
			if got[i] != byte(i+peer) {
				return fmt.Errorf("byte %d", i)
			}
		}
		return WaitAll(ctx, r1, r2)
	})
	ctx := context.Background()
	_, err := comms[0].Isend(ctx, 7, 0, nil)
	require.ErrorIs(t, err, ErrRank)
	_, err = comms[0].Isend(ctx, 1, -1, nil)
	require.ErrorIs(t, err, ErrSync)
}

func TestPutGetFence(t *testing.T) {
	const n = 4
	comms := newWorld(t, n, nil)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		w, err := c.Allocate(ctx, 8*n, &WinConfig{DispUnit: 8})
		if err != nil {
			return err
		}
		if err := w.Fence(ctx, ModeNoPrecede); err != nil {
			return err
		}
		for r := range n { // my rank+1 into slot [me] of everyone
			if err := w.Put(ctx, u64(uint64(100*c.Rank()+r)), r, c.Rank()); err != nil {
				return err
			}
		}
		if err := w.Fence(ctx, 0); err != nil {
			return err
		}
		for s := range n {
			if got := binary.LittleEndian.Uint64(w.Bytes()[8*s:]); got != uint64(100*s+c.Rank()) {
				return fmt.Errorf("slot %d = %d", s, got)
			}
		}
		// Get the right neighbour's whole window.
		right := (c.Rank() + 1) % n
		buf := make([]byte, 8*n)
		if err := w.Get(ctx, buf, right, 0); err != nil {
			return err
		}
		if err := w.Fence(ctx, ModeNoSucceed); err != nil {
			return err
		}
		for s := range n {
			if got := binary.LittleEndian.Uint64(buf[8*s:]); got != uint64(100*s+right) {
				return fmt.Errorf("get slot %d = %d", s, got)
			}
		}
		// No epoch after NoSucceed.
		if err := w.Put(ctx, u64(1), right, 0); !errors.Is(err, ErrNoEpoch) {
			return fmt.Errorf("put outside an epoch: %v", err)
		}
		return w.Free(ctx)
	})
}

func TestPSCW(t *testing.T) {
	const n = 3
	comms := newWorld(t, n, nil)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		w, err := c.Allocate(ctx, 64, nil)
		if err != nil {
			return err
		}
		left, right := (c.Rank()+n-1)%n, (c.Rank()+1)%n
		for it := range 20 {
			if err := w.Post(ctx, []int{left}, 0); err != nil {
				return err
			}
			if err := w.Start(ctx, []int{right}, 0); err != nil {
				return err
			}
			msg := []byte(fmt.Sprintf("it %02d from %d", it, c.Rank()))
			if err := w.Put(ctx, msg, right, 0); err != nil {
				return err
			}
			if err := w.Complete(ctx); err != nil {
				return err
			}
			if err := w.Wait(ctx); err != nil {
				return err
			}
			if want := fmt.Sprintf("it %02d from %d", it, left); string(w.Bytes()[:len(want)]) != want {
				return fmt.Errorf("iteration %d: %q", it, w.Bytes()[:len(want)])
			}
		}
		if err := w.Complete(ctx); !errors.Is(err, ErrSync) {
			return fmt.Errorf("complete without start: %v", err)
		}
		return w.Free(ctx)
	})
}

func TestLockExclusiveExcludes(t *testing.T) {
	const n, rounds = 4, 15
	comms := newWorld(t, n, nil)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		w, err := c.Allocate(ctx, 8, nil)
		if err != nil {
			return err
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		// Read-modify-write with plain get and put: only mutual exclusion
		// makes the count come out right.
		buf := make([]byte, 8)
		for range rounds {
			if err := w.Lock(ctx, LockExclusive, 0); err != nil {
				return err
			}
			if err := w.Get(ctx, buf, 0, 0); err != nil {
				return err
			}
			if err := w.Flush(ctx, 0); err != nil {
				return err
			}
			v := binary.LittleEndian.Uint64(buf)
			if err := w.Put(ctx, u64(v+1), 0, 0); err != nil {
				return err
			}
			if err := w.Unlock(ctx, 0); err != nil {
				return err
			}
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		if c.Rank() == 0 {
			if got := binary.LittleEndian.Uint64(w.Bytes()); got != n*rounds {
				return fmt.Errorf("counter %d, want %d", got, n*rounds)
			}
		}
		return w.Free(ctx)
	})
}

func TestLockSharedShares(t *testing.T) {
	comms := newWorld(t, 3, nil)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		w, err := c.Allocate(ctx, 8, nil)
		if err != nil {
			return err
		}
		// Ranks 1 and 2 hold shared locks on rank 0 at the same time.
		if c.Rank() > 0 {
			if err := w.Lock(ctx, LockShared, 0); err != nil {
				return err
			}
		}
		if err := c.Barrier(ctx); err != nil { // both hold it here
			return err
		}
		if c.Rank() == 0 {
			// An exclusive lock must wait for both.
			short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
			err := w.Lock(short, LockExclusive, 0)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("exclusive lock granted while shared held: %v", err)
			}
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		if c.Rank() > 0 {
			if err := w.Unlock(ctx, 0); err != nil {
				return err
			}
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		if c.Rank() == 0 {
			if err := w.Lock(ctx, LockExclusive, 0); err != nil {
				return err
			}
			if err := w.Unlock(ctx, 0); err != nil {
				return err
			}
			if err := w.Unlock(ctx, 0); !errors.Is(err, ErrSync) {
				return fmt.Errorf("unlock without lock: %v", err)
			}
		}
		return w.Free(ctx)
	})
}

func TestFetchAndOpCounter(t *testing.T) {
	const n, each1 = 4, 25
	comms := newWorld(t, n, nil)
	var mu sync.Mutex
	seen := map[int64]bool{}
	each(t, comms, func(ctx context.Context, c *Comm) error {
		w, err := c.Allocate(ctx, 16, nil)
		if err != nil {
			return err
		}
		if err := w.LockAll(ctx); err != nil {
			return err
		}
		res := make([]byte, 8)
		for range each1 {
			// The NIC's fetch-and-add (int64 sum) ...
			if err := w.FetchAndOp(ctx, u64(1), res, Int64, Sum, 0, 0); err != nil {
				return err
			}
			if err := w.Flush(ctx, 0); err != nil {
				return err
			}
			mu.Lock()
			if seen[i64(res)] {
				mu.Unlock()
				return fmt.Errorf("ticket %d handed out twice", i64(res))
			}
			seen[i64(res)] = true
			mu.Unlock()
			// ... and an active-message fetch-and-op (float64 sum) on the
			// next element.
			fb, fres := u64(math.Float64bits(0.5)), make([]byte, 8)
			if err := w.FetchAndOp(ctx, fb, fres, Float64, Sum, 0, 1*8); err != nil {
				return err
			}
		}
		if err := w.UnlockAll(ctx); err != nil {
			return err
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		if c.Rank() == 0 {
			if got := i64(w.Bytes()); got != n*each1 {
				return fmt.Errorf("counter %d", got)
			}
			if got := math.Float64frombits(binary.LittleEndian.Uint64(w.Bytes()[8:])); got != 0.5*n*each1 {
				return fmt.Errorf("float counter %v", got)
			}
		}
		return w.Free(ctx)
	})
	require.Len(t, seen, n*each1)
}

func TestCompareAndSwapMutex(t *testing.T) {
	const n, rounds = 3, 10
	comms := newWorld(t, n, nil)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		// Word 0: mutex (0 free, rank+1 held); word 1: protected counter;
		// bytes 16..19: an int32 for the active-message CAS.
		w, err := c.Allocate(ctx, 24, nil)
		if err != nil {
			return err
		}
		if err := w.LockAll(ctx); err != nil {
			return err
		}
		res, buf := make([]byte, 8), make([]byte, 8)
		me := u64(uint64(c.Rank() + 1))
		for range rounds {
			for {
				if err := w.CompareAndSwap(ctx, me, u64(0), res, Uint64, 0, 0); err != nil {
					return err
				}
				if err := w.Flush(ctx, 0); err != nil {
					return err
				}
				if binary.LittleEndian.Uint64(res) == 0 {
					break
				}
			}
			if err := w.Get(ctx, buf, 0, 8); err != nil {
				return err
			}
			if err := w.Flush(ctx, 0); err != nil {
				return err
			}
			if err := w.Put(ctx, u64(binary.LittleEndian.Uint64(buf)+1), 0, 8); err != nil {
				return err
			}
			if err := w.Flush(ctx, 0); err != nil {
				return err
			}
			if err := w.CompareAndSwap(ctx, u64(0), me, res, Uint64, 0, 0); err != nil {
				return err
			}
			if err := w.Flush(ctx, 0); err != nil {
				return err
			}
			if binary.LittleEndian.Uint64(res) != uint64(c.Rank()+1) {
				return fmt.Errorf("mutex held by %d while I released", binary.LittleEndian.Uint64(res))
			}
		}
		// int32 CAS through an active message: exactly one rank wins.
		r32 := make([]byte, 4)
		if err := w.CompareAndSwap(ctx, binary.LittleEndian.AppendUint32(nil, uint32(c.Rank()+1)),
			make([]byte, 4), r32, Int32, 0, 16); err != nil {
			return err
		}
		if err := w.UnlockAll(ctx); err != nil {
			return err
		}
		won := []int64{0}
		if binary.LittleEndian.Uint32(r32) == 0 {
			won[0] = 1
		}
		if err := c.AllreduceInt64(ctx, ReduceSum, won); err != nil {
			return err
		}
		if won[0] != 1 {
			return fmt.Errorf("%d ranks won the int32 CAS", won[0])
		}
		if c.Rank() == 0 && binary.LittleEndian.Uint64(w.Bytes()[8:]) != n*rounds {
			return fmt.Errorf("protected counter %d", binary.LittleEndian.Uint64(w.Bytes()[8:]))
		}
		return w.Free(ctx)
	})
}
