package mailbox

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/rvma/rvma/verbs"
)

// Initiator puts into remote mailboxes over one connected QP. It owns the
// QP's send CQ: nothing else may poll it.
type Initiator struct {
	qp *verbs.QP
	cq *verbs.CQ

	mu      sync.Mutex // guards nextID, handles, wcs (polling), round
	nextID  uint64
	handles map[uint64]*Handle
	wcs     []verbs.WorkCompletion
	// round is closed (and replaced) after completions are dispatched or
	// the blocked poller leaves; waiters that are not the poller sleep on
	// it, so exactly one goroutine blocks on the CQ at a time.
	round  chan struct{}
	poller atomic.Bool
}

// NewInitiator wraps a connected QP and its send CQ.
func NewInitiator(qp *verbs.QP, cq *verbs.CQ) *Initiator {
	return &Initiator{qp: qp, cq: cq, handles: map[uint64]*Handle{}, wcs: make([]verbs.WorkCompletion, 32),
		round: make(chan struct{})}
}

// Handle is a put in flight.
type Handle struct {
	in   *Initiator
	done bool
	err  error
}

// PutAsync starts a put of the bytes sge names into (mailbox, offset) at
// the peer. The bytes must not change until the put completes.
func (in *Initiator) PutAsync(mailbox, offset uint64, sge verbs.SGE) (*Handle, error) {
	return in.post(verbs.SendWR{Opcode: verbs.OpMailboxWrite, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{sge}, Mailbox: mailbox, MailboxOffset: offset})
}

// Put puts and waits for the target to have placed the bytes.
func (in *Initiator) Put(ctx context.Context, mailbox, offset uint64, sge verbs.SGE) error {
	h, err := in.PutAsync(mailbox, offset, sge)
	if err != nil {
		return err
	}
	return h.Wait(ctx)
}

func (in *Initiator) post(wr verbs.SendWR) (*Handle, error) {
	in.mu.Lock()
	in.nextID++
	wr.ID = in.nextID
	h := &Handle{in: in}
	in.handles[wr.ID] = h
	in.mu.Unlock()
	if _, err := in.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		in.mu.Lock()
		delete(in.handles, wr.ID)
		in.mu.Unlock()
		return nil, fmt.Errorf("mailbox: put: %w", err)
	}
	return h, nil
}

// poll dispatches completions to their handles.
func (in *Initiator) poll() error {
	in.mu.Lock()
	defer in.mu.Unlock()
	n, err := in.cq.Poll(in.wcs)
	for _, wc := range in.wcs[:n] {
		if h := in.handles[wc.WRID]; h != nil {
			delete(in.handles, wc.WRID)
			h.done, h.err = true, putError(&wc)
		}
	}
	if n > 0 {
		in.nextRound()
	}
	return err
}

// nextRound wakes the waiters that sleep on the current round; in.mu is
// held.
func (in *Initiator) nextRound() {
	close(in.round)
	in.round = make(chan struct{})
}

// putError maps a completion to the put's outcome.
func putError(wc *verbs.WorkCompletion) error {
	switch {
	case wc.Status == verbs.StatusSuccess:
		return nil
	case wc.Status == verbs.StatusRNRRetryExceeded:
		return fmt.Errorf("%w: %w", ErrNoBuffer, wc.Err())
	case wc.Status == verbs.StatusRemoteAccessError && wc.VendorErr != 0:
		var e error
		switch verbs.MailboxResult(wc.VendorErr) {
		case codeNoMailbox:
			e = ErrNoMailbox
		case codeClosed:
			e = ErrWindowClosed
		case codeOutOfRange:
			e = ErrOutOfRange
		case codeEpochCrossed:
			e = ErrEpochCrossed
		case codeLimit:
			e = ErrLimit
		default:
			return wc.Err()
		}
		return fmt.Errorf("%w: %w", e, wc.Err())
	}
	return wc.Err()
}

// Test reports whether the put has completed, and how. It polls the CQ
// only when no goroutine is blocked in Wait doing so, so it never takes a
// completion from under a blocked poller.
func (h *Handle) Test() (bool, error) {
	in := h.in
	var perr error
	if in.poller.CompareAndSwap(false, true) {
		perr = in.poll()
		in.poller.Store(false)
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if h.done {
		return true, h.err
	}
	return false, perr
}

// Wait blocks until the put completes or ctx ends. Any number of
// goroutines may wait on handles of one initiator: one of them blocks on the
// CQ and dispatches what arrives; the others sleep until it has.
func (h *Handle) Wait(ctx context.Context) error {
	in := h.in
	for {
		in.mu.Lock()
		done, herr, round := h.done, h.err, in.round
		in.mu.Unlock()
		if done {
			return herr
		}
		if in.poller.CompareAndSwap(false, true) {
			err := in.poll()
			if err == nil && !h.isDone() {
				err = in.cq.Wait(ctx)
				if err == nil {
					err = in.poll()
				}
			}
			in.poller.Store(false)
			in.mu.Lock()
			in.nextRound() // whoever sleeps may take over polling
			in.mu.Unlock()
			if err != nil {
				return err
			}
			continue
		}
		select {
		case <-round:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (h *Handle) isDone() bool {
	h.in.mu.Lock()
	defer h.in.mu.Unlock()
	return h.done
}
