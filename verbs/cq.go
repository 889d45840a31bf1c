package verbs

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rvma/rvma/internal/spin"
)

// CQConfig configures CreateCQ. The zero value means defaults.
type CQConfig struct {
	// Capacity is the number of completions the CQ holds. A completion that
	// finds it full overruns it (see ErrCQOverrun). Default 4096, range
	// 1..1<<20.
	Capacity int
	// Spin is how long Wait polls (driving the device's progress) before it
	// blocks, which saves a wake-up when completions arrive within
	// microseconds. Default 20µs; a negative value disables spinning.
	Spin time.Duration
}

// CQ is a completion queue. Completions are flat values copied into the
// caller's slice by Poll, so polling allocates nothing.
//
// A CQ is safe for concurrent use; completions are delivered in the order
// the engine produced them.
type CQ struct {
	// Immutable after CreateCQ: read without a lock.
	dev    *Device
	spin   time.Duration
	notify chan struct{} // a completion (or an overrun) for a waiter
	done   chan struct{} // closed by close

	// mu guards the fields below. The engine pushes completions with a
	// QP's mu held, so mu nests inside QP.mu (and inside Device.mu, in
	// Device.Close), and nothing under it calls out of the CQ: push
	// wakes a waiter through notify and returns.
	mu      sync.Mutex
	ring    []WorkCompletion // the slots from head, count of them, are stored completions
	head    int
	overrun bool
	closed  bool
	qps     int // QPs that complete into this CQ

	// Atomics. count mirrors the number of stored completions: written
	// under mu, read without it by the fast paths of Poll, Len and Wait
	// (which take mu before touching ring). waiters counts goroutines
	// blocked in Wait, so that push skips the wake-up when there are none.
	// woken says Wake was called and no Wait has returned for it yet.
	count   atomic.Int32
	waiters atomic.Int32
	woken   atomic.Bool
}

// CreateCQ creates a completion queue.
func (d *Device) CreateCQ(cfg CQConfig) (*CQ, error) {
	if d.closed.Load() {
		return nil, ErrClosed
	}
	if cfg.Capacity == 0 {
		cfg.Capacity = 4096
	}
	if cfg.Capacity < 1 || cfg.Capacity > 1<<20 {
		return nil, fmt.Errorf("verbs: create CQ: %w: capacity %d", ErrInvalidArgument, cfg.Capacity)
	}
	switch {
	case cfg.Spin == 0:
		cfg.Spin = spin.Or(20 * time.Microsecond)
	case cfg.Spin < 0:
		cfg.Spin = 0
	}
	cq := &CQ{dev: d, spin: cfg.Spin, ring: make([]WorkCompletion, 0, cfg.Capacity),
		notify: make(chan struct{}, 1), done: make(chan struct{})}
	cq.ring = cq.ring[:cfg.Capacity]
	d.mu.Lock()
	d.cqs[cq] = struct{}{}
	d.mu.Unlock()
	return cq, nil
}

// push stores a completion; false if the CQ was full (it is then in the
// overrun state) or closed.
func (cq *CQ) push(wc WorkCompletion) bool {
	cq.mu.Lock()
	n := int(cq.count.Load())
	if cq.closed || cq.overrun || n == len(cq.ring) {
		if !cq.closed {
			cq.overrun = true
		}
		cq.mu.Unlock()
		cq.wake()
		return false
	}
	i := cq.head + n
	if i >= len(cq.ring) {
		i -= len(cq.ring)
	}
	cq.ring[i] = wc
	cq.count.Store(int32(n + 1))
	cq.mu.Unlock()
	if cq.waiters.Load() > 0 {
		cq.wake()
	}
	return true
}

func (cq *CQ) wake() {
	select {
	case cq.notify <- struct{}{}:
	default:
	}
}

// Poll moves up to len(wcs) completions into wcs and returns how many.
// Once the stored completions are drained, a CQ that overran returns
// ErrCQOverrun; a closed CQ returns ErrClosed.
func (cq *CQ) Poll(wcs []WorkCompletion) (int, error) {
	if cq.count.Load() == 0 && !cq.dev.closed.Load() {
		cq.dev.Progress()
	}
	if cq.count.Load() == 0 {
		// Fast path without the lock; the flags are re-read under it.
		if !cq.overrunOrClosed() {
			return 0, nil
		}
	}
	cq.mu.Lock()
	defer cq.mu.Unlock()
	n := int(cq.count.Load())
	if n > len(wcs) {
		n = len(wcs)
	}
	for i := 0; i < n; i++ {
		wcs[i] = cq.ring[cq.head]
		cq.head++
		if cq.head == len(cq.ring) {
			cq.head = 0
		}
	}
	left := cq.count.Add(int32(-n))
	if n == 0 && left == 0 {
		if cq.closed {
			return 0, ErrClosed
		}
		if cq.overrun {
			return 0, ErrCQOverrun
		}
	}
	return n, nil
}

