package fabric

import (
	"net/netip"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/wire"
)

// sink is a Port that records what reaches it.
type sink struct {
	mu  sync.Mutex
	got []uint32
}

func (s *sink) Addr() netip.AddrPort { return netip.MustParseAddrPort("[fd00::1]:1") }
func (s *sink) MaxPayload() int      { return 1024 }
func (s *sink) SetHandler(Handler)   {}
func (s *sink) Close() error         { return nil }
func (s *sink) Send(pkts []*wire.Packet) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range pkts {
		s.got = append(s.got, p.PSN)
		p.Release()
	}
}

func (s *sink) psns() []uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]uint32(nil), s.got...)
}

func send(fp *FaultPort, n int) {
	for i := 0; i < n; i++ {
		p := wire.Get()
		p.PSN = uint32(i)
		fp.Send([]*wire.Packet{p})
	}
}

func TestFaults(t *testing.T) {
	const n = 20000
	cases := []struct {
		name   string
		f      Faults
		check  func(t *testing.T, got []uint32)
		settle time.Duration
	}{
		{"none", Faults{}, func(t *testing.T, got []uint32) {
			require.Len(t, got, n)
		}, 0},
		{"drop 10%", Faults{Drop: 0.1, Seed: 1}, func(t *testing.T, got []uint32) {
			require.InDelta(t, 0.9*n, len(got), 0.02*n)
		}, 0},
		{"duplicate 10%", Faults{Duplicate: 0.1, Seed: 2}, func(t *testing.T, got []uint32) {
			require.InDelta(t, 1.1*n, len(got), 0.02*n)
		}, 0},
		{"reorder 5%", Faults{Reorder: 0.05, Seed: 3}, func(t *testing.T, got []uint32) {
			require.Len(t, got, n)
			inversions := 0
			for i := 1; i < len(got); i++ {
				if got[i] < got[i-1] {
					inversions++
				}
			}
			require.Positive(t, inversions)
		}, 50 * time.Millisecond},
		{"delay", Faults{Delay: 20 * time.Millisecond, Seed: 4}, nil, 0},
	}
	for _, c := range cases {
		// On the bubble's clock: held packets leave exactly when due.
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				s := &sink{}
				fp := NewFaultPort(s)
				defer fp.Close()
				fp.SetFaults(c.f)
				if c.check == nil { // delay: nothing arrives before the delay, all of it at the delay
					send(fp, 10)
					time.Sleep(c.f.Delay - time.Nanosecond)
					synctest.Wait()
					require.Empty(t, s.psns())
					time.Sleep(time.Nanosecond)
					synctest.Wait()
					require.Len(t, s.psns(), 10)
					return
				}
				send(fp, n)
				time.Sleep(c.settle) // far past the longest hold (250µs)
				c.check(t, s.psns())
			})
		})
	}
}

func TestFaultsSeeded(t *testing.T) {
	run := func() []uint32 {
		s := &sink{}
		fp := NewFaultPort(s)
		fp.SetFaults(Faults{Drop: 0.3, Seed: 77})
		send(fp, 1000)
		return s.psns()
	}
	require.Equal(t, run(), run(), "the same seed drops the same packets")
}

func TestFaultPortCloseDropsHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &sink{}
		fp := NewFaultPort(s)
		fp.SetFaults(Faults{Delay: time.Hour})
		send(fp, 5)
		require.NoError(t, fp.Close())
		send(fp, 5) // after close: released, never delivered
		// On the bubble's clock: past every due time, at once.
		time.Sleep(2 * time.Hour)
		require.Empty(t, s.psns())
	})
}

func TestImpairerBursts(t *testing.T) {
	im := NewImpairer(Faults{BurstEnter: 0.01, BurstExit: 0.25, Seed: 9})
	const n = 200000
	lost, runs, run := 0, 0, 0
	for i := 0; i < n; i++ {
		if c, _ := im.Fate(); c == 0 {
			lost++
			run++
			continue
		}
		if run > 0 {
			runs++
			run = 0
		}
	}
	// Stationary loss enter/(enter+exit) = 3.85%; mean burst 1/exit = 4.
	require.InDelta(t, 0.0385, float64(lost)/n, 0.006)
	require.InDelta(t, 4.0, float64(lost)/float64(runs), 0.5)
}

func TestImpairerSeeded(t *testing.T) {
	f := Faults{Drop: 0.1, Duplicate: 0.1, Jitter: time.Millisecond, Reorder: 0.1, Seed: 4}
	a, b := NewImpairer(f), NewImpairer(f)
	for i := 0; i < 1000; i++ {
		ca, da := a.Fate()
		cb, db := b.Fate()
		require.Equal(t, ca, cb)
		require.Equal(t, da, db)
	}
}

// A fixed delay is a longer wire, not a shuffle: packets sent in one
// batch (held with the same due time) and in batches racing the release
// timer leave in the order they came.
//
// On the bubble's clock the release timer fires at the very instant the
// sender wakes from each of its pauses after the first, so the two run
// concurrently, at due times that are exact.
func TestDelayKeepsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := &sink{}
		fp := NewFaultPort(s)
		defer fp.Close()
		const delay = 2 * time.Millisecond
		fp.SetFaults(Faults{Delay: delay})
		const batches, per = 200, 16
		for b := range batches {
			pkts := make([]*wire.Packet, per)
			for i := range pkts {
				pkts[i] = wire.Get()
				pkts[i].PSN = uint32(b*per + i)
			}
			fp.Send(pkts)
			if b%20 == 0 {
				time.Sleep(delay / 2)
			}
		}
		time.Sleep(delay) // the last batch is due
		synctest.Wait()
		got := s.psns()
		require.Len(t, got, batches*per)
		for i, psn := range got {
			require.Equal(t, uint32(i), psn, "packet %d left out of order", i)
		}
	})
}
