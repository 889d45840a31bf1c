package multipath_test

import (
	"bytes"
	"crypto/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/multipath"
	"github.com/rvma/rvma/verbs"
)

// Failover and revival on the loop provider with fault injection: the
// sender's GID i is path i, and Faults on it drop or delay what it sends
// (the peer's acknowledgements come back).

func sumBytes(st []multipath.Stats) (bytes, reissued uint64) {
	for _, p := range st {
		bytes += p.Bytes
		reissued += p.Reissued
	}
	return bytes, reissued
}

// requireMonotonic checks that no path's counter went down.
func requireMonotonic(t *testing.T, before, after []multipath.Stats) {
	t.Helper()
	for i := range before {
		require.GreaterOrEqual(t, after[i].Bytes, before[i].Bytes, "path %d: Bytes went down", i)
		require.GreaterOrEqual(t, after[i].Posted, before[i].Posted, "path %d: Posted went down", i)
		require.GreaterOrEqual(t, after[i].Reissued, before[i].Reissued, "path %d: Reissued went down", i)
	}
}

// A black-holed path that is "revived" (the connection manager answers
// over TCP, which does not take the path) stays down and carries nothing
// while its probe over itself goes unanswered, on both sides; once the
// path works again, the revival's probe brings it up, and it carries data.
// Its counters carry on across the revival.
func TestReviveUpOnlyAfterProbe(t *testing.T) {
	ctx, a, b, c, peer := loopConns(t, "2", 1<<20, &multipath.Config{Balancer: multipath.Equal{}, Small: 4096, Revive: -1,
		Connect: verbs.ConnectConfig{Timeout: 50 * time.Millisecond, RetryCount: 2}})
	rand.Read(a.buf)
	req, err := c.Write(a.mr, 0, len(a.buf), b.mr.Addr(), b.mr.RKey())
	require.NoError(t, err)
	require.NoError(t, req.Wait(ctx))
	first := c.Paths()
	require.Positive(t, first[1].Bytes)

	require.NoError(t, a.dev.SetFaults(1, verbs.Faults{Drop: 1}))
	rand.Read(a.buf)
	req, err = c.Write(a.mr, 0, len(a.buf), b.mr.Addr(), b.mr.RKey())
	require.NoError(t, err)
	require.NoError(t, req.Wait(ctx))
	require.True(t, bytes.Equal(a.buf, b.buf))
	down := c.Paths()
	require.False(t, down[1].Up)
	requireMonotonic(t, first, down)

	// Revive while the path still drops everything, writing meanwhile.
	revived := make(chan error, 1)
	go func() { revived <- c.Revive(ctx, 1) }()
	writes := 0
	for done := false; !done; {
		select {
		case err = <-revived:
			done = true
		default:
		}
		rand.Read(a.buf)
		req, err := c.Write(a.mr, 0, len(a.buf), b.mr.Addr(), b.mr.RKey())
		require.NoError(t, err)
		require.NoError(t, req.Wait(ctx))
		require.True(t, bytes.Equal(a.buf, b.buf))
		require.False(t, c.Paths()[1].Up, "path 1 up before its probe was acknowledged")
		writes++
	}
	require.ErrorIs(t, err, verbs.StatusRetryExceeded, "the revival's probe fails")
	after := c.Paths()
	require.False(t, after[1].Up)
	require.Equal(t, down[1].Posted, after[1].Posted, "a path being revived carried data")
	require.False(t, peer.Paths()[1].Up, "the accepting side's path is up without its probe")
	requireMonotonic(t, down, after)
	t.Logf("%d writes during the failed revival", writes)

	// The path works again: the revival's probe brings it up, with a
	// capacity measured over itself, on both sides.
	require.NoError(t, a.dev.SetFaults(1, verbs.Faults{}))
	require.NoError(t, c.Revive(ctx, 1))
	up := c.Paths()
	require.True(t, up[1].Up)
	require.Positive(t, up[1].Capacity)
	requireMonotonic(t, after, up)
	require.Eventually(t, func() bool { return peer.Paths()[1].Up }, 10*time.Second, time.Millisecond)
	rand.Read(a.buf)
	req, err = c.Write(a.mr, 0, len(a.buf), b.mr.Addr(), b.mr.RKey())
	require.NoError(t, err)
	require.NoError(t, req.Wait(ctx))
	require.True(t, bytes.Equal(a.buf, b.buf))
	last := c.Paths()
	require.Greater(t, last[1].Posted, up[1].Posted, "the revived path carries data again")
	require.Greater(t, last[1].Bytes, up[1].Bytes)
	requireMonotonic(t, up, last)
	require.ErrorIs(t, peer.Revive(ctx, 1), multipath.ErrAccepted)
}

