package mailbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rvma/rvma/verbs"
)

// Initiator puts into remote mailboxes over one connected QP. It owns the
// QP's send CQ: nothing else may poll it.
type Initiator struct {
	qp *verbs.QP
	cq *verbs.CQ

	mu      sync.Mutex // guards nextID, handles, wcs (polling)
	nextID  uint64
	handles map[uint64]*Handle
	wcs     []verbs.WorkCompletion
}

// NewInitiator wraps a connected QP and its send CQ.
func NewInitiator(qp *verbs.QP, cq *verbs.CQ) *Initiator {
	return &Initiator{qp: qp, cq: cq, handles: map[uint64]*Handle{}, wcs: make([]verbs.WorkCompletion, 32)}
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
	return err
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

// Test reports whether the put has completed, and how.
func (h *Handle) Test() (bool, error) {
	h.in.mu.Lock()
	done, err := h.done, h.err
	h.in.mu.Unlock()
	if done {
		return true, err
	}
	if perr := h.in.poll(); perr != nil {
		return false, perr
	}
	h.in.mu.Lock()
	defer h.in.mu.Unlock()
	return h.done, h.err
}

// Wait blocks until the put completes or ctx ends.
//
// Several goroutines may wait on different handles of one initiator; one
// may then take another's completion from the CQ while the other sleeps,
// so sleepers re-check at least every millisecond.
func (h *Handle) Wait(ctx context.Context) error {
	for {
		done, err := h.Test()
		if done {
			return err
		}
		if err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, time.Millisecond)
		err = h.in.cq.Wait(wctx)
		cancel()
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}
