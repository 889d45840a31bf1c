package verbs_test

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

// A write list places every run where it says, on every provider; a list
// with one run out of bounds places none and fails as a WRITE out of
// bounds does; a list that is not inline, too long or on UC is refused at
// the post.
func TestWriteList(t *testing.T) {
	for _, env := range []verbstest.Env{verbstest.Loop(), verbstest.UDP(), verbstest.SHM(), verbstest.SHMAlloc()} {
		t.Run(env.Name(), func(t *testing.T) {
			a, b := verbstest.Pair(t, env, verbstest.PairConfig{})
			base := b.MR.Addr()
			var list []byte
			list = verbs.AppendWriteList(list, base+3, []byte("abc"))
			list = verbs.AppendWriteList(list, base+100, bytes.Repeat([]byte{7}, 300))
			list = verbs.AppendWriteList(list, base+1000, nil)
			list = verbs.AppendWriteList(list, base+8, []byte("z"))
			a.Post(t, verbs.SendWR{ID: 1, Opcode: verbs.OpWriteList, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: list, RKey: b.MR.RKey()})
			wc := a.Wait(t)
			require.Equal(t, verbs.StatusSuccess, wc.Status)
			require.Equal(t, verbs.WCWrite, wc.Opcode)
			require.Equal(t, "abc", string(b.Buf[3:6]))
			require.Equal(t, bytes.Repeat([]byte{7}, 300), b.Buf[100:400])
			require.Equal(t, byte('z'), b.Buf[8])
			require.Zero(t, b.Buf[0])
			require.Zero(t, b.Buf[99])

			// One run past the end: nothing of the list lands.
			bad := verbs.AppendWriteList(nil, base+20, []byte("xx"))
			bad = verbs.AppendWriteList(bad, base+uint64(len(b.Buf))-1, []byte("yy"))
			a.Post(t, verbs.SendWR{ID: 2, Opcode: verbs.OpWriteList, Flags: verbs.FlagSignaled | verbs.FlagInline, Inline: bad, RKey: b.MR.RKey()})
			wc = a.Wait(t)
			require.Equal(t, verbs.StatusRemoteAccessError, wc.Status)
			require.Zero(t, b.Buf[20], "a refused list places nothing")

			_, err := a.QP.PostSend([]verbs.SendWR{{Opcode: verbs.OpWriteList, Inline: list, RKey: b.MR.RKey()}})
			require.ErrorIs(t, err, verbs.ErrInvalidWR, "not inline")
			long := verbs.AppendWriteList(nil, base, make([]byte, 1<<16-1))
			_, err = a.QP.PostSend([]verbs.SendWR{{Opcode: verbs.OpWriteList, Flags: verbs.FlagInline, Inline: long, RKey: b.MR.RKey()}})
			require.ErrorIs(t, err, verbs.ErrInvalidWR, "longer than the MTU")
		})
	}
}
