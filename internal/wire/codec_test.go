package wire

import (
	"bytes"
	"crypto/cipher"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/ghash"
)

func sample(op Opcode, payload []byte) *Packet {
	return &Packet{Opcode: op, Solicit: true, AckReq: true, Placed: true, DestQP: 0xABCDEF, PSN: 0x123456,
		VA: 0x1122334455667788, RKey: 0xCAFEBABE, DMALen: 70000, Syndrome: SyndromeNAK | NAKRemoteAccess,
		MSN: 0x00BEEF, Imm: 0xDEADBEEF, SwapAdd: 7, Compare: 9, Orig: 11, Mailbox: 0xB0B, Offset: 4096,
		MsgOff: 8192, MsgLen: 12345, Secret: 0x5EC12E7, Payload: payload}
}

// expect keeps only the fields the opcode carries, which is what a decode
// must return.
func expect(p *Packet) Packet {
	o := p.Opcode
	q := Packet{Opcode: o, Solicit: p.Solicit, AckReq: p.AckReq, Placed: p.Placed, DestQP: p.DestQP, PSN: p.PSN}
	if o.HasRETH() || o.HasAtomicETH() {
		q.VA, q.RKey = p.VA, p.RKey
	}
	if o.HasRETH() {
		q.DMALen = p.DMALen
	}
	if o.HasAtomicETH() {
		q.SwapAdd, q.Compare = p.SwapAdd, p.Compare
	}
	if o.HasAETH() {
		q.Syndrome, q.MSN = p.Syndrome, p.MSN
	}
	if o == AtomicAck {
		q.Orig = p.Orig
	}
	if o.IsMailbox() {
		q.Mailbox, q.Offset, q.MsgOff, q.MsgLen = p.Mailbox, p.Offset, p.MsgOff, p.MsgLen
	}
	if o.HasImm() {
		q.Imm = p.Imm
	}
	if o.HasPayload() {
		q.Payload = p.Payload
	}
	return q
}

func allOpcodes() []Opcode {
	var ops []Opcode
	for i := 0; i < 256; i++ {
		if Opcode(i).Valid() {
			ops = append(ops, Opcode(i))
		}
	}
	return ops
}

func TestRoundTrip(t *testing.T) {
	ops := allOpcodes()
	require.Len(t, ops, 21+12+12+1, "21 RC opcodes, 12 UC, 6+6 mailbox, write list")
	for _, op := range ops {
		for _, n := range []int{0, 1, 2, 3, 4, 5, 4096} {
			payload := bytes.Repeat([]byte{0xA5}, n)
			if !op.HasPayload() && n > 0 {
				continue
			}
			p := sample(op, payload)
			b := Append([]byte("prefix"), p)
			require.Equal(t, p.EncodedLen(), len(b)-6, "%v", op)
			require.Zero(t, (len(b)-6)%4, "padded to four bytes")
			var q Packet
			require.NoError(t, Parse(b[6:], &q), "%v %d", op, n)
			require.True(t, q.Verify(p.Secret), "%v: the trailer matches the secret", op)
			require.False(t, q.Verify(p.Secret+1), "%v: and no other", op)
			q.Raw, q.ICRC = nil, 0
			if len(q.Payload) == 0 {
				q.Payload = nil
			}
			want := expect(p)
			if len(want.Payload) == 0 {
				want.Payload = nil
			}
			require.Equal(t, want, q, "%v %d", op, n)
		}
	}
}

// The BTH bytes as IBTA lays them out, checked byte by byte once.
func TestBTHLayout(t *testing.T) {
	p := &Packet{Opcode: WriteOnly, Solicit: true, AckReq: true, DestQP: 0x010203, PSN: 0x0A0B0C, VA: 0x1000, RKey: 0x55, DMALen: 3, Payload: []byte{1, 2, 3}}
	b := Append(nil, p)
	require.Equal(t, []byte{0x0A, 0x80 | 1<<4, 0xFF, 0xFF, 0, 1, 2, 3, 0x80, 0x0A, 0x0B, 0x0C}, b[:12])
	require.Equal(t, []byte{0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0x55, 0, 0, 0, 3}, b[12:28], "RETH")
	require.Equal(t, []byte{1, 2, 3, 0}, b[28:32], "payload and one pad byte")
	require.Len(t, b, 36)
}

