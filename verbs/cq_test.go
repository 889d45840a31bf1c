package verbs_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

// TestCQWaiters: every goroutine blocked in Wait returns once the CQ holds
// a completion (push wakes one; the one woken passes it on), and Wake
// makes a Wait return, also one that starts after it.
func TestCQWaiters(t *testing.T) {
	a, b := verbstest.Pair(t, verbstest.Loop(), verbstest.PairConfig{BufSize: 1 << 12, CQ: verbs.CQConfig{Spin: -1}})
	wait := func() <-chan error {
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			done <- a.CQ.Wait(ctx)
		}()
		return done
	}

	// Wake, before a Wait and during one.
	a.CQ.Wake()
	require.NoError(t, <-wait())
	w := wait()
	time.Sleep(20 * time.Millisecond) // into the wait (earlier, it returns at once: the same)
	a.CQ.Wake()
	require.NoError(t, <-w)
	require.Equal(t, 0, a.CQ.Len())

	// Three waiters, one completion.
	ws := []<-chan error{wait(), wait(), wait()}
	time.Sleep(20 * time.Millisecond)
	_, err := a.QP.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{a.MR.SGE(0, 8)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()}})
	require.NoError(t, err)
	for i, w := range ws {
		require.NoError(t, <-w, "waiter %d (the CQ holds %d)", i, a.CQ.Len())
	}
	require.Equal(t, 1, a.CQ.Len())
}
