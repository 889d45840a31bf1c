package verbs

import (
	"fmt"
	"net/netip"

	"github.com/rvma/rvma/internal/wire"
)

// GID is a device's local address: one per vNIC, the unit multipath binds
// QPs to. For the UDP provider it is the socket's IP address and port; the
// loop provider synthesises unique-local IPv6 addresses.
type GID = netip.AddrPort

// Access is a set of memory-region access rights.
type Access uint32

// Access rights, as ibv_access_flags.
const (
	AccessLocalWrite Access = 1 << iota
	AccessRemoteWrite
	AccessRemoteRead
	AccessRemoteAtomic

	// AccessAll grants every right.
	AccessAll = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
)

func (a Access) String() string {
	s := ""
	for i, n := range []string{"LOCAL_WRITE", "REMOTE_WRITE", "REMOTE_READ", "REMOTE_ATOMIC"} {
		if a&(1<<i) != 0 {
			if s != "" {
				s += "|"
			}
			s += n
		}
	}
	if s == "" {
		return "NONE"
	}
	return s
}

// QPType is a queue pair's transport service.
type QPType uint8

// Transport services.
const (
	// RC: reliable connected. In order, exactly once, acknowledged;
	// retransmission on loss; every operation.
	RC QPType = iota + 1
	// UC: unreliable connected. No acknowledgement or retransmission; a
	// message that loses a packet is dropped at the target. SEND and WRITE
	// (with and without immediate) and mailbox writes only.
	UC
)

func (t QPType) String() string {
	switch t {
	case RC:
		return "RC"
	case UC:
		return "UC"
	}
	return fmt.Sprintf("QPType(%d)", uint8(t))
}

// QPState is a queue pair's state.
//
//	Reset -> Init -> ReadyToReceive -> ReadyToSend
//	  any state -> Error (on a fatal completion, or by SetError)
//	  any state -> Reset (by Reset)
type QPState uint8

// QP states, as ibv_qp_state.
const (
	StateReset QPState = iota
	StateInit
	StateReadyToReceive
	StateReadyToSend
	StateError
)

func (s QPState) String() string {
	switch s {
	case StateReset:
		return "RESET"
	case StateInit:
		return "INIT"
	case StateReadyToReceive:
		return "RTR"
	case StateReadyToSend:
		return "RTS"
	case StateError:
		return "ERROR"
	}
	return fmt.Sprintf("QPState(%d)", uint8(s))
}

// Opcode is a send work request's operation.
type Opcode uint8

// Send work request opcodes.
const (
	OpSend Opcode = iota + 1
	OpSendImm
	OpWrite
	OpWriteImm
	OpRead
	OpCompareSwap
	OpFetchAdd
	// OpMailboxWrite writes to a mailbox address and offset at the target
	// (rvma's extension); the target's MailboxHandler places the bytes.
	OpMailboxWrite
	// OpMailboxWriteImm is OpMailboxWrite with 32 bits of immediate data
	// handed to the target's handler with the last packet.
	OpMailboxWriteImm
	// OpWriteList writes several small runs of the memory under RKey in
	// one packet (rvma's extension, RC only): Inline holds the list, built
	// with AppendWriteList, at most the connection's MTU; RemoteAddr is
	// unused. The target checks every run before it places any; one out
	// of bounds fails the request as a WRITE out of bounds does. It
	// completes as a WRITE.
	OpWriteList
)

// AppendWriteList appends a run of data to be written at remote address
// addr to an OpWriteList's list; data is at most 65535 bytes.
func AppendWriteList(list []byte, addr uint64, data []byte) []byte {
	return wire.AppendListEntry(list, addr, data)
}

// WriteListEntry is the bytes a run takes in an OpWriteList's list
// besides its data.
const WriteListEntry = wire.ListEntryLen

var opNames = [...]string{"", "SEND", "SEND_WITH_IMM", "RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "RDMA_READ",
	"ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD", "MAILBOX_WRITE", "MAILBOX_WRITE_WITH_IMM", "WRITE_LIST"}

func (o Opcode) String() string {
	if int(o) < len(opNames) && o != 0 {
		return opNames[o]
	}
	return fmt.Sprintf("Opcode(%d)", uint8(o))
}

func (o Opcode) isAtomic() bool   { return o == OpCompareSwap || o == OpFetchAdd }
func (o Opcode) isReadLike() bool { return o == OpRead || o.isAtomic() }
func (o Opcode) isMailbox() bool  { return o == OpMailboxWrite || o == OpMailboxWriteImm }
func (o Opcode) hasImm() bool     { return o == OpSendImm || o == OpWriteImm || o == OpMailboxWriteImm }

func (o Opcode) wcOpcode() WCOpcode {
	switch o {
	case OpSend, OpSendImm:
		return WCSend
	case OpWrite, OpWriteImm, OpWriteList:
		return WCWrite
	case OpRead:
		return WCRead
	case OpCompareSwap:
		return WCCompareSwap
	case OpFetchAdd:
		return WCFetchAdd
	case OpMailboxWrite, OpMailboxWriteImm:
		return WCMailboxWrite
	}
	return 0
}

// SendFlags modify a send work request.
type SendFlags uint8