func TestParseErrors(t *testing.T) {
	good := Append(nil, sample(WriteFirst, make([]byte, 8)))
	cases := []struct {
		name string
		b    []byte
		err  error
	}{
		{"empty", nil, ErrShort},
		{"BTH only", good[:12], ErrShort},
		{"unknown opcode", append([]byte{0x15}, good[1:]...), ErrOpcode},
		{"transport version", func() []byte { b := bytes.Clone(good); b[1] |= 1; return b }(), ErrVersion},
		{"other partition", func() []byte { b := bytes.Clone(good); b[3] = 0x01; return b }(), ErrPKey},
		{"truncated RETH", good[:20], ErrShort},
		{"ACK with payload", Append(nil, &Packet{Opcode: Acknowledge, Payload: []byte{1, 2, 3, 4}}), ErrPayload},
		{"pad beyond payload", func() []byte {
			b := Append(nil, &Packet{Opcode: SendOnly})
			b[1] |= 3 << 4
			return b
		}(), ErrPad},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var p Packet
			require.True(t, errors.Is(Parse(c.b, &p), c.err))
		})
	}
}

func FuzzParse(f *testing.F) {
	for _, op := range allOpcodes() {
		var payload []byte
		if op.HasPayload() {
			payload = []byte("payload")
		}
		f.Add(Append(nil, sample(op, payload)))
		pm := sample(op, payload)
		pm.Auth = NewMAC(fuzzKey)
		f.Add(Append(nil, pm))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Packet
		if Parse(b, &p) != nil {
			return
		}
		// Whatever parses re-encodes to the same bytes, trailer aside
		// (the secret or key is unknown), except the pad bytes, which
		// Append zeroes.
		p.Secret = 0
		m := NewMAC(fuzzKey)
		if p.HasMAC {
			p.Auth = m
		}
		again := Append(nil, &p)
		require.Len(t, again, len(b))
		n := len(b) - p.trailerLen() - padLen(len(p.Payload))
		// Reserved bits (BTH M bit, byte 4 but the flags, byte 8 below
		// AckReq) are ignored by receivers and sent as zero.
		want := bytes.Clone(b[:n])
		want[1] &^= 0x40
		want[4] &= placedBit | macBit
		want[8] &= 0x80
		require.Equal(t, want, again[:n])
		var q Packet
		require.NoError(t, Parse(again, &q))
		if p.HasMAC {
			require.True(t, q.VerifyMAC(m))
			require.False(t, q.Verify(0), "a MAC packet never passes the checksum")
		} else {
			require.True(t, q.Verify(0))
		}
	})
}

func BenchmarkAppend(b *testing.B) {
	p := sample(WriteMiddle, make([]byte, 4096))
	buf := make([]byte, 0, 8192)
	b.SetBytes(4096)
	b.ReportAllocs()
	for b.Loop() {
		buf = Append(buf[:0], p)
	}
}

func BenchmarkParseVerify(b *testing.B) {
	pk := sample(WriteMiddle, make([]byte, 4096))
	buf := Append(nil, pk)
	var p Packet
	b.SetBytes(4096)
	b.ReportAllocs()
	for b.Loop() {
		if Parse(buf, &p) != nil || !p.Verify(pk.Secret) {
			b.Fatal("bad")
		}
	}
}

func TestUnalignedRejected(t *testing.T) {
	b := Append(nil, &Packet{Opcode: SendOnly, Payload: []byte{1, 2, 3, 4}})
	b = append(b[:len(b)-4], 9, 0, 0, 0, 0) // one byte more: not a whole word
	var p Packet
	require.ErrorIs(t, Parse(b, &p), ErrPad)
}

