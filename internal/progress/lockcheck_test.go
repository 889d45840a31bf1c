//go:build rvmadebug

package progress_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/progress"
	"github.com/rvma/rvma/internal/testutil"
	"github.com/rvma/rvma/verbs"
)

// TestRulesEnforced breaks the engine's documented rules on purpose; the
// debug build panics, naming the rule, where a normal build would
// deadlock (or race).
func TestRulesEnforced(t *testing.T) {
	ctx := context.Background()

	t.Run("wait in OnRecv", func(t *testing.T) {
		a, b := pair(t, -1)
		msgs := make(chan string, 1)
		var e *progress.Engine
		e = progress.New(b.CQ, progress.Config{Background: true, OnRecv: func(*verbs.WorkCompletion) {
			op, _ := e.Start(0, nil)
			msgs <- testutil.Recovered(func() { op.Wait(ctx) })
			e.Finish(op, nil) // Start and Finish are allowed
		}})
		defer e.Close()
		_, err := b.QP.PostRecv([]verbs.RecvWR{{SGL: []verbs.SGE{b.MR.SGE(0, 64)}}})
		require.NoError(t, err)
		_, err = a.QP.PostSend([]verbs.SendWR{{Opcode: verbs.OpSend, SGL: []verbs.SGE{a.MR.SGE(0, 4)}}})
		require.NoError(t, err)
		select {
		case m := <-msgs:
			require.Contains(t, m, "Wait called from an OnRecv")
		case <-time.After(10 * time.Second):
			t.Fatal("no receive")
		}
		// The poller let go of the role: the engine still works.
		op, _ := e.Start(0, nil)
		go e.Finish(op, nil)
		require.NoError(t, op.Wait(ctx))
	})

	t.Run("locking from an OnDone", func(t *testing.T) {
		a, _ := pair(t, -1)
		e := progress.New(a.CQ, progress.Config{})
		defer e.Close()
		other, _ := e.Start(0, nil)
		var msg string
		op, _ := e.Start(0, func(error) {
			msg = testutil.Recovered(func() { e.Finish(other, nil) }) // FinishLocked is the one to call
		})
		e.Finish(op, nil)
		require.Contains(t, msg, "which it holds already")
		e.Locked(func() { e.FinishLocked(other, nil) })
		require.NoError(t, other.Err())
	})

	t.Run("locking from a Wait condition", func(t *testing.T) {
		a, _ := pair(t, -1)
		e := progress.New(a.CQ, progress.Config{})
		defer e.Close()
		var msg string
		require.NoError(t, e.Wait(ctx, func() bool {
			msg = testutil.Recovered(e.Wake)
			return true
		}))
		require.Contains(t, msg, "which it holds already")
	})

	t.Run("FinishLocked without the lock", func(t *testing.T) {
		a, _ := pair(t, -1)
		e := progress.New(a.CQ, progress.Config{})
		defer e.Close()
		op, _ := e.Start(0, nil)
		require.Contains(t, testutil.Recovered(func() { e.FinishLocked(op, nil) }), "FinishLocked, but goroutine")
	})
}
