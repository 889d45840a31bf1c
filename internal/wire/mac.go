package wire

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/subtle"
	"encoding/binary"
	"sync/atomic"

	"github.com/rvma/rvma/internal/ghash"
)

// TagLen is the size of a packet's MAC tag.
const TagLen = 16

// MAC is one direction of a connection's packet authentication: AES-GMAC
// (AES-GCM with nothing to encrypt) under a 128-bit key that the
// receiving QP chose. The hash runs on the CPU's 512- or 256-bit
// carry-less multiplies where it has them (internal/ghash, which also
// hashes a payload where it lies: sealSplit), otherwise in the standard
// library's GCM: covering the payload costs a fraction of what moving it
// does. GCM must never see a nonce
// twice under one key: the nonce is the sender's packet counter, which
// only grows (a retransmission is a new packet), and a key lives for one
// connection (a QP gets a new one when reset). A MAC is safe for
// concurrent use.
type MAC struct {
	block cipher.Block
	hash  *ghash.Key    // nil: aead does it all
	aead  cipher.AEAD   // without ghash's assembly
	next  atomic.Uint64 // the sender's last counter
}

// macScratch is a packet's room for the MAC's nonce and key stream: a
// slice of an array of the MAC's own would escape through the cipher's
// interface, an allocation per packet.
type macScratch [2 * TagLen]byte

// NewMAC returns the MAC for key.
func NewMAC(key [16]byte) *MAC {
	b, err := aes.NewCipher(key[:])
	if err != nil {
		panic(err) // a 16-byte key is always valid
	}
	m := &MAC{block: b}
	if ghash.Available {
		var h [16]byte
		b.Encrypt(h[:], h[:])
		m.hash = ghash.New(&h)
		return m
	}
	if m.aead, err = cipher.NewGCM(b); err != nil {
		panic(err)
	}
	return m
}

// nonce fills s's first 12 bytes with the nonce of counter seq and
// returns them.
func nonce(s *macScratch, seq uint64) []byte {
	*s = macScratch{}
	binary.BigEndian.PutUint64(s[4:], seq)
	return s[:12]
}

// tag writes GMAC's tag of a||b||c under counter seq to t (hash only).
func (m *MAC) tag(t *[TagLen]byte, s *macScratch, seq uint64, a, b, c []byte) {
	nonce(s, seq)
	s[15] = 1 // J0: the nonce, then the block counter 1
	m.block.Encrypt(s[TagLen:], s[:TagLen])
	m.hash.SumParts(t, a, b, c)
	for i := range t {
		t[i] ^= s[TagLen+i]
	}
}

// seal appends the counter and the tag over b[start:] and the counter;
// s is scratch.
func (m *MAC) seal(b []byte, start int, s *macScratch) []byte {
	seq := m.next.Add(1)
	b = binary.BigEndian.AppendUint64(b, seq)
	if m.hash == nil {
		return m.aead.Seal(b, nonce(s, seq), nil, b[start:])
	}
	var t [TagLen]byte
	m.tag(&t, s, seq, b[start:], nil, nil)
	return append(b, t[:]...)
}

// sealSplit is seal for a packet whose payload lies elsewhere, between
// b[start:at] (the headers) and b[at:] (the pad): the tag covers headers,
// payload, pad and counter as seal's does. Hash only (AppendSplit).
func (m *MAC) sealSplit(b []byte, start, at int, payload []byte, s *macScratch) []byte {
	seq := m.next.Add(1)
	b = binary.BigEndian.AppendUint64(b, seq)
	var t [TagLen]byte
	m.tag(&t, s, seq, b[start:at], payload, b[at:])
	return append(b, t[:]...)
}

// VerifyMAC reports whether p carries a valid tag under m. It says
// nothing of replays: the receiver checks p.Seq against its window.
func (p *Packet) VerifyMAC(m *MAC) bool {
	if !p.HasMAC || len(p.Signed) < 8 {
		return false
	}
	full := p.Signed[:len(p.Signed)+TagLen]
	tag := full[len(p.Signed):]
	if m.hash != nil {
		var t [TagLen]byte
		m.tag(&t, &p.scratch, p.Seq, p.Signed, nil, nil)
		return subtle.ConstantTimeCompare(t[:], tag) == 1
	}
	// Open with an empty ciphertext checks the tag only; dst has room so
	// nothing is allocated.
	var dst [0]byte
	_, err := m.aead.Open(dst[:0], nonce(&p.scratch, p.Seq), tag, p.Signed)
	return err == nil
}

// ReplayWindow refuses a packet counter seen before or older than the
// window (RFC 6479's bitmap, as IPsec and WireGuard keep one): packets
// may arrive out of order by up to ReplayWindowSize counters.
type ReplayWindow struct {
	top  uint64 // the highest counter accepted
	bits [ReplayWindowSize / 64]uint64
}

// ReplayWindowSize is how far behind the newest a counter may arrive.
const ReplayWindowSize = 4096

// Accept records seq and reports whether it is new. Counters start at 1.
func (w *ReplayWindow) Accept(seq uint64) bool {
	const words = ReplayWindowSize / 64
	switch {
	case seq == 0:
		return false
	case seq > w.top:
		// Clear the words the window slides past.
		for i, cur, end := 0, w.top/64+1, seq/64; cur <= end && i < words; i, cur = i+1, cur+1 {
			w.bits[cur%words] = 0
		}
		w.top = seq
	case w.top-seq >= ReplayWindowSize-64:
		return false // too old to tell (the oldest word is being reused)
	}
	word, bit := &w.bits[(seq/64)%words], uint64(1)<<(seq%64)
	if *word&bit != 0 {
		return false
	}
	*word |= bit
	return true
}

// Reset forgets every counter.
func (w *ReplayWindow) Reset() { *w = ReplayWindow{} }
