package verbs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

// A round trip far longer than the timeout floor: the timer backs off and
// then follows the measured round trip, so the connection neither dies
// (a fixed 20 ms and 7 retries gave up after 160 ms) nor resends every
// flight.
func TestRCLongRoundTrip(t *testing.T) {
	a, b := verbstest.Pair(t, verbstest.Loop(), verbstest.PairConfig{})
	for _, s := range []*verbstest.Side{a, b} {
		require.NoError(t, s.Dev.SetFaults(-1, verbs.Faults{Delay: 60 * time.Millisecond}))
	}
	for i := range 8 {
		a.Buf[i] = byte(i + 1)
		a.Post(t, verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
			SGL: []verbs.SGE{a.MR.SGE(i, 1)}, RemoteAddr: b.MR.Addr() + uint64(i), RKey: b.MR.RKey()})
		require.Equal(t, verbs.StatusSuccess, a.Wait(t).Status, "write %d", i)
	}
	require.Equal(t, a.Buf[:8], b.Buf[:8])
	t.Logf("%d retransmission timeouts over a 120 ms round trip", a.QP.Stats().Timeouts)
	// The first flight may time out a few times before the first sample;
	// the later ones must not.
	require.LessOrEqual(t, a.QP.Stats().Timeouts, uint64(4), "timeouts after the round trip was measured")
}
