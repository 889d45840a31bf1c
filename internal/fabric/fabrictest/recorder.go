// Package fabrictest has test doubles for the fabric seam.
package fabrictest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rvma/rvma/internal/wire"
)

// Recorder is a fabric.Handler that records the PSN and payload of every
// packet it is given, and whether it was ever called concurrently (which
// the Port contract forbids). It is safe for concurrent use.
type Recorder struct {
	mu       sync.Mutex
	psns     []uint32
	payloads []string
	grew     chan struct{} // closed when packets are recorded; made by WaitCount
	active   atomic.Int32
	overlap  atomic.Bool
	// Delay, if set, is called inside every HandlePackets, to widen the
	// window in which a second call would overlap.
	Delay func()
}

// HandlePackets implements fabric.Handler.
func (r *Recorder) HandlePackets(pkts []*wire.Packet) {
	if r.active.Add(1) > 1 {
		r.overlap.Store(true)
	}
	defer r.active.Add(-1)
	if r.Delay != nil {
		r.Delay()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range pkts {
		r.psns = append(r.psns, p.PSN)
		r.payloads = append(r.payloads, string(p.Payload))
	}
	if r.grew != nil {
		close(r.grew)
		r.grew = nil
	}
}

// WaitCount blocks until at least n packets are recorded, or ctx ends; its
// error then says how many were. Inside a synctest bubble it blocks
// durably, so the bubble's clock moves on while it waits.
func (r *Recorder) WaitCount(ctx context.Context, n int) error {
	for {
		r.mu.Lock()
		got := len(r.psns)
		if got >= n {
			r.mu.Unlock()
			return nil
		}
		if r.grew == nil {
			r.grew = make(chan struct{})
		}
		grew := r.grew
		r.mu.Unlock()
		select {
		case <-grew:
		case <-ctx.Done():
			return fmt.Errorf("fabrictest: %d of %d packets recorded: %w", got, n, ctx.Err())
		}
	}
}

// Count returns the number of packets recorded.
func (r *Recorder) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.psns)
}

// PSNs returns the recorded PSNs in arrival order.
func (r *Recorder) PSNs() []uint32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]uint32(nil), r.psns...)
}

// Payloads returns the recorded payloads in arrival order.
func (r *Recorder) Payloads() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.payloads...)
}

// Overlapped reports whether two calls ever ran at once.
func (r *Recorder) Overlapped() bool { return r.overlap.Load() }
