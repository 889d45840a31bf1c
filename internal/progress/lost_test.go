package progress

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

// TestNoLostWakeup plays, in direct mode, the two moves of another
// goroutine that once left a waiter asleep with its request complete or
// its completion unpolled, each at the moment that opened the gap. The
// waiter must return at once; the stranded one waited out its context.
func TestNoLostWakeup(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   waitPoint
		move func(e *Engine)
	}{
		// Another poller finished the request between the waiter's look
		// at it and its taking the role: the waiter then blocked on a CQ
		// that would deliver nothing more.
		{"finished before the role", beforeRole, func(e *Engine) {
			ok, err := e.Progress()
			if !ok || err != nil {
				panic("the completion was not there to take")
			}
		}},
		// The holder let the role go, and woke the round, after the
		// waiter failed to take it and before it slept: it then slept
		// with nobody polling.
		{"released before the sleep", beforeSleep, func(e *Engine) {
			e.poller.Store(false)
			e.Wake()
		}},
		// The role's holder (a Test) let it go after the waiter slept:
		// it must wake the waiter, or nobody polls.
		{"released after the sleep", beforeSleep, func(e *Engine) {
			go func() {
				for !e.holds(func() bool { return e.sleepers }) {
					time.Sleep(time.Millisecond)
				}
				e.letGo()
			}()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := verbstest.Pair(t, verbstest.Loop(), verbstest.PairConfig{BufSize: 1 << 12})
			e := New(a.CQ, Config{})
			defer e.Close()
			op, id := e.Start(1, nil)
			_, err := a.QP.PostSend([]verbs.SendWR{{ID: id, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
				SGL: []verbs.SGE{a.MR.SGE(0, 8)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()}})
			require.NoError(t, err)
			require.Eventually(t, func() bool { return a.CQ.Len() > 0 }, 5*time.Second, time.Millisecond)

			played := false
			waitHook = func(e *Engine, at waitPoint) {
				if at == beforeRole && tc.at == beforeSleep && !played { // both beforeSleep cases
					// Someone else holds the role when the waiter tries it.
					e.poller.Store(true)
				}
				if at == tc.at && !played && (at != beforeSleep || e.poller.Load()) {
					played = true
					tc.move(e)
				}
			}
			t.Cleanup(func() { waitHook = nil })
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			require.NoError(t, op.Wait(ctx))
			require.True(t, played, "the move was played")
		})
	}
}

// TestDirectFinishElsewhere: in direct mode the waiter that holds the
// poller role blocks on the CQ; an Op finished by another goroutine (a
// reply, a post that failed there) must end that wait, with nothing more
// ever arriving on the CQ. The same for a Wake after a change of state a
// condition reads.
func TestDirectFinishElsewhere(t *testing.T) {
	for _, by := range []string{"finish", "posted", "wake"} {
		t.Run(by, func(t *testing.T) {
			a, _ := verbstest.Pair(t, verbstest.Loop(), verbstest.PairConfig{BufSize: 1 << 12, CQ: verbs.CQConfig{Spin: -1}})
			e := New(a.CQ, Config{})
			defer e.Close()
			n := 0
			if by == "posted" {
				n = 1
			}
			op, id := e.Start(n, nil)
			var flag bool
			cond := func() bool { return op.done || flag }
			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				done <- e.Wait(ctx, cond)
			}()
			require.Eventually(t, func() bool { return e.poller.Load() }, 5*time.Second, time.Millisecond)
			time.Sleep(20 * time.Millisecond) // on the CQ by now (earlier, it returns the same)
			switch by {
			case "finish":
				e.Finish(op, nil)
			case "posted":
				e.Posted(op, id, 1, 0, verbs.ErrQueueFull) // the post failed: none was posted
			case "wake":
				e.Locked(func() { flag = true })
				e.Wake()
			}
			require.NoError(t, <-done)
		})
	}
}

// TestCondOnce: a condition that is met is not evaluated again, since it
// may take what it found (multipath's Recv takes the message). Another
// poller queues items between the waiter's first look and its own poll.
func TestCondOnce(t *testing.T) {
	for _, queued := range []int{1, 2} {
		t.Run(fmt.Sprint(queued), func(t *testing.T) {
			a, _ := verbstest.Pair(t, verbstest.Loop(), verbstest.PairConfig{BufSize: 1 << 12, CQ: verbs.CQConfig{Spin: -1}})
			e := New(a.CQ, Config{})
			defer e.Close()
			queue, took := 0, 0
			cond := func() bool {
				if queue == 0 {
					return false
				}
				queue--
				took++
				return true
			}
			played := false
			waitHook = func(e *Engine, at waitPoint) {
				if at == beforeRole && !played {
					played = true
					e.Locked(func() { queue = queued }) // another poller's OnRecv
				}
			}
			t.Cleanup(func() { waitHook = nil })
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			require.NoError(t, e.Wait(ctx, cond))
			require.Equal(t, 1, took, "one item taken by one Wait")
			require.Equal(t, queued-1, queue)
		})
	}
}

// TestTestLetsGo: a Test that holds the poller role while a waiter goes
// to sleep must wake it when it lets the role go, or nobody polls for it.
func TestTestLetsGo(t *testing.T) {
	a, b := verbstest.Pair(t, verbstest.Loop(), verbstest.PairConfig{BufSize: 1 << 12, CQ: verbs.CQConfig{Spin: -1}})
	write := func(id uint64) {
		_, err := a.QP.PostSend([]verbs.SendWR{{ID: id, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
			SGL: []verbs.SGE{a.MR.SGE(0, 8)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()}})
		require.NoError(t, err)
	}
	var yid uint64
	inPoll, first := make(chan struct{}), true
	var e *Engine
	e = New(a.CQ, Config{AfterPoll: func() {
		if !first {
			return
		}
		first = false
		close(inPoll)
		// Hold the role until the waiter sleeps, then leave it a
		// completion that only a poller will take.
		for !e.holds(func() bool { return e.sleepers }) {
			time.Sleep(time.Millisecond)
		}
		write(yid)
		for a.CQ.Len() == 0 {
			time.Sleep(time.Millisecond)
		}
	}})
	defer e.Close()
	x, xid := e.Start(1, nil)
	y, id := e.Start(1, nil)
	yid = id
	write(xid)
	require.Eventually(t, func() bool { return a.CQ.Len() > 0 }, 5*time.Second, time.Millisecond)
	done := make(chan error, 1)
	go func() {
		<-inPoll
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		done <- y.Wait(ctx)
	}()
	ok, err := x.Test()
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, <-done, "the waiter was left asleep with nobody polling")
}
