package verbs_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

// TestDuplicateReadAfterCompletion: a READ request delivered twice is
// answered twice, the second time from memory the application may be
// writing by then (the READ completed); under the race detector that
// re-read must not be reported as the application's race. Every packet
// of the requester goes twice.
func TestDuplicateReadAfterCompletion(t *testing.T) {
	a, b := verbstest.Pair(t, verbstest.UDP(), verbstest.PairConfig{BufSize: 1 << 16})
	require.NoError(t, a.Dev.SetFaults(-1, verbs.Faults{Duplicate: 1, Seed: 1}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for round := range 50 {
		for i := range 8192 {
			b.Buf[i] = byte(round + i)
		}
		_, err := a.QP.PostSend([]verbs.SendWR{{ID: uint64(round), Opcode: verbs.OpRead, Flags: verbs.FlagSignaled,
			SGL: []verbs.SGE{a.MR.SGE(0, 8192)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()}})
		require.NoError(t, err)
		var wc [1]verbs.WorkCompletion
		n, err := a.CQ.WaitPoll(ctx, wc[:])
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, verbs.StatusSuccess, wc[0].Status)
		for i := range 8192 {
			require.Equal(t, byte(round+i), a.Buf[i], "round %d byte %d", round, i)
		}
	}
}
