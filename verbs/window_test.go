package verbs

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWindowFollowsMTU: with the default window, the packets of bulk
// messages on a UDP path of large packets are held to about 1 MiB (never
// fewer than minCwnd), so that they do not outrun a receive buffer, while
// small messages keep the whole window; a window given is kept for both.
func TestWindowFollowsMTU(t *testing.T) {
	for _, tc := range []struct {
		window, mtu     int
		want, ackEveryW int
	}{
		{0, 256, 128, 32},
		{0, 1024, 128, 32},
		{0, 4096, 128, 32},
		{0, 8192, 128, 32},
		{0, 16384, 64, 16},
		{0, 32768, 32, 8},
		{0, 61440, 17, 4},
		{0, 64880, 16, 4},
		{256, 61440, 256, 64},
		{8, 4096, 8, 2},
	} {
		t.Run(fmt.Sprintf("window %d mtu %d", tc.window, tc.mtu), func(t *testing.T) {
			a, err := resolveConnect(&ConnectConfig{Window: tc.window})
			require.NoError(t, err)
			a.fitWindow(tc.mtu, true)
			require.Equal(t, tc.want, a.bulk)
			require.Equal(t, tc.ackEveryW, a.bulkAckEvery)
			w := tc.window
			if w == 0 {
				w = defaultWindow
			}
			require.Equal(t, w, a.window, "the whole window stays")
			require.Equal(t, ackEveryFor(w), a.ackEvery)
			// Not over UDP: the whole window.
			a.fitWindow(tc.mtu, false)
			require.Equal(t, w, a.bulk)
		})
	}
}

// TestBulkWindowShrinksWithLosses: the bulk window is its share of the
// congestion window, so every loss halves it too, down to minCwnd.
func TestBulkWindowShrinksWithLosses(t *testing.T) {
	a, err := resolveConnect(nil)
	require.NoError(t, err)
	a.fitWindow(61440, true)
	r := &requester{cwnd: a.window}
	var got []int32
	for range 6 {
		got = append(got, r.bulkWindow(&a))
		r.cwnd = max(minCwnd, r.cwnd/2) // onLoss
	}
	require.Equal(t, []int32{17, 8, 4, 4, 4, 4}, got)
	b, err := resolveConnect(nil)
	require.NoError(t, err)
	b.fitWindow(4096, true)
	r = &requester{cwnd: b.window}
	require.Equal(t, int32(128), r.bulkWindow(&b))
	r.cwnd = 64
	require.Equal(t, int32(64), r.bulkWindow(&b))
}
