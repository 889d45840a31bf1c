package rma

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
)

func TestByteSpan(t *testing.T) {
	for _, tc := range []struct {
		disp, unit, extent int
		size               uint64
		off                int
		ok                 bool
	}{
		{0, 1, 8, 8, 0, true},
		{0, 1, 9, 8, 0, false},
		{1, 8, 8, 16, 8, true},
		{2, 8, 8, 16, 0, false},
		{2, 8, 0, 16, 16, true}, // an empty access at the end
		{3, 8, 0, 16, 0, false},
		{-1, 8, 8, 16, 0, false},
		{1<<61 - 1, 8, 8, 1 << 20, 0, false}, // wrapped to -8 before
		{1 << 61, 8, 8, 1 << 20, 0, false},   // wraps to 0 in 64 bits
		{math.MaxInt, 1, 1, math.MaxUint64, math.MaxInt, true},
		{math.MaxInt, 2, 0, math.MaxUint64, 0, false}, // 2^64-2: no offset of a real window
		{math.MinInt, 1, 8, 16, 0, false},
		{0, 1, -1, 16, 0, false},
		{4, 1 << 32, 8, 1 << 40, 1 << 34, true},
		{1 << 32, 1 << 32, 8, math.MaxUint64, 0, false}, // 2^64
	} {
		off, ok := byteSpan(tc.disp, tc.unit, tc.extent, tc.size)
		require.Equal(t, tc.ok, ok, "%+v", tc)
		if ok {
			require.Equal(t, tc.off, off, "%+v", tc)
		}
	}
}

func TestLayoutChecked(t *testing.T) {
	for _, tc := range []struct {
		l      Layout
		extent int
		ok     bool
	}{
		{Layout{}, 0, true},
		{Layout{Count: 1, Block: 8}, 8, true},
		{Layout{Count: 4, Block: 2, Stride: 8}, 26, true},
		{Layout{Count: 2, Block: 8, Stride: 4}, 0, false}, // overlaps
		{Layout{Count: -1, Block: 8, Stride: 8}, 0, false},
		{Layout{Count: 2, Block: -1, Stride: 8}, 0, false},
		{Layout{Count: math.MaxInt/2 + 2, Block: 2, Stride: 2}, 0, false},
		{Layout{Count: 3, Block: 8, Stride: math.MaxInt / 2}, 0, false},
		{Layout{Count: 2, Block: 1, Stride: math.MaxInt}, 0, false},
		{Layout{Count: 2, Block: 0, Stride: math.MaxInt - 1}, math.MaxInt - 1, true},
		{Layout{Count: 1, Block: math.MaxInt, Stride: -5}, math.MaxInt, true}, // one block: stride unused
	} {
		ext, ok := tc.l.checkedExtent()
		require.Equal(t, tc.ok, ok, "%+v", tc.l)
		if ok {
			require.Equal(t, tc.extent, ext, "%+v", tc.l)
			_, err := tc.l.norm(16)
			require.NoError(t, err)
		} else if tc.l != (Layout{}) {
			_, err := tc.l.norm(16)
			require.ErrorIs(t, err, ErrDatatype, "%+v", tc.l)
		}
	}
}

func TestWinDesc(t *testing.T) {
	rw := remoteWin{addr: 1 << 40, rkey: 7, size: 4096, unit: 8, lockAddr: 1 << 41, lockKey: 9,
		notify: notifyPerOrigin, countOps: true, misalign: 3, depth: 5}
	b := rw.encode(map[int]int{2: 100, 0: 8, 5: 1 << 40})
	for me, want := range map[int]int{0: 8, 2: 100, 5: math.MaxInt32, 1: 0} {
		got, err := decodeWin(b, 4, me)
		require.NoError(t, err)
		exp := rw
		exp.expect = want
		require.Equal(t, exp, got)
	}
	_, err := decodeWin([]byte{descFailed}, 3, 0)
	require.ErrorIs(t, err, ErrRemote)
	var oe *OpError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, 3, oe.Rank)
	for _, bad := range [][]byte{nil, b[:remoteWinLen-1], b[:remoteWinLen+5]} {
		_, err := decodeWin(bad, 1, 0)
		require.ErrorIs(t, err, ErrDatatype)
	}
}

