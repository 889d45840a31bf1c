package verbs_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/lockcheck"
	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

// TestPostInlineNoAlloc: posting a request whose inline data lies on the
// caller's stack, and polling its completion, allocates nothing. Post
// copies inline data, so it must not let the caller's bytes escape: once,
// handing them to the shm port's batch (an interface) made every caller's
// inline data a heap allocation (rma's credit writes among them).
func TestPostInlineNoAlloc(t *testing.T) {
	for _, env := range []verbstest.Env{verbstest.Loop(), verbstest.SHMAlloc()} {
		t.Run(env.Name(), func(t *testing.T) {
			a, b := verbstest.Pair(t, env, verbstest.PairConfig{})
			var wcs [1]verbs.WorkCompletion
			post := func() {
				var data [8]byte // on the stack, unless PostSend leaks it
				data[0] = 7
				_, err := a.QP.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.FlagInline | verbs.FlagSignaled,
					Inline: data[:], RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()}})
				require.NoError(t, err)
				for {
					n, err := a.CQ.Poll(wcs[:])
					require.NoError(t, err)
					if n == 1 {
						break
					}
				}
				require.Equal(t, verbs.StatusSuccess, wcs[0].Status)
			}
			for range 2000 { // warm the pools and every send-queue slot's inline buffer
				post()
			}
			allocs := testing.AllocsPerRun(100, post)
			// The debug build's lock records allocate, and the race
			// detector's pools drop objects at random.
			if !lockcheck.Enabled && !raceEnabledVerbs {
				require.Zero(t, allocs)
			}
		})
	}
}