// Send flags, as ibv_send_flags.
const (
	// FlagSignaled asks for a completion even if the QP does not signal
	// every request.
	FlagSignaled SendFlags = 1 << iota
	// FlagInline copies SendWR.Inline at post time; no memory region is
	// involved and the caller may reuse the slice at once.
	FlagInline
	// FlagSolicited sets the solicited-event bit on the last packet.
	FlagSolicited
	// FlagFence makes the request wait until earlier READs and atomics
	// have completed.
	FlagFence
	// FlagUnordered lets a WRITE take effect before the requests posted
	// earlier on its QP: on shared memory it is executed at once when the
	// target memory allows, even while earlier requests are in flight
	// (and does not hold later ones back). For data whose order does not
	// matter, such as a counter that only grows. Not part of ibverbs.
	FlagUnordered
	// FlagDefer lets the request's packets wait in the QP until a request
	// posted without it sends them together with its own (or until
	// DeferMax packets wait, or the retransmission timeout passes), as a
	// chain of requests posted at once rings the doorbell once: a run of small WRITEs then leaves in one batch
	// (one system call and one acknowledgement over UDP). Only for
	// requests that a later one is sure to follow, such as puts before
	// their flush; until then they make no progress. Not part of ibverbs.
	FlagDefer
)

// DeferMax is how many packets of FlagDefer requests a QP holds before it
// sends them anyway: one batch of the UDP provider's trains.
const DeferMax = 64

// SGE is a scatter/gather element: Length bytes at Addr inside the memory
// region whose local key is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWR is a send-queue work request.
type SendWR struct {
	ID     uint64
	Opcode Opcode
	Flags  SendFlags
	SGL    []SGE  // gather list (read from; scatter list for READ and atomics; none for an atomic whose previous value is not wanted)
	Inline []byte // with FlagInline: the payload, copied at post time
	Imm    uint32 // immediate data for the _IMM opcodes

	RemoteAddr uint64 // WRITE, READ, atomics: target IOVA
	RKey       uint32 // WRITE, READ, atomics: target memory region's remote key

	CompareAdd uint64 // FETCH_ADD: the addend; CMP_SWAP: the compare value
	Swap       uint64 // CMP_SWAP: the swap value

	Mailbox       uint64 // mailbox writes: target mailbox address
	MailboxOffset uint64 // mailbox writes: byte offset in the mailbox's buffer
}

// RecvWR is a receive-queue work request.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// WCOpcode is the operation a work completion reports.
type WCOpcode uint8

// Completion opcodes, as ibv_wc_opcode.
const (
	WCSend WCOpcode = iota + 1
	WCWrite
	WCRead
	WCCompareSwap
	WCFetchAdd
	WCMailboxWrite
	WCRecv
	WCRecvWriteImm
)

var wcNames = [...]string{"", "SEND", "RDMA_WRITE", "RDMA_READ", "COMP_SWAP", "FETCH_ADD", "MAILBOX_WRITE", "RECV", "RECV_RDMA_WITH_IMM"}

func (o WCOpcode) String() string {
	if int(o) < len(wcNames) && o != 0 {
		return wcNames[o]
	}
	return fmt.Sprintf("WCOpcode(%d)", uint8(o))
}

// WCFlags describe optional completion fields.
type WCFlags uint8

// Completion flags.
const (
	WCWithImm WCFlags = 1 << iota
)

// WorkCompletion reports the outcome of one work request. It is a flat
// value so that a caller-supplied slice can be reused across Poll calls.
type WorkCompletion struct {
	WRID      uint64
	Status    Status
	Opcode    WCOpcode
	Flags     WCFlags
	ByteLen   uint32 // bytes received (receive completions) or transferred
	Imm       uint32 // valid with WCWithImm
	QPN       uint32 // the local QP
	SrcQP     uint32 // the remote QP (receive completions)
	VendorErr uint32 // provider detail for failures
}

// Err returns nil for a successful completion and a *CompletionError
// otherwise.
func (wc *WorkCompletion) Err() error {
	if wc.Status == StatusSuccess {
		return nil
	}
	return &CompletionError{Status: wc.Status, WRID: wc.WRID, Opcode: wc.Opcode, VendorErr: wc.VendorErr}
}

// Status is a work completion's status, as ibv_wc_status. A Status is also
// an error value, so errors.Is(err, verbs.StatusRemoteAccessError) works on
// a CompletionError.
type Status uint8

// Completion statuses.
const (
	StatusSuccess Status = iota
	StatusLocalLengthError
	StatusLocalQPOperationError
	StatusLocalProtectionError
	StatusFlushed
	StatusLocalAccessError
	StatusBadResponse
	StatusRemoteInvalidRequest
	StatusRemoteAccessError
	StatusRemoteOperationalError
	StatusRetryExceeded
	StatusRNRRetryExceeded
	StatusGeneralError
)

var statusNames = [...]string{"success", "local length error", "local QP operation error",
	"local protection error", "flushed", "local access error", "bad response",
	"remote invalid request", "remote access error", "remote operational error",
	"transport retry counter exceeded", "RNR retry counter exceeded", "general error"}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Error makes Status usable as an errors.Is target. It returns the bare
// name, because fmt prints an error's Error rather than its String.
func (s Status) Error() string { return s.String() }
