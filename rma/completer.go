package rma

import "sync"

// A completer finishes operations that complete outside the Comm's CQ:
// on a peer's multipath connection or over its reliability connection.
// Each operation adds a wait for itself; one goroutine per completer runs
// the waits in the order they were added while any is pending, instead of
// a goroutine per operation. That order is the order the transfers were
// started, which is about the order they finish (a reliability
// connection's puts finish in it), and a flush waits for all of them.
type completer struct {
	mu      sync.Mutex
	waits   []func()
	running bool
}

// add queues wait, starting the completer's goroutine (counted in wg) if
// it is not running.
func (q *completer) add(wg *sync.WaitGroup, wait func()) {
	q.mu.Lock()
	q.waits = append(q.waits, wait)
	if q.running {
		q.mu.Unlock()
		return
	}
	q.running = true
	q.mu.Unlock()
	wg.Add(1)
	go q.run(wg)
}

func (q *completer) run(wg *sync.WaitGroup) {
	defer wg.Done()
	for {
		q.mu.Lock()
		if len(q.waits) == 0 {
			q.running = false
			q.waits = q.waits[:0:0] // a burst's backing array goes
			q.mu.Unlock()
			return
		}
		wait := q.waits[0]
		q.waits[0] = nil
		q.waits = q.waits[1:]
		q.mu.Unlock()
		wait()
	}
}
