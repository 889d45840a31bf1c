package verbs

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
	Payload []byte

	QPN       uint32 // the local QP the write arrived on
	SrcQP     uint32 // the initiator's QP
	Source    GID    // the initiator's address
	Transport QPType // RC or UC
	// Retry is set when an RC requester retransmits a packet the handler
	// answered MailboxNotReady, so the handler may count attempts.
	Retry bool
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
// requests on any QP.
type MailboxHandler interface {
	HandleMailboxWrite(w *MailboxWrite) MailboxResult
}
