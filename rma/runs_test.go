package rma

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// PutRuns and GetRuns move each run as Put and Get would, in any order
// (a struct type's pieces backwards, zero-length runs among them), on
// every provider, with the bytes compared; the origin is registered once
// for the call, not once per run; a run outside the origin or the window
// is refused before anything moves.
func TestRuns(t *testing.T) {
	const size, n = 8192, 600
	// Alternating 16 and 48 bytes, as a struct of a short and a long
	// member, listed backwards; target offsets interleaved differently.
	var runs []Run
	for i, o := 0, 0; o+64 <= size && len(runs) < n; i++ {
		l := 16 + 32*(i%2)
		runs = append(runs, Run{Origin: o, Target: size - o - l, Len: l})
		o += l + 3
	}
	runs = append(runs, Run{Origin: 5, Target: 7, Len: 0})
	for i, j := 0, len(runs)-1; i < j; i, j = i+1, j-1 {
		runs[i], runs[j] = runs[j], runs[i]
	}
	for _, prov := range []string{"loop", "shm", "udp"} {
		t.Run(prov, func(t *testing.T) {
			comms := newWorld(t, 2, &Config{Provider: prov})
			each(t, comms, func(ctx context.Context, c *Comm) error {
				me, peer := c.Rank(), 1-c.Rank()
				mem := make([]byte, size)
				for i := range mem {
					mem[i] = byte(i*5 + me)
				}
				w, err := c.Create(ctx, mem, nil)
				if err != nil {
					return err
				}
				if err := w.Fence(ctx, 0); err != nil {
					return err
				}
				origin := make([]byte, size)
				for i := range origin {
					origin[i] = byte(i*11 + 100*me)
				}
				regs := len(c.reg.mrs)
				if err := w.PutRuns(ctx, origin, runs, peer, 0); err != nil {
					return err
				}
				got := make([]byte, size)
				if err := w.Fence(ctx, 0); err != nil {
					return err
				}
				if err := w.GetRuns(ctx, got, runs, peer, 0); err != nil {
					return err
				}
				if err := w.Fence(ctx, 0); err != nil {
					return err
				}
				if n := len(c.reg.mrs) - regs; n > 2 {
					return fmt.Errorf("%d regions registered for two calls", n)
				}
				// What the peer put here: its origin's runs at their targets.
				want := make([]byte, size)
				for i := range want {
					want[i] = byte(i*5 + me)
				}
				for _, r := range runs {
					for k := range r.Len {
						want[r.Target+k] = byte((r.Origin+k)*11 + 100*peer)
					}
				}
				require.Equal(t, want, mem, "rank %d's window after the peer's PutRuns", me)
				// What this rank got back: its own origin's bytes, from
				// the peer's window where it put them.
				for _, r := range runs {
					for k := range r.Len {
						require.Equal(t, byte((r.Origin+k)*11+100*me), got[r.Origin+k], "run %+v byte %d", r, k)
					}
				}

				// Refused whole: nothing of the good runs before the bad one moves.
				before := append([]byte(nil), mem...)
				if err := w.Fence(ctx, 0); err != nil {
					return err
				}
				bad := []struct {
					runs []Run
					disp int
					want error
				}{
					{[]Run{{0, 0, 8}, {size - 4, 0, 8}}, 0, ErrDatatype}, // past the origin
					{[]Run{{0, 0, 8}, {-1, 0, 8}}, 0, ErrDatatype},
					{[]Run{{0, 0, 8}, {0, 0, -1}}, 0, ErrDatatype},
					{[]Run{{0, 0, 8}, {0, -8, 8}}, 0, ErrOutOfBounds},
					{[]Run{{0, 0, 8}, {0, 8, 8}}, int(^uint(0) >> 1), ErrOutOfBounds}, // disp + target overflows
				}
				for i, b := range bad {
					if err := w.PutRuns(ctx, origin, b.runs, peer, b.disp); !errors.Is(err, b.want) {
						return fmt.Errorf("bad runs %d: PutRuns returned %v, want %v", i, err, b.want)
					}
					if err := w.GetRuns(ctx, got, b.runs, peer, b.disp); !errors.Is(err, b.want) {
						return fmt.Errorf("bad runs %d: GetRuns returned %v, want %v", i, err, b.want)
					}
				}
				// A run past the window's end fails as Put does.
				err = w.PutRuns(ctx, origin, []Run{{0, size - 4, 8}}, peer, 0)
				if !errors.Is(err, ErrOutOfBounds) {
					return fmt.Errorf("run past the window: %v, want ErrOutOfBounds", err)
				}
				if err := w.Fence(ctx, 0); err != nil {
					return err
				}
				require.Equal(t, before, mem, "a refused call moved bytes")
				return w.Free(ctx)
			})
		})
	}
}

// Register makes the pieces of a buffer that reach rma one by one, each
// a slice no longer than itself (as from C), share one registration
// instead of each registering its own; the bytes still land.
func TestRegister(t *testing.T) {
	comms := newWorld(t, 2, &Config{Provider: "udp"})
	each(t, comms, func(ctx context.Context, c *Comm) error {
		const n = 100
		mem := make([]byte, 8*n)
		for i := range mem {
			mem[i] = byte(i*3 + c.Rank())
		}
		w, err := c.Create(ctx, mem, nil)
		if err != nil {
			return err
		}
		if err := w.LockAll(ctx); err != nil {
			return err
		}
		peer := 1 - c.Rank()
		buf := make([]byte, 8*n)
		require.NoError(t, w.Register(buf))
		require.NoError(t, w.Register(nil))
		regs := len(c.reg.mrs)
		for i := n - 1; i >= 0; i-- { // backwards: no piece holds a later one
			if err := w.Get(ctx, buf[8*i:8*i+8:8*i+8], peer, 8*i); err != nil {
				return err
			}
		}
		if err := w.Flush(ctx, peer); err != nil {
			return err
		}
		require.Equal(t, regs, len(c.reg.mrs), "pieces of a registered buffer registered again")
		for i := range buf {
			require.Equal(t, byte(i*3+peer), buf[i], "byte %d", i)
		}
		if err := w.UnlockAll(ctx); err != nil {
			return err
		}
		return w.Free(ctx)
	})
}
