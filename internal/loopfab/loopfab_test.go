package loopfab

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/fabric"
	"github.com/rvma/rvma/internal/fabric/fabrictest"
	"github.com/rvma/rvma/internal/wire"
)

func TestDeliveryAndOrder(t *testing.T) {
	a, err := Open(t.Name(), 2, 4096)
	require.NoError(t, err)
	b, err := Open(t.Name(), 1, 4096)
	require.NoError(t, err)
	defer a[0].Close()
	defer a[1].Close()
	defer b[0].Close()
	require.NotEqual(t, a[0].Addr(), a[1].Addr())
	require.NotEqual(t, a[0].Addr().Addr(), b[0].Addr().Addr(), "devices get distinct addresses")
	r := &fabrictest.Recorder{}
	b[0].SetHandler(r)
	a[0].SetHandler(&fabrictest.Recorder{})
	for i := 0; i < 1000; i++ {
		p := wire.Get()
		p.Dst, p.PSN, p.Payload = b[0].Addr(), uint32(i), []byte("x")
		a[0].Send([]*wire.Packet{p})
	}
	require.Equal(t, 1000, r.Count())
	for i, psn := range r.PSNs() {
		require.Equal(t, uint32(i), psn)
	}
	require.Equal(t, uint64(1000), b[0].Stats().Received)
}

func TestUndeliverable(t *testing.T) {
	a, err := Open(t.Name(), 1, 1024)
	require.NoError(t, err)
	defer a[0].Close()
	other, err := Open(t.Name()+"-other", 1, 1024)
	require.NoError(t, err)
	other[0].SetHandler(&fabrictest.Recorder{})
	p := wire.Get()
	p.Dst = other[0].Addr() // another fabric: unreachable
	a[0].Send([]*wire.Packet{p})
	require.Equal(t, uint64(1), a[0].Stats().Undeliverable)
	require.NoError(t, other[0].Close())
	require.ErrorIs(t, other[0].Close(), ErrClosed)
}

// Concurrent senders never run a port's handler twice at once, and a busy
// destination hands work to its worker rather than capturing a sender.
//
// The test runs on synctest's clock: a handler call takes exactly delay of
// it, and a sleeping handler wakes only once every other goroutine is
// blocked, so the senders do all they can while a handler runs (a second
// handler call would overlap it). Each sender sends a packet every
// delay/2, so packets are queued whenever a handler call ends, and the
// destination stays busy for per*delay/2: twice as long as a sender may
// drain inline (inlineBudget calls at most).
func TestSingleDrainer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dst, err := Open(t.Name(), 1, 1024)
		require.NoError(t, err)
		defer dst[0].Close()
		const delay = 10 * time.Microsecond
		r := &fabrictest.Recorder{Delay: func() { time.Sleep(delay) }}
		dst[0].SetHandler(r)
		var wg sync.WaitGroup
		const senders, per = 4, 1000
		longest := make([]time.Duration, senders) // a sender's longest Send
		for s := range senders {
			src, err := Open(t.Name(), 1, 1024)
			require.NoError(t, err)
			defer src[0].Close()
			wg.Go(func() {
				for range per {
					p := wire.Get()
					p.Dst = dst[0].Addr()
					start := time.Now()
					src[0].Send([]*wire.Packet{p})
					longest[s] = max(longest[s], time.Since(start))
					time.Sleep(delay / 2)
				}
			})
		}
		wg.Wait()
		// The worker may still be draining.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, r.WaitCount(ctx, senders*per))
		require.Equal(t, senders*per, r.Count())
		require.False(t, r.Overlapped(), "the handler ran concurrently")
		for s, d := range longest {
			require.LessOrEqual(t, d, inlineBudget*delay, "sender %d was captured by the busy destination", s)
		}
	})
}

func TestOpenLimits(t *testing.T) {
	_, err := Open("x", 0, 1024)
	require.Error(t, err)
	_, err = Open("x", 1, 100)
	require.Error(t, err)
	_, err = Open("x", 1, MaxMTU+1)
	require.Error(t, err)
}

func TestPortContract(t *testing.T) {
	fabrictest.TestPort(t, func(t *testing.T) fabric.Port {
		p, err := Open(t.Name(), 1, 4096)
		require.NoError(t, err)
		return p[0]
	})
}
