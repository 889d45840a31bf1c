package udpfab

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/fabric"
	"github.com/rvma/rvma/internal/fabric/fabrictest"
	"github.com/rvma/rvma/internal/wire"
)

var lo = netip.MustParseAddrPort("127.0.0.1:0")

func TestSplit(t *testing.T) {
	cases := []struct {
		n, seg int
		want   []int
	}{
		{10, 0, []int{10}},
		{10, 4, []int{4, 4, 2}},
		{12, 4, []int{4, 4, 4}},
		{3, 4, []int{3}},
		{0, 0, []int{0}},
	}
	for _, c := range cases {
		m := Message{Buf: make([]byte, 64), N: c.n, Seg: c.seg}
		var got []int
		Split(&m, func(d []byte) { got = append(got, len(d)) })
		require.Equal(t, c.want, got, "%d bytes in segments of %d", c.n, c.seg)
	}
}

// roundTrip sends trains of datagrams and checks every datagram arrives
// once and intact, whatever the kernel coalesces.
func roundTrip(t *testing.T, cfg *Config) {
	tx, err := Listen(lo, cfg)
	require.NoError(t, err)
	defer tx.Close()
	rx, err := Listen(lo, cfg)
	require.NoError(t, err)
	defer rx.Close()
	const seg = 1000
	var want [][]byte
	var msgs []Message
	for i := 0; i < 20; i++ {
		var train []byte
		n := 1 + i%5
		for k := 0; k < n; k++ {
			size := seg
			if k == n-1 && i%2 == 1 {
				size = 300 // a short last segment ends the train
			}
			d := bytes.Repeat([]byte{byte(i), byte(k)}, size/2)
			want = append(want, d)
			train = append(train, d...)
		}
		msgs = append(msgs, Message{Buf: train, Addr: rx.LocalAddr(), Seg: seg})
	}
	if !tx.Features().GSO {
		// Without GSO every datagram is its own message.
		msgs = msgs[:0]
		for _, d := range want {
			msgs = append(msgs, Message{Buf: d, Addr: rx.LocalAddr()})
		}
	}
	dropped, err := tx.WriteBatch(msgs)
	require.NoError(t, err)
	require.Zero(t, dropped)
	in := make([]Message, BatchSize)
	for i := range in {
		in[i].Buf = make([]byte, MaxTrain)
	}
	var got [][]byte
	for len(got) < len(want) {
		n, err := rx.ReadBatch(in)
		require.NoError(t, err)
		for i := 0; i < n; i++ {
			require.Equal(t, tx.LocalAddr(), in[i].Addr)
			Split(&in[i], func(d []byte) { got = append(got, bytes.Clone(d)) })
		}
	}
	require.Equal(t, want, got)
}

func TestRoundTrip(t *testing.T) {
	t.Run("offloads", func(t *testing.T) { roundTrip(t, nil) })
	t.Run("no GSO", func(t *testing.T) { roundTrip(t, &Config{NoGSO: true}) })
	t.Run("no GRO", func(t *testing.T) { roundTrip(t, &Config{NoGRO: true}) })
	t.Run("neither", func(t *testing.T) { roundTrip(t, &Config{NoGSO: true, NoGRO: true}) })
}

func TestFeatures(t *testing.T) {
	c, err := Listen(lo, nil)
	require.NoError(t, err)
	defer c.Close()
	f := c.Features()
	t.Logf("features: %+v", f)
	require.Positive(t, f.RecvBuffer)
	c2, err := Listen(lo, &Config{NoGSO: true, NoGRO: true})
	require.NoError(t, err)
	defer c2.Close()
	require.False(t, c2.Features().GSO)
	require.False(t, c2.Features().GRO)
}

func TestOversizedDatagramIsDroppedNotFatal(t *testing.T) {
	tx, err := Listen(lo, nil)
	require.NoError(t, err)
	defer tx.Close()
	rx, err := Listen(lo, nil)
	require.NoError(t, err)
	defer rx.Close()
	dropped, err := tx.WriteBatch([]Message{
		{Buf: make([]byte, 70000), Addr: rx.LocalAddr()}, // over the UDP limit
		{Buf: []byte("after"), Addr: rx.LocalAddr()},
	})
	require.NoError(t, err)
	require.Equal(t, 1, dropped)
	in := []Message{{Buf: make([]byte, 100)}}
	n, err := rx.ReadBatch(in)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, "after", string(in[0].Buf[:in[0].N]))
}

