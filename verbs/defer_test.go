package verbs_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

// FlagDefer holds a request's packets until the next post without it: on
// the loop provider, which delivers in the sender's goroutine, a plain
// WRITE has landed when PostSend returns, a deferred one has not; the
// next plain post sends both, and DeferMax waiting packets go on their
// own.
func TestDeferHoldsPackets(t *testing.T) {
	a, b := verbstest.Pair(t, verbstest.Loop(), verbstest.PairConfig{})
	put := func(i int, flags verbs.SendFlags) {
		a.Post(t, verbs.SendWR{Opcode: verbs.OpWrite, Flags: flags | verbs.FlagInline, Inline: []byte{byte(i + 1)},
			RemoteAddr: b.MR.Addr() + uint64(i), RKey: b.MR.RKey()})
	}
	put(0, 0)
	require.Equal(t, byte(1), b.Buf[0], "a plain WRITE lands at post")
	for i := 1; i < 10; i++ {
		put(i, verbs.FlagDefer)
	}
	require.Equal(t, make([]byte, 9), b.Buf[1:10], "deferred WRITEs wait")
	put(10, 0)
	for i := range 11 {
		require.Equal(t, byte(i+1), b.Buf[i], "byte %d after the next plain post", i)
	}
	for i := range verbs.DeferMax {
		put(100+i, verbs.FlagDefer)
	}
	for i := range verbs.DeferMax {
		require.Equal(t, byte(101+i), b.Buf[100+i], "DeferMax packets go without a plain post")
	}
}