// A path that fails halfway through its sub-flow: only the chunks whose
// work requests did not complete are written again, over the other path;
// every byte is delivered exactly once by the counters' reckoning.
func TestReissueOnlyMissing(t *testing.T) {
	const n = 4 << 20
	ctx, a, b, c := loopPair(t, "2", n, &multipath.Config{Balancer: multipath.Equal{}, Revive: -1, MinChunk: 64 << 10, MaxChunk: 64 << 10,
		Connect: verbs.ConnectConfig{MTU: 4096, Window: 16, Timeout: 100 * time.Millisecond, RetryCount: 2}})
	// Path 1 is slow (16 packets per 20 ms round trip): its 2 MiB take
	// well over half a second, chunk after chunk.
	require.NoError(t, a.dev.SetFaults(1, verbs.Faults{Delay: 20 * time.Millisecond}))
	rand.Read(a.buf)
	before := c.Paths()
	req, err := c.Write(a.mr, 0, n, b.mr.Addr(), b.mr.RKey())
	require.NoError(t, err)
	// Test drives the completions (nobody else polls).
	require.Eventually(t, func() bool { req.Test(); return c.Paths()[1].Bytes > before[1].Bytes }, 10*time.Second, 200*time.Microsecond)
	require.NoError(t, a.dev.SetFaults(1, verbs.Faults{Drop: 1}))
	require.NoError(t, req.Wait(ctx))
	require.True(t, bytes.Equal(a.buf, b.buf))

	p := c.Paths()
	require.False(t, p[1].Up)
	delivered1 := p[1].Bytes - before[1].Bytes
	require.Positive(t, delivered1, "path 1 delivered part of its share")
	require.Less(t, delivered1, uint64(n/2), "path 1 failed before the end of its share")
	require.Equal(t, uint64(n/2), p[1].Posted-before[1].Posted, "path 1's share")
	total, reissued := sumBytes(p)
	b0, r0 := sumBytes(before)
	require.Equal(t, uint64(n), total-b0, "every byte delivered once")
	require.Equal(t, uint64(n/2)-delivered1, reissued-r0, "only the undelivered part was sent again")
	require.Equal(t, reissued-r0, p[0].Reissued-before[0].Reissued)
	t.Logf("path 1 delivered %d of %d bytes before failing; %d re-sent", delivered1, n/2, reissued-r0)
}