// TestProgressWithBackground: a goroutine calling Progress and the
// background reader share the socket; every packet is handled exactly
// once, never concurrently, and nothing is stranded when polling stops.
func TestProgressWithBackground(t *testing.T) {
	a, err := Open(lo, DefaultMTU, nil)
	require.NoError(t, err)
	defer a.Close()
	b, err := Open(lo, DefaultMTU, nil)
	require.NoError(t, err)
	defer b.Close()
	r := &fabrictest.Recorder{}
	b.SetHandler(r)
	const total = 20000
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // an intermittent poller
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			b.Progress()
			if time.Now().UnixNano()%3 == 0 {
				time.Sleep(20 * time.Microsecond)
			}
		}
	}()
	for i := 0; i < total; i++ {
		p := wire.Get()
		p.Opcode, p.PSN, p.Dst, p.DestQP = wire.Acknowledge, uint32(i), b.Addr(), 5
		a.Send([]*wire.Packet{p})
		if i%256 == 255 { // stay within the socket buffer
			require.NoError(t, r.WaitCount(ctx, i-2048))
		}
	}
	close(stop) // polling stops: the background reader must finish the job
	wg.Wait()
	require.NoError(t, r.WaitCount(ctx, total))
	require.Equal(t, total, r.Count())
	require.False(t, r.Overlapped(), "the handler ran concurrently")
	seen := map[uint32]bool{}
	for _, psn := range r.PSNs() {
		require.False(t, seen[psn], "packet %d handled twice", psn)
		seen[psn] = true
	}
}

func TestMalformedCounted(t *testing.T) {
	p, err := Open(lo, DefaultMTU, nil)
	require.NoError(t, err)
	defer p.Close()
	p.SetHandler(&fabrictest.Recorder{})
	c, err := Listen(lo, nil)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.WriteBatch([]Message{{Buf: []byte("not a packet"), Addr: p.Addr()}, {Buf: []byte{0xFF}, Addr: p.Addr()}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return p.Malformed() == 2 }, 5*time.Second, time.Millisecond)
}

func TestOpenErrors(t *testing.T) {
	_, err := Open(lo, 100, nil)
	require.Error(t, err)
	_, err = Open(lo, MaxMTU+1, nil)
	require.Error(t, err)
	p, err := Open(lo, DefaultMTU, nil)
	require.NoError(t, err)
	_, err = Open(p.Addr(), DefaultMTU, nil)
	require.Error(t, err, "address in use")
	require.NoError(t, p.Close())
	require.Error(t, p.Close())
}

func TestDefaultMTU(t *testing.T) {
	require.Equal(t, DefaultMTU, DefaultMTUFor(netip.MustParseAddr("127.0.0.1")), "lo carries 4096 easily")
	require.Equal(t, DefaultMTU, DefaultMTUFor(netip.MustParseAddr("0.0.0.0")))
}

// TestLargestMTU: the largest MTU follows the interface (lo's is 65536
// unless someone changed it), a multiple of 4096 above 4096, within a
// datagram; an unknown interface gets the default.
func TestLargestMTU(t *testing.T) {
	addr := netip.MustParseAddr("127.0.0.1")
	room, ok := roomFor(addr)
	require.True(t, ok, "127.0.0.1 belongs to an interface")
	got := LargestMTUFor(addr)
	if room >= 2*DefaultMTU {
		require.Greater(t, got, DefaultMTU)
		require.Zero(t, got%DefaultMTU)
		require.LessOrEqual(t, got, min(room, MaxMTU))
		require.Greater(t, got+DefaultMTU, min(room, MaxMTU), "the largest multiple that fits")
	} else {
		require.Equal(t, DefaultMTUFor(addr), got)
	}
	require.Equal(t, DefaultMTU, LargestMTUFor(netip.MustParseAddr("0.0.0.0")))
	require.Equal(t, DefaultMTU, LargestMTUFor(netip.MustParseAddr("192.0.2.77")), "no interface owns it")
}

