package rma

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDynamic: ranks attach memory to a dynamic window after creating it,
// exchange its addresses, and put, get, accumulate, fetch-and-op and
// compare-and-swap into their neighbours' at those addresses, values
// checked by the owners; an address not attached is refused, and after a
// detach and a new attach the origins reach the new memory.
func TestDynamic(t *testing.T) {
	for _, provider := range []string{"loop", "shm"} {
		t.Run(provider, func(t *testing.T) {
			const n = 3
			comms := newWorld(t, n, &Config{Provider: provider})
			each(t, comms, func(ctx context.Context, c *Comm) error { return dynamicRank(ctx, c, n) })
		})
	}
}

// addrs gathers every rank's address of b.
func addrs(ctx context.Context, c *Comm, b []byte) ([]int, error) {
	all, err := c.Allgather(ctx, u64(uint64(Address(b))))
	if err != nil {
		return nil, err
	}
	out := make([]int, len(all))
	for r, a := range all {
		out[r] = int(binary.LittleEndian.Uint64(a))
	}
	return out, nil
}

func dynamicRank(ctx context.Context, c *Comm, n int) error {
	me, next, prev := c.Rank(), (c.Rank()+1)%n, (c.Rank()+n-1)%n
	d, err := c.CreateDynamic(ctx)
	if err != nil {
		return err
	}
	a, b := make([]byte, 64), make([]byte, 64)
	for i := range b {
		b[i] = byte(me*10 + i)
	}
	if err := d.Attach(a); err != nil {
		return err
	}
	if err := d.Attach(b); err != nil {
		return err
	}
	if err := d.Attach(a[8:16]); !errors.Is(err, ErrAttach) {
		return fmt.Errorf("overlapping attach: %v", err)
	}
	as, err := addrs(ctx, c, a)
	if err != nil {
		return err
	}
	bs, err := addrs(ctx, c, b)
	if err != nil {
		return err
	}
	w := d.Win()
	if err := w.Fence(ctx, 0); err != nil {
		return err
	}
	got := make([]byte, 16)
	old, res := make([]byte, 8), make([]byte, 8)
	old32, res32 := make([]byte, 4), make([]byte, 4)
	for _, step := range []func() error{
		func() error { return d.Put(ctx, []byte("dynamic!"), next, as[next]+8) },
		func() error { return d.Put(ctx, []byte("self"), me, as[me]+48) },
		func() error { return d.Get(ctx, got, prev, bs[prev]+4) },
		func() error { return d.Accumulate(ctx, u64(5), Int64, Sum, next, as[next]+16) },
		func() error { return d.FetchAndOp(ctx, u64(7), old, Int64, Sum, next, as[next]+16) },
		func() error { return d.CompareAndSwap(ctx, u64(99), u64(0), res, Uint64, next, as[next]+24) },
		// 4-byte elements and Max are the target's to apply
		func() error {
			return d.CompareAndSwap(ctx, []byte{9, 0, 0, 0}, make([]byte, 4), res32, Int32, next, as[next]+40)
		},
		func() error { return d.FetchAndOp(ctx, []byte{5, 0, 0, 0}, old32, Int32, Max, next, as[next]+44) },
		func() error {
			return d.PutLayout(ctx, []byte{1, 2, 3, 4}, Layout{}, next, as[next]+32, Layout{Count: 2, Block: 2, Stride: 4})
		},
	} {
		if err := step(); err != nil {
			return err
		}
		// Accumulates are ordered; the fetch sees the sum before it only
		// once that one completed, which a flush ensures.
		if err := w.FlushAll(ctx); err != nil {
			return err
		}
	}
	if err := d.Put(ctx, u64(1), next, bs[next]+60); !errors.Is(err, ErrOutOfBounds) {
		return fmt.Errorf("a put past the region: %v", err)
	}
	if err := w.Fence(ctx, 0); err != nil {
		return err
	}
	for i := range got {
		if got[i] != byte(prev*10+4+i) {
			return fmt.Errorf("get: % x", got)
		}
	}
	le := binary.LittleEndian
	switch {
	case string(a[48:52]) != "self":
		return fmt.Errorf("put to this rank: %q", a[48:52])
	case string(a[8:16]) != "dynamic!":
		return fmt.Errorf("put: %q", a[8:16])
	case le.Uint64(a[16:]) != 12 || le.Uint64(old) != 5:
		return fmt.Errorf("accumulate, fetch-and-op: %d, fetched %d", le.Uint64(a[16:]), le.Uint64(old))
	case le.Uint64(a[24:]) != 99 || le.Uint64(res) != 0:
		return fmt.Errorf("compare-and-swap: %d, old %d", le.Uint64(a[24:]), le.Uint64(res))
	case le.Uint32(a[40:]) != 9 || le.Uint32(res32) != 0 || le.Uint32(a[44:]) != 5 || le.Uint32(old32) != 0:
		return fmt.Errorf("4-byte compare-and-swap, max: %d (old %d), %d (old %d)", le.Uint32(a[40:]), le.Uint32(res32),
			le.Uint32(a[44:]), le.Uint32(old32))
	case string(a[32:40]) != "\x01\x02\x00\x00\x03\x04\x00\x00":
		return fmt.Errorf("strided put: % x", a[32:40])
	}

	// Detach b (its origins forget it), attach c: the new memory is
	// reached, the old address no more.
	if err := d.Detach(ctx, Address(b)); err != nil {
		return err
	}
	if err := d.Detach(ctx, Address(b)); !errors.Is(err, ErrAttach) {
		return fmt.Errorf("a second detach: %v", err)
	}
	cm := make([]byte, 32)
	if err := d.Attach(cm); err != nil {
		return err
	}
	cs, err := addrs(ctx, c, cm)
	if err != nil {
		return err
	}
	if err := w.Fence(ctx, 0); err != nil {
		return err
	}
	if err := d.Put(ctx, []byte("again"), next, cs[next]); err != nil {
		return err
	}
	if err := d.Get(ctx, got[:4], prev, bs[prev]); !errors.Is(err, ErrOutOfBounds) {
		return fmt.Errorf("a get from a detached region: %v", err)
	}
	if err := w.Fence(ctx, 0); err != nil {
		return err
	}
	if string(cm[:5]) != "again" {
		return fmt.Errorf("put into new memory: %q", cm[:5])
	}
	return d.Free(ctx)
}

