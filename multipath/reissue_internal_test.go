package multipath

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
)

// A re-issue whose post fails finishes its request from the re-issuing
// goroutine, while the waiter holds the direct engine's poller role and
// blocks on the CQ: Wait must return the request's error at once, not
// when its context ends.
//
// Path 0 drops everything; path 1 delivers its half of a 1 MiB write, and
// then its QP is destroyed. When path 0 gives up, its half is re-issued
// on path 1 (still up: nothing has failed there yet), from a goroutine of
// its own, whose PostSend fails with verbs.ErrClosed: path 1 goes down
// too, and the request finishes with ErrPaths outside the poller's
// dispatch, with nothing more to arrive on the CQ.
func TestReissueFailedPostWakesWaiter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var r [4]byte
	rand.Read(r[:])
	uri := "loop://mp-reissue-" + hex.EncodeToString(r[:]) + "?gids=2"
	type end struct {
		dev *verbs.Device
		pd  *verbs.PD
		mr  *verbs.MR
	}
	const n = 1 << 20
	open := func() end {
		d, err := verbs.Open(ctx, uri, nil)
		require.NoError(t, err)
		t.Cleanup(func() { d.Close() })
		pd, err := d.AllocPD()
		require.NoError(t, err)
		mr, err := pd.RegisterMR(make([]byte, n), verbs.AccessAll)
		require.NoError(t, err)
		return end{d, pd, mr}
	}
	a, b := open(), open()

	ln, err := Listen(ctx, b.pd, "127.0.0.1:0", nil)
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	acc := make(chan *Conn, 1)
	go func() {
		c, _ := ln.Accept(ctx)
		acc <- c
	}()
	c, err := Dial(ctx, a.pd, ln.Addr(), &Config{Balancer: Equal{}, Revive: time.Hour,
		Connect: verbs.ConnectConfig{Timeout: 50 * time.Millisecond, RetryCount: 2}})
	require.NoError(t, err)
	peer := <-acc
	require.NotNil(t, peer)
	t.Cleanup(func() { c.Close(); peer.Close() })
	require.True(t, c.Paths()[0].Up)
	require.True(t, c.Paths()[1].Up)

	require.NoError(t, a.dev.SetFaults(0, verbs.Faults{Drop: 1}))
	rand.Read(a.mr.Bytes())
	req, err := c.Write(a.mr, 0, n, b.mr.Addr(), b.mr.RKey())
	require.NoError(t, err)
	// Nobody else polls: drive the engine until path 1 has delivered its
	// half. Path 0 gives up only after its retries (hundreds of ms).
	require.Eventually(t, func() bool {
		c.eng.Progress()
		return c.Paths()[1].Bytes >= n/2
	}, 10*time.Second, 100*time.Microsecond)
	done, _ := req.Test()
	require.False(t, done)
	// No poll from here to the Destroy: path 0's failure, if it is on the
	// CQ already, is dispatched only by Wait.
	p := c.Paths()
	require.Equal(t, uint64(n/2), p[1].Bytes, "path 1 carried its half only")
	require.True(t, p[0].Up, "path 0 failed before path 1's QP was destroyed: nothing to re-issue onto a dead QP")

	// Path 1's QP goes away behind the connection's back: the re-issue's
	// post will fail.
	require.NoError(t, c.qp(1).Destroy())

	const deadline = 3 * time.Second
	wctx, wcancel := context.WithTimeout(ctx, deadline)
	defer wcancel()
	start := time.Now()
	err = req.Wait(wctx)
	el := time.Since(start)
	t.Logf("Wait returned after %v: %v", el, err)
	// The request's own error, read without polling: set once it has
	// finished (the parent Op has no work requests of its own).
	ferr := req.op.Err()
	require.Error(t, err)
	require.False(t, errors.Is(err, context.DeadlineExceeded),
		"Wait ran into its deadline; the request's own error: %v", ferr)
	require.Less(t, el, deadline/2, "Wait returned late")
	require.ErrorIs(t, err, ErrPaths)
	require.ErrorIs(t, err, verbs.ErrClosed)
	require.ErrorIs(t, ferr, ErrPaths, "the request's own error")
	p = c.Paths()
	require.False(t, p[0].Up)
	require.False(t, p[1].Up)
}