// A burst of sub-flows failing together (one path dies under eight small
// requests) is re-issued over all the survivors, not piled onto the first
// one the balancer sees idle.
func TestReissueSpreads(t *testing.T) {
	const reqs, size = 8, 150 << 10 // 50 KiB per path: each re-issue is a pick
	ctx, a, b, c := loopPair(t, "3", reqs*size, &multipath.Config{Balancer: multipath.Equal{}, Small: 64 << 10, Revive: -1,
		Connect: verbs.ConnectConfig{Timeout: 200 * time.Millisecond, RetryCount: 1}})
	// The survivors take 30 ms a round trip, so what is re-issued onto
	// them is still outstanding while the rest of the burst is decided
	// (the QP flushes the burst at once); that is what a pick must see.
	for i := range 2 {
		require.NoError(t, a.dev.SetFaults(i, verbs.Faults{Delay: 30 * time.Millisecond}))
	}
	require.NoError(t, a.dev.SetFaults(2, verbs.Faults{Drop: 1}))
	rand.Read(a.buf)
	var rs []*multipath.Request
	for i := range reqs {
		req, err := c.Write(a.mr, i*size, size, b.mr.Addr()+uint64(i*size), b.mr.RKey())
		require.NoError(t, err)
		rs = append(rs, req)
	}
	for _, req := range rs {
		require.NoError(t, req.Wait(ctx))
	}
	require.True(t, bytes.Equal(a.buf, b.buf))
	p := c.Paths()
	require.False(t, p[2].Up)
	require.Zero(t, p[2].Bytes)
	_, reissued := sumBytes(p)
	require.Equal(t, uint64(reqs*size/3), reissued, "path 2's shares, re-sent once")
	require.Positive(t, p[0].Reissued, "survivor 0 took none of the burst")
	require.Positive(t, p[1].Reissued, "survivor 1 took none of the burst")
	require.InDelta(t, p[0].Reissued, p[1].Reissued, float64(size/3), "the burst is spread evenly")
}

// Dial probes the paths, so the first request is already split in
// proportion to their measured capacities; with NoProbe the paths are up
// unmeasured and the first split is even.
func TestDialProbes(t *testing.T) {
	const n = 3 << 20
	ctx, a, b, c := loopPair(t, "3", n, nil)
	st := c.Paths()
	states := make([]multipath.PathState, len(st))
	for i, p := range st {
		require.True(t, p.Up, "path %d", i)
		require.Positive(t, p.Capacity, "path %d not probed", i)
		require.Zero(t, p.Posted, "a probe counted as data")
		states[i] = p.PathState
	}
	want := multipath.Proportional{}.Split(n, states)
	req, err := c.Write(a.mr, 0, n, b.mr.Addr(), b.mr.RKey())
	require.NoError(t, err)
	require.NoError(t, req.Wait(ctx))
	for i, p := range c.Paths() {
		require.Equal(t, uint64(want[i]), p.Bytes, "path %d: the first split follows the probes", i)
	}
	t.Logf("probed %.0f/%.0f/%.0f MB/s, first split %v", st[0].Capacity/1e6, st[1].Capacity/1e6, st[2].Capacity/1e6, want)

	ctx, a, b, c = loopPair(t, "3", n, &multipath.Config{NoProbe: true})
	for i, p := range c.Paths() {
		require.True(t, p.Up, "path %d", i)
		require.Zero(t, p.Capacity, "path %d probed", i)
	}
	req, err = c.Write(a.mr, 0, n, b.mr.Addr(), b.mr.RKey())
	require.NoError(t, err)
	require.NoError(t, req.Wait(ctx))
	for i, p := range c.Paths() {
		require.Equal(t, uint64(n/3), p.Bytes, "path %d", i)
	}
}

// A path that does not answer its probe at Dial is down from the start,
// and the connection works over the others.
func TestDialProbeFails(t *testing.T) {
	ctx := t.Context()
	var r [4]byte
	rand.Read(r[:])
	uri := "loop://mp-dead-" + string(rune('a'+r[0]%26)) + "?gids=2"
	a, b := open(t, ctx, uri, 1<<20), open(t, ctx, uri, 1<<20)
	require.NoError(t, a.dev.SetFaults(1, verbs.Faults{Drop: 1}))
	c, peer := pair(t, ctx, a, b, &multipath.Config{Revive: -1, Connect: verbs.ConnectConfig{Timeout: 20 * time.Millisecond, RetryCount: 1}})
	defer c.Close()
	defer peer.Close()
	p := c.Paths()
	require.True(t, p[0].Up)
	require.False(t, p[1].Up)
	rand.Read(a.buf)
	req, err := c.Write(a.mr, 0, len(a.buf), b.mr.Addr(), b.mr.RKey())
	require.NoError(t, err)
	require.NoError(t, req.Wait(ctx))
	require.True(t, bytes.Equal(a.buf, b.buf))
	require.Zero(t, c.Paths()[1].Posted)
}
