package rma

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// Small puts to another host travel in write lists: many of them, of
// every small size, more than one list holds, land byte for byte by the
// end of each kind of epoch (fence, post/start/complete/wait, lock and
// flush), and the window's neighbours stay untouched.
func TestPackedPuts(t *testing.T) {
	const win = 1 << 16
	for _, prov := range []string{"loop", "udp"} {
		t.Run(prov, func(t *testing.T) {
			comms := newWorld(t, 3, &Config{Provider: prov})
			for _, sync := range []string{"fence", "pscw", "lock"} {
				t.Run(sync, func(t *testing.T) {
					each(t, comms, func(ctx context.Context, c *Comm) error {
						w, err := c.Allocate(ctx, win, nil)
						if err != nil {
							return err
						}
						size := c.Size()
						to, from := (c.Rank()+1)%size, (c.Rank()+size-1)%size
						// The bytes rank r puts: runs of 1..packMax bytes with
						// gaps, from a seed both sides know.
						plan := func(r int) (offs, lens []int, want []byte) {
							rng := rand.New(rand.NewPCG(uint64(r), 7))
							want = make([]byte, win)
							for off := 0; ; {
								n := 1 + rng.IntN(packMax)
								if off+n > win-512 {
									break
								}
								for i := range n {
									want[off+i] = byte(1 + rng.IntN(255))
								}
								offs, lens = append(offs, off), append(lens, n)
								off += n + rng.IntN(8)
							}
							return offs, lens, want
						}
						offs, lens, mine := plan(c.Rank())
						puts := func() error {
							for i, off := range offs {
								if err := w.Put(ctx, mine[off:off+lens[i]], to, off); err != nil {
									return err
								}
							}
							return nil
						}
						switch sync {
						case "fence":
							err = w.Fence(ctx, 0)
							if err == nil {
								err = puts()
							}
							if err == nil {
								err = w.Fence(ctx, ModeNoSucceed)
							}
						case "pscw":
							err = w.Post(ctx, []int{from}, 0)
							if err == nil {
								err = w.Start(ctx, []int{to}, 0)
							}
							if err == nil {
								err = puts()
							}
							if err == nil {
								err = w.Complete(ctx)
							}
							if err == nil {
								err = w.Wait(ctx)
							}
						case "lock":
							err = w.Lock(ctx, LockShared, to)
							if err == nil {
								err = puts()
							}
							if err == nil {
								err = w.Unlock(ctx, to)
							}
							if err == nil {
								err = c.Barrier(ctx)
							}
						}
						if err != nil {
							return err
						}
						_, _, want := plan(from)
						got := w.Bytes()
						for i := range want {
							if got[i] != want[i] {
								return fmt.Errorf("byte %d from rank %d: %d, want %d", i, from, got[i], want[i])
							}
						}
						return w.Free(ctx)
					})
				})
			}
		})
	}
	require.Greater(t, packCap/(packMax+10), 0)
}
