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
	in := func(ns string, addrs ...netip.Addr) *side {
		var s *side
		uri := "udp://"
		for i, a := range addrs {
			if i > 0 {
				uri += ","
			}
			uri += netip.AddrPortFrom(a, 0).String()
		}
		require.NoError(t, b.In(ns, func() error {
			s = open(t, ctx, uri, 4<<20)
			return nil
		}))
		return s
	}
	sa := in(b.NameA, b.Paths[0].A, b.Paths[1].A)
	sb := in(b.NameB, b.Paths[0].B, b.Paths[1].B)
	var ln *multipath.Listener
	require.NoError(t, b.In(b.NameB, func() (err error) {
		ln, err = multipath.Listen(ctx, sb.pd, netip.AddrPortFrom(b.Paths[0].B, 0).String(), nil)
		return err
	}))
	defer ln.Close()
	acc := make(chan *multipath.Conn, 1)
	go func() {
		c, _ := ln.Accept(ctx)
		acc <- c
	}()
	var c *multipath.Conn
	require.NoError(t, b.In(b.NameA, func() (err error) {
		// Revive by hand: the connection manager's TCP dial must happen
		// inside namespace A, which a background goroutine's is not.
		c, err = multipath.Dial(ctx, sa.pd, ln.Addr(), &multipath.Config{Revive: -1,
			Connect: verbs.ConnectConfig{Timeout: 200 * time.Millisecond, RetryCount: 2}})
		return err
	}))
	peer := <-acc
	require.NotNil(t, peer)
	defer c.Close()
	defer peer.Close()

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
	require.NoError(t, b.In(b.NameA, func() error { return c.Revive(ctx, 1) }))
	require.True(t, c.Paths()[1].Up)
	before := c.Paths()[1].Bytes
	req, err = c.Write(sa.mr, 0, len(sa.buf), sb.mr.Addr(), sb.mr.RKey())
	require.NoError(t, err)
	require.NoError(t, req.Wait(ctx))
	require.Greater(t, c.Paths()[1].Bytes, before)
	t.Logf("path 1 revived, capacity %.0f Mbit/s", c.Paths()[1].Capacity*8/1e6)
}
