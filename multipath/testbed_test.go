package multipath_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/testbed"
	"github.com/rvma/rvma/multipath"
	"github.com/rvma/rvma/verbs"
)

// Over two real paths shaped to 100 and 300 Mbit/s: the data arrives
// intact, both paths carry it, and the capacity estimates rank the paths
// as the shaping does. Times are logged, not asserted.
func TestShapedPaths(t *testing.T) {
	b := testbed.New(t, testbed.Config{Paths: 2, Rates: []string{"100mbit", "300mbit"}})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Revive by hand: the connection manager's TCP dial must happen
	// inside namespace A, which a background goroutine's is not.
	sa, sb, c := testbedPair(t, ctx, b, 4<<20, &multipath.Config{Revive: -1,
		Connect: verbs.ConnectConfig{Timeout: 200 * time.Millisecond, RetryCount: 2}})

	require.NoError(t, c.Probe(ctx))
	p := c.Paths()
	t.Logf("probes: %.0f and %.0f Mbit/s", p[0].Capacity*8/1e6, p[1].Capacity*8/1e6)
	require.Positive(t, p[0].Capacity)
	require.Positive(t, p[1].Capacity)
	for round := range 4 {
		rand.Read(sa.buf)
		start := time.Now()
		req, err := c.Write(sa.mr, 0, len(sa.buf), sb.mr.Addr(), sb.mr.RKey())
		require.NoError(t, err)
		require.NoError(t, req.Wait(ctx))
		el := time.Since(start)
		require.True(t, bytes.Equal(sa.buf, sb.buf), "round %d", round)
		p = c.Paths()
		t.Logf("round %d: %v (%.0f Mbit/s); capacity estimates %.0f and %.0f Mbit/s; bytes %d and %d", round, el,
			float64(len(sa.buf))*8/el.Seconds()/1e6, p[0].Capacity*8/1e6, p[1].Capacity*8/1e6, p[0].Bytes, p[1].Bytes)
	}
	p = c.Paths()
	require.Positive(t, p[0].Bytes)
	require.Positive(t, p[1].Bytes)

	// The fast path's link goes down: its sub-flow moves to the slow path.
	require.NoError(t, b.SetDown(1, true))
	rand.Read(sa.buf)
	start := time.Now()
	req, err := c.Write(sa.mr, 0, len(sa.buf), sb.mr.Addr(), sb.mr.RKey())
	require.NoError(t, err)
	require.NoError(t, req.Wait(ctx))
	require.True(t, bytes.Equal(sa.buf, sb.buf))
	require.False(t, c.Paths()[1].Up)
	t.Logf("with path 1 down: %v", time.Since(start))
	// It comes back: re-dialled and probed, it is used again.
	require.NoError(t, b.SetDown(1, false))
	// As the background reviver would, try again until the link carries
	// the probe: a veth pair set up again may take a moment (longer on a
	// loaded host) before its first packets pass.
	require.Eventually(t, func() bool {
		return b.In(b.NameA, func() error { return c.Revive(ctx, 1) }) == nil
	}, 20*time.Second, 100*time.Millisecond, "path 1 never revived")
	require.True(t, c.Paths()[1].Up)
	before := c.Paths()[1].Bytes
	req, err = c.Write(sa.mr, 0, len(sa.buf), sb.mr.Addr(), sb.mr.RKey())
	require.NoError(t, err)
	require.NoError(t, req.Wait(ctx))
	require.Greater(t, c.Paths()[1].Bytes, before)
	t.Logf("path 1 revived, capacity %.0f Mbit/s", c.Paths()[1].Capacity*8/1e6)
}

// testbedPair opens a device of size bytes in each namespace of b, one
// GID per path, and dials a Conn from A to B with cfg (inside namespace A,
// as the connection manager's TCP dial must be). Both ends close with the
// test.
func testbedPair(t *testing.T, ctx context.Context, b *testbed.Bed, size int, cfg *multipath.Config) (sa, sb *side, c *multipath.Conn) {
	in := func(ns string, addr func(testbed.Path) netip.Addr) *side {
		uri := "udp://"
		for i, p := range b.Paths {
			if i > 0 {
				uri += ","
			}
			uri += netip.AddrPortFrom(addr(p), 0).String()
		}
		var s *side
		require.NoError(t, b.In(ns, func() error { s = open(t, ctx, uri, size); return nil }))
		return s
	}
	sa = in(b.NameA, func(p testbed.Path) netip.Addr { return p.A })
	sb = in(b.NameB, func(p testbed.Path) netip.Addr { return p.B })
	var ln *multipath.Listener
	require.NoError(t, b.In(b.NameB, func() (err error) {
		ln, err = multipath.Listen(ctx, sb.pd, netip.AddrPortFrom(b.Paths[0].B, 0).String(), nil)
		return err
	}))
	t.Cleanup(func() { ln.Close() })
	acc := make(chan *multipath.Conn, 1)
	go func() {
		c, _ := ln.Accept(ctx)
		acc <- c
	}()
	require.NoError(t, b.In(b.NameA, func() (err error) {
		c, err = multipath.Dial(ctx, sa.pd, ln.Addr(), cfg)
		return err
	}))
	peer := <-acc
	require.NotNil(t, peer)
	t.Cleanup(func() {
		c.Close()
		peer.Close()
	})
	return sa, sb, c
}
