package wire

// Opcode is the BTH opcode: the top three bits name the transport, the low
// five the operation.
type Opcode uint8

// Transport prefixes.
const (
	TransportRC  Opcode = 0x00
	TransportUC  Opcode = 0x20
	transportMsk Opcode = 0xE0
)

// RC opcodes (IBTA Vol. 1, table 38). UC uses the same low bits with the UC
// prefix for the SEND and RDMA WRITE families.
const (
	SendFirst        Opcode = 0x00
	SendMiddle       Opcode = 0x01
	SendLast         Opcode = 0x02
	SendLastImm      Opcode = 0x03
	SendOnly         Opcode = 0x04
	SendOnlyImm      Opcode = 0x05
	WriteFirst       Opcode = 0x06
	WriteMiddle      Opcode = 0x07
	WriteLast        Opcode = 0x08
	WriteLastImm     Opcode = 0x09
	WriteOnly        Opcode = 0x0A
	WriteOnlyImm     Opcode = 0x0B
	ReadRequest      Opcode = 0x0C
	ReadRespFirst    Opcode = 0x0D
	ReadRespMiddle   Opcode = 0x0E
	ReadRespLast     Opcode = 0x0F
	ReadRespOnly     Opcode = 0x10
	Acknowledge      Opcode = 0x11
	AtomicAck        Opcode = 0x12
	CompareSwap      Opcode = 0x13
	FetchAdd         Opcode = 0x14
	lastStandardCode Opcode = 0x14
)

// Mailbox-write extension opcodes, in the manufacturer-specific range. The
// RC family uses 0xC0-0xC5, the UC family the same low bits at 0xE0.
const (
	MailboxFirst   Opcode = 0xC0
	MailboxMiddle  Opcode = 0xC1
	MailboxLast    Opcode = 0xC2
	MailboxLastImm Opcode = 0xC3
	MailboxOnly    Opcode = 0xC4
	MailboxOnlyImm Opcode = 0xC5

	mailboxRCBase Opcode = 0xC0
	mailboxUCBase Opcode = 0xE0
)

// WriteList is a WRITE of several small runs in one packet (rvma's
// extension, RC only, single packet): after the RETH (whose rkey covers
// every run; VA 0, DMA length the payload's) the payload is a list of
// entries, each a virtual address (8 bytes), a length (2) and that many
// bytes (see AppendListEntry, ListEntries). The responder checks every
// entry before it places any.
const WriteList Opcode = 0xC6

// UC returns the UC form of an RC send, write or mailbox opcode.
// A WRITE_LIST has no UC form: it is returned as it is.
func (o Opcode) UC() Opcode {
	if o == WriteList {
		return o
	}
	if o.isMailbox() {
		return o - mailboxRCBase + mailboxUCBase
	}
	return o | TransportUC
}

// Base strips the transport, mapping UC opcodes onto their RC equivalents so
// that one switch can handle both transports.
func (o Opcode) Base() Opcode {
	switch {
	case o >= mailboxUCBase && o <= mailboxUCBase+5:
		return o - mailboxUCBase + mailboxRCBase
	case o >= mailboxRCBase && o <= mailboxRCBase+5, o == WriteList:
		return o
	default:
		return o &^ transportMsk
	}
}

// IsUC reports whether the opcode belongs to the UC transport.
func (o Opcode) IsUC() bool {
	if o >= mailboxRCBase {
		return o >= mailboxUCBase && o <= mailboxUCBase+5
	}
	return o&transportMsk == TransportUC && o&^transportMsk <= WriteOnlyImm
}

// Valid reports whether the opcode is one this transport speaks.
func (o Opcode) Valid() bool {
	switch {
	case o&transportMsk == TransportRC:
		return o <= lastStandardCode
	case o&transportMsk == TransportUC:
		return o&^transportMsk <= WriteOnlyImm
	default:
		b := o.Base()
		return b >= MailboxFirst && b <= MailboxOnlyImm || o == WriteList
	}
}

func (o Opcode) isMailbox() bool { b := o; return b >= mailboxRCBase && b <= mailboxRCBase+5 }

// IsMailbox reports whether the opcode is a mailbox write (either transport).
func (o Opcode) IsMailbox() bool { return o.Base().isMailbox() }

// IsFirst reports whether the packet starts a multi-packet message.
func (o Opcode) IsFirst() bool {
	switch o.Base() {
	case SendFirst, WriteFirst, ReadRespFirst, MailboxFirst:
		return true
	}
	return false
}

