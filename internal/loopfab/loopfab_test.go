package loopfab

import (
	"sync"
	"testing"
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
func TestSingleDrainer(t *testing.T) {
	dst, err := Open(t.Name(), 1, 1024)
	require.NoError(t, err)
	defer dst[0].Close()
	r := &fabrictest.Recorder{Delay: func() { time.Sleep(10 * time.Microsecond) }}
	dst[0].SetHandler(r)
	var wg sync.WaitGroup
	const senders, per = 4, 500
	for s := 0; s < senders; s++ {
		src, err := Open(t.Name(), 1, 1024)
		require.NoError(t, err)
		defer src[0].Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				p := wire.Get()
				p.Dst = dst[0].Addr()
				src[0].Send([]*wire.Packet{p})
			}
		}()
	}
	wg.Wait()
	require.Eventually(t, func() bool { return r.Count() == senders*per }, 5*time.Second, time.Millisecond)
	require.False(t, r.Overlapped(), "the handler ran concurrently")
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
