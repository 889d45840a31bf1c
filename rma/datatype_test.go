package rma

import (
	"sync"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// Narrow elements: arithmetic wraps and compares as the element's own
// type, and an update through the 4-byte word holding the element keeps
// the word's other bytes, even while other goroutines update them.
func TestNarrowElements(t *testing.T) {
	for _, tc := range []struct {
		dt          Datatype
		op          Op
		old, x, out uint64
	}{
		{Int8, Sum, 127, 1, 0x80},        // 127 + 1 wraps to -128
		{Int8, Min, 0xfb, 3, 0xfb},       // min(-5, 3) = -5
		{Uint8, Min, 0xfb, 3, 3},         // min(251, 3) = 3
		{Int16, Max, 0xfff6, 2, 2},       // max(-10, 2) = 2
		{Uint16, Max, 0xfff6, 2, 0xfff6}, // max(65526, 2)
		{Int16, Prod, 0xfffd, 3, 0xfff7}, // -3 * 3 = -9
		{Uint8, Bxor, 0xf0, 0xff, 0x0f},
	} {
		require.Equal(t, tc.out, combine(tc.op, tc.dt, tc.old, tc.x), "%v %v", tc.dt, tc.op)
	}

	// Every byte of a 16-byte buffer incremented by its own goroutines
	// (and two shorts among them), concurrently: no update is lost.
	buf := make([]uint64, 2)
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), 16)
	const rounds = 2000
	var wg sync.WaitGroup
	for i := range 12 {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range rounds {
					applyAtomic(Sum, Uint8, mem[i:i+1], []byte{1}, nil)
				}
			}()
		}
	}
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				applyAtomic(Sum, Uint16, mem[12:16], []byte{1, 0, 2, 0}, nil)
			}
		}()
	}
	wg.Wait()
	for i := range 12 {
		require.Equal(t, byte(2*rounds%256), mem[i], "byte %d", i)
	}
	require.Equal(t, uint64(2*rounds), loadElem(mem[12:14]))
	require.Equal(t, uint64(4*rounds), loadElem(mem[14:16]))
	// Compare-and-swap on a short swaps only when equal, and keeps its
	// neighbours.
	require.Equal(t, uint64(2*rounds), compareSwap(Uint16, mem[12:14], 2*rounds, 7))
	require.Equal(t, uint64(7), loadElem(mem[12:14]))
	require.Equal(t, uint64(7), compareSwap(Uint16, mem[12:14], 9, 8))
	require.Equal(t, uint64(7), loadElem(mem[12:14]))
	require.Equal(t, uint64(4*rounds), loadElem(mem[14:16]))
}
