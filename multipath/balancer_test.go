package multipath

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
)

func sum(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}

func TestBalancers(t *testing.T) {
	paths := []PathState{{Up: true, Capacity: 100}, {Up: true, Capacity: 300}, {Up: false, Capacity: 500}}
	tests := []struct {
		name string
		b    Balancer
		want []int
	}{
		{"equal", Equal{}, []int{500, 500, 0}},
		{"proportional", Proportional{}, []int{250, 750, 0}},
		{"adaptive idle", Adaptive{}, []int{250, 750, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.b.Split(1000, paths)
			require.Equal(t, 1000, sum(got))
			require.InDeltaSlice(t, tc.want, got, 2)
		})
	}
	// Adaptive gives a busy path less: path 1 has 600 bytes queued, which
	// at 300 B/s is 2 s; path 0 at 100 B/s must carry more.
	busy := []PathState{{Up: true, Capacity: 100}, {Up: true, Capacity: 300, Outstanding: 600}}
	got := Adaptive{}.Split(400, busy)
	require.Equal(t, 400, sum(got))
	require.InDeltaSlice(t, []int{250, 150}, got, 2) // both finish at 2.5 s
	require.Equal(t, 0, Adaptive{}.Pick(busy))
	require.Equal(t, 0, Equal{}.Pick(busy))
	// Unmeasured paths count as the mean of the measured ones.
	require.Equal(t, []int{500, 500}, Proportional{}.Split(1000, []PathState{{Up: true, Capacity: 200}, {Up: true}}))
	// Nothing up: nothing carried, no pick.
	require.Equal(t, []int{0}, Proportional{}.Split(10, []PathState{{}}))
	require.Equal(t, -1, Equal{}.Pick([]PathState{{}}))
	// Remainders are handed out, never lost.
	require.Equal(t, 7, sum(Equal{}.Split(7, []PathState{{Up: true}, {Up: true}, {Up: true}})))
}

func TestNextChunk(t *testing.T) {
	const lo, hi = 64, 1024
	tests := []struct {
		chunk        int
		linear, lost bool
		want         int
		wantLinear   bool
	}{
		{64, false, false, 128, false},    // clean: double
		{1024, false, false, 1024, false}, // capped
		{512, false, true, 256, true},     // a loss: halve, then linear
		{64, true, true, 64, true},        // not below the minimum
		{256, true, false, 320, true},     // after a loss: grow by lo
		{1000, true, false, 1024, true},   // capped
	}
	for _, tc := range tests {
		got, lin := nextChunk(tc.chunk, lo, hi, tc.linear, tc.lost)
		require.Equal(t, tc.want, got, "%+v", tc)
		require.Equal(t, tc.wantLinear, lin, "%+v", tc)
	}
}

// Consecutive decisions see each other: the bytes a pick or split assigns
// count as outstanding at once, so a burst of small sub-flows (failed ones
// re-issued, or new requests) spreads over the paths instead of all going
// to the one that looked idle first.
func TestAssignCountsOutstanding(t *testing.T) {
	for _, bal := range []Balancer{Equal{}, Proportional{}, Adaptive{}} {
		c := &Conn{cfg: Config{Balancer: bal, Small: 1 << 20},
			paths: []pathStats{{PathState: PathState{Up: true, Capacity: 100}}, {PathState: PathState{Up: true, Capacity: 100}},
				{PathState: PathState{Capacity: 100}}}}
		var got [3]int
		for range 8 {
			shares := c.assignLocked(1000, false)
			require.Len(t, shares, 3)
			for i, s := range shares {
				got[i] += s
			}
		}
		require.Equal(t, [3]int{4000, 4000, 0}, got, "%T", bal)
		require.Equal(t, 4000, c.paths[0].Outstanding)
		require.Equal(t, 4000, c.paths[1].Outstanding)
	}
	// Nothing up: no decision, nothing counted.
	c := &Conn{cfg: Config{Balancer: Equal{}, Small: 10}, paths: []pathStats{{}}}
	require.Nil(t, c.assignLocked(100, false))
	require.Nil(t, c.assignLocked(5, false))
	require.Zero(t, c.paths[0].Outstanding)
}

// Revival attempts of a path that keeps failing back off exponentially,
// up to the cap; a success starts over.
func TestBackoff(t *testing.T) {
	const base, limit = 100 * time.Millisecond, time.Second
	t0 := time.Unix(1000, 0)
	var b backoff
	require.True(t, b.due(t0), "the first attempt is not delayed")
	now := t0
	var waits []time.Duration
	for range 6 {
		b.failed(now, base, limit)
		require.False(t, b.due(now.Add(b.wait-time.Nanosecond)))
		require.True(t, b.due(now.Add(b.wait)))
		waits = append(waits, b.wait)
		now = now.Add(b.wait)
	}
	require.Equal(t, []time.Duration{100, 200, 400, 800, 1000, 1000}, func() []time.Duration {
		out := make([]time.Duration, len(waits))
		for i, w := range waits {
			out[i] = w / time.Millisecond
		}
		return out
	}())
	b.reset()
	require.True(t, b.due(now))
	b.failed(now, base, limit)
	require.Equal(t, base, b.wait)
}

// downBalancer gives everything to path 0, up or not.
type downBalancer struct{}

func (downBalancer) Split(n int, paths []PathState) []int {
	return append([]int{n}, make([]int, len(paths)-1)...)
}
func (downBalancer) Pick([]PathState) int { return 0 }

// A balancer that assigns bytes to a path that is down gets no decision:
// the path's QP would flush them back at once, over and over.
func TestAssignRefusesDownPaths(t *testing.T) {
	c := &Conn{cfg: Config{Balancer: downBalancer{}, Small: 10}, paths: []pathStats{{}, {PathState: PathState{Up: true}}}}
	require.Nil(t, c.assignLocked(100, false))
	require.Nil(t, c.assignLocked(5, false))
	require.Zero(t, c.paths[0].Outstanding)
}

// A path's QP backs off its retransmission timeout only to 4 × its floor,
// so that a dead path fails over within about half a second.
func TestConfigPathTimeout(t *testing.T) {
	for _, tc := range []struct {
		in, floor, want time.Duration
	}{
		{0, 0, 80 * time.Millisecond},
		{0, 50 * time.Millisecond, 200 * time.Millisecond},
		{time.Second, 0, time.Second}, // set by the user: kept
	} {
		c := &Config{Connect: verbs.ConnectConfig{MaxTimeout: tc.in, Timeout: tc.floor}}
		require.Equal(t, tc.want, c.defaults(2).Connect.MaxTimeout, "%+v", tc)
	}
}
