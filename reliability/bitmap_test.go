package reliability

import (
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBitmapSemantics(t *testing.T) {
	for _, n := range []int{0, 1, 63, 64, 65, 130, 1000} {
		b := NewBitmap(n)
		require.Equal(t, n, b.Len())
		require.Equal(t, n == 0, b.Full())
		require.Equal(t, 0, b.NextClear(0)%max(n, 1))
		if n == 0 {
			require.False(t, b.Set(0))
			continue
		}
		require.Equal(t, []Range{{0, n}}, b.Gaps(nil))
		require.Empty(t, b.Present(nil))
		ref := make([]bool, n)
		rng := rand.New(rand.NewPCG(uint64(n), 1))
		for k := 0; k < n; k++ {
			i := rng.IntN(n)
			require.Equal(t, !ref[i], b.Set(i), "bit %d", i)
			ref[i] = true
		}
		count := 0
		var gaps, present []Range
		for i := 0; i < n; {
			j := i
			for j < n && ref[j] == ref[i] {
				j++
			}
			if ref[i] {
				present = append(present, Range{i, j})
				count += j - i
			} else {
				gaps = append(gaps, Range{i, j})
			}
			i = j
		}
		require.Equal(t, count, b.Count())
		require.Equal(t, gaps, b.Gaps(nil))
		require.Equal(t, present, b.Present(nil))
		for i := 0; i < n; i++ {
			require.Equal(t, ref[i], b.Test(i))
		}
		require.False(t, b.Set(-1))
		require.False(t, b.Set(n))
		require.False(t, b.Test(n))

		// Slice and Merge round-trip from any offset.
		for _, from := range []int{0, 1, 37, n / 2} {
			words := make([]uint64, (n-from+63)/64)
			b.Slice(from, words)
			c := NewBitmap(n)
			c.Merge(from, words)
			for i := 0; i < n; i++ {
				require.Equal(t, i >= from && ref[i], c.Test(i), "from %d bit %d", from, i)
			}
		}

		b.Reset(n)
		require.Equal(t, 0, b.Count())
		require.Equal(t, []Range{{0, n}}, b.Gaps(nil))
	}
}

func TestBitmapResetReuses(t *testing.T) {
	b := NewBitmap(1000)
	for i := 0; i < 1000; i++ {
		b.Set(i)
	}
	require.True(t, b.Full())
	b.Reset(100)
	require.Equal(t, 100, b.Len())
	require.Equal(t, 0, b.Count())
	require.Equal(t, 0, b.NextClear(0))
	require.Equal(t, 100, b.NextSet(0))
	b.Reset(5000)
	require.Equal(t, 5000, b.NextSet(0))
}

// Many goroutines set overlapping bits: every bit is counted exactly once.
func TestBitmapConcurrentSet(t *testing.T) {
	const n, workers = 10000, 8
	b := NewBitmap(n)
	var wg sync.WaitGroup
	newly := make([]int, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 2))
			for _, i := range rng.Perm(n) {
				if b.Set(i) {
					newly[w]++
				}
			}
		}()
	}
	wg.Wait()
	sum := 0
	for _, v := range newly {
		sum += v
	}
	require.Equal(t, n, sum)
	require.True(t, b.Full())
	require.Empty(t, b.Gaps(nil))
}

func BenchmarkBitmapSet(b *testing.B) {
	bm := NewBitmap(1 << 16)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if i&(1<<16-1) == 0 {
			bm.Reset(1 << 16)
		}
		bm.Set(i & (1<<16 - 1))
	}
}
