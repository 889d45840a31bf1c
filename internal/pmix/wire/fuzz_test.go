package wire

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzParseRequest: ParseRequest never panics; a request it accepts
// encodes back to the same request.
func FuzzParseRequest(f *testing.F) {
	commit, _ := AppendCommit(nil, []KV{{Key: "rvma-rendezvous", Value: "10.0.0.1:7000 abc"}})
	fence, _ := AppendFence(nil, []Proc{{Nspace: "42", Rank: RankWildcard}}, []Info{{Key: "pmix.collect", Value: true}})
	get, _ := AppendGet(nil, Proc{Nspace: "42", Rank: 0}, []Info{{Key: "pmix.timeout", Value: uint32(3)}}, "k")
	for _, b := range [][]byte{commit, fence, get, AppendFinalize(nil)} {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		q, err := ParseRequest(b)
		if err != nil {
			return
		}
		var again []byte
		switch q.Cmd {
		case CmdFence:
			again, err = AppendFence(nil, q.Procs, q.Infos)
		case CmdGet:
			if q.Key == "" {
				return // a get without a key: the encoder always writes one
			}
			again, err = AppendGet(nil, q.Proc, q.Infos, q.Key)
		default:
			return // commits and finalizes carry nothing to compare
		}
		if err != nil {
			return // a value type the encoder does not write
		}
		q2, err := ParseRequest(again)
		require.NoError(t, err)
		require.Equal(t, q, q2)
	})
}

// FuzzParseGetReply: ParseGetReply never panics, whatever the server
// sends; the data it reads encodes back to the same data.
func FuzzParseGetReply(f *testing.F) {
	f.Add(unhex(f, openMPIGetReply))
	f.Add(AppendStatus(nil, ErrNotFound))
	b, _ := AppendGetReply(nil, []ProcData{{Proc: Proc{"j", 1}, KVs: []KV{{Key: "a", Value: uint32(1)}, {Key: "b", Value: true}}}})
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		st, data, err := ParseGetReply(b)
		if err != nil || st != Success {
			return
		}
		for _, d := range data {
			if d.Err != nil {
				return
			}
			for _, kv := range d.KVs {
				switch kv.Value.(type) {
				case string, bool, uint32:
				default:
					return // a type the encoder does not write
				}
			}
		}
		again, err := AppendGetReply(nil, data)
		require.NoError(t, err)
		_, data2, err := ParseGetReply(again)
		require.NoError(t, err)
		require.Equal(t, data, data2)
	})
}

// FuzzParseConnect: the connection request's decoders (header, body,
// credential) never panic; a request they accept encodes back to the same
// bytes.
func FuzzParseConnect(f *testing.F) {
	f.Add(AppendConnect(nil, Connect{Sec: "native", Cred: NativeCred(1, 2), Proc: Proc{"42", 3}, Version: "3.2.3",
		Bfrops: "v3", BufType: BufferNonDesc, GDS: "hash"}))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := ParseConnectHeader(b)
		if err != nil || n != len(b)-HeaderLen {
			return
		}
		c, err := ParseConnect(b[HeaderLen:])
		if err != nil {
			return
		}
		ParseNativeCred(c.Cred)
		if len(b[HeaderLen:]) == len(AppendConnect(nil, c))-HeaderLen {
			require.Equal(t, b[HeaderLen:], AppendConnect(nil, c)[HeaderLen:])
		}
	})
}

// FuzzParseHeader: a frame header and a status reply never panic their
// decoders.
func FuzzParseHeader(f *testing.F) {
	f.Add(append(AppendHeader(nil, Header{PIndex: 1, Tag: 100, Len: 8}), AppendStatus(nil, Success)...))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHeader(b, 1<<20)
		if err == nil {
			require.Equal(t, b[:HeaderLen-4], AppendHeader(nil, h)[:HeaderLen-4])
			ParseStatus(b[HeaderLen:])
		}
	})
}
