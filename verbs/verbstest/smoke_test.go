package verbstest

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
)

func TestSmoke(t *testing.T) {
	a, b := Pair(t, Loop(), PairConfig{})
	copy(a.Buf, bytes.Repeat([]byte("hello rvma "), 100))
	a.Post(t, verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{a.MR.SGE(0, 1100)}, RemoteAddr: b.MR.Addr() + 100, RKey: b.MR.RKey()})
	wc := a.Wait(t)
	require.Equal(t, verbs.StatusSuccess, wc.Status)
	require.Equal(t, a.Buf[:1100], b.Buf[100:1200])

	a.Post(t, verbs.SendWR{ID: 2, Opcode: verbs.OpRead, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{a.MR.SGE(5000, 1100)}, RemoteAddr: b.MR.Addr() + 100, RKey: b.MR.RKey()})
	wc = a.Wait(t)
	require.Equal(t, verbs.StatusSuccess, wc.Status, "%+v", wc)
	require.Equal(t, a.Buf[:1100], a.Buf[5000:6100])

	binary.NativeEndian.PutUint64(b.Buf[64:], 40)
	a.Post(t, verbs.SendWR{ID: 3, Opcode: verbs.OpFetchAdd, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{a.MR.SGE(8, 8)}, RemoteAddr: b.MR.Addr() + 64, RKey: b.MR.RKey(), CompareAdd: 2})
	wc = a.Wait(t)
	require.Equal(t, verbs.StatusSuccess, wc.Status, "%+v", wc)
	require.Equal(t, uint64(40), binary.NativeEndian.Uint64(a.Buf[8:]))
	require.Equal(t, uint64(42), binary.NativeEndian.Uint64(b.Buf[64:]))

	b.PostRecv(t, 77, 30000, 2000)
	a.Post(t, verbs.SendWR{ID: 4, Opcode: verbs.OpSendImm, Flags: verbs.FlagSignaled, Imm: 99,
		SGL: []verbs.SGE{a.MR.SGE(0, 1000)}})
	require.Equal(t, verbs.StatusSuccess, a.Wait(t).Status)
	wc = b.Wait(t)
	require.Equal(t, verbs.WorkCompletion{WRID: 77, Opcode: verbs.WCRecv, Flags: verbs.WCWithImm, Imm: 99,
		ByteLen: 1000, QPN: b.QP.Num(), SrcQP: a.QP.Num()}, wc)
	require.Equal(t, a.Buf[:1000], b.Buf[30000:31000])
}
