package verbs_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

// QP.Stats counts a lossy path's recoveries; a clean path has no
// sequence NAKs.
func TestQPStats(t *testing.T) {
	for _, drop := range []float64{0, 0.1} {
		a, b := verbstest.Pair(t, verbstest.Loop(), verbstest.PairConfig{BufSize: 1 << 20,
			Connect: verbs.ConnectConfig{MTU: 4096, Timeout: 2 * time.Millisecond}})
		require.NoError(t, a.Dev.SetFaults(0, verbs.Faults{Drop: drop, Seed: 3}))
		a.Post(t, verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
			SGL: []verbs.SGE{a.MR.SGE(0, 1<<20)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()})
		wc := a.Wait(t)
		require.NoError(t, wc.Err())
		s := a.QP.Stats()
		if drop == 0 {
			// No gap, no sequence NAK (a timeout may fire on a slow
			// machine, so timeouts are not asserted).
			require.Zero(t, s.SeqNaks)
			require.Zero(t, s.RNRNaks)
		} else {
			require.Positive(t, s.Timeouts+s.SeqNaks, "losses on a 10%% lossy path went unnoticed")
		}
	}
}
