package wire

import (
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"sync/atomic"
)

// TagLen is the size of a packet's MAC tag.
const TagLen = 16

// MAC is one direction of a connection's packet authentication: AES-GMAC
// (AES-GCM with nothing to encrypt) under a 128-bit key that the
// receiving QP chose. GMAC runs at memory speed with the CPU's AES and
// carry-less multiply instructions (about 12 GB/s here), so covering the
// payload costs a fraction of what moving it does. GCM must never see a
// nonce twice under one key: the nonce is the sender's packet counter,
// which only grows (a retransmission is a new packet), and a key lives for
// one connection (a QP gets a new one when reset). A MAC is safe for
// concurrent use.
type MAC struct {
	aead cipher.AEAD
	next atomic.Uint64 // the sender's last counter
}

// NewMAC returns the MAC for key.
func NewMAC(key [16]byte) *MAC {
	b, err := aes.NewCipher(key[:])
	if err != nil {
		panic(err) // a 16-byte key is always valid
	}
	g, err := cipher.NewGCM(b)
	if err != nil {
		panic(err)
	}
	return &MAC{aead: g}
}

// nonce fills n with the nonce of counter seq. The caller's array (in the
// packet) keeps the slice given to the AEAD off the heap: an array of its
// own would escape through the interface, an allocation per packet.
func nonce(n *[12]byte, seq uint64) []byte {
	*n = [12]byte{}
	binary.BigEndian.PutUint64(n[4:], seq)
	return n[:]
}

// seal appends the counter and the tag over b[start:] and the counter;
// n is scratch for the nonce.
func (m *MAC) seal(b []byte, start int, n *[12]byte) []byte {
	seq := m.next.Add(1)
	b = binary.BigEndian.AppendUint64(b, seq)
	return m.aead.Seal(b, nonce(n, seq), nil, b[start:])
}

// VerifyMAC reports whether p carries a valid tag under m. It says
// nothing of replays: the receiver checks p.Seq against its window.
func (p *Packet) VerifyMAC(m *MAC) bool {
	if !p.HasMAC || len(p.Signed) < 8 {
		return false
	}
	full := p.Signed[:len(p.Signed)+TagLen]
	tag := full[len(p.Signed):]
	// Open with an empty ciphertext checks the tag only; dst has room so
	// nothing is allocated.
	var dst [0]byte
	_, err := m.aead.Open(dst[:0], nonce(&p.nonce, p.Seq), tag, p.Signed)
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