// IsOnly reports whether the packet is a whole message by itself.
func (o Opcode) IsOnly() bool {
	switch o.Base() {
	case SendOnly, SendOnlyImm, WriteOnly, WriteOnlyImm, ReadRespOnly, MailboxOnly, MailboxOnlyImm, WriteList:
		return true
	}
	return false
}

// IsLast reports whether the packet ends a multi-packet message.
func (o Opcode) IsLast() bool {
	switch o.Base() {
	case SendLast, SendLastImm, WriteLast, WriteLastImm, ReadRespLast, MailboxLast, MailboxLastImm:
		return true
	}
	return false
}

// Starts reports whether the packet begins a message (FIRST or ONLY).
func (o Opcode) Starts() bool { return o.IsFirst() || o.IsOnly() }

// Ends reports whether the packet ends a message (LAST or ONLY).
func (o Opcode) Ends() bool { return o.IsLast() || o.IsOnly() }

// HasImm reports whether an ImmDt header follows.
func (o Opcode) HasImm() bool {
	switch o.Base() {
	case SendLastImm, SendOnlyImm, WriteLastImm, WriteOnlyImm, MailboxLastImm, MailboxOnlyImm:
		return true
	}
	return false
}

// HasRETH reports whether an RDMA extended transport header follows.
func (o Opcode) HasRETH() bool {
	switch o.Base() {
	case WriteFirst, WriteOnly, WriteOnlyImm, ReadRequest, WriteList:
		return true
	}
	return false
}

// HasAETH reports whether an ACK extended transport header follows.
func (o Opcode) HasAETH() bool {
	switch o {
	case Acknowledge, AtomicAck, ReadRespFirst, ReadRespLast, ReadRespOnly:
		return true
	}
	return false
}

// HasAtomicETH reports whether an atomic extended transport header follows.
func (o Opcode) HasAtomicETH() bool { return o == CompareSwap || o == FetchAdd }

// HasPayload reports whether the opcode may carry payload.
func (o Opcode) HasPayload() bool {
	switch o.Base() {
	case ReadRequest, Acknowledge, AtomicAck, CompareSwap, FetchAdd:
		return false
	}
	return true
}

// IsResponse reports whether the packet travels from responder to requester.
func (o Opcode) IsResponse() bool {
	switch o {
	case ReadRespFirst, ReadRespMiddle, ReadRespLast, ReadRespOnly, Acknowledge, AtomicAck:
		return true
	}
	return false
}

var names = map[Opcode]string{
	SendFirst: "SEND_FIRST", SendMiddle: "SEND_MIDDLE", SendLast: "SEND_LAST",
	SendLastImm: "SEND_LAST_IMM", SendOnly: "SEND_ONLY", SendOnlyImm: "SEND_ONLY_IMM",
	WriteFirst: "WRITE_FIRST", WriteMiddle: "WRITE_MIDDLE", WriteLast: "WRITE_LAST",
	WriteLastImm: "WRITE_LAST_IMM", WriteOnly: "WRITE_ONLY", WriteOnlyImm: "WRITE_ONLY_IMM",
	ReadRequest: "READ_REQUEST", ReadRespFirst: "READ_RESP_FIRST", ReadRespMiddle: "READ_RESP_MIDDLE",
	ReadRespLast: "READ_RESP_LAST", ReadRespOnly: "READ_RESP_ONLY", Acknowledge: "ACK",
	AtomicAck: "ATOMIC_ACK", CompareSwap: "CMP_SWAP", FetchAdd: "FETCH_ADD",
	MailboxFirst: "MBX_FIRST", MailboxMiddle: "MBX_MIDDLE", MailboxLast: "MBX_LAST",
	MailboxLastImm: "MBX_LAST_IMM", MailboxOnly: "MBX_ONLY", MailboxOnlyImm: "MBX_ONLY_IMM",
	WriteList: "WRITE_LIST",
}

func (o Opcode) String() string {
	prefix := "RC_"
	if o.IsUC() {
		prefix = "UC_"
	}
	if n, ok := names[o.Base()]; ok && o.Valid() {
		return prefix + n
	}
	return "OPCODE_0x" + string("0123456789ABCDEF"[o>>4]) + string("0123456789ABCDEF"[o&15])
}
