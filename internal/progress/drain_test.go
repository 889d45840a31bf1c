package progress_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/progress"
	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

// A poster that adds completions a send queue at a time, while the
// background goroutine holds the poller role a batch at a time, keeps the
// CQ from overrunning with Drain after each post; every completion is
// dispatched once.
func TestDrainKeepsUp(t *testing.T) {
	const capacity, depth, limit, total = 1024, 256, 256, 64 << 10
	a, b := verbstest.Pair(t, verbstest.Loop(), verbstest.PairConfig{BufSize: 1 << 16,
		QP: verbs.QPConfig{MaxSendWR: depth}, CQ: verbs.CQConfig{Capacity: capacity, Spin: -1}})
	e := progress.New(a.CQ, progress.Config{Background: true})
	defer e.Close()
	var done atomic.Int64
	op, base := e.Start(total, func(err error) {
		if err == nil {
			done.Add(1)
		}
	})
	wrs := make([]verbs.SendWR, total)
	for i := range wrs {
		wrs[i] = verbs.SendWR{ID: base + uint64(i), Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
			SGL: []verbs.SGE{a.MR.SGE(8*(i%64), 8)}, RemoteAddr: b.MR.Addr() + uint64(8*(i%64)), RKey: b.MR.RKey()}
	}
	for posted := 0; posted < total; {
		n, err := a.QP.PostSend(wrs[posted:])
		posted += n
		if err != nil {
			require.ErrorIs(t, err, verbs.ErrQueueFull)
		}
		require.NoError(t, e.Drain(limit))
		require.LessOrEqual(t, a.CQ.Len(), limit+depth, "a post adds at most a send queue")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, op.Wait(ctx))
	require.Equal(t, int64(1), done.Load())
}

// Drain called by the poller itself, from OnRecv, with completions in the
// CQ, returns instead of waiting for the role it holds.
func TestDrainInOnRecv(t *testing.T) {
	a, b := verbstest.Pair(t, verbstest.Loop(), verbstest.PairConfig{BufSize: 1 << 16, CQ: verbs.CQConfig{Spin: -1}})
	drained := make(chan error, 1)
	var e *progress.Engine
	var first atomic.Bool
	e = progress.New(b.CQ, progress.Config{Background: true, OnRecv: func(wc *verbs.WorkCompletion) {
		if !first.CompareAndSwap(false, true) {
			return
		}
		// Another message arrives while this one is handled.
		_, err := a.QP.PostSend([]verbs.SendWR{{Opcode: verbs.OpSendImm, SGL: []verbs.SGE{a.MR.SGE(0, 4)}}})
		if err == nil {
			for deadline := time.Now().Add(5 * time.Second); b.CQ.Len() == 0 && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			if b.CQ.Len() == 0 {
				err = errors.New("the second message did not arrive")
			}
		}
		if err == nil {
			err = e.Drain(0)
		}
		drained <- err
	}})
	for i := range 2 {
		_, err := b.QP.PostRecv([]verbs.RecvWR{{ID: uint64(i), SGL: []verbs.SGE{b.MR.SGE(64*i, 64)}}})
		require.NoError(t, err)
	}
	_, err := a.QP.PostSend([]verbs.SendWR{{Opcode: verbs.OpSendImm, SGL: []verbs.SGE{a.MR.SGE(0, 4)}}})
	require.NoError(t, err)
	select {
	case err := <-drained:
		require.NoError(t, err)
		e.Close()
	case <-time.After(10 * time.Second):
		// Not closed: Close would wait for the stuck poller.
		t.Fatal("Drain in OnRecv waited for itself")
	}
}
