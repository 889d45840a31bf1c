package sdrwire

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRoundTrip(t *testing.T) {
	for _, m := range []Message{
		{Type: TypePing, Stamp: 123456789},
		{Type: TypePong, Stamp: -5},
		{Type: TypeQuery, Seq: 1<<63 + 7},
		{Type: TypeStatus, Seq: 9, Floor: 4, Flags: FlagComplete | FlagTaken, Chunk: 4096, K: 32, MaxM: 8, Len: 1 << 30,
			RKey: 0xdeadbeef, Addr: 1 << 40, ParRKey: 7, ParAddr: 1<<40 + 99, ParLen: 12345, Arrived: 4, Decoded: 2,
			Cum: 17, Highest: 1000, Skipped: 9, Window: 1<<33 + 5, Words: []uint64{1, 2, 1 << 63}},
		{Type: TypeProbe, Stamp: 77, Seq: 12, Pad: 700},
		{Type: TypeProbe, Stamp: 1, Seq: 0},
		{Type: TypeEcho, Stamp: -3, Seq: 1 << 40},
		{Type: TypeStatus, Seq: 1},
	} {
		b := Append(nil, &m)
		require.LessOrEqual(t, len(b), MaxLen)
		var got Message
		require.NoError(t, Parse(b, &got))
		require.Equal(t, m.Type, got.Type)
		switch m.Type {
		case TypePing, TypePong:
			require.Equal(t, m.Stamp, got.Stamp)
		case TypeQuery:
			require.Equal(t, m.Seq, got.Seq)
		default:
			require.Equal(t, m, got)
		}
	}
}

func TestMalformed(t *testing.T) {
	ok := Append(nil, &Message{Type: TypeStatus, Words: []uint64{1, 2}})
	for name, b := range map[string][]byte{
		"empty":       nil,
		"version":     {9, TypePing, 0, 0, 0, 0, 0, 0, 0, 0},
		"type":        {version, 77},
		"short ping":  {version, TypePing, 1},
		"long query":  append(Append(nil, &Message{Type: TypeQuery}), 0),
		"short probe": Append(nil, &Message{Type: TypeProbe})[:probeFixed-1],
		"long probe":  append(Append(nil, &Message{Type: TypeProbe, Pad: MaxLen}), 0),
		"long echo":   append(Append(nil, &Message{Type: TypeEcho}), 0),
		"old version": func() []byte { b := Append(nil, &Message{Type: TypePing}); b[0] = 1; return b }(),
		"short":       ok[:statusFixed-1],
		"truncated":   ok[:len(ok)-1],
		"extra":       append(append([]byte(nil), ok...), 0),
		"many words": func() []byte {
			b := append([]byte(nil), ok[:statusFixed]...)
			b[statusFixed-2], b[statusFixed-1] = 0xff, 0xff
			return b
		}(),
	} {
		var m Message
		require.ErrorIs(t, Parse(b, &m), ErrMalformed, name)
	}
}

// A message of another version is refused with an error that names both
// versions, so that mismatched builds say so instead of timing out.
func TestVersionMismatch(t *testing.T) {
	b := Append(nil, &Message{Type: TypeStatus, Seq: 1})
	b[0] = 2
	var m Message
	err := Parse(b, &m)
	require.ErrorIs(t, err, ErrVersion)
	var ve *VersionError
	require.ErrorAs(t, err, &ve)
	require.EqualValues(t, 2, ve.Got)
	require.Contains(t, err.Error(), "version 2, this end 3")
}

func FuzzParse(f *testing.F) {
	f.Add(Append(nil, &Message{Type: TypeStatus, Seq: 3, Words: []uint64{5}}))
	f.Add(Append(nil, &Message{Type: TypePing, Stamp: 1}))
	f.Add(Append(nil, &Message{Type: TypeProbe, Stamp: 1, Seq: 2, Pad: 5}))
	f.Add(Append(nil, &Message{Type: TypeEcho, Stamp: 1, Seq: 2}))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m Message
		if Parse(b, &m) != nil {
			return
		}
		again := Append(nil, &m)
		var m2 Message
		require.NoError(t, Parse(again, &m2))
		require.Equal(t, Append(nil, &m2), again)
	})
}
