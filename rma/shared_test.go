package rma

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
)

// TestShared: on shm, every rank's part of an allocated window is mapped
// into every rank's process: stores by the owner are seen by a neighbour
// after a barrier, a neighbour's stores by the owner after a fence, and
// a put through the window is seen in the mapping.
func TestShared(t *testing.T) {
	const n = 3
	comms := newWorld(t, n, &Config{Provider: "shm"})
	size := func(r int) int { return 100 * (r + 1) }
	each(t, comms, func(ctx context.Context, c *Comm) error {
		me, next := c.Rank(), (c.Rank()+1)%n
		w, err := c.Allocate(ctx, size(me), nil)
		if err != nil {
			return err
		}
		mine, err := w.Shared(ctx, me)
		if err != nil || len(mine) != size(me) || &mine[0] != &w.Bytes()[0] {
			return fmt.Errorf("own part: %d bytes, %v", len(mine), err)
		}
		for i := range mine {
			mine[i] = byte(me + 1)
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		theirs, err := w.Shared(ctx, next)
		if err != nil {
			return err
		}
		if !bytes.Equal(theirs, bytes.Repeat([]byte{byte(next + 1)}, size(next))) {
			return fmt.Errorf("rank %d's part through the mapping: % x", next, theirs[:8])
		}
		if err := w.Fence(ctx, 0); err != nil {
			return err
		}
		theirs[0] = 0xa0 + byte(me) // a store into the neighbour's part
		if err := w.Put(ctx, []byte{0xb0 + byte(me)}, next, 1); err != nil {
			return err
		}
		if err := w.Fence(ctx, 0); err != nil {
			return err
		}
		prev := (me + n - 1) % n
		if mine[0] != 0xa0+byte(prev) || mine[1] != 0xb0+byte(prev) || mine[2] != byte(me+1) {
			return fmt.Errorf("own part after the fence: % x", mine[:3])
		}
		if theirs[1] != 0xb0+byte(me) {
			return fmt.Errorf("the put, through the mapping: %#x", theirs[1])
		}
		return w.Free(ctx)
	})
}

// TestSharedRefused: where a peer's memory cannot be mapped (no shared
// memory: the loop provider; memory the caller registered), Shared says
// so rather than return something else; this rank's part is always there.
func TestSharedRefused(t *testing.T) {
	for _, provider := range []string{"loop", "shm"} {
		comms := newWorld(t, 2, &Config{Provider: provider})
		each(t, comms, func(ctx context.Context, c *Comm) error {
			var w *Win
			var err error
			mem := make([]byte, 64)
			if provider == "loop" {
				w, err = c.Allocate(ctx, 64, nil)
			} else {
				w, err = c.Create(ctx, mem, nil)
			}
			if err != nil {
				return err
			}
			defer w.Free(ctx)
			if b, err := w.Shared(ctx, c.Rank()); err != nil || len(b) != 64 {
				return fmt.Errorf("%s: own part: %d %v", provider, len(b), err)
			}
			_, err = w.Shared(ctx, 1-c.Rank())
			if !errors.Is(err, ErrNotShared) {
				return fmt.Errorf("%s: peer's part: %v, want ErrNotShared", provider, err)
			}
			return nil
		})
	}
	comms := newWorld(t, 2, &Config{Provider: "shm"})
	each(t, comms, func(ctx context.Context, c *Comm) error {
		w, err := c.Allocate(ctx, 8, nil)
		if err != nil {
			return err
		}
		defer w.Free(ctx)
		if _, err = w.Shared(ctx, 2); !errors.Is(err, ErrRank) {
			return fmt.Errorf("rank 2 of 2: %v, want ErrRank", err)
		}
		return nil
	})
}
