package verbs_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

// FlagDefer holds a request's packets until the next post without it: a
// deferred WRITE does not land while its QP's retransmission timeout (a
// 10 s here) has not passed; the next plain post sends it with its own,
// and DeferMax waiting packets go on their own. Arrivals are learnt from
// completions (RC completes in order), not by polling the target's memory.
func TestDeferHoldsPackets(t *testing.T) {
	a, b := verbstest.Pair(t, verbstest.Loop(), verbstest.PairConfig{Connect: verbs.ConnectConfig{Timeout: 10 * time.Second, MaxTimeout: 60 * time.Second}})
	put := func(i int, flags verbs.SendFlags) {
		a.Post(t, verbs.SendWR{ID: uint64(i), Opcode: verbs.OpWrite, Flags: flags | verbs.FlagInline, Inline: []byte{byte(i + 1)},
			RemoteAddr: b.MR.Addr() + uint64(i), RKey: b.MR.RKey()})
	}
	landed := func(from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			require.Equal(t, byte(i+1), b.Buf[i], "byte %d", i)
		}
	}
	put(0, verbs.FlagSignaled)
	require.Equal(t, verbs.StatusSuccess, a.Wait(t).Status)
	landed(0, 1)
	for i := 1; i < 10; i++ {
		put(i, verbs.FlagDefer)
	}
	time.Sleep(50 * time.Millisecond) // ample for the loop fabric, were they sent
	require.True(t, bytes.Equal(make([]byte, 9), b.Buf[1:10]), "deferred WRITEs wait for the next plain post")
	put(10, verbs.FlagSignaled)
	require.Equal(t, uint64(10), a.Wait(t).WRID)
	landed(0, 11)
	for i := range verbs.DeferMax {
		flags := verbs.FlagDefer
		if i == verbs.DeferMax-1 {
			flags |= verbs.FlagSignaled
		}
		put(100+i, flags)
	}
	// Its completion comes (within Wait's 10 s, before the 10 s timeout
	// that would send them too) only if the batch went on its own.
	require.Equal(t, uint64(100+verbs.DeferMax-1), a.Wait(t).WRID, "DeferMax packets go without a plain post")
	landed(100, 100+verbs.DeferMax)
}

// A deferred request that no plain post follows goes when the
// retransmission timeout passes, as a send, not a loss: nothing counts as
// a timeout.
func TestDeferBoundedByTimeout(t *testing.T) {
	a, b := verbstest.Pair(t, verbstest.Loop(), verbstest.PairConfig{Connect: verbs.ConnectConfig{Timeout: 5 * time.Millisecond}})
	a.Post(t, verbs.SendWR{ID: 7, Opcode: verbs.OpWrite, Flags: verbs.FlagDefer | verbs.FlagSignaled | verbs.FlagInline, Inline: []byte("late"),
		RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()})
	wc := a.Wait(t)
	require.Equal(t, uint64(7), wc.WRID)
	require.Equal(t, verbs.StatusSuccess, wc.Status)
	require.Equal(t, "late", string(b.Buf[:4]))
	require.Zero(t, a.QP.Stats().Timeouts, "sending a deferred packet is no retransmission")
}
