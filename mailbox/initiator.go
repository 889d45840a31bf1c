package mailbox

import (
	"context"
	"fmt"

	"github.com/rvma/rvma/internal/progress"
	"github.com/rvma/rvma/verbs"
)

// Initiator puts into remote mailboxes over one connected QP. It owns the
// QP's send CQ: nothing else may poll it.
type Initiator struct {
	qp  *verbs.QP
	eng *progress.Engine
}

// NewInitiator wraps a connected QP and its send CQ.
func NewInitiator(qp *verbs.QP, cq *verbs.CQ) *Initiator {
	return &Initiator{qp: qp, eng: progress.New(cq, progress.Config{Err: CompletionError})}
}

// Handle is a put in flight.
type Handle struct {
	op *progress.Op
}

// PutAsync starts a put of the bytes sge names into (mailbox, offset) at
// the peer. The bytes must not change until the put completes.
func (in *Initiator) PutAsync(mailbox, offset uint64, sge verbs.SGE) (*Handle, error) {
	op, id := in.eng.Start(1, nil)
	_, err := in.qp.PostSend([]verbs.SendWR{{ID: id, Opcode: verbs.OpMailboxWrite, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{sge}, Mailbox: mailbox, MailboxOffset: offset}})
	if err != nil {
		in.eng.Posted(op, id, 1, 0, err)
		return nil, fmt.Errorf("mailbox: put: %w", err)
	}
	return &Handle{op: op}, nil
}

// Put puts and waits for the target to have placed the bytes.
func (in *Initiator) Put(ctx context.Context, mailbox, offset uint64, sge verbs.SGE) error {
	h, err := in.PutAsync(mailbox, offset, sge)
	if err != nil {
		return err
	}
	return h.Wait(ctx)
}

// CompletionError maps the completion of a mailbox write to the put's
// outcome: nil, or an error wrapping one of this package's sentinels (or
// the verbs completion error when no sentinel applies).
func CompletionError(wc *verbs.WorkCompletion) error {
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
func (h *Handle) Test() (bool, error) { return h.op.Test() }

// Wait blocks until the put completes or ctx ends. Any number of
// goroutines may wait on handles of one initiator: one of them blocks on the
// CQ and dispatches what arrives; the others sleep until it has.
func (h *Handle) Wait(ctx context.Context) error { return h.op.Wait(ctx) }
