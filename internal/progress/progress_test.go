package progress_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/progress"
	"github.com/rvma/rvma/internal/testutil"
	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

func pair(t *testing.T, cqSpin time.Duration) (*verbstest.Side, *verbstest.Side) {
	return verbstest.Pair(t, verbstest.Loop(), verbstest.PairConfig{BufSize: 1 << 16, CQ: verbs.CQConfig{Spin: cqSpin}})
}

// Many goroutines wait on their own writes over one CQ; every write
// completes exactly once, in both waiting modes.
func TestConcurrentWaiters(t *testing.T) {
	for _, bg := range []bool{false, true} {
		t.Run(map[bool]string{false: "direct", true: "background"}[bg], func(t *testing.T) {
			spin := time.Duration(0)
			if bg {
				spin = -1 // the background poller must sleep on the CQ
			}
			a, b := pair(t, spin)
			e := progress.New(a.CQ, progress.Config{Background: bg})
			defer e.Close()
			var done atomic.Int64
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range 200 {
						op, id := e.Start(1, func(err error) {
							if err == nil {
								done.Add(1)
							}
						})
						_, err := a.QP.PostSend([]verbs.SendWR{{ID: id, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
							SGL: []verbs.SGE{a.MR.SGE(8*g, 8)}, RemoteAddr: b.MR.Addr() + uint64(8*i), RKey: b.MR.RKey()}})
						require.NoError(t, err)
						ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						require.NoError(t, op.Wait(ctx))
						cancel()
					}
				}()
			}
			wg.Wait()
			require.Equal(t, int64(8*200), done.Load())
		})
	}
}

func TestFinishPostedAndErrors(t *testing.T) {
	a, b := pair(t, -1)
	e := progress.New(a.CQ, progress.Config{Background: true})
	defer e.Close()
	ctx := context.Background()

	// An Op finished from outside the CQ.
	op, _ := e.Start(0, nil)
	done, err := op.Test()
	require.False(t, done)
	require.NoError(t, err)
	boom := errors.New("boom")
	go e.Finish(op, boom)
	require.ErrorIs(t, op.Wait(ctx), boom)

	// A partial post: one of three posted, the rest never will be.
	op, id := e.Start(3, nil)
	_, err = a.QP.PostSend([]verbs.SendWR{{ID: id, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{a.MR.SGE(0, 8)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()}})
	require.NoError(t, err)
	e.Posted(op, id, 3, 1, verbs.ErrQueueFull)
	require.ErrorIs(t, op.Wait(ctx), verbs.ErrQueueFull)

	// A failed completion carries the mapped error.
	op, id = e.Start(1, nil)
	_, err = a.QP.PostSend([]verbs.SendWR{{ID: id, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{a.MR.SGE(0, 8)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey() + 1}})
	require.NoError(t, err)
	require.ErrorIs(t, op.Wait(ctx), verbs.StatusRemoteAccessError)

	// A waiter's context ends the wait.
	op, _ = e.Start(0, nil)
	short, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, op.Wait(short), context.DeadlineExceeded)
}

// Receive completions reach OnRecv in order, with a background poller and
// nobody waiting. In a synctest bubble: once every goroutine is idle, the
// background poller has handled all that arrived.
func TestOnRecv(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := pair(t, -1)
		var mu sync.Mutex
		var got []uint32
		e := progress.New(b.CQ, progress.Config{Background: true, OnRecv: func(wc *verbs.WorkCompletion) {
			mu.Lock()
			got = append(got, wc.Imm)
			mu.Unlock()
		}})
		defer e.Close()
		for i := range 16 {
			_, err := b.QP.PostRecv([]verbs.RecvWR{{ID: uint64(i), SGL: []verbs.SGE{b.MR.SGE(64*i, 64)}}})
			require.NoError(t, err)
		}
		for i := range 16 {
			_, err := a.QP.PostSend([]verbs.SendWR{{Opcode: verbs.OpSendImm, Imm: uint32(i), SGL: []verbs.SGE{a.MR.SGE(0, 4)}}})
			require.NoError(t, err)
		}
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, got, 16)
		for i, v := range got {
			require.Equal(t, uint32(i), v)
		}
	})
}

// In direct mode (no background poller), a waiter that finds the poller
// role taken sleeps until the holder lets it go; whoever lets it go, a
// Wait's poller or a Test, must leave nobody asleep with nobody polling.
// Goroutines that Test their writes before waiting shuffle the role among
// many hands; a stranded waiter fails on its context.
func TestDirectNoStrandedWaiter(t *testing.T) {
	for _, env := range []verbstest.Env{verbstest.Loop(), verbstest.UDP()} {
		t.Run(env.Name(), func(t *testing.T) { directNoStrandedWaiter(t, env) })
	}
}

func directNoStrandedWaiter(t *testing.T, env verbstest.Env) {
	a, b := verbstest.Pair(t, env, verbstest.PairConfig{BufSize: 1 << 16})
	e := progress.New(a.CQ, progress.Config{})
	defer e.Close()
	testutil.Rounds(t, 16, 300, func(g, i int) error {
		op, id := e.Start(1, nil)
		_, err := a.QP.PostSend([]verbs.SendWR{{ID: id, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
			SGL: []verbs.SGE{a.MR.SGE(8*g, 8)}, RemoteAddr: b.MR.Addr() + uint64(8*(i%64)), RKey: b.MR.RKey()}})
		if err == nil && g%2 == 0 {
			_, err = op.Test()
		}
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return op.Wait(ctx)
	})
}
