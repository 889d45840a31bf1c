package linkem

import (
	"net"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/fabric"
)

func udp(t *testing.T) *net.UDPConn {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// Both directions cross the link, each after the configured delay; the
// peers are learned from their first packets.
func TestForwardDelay(t *testing.T) {
	l, err := Start(Config{Faults: fabric.Faults{Delay: 20 * time.Millisecond}})
	require.NoError(t, err)
	defer l.Close()
	x, y := udp(t), udp(t)
	// y speaks first (toward B) so that the link learns it; x's packet
	// toward A then goes to y.
	_, err = y.WriteToUDPAddrPort([]byte("hello x"), l.AddrB())
	require.NoError(t, err)
	start := time.Now()
	_, err = x.WriteToUDPAddrPort([]byte("hello y"), l.AddrA())
	require.NoError(t, err)
	buf := make([]byte, 100)
	y.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, from, err := y.ReadFromUDPAddrPort(buf)
	require.NoError(t, err)
	require.Equal(t, "hello y", string(buf[:n]))
	require.Equal(t, l.AddrB(), from)
	require.GreaterOrEqual(t, time.Since(start), 20*time.Millisecond)
	x.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, from, err = x.ReadFromUDPAddrPort(buf)
	require.NoError(t, err)
	require.Equal(t, "hello x", string(buf[:n])) // waited for x to be known
	require.Equal(t, l.AddrA(), from)
	require.Eventually(t, func() bool {
		ab, ba := l.Stats()
		return ab.Delivered == 1 && ba.Delivered == 1
	}, 5*time.Second, time.Millisecond)
}

// The rate limiter spaces departures at the line rate and drops what
// overflows the queue. Arrivals are stamped an hour ahead, so that nothing
// leaves the line while the test looks.
func TestRateAndQueue(t *testing.T) {
	const rate = 10e6 // bytes/s
	l, err := Start(Config{Rate: rate, Queue: 200 << 10})
	require.NoError(t, err)
	defer l.Close()
	d := l.dir[0]
	at := time.Now().Add(time.Hour)
	for i := 0; i < 400; i++ { // 400 kB into a 200 kB queue
		d.arrive(make([]byte, 1000), uint64(i), at)
	}
	ab, _ := l.Stats()
	require.Equal(t, uint64(400), ab.Packets)
	require.Equal(t, uint64(400-204), ab.Overflow) // 204 fit in 200 KiB
	d.mu.Lock()
	defer d.mu.Unlock()
	var departures []time.Time
	for _, p := range d.held {
		if p.b != nil {
			departures = append(departures, p.at)
		}
	}
	require.Len(t, departures, 204)
	last := departures[0]
	for _, t0 := range departures {
		if t0.After(last) {
			last = t0
		}
	}
	// 204 packets of 1000 bytes at 10 MB/s: the last leaves 20.4 ms after the start.
	require.Equal(t, 20400*time.Microsecond, last.Sub(at))
}

// Loss follows the seeded impairer exactly, packet by packet.
func TestLossIsSeeded(t *testing.T) {
	f := fabric.Faults{Drop: 0.3, BurstEnter: 0.01, BurstExit: 0.3, Duplicate: 0.05, Seed: 11}
	l, err := Start(Config{Faults: f})
	require.NoError(t, err)
	defer l.Close()
	ref := fabric.NewImpairer(f)
	lost, dup := 0, 0
	at := time.Now().Add(time.Hour)
	for i := 0; i < 1000; i++ {
		switch c, _ := ref.Fate(); c {
		case 0:
			lost++
		case 2:
			dup++
		}
		l.dir[0].arrive([]byte{byte(i)}, uint64(i), at)
	}
	ab, _ := l.Stats()
	require.Equal(t, uint64(lost), ab.Lost)
	require.Equal(t, uint64(dup), ab.Duplicated)
	require.InDelta(t, 330, lost, 60)
}

// recvFrom reads one datagram from c.
func recvFrom(t *testing.T, c *net.UDPConn) string {
	t.Helper()
	buf := make([]byte, 100)
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	n, _, err := c.ReadFromUDPAddrPort(buf)
	require.NoError(t, err)
	return string(buf[:n])
}

// An endpoint restarted on a new port (a resuming sender) takes its side
// over with its first packet, so that replies reach it; a configured peer
// is kept whoever sends.
func TestPeerRelearned(t *testing.T) {
	for _, fixed := range []bool{false, true} {
		t.Run(map[bool]string{false: "learned", true: "configured"}[fixed], func(t *testing.T) {
			old, fresh, y := udp(t), udp(t), udp(t)
			cfg := Config{}
			if fixed {
				cfg.PeerA = old.LocalAddr().(*net.UDPAddr).AddrPort()
			}
			l, err := Start(cfg)
			require.NoError(t, err)
			defer l.Close()
			_, err = y.WriteToUDPAddrPort([]byte("to old"), l.AddrB())
			require.NoError(t, err)
			_, err = old.WriteToUDPAddrPort([]byte("from old"), l.AddrA())
			require.NoError(t, err)
			require.Equal(t, "from old", recvFrom(t, y))
			require.Equal(t, "to old", recvFrom(t, old))

			// The restarted endpoint speaks; the reply follows the rule.
			_, err = fresh.WriteToUDPAddrPort([]byte("from fresh"), l.AddrA())
			require.NoError(t, err)
			require.Equal(t, "from fresh", recvFrom(t, y))
			_, err = y.WriteToUDPAddrPort([]byte("reply"), l.AddrB())
			require.NoError(t, err)
			want, other := fresh, old
			if fixed {
				want, other = old, fresh
			}
			require.Equal(t, "reply", recvFrom(t, want))
			require.NoError(t, other.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
			_, _, err = other.ReadFromUDPAddrPort(make([]byte, 100))
			require.Error(t, err, "the reply went to both")
			ab, _ := l.Stats()
			require.Equal(t, map[bool]uint64{false: 2, true: 0}[fixed], ab.NewPeers, "A's peer learned")
		})
	}
}

// SetRate spaces the packets that arrive after it at the new rate;
// SetDown drops everything until the link is up again.
func TestSetRateAndDown(t *testing.T) {
	l, err := Start(Config{Rate: 10e6, Queue: 1 << 20})
	require.NoError(t, err)
	defer l.Close()
	d := l.dir[0]
	at := time.Now().Add(time.Hour)
	departures := func() []time.Time {
		d.mu.Lock()
		defer d.mu.Unlock()
		var ts []time.Time
		for _, p := range d.held {
			if p.b != nil {
				ts = append(ts, p.at)
			}
		}
		slices.SortFunc(ts, time.Time.Compare)
		return ts
	}
	d.arrive(make([]byte, 1000), 1, at) // 100 µs at 10 MB/s
	l.SetRate(1e6)
	d.arrive(make([]byte, 1000), 2, at) // 1 ms at 1 MB/s, after the first
	ts := departures()
	require.Len(t, ts, 2)
	require.Equal(t, 100*time.Microsecond, ts[0].Sub(at))
	require.Equal(t, 1100*time.Microsecond, ts[1].Sub(at))

	l.SetDown(true)
	for i := range 10 {
		l.dir[i%2].arrive(make([]byte, 1000), uint64(3+i), at)
	}
	require.Len(t, departures(), 2)
	ab, ba := l.Stats()
	require.Equal(t, uint64(5), ab.Down)
	require.Equal(t, uint64(5), ba.Down)
	l.SetDown(false)
	d.arrive(make([]byte, 1000), 20, at)
	require.Len(t, departures(), 3)
}
