package fabrictest

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/wire"
)

func record(r *Recorder, psn uint32) {
	p := wire.Get()
	p.PSN = psn
	r.HandlePackets([]*wire.Packet{p})
	p.Release()
}

// WaitCount returns once enough packets are recorded, and no sooner; it
// gives up, saying how many arrived, when its context ends.
func TestWaitCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &Recorder{}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		go func() {
			for i := range 3 {
				time.Sleep(time.Millisecond)
				record(r, uint32(i))
			}
		}()
		start := time.Now()
		require.NoError(t, r.WaitCount(ctx, 3))
		require.Equal(t, 3*time.Millisecond, time.Since(start), "returned before the third packet")
		require.NoError(t, r.WaitCount(ctx, 2), "already recorded")

		err := r.WaitCount(ctx, 4)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorContains(t, err, "3 of 4")
	})
}
