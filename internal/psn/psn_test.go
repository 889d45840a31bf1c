package psn

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestArithmetic(t *testing.T) {
	cases := []struct {
		name string
		a, b uint32
		diff int32
	}{
		{"equal", 5, 5, 0},
		{"ahead", 10, 3, 7},
		{"behind", 3, 10, -7},
		{"wrap ahead", 2, Mask - 1, 4},
		{"wrap behind", Mask - 1, 2, -4},
		{"horizon", half, 0, half},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.diff, Diff(c.a, c.b))
			require.Equal(t, c.diff < 0, Less(c.a, c.b))
			require.Equal(t, c.diff <= 0, LessEq(c.a, c.b))
		})
	}
	require.Equal(t, uint32(1), Add(Mask, 2))
	require.Equal(t, uint32(Mask), Add(0, -1))
	require.True(t, InRange(Mask, Mask-1, 3))
	require.True(t, InRange(0, Mask-1, 3))
	require.False(t, InRange(3, Mask-1, 3))
}

func FuzzDiff(f *testing.F) {
	f.Add(uint32(0), int32(5))
	f.Add(uint32(Mask), int32(-100))
	f.Fuzz(func(t *testing.T, p uint32, n int32) {
		p &= Mask
		n %= half
		q := Add(p, int(n))
		require.Equal(t, n, Diff(q, p))
		require.Equal(t, p, Add(q, -int(n)))
	})
}
