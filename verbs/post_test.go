package verbs_test

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/lockcheck"
	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

// holdFirstFlush holds the first outbox that carries first transmissions
// of qp's requests before it is sent: entered is closed then, and the
// poster waits there, its packets unsent, until release is called (at
// the latest when the test ends, before the pair closes).
func holdFirstFlush(t *testing.T, qp *verbs.QP) (entered chan struct{}, release func()) {
	return holdFlush(t, func(held []*verbs.QP) bool { return slices.Contains(held, qp) })
}

// holdFlush is holdFirstFlush for the first outbox whose held QPs (those
// with first transmissions in it; none for READ responses) match.
func holdFlush(t *testing.T, match func(held []*verbs.QP) bool) (entered chan struct{}, release func()) {
	entered, gate := make(chan struct{}), make(chan struct{})
	var once sync.Once
	verbs.SetFlushHook(func(held []*verbs.QP) {
		if match(held) {
			once.Do(func() { close(entered); <-gate })
		}
	})
	release = sync.OnceFunc(func() { close(gate) })
	t.Cleanup(func() { release(); verbs.SetFlushHook(nil) })
	return entered, release
}

// TestNoCompletionBeforeFlush: a request's first transmission leaves
// after the QP's lock, from its outbox, and reads the request's memory
// then. If its retransmission (a timeout while the poster was delayed) is
// acknowledged first, the request must still not complete, which hands
// its buffer back, until that outbox has been sent: the race detector saw
// the stale packet read a buffer its owner was already reusing.
func TestNoCompletionBeforeFlush(t *testing.T) {
	for _, env := range []verbstest.Env{verbstest.Loop(), verbstest.UDP()} {
		t.Run(env.Name(), func(t *testing.T) {
			a, b := verbstest.Pair(t, env, verbstest.PairConfig{Connect: verbs.ConnectConfig{Timeout: time.Millisecond}})
			entered, release := holdFirstFlush(t, a.QP)
			for i := range 64 {
				a.Buf[i] = byte(i + 1)
			}
			posted := make(chan error, 1)
			go func() {
				_, err := a.QP.PostSend([]verbs.SendWR{{ID: 7, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
					SGL: []verbs.SGE{a.MR.SGE(0, 64)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()}})
				posted <- err
			}()
			<-entered
			// The retransmission lands and is acknowledged...
			require.Eventually(t, func() bool { return a.QP.Held() || a.CQ.Len() > 0 }, 10*time.Second, 100*time.Microsecond)
			// ...but the request does not complete while its first
			// transmission waits to be sent.
			require.Zero(t, a.CQ.Len(), "completed while its packet was still to be sent")
			release()
			require.NoError(t, <-posted)
			wc := a.Wait(t)
			require.Equal(t, uint64(7), wc.WRID)
			require.Equal(t, verbs.StatusSuccess, wc.Status)
			require.False(t, a.QP.Held())
			require.Equal(t, a.Buf[:64], b.Buf[:64])
		})
	}
}

// TestNoErrorBeforeFlush: a QP that fails while an outbox still holds
// first transmissions of its requests completes them, with their errors,
// only once that outbox is sent. An error completion hands the buffer
// back as a success does; the stale packet would read it after. Both ways
// to fail: the user moving the QP to the error state (toErrorLocked), and
// the target refusing a retransmission (fail, with an acknowledged
// request ahead of the refused one).
func TestNoErrorBeforeFlush(t *testing.T) {
	type want struct {
		id uint64
		st verbs.Status
	}
	for _, tc := range []struct {
		name string
		bad  bool // the second WRITE carries a wrong key
		fail func(t *testing.T, a *verbstest.Side)
		want []want
	}{
		{name: "set-error", fail: func(t *testing.T, a *verbstest.Side) { require.NoError(t, a.QP.SetError()) },
			want: []want{{1, verbs.StatusFlushed}, {2, verbs.StatusFlushed}}},
		{name: "refused", bad: true, fail: func(t *testing.T, a *verbstest.Side) {
			// The retransmission is acknowledged, then refused.
			require.Eventually(t, func() bool { return a.QP.State() == verbs.StateError }, 10*time.Second, 100*time.Microsecond)
		}, want: []want{{1, verbs.StatusSuccess}, {2, verbs.StatusRemoteAccessError}}},
	} {
		for _, env := range []verbstest.Env{verbstest.Loop(), verbstest.UDP()} {
			t.Run(tc.name+"/"+env.Name(), func(t *testing.T) {
				a, b := verbstest.Pair(t, env, verbstest.PairConfig{Connect: verbs.ConnectConfig{Timeout: time.Millisecond}})
				entered, release := holdFirstFlush(t, a.QP)
				rkey := b.MR.RKey()
				if tc.bad {
					rkey ^= 0x55
				}
				posted := make(chan error, 1)
				go func() {
					_, err := a.QP.PostSend([]verbs.SendWR{
						{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{a.MR.SGE(0, 64)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()},
						{ID: 2, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{a.MR.SGE(64, 64)}, RemoteAddr: b.MR.Addr(), RKey: rkey},
					})
					posted <- err
				}()
				<-entered
				tc.fail(t, a)
				require.Equal(t, verbs.StateError, a.QP.State())
				require.Zero(t, a.CQ.Len(), "completed while its packets were still to be sent")
				release()
				require.NoError(t, <-posted)
				wcs := a.WaitN(t, 2)
				for i, w := range tc.want {
					require.Equal(t, w.id, wcs[i].WRID)
					require.Equal(t, w.st, wcs[i].Status)
				}
			})
		}
	}
}

// TestReturnsAfterFlush: packets read memory when their outbox is sent,
// perhaps by another goroutine after the call that gives that memory back
// took its locks. Destroy (whose requests' first transmissions read their
// buffers) and Deregister (whose region a READ's responses read; for
// AllocMR on shm it is unmapped) return only once those packets are sent,
// so a caller that reuses the memory then changes no packet, and the
// requester of the READ gets the bytes as they were.
func TestReturnsAfterFlush(t *testing.T) {
	for _, tc := range []struct {
		name  string
		op    verbs.Opcode
		held  func(a *verbstest.Side) func([]*verbs.QP) bool
		call  func(a, b *verbstest.Side) error
		check func(t *testing.T, a, b *verbstest.Side)
	}{
		{name: "destroy", op: verbs.OpWrite,
			held: func(a *verbstest.Side) func([]*verbs.QP) bool {
				return func(h []*verbs.QP) bool { return slices.Contains(h, a.QP) }
			},
			call: func(a, _ *verbstest.Side) error { return a.QP.Destroy() },
			check: func(t *testing.T, a, _ *verbstest.Side) {
				require.ErrorIs(t, a.QP.Destroy(), verbs.ErrClosed)
			}},
		{name: "deregister", op: verbs.OpRead,
			held: func(*verbstest.Side) func([]*verbs.QP) bool {
				return func(h []*verbs.QP) bool { return len(h) == 0 } // READ responses
			},
			call: func(_, b *verbstest.Side) error { return b.MR.Deregister() },
			check: func(t *testing.T, a, _ *verbstest.Side) {
				wcs := a.WaitN(t, 1)
				require.Equal(t, verbs.StatusSuccess, wcs[0].Status)
				for i, c := range a.Buf[:256] {
					require.Equal(t, byte(i^0x5a), c, "byte %d: not as it was", i)
				}
			}},
	} {
		for _, env := range []verbstest.Env{verbstest.Loop(), verbstest.UDP()} {
			t.Run(tc.name+"/"+env.Name(), func(t *testing.T) {
				a, b := verbstest.Pair(t, env, verbstest.PairConfig{})
				for i := range 256 {
					a.Buf[i], b.Buf[i] = byte(i), byte(i^0x5a)
				}
				entered, release := holdFlush(t, tc.held(a))
				posted := postAsync(a.QP, verbs.SendWR{ID: 1, Opcode: tc.op, Flags: verbs.FlagSignaled,
					SGL: []verbs.SGE{a.MR.SGE(0, 256)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()})
				<-entered
				returnsOnlyAfter(t, tc.name, func() error { return tc.call(a, b) }, func() {
					release()
					require.NoError(t, <-posted)
				})
				tc.check(t, a, b)
			})
		}
	}
}

// postAsync posts wr from a goroutine of its own: the loop fabric may
// deliver, and the peer answer, within the post, which a held flush stops.
func postAsync(qp *verbs.QP, wr verbs.SendWR) <-chan error {
	posted := make(chan error, 1)
	go func() {
		_, err := qp.PostSend([]verbs.SendWR{wr})
		posted <- err
	}()
	return posted
}

// returnsOnlyAfter runs call, which must not return until release has
// run, and then must return nil.
func returnsOnlyAfter(t *testing.T, name string, call func() error, release func()) {
	done := make(chan error, 1)
	go func() { done <- call() }()
	require.Never(t, func() bool { return len(done) > 0 }, 50*time.Millisecond, time.Millisecond,
		"%s returned while a packet was still to read the memory it gives back", name)
	release()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not return once the packets were sent", name)
	}
}

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

// TestErrorAfterAcknowledged: of one post of a good WRITE and one the
// target refuses, the first completes with success and the second with
// the error, also when the refusal arrives while the post's outbox is
// being sent (the loop fabric delivers in the sender's goroutine, so the
// NAK is handled inside the flush): the first's completion, held for the
// outbox, must not take the second's status.
func TestErrorAfterAcknowledged(t *testing.T) {
	for _, env := range []verbstest.Env{verbstest.Loop(), verbstest.UDP()} {
		t.Run(env.Name(), func(t *testing.T) {
			a, b := verbstest.Pair(t, env, verbstest.PairConfig{})
			n, err := a.QP.PostSend([]verbs.SendWR{
				{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{a.MR.SGE(0, 64)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()},
				{ID: 2, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{a.MR.SGE(64, 64)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey() ^ 0x55},
			})
			require.NoError(t, err)
			require.Equal(t, 2, n)
			wcs := a.WaitN(t, 2)
			require.Equal(t, uint64(1), wcs[0].WRID)
			require.Equal(t, verbs.StatusSuccess, wcs[0].Status)
			require.Equal(t, uint64(2), wcs[1].WRID)
			require.Equal(t, verbs.StatusRemoteAccessError, wcs[1].Status)
		})
	}
}
