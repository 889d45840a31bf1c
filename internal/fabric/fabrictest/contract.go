package fabrictest

import (
	"bytes"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/fabric"
	"github.com/rvma/rvma/internal/wire"
)

// TestPort checks the fabric.Port contract on a provider, as every
// provider's tests do: open returns a new port of one fabric, reachable
// from the others it returns, with no handler yet; TestPort closes what it
// opens. Delivery is not part of the contract, but on the small bursts
// used here every provider delivers, so a loss is a failure.
func TestPort(t *testing.T, open func(t *testing.T) fabric.Port) {
	t.Run("Addresses", func(t *testing.T) {
		a, b := open(t), open(t)
		defer a.Close()
		defer b.Close()
		require.True(t, a.Addr().IsValid())
		require.NotEqual(t, a.Addr(), b.Addr())
		require.GreaterOrEqual(t, a.MaxPayload(), 256)
	})
	t.Run("DeliversIntact", func(t *testing.T) {
		a, b := open(t), open(t)
		defer a.Close()
		defer b.Close()
		h := newContractHandler()
		b.SetHandler(h)
		a.SetHandler(newContractHandler())
		sizes := []int{0, 1, 7, 255, 1024, b.MaxPayload() / 2, b.MaxPayload()}
		var want []string
		for round := range 8 {
			var batch []*wire.Packet
			for i, n := range sizes {
				psn := uint32(round*len(sizes) + i)
				payload := pattern(psn, n)
				want = append(want, string(payload))
				batch = append(batch, packet(b.Addr(), psn, payload))
			}
			a.Send(batch)
			h.await(t, len(want))
		}
		require.ElementsMatch(t, want, h.payloads())
		if s, ok := b.(fabric.StatsReporter); ok {
			require.Equal(t, uint64(len(want)), s.Stats().Received)
		}
		if s, ok := a.(fabric.StatsReporter); ok {
			require.Equal(t, uint64(len(want)), s.Stats().Sent)
		}
	})
	t.Run("OneHandlerCallAtATime", func(t *testing.T) {
		dst := open(t)
		defer dst.Close()
		h := newContractHandler()
		h.delay = 20 * time.Microsecond
		dst.SetHandler(h)
		const senders, per = 3, 100
		var wg sync.WaitGroup
		for s := range senders {
			src := open(t)
			defer src.Close()
			src.SetHandler(newContractHandler())
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range per {
					src.Send([]*wire.Packet{packet(dst.Addr(), uint32(s*per+i), pattern(uint32(i), 16))})
				}
			}()
		}
		wg.Wait()
		h.await(t, senders*per)
		require.False(t, h.overlap.Load(), "the handler ran concurrently")
	})
	t.Run("SendFromHandler", func(t *testing.T) {
		a, b := open(t), open(t)
		defer a.Close()
		defer b.Close()
		ha := newContractHandler()
		a.SetHandler(ha)
		hb := newContractHandler()
		hb.echo = b // b answers every packet from within its handler
		b.SetHandler(hb)
		for i := range 32 {
			a.Send([]*wire.Packet{packet(b.Addr(), uint32(i), pattern(uint32(i), 100))})
		}
		hb.await(t, 32)
		ha.await(t, 32)
		require.ElementsMatch(t, hb.payloads(), ha.payloads())
	})
	t.Run("NoDestination", func(t *testing.T) {
		a, b := open(t), open(t)
		defer a.Close()
		h := newContractHandler()
		b.SetHandler(h)
		gone := b.Addr()
		require.NoError(t, b.Close())
		// Sent to a closed port and to an address no port has: dropped,
		// and the sender keeps working.
		a.Send([]*wire.Packet{packet(gone, 1, []byte("to a closed port"))})
		a.Send([]*wire.Packet{packet(netip.MustParseAddrPort("[fd00::dead]:4791"), 2, []byte("nowhere"))})
		c := open(t)
		defer c.Close()
		hc := newContractHandler()
		c.SetHandler(hc)
		a.Send([]*wire.Packet{packet(c.Addr(), 3, []byte("still works"))})
		hc.await(t, 1)
		require.Zero(t, h.count())
	})
	t.Run("CloseWaitsForHandler", func(t *testing.T) {
		src, dst := open(t), open(t)
		defer src.Close()
		src.SetHandler(newContractHandler())
		h := newContractHandler()
		h.delay = 200 * time.Microsecond // a handler call is likely in progress at Close
		dst.SetHandler(h)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := uint32(0); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				src.Send([]*wire.Packet{packet(dst.Addr(), i, pattern(i, 64))})
				time.Sleep(10 * time.Microsecond)
			}
		}()
		if pr, ok := dst.(fabric.Progresser); ok {
			// A poller runs the handler too, before and after Close.
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					pr.Progress()
					runtime.Gosched()
				}
			}()
		}
		h.await(t, 3)
		require.NoError(t, dst.Close())
		require.Zero(t, h.active.Load(), "a handler call was in progress after Close returned")
		calls := h.calls.Load()
		// Whatever reaches the closed port later is dropped: the sender
		// goes on, and a live port behind the same sender still receives,
		// so the packets to dst were given every chance to arrive.
		live := open(t)
		defer live.Close()
		hl := newContractHandler()
		live.SetHandler(hl)
		src.Send([]*wire.Packet{packet(live.Addr(), 0, []byte("after"))})
		hl.await(t, 1)
		close(stop)
		wg.Wait()
		src.Send([]*wire.Packet{packet(live.Addr(), 1, []byte("after the flood"))})
		hl.await(t, 2)
		require.Equal(t, calls, h.calls.Load(), "the handler ran after Close returned")
		require.Error(t, dst.Close(), "a second Close")
		dst.Send([]*wire.Packet{packet(src.Addr(), 0, []byte("from a closed port"))}) // dropped, no panic
	})
}

