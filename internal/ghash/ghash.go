package ghash

import (
	"encoding/binary"
)

// The hash works on blocks byte-reversed into 128-bit integers, so that
// a carry-less multiply of two of them is the product of their
// polynomials (bit-reflected, and one bit short: each key power is stored
// times x to make up for it, as Intel's paper on GCM with PCLMULQDQ
// does). poly is the reduction constant of x^128 + x^7 + x^2 + x + 1 in
// that representation.
const polyHi = 0xc200000000000000

// u128 is a block as a reflected integer.
type u128 struct{ lo, hi uint64 }

func load(b []byte) u128 {
	return u128{lo: binary.BigEndian.Uint64(b[8:]), hi: binary.BigEndian.Uint64(b[:8])}
}

func (v u128) store(b []byte) {
	binary.BigEndian.PutUint64(b[:8], v.hi)
	binary.BigEndian.PutUint64(b[8:], v.lo)
}

// Key is a hash key's powers H^32 ... H^1, each times x, as the
// assembly loads them: four lanes a 512-bit register, lo before hi.
type Key struct {
	powers [32 * 16]byte
	h1     u128 // H times x, for mul
}

// New returns the key for hash subkey h (AES_K(0^128) in GCM).
func New(h *[16]byte) *Key {
	k := &Key{}
	v := load(h[:])
	// times x: shift left one bit; the bit shifted out wraps as poly.
	carry := v.hi >> 63
	v.hi = v.hi<<1 | v.lo>>63
	v.lo <<= 1
	if carry != 0 {
		v.hi ^= polyHi
		v.lo ^= 1
	}
	k.h1 = v
	p := v
	for i := 31; i >= 0; i-- {
		binary.LittleEndian.PutUint64(k.powers[16*i:], p.lo)
		binary.LittleEndian.PutUint64(k.powers[16*i+8:], p.hi)
		p = mul(p, v)
	}
	return k
}

// clmul is the 128-bit carry-less product of a and b.
func clmul(a, b uint64) (lo, hi uint64) {
	for i := range 64 {
		if b>>i&1 != 0 {
			lo ^= a << i
			if i > 0 {
				hi ^= a >> (64 - i)
			}
		}
	}
	return lo, hi
}

// mul multiplies a by h (a key power, times x) and reduces: the
// assembly's arithmetic, one block at a time.
func mul(a, h u128) u128 {
	l0, l1 := clmul(a.lo, h.lo)
	h0, h1 := clmul(a.hi, h.hi)
	m0, m1 := clmul(a.lo, h.hi)
	n0, n1 := clmul(a.hi, h.lo)
	m0, m1 = m0^n0, m1^n1
	t := u128{lo: l0, hi: l1 ^ m0}
	top := u128{lo: h0 ^ m1, hi: h1}
	for range 2 {
		r0, r1 := clmul(t.lo, polyHi)
		t = u128{lo: t.hi ^ r0, hi: t.lo ^ r1}
	}
	return u128{lo: top.lo ^ t.lo, hi: top.hi ^ t.hi}
}

// impl is one of the ways to fold blocks into the state.
type impl uint8

const (
	implGeneric impl = iota // updateGeneric: a bit at a time
	implAVX2                // blocksAVX2
	implAVX512              // blocksAVX512
)

// Update folds data, whole 16-byte blocks, into the hash state x (a
// reflected integer, lo before hi; zero to start). len(data) must be a
// multiple of 16.
func (k *Key) Update(x *[16]byte, data []byte) { k.update(x, data, best) }

// update is Update by implementation i (tests try each the CPU runs).
func (k *Key) update(x *[16]byte, data []byte, i impl) {
	if len(data)%16 != 0 {
		panic("ghash: partial block")
	}
	if len(data) == 0 {
		return
	}
	switch i {
	case implAVX512:
		blocksAVX512(&k.powers, x, &data[0], len(data))
	case implAVX2:
		blocksAVX2(&k.powers, x, &data[0], len(data))
	default:
		k.updateGeneric(x, data)
	}
}

// updateGeneric is Update without the assembly: slow (a bit at a time),
// for tests and for the key's powers.
func (k *Key) updateGeneric(x *[16]byte, data []byte) {
	s := u128{lo: binary.LittleEndian.Uint64(x[:8]), hi: binary.LittleEndian.Uint64(x[8:])}
	for ; len(data) >= 16; data = data[16:] {
		b := load(data)
		s = mul(u128{lo: s.lo ^ b.lo, hi: s.hi ^ b.hi}, k.h1)
	}
	binary.LittleEndian.PutUint64(x[:8], s.lo)
	binary.LittleEndian.PutUint64(x[8:], s.hi)
}

// Sum returns GHASH_H(aad, nothing) in GCM's byte order: the hash of aad,
// zero-padded to a block, then the lengths block. A GMAC tag is it XOR
// AES_K(J0).
func (k *Key) Sum(tag *[16]byte, aad []byte) { k.sum(tag, aad, nil, nil, best) }

// SumParts is Sum of the concatenation a||b||c without joining them: a
// packet's headers, its payload where it lies, and its trailer. Blocks
// that straddle two parts are gathered; the rest is hashed in place.
func (k *Key) SumParts(tag *[16]byte, a, b, c []byte) { k.sum(tag, a, b, c, best) }

// sum is SumParts by implementation i.
func (k *Key) sum(tag *[16]byte, a, b, c []byte, i impl) {
	var x, part [16]byte
	n := 0 // bytes waiting in part
	for _, p := range [3][]byte{a, b, c} {
		if n > 0 {
			m := copy(part[n:], p)
			n += m
			p = p[m:]
			if n < 16 {
				continue
			}
			k.update(&x, part[:], i)
			n = 0
		}
		full := len(p) &^ 15
		k.update(&x, p[:full], i)
		n = copy(part[:], p[full:])
	}
	var last [32]byte
	if n > 0 {
		copy(last[:], part[:n])
		n = 16
	}
	binary.BigEndian.PutUint64(last[n:], uint64(len(a)+len(b)+len(c))*8)
	k.update(&x, last[:n+16], i)
	s := u128{lo: binary.LittleEndian.Uint64(x[:8]), hi: binary.LittleEndian.Uint64(x[8:])}
	s.store(tag[:])
}
