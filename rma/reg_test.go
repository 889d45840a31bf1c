package rma

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRegionEvictedWhileBuilding: a strided transfer whose first blocks
// lie in the oldest cached region and whose later blocks need a new one,
// with the cache full, evicts that oldest region while the requests built
// on it are not posted yet. They must still go out and move the right
// bytes: before, their lkey was gone at post, the READs failed with a
// local protection error (and a QP stalled behind them). Both a get and a
// put, on a provider whose requests carry SGEs to the NIC.
func TestRegionEvictedWhileBuilding(t *testing.T) {
	for _, get := range []bool{true, false} {
		name := "put"
		if get {
			name = "get"
		}
		t.Run(name, func(t *testing.T) {
			comms := newWorld(t, 2, &Config{Provider: "udp"})
			const blocks, block, stride = 64, 300, 600 // over inlineMax: the put registers its origin too
			each(t, comms, func(ctx context.Context, c *Comm) error {
				mem := make([]byte, blocks*block)
				for i := range mem {
					mem[i] = byte(i*7 + c.Rank())
				}
				w, err := c.Create(ctx, mem, nil)
				if err != nil {
					return err
				}
				if err := w.LockAll(ctx); err != nil {
					return err
				}
				if c.Rank() == 0 {
					origin := make([]byte, blocks*stride)
					// The oldest region holds the first block only; then
					// the cache fills with others.
					if err := w.Get(ctx, origin[:block:block], 1, 0); err != nil {
						return err
					}
					for range regCacheCap - 1 {
						b := make([]byte, 8)
						if err := w.Get(ctx, b, 1, 0); err != nil {
							return err
						}
					}
					require.Len(t, c.reg.mrs, regCacheCap)
					// The gets land by the flush; a put from origin
					// rewritten before then could send what the first
					// get brought back late (it did, one run in five).
					if err := w.Flush(ctx, 1); err != nil {
						return err
					}
					ol := Layout{Count: blocks, Block: block, Stride: stride}
					tl := Layout{Count: 1, Block: blocks * block, Stride: blocks * block}
					if get {
						r, err := w.RgetLayout(ctx, origin, ol, 1, 0, tl)
						if err != nil {
							return err
						}
						if err := r.Wait(ctx); err != nil {
							return err
						}
						for i := range blocks {
							for j := range block {
								k := i*block + j
								require.Equal(t, byte(k*7+1), origin[i*stride+j], "block %d byte %d", i, j)
							}
						}
					} else {
						for i := range origin {
							origin[i] = byte(i * 3)
						}
						if err := w.PutLayout(ctx, origin, ol, 1, 0, tl); err != nil {
							return err
						}
						if err := w.Flush(ctx, 1); err != nil {
							return err
						}
					}
					require.Zero(t, c.reg.busy.Load(), "holds left")
					require.Empty(t, c.reg.retired, "retired regions not deregistered")
				}
				if err := w.UnlockAll(ctx); err != nil {
					return err
				}
				if err := c.Barrier(ctx); err != nil {
					return err
				}
				if !get && c.Rank() == 1 {
					for i := range blocks {
						for j := range block {
							require.Equal(t, byte((i*stride+j)*3), mem[i*block+j], "block %d byte %d", i, j)
						}
					}
				}
				return w.Free(ctx)
			})
		})
	}
}
