package wire

import (
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// unhex reads bytes written as spaced hex, with | between fields for the
// reader.
func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.NewReplacer(" ", "", "|", "", "\n", "", "\t", "").Replace(s))
	require.NoError(t, err)
	return b
}

// A get's reply from Open MPI 4.1's PMIx server (libpmix 4.2) to this
// package's client, captured: rank 0 of namespace 426115073 put
// rvma-test = "hello from 0".
const openMPIGetReply = `00000001 00000000 | 00000001 000f 000000000000003b |
	00000001 0000000a 343236313135303733 00 00000000 |
	00000001 0000000a 72766d612d74657374 00 0003 0000000d 68656c6c6f2066726f6d2030 00`

func TestGetReplyFromOpenMPI(t *testing.T) {
	b := unhex(t, openMPIGetReply)
	st, data, err := ParseGetReply(b)
	require.NoError(t, err)
	require.Equal(t, Success, st)
	want := []ProcData{{Proc: Proc{Nspace: "426115073", Rank: 0}, KVs: []KV{{Key: "rvma-test", Value: "hello from 0"}}}}
	require.Equal(t, want, data)
	// and the fake server's reply is the same bytes
	again, err := AppendGetReply(nil, want)
	require.NoError(t, err)
	require.Equal(t, b, again)
}

func TestHeader(t *testing.T) {
	b := AppendHeader(nil, Header{PIndex: 3, Tag: 101, Len: 9})
	require.Equal(t, unhex(t, "00000003 00000065 00000009 00000000"), b)
	h, err := ParseHeader(b, 100)
	require.NoError(t, err)
	require.Equal(t, Header{PIndex: 3, Tag: 101, Len: 9}, h)
	_, err = ParseHeader(b, 8)
	require.ErrorIs(t, err, ErrMalformed)
	_, err = ParseHeader(b[:15], 100)
	require.ErrorIs(t, err, ErrShort)
}

func TestConnect(t *testing.T) {
	c := Connect{Sec: "native", Cred: NativeCred(1000, 100), Proc: Proc{Nspace: "42", Rank: 7},
		Version: "3.2.3", Bfrops: "v3", BufType: BufferNonDesc, GDS: "hash"}
	b := AppendConnect(nil, c)
	body := unhex(t, `6e617469766500 | 00000008 e8030000 64000000 | 00 | 343200 00000007 |
		332e322e3300 | 763300 | 01 | 6861736800`)
	// the header is in the host's byte order: pindex -1, tag UINT32_MAX, length
	require.Equal(t, append(unhex(t, "ffffffff ffffffff 2a000000 00000000"), body...), b)
	n, err := ParseConnectHeader(b)
	require.NoError(t, err)
	require.Equal(t, len(body), n)
	got, err := ParseConnect(b[HeaderLen:])
	require.NoError(t, err)
	require.Equal(t, c, got)
	uid, gid, err := ParseNativeCred(got.Cred)
	require.NoError(t, err)
	require.Equal(t, [2]uint32{1000, 100}, [2]uint32{uid, gid})

	for i := range body {
		_, err := ParseConnect(body[:i])
		require.Error(t, err, "cut at %d", i)
	}
	tool := append([]byte(nil), body...)
	tool[len("native")+1+4+8] = 3 // a tool asking for an identifier
	_, err = ParseConnect(tool)
	require.ErrorIs(t, err, ErrMalformed)
}

