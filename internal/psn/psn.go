// Package psn implements 24-bit packet sequence numbers as InfiniBand and
// RoCE use them: arithmetic modulo 2^24 and comparisons that stay correct
// across wraparound as long as the two values are less than 2^23 apart.
//
// Values are plain integers; the package has no state and is safe for
// concurrent use.
package psn

// Mask keeps the low 24 bits of a PSN.
const Mask = 1<<24 - 1

// half is the comparison horizon: two PSNs further apart than this are
// ambiguous, so windows must stay well below it.
const half = 1 << 23

// Add returns p+n modulo 2^24.
func Add(p uint32, n int) uint32 { return uint32(int64(p)+int64(n)) & Mask }

// Diff returns a-b as a signed distance in (-2^23, 2^23].
func Diff(a, b uint32) int32 {
	d := (a - b) & Mask
	if d > half {
		return int32(d) - 1<<24
	}
	return int32(d)
}

// Less reports whether a comes before b.
func Less(a, b uint32) bool { return Diff(a, b) < 0 }

// LessEq reports whether a comes before b or equals it.
func LessEq(a, b uint32) bool { return Diff(a, b) <= 0 }

// InRange reports whether p lies in [lo, hi) in sequence space.
func InRange(p, lo, hi uint32) bool { return !Less(p, lo) && Less(p, hi) }
