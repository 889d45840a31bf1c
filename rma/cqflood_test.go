package rma

import (
	"context"
	"fmt"
	"testing"
)

// TestCompletionFlood: single calls whose requests outnumber the CQ
// (a strided get or put of more blocks than the CQ holds), from both ranks
// at once and then closed by a fence, must move every byte and fail
// nothing: MPICH's getfence1 with 262144 elements of a strided type
// overran the CQ ("completion queue overrun") in the fence.
//
// The CQ is made small (8192, against 4096 requests a send queue) so that
// the flood is short: this test runs under the race detector and the lock
// checker too.
func TestCompletionFlood(t *testing.T) {
	defer func(c int) { cqCapacity = c }(cqCapacity)
	cqCapacity = 8192
	for _, prov := range []string{"shm", "udp"} {
		for _, get := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/get=%v", prov, get), func(t *testing.T) {
				comms := newWorld(t, 2, &Config{Provider: prov})
				const blocks, block, stride = 3*8192 + 5, smallBlock, smallBlock + 32
				each(t, comms, func(ctx context.Context, c *Comm) error {
					mem := make([]byte, blocks*stride)
					for i := range mem {
						mem[i] = byte(i*7 + c.Rank())
					}
					w, err := c.Create(ctx, mem, nil)
					if err != nil {
						return err
					}
					if err := w.Fence(ctx, 0); err != nil {
						return err
					}
					peer := 1 - c.Rank()
					tl := Layout{Count: blocks, Block: block, Stride: stride}
					buf := make([]byte, blocks*block)
					if get {
						if _, err := w.RgetLayout(ctx, buf, Layout{}, peer, 0, tl); err != nil {
							return err
						}
					} else {
						for i := range buf {
							buf[i] = byte(i*3 + c.Rank())
						}
						if err := w.PutLayout(ctx, buf, Layout{}, peer, 0, tl); err != nil {
							return err
						}
					}
					if err := w.Fence(ctx, 0); err != nil {
						return err
					}
					for i := 0; i < blocks; i++ {
						for j := 0; j < block; j++ {
							if get {
								want := byte((i*stride+j)*7 + peer)
								if buf[i*block+j] != want {
									return fmt.Errorf("rank %d: get byte %d of block %d: %d, want %d", c.Rank(), j, i, buf[i*block+j], want)
								}
							} else {
								want := byte((i*block+j)*3 + peer)
								if mem[i*stride+j] != want {
									return fmt.Errorf("rank %d: put byte %d of block %d: %d, want %d", c.Rank(), j, i, mem[i*stride+j], want)
								}
							}
						}
					}
					return w.Free(ctx)
				})
			})
		}
	}
}
