package reliability

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
)

// A probe train measures the per-packet loss one way from the echoes that
// are missing, and feeds the estimate the model chooses with.
func TestProbe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Paced, as haul paces them: an unpaced train outruns a loaded
	// receiver. An echo that comes later than the train's wait counts as
	// lost, so on a starved machine the loss can only read high: the
	// assertions hold whatever the machine's speed.
	paced := Config{Rate: 50e6 / 8}
	t.Run("clean", func(t *testing.T) {
		a, _ := pair(t, verbs.Faults{}, paced, Config{})
		res, err := a.conn.Probe(ctx, 500)
		require.NoError(t, err)
		require.Positive(t, res.Echoed)
		require.LessOrEqual(t, res.Echoed, 500)
		require.InDelta(t, 1-float64(res.Echoed)/500, res.Loss, 1e-9)
		require.Positive(t, res.MinRTT)
		require.LessOrEqual(t, res.MinRTT, res.Median)
		if res.Echoed == 500 {
			// No loss in 1000 packets: below about one in a thousand, not zero.
			require.InDelta(t, 0.5/1001, a.conn.Loss(), 1e-9)
		}
	})
	t.Run("lossy", func(t *testing.T) {
		a, _ := pair(t, verbs.Faults{Drop: 0.05, Seed: 11}, paced, Config{})
		res, err := a.conn.Probe(ctx, 2000)
		require.NoError(t, err)
		require.Less(t, res.Echoed, 2000)
		require.GreaterOrEqual(t, res.Loss, 0.03) // the drops are there; lateness only adds
		require.InDelta(t, res.Loss, a.conn.Loss(), 1e-3)
	})
	t.Run("silent peer", func(t *testing.T) {
		a, b := pair(t, verbs.Faults{}, Config{PeerTimeout: 200 * time.Millisecond}, Config{})
		require.NoError(t, b.dev.SetFaults(-1, verbs.Faults{Drop: 1}))
		_, err := a.conn.Probe(ctx, 10)
		require.ErrorIs(t, err, ErrPeer)
	})
	t.Run("bad count", func(t *testing.T) {
		a, _ := pair(t, verbs.Faults{}, Config{}, Config{})
		_, err := a.conn.Probe(ctx, 0)
		require.ErrorIs(t, err, ErrConfig)
	})
}

// The receiver's statuses say which first sends were lost: the estimate
// follows the data's loss, not the repeats (a repeat after a timeout of a
// chunk that had arrived is no loss).
func TestLossFromStatuses(t *testing.T) {
	a, b := pair(t, verbs.Faults{}, Config{Scheme: SR, RTT: 2 * time.Millisecond}, Config{})
	a.conn.mu.Lock()
	a.conn.testDrop = func(seq uint64, idx, try int) bool { return try == 1 && idx%50 == 7 }
	a.conn.mu.Unlock()
	transfer(t, a, b, []int{4 << 20, 4 << 20}, nil)
	// 2048 chunks, 41 lost on their first send; the last statuses of a
	// message may go unread, so a little less is counted.
	require.InDelta(t, 0.02, a.conn.Loss(), 0.004)
}

// The model decides per stripe with the bytes of the stream left: a
// message at the head of a long stream goes by selective repeat (repairs
// hide behind later data); the same message alone, under a bandwidth-delay
// product, by erasure coding. The choices are in the result.
func TestChoicePerStripe(t *testing.T) {
	cfg := Config{Loss: 1e-2, RTT: 50 * time.Millisecond, MinRTT: 50 * time.Millisecond, Rate: 1e9}
	for _, tc := range []struct {
		name   string
		stream int64
		want   Scheme
	}{
		{"head of 4 GiB", 4 << 30, SR},
		{"alone", 0, EC},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t, verbs.Faults{}, cfg, Config{})
			res := transfer(t, a, b, []int{1 << 20}, &SendOptions{Stream: tc.stream})
			d := res[0].Decisions
			require.NotEmpty(t, d)
			require.Equal(t, tc.want, d[0].Scheme, d[0].Reason)
			require.Equal(t, 0, d[0].Chunk)
			require.Equal(t, tc.want, res[0].Scheme)
			require.Contains(t, d[0].Reason, "chunk loss 0.01")
			if tc.want == EC {
				require.Equal(t, res[0].ECChunks, 256)
				require.Positive(t, d[0].M)
			}
		})
	}
}

// At a stream's tail the choice turns from SR to EC: the plan is made
// again as the bytes left shrink.
func TestPlanFollowsBytesLeft(t *testing.T) {
	key := planKey{scheme: Auto, k: 32, chunk: 4096, rmx: 8}
	l := Link{Rate: 250e6, RTT: 100 * time.Millisecond, Loss: 1e-2}
	req := planRequest{key: key, link: l, repair: 110 * time.Millisecond, fallback: 25 * time.Millisecond}
	req.size = 1 << 30
	p := makePlan(req)
	require.Zero(t, p.m, "1 GiB left: SR")
	require.Contains(t, p.reason, "repairs hide behind later data")
	req.size = 8 << 20
	require.Positive(t, makePlan(req).m, "8 MiB left (a third of the BDP): EC")
	// At a loss above parity's cost the model decides even in the body.
	req.size, req.link.Loss = 1<<30, 0.05
	require.Contains(t, makePlan(req).reason, "model at chunk loss 0.05")
	req.link.Loss = 1e-2
	key.scheme = SR
	req.key = key
	require.Zero(t, makePlan(req).m, "forced SR")
	key.scheme, key.m = EC, 3
	req.key, req.size = key, 1<<30
	require.Equal(t, 3, makePlan(req).m, "forced EC with m")
}

// Probe waits for the echoes a round trip and a margin after its last
// probe, not its peer timeout, even when its train is shorter than the
// round trip and some echoes are lost.
func TestProbeWaitsAboutARoundTrip(t *testing.T) {
	a, _ := pair(t, verbs.Faults{Drop: 0.2, Delay: 20 * time.Millisecond, Seed: 5}, Config{PeerTimeout: time.Minute}, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, a.conn.Ready(ctx)) // the RTT is known: the first echo is not its first sample
	res, err := a.conn.Probe(ctx, 50)
	require.NoError(t, err)
	require.Less(t, res.Echoed, 50)
	require.Less(t, res.Duration, 20*time.Second) // not the minute
}
