package wire

import (
	"net/netip"
	"sync"
)

// AETH syndrome types (top two bits of the syndrome byte) and NAK codes.
const (
	SyndromeACK uint8 = 0x00
	SyndromeRNR uint8 = 0x20
	SyndromeNAK uint8 = 0x60

	NAKSequence      uint8 = 0
	NAKInvalid       uint8 = 1
	NAKRemoteAccess  uint8 = 2
	NAKRemoteOp      uint8 = 3
	NAKInvalidRD     uint8 = 4
	NAKMailboxBase   uint8 = 16 // 16..31: a mailbox refused a write (non-fatal, message consumed)
	syndromeTypeMask uint8 = 0x60
	syndromeValMask  uint8 = 0x1F
)

// SyndromeType returns the syndrome's type bits (ACK, RNR or NAK).
func SyndromeType(s uint8) uint8 { return s & syndromeTypeMask }

// SyndromeValue returns the syndrome's five value bits: the credit count of
// an ACK, the timer of an RNR NAK, or the code of a NAK.
func SyndromeValue(s uint8) uint8 { return s & syndromeValMask }

// Packet is one transport packet in decoded form. Which header fields are
// meaningful is decided by Opcode, as in the IBTA header tables.
type Packet struct {
	Src, Dst netip.AddrPort

	// BTH
	Opcode  Opcode
	Solicit bool
	AckReq  bool
	DestQP  uint32
	PSN     uint32
	// Placed (rvma, shared memory only): the payload did not travel in
	// the packet. A WRITE's DMALen bytes were already placed by the
	// requester; a mailbox write's payload is the 8-byte address, in the
	// sender's memory, that the receiver pulls MsgLen bytes from.
	Placed bool

	// RETH (and the VA/RKey of AtomicETH).
	VA     uint64
	RKey   uint32
	DMALen uint32

	// AETH
	Syndrome uint8
	MSN      uint32

	// ImmDt
	Imm uint32

	// AtomicETH operands and the AtomicAckETH original value.
	SwapAdd uint64
	Compare uint64
	Orig    uint64

	// MBXETH: mailbox address, the write's byte offset in the mailbox's
	// buffer, this packet's offset within the write, and the write's total
	// length. Every packet carries it, so packets can be placed in any order.
	Mailbox uint64
	Offset  uint64
	MsgOff  uint32
	MsgLen  uint32

	// Secret is the per-connection value the receiver chose at connection
	// time; a packet without it is not from the connected peer.
	Secret uint64

	Payload []byte
	// Steady, on a packet to send, says its payload does not change until
	// it is sent (a request's source, which the application leaves alone
	// until completion, or the packet's own copy), so a port may send it
	// from where it lies and seal the MAC over it there. A payload others
	// may write meanwhile (a READ response's memory) must be copied first:
	// bytes that changed after sealing would fail the MAC every time.
	Steady bool

	// Raw and ICRC are set by Parse: the encoded headers the trailer covers
	// and the trailer itself, checked by Verify.
	Raw  []byte
	ICRC uint32

	// Auth, on a packet to send, is the receiver's MAC key: Append then
	// writes a MAC trailer instead of the checksum. Parse sets HasMAC for
	// such a packet, Seq to the sender's counter and Signed to the bytes
	// the tag covers, checked by VerifyMAC.
	Auth   *MAC
	HasMAC bool
	Seq    uint64
	Signed []byte

	bounce  []byte     // owned buffer Payload may point into
	scratch macScratch // the MAC's nonce and key stream, here so that sealing and checking allocate nothing
}

var pool = sync.Pool{New: func() any { return new(Packet) }}

// Get returns a zeroed packet from the pool.
func Get() *Packet { return pool.Get().(*Packet) }

// Release returns p to the pool. p must not be used afterwards.
func (p *Packet) Release() {
	b := p.bounce
	*p = Packet{}
	p.bounce = b[:0]
	pool.Put(p)
}

// Bounce returns an owned buffer of length n that lives as long as the
// packet, for payloads that must be gathered or copied.
func (p *Packet) Bounce(n int) []byte {
	if cap(p.bounce) < n {
		p.bounce = make([]byte, n)
	}
	p.bounce = p.bounce[:n]
	return p.bounce
}

// Clone returns a copy of p from the pool. A payload held in p's bounce
// buffer is copied; a borrowed payload is shared (it is read-only).
func (p *Packet) Clone() *Packet {
	q := Get()
	b := q.bounce
	*q = *p
	q.bounce = b
	if len(p.bounce) > 0 && len(p.Payload) > 0 && &p.Payload[0] == &p.bounce[0] {
		q.Payload = q.Bounce(len(p.Payload))
		copy(q.Payload, p.Payload)
	}
	return q
}

// Own copies a borrowed payload (one that aliases the sender's memory)
// into p's bounce buffer, so that p may outlive the send that built it: a
// UC send completes once sent, and its memory may then be reused while a
// delayed packet is still on its way.
func (p *Packet) Own() {
	if len(p.Payload) == 0 || (len(p.bounce) > 0 && &p.Payload[0] == &p.bounce[0]) {
		return
	}
	src := p.Payload
	p.Payload = p.Bounce(len(src))
	copy(p.Payload, src)
}
