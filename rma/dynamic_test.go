package rma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
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