// The requests' bytes, as the C client packs them into an undescribed
// buffer: each item an int32 count then its payload, sizes tagged with
// their width (uint64, type 15).
func TestRequestBytes(t *testing.T) {
	commit, err := AppendCommit(nil, []KV{{Key: "k", Value: "v"}})
	require.NoError(t, err)
	kv := "00000001 00000002 6b00 0003 00000002 7600"
	require.Equal(t, unhex(t, "00000001 02 | 00000001 01 | 00000001 01 000f 0000000000000012 "+kv+
		"| 00000001 02 | 00000001 01 000f 0000000000000012 "+kv), commit)

	fence, err := AppendFence(nil, []Proc{{Nspace: "42", Rank: RankWildcard}}, []Info{{Key: "pmix.collect", Value: true}})
	require.NoError(t, err)
	require.Equal(t, unhex(t, `00000001 03 | 00000001 000f 0000000000000001 | 00000001 00000003 343200 fffffffe |
		00000001 000f 0000000000000001 | 00000001 0000000d 706d69782e636f6c6c65637400 00000000 0001 01`), fence)

	get, err := AppendGet(nil, Proc{Nspace: "42", Rank: 0}, nil, "k")
	require.NoError(t, err)
	require.Equal(t, unhex(t, `00000001 04 | 00000001 00000003 343200 | 00000001 00000000 |
		00000001 000f 0000000000000000 | 00000001 00000002 6b00`), get)

	require.Equal(t, unhex(t, "00000001 05"), AppendFinalize(nil))
	require.Equal(t, unhex(t, "00000001 ffffffd2"), AppendStatus(nil, ErrNotFound))
}

func TestRequestRoundTrip(t *testing.T) {
	commit, _ := AppendCommit(nil, []KV{{Key: "a", Value: "1"}, {Key: "b", Value: uint32(2)}})
	fence, _ := AppendFence(nil, []Proc{{Nspace: "j", Rank: 0}, {Nspace: "j", Rank: 1}}, []Info{{Key: "pmix.collect", Value: true}})
	get, _ := AppendGet(nil, Proc{Nspace: "j", Rank: 3}, []Info{{Key: "pmix.timeout", Value: uint32(5)}}, "key")
	empty, _ := AppendCommit(nil, nil)
	for _, tc := range []struct {
		name string
		b    []byte
		want Request
	}{
		{"commit", commit, Request{Cmd: CmdCommit, Scopes: map[uint8][]KV{
			ScopeLocal: {{Key: "a", Value: "1"}, {Key: "b", Value: uint32(2)}}, ScopeRemote: {{Key: "a", Value: "1"}, {Key: "b", Value: uint32(2)}}}}},
		{"empty commit", empty, Request{Cmd: CmdCommit, Scopes: map[uint8][]KV{}}},
		{"fence", fence, Request{Cmd: CmdFence, Procs: []Proc{{"j", 0}, {"j", 1}}, Infos: []Info{{Key: "pmix.collect", Value: true}}}},
		{"get", get, Request{Cmd: CmdGet, Proc: Proc{"j", 3}, Infos: []Info{{Key: "pmix.timeout", Value: uint32(5)}}, Key: "key"}},
		{"finalize", AppendFinalize(nil), Request{Cmd: CmdFinalize}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseRequest(tc.b)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			// a cut message fails, or is a shorter valid one (a commit
			// of fewer scopes, a get without its key)
			for i := range tc.b {
				if got, err := ParseRequest(tc.b[:i]); err == nil {
					require.NotEqual(t, tc.want, got, "cut at %d", i)
				}
			}
			_, err = ParseRequest(append(tc.b, 0))
			require.Error(t, err, "a byte too many")
		})
	}
	_, err := ParseRequest(unhex(t, "00000001 09"))
	require.ErrorIs(t, err, ErrMalformed)
}