func TestSecretSeed(t *testing.T) {
	for _, s := range []uint64{0, 1, 0x0123456789ABCDEF, ^uint64(0)} {
		var b [8]byte
		for i := range b {
			b[i] = byte(s >> (8 * i))
		}
		require.Equal(t, crc32.Update(0, castagnoli, b[:]), secretSeed(s))
	}
}

// The trailer pins the headers and the payload length.
func TestTrailerCoverage(t *testing.T) {
	p := sample(WriteOnly, []byte("12345678"))
	b := Append(nil, p)
	for _, c := range []struct {
		name string
		mut  func([]byte) []byte
	}{
		{"header byte", func(b []byte) []byte { b[13] ^= 1; return b }},
		{"PSN", func(b []byte) []byte { b[11] ^= 1; return b }},
		{"length", func(b []byte) []byte { // four payload bytes fewer, same trailer
			n := len(b)
			return append(b[:n-8], b[n-4:]...)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			var q Packet
			require.NoError(t, Parse(c.mut(bytes.Clone(b)), &q))
			require.False(t, q.Verify(p.Secret))
		})
	}
}

var fuzzKey = [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}

// A MAC covers every byte before the tag: changing any one, or the key,
// fails it; so does a packet under the checksum or with its counter
// swapped.
func TestMAC(t *testing.T) {
	m := NewMAC(fuzzKey)
	for _, op := range allOpcodes() {
		var payload []byte
		if op.HasPayload() {
			payload = []byte("a payload of some length")
		}
		p := sample(op, payload)
		p.Auth = m
		b := Append(nil, p)
		require.Len(t, b, p.EncodedLen())
		var q Packet
		require.NoError(t, Parse(b, &q), op)
		require.True(t, q.HasMAC)
		require.True(t, q.VerifyMAC(m), op)
		require.Equal(t, string(payload), string(q.Payload))
		require.False(t, q.VerifyMAC(NewMAC([16]byte{})), "another key")
		for i := range b {
			if i == 4 {
				continue // the flags byte: flipping it changes the format
			}
			c := bytes.Clone(b)
			c[i] ^= 0x20
			var r Packet
			if Parse(c, &r) != nil {
				continue
			}
			require.False(t, r.VerifyMAC(m), "%v: byte %d changed and still verified", op, i)
		}
	}
	// Counters only grow, so two packets never share a nonce.
	p := sample(SendOnly, []byte("x"))
	p.Auth = m
	var a, b Packet
	require.NoError(t, Parse(Append(nil, p), &a))
	require.NoError(t, Parse(Append(nil, p), &b))
	require.Less(t, a.Seq, b.Seq)
}

func TestReplayWindow(t *testing.T) {
	var w ReplayWindow
	require.False(t, w.Accept(0))
	require.True(t, w.Accept(1))
	require.False(t, w.Accept(1), "replay")
	require.True(t, w.Accept(3))
	require.True(t, w.Accept(2), "late but new")
	require.False(t, w.Accept(2))
	require.True(t, w.Accept(5000))
	require.False(t, w.Accept(3), "older than the window")
	require.True(t, w.Accept(5000-ReplayWindowSize+100), "inside the window")
	require.False(t, w.Accept(5000-ReplayWindowSize+100))
	// A jump far ahead forgets everything behind it.
	require.True(t, w.Accept(1_000_000))
	require.True(t, w.Accept(1_000_000-64))
	require.False(t, w.Accept(5000))
	// Exhaustive against a set, with random reordering.
	var v ReplayWindow
	seen := map[uint64]bool{}
	rng := rand.New(rand.NewPCG(1, 2))
	top := uint64(0)
	for range 100000 {
		s := top + uint64(rng.IntN(64)) - uint64(min(top, uint64(rng.IntN(3000))))
		if s == 0 {
			continue
		}
		got := v.Accept(s)
		if seen[s] {
			require.False(t, got, "counter %d accepted twice", s)
		} else if top < ReplayWindowSize-64 || s > top-(ReplayWindowSize-64) {
			require.True(t, got, "new counter %d refused (top %d)", s, top)
		}
		if got {
			seen[s] = true
			top = max(top, s)
		}
	}
}

