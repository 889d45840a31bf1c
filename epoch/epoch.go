// Package epoch keeps the retained history of a mailbox window: the
// completion records of its last N completed buffers, each with the buffer
// itself, so that an application can look back at what arrived and roll its
// communication state back to the last consistent step after a failure
// (rewind).
//
// A History is not safe for concurrent use: its owner serialises calls
// (a mailbox window holds its own lock around each). Buffers in a History belong to it
// while they are retained: the application may read them, and must not
// write them, until they are evicted (Add returns the evicted record) or
// handed back by Rewind.
package epoch

import (
	"errors"
	"fmt"
)

// Record describes one completed buffer of a window.
type Record struct {
	Epoch  uint64 // the epoch the buffer completed (0 for the first)
	Buffer int    // the buffer's id, as Post returned it
	Bytes  int    // payload bytes placed in the buffer during the epoch
	Ops    int    // writes completed in the buffer during the epoch
	// Partial is set when the epoch was ended by hand (IncEpoch) before
	// its threshold was reached.
	Partial bool
	// Data is the buffer. Appended windows fill Data[:Bytes]; steered
	// windows place bytes at the offsets the initiators named.
	Data []byte
}

// ErrNotRetained is returned by Rewind when the history no longer holds
// the epoch asked for (or never had it).
var ErrNotRetained = errors.New("epoch: not retained")

// History is a bounded ring of records, newest last.
type History struct {
	ring []Record
	n    int // records held
	next int // slot of the next record
}

// New returns a history that keeps the last n records (n >= 1).
func New(n int) *History {
	if n < 1 {
		n = 1
	}
	return &History{ring: make([]Record, n)}
}

// Cap returns how many records the history keeps.
func (h *History) Cap() int { return len(h.ring) }

// Len returns how many records it holds.
func (h *History) Len() int { return h.n }

// Add appends a record; if the history was full it returns the oldest
// record, evicted, whose buffer goes back to the application.
func (h *History) Add(r Record) (evicted Record, ok bool) {
	if h.n == len(h.ring) {
		evicted, ok = h.ring[h.next], true
	} else {
		h.n++
	}
	h.ring[h.next] = r
	h.next = (h.next + 1) % len(h.ring)
	return evicted, ok
}

// At returns the record k epochs back: 1 is the most recent completed
// epoch.
func (h *History) At(k int) (Record, error) {
	if k < 1 || k > h.n {
		return Record{}, fmt.Errorf("%w: %d epochs back, %d retained", ErrNotRetained, k, h.n)
	}
	i := (h.next - k + len(h.ring)) % len(h.ring)
	return h.ring[i], nil
}

// Last returns up to n records, most recent first.
func (h *History) Last(n int) []Record {
	n = min(n, h.n)
	out := make([]Record, 0, n)
	for k := 1; k <= n; k++ {
		r, _ := h.At(k)
		out = append(out, r)
	}
	return out
}

// Rewind drops the k most recent records (k >= 1) and returns the one
// k epochs back: the state to restart from. The dropped records' buffers,
// including the returned one, go back to the application.
func (h *History) Rewind(k int) (Record, []Record, error) {
	r, err := h.At(k)
	if err != nil {
		return Record{}, nil, err
	}
	dropped := h.Last(k)
	h.n -= k
	h.next = (h.next - k + len(h.ring)) % len(h.ring)
	for i := 0; i < k; i++ {
		h.ring[(h.next+i)%len(h.ring)] = Record{}
	}
	return r, dropped, nil
}
