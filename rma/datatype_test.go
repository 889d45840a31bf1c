package rma

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
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

// applyAtomic on runs long enough to be updated a word at a time equals
// the element-by-element definition (combine), for every element type and
// operation, at every alignment of the run, with and without the old
// values, including the elements before and after the whole words.
func TestApplyAtomicWords(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	dts := []Datatype{Int8, Uint8, Int16, Uint16, Int32, Uint32, Float32, Int64, Uint64, Float64}
	ops := []Op{Sum, Prod, Min, Max, Band, Bor, Bxor, Replace, NoOp}
	buf := make([]uint64, 64)
	all := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), 8*len(buf))
	for _, dt := range dts {
		sz := dt.Size()
		for _, op := range ops {
			if check(op, dt, sz) != nil {
				continue
			}
			for start := 0; start < 16; start += sz {
				for _, n := range []int{32, 40, 56 * sz, 200 - 200%sz} {
					for _, wantOld := range []bool{false, true} {
						mem := all[start : start+n]
						for i := range all {
							all[i] = byte(rng.Uint32())
						}
						origin := make([]byte, n)
						for i := range origin {
							origin[i] = byte(rng.Uint32())
						}
						if dt == Float32 || dt == Float64 {
							// finite values, so NaN != NaN does not hide a difference
							for i := 0; i < n; i += sz {
								f := rng.Float64()*200 - 100
								storeFloat(dt, mem[i:], f)
								storeFloat(dt, origin[i:], rng.Float64()*200-100)
							}
						}
						before := append([]byte(nil), all...)
						want := append([]byte(nil), mem...)
						wantPrev := append([]byte(nil), mem...)
						for i := 0; i < n; i += sz {
							storeElem(want[i:i+sz], combine(op, dt, loadElem(want[i:i+sz]), loadElem(origin[i:i+sz])))
						}
						var old []byte
						if wantOld {
							old = make([]byte, n)
						}
						applyAtomic(op, dt, mem, origin, old)
						name := fmt.Sprintf("%v %v at %d, %d bytes", op, dt, start, n)
						require.Equal(t, want, mem, name)
						if wantOld {
							require.Equal(t, wantPrev, old, name+": old values")
						}
						require.Equal(t, before[:start], all[:start], name+": bytes before")
						require.Equal(t, before[start+n:], all[start+n:], name+": bytes after")
					}
				}
			}
		}
	}
}

func storeFloat(dt Datatype, b []byte, f float64) {
	if dt == Float32 {
		binary.LittleEndian.PutUint32(b, math.Float32bits(float32(f)))
		return
	}
	binary.LittleEndian.PutUint64(b, math.Float64bits(f))
}

// Accumulates of whole words and of single elements into the same bytes
// from many goroutines at once: no update is lost.
func TestApplyAtomicWordsConcurrent(t *testing.T) {
	buf := make([]uint64, 8)
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), 64)
	const rounds = 3000
	ones := make([]byte, 60)
	for i := range ones {
		ones[i] = 1
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				applyAtomic(Sum, Uint8, mem[1+g%2:61+g%2], ones[:60], nil) // words and the bytes around them
				applyAtomic(Sum, Uint8, mem[30:31], ones[:1], nil)
			}
		}()
	}
	wg.Wait()
	// Bytes 1..60 got 2 rounds from the goroutines at offset 1, 2..61
	// from those at 2; byte 30 also 4 single sums.
	for i := range 64 {
		want := 0
		if i >= 1 && i < 61 {
			want += 2 * rounds
		}
		if i >= 2 && i < 62 {
			want += 2 * rounds
		}
		if i == 30 {
			want += 4 * rounds
		}
		require.Equal(t, byte(want%256), mem[i], "byte %d", i)
	}
}