// Sealing and checking a MAC allocate nothing: the UDP provider does both
// per packet (the nonce once escaped to the heap through the AEAD).
func TestMACAllocatesNothing(t *testing.T) {
	m := NewMAC(fuzzKey)
	p := sample(WriteOnly, []byte("eight by"))
	p.Auth = m
	buf := make([]byte, 0, 256)
	var q Packet
	allocs := testing.AllocsPerRun(100, func() {
		b := Append(buf[:0], p)
		if Parse(b, &q) != nil || !q.VerifyMAC(m) {
			t.Fatal("the packet did not verify")
		}
	})
	require.Zero(t, allocs)
}

// The MAC's two ways of hashing, internal/ghash's assembly and the
// standard library's GCM, give the same tags: a packet sealed by either
// verifies under the other, and payloads of every length around the
// assembly's 16-, 64- and 256-byte rounds are covered.
func TestMACPathsAgree(t *testing.T) {
	if !ghash.Available {
		t.Skip("this CPU has no AVX-512 carry-less multiply: one path only")
	}
	key := [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	fast := NewMAC(key)
	require.NotNil(t, fast.hash)
	slow := NewMAC(key)
	g, err := cipher.NewGCM(slow.block)
	require.NoError(t, err)
	slow.hash, slow.aead = nil, g
	rng := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{0, 1, 15, 16, 17, 63, 64, 200, 255, 256, 257, 1000, 4096, 8900} {
		payload := make([]byte, n)
		for i := range payload {
			payload[i] = byte(rng.Uint32())
		}
		for _, pair := range [][2]*MAC{{fast, slow}, {slow, fast}} {
			p := sample(WriteOnly, payload)
			p.Auth = pair[0]
			var q Packet
			require.NoError(t, Parse(Append(nil, p), &q))
			require.True(t, q.VerifyMAC(pair[1]), "%d bytes", n)
			if n > 0 {
				b := Append(nil, p)
				b[len(b)-TagLen-9] ^= 1 // the payload's last byte
				require.NoError(t, Parse(b, &q))
				require.False(t, q.VerifyMAC(pair[1]), "%d bytes, changed", n)
			}
		}
	}
}

// TestAppendSplit: a packet appended with its payload left in place, put
// together as the socket gathers it (headers, payload, rest), is byte for
// byte the packet Append makes, under the checksum and under a MAC (two
// MACs of one key count alike); a MAC that cannot hash pieces appends the
// packet whole.
func TestAppendSplit(t *testing.T) {
	slowMAC := func() *MAC {
		m := NewMAC(fuzzKey)
		if m.hash != nil {
			g, err := cipher.NewGCM(m.block)
			require.NoError(t, err)
			m.hash, m.aead = nil, g
		}
		return m
	}
	for _, mode := range []string{"checksum", "mac", "mac without the hash's assembly"} {
		var whole, split *MAC
		switch mode {
		case "mac":
			whole, split = NewMAC(fuzzKey), NewMAC(fuzzKey)
		case "mac without the hash's assembly":
			whole, split = slowMAC(), slowMAC()
		}
		for _, op := range allOpcodes() {
			for _, n := range []int{0, 1, 3, 4, 15, 17, 4096, 61440} {
				if !op.HasPayload() && n > 0 {
					continue
				}
				payload := make([]byte, n)
				for i := range payload {
					payload[i] = byte(i*7 + n)
				}
				p := sample(op, payload)
				p.Auth = whole
				want := Append(nil, p)
				p.Auth = split
				b, at := AppendSplit([]byte("prefix"), p)
				got := b[6:]
				if at >= 0 {
					require.False(t, split != nil && split.hash == nil, "%s: split although the MAC hashes whole only", mode)
					got = append(append(append([]byte(nil), b[6:at]...), payload...), b[at:]...)
				} else {
					require.True(t, split != nil && split.hash == nil, "%s: not split", mode)
				}
				require.Equal(t, want, got, "%s %v %d", mode, op, n)
				require.Len(t, got, p.EncodedLen())
			}
		}
	}
}
