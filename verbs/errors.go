package verbs

import (
	"errors"
	"fmt"
)

// Sentinel errors returned by calls (not by completions).
var (
	// ErrClosed: the object (device, CQ, QP, MR, ...) was closed or
	// destroyed, or its device was.
	ErrClosed = errors.New("verbs: closed")
	// ErrQPState: the QP is not in a state that allows the call, such as
	// PostSend before ReadyToSend or a transition out of order.
	ErrQPState = errors.New("verbs: invalid QP state for this operation")
	// ErrQueueFull: the send or receive queue has no free slot.
	ErrQueueFull = errors.New("verbs: work queue full")
	// ErrInvalidWR: a work request is malformed (too many SGEs, inline data
	// too long, an opcode the QP type does not support, a misaligned atomic).
	ErrInvalidWR = errors.New("verbs: invalid work request")
	// ErrInvalidArgument: a configuration value or argument is out of range.
	ErrInvalidArgument = errors.New("verbs: invalid argument")
	// ErrInvalidAccess: an access flag combination ibverbs also rejects.
	ErrInvalidAccess = errors.New("verbs: invalid access flags")
	// ErrCQOverrun: a completion arrived at a full CQ. The QP that produced
	// it was moved to the error state; the CQ reports this once drained.
	ErrCQOverrun = errors.New("verbs: completion queue overrun")
	// ErrUnknownProvider: the URI names no provider this build has.
	ErrUnknownProvider = errors.New("verbs: unknown provider")
	// ErrBusy: the object is still in use (a PD with MRs or QPs, a CQ with
	// QPs).
	ErrBusy = errors.New("verbs: resource busy")

	// ErrUnsupported is returned for a feature the device's providers
	// do not offer (such as a shared mailbox window without shm ports).
	ErrUnsupported = errors.New("verbs: not supported by the device's providers")
)

// CompletionError is a failed work completion as an error, for callers that
// turn completions into errors (see WorkCompletion.Err).
type CompletionError struct {
	Status Status
	WRID   uint64
	Opcode WCOpcode
	// VendorErr carries provider detail, such as a mailbox's refusal code.
	VendorErr uint32
}

func (e *CompletionError) Error() string {
	if e.VendorErr != 0 {
		return fmt.Sprintf("verbs: %v failed: %s (wr %d, vendor error %d)", e.Opcode, e.Status.String(), e.WRID, e.VendorErr)
	}
	return fmt.Sprintf("verbs: %v failed: %s (wr %d)", e.Opcode, e.Status.String(), e.WRID)
}

// Is lets errors.Is match a CompletionError against a Status.
func (e *CompletionError) Is(target error) bool {
	s, ok := target.(Status)
	return ok && s == e.Status
}