func pattern(seed uint32, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(seed*131 + uint32(i)*7)
	}
	return b
}

func packet(dst netip.AddrPort, psn uint32, payload []byte) *wire.Packet {
	p := wire.Get()
	p.Dst, p.Opcode, p.DestQP, p.PSN, p.Payload = dst, wire.SendOnly, 7, psn, payload
	return p
}

// contractHandler records payloads, counts calls, and notices overlapping
// calls; with echo set it sends each packet back to its source.
type contractHandler struct {
	mu      sync.Mutex
	got     []string
	arrived chan struct{}
	delay   time.Duration
	echo    fabric.Port
	active  atomic.Int32
	calls   atomic.Int64
	overlap atomic.Bool
}

func newContractHandler() *contractHandler {
	return &contractHandler{arrived: make(chan struct{}, 1)}
}

func (h *contractHandler) HandlePackets(pkts []*wire.Packet) {
	if h.active.Add(1) > 1 {
		h.overlap.Store(true)
	}
	defer h.active.Add(-1)
	h.calls.Add(1)
	if h.delay > 0 {
		time.Sleep(h.delay)
	}
	var replies []*wire.Packet
	h.mu.Lock()
	for _, p := range pkts {
		h.got = append(h.got, string(p.Payload))
		if h.echo != nil {
			replies = append(replies, packet(p.Src, p.PSN, bytes.Clone(p.Payload)))
		}
	}
	h.mu.Unlock()
	if len(replies) > 0 {
		h.echo.Send(replies)
	}
	select {
	case h.arrived <- struct{}{}:
	default:
	}
}

func (h *contractHandler) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.got)
}

func (h *contractHandler) payloads() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.got...)
}

// await waits until at least n packets arrived; 10 s without one more is
// a loss.
func (h *contractHandler) await(t *testing.T, n int) {
	t.Helper()
	for h.count() < n {
		select {
		case <-h.arrived:
		case <-time.After(10 * time.Second):
			require.FailNow(t, fmt.Sprintf("%d of %d packets arrived", h.count(), n))
		}
	}
}
