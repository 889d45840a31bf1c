package rma

import (
	"errors"
	"fmt"
)

// Sentinel errors; OpError wraps them with the operation and rank.
var (
	// ErrOutOfBounds: the access falls outside the target's window.
	ErrOutOfBounds = errors.New("rma: access outside the target window")
	// ErrNoEpoch: the call needs an access epoch (fence, start, lock) that
	// is not open for the target.
	ErrNoEpoch = errors.New("rma: no access epoch open for the target")
	// ErrDatatype: a buffer's length is not a multiple of the datatype's
	// size, or the operation does not apply to the datatype.
	ErrDatatype = errors.New("rma: datatype mismatch")
	// ErrRank: the rank is not in the communicator.
	ErrRank = errors.New("rma: rank out of range")
	// ErrSync: a synchronisation call out of order (complete without
	// start, unlock without lock, ...).
	ErrSync = errors.New("rma: synchronisation call out of order")
	// ErrPeer: the peer is unreachable or failed (its QP broke).
	ErrPeer = errors.New("rma: peer failed")
	// ErrClosed: the communicator or window was closed.
	ErrClosed = errors.New("rma: closed")
	// ErrRemote: a collective call (Fence, Free, window creation, the
	// exposure epoch of Wait) failed on another rank, named by the
	// OpError; this rank's part succeeded.
	ErrRemote = errors.New("rma: failed on another rank")
	// ErrBootstrap: the environment describes no usable job.
	ErrBootstrap = errors.New("rma: bootstrap failed")
)

// OpError is the error of one operation towards one rank.
type OpError struct {
	Op   string // "put", "get", "accumulate", "lock", "connect", ...
	Rank int    // the target or peer rank; -1 when none
	Err  error
}

func (e *OpError) Error() string {
	if e.Rank < 0 {
		return fmt.Sprintf("rma: %s: %v", e.Op, e.Err)
	}
	return fmt.Sprintf("rma: %s to rank %d: %v", e.Op, e.Rank, e.Err)
}

func (e *OpError) Unwrap() error { return e.Err }

func opErr(op string, rank int, err error) error {
	if err == nil {
		return nil
	}
	var oe *OpError
	if errors.As(err, &oe) && oe.Op == op && oe.Rank == rank {
		return err
	}
	return &OpError{Op: op, Rank: rank, Err: err}
}
