package reliability

import (
	"math/bits"
	"sync/atomic"
)

// Bitmap holds one bit per chunk of a message: set once the chunk has
// arrived whole. Set, Test and Count are safe for concurrent use; Reset is
// not (the owner calls it between messages).
type Bitmap struct {
	words []atomic.Uint64
	n     int
	count atomic.Int64
}

// Range is the half-open chunk interval [Start, End).
type Range struct{ Start, End int }

// NewBitmap returns a cleared bitmap of n bits.
func NewBitmap(n int) *Bitmap {
	b := &Bitmap{}
	b.Reset(n)
	return b
}

// Reset clears the bitmap and resizes it to n bits, reusing its storage
// when it is large enough: clearing costs n/64 stores.
func (b *Bitmap) Reset(n int) {
	w := (n + 63) / 64
	if cap(b.words) >= w {
		b.words = b.words[:w]
		for i := range b.words {
			b.words[i].Store(0)
		}
	} else {
		b.words = make([]atomic.Uint64, w)
	}
	b.n = n
	b.count.Store(0)
}

// Len is the number of bits.
func (b *Bitmap) Len() int { return b.n }

// Set sets bit i and reports whether it was clear: exactly one of several
// concurrent setters of one bit gets true, so counts built on Set never
// count a duplicate. Out-of-range bits are ignored (false).
func (b *Bitmap) Set(i int) bool {
	if uint(i) >= uint(b.n) {
		return false
	}
	m := uint64(1) << (uint(i) & 63)
	if b.words[i>>6].Or(m)&m != 0 {
		return false
	}
	b.count.Add(1)
	return true
}

// Test reports whether bit i is set.
func (b *Bitmap) Test(i int) bool {
	if uint(i) >= uint(b.n) {
		return false
	}
	return b.words[i>>6].Load()&(1<<(uint(i)&63)) != 0
}

// Count is the number of set bits.
func (b *Bitmap) Count() int { return int(b.count.Load()) }

// Full reports whether every bit is set.
func (b *Bitmap) Full() bool { return b.Count() == b.n }

// NextClear returns the first clear bit at or after i, or Len if none.
func (b *Bitmap) NextClear(i int) int {
	for i < b.n {
		w := ^b.words[i>>6].Load() >> (uint(i) & 63)
		if w != 0 {
			i += bits.TrailingZeros64(w)
			return min(i, b.n)
		}
		i = (i | 63) + 1
	}
	return b.n
}

// NextSet returns the first set bit at or after i, or Len if none.
func (b *Bitmap) NextSet(i int) int {
	for i < b.n {
		w := b.words[i>>6].Load() >> (uint(i) & 63)
		if w != 0 {
			return min(i+bits.TrailingZeros64(w), b.n)
		}
		i = (i | 63) + 1
	}
	return b.n
}

// Present appends the maximal ranges of set bits to dst.
func (b *Bitmap) Present(dst []Range) []Range {
	for i := b.NextSet(0); i < b.n; {
		j := b.NextClear(i)
		dst = append(dst, Range{i, j})
		i = b.NextSet(j)
	}
	return dst
}

// Gaps appends the maximal ranges of clear bits to dst.
func (b *Bitmap) Gaps(dst []Range) []Range {
	for i := b.NextClear(0); i < b.n; {
		j := b.NextSet(i)
		dst = append(dst, Range{i, j})
		i = b.NextClear(j)
	}
	return dst
}

// Slice copies the bits [from, from+64·len(dst)) into dst, bit j of word w
// being bit from+64w+j; bits past Len read as clear.
func (b *Bitmap) Slice(from int, dst []uint64) {
	for w := range dst {
		dst[w] = b.word64(from + 64*w)
	}
}

// word64 returns the 64 bits starting at bit i.
func (b *Bitmap) word64(i int) uint64 {
	if i >= b.n || i < 0 {
		return 0
	}
	sh := uint(i) & 63
	v := b.words[i>>6].Load() >> sh
	if sh != 0 && i>>6+1 < len(b.words) {
		v |= b.words[i>>6+1].Load() << (64 - sh)
	}
	if rest := b.n - i; rest < 64 {
		v &= 1<<uint(rest) - 1
	}
	return v
}

// Merge sets every bit that is set in words starting at bit from (the
// inverse of Slice) and returns how many were newly set.
func (b *Bitmap) Merge(from int, words []uint64) int {
	n := 0
	for w, v := range words {
		for v != 0 {
			j := bits.TrailingZeros64(v)
			v &= v - 1
			if b.Set(from + 64*w + j) {
				n++
			}
		}
	}
	return n
}