func (cq *CQ) overrunOrClosed() bool {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.overrun || cq.closed
}

// Len returns the number of completions waiting.
func (cq *CQ) Len() int { return int(cq.count.Load()) }

// Wait blocks until the CQ holds a completion, Wake is called, the
// context ends, or the CQ is closed or overruns. It spins for the
// configured time first. Any number of goroutines may wait: a completion
// stored while they wait wakes every one of them that still finds one
// when it runs (one that finds it polled already waits on).
func (cq *CQ) Wait(ctx context.Context) error {
	if cq.count.Load() > 0 || cq.takeWake() {
		return nil
	}
	if cq.spin > 0 {
		deadline := time.Now().Add(cq.spin)
		for i := 0; ; i++ {
			if cq.count.Load() > 0 || cq.takeWake() {
				return nil
			}
			if !cq.dev.closed.Load() {
				cq.dev.Progress()
			}
			if i&15 == 15 {
				if time.Now().After(deadline) {
					break
				}
				// Yield now and then: with more goroutines (or processes)
				// than processors the one that would complete the request
				// must get to run.
				spin.Pause(i >> 4)
			}
		}
	}
	cq.waiters.Add(1)
	defer cq.waiters.Add(-1)
	for {
		if cq.count.Load() > 0 {
			cq.passWake()
			return nil
		}
		if cq.takeWake() {
			return nil
		}
		if cq.overrunOrClosed() {
			cq.passWake()
			if cq.isClosed() {
				return ErrClosed
			}
			return ErrCQOverrun
		}
		select {
		case <-cq.notify:
		case <-cq.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// passWake hands the wake-up this waiter may have taken to the next, if
// others wait: push and Wake wake one, and what woke this one (a stored
// completion, an overrun) concerns them all.
func (cq *CQ) passWake() {
	if cq.waiters.Load() > 1 {
		cq.wake()
	}
}

// Wake makes one Wait return, now or, if none is waiting, the next one
// to start: a goroutine that blocks on the CQ on behalf of others (a
// progress engine's poller) learns that something it waits for changed
// outside the CQ. Wait may so return with nothing to poll.
func (cq *CQ) Wake() {
	cq.woken.Store(true)
	if cq.waiters.Load() > 0 {
		cq.wake()
	}
}

// takeWake consumes a Wake.
func (cq *CQ) takeWake() bool { return cq.woken.Load() && cq.woken.Swap(false) }

func (cq *CQ) isClosed() bool {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	return cq.closed
}

// WaitPoll waits for at least one completion, then polls.
func (cq *CQ) WaitPoll(ctx context.Context, wcs []WorkCompletion) (int, error) {
	for {
		n, err := cq.Poll(wcs)
		if n > 0 || err != nil {
			return n, err
		}
		if err := cq.Wait(ctx); err != nil {
			return 0, err
		}
	}
}

// Close destroys the CQ. It fails with ErrBusy while QPs use it.
func (cq *CQ) Close() error {
	cq.mu.Lock()
	if cq.closed {
		cq.mu.Unlock()
		return ErrClosed
	}
	if cq.qps > 0 {
		n := cq.qps
		cq.mu.Unlock()
		return fmt.Errorf("verbs: close CQ: %w: %d QPs", ErrBusy, n)
	}
	cq.mu.Unlock()
	cq.close()
	cq.dev.mu.Lock()
	delete(cq.dev.cqs, cq)
	cq.dev.mu.Unlock()
	return nil
}

func (cq *CQ) close() {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if !cq.closed {
		cq.closed = true
		close(cq.done)
	}
}

func (cq *CQ) attach(delta int) error {
	cq.mu.Lock()
	defer cq.mu.Unlock()
	if cq.closed {
		return ErrClosed
	}
	cq.qps += delta
	return nil
}
