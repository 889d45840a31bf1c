package main

import (
	"sync"
	"sync/atomic"
)

// A handle is what C holds instead of a Go pointer (cgo forbids C keeping
// those): kind in the top byte, so that a window handle passed as a
// request is refused, a generation in the next 24 bits, so that a freed
// handle is refused after its slot is reused, and the slot index plus one
// in the low 32 bits, so that 0 is never valid.
type handle = uint64

// Kinds of handle.
const (
	kindComm    = 1
	kindWin     = 2
	kindRequest = 3
)

// Slots come in chunks, allocated as the table grows and never moved, so
// that lookups are two atomic loads and no lock: every put pays one.
const (
	chunkBits = 10
	chunkSize = 1 << chunkBits
	maxChunks = 1024 // 1M live handles per kind
)

type entry[T any] struct {
	h handle
	v T
}

type chunk[T any] [chunkSize]atomic.Pointer[entry[T]]

// table maps handles of one kind to values. Lookups are lock-free; adding
// and removing take mu.
type table[T any] struct {
	kind   uint64
	chunks [maxChunks]atomic.Pointer[chunk[T]]

	mu   sync.Mutex
	gens []uint32 // per slot: generation of its last handle
	free []uint32 // slots to reuse
}

// add stores v and returns its handle, or false if the table is full.
func (t *table[T]) add(v T) (handle, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var i uint32
	if n := len(t.free); n > 0 {
		i, t.free = t.free[n-1], t.free[:n-1]
	} else {
		if len(t.gens) == maxChunks*chunkSize {
			return 0, false
		}
		i = uint32(len(t.gens))
		t.gens = append(t.gens, 0)
		if i%chunkSize == 0 {
			t.chunks[i>>chunkBits].Store(new(chunk[T]))
		}
	}
	t.gens[i] = (t.gens[i] + 1) & 0xffffff
	h := t.kind<<56 | uint64(t.gens[i])<<32 | uint64(i+1)
	t.chunks[i>>chunkBits].Load()[i%chunkSize].Store(&entry[T]{h: h, v: v})
	return h, true
}

// slot returns h's slot, or nil if h cannot be of this table.
func (t *table[T]) slot(h handle) *atomic.Pointer[entry[T]] {
	i := uint32(h) - 1
	if h>>56 != t.kind || uint32(h) == 0 || i>>chunkBits >= maxChunks {
		return nil
	}
	c := t.chunks[i>>chunkBits].Load()
	if c == nil {
		return nil
	}
	return &c[i%chunkSize]
}

// get returns h's value.
func (t *table[T]) get(h handle) (T, bool) {
	if s := t.slot(h); s != nil {
		if e := s.Load(); e != nil && e.h == h {
			return e.v, true
		}
	}
	var zero T
	return zero, false
}

// remove removes h and returns its value: of several callers removing one
// handle, one gets it.
func (t *table[T]) remove(h handle) (T, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var zero T
	s := t.slot(h)
	if s == nil {
		return zero, false
	}
	e := s.Load()
	if e == nil || e.h != h {
		return zero, false
	}
	s.Store(nil)
	t.free = append(t.free, uint32(h)-1)
	return e.v, true
}

// drain removes every handle and returns their values.
func (t *table[T]) drain() []T {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []T
	for i := range t.gens {
		s := &t.chunks[i>>chunkBits].Load()[i%chunkSize]
		if e := s.Swap(nil); e != nil {
			out = append(out, e.v)
			t.free = append(t.free, uint32(i))
		}
	}
	return out
}
