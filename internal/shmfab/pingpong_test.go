//go:build linux

package shmfab

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/wire"
)

type echo struct {
	p   *Port
	got chan uint32
}

func (e *echo) HandlePackets(pkts []*wire.Packet) {
	for _, pkt := range pkts {
		if e.got != nil {
			e.got <- pkt.PSN
			continue
		}
		e.p.Send([]*wire.Packet{packet(pkt.Src, pkt.PSN, nil)})
	}
}

// A packet bounced back and forth, with pauses until both receivers have
// fallen asleep now and then: no wake-up is lost.
func TestPingPong(t *testing.T) {
	a, err := Open(t.Name(), 4096)
	require.NoError(t, err)
	defer a.Close()
	b, err := Open(t.Name(), 4096)
	require.NoError(t, err)
	defer b.Close()
	got := make(chan uint32, 1)
	a.SetHandler(&echo{p: a, got: got})
	b.SetHandler(&echo{p: b})
	for i := range 3000 {
		if i%500 == 0 {
			asleep(t, a)
			asleep(t, b)
		}
		a.Send([]*wire.Packet{packet(b.Addr(), uint32(i), nil)})
		select {
		case psn := <-got:
			require.Equal(t, uint32(i), psn)
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d lost", i)
		}
	}
}
