package verbs

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRTOEstimator(t *testing.T) {
	ms := time.Millisecond
	t0 := time.Unix(0, 0)
	var e rtoEstimator
	e.init(20*ms, 2*time.Second)
	require.Equal(t, 20*ms, e.rto(), "before a sample: the floor")

	// A 100 ms round trip: srtt 100, rttvar 50, rto 300.
	e.sent(10, t0)
	e.sent(11, t0.Add(ms)) // one PSN timed at a time
	e.acked(11, t0.Add(100*ms))
	require.Equal(t, 100*ms, e.srtt)
	require.Equal(t, 50*ms, e.rttvar)
	require.Equal(t, 300*ms, e.rto())

	// An acknowledgement that does not cover the timed PSN gives none.
	e.sent(20, t0.Add(200*ms))
	e.acked(20, t0.Add(250*ms))
	require.Equal(t, 100*ms, e.srtt)
	e.acked(21, t0.Add(260*ms))                        // covers 20: a 60 ms sample
	require.Equal(t, 95*ms, e.srtt)                    // 7/8·100 + 1/8·60
	require.Equal(t, 47500*time.Microsecond, e.rttvar) // 3/4·50 + 1/4·40

	// Timeouts double it up to the cap, and progress ends the backoff.
	base := e.rto()
	e.timedOut(t0.Add(300 * ms))
	require.Equal(t, 2*base, e.rto())
	for range 10 {
		e.timedOut(t0.Add(400 * ms))
	}
	require.Equal(t, 2*time.Second, e.rto())
	e.acked(22, t0.Add(time.Second))
	require.Equal(t, 2*time.Second, e.rto(), "progress long after the retransmission keeps the backoff")
	e.sent(40, t0.Add(time.Second))
	e.acked(41, t0.Add(time.Second+95*ms))
	require.Less(t, e.rto(), base+ms, "a sample ends it")

	// Karn: a PSN timed, then resent, gives no sample; one before the
	// rewind still does.
	e.sent(30, t0.Add(2*time.Second))
	e.resent(30)
	e.acked(31, t0.Add(5*time.Second))
	require.Equal(t, 95*ms, e.srtt)
	e.sent(32, t0.Add(6*time.Second))
	e.resent(40)
	e.acked(33, t0.Add(6*time.Second+95*ms))
	require.Equal(t, 95*ms, e.srtt, "a 95 ms sample")
	require.Less(t, e.rttvar, 47500*time.Microsecond)

	// A loss (progress soon after the retransmission) ends the backoff.
	e.timedOut(t0.Add(7 * time.Second))
	e.timedOut(t0.Add(7 * time.Second))
	e.acked(50, t0.Add(7*time.Second+ms))
	require.Equal(t, e.base(), e.rto())

	// Fast round trips never take it below the floor.
	var f rtoEstimator
	f.init(20*ms, 2*time.Second)
	for i := range uint32(50) {
		f.sent(i, t0)
		f.acked(i+1, t0.Add(30*time.Microsecond))
	}
	require.Equal(t, 20*ms, f.rto())

	// PSNs wrap at 2^24.
	var g rtoEstimator
	g.init(ms, time.Second)
	g.sent(0xfffffe, t0)
	g.acked(1, t0.Add(5*ms))
	require.Equal(t, 5*ms, g.srtt)
}
