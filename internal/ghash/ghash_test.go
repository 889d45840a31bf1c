package ghash

import (
	"crypto/aes"
	"crypto/cipher"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// gmac is the reference: the standard library's GCM with nothing to
// encrypt.
func gmac(t testing.TB, key []byte, nonce []byte, aad []byte) []byte {
	b, err := aes.NewCipher(key)
	require.NoError(t, err)
	g, err := cipher.NewGCM(b)
	require.NoError(t, err)
	return g.Seal(nil, nonce, nil, aad)
}

// impls lists the implementations this CPU runs, the generic one first.
func impls() []impl {
	is := []impl{implGeneric}
	if hasAVX2 {
		is = append(is, implAVX2)
	}
	if hasAVX512 {
		is = append(is, implAVX512)
	}
	return is
}

func (i impl) String() string { return [...]string{"generic", "AVX2", "AVX-512"}[i] }

// tag is GMAC over Sum by implementation i.
func tag(t testing.TB, key, nonce, aad []byte, i impl) []byte {
	b, err := aes.NewCipher(key)
	require.NoError(t, err)
	var h, ek, j0, out [16]byte
	b.Encrypt(h[:], h[:])
	New(&h).sum(&out, aad, nil, nil, i)
	copy(j0[:], nonce)
	j0[15] = 1
	b.Encrypt(ek[:], j0[:])
	for i := range out {
		out[i] ^= ek[i]
	}
	return out[:]
}

// Lengths around every boundary of the assembly's rounds: 16 blocks, 4,
// 1, and a partial block.
func TestSumMatchesGCM(t *testing.T) {
	t.Logf("implementations on this CPU: %v", impls())
	r := rand.New(rand.NewPCG(1, 2))
	lengths := []int{0, 1, 15, 16, 17, 31, 32, 48, 63, 64, 65, 80, 127, 128, 200, 255, 256, 257, 271, 272, 319, 320, 511, 512, 513, 1500, 4096, 8192 + 7, 9000}
	for range 40 {
		lengths = append(lengths, r.IntN(20000))
	}
	for _, n := range lengths {
		key := make([]byte, 16)
		nonce := make([]byte, 12)
		aad := make([]byte, n)
		fill(r, key)
		fill(r, nonce)
		fill(r, aad)
		want := gmac(t, key, nonce, aad)
		for _, i := range impls() {
			require.Equal(t, want, tag(t, key, nonce, aad, i), "%v, %d bytes", i, n)
		}
	}
}

// TestSumPartsMatchesSum: every way of cutting the data into three parts,
// around block boundaries and with empty parts, hashes as the whole does,
// in the assembly and the generic code.
func TestSumPartsMatchesSum(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	var h [16]byte
	fill(r, h[:])
	k := New(&h)
	for _, n := range []int{0, 1, 15, 16, 17, 40, 64, 100, 513, 4096 + 36, 61440 + 36} {
		data := make([]byte, n)
		fill(r, data)
		var want [16]byte
		k.Sum(&want, data)
		cuts := []int{0, 1, 4, 12, 15, 16, 17, 28, 31, 32, 33, n / 2, n - 17, n - 16, n - 1, n}
		for range 20 {
			cuts = append(cuts, r.IntN(n+1))
		}
		for _, i := range cuts {
			for _, j := range cuts {
				if i < 0 || j < i || j > n {
					continue
				}
				for _, im := range impls() {
					if im == implGeneric && n > 600 {
						continue // the bit-serial code is slow
					}
					var got [16]byte
					k.sum(&got, data[:i], data[i:j], data[j:], im)
					require.Equal(t, want, got, "%d bytes cut at %d and %d, %v", n, i, j, im)
				}
			}
		}
	}
}

// Keys whose hash subkey has its top bit set or not, and all-ones data,
// take the reduction's every branch.
func TestSumEdgeValues(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 64 {
		key := make([]byte, 16)
		fill(r, key)
		for _, v := range []byte{0x00, 0xff, 0x80, 0x01} {
			aad := make([]byte, 16*37+5)
			for i := range aad {
				aad[i] = v
			}
			nonce := make([]byte, 12)
			for _, i := range impls()[1:] {
				require.Equal(t, gmac(t, key, nonce, aad), tag(t, key, nonce, aad, i), "%v", i)
			}
		}
	}
}

func FuzzSum(f *testing.F) {
	f.Add([]byte("0123456789abcdef"), []byte{}, uint16(0), uint16(0))
	f.Add([]byte("0123456789abcdef"), make([]byte, 300), uint16(12), uint16(290))
	f.Fuzz(func(t *testing.T, key, aad []byte, i, j uint16) {
		if len(key) < 16 {
			return
		}
		key = key[:16]
		nonce := make([]byte, 12)
		want := gmac(t, key, nonce, aad)
		for _, i := range impls()[1:] {
			require.Equal(t, want, tag(t, key, nonce, aad, i), "%v", i)
		}
		// The same data in three parts.
		a, b := min(int(i), len(aad)), min(int(j), len(aad))
		a, b = min(a, b), max(a, b)
		var h, out [16]byte
		c, err := aes.NewCipher(key)
		require.NoError(t, err)
		c.Encrypt(h[:], h[:])
		var whole [16]byte
		New(&h).Sum(&whole, aad)
		New(&h).SumParts(&out, aad[:a], aad[a:b], aad[b:])
		require.Equal(t, whole, out)
	})
}

func fill(r *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

func BenchmarkSum(b *testing.B) {
	for _, n := range []int{64, 1500, 8192, 65536} {
		b.Run(byteSize(n), func(b *testing.B) {
			var h, tag [16]byte
			h[0] = 0x42
			k := New(&h)
			data := make([]byte, n)
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				k.Sum(&tag, data)
			}
		})
	}
}

// BenchmarkGCMSum is the standard library's GMAC beside Sum.
func BenchmarkGCMSum(b *testing.B) {
	for _, n := range []int{64, 1500, 8192, 65536} {
		b.Run(byteSize(n), func(b *testing.B) {
			c, _ := aes.NewCipher(make([]byte, 16))
			g, _ := cipher.NewGCM(c)
			data := make([]byte, n)
			nonce := make([]byte, 12)
			dst := make([]byte, 0, 16)
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				dst = g.Seal(dst[:0], nonce, nil, data)
			}
		})
	}
}

func byteSize(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return strconv.Itoa(n/1024) + "KiB"
	}
	return strconv.Itoa(n) + "B"
}
