package multipath

import (
	"testing"

	"github.com/stretchr/testify/require"
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
