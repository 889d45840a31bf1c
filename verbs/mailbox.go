package verbs

import (
	"fmt"

	"github.com/rvma/rvma/internal/fabric"
)

// MailboxWrite describes one packet of a mailbox write as it arrives at the
// target. Every packet carries the mailbox address and offsets, so packets
// can be placed in any order (multipath, UC); on an RC QP they arrive in
// order and exactly once.
type MailboxWrite struct {
	Mailbox uint64 // the 64-bit mailbox address the initiator named
	Offset  uint64 // the write's byte offset in the mailbox's buffer
	MsgOff  uint32 // this packet's offset within the write
	MsgLen  uint32 // the write's total length
	First   bool   // the packet starts the write
	Last    bool   // the packet ends the write
	HasImm  bool   // Imm is valid (last packet of a write with immediate)
	Imm     uint32
	// Payload is valid only during the call: place it, do not keep it.
	// It is nil when the payload stayed in the initiator's memory (shm);
	// Len and Place serve both cases, so a handler should use them.
	Payload []byte

	QPN       uint32 // the local QP the write arrived on
	SrcQP     uint32 // the initiator's QP
	Source    GID    // the initiator's address
	Transport QPType // RC or UC
	// Retry is set when an RC requester retransmits a packet the handler
	// answered MailboxNotReady, so the handler may count attempts.
	Retry bool

	pull     fabric.Puller // the payload is pulled from the initiator's memory
	pullAddr uint64
}

// Len is the number of payload bytes the packet delivers.
func (w *MailboxWrite) Len() int {
	if w.pull != nil {
		return int(w.MsgLen)
	}
	return len(w.Payload)
}

// Place copies the packet's payload into dst, which must be Len bytes
// long. On shm a large write's payload is not carried by the packet: Place
// reads it straight from the initiator's memory into dst, so the bytes are
// copied once. An error (the initiator is gone) means nothing usable was
// placed.
func (w *MailboxWrite) Place(dst []byte) error {
	if len(dst) != w.Len() {
		return fmt.Errorf("verbs: mailbox place: %w: %d bytes for a %d-byte payload", ErrInvalidArgument, len(dst), w.Len())
	}
	if w.pull == nil {
		copy(dst, w.Payload)
		return nil
	}
	return w.pull.Pull(w.Source, w.pullAddr, dst)
}

// MailboxResult is a MailboxHandler's verdict on one packet.
type MailboxResult uint8

// Mailbox verdicts.
const (
	// MailboxAccepted: the payload was placed (or deliberately discarded);
	// the transport acknowledges it.
	MailboxAccepted MailboxResult = 0
	// MailboxNotReady: no buffer can take the payload now. An RC initiator
	// retries after the receiver-not-ready timer, up to its RNR retry
	// count, then fails with StatusRNRRetryExceeded; on UC the write is
	// dropped.
	MailboxNotReady MailboxResult = 1
	// MailboxRefused and the values above it, up to MailboxRefusedMax,
	// refuse the write. An RC initiator's request fails with
	// StatusRemoteAccessError and WorkCompletion.VendorErr set to the
	// value, and its QP enters the error state, as after any remote access
	// error; nothing is placed.
	MailboxRefused    MailboxResult = 2
	MailboxRefusedMax MailboxResult = 17
)

// MailboxHandler places mailbox writes at the target: the receive steering
// hook through which the mailbox layer decides where the bytes of a write
// go. It is called once per arriving packet, for RC in PSN order, and it
// copies the payload itself (the one copy a NIC makes) so that placement and
// any accounting happen together.
//
// Calls for one QP are never concurrent, but calls for different QPs or
// GIDs may be, so an implementation must be safe for concurrent use. No
// lock of the engine is held during the call, so the handler may post work
// requests on any QP. It must not call Device.Close, QP.Destroy,
// MR.Deregister or MR.Exclusive: they wait until packets already built
// have been sent, and the goroutine that runs the handler may be the one
// that is to send them (the loop provider delivers within the sender's
// send).
type MailboxHandler interface {
	HandleMailboxWrite(w *MailboxWrite) MailboxResult
}
