package epoch

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func rec(e uint64) Record { return Record{Epoch: e, Buffer: int(e), Bytes: int(e) * 10} }

func TestHistory(t *testing.T) {
	h := New(3)
	_, err := h.At(1)
	require.ErrorIs(t, err, ErrNotRetained)
	for e := uint64(0); e < 3; e++ {
		_, ev := h.Add(rec(e))
		require.False(t, ev)
	}
	ev, ok := h.Add(rec(3))
	require.True(t, ok)
	require.Equal(t, rec(0), ev, "the oldest is evicted")
	require.Equal(t, []Record{rec(3), rec(2), rec(1)}, h.Last(10))
	r, err := h.At(2)
	require.NoError(t, err)
	require.Equal(t, rec(2), r)
	_, err = h.At(4)
	require.ErrorIs(t, err, ErrNotRetained)
	_, err = h.At(0)
	require.ErrorIs(t, err, ErrNotRetained)

	r, dropped, err := h.Rewind(2)
	require.NoError(t, err)
	require.Equal(t, rec(2), r)
	require.Equal(t, []Record{rec(3), rec(2)}, dropped)
	require.Equal(t, []Record{rec(1)}, h.Last(10))
	h.Add(rec(9))
	require.Equal(t, []Record{rec(9), rec(1)}, h.Last(10))
	_, _, err = h.Rewind(3)
	require.ErrorIs(t, err, ErrNotRetained)
}