// Window descriptions come from peers: decoding never panics, and what it
// accepts has the published shape.
func FuzzDecodeWin(f *testing.F) {
	f.Add((&remoteWin{size: 64, unit: 1}).encode(nil))
	f.Add((&remoteWin{size: 64, unit: 8, notify: notifyPerOrigin, depth: 2}).encode(map[int]int{0: 8, 1: 16}))
	f.Add([]byte{descFailed})
	f.Fuzz(func(t *testing.T, b []byte) {
		rw, err := decodeWin(b, 1, 0)
		if err != nil {
			require.True(t, errors.Is(err, ErrDatatype) || errors.Is(err, ErrRemote))
			return
		}
		require.Less(t, rw.misalign, uint8(8))
		require.GreaterOrEqual(t, rw.expect, 0)
		require.Equal(t, 0, (len(b)-remoteWinLen)%12)
	})
}

// step follows the mailbox: a put that finds its epoch complete starts the
// next; one that crosses the expectation counts whole into its epoch.
func TestStep(t *testing.T) {
	for _, tc := range []struct {
		epoch           uint64
		acc, units, exp int
		wantE           uint64
		wantA           int
	}{
		{1, 0, 8, 16, 1, 8},
		{1, 8, 8, 16, 1, 16},
		{1, 16, 8, 16, 2, 8},  // the epoch is full: the next one
		{1, 12, 8, 16, 1, 20}, // crosses: counted into epoch 1, which it closes
		{1, 20, 1, 16, 2, 1},
		{3, 1, 1, 1, 4, 1}, // counting puts
	} {
		e, a := step(tc.epoch, tc.acc, tc.units, tc.exp)
		require.Equal(t, tc.wantE, e, "%+v", tc)
		require.Equal(t, tc.wantA, a, "%+v", tc)
	}
	tx := &txState{}
	tx.init(2)
	wrs := make([]verbs.SendWR, 5)
	for i := range wrs {
		wrs[i].Inline = make([]byte, 8)
	}
	ok, e, a := tx.fits(wrs[:4], countBytes, 16) // epochs 1 and 2: posted
	require.True(t, ok)
	require.Equal(t, uint64(2), e)
	require.Equal(t, 16, a)
	ok, _, _ = tx.fits(wrs, countBytes, 16) // the fifth starts epoch 3
	require.False(t, ok)
	ok, e, _ = tx.fits(wrs[:2], countPuts, 1) // counting puts: one epoch each
	require.True(t, ok)
	require.Equal(t, uint64(2), e)
	tx.synced = false
	ok, _, _ = tx.fits(wrs[:1], countBytes, 16)
	require.False(t, ok, "an origin that does not know where it stands posts nothing")
}

// Allgather's messages come from peers: decoding never panics, and what it
// accepts fills exactly the ranks it was asked for, inside the message.
func FuzzDecodeBlocks(f *testing.F) {
	f.Add([]byte{3, 0, 0, 0, 'a', 'b', 'c', 0, 0, 0, 0}, uint8(2))
	f.Add([]byte{255, 255, 255, 255}, uint8(1))
	f.Add([]byte{}, uint8(0))
	f.Fuzz(func(t *testing.T, m []byte, n uint8) {
		ranks := make([]int, n%16)
		for i := range ranks {
			ranks[i] = i
		}
		out := make([][]byte, len(ranks))
		if err := decodeBlocks(m, ranks, out); err != nil {
			require.ErrorIs(t, err, ErrDatatype)
			return
		}
		total := 0
		for _, b := range out {
			require.NotNil(t, b)
			total += 4 + len(b)
		}
		require.Equal(t, len(m), total, "every byte of the message is accounted for")
	})
}
