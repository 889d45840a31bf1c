package verbs

import (
	"fmt"
	"sync"
)

// recvWQE is a posted receive: its scatter list resolved at post time.
type recvWQE struct {
	id     uint64
	segs   [][]byte
	total  int
	status Status // a local error found at post time, reported on use
}

// recvQueue is a ring of posted receives, used by a QP's own receive queue
// and by shared receive queues.
type recvQueue struct {
	ring    []recvWQE
	head, n int
	maxSGE  int
	pd      *PD
}

func newRecvQueue(pd *PD, depth, maxSGE int) recvQueue {
	q := recvQueue{ring: make([]recvWQE, depth), maxSGE: maxSGE, pd: pd}
	for i := range q.ring {
		q.ring[i].segs = make([][]byte, 0, maxSGE)
	}
	return q
}

// post appends receives; it returns how many and the first error.
func (q *recvQueue) post(wrs []RecvWR) (int, error) {
	for i := range wrs {
		wr := &wrs[i]
		if len(wr.SGL) > q.maxSGE {
			return i, fmt.Errorf("verbs: post recv: %w: %d SGEs, max %d", ErrInvalidWR, len(wr.SGL), q.maxSGE)
		}
		if q.n == len(q.ring) {
			return i, ErrQueueFull
		}
		j := q.head + q.n
		if j >= len(q.ring) {
			j -= len(q.ring)
		}
		w := &q.ring[j]
		w.id, w.total, w.status = wr.ID, 0, StatusSuccess
		w.segs = w.segs[:0]
		for _, s := range wr.SGL {
			b, st := q.pd.resolveLocal(s, AccessLocalWrite)
			if st != StatusSuccess {
				w.status = st
				continue
			}
			w.segs = append(w.segs, b)
			w.total += len(b)
		}
		q.n++
	}
	return len(wrs), nil
}

// take removes the oldest receive into *dst; false if none is posted.
func (q *recvQueue) take(dst *recvWQE) bool {
	if q.n == 0 {
		return false
	}
	w := &q.ring[q.head]
	dst.id, dst.total, dst.status = w.id, w.total, w.status
	dst.segs = append(dst.segs[:0], w.segs...)
	q.head++
	if q.head == len(q.ring) {
		q.head = 0
	}
	q.n--
	return true
}

// SRQConfig configures CreateSRQ. The zero value means defaults.
type SRQConfig struct {
	MaxWR  int // receive slots; default 1024, range 1..65536
	MaxSGE int // SGEs per receive; default 4, range 1..32
}

// SRQ is a shared receive queue: several QPs of one PD take their receives
// from it. It is safe for concurrent use.
type SRQ struct {
	pd *PD // immutable

	// mu guards q and closed. QPs take receives under their own mu, so
	// it nests inside a QP's mu, and nothing under it calls out.
	mu     sync.Mutex
	q      recvQueue
	closed bool
}

// CreateSRQ creates a shared receive queue.
func (pd *PD) CreateSRQ(cfg SRQConfig) (*SRQ, error) {
	if err := pd.usable(); err != nil {
		return nil, err
	}
	if cfg.MaxWR == 0 {
		cfg.MaxWR = 1024
	}
	if cfg.MaxSGE == 0 {
		cfg.MaxSGE = 4
	}
	if cfg.MaxWR < 1 || cfg.MaxWR > 65536 || cfg.MaxSGE < 1 || cfg.MaxSGE > 32 {
		return nil, fmt.Errorf("verbs: create SRQ: %w: %+v", ErrInvalidArgument, cfg)
	}
	return &SRQ{pd: pd, q: newRecvQueue(pd, cfg.MaxWR, cfg.MaxSGE)}, nil
}

// PostRecv posts receives; it returns how many were posted before an error.
func (s *SRQ) PostRecv(wrs []RecvWR) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.pd.dev.closed.Load() {
		return 0, ErrClosed
	}
	return s.q.post(wrs)
}

// Len returns the number of posted receives.
func (s *SRQ) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.q.n
}

// Close destroys the SRQ; posted receives are discarded.
func (s *SRQ) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.closed = true
	return nil
}

func (s *SRQ) take(dst *recvWQE) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.closed && s.q.take(dst)
}