// Values of every type the v3 encoding sends, as a get's reply may carry
// them (the job's data that the server keeps per rank among them).
func TestValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    string
		want any
	}{
		{"undef", "0000", nil},
		{"bool", "0001 01", true},
		{"byte", "0002 7f", uint8(0x7f)},
		{"string", "0003 00000003 686900", "hi"},
		{"null string", "0003 00000000", ""},
		{"size", "0004 000f 0000000000000102", uint64(258)},
		{"pid", "0005 000e 00000063", int64(99)},
		{"int", "0006 0009 fffffffe", int64(-2)},
		{"int8", "0007 ff", int8(-1)},
		{"int16", "0008 fffe", int16(-2)},
		{"int32", "0009 fffffffd", int32(-3)},
		{"int64", "000a fffffffffffffffc", int64(-4)},
		{"uint16", "000d 0102", uint16(0x102)},
		{"uint32", "000e 01020304", uint32(0x01020304)},
		{"uint64", "000f 0000000000000005", uint64(5)},
		{"double", "0011 00000009 312e35303030303000", "1.500000"},
		{"timeval", "0012 0000000000000001 0000000000000002", [2]int64{1, 2}},
		{"status", "0014 ffffffd2", ErrNotFound},
		{"proc", "0016 00000002 6a00 00000004", Proc{"j", 4}},
		{"byte object", "001b 000f 0000000000000002 abcd", []byte{0xab, 0xcd}},
		{"rank", "0028 fffffffe", RankWildcard},
		{"envar", "002e 00000002 4100 00000002 4200 3a", Envar{"A", "B", ':'}},
		{"array of uint16", "0027 000d 000f 0000000000000002 0001 0002", []any{uint16(1), uint16(2)}},
		{"array of info", "0027 0018 000f 0000000000000001 00000002 6b00 00000000 000e 00000007",
			[]any{Info{Key: "k", Value: uint32(7)}}},
		{"empty array", "0027 0018 000f 0000000000000000", []any(nil)},
		{"value in a value", "0015 0003 00000002 7800", "x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := unhex(t, tc.b)
			r := Reader{B: b}
			v := r.Value()
			require.NoError(t, r.Err)
			require.Equal(t, tc.want, v)
			require.Zero(t, r.Len(), "all read")
			for i := range b {
				r := Reader{B: b[:i]}
				r.Value()
				require.Error(t, r.Err, "cut at %d", i)
			}
		})
	}

	r := Reader{B: unhex(t, "0017")} // PMIX_APP: not understood
	r.Value()
	var ut *UnsupportedTypeError
	require.ErrorAs(t, r.Err, &ut)
	require.Equal(t, uint16(23), ut.Type)

	r = Reader{B: unhex(t, "0027 0027 000f 0000000000000001"+strings.Repeat("0027 000f 0000000000000001", 10))}
	r.Value()
	require.ErrorIs(t, r.Err, ErrMalformed, "nested too deep")

	r = Reader{B: unhex(t, "001b 000f 7fffffffffffffff 00")}
	r.Value()
	require.ErrorIs(t, r.Err, ErrShort, "a length beyond the message")
}

// A value the client cannot read ends that process's data only; a key
// before it is still found.
func TestGetReplyUnsupported(t *testing.T) {
	var inner Scratch
	inner.Count(1)
	inner.Proc(Proc{"j", 0})
	inner.Count(1)
	require.NoError(t, inner.KVal(KV{Key: "mine", Value: "yes"}))
	inner.Count(1)
	inner.String("app")
	inner.U16(23) // PMIX_APP
	s := Scratch{B: AppendStatus(nil, Success)}
	s.Count(1)
	s.Size(uint64(len(inner.B)))
	s.B = append(s.B, inner.B...)
	st, data, err := ParseGetReply(s.B)
	require.NoError(t, err)
	require.Equal(t, Success, st)
	require.Len(t, data, 1)
	require.Equal(t, []KV{{Key: "mine", Value: "yes"}}, data[0].KVs)
	var ut *UnsupportedTypeError
	require.True(t, errors.As(data[0].Err, &ut))

	st, data, err = ParseGetReply(AppendStatus(nil, ErrTimeout))
	require.NoError(t, err)
	require.Equal(t, ErrTimeout, st)
	require.Empty(t, data)
}

func TestProcString(t *testing.T) {
	require.Equal(t, "42.3", Proc{"42", 3}.String())
	require.Equal(t, "42.*", Proc{"42", RankWildcard}.String())
}