func TestPortContract(t *testing.T) {
	for _, mtu := range []int{DefaultMTU, LargestMTUFor(lo.Addr())} {
		t.Run(fmt.Sprint(mtu), func(t *testing.T) {
			fabrictest.TestPort(t, func(t *testing.T) fabric.Port {
				p, err := Open(lo, mtu, nil)
				require.NoError(t, err)
				return p
			})
		})
	}
}

// TestGatheredSendsIntact: payloads long enough to be sent from where they
// lie (in the packets' own buffers here, which go back to the pool once
// sent) arrive intact and MAC-valid, mixed with short copied ones, from
// senders sending at once, in batches that flush midway (more trains than
// a batch holds). A packet released before its train is sent would hand
// its buffer to another sender's packet and corrupt both.
func TestGatheredSendsIntact(t *testing.T) {
	if !canGather {
		t.Skip("this platform sends copied datagrams only")
	}
	for _, mtu := range []int{DefaultMTU, LargestMTUFor(lo.Addr())} {
		t.Run(fmt.Sprint(mtu), func(t *testing.T) {
			dst, err := Open(lo, mtu, nil)
			require.NoError(t, err)
			defer dst.Close()
			r := &fabrictest.Recorder{}
			var badMAC atomic.Int64
			mac := wire.NewMAC([16]byte{7})
			dst.SetHandler(handlerFunc(func(pkts []*wire.Packet) {
				for _, p := range pkts {
					if !p.VerifyMAC(mac) {
						badMAC.Add(1)
					}
				}
				r.HandlePackets(pkts)
			}))
			const senders, rounds, per = 3, 20, 100
			payload := func(s, i, n int) []byte {
				b := make([]byte, n)
				for k := range b {
					b[k] = byte(s*31 + i*7 + k)
				}
				return b
			}
			size := func(i int) int {
				switch {
				case i%3 == 0:
					return 1 + i%200 // copied
				case i%50 == 1:
					return mtu
				}
				// Gathered, each its own train mostly (GSO trains take
				// equal sizes), so a batch of 100 flushes midway.
				return gatherMin + (i*977)%(min(mtu, 12000)-gatherMin+1)
			}
			var sent atomic.Int64
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			for s := range senders {
				src, err := Open(lo, mtu, nil)
				require.NoError(t, err)
				defer src.Close()
				src.SetHandler(&fabrictest.Recorder{})
				wg.Add(1)
				go func() {
					defer wg.Done()
					for round := range rounds {
						pkts := make([]*wire.Packet, 0, per)
						for j := range per {
							i := round*per + j
							p := wire.Get()
							p.Opcode, p.PSN, p.Dst, p.DestQP, p.Auth = wire.SendOnly, uint32(s<<20|i), dst.Addr(), 5, mac
							b := p.Bounce(size(i))
							copy(b, payload(s, i, len(b)))
							p.Payload = b
							pkts = append(pkts, p)
						}
						src.Send(pkts)
						// Stay within the receiver's socket buffer: a
						// batch a sender in flight.
						if r.WaitCount(ctx, int(sent.Add(per))-senders*per) != nil {
							return
						}
					}
				}()
			}
			wg.Wait()
			require.NoError(t, r.WaitCount(ctx, senders*rounds*per))
			psns, got := r.PSNs(), r.Payloads()
			require.Len(t, psns, senders*rounds*per)
			require.Zero(t, badMAC.Load(), "packets whose MAC failed")
			for k, psn := range psns {
				s, i := int(psn>>20), int(psn&(1<<20-1))
				require.Equal(t, string(payload(s, i, size(i))), got[k], "sender %d packet %d", s, i)
			}
		})
	}
}

type handlerFunc func([]*wire.Packet)

func (f handlerFunc) HandlePackets(pkts []*wire.Packet) { f(pkts) }