// TestDynamicAcrossRegions: an access may span regions attached next to
// each other (MPI's window is the attached memory, not one region): puts,
// gets (contiguous and strided), accumulates and get-accumulates across
// the boundary move and apply every element once. An element split by
// the boundary, or a byte that is not attached, fails the whole access
// with ErrOutOfBounds and changes nothing.
func TestDynamicAcrossRegions(t *testing.T) {
	for _, provider := range []string{"loop", "shm", "udp"} {
		t.Run(provider, func(t *testing.T) {
			comms := newWorld(t, 2, &Config{Provider: provider})
			const half = 4096
			mem := make([]byte, 2*half+64) // [0,half) and [half,2*half) attached; the rest not
			each(t, comms, func(ctx context.Context, c *Comm) error {
				d, err := c.CreateDynamic(ctx)
				if err != nil {
					return err
				}
				if c.Rank() == 1 {
					if err := d.Attach(mem[:half]); err != nil {
						return err
					}
					if err := d.Attach(mem[half : 2*half]); err != nil {
						return err
					}
				}
				base, err := addrs(ctx, c, mem)
				if err != nil {
					return err
				}
				w := d.Win()
				if err := w.Fence(ctx, 0); err != nil {
					return err
				}
				if c.Rank() == 0 {
					at := base[1] + half - 1000
					data := make([]byte, 3000)
					for i := range data {
						data[i] = byte(i%251 + 1)
					}
					if err := d.Put(ctx, data, 1, at); err != nil {
						return fmt.Errorf("put across: %w", err)
					}
					if err := w.Flush(ctx, 1); err != nil {
						return err
					}
					got := make([]byte, 3000)
					if err := d.Get(ctx, got, 1, at); err != nil {
						return fmt.Errorf("get across: %w", err)
					}
					// Every 10th byte of the same span, strided.
					strided := make([]byte, 300)
					if _, err := d.RgetLayout(ctx, strided, Layout{}, 1, at, Layout{Count: 300, Block: 1, Stride: 10}); err != nil {
						return fmt.Errorf("strided get across: %w", err)
					}
					if err := w.Flush(ctx, 1); err != nil {
						return err
					}
					if !bytes.Equal(data, got) {
						return fmt.Errorf("get across: wrong bytes")
					}
					for i := range strided {
						if strided[i] != data[10*i] {
							return fmt.Errorf("strided get across: byte %d is %d, want %d", i, strided[i], data[10*i])
						}
					}
					// 8-byte elements: the boundary falls between two.
					ones := make([]byte, 8*64)
					for i := range 64 {
						binary.LittleEndian.PutUint64(ones[8*i:], uint64(i+1))
					}
					acc := base[1] + half - 8*32
					if err := d.Accumulate(ctx, ones, Int64, Sum, 1, acc); err != nil {
						return fmt.Errorf("accumulate across: %w", err)
					}
					old := make([]byte, len(ones))
					if err := d.GetAccumulate(ctx, ones, old, Int64, Sum, 1, acc); err != nil {
						return fmt.Errorf("get-accumulate across: %w", err)
					}
					if err := w.Flush(ctx, 1); err != nil {
						return err
					}
					for i := range 64 {
						want := binary.LittleEndian.Uint64(data[1000-8*32+8*i:]) + uint64(i+1)
						if v := binary.LittleEndian.Uint64(old[8*i:]); v != want {
							return fmt.Errorf("get-accumulate across: element %d was %d, want %d", i, v, want)
						}
					}
					// The boundary inside an element, and a byte past
					// what is attached.
					if err := d.Accumulate(ctx, ones[:16], Int64, Sum, 1, base[1]+half-4); !errors.Is(err, ErrOutOfBounds) {
						if err == nil {
							err = w.Flush(ctx, 1)
						}
						if !errors.Is(err, ErrOutOfBounds) {
							return fmt.Errorf("accumulate splitting an element: %v", err)
						}
					}
					if err := d.Put(ctx, data[:100], 1, base[1]+2*half-50); !errors.Is(err, ErrOutOfBounds) {
						return fmt.Errorf("put past the attached memory: %v", err)
					}
				}
				return w.Fence(ctx, 0)
			})
			at := half - 1000
			for i := range 3000 {
				if i >= 1000-8*32 && i < 1000+8*32 {
					continue // the accumulated elements, below
				}
				require.Equal(t, byte(i%251+1), mem[at+i], "byte %d", i)
			}
			for i := range 64 {
				off := half - 8*32 + 8*i
				b := make([]byte, 8)
				for j := range b {
					b[j] = byte((off-at+j)%251 + 1)
				}
				require.Equal(t, binary.LittleEndian.Uint64(b)+2*uint64(i+1), binary.LittleEndian.Uint64(mem[off:]), "element %d", i)
			}
			require.Equal(t, make([]byte, 64), mem[2*half:], "nothing written past the attached memory")
		})
	}
}
