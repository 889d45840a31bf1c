package rma

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rvma/rvma/verbs"
)

// A plain window of a rank on this host whose memory came from Allocate
// (shm: device memory every rank of the host can map) is reached without
// the NIC: the origin maps the target's window once, and then a put or a
// get is a copy, an accumulate, fetch-and-op or compare-and-swap is a CPU
// atomic on the target's memory (the same atomics the target's progress
// engine and the shm NIC apply, so all three agree), and a flush has
// nothing to wait for but the target's liveness. Every check (epoch,
// layouts, bounds, datatype) has run before; only the movement differs.
//
// MPI orders accumulates from one origin to one target. A CPU atomic
// completes at once, so it only must not overtake an accumulate still in
// flight on the QP (an active message, or a NIC atomic): while one is, the
// origin takes the QP too. Puts and gets carry no such order.

// directPeer is a target's window (or, for the credit words of a
// notified window, an origin's words) mapped into this process.
type directPeer struct {
	mu    sync.Mutex     // serialises the first attempt to map
	state atomic.Uint32  // directUntried, directMapped or directNone
	m     *verbs.Mapping // set before state becomes directMapped
	dirty atomic.Bool    // a put went through m since the last flush
}

const (
	directUntried = iota
	directMapped
	directNone
)

// mapped returns target's window mapped here, mapping it at the first
// call, if accesses through it are right now; nil where it cannot be
// (another host, memory not from Allocate, a notified window, this rank)
// or must not (the target is gone, faults are injected on the port).
func (w *Win) mapped(ctx context.Context, target int) *verbs.Mapping {
	return w.direct[target].open(func() *verbs.Mapping {
		rw := &w.remote[target]
		if rw.notify != 0 || target == w.c.rank || rw.size == 0 {
			return nil
		}
		qp, err := w.c.conn(ctx, target)
		if err != nil {
			return nil
		}
		m, _ := qp.Map(rw.rkey, rw.addr, int(rw.size), verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
		return m
	})
}

// open returns d's mapping, which mapFn makes at the first call (nil: it
// cannot be), if accesses through it are right now.
func (d *directPeer) open(mapFn func() *verbs.Mapping) *verbs.Mapping {
	switch d.state.Load() {
	case directMapped:
		if d.m.Usable() {
			return d.m
		}
		return nil
	case directNone:
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state.Load() == directUntried {
		st := uint32(directNone)
		if m := mapFn(); m != nil {
			d.m, st = m, directMapped
		}
		d.state.Store(st)
	}
	if d.m != nil && d.m.Usable() {
		return d.m
	}
	return nil
}

// creditWord returns this rank's credit word in origin o's memory, mapped
// here (shm), so that a credit is a store; nil where it is not. qp is
// the connection to o.
func (w *Win) creditWord(o int, qp *verbs.QP) *uint64 {
	if w.credMap == nil {
		return nil
	}
	m := w.credMap[o].open(func() *verbs.Mapping {
		rw := &w.remote[o]
		m, _ := qp.Map(rw.credKey, rw.credAddr+uint64(8*w.c.rank), 8, verbs.AccessRemoteWrite)
		return m
	})
	if m == nil {
		return nil
	}
	return (*uint64)(unsafe.Pointer(&m.Bytes()[0]))
}

// directCarrier reaches a peer whose window is mapped here: a put or a
// get is a copy, and the window is there for CPU atomics. While the
// mapping may not be used (the peer is gone, faults are injected on the
// port), the peer is reached through rc.
type directCarrier struct {
	rc *rcCarrier
	d  *directPeer
}

func (c *directCarrier) put(ctx context.Context, x xfer) (*Request, error) {
	if !c.d.m.Usable() {
		return c.rc.put(ctx, x)
	}
	dst := c.d.m.Bytes()[x.off:]
	if x.ol.Contiguous() && x.tl.Contiguous() {
		copy(dst[:x.tl.Size()], x.origin)
	} else {
		segments(x.ol, x.tl, func(s seg) { copy(dst[s.t:s.t+s.n], x.origin[s.o:s.o+s.n]) })
	}
	if !c.d.dirty.Load() {
		c.d.dirty.Store(true)
	}
	return nil, nil
}

func (c *directCarrier) get(ctx context.Context, x xfer) (*Request, error) {
	if !c.d.m.Usable() {
		return c.rc.get(ctx, x)
	}
	src := c.d.m.Bytes()[x.off:]
	if x.ol.Contiguous() && x.tl.Contiguous() {
		copy(x.origin[:x.tl.Size()], src)
	} else {
		segments(x.ol, x.tl, func(s seg) { copy(x.origin[s.o:s.o+s.n], src[s.t:s.t+s.n]) })
	}
	return nil, nil
}

func (c *directCarrier) mem() []byte {
	if !c.d.m.Usable() {
		return nil
	}
	return c.d.m.Bytes()
}

// directAtomic returns the n bytes at byte off of target's window, mapped
// here, for an atomic on elements of sz bytes by this rank's CPU; nil if
// the window is not mapped, the elements are not aligned to their size
// (only the target's engine applies those, under its lock), or an
// accumulate towards target is still in flight on the QP.
func (w *Win) directAtomic(ctx context.Context, target, off, n, sz int) []byte {
	if w.amOut[target].Load() != 0 || w.nicOut[target].Load() != 0 {
		return nil
	}
	mem := w.carrier(ctx, target).mem()
	if mem == nil {
		return nil
	}
	b := mem[off : off+n]
	if uintptr(unsafe.Pointer(&b[0]))%uintptr(sz) != 0 {
		return nil
	}
	return b
}

// directFlushed is a flush's part for what went through the mapping:
// those puts completed when they were made, unless the target is gone,
// which nothing else would tell.
func (w *Win) directFlushed(target int) error {
	if d := &w.direct[target]; d.dirty.Load() {
		d.dirty.Store(false)
		if d.m.PeerGone() {
			return fmt.Errorf("%w: its process is gone", ErrPeer)
		}
	}
	return nil
}
