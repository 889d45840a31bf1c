// Package fabric is the seam between rvma's transport engine (package verbs)
// and the providers that move packets: the in-process loop fabric and the
// UDP sockets. A provider gives the engine one Port per local address (GID);
// the engine gives each Port a Handler for the packets that arrive.
//
// The interfaces are batch-first, after wireguard-go's conn.Bind: Send takes
// a slice of packets and HandlePackets receives one; a batch of one is the
// degenerate case.
package fabric

import (
	"net/netip"

	"github.com/rvma/rvma/internal/wire"
)

// Handler consumes packets arriving at a Port. A Port calls HandlePackets
// from one goroutine at a time; the packets are valid only during the call
// (the Port releases them afterwards), so a handler that needs data past the
// call copies it.
type Handler interface {
	HandlePackets(pkts []*wire.Packet)
}

// Port is one local address of a device.
type Port interface {
	// Addr is the port's address, which is also its GID.
	Addr() netip.AddrPort
	// MaxPayload is the largest packet payload the port carries.
	MaxPayload() int
	// Send transmits packets toward their Dst. It takes ownership of every
	// packet, whatever happens to it, and never blocks on the receiver for
	// longer than the receiver takes to process what it is given.
	// Delivery is not guaranteed: that is the transport's job.
	Send(pkts []*wire.Packet)
	// SetHandler installs the receiver of arriving packets. It must be
	// called before the first packet can arrive.
	SetHandler(h Handler)
	// Close stops the port. Packets sent to it afterwards are dropped.
	Close() error
}

// Progresser is implemented by ports that can receive in the caller's
// goroutine: Progress handles what has arrived and returns the number of
// packets, without blocking. Busy-polling callers use it to save a
// goroutine hand-off per packet; ports without it progress on their own.
type Progresser interface {
	Progress() int
}

// Stats counts what a port did with packets, for diagnostics and tests.
type Stats struct {
	Sent, Received uint64
	Dropped        uint64 // received but undecodable
	Undeliverable  uint64 // could not be sent: no port at the destination, or refused by the kernel
}

// Rights are what a region exported through Memory allows its peers.
type Rights uint32

// Region rights.
const (
	RemoteRead Rights = 1 << iota
	RemoteWrite
	RemoteAtomic
)

// QP names a remote queue pair: its number and the secret its packets
// carry.
type QP struct {
	Num    uint32
	Secret uint64
}

// Memory is implemented by ports whose peers can reach each other's
// registered memory without packets (shared memory): the initiator of a
// WRITE, READ or atomic copies the bytes itself, as one host's CPU would,
// and the target's engine never sees the operation. Every method may
// decline with an error; the engine then sends the operation as packets,
// whose handling at the target decides errors (a wrong key, a range out of
// bounds), so declining is always safe.
type Memory interface {
	// Export lets peers reach buf as remote key rkey at address iova with
	// rights. A region Export cannot publish stays reachable by packets.
	// The protection domain pd (any number unique in the device) must
	// be the one of the QPs that access it (see Attach).
	Export(rkey uint32, iova uint64, buf []byte, rights Rights, pd uint64) error
	// Unexport withdraws rkey; when it returns no peer accesses the bytes.
	Unexport(rkey uint32)
	// Attach lists queue pair qpn of protection domain pd, whose packets
	// carry secret, as able to take direct accesses to that domain's
	// regions; Detach removes it (the QP left the ready
	// states). Accesses name the remote QP they act for and are declined
	// unless it is listed, so a QP that is gone or in error is reached
	// through packets, which fail as they should.
	Attach(qpn uint32, secret uint64, pd uint64) error
	Detach(qpn uint32)
	// Impair marks the port as injecting faults: while on, peers reach it
	// through packets only (direct accesses would bypass the faults).
	Impair(on bool)
	// Write copies src (a gather list) to the region rkey at va of the
	// peer at dst, for its QP q. With ordered it declines unless every
	// packet sent to dst before has been handled there, so the write
	// cannot overtake them.
	Write(dst netip.AddrPort, q QP, rkey uint32, va uint64, src [][]byte, ordered bool) error
	// Read copies the peer's bytes at va into the scatter list into.
	Read(dst netip.AddrPort, q QP, rkey uint32, va uint64, into [][]byte) error
	// Atomic runs a fetch-and-add (cas false: add swapAdd) or a
	// compare-and-swap (replace compare by swapAdd) on the peer's aligned
	// 8-byte word at va with the CPU's atomic instructions, and returns the
	// word's previous value.
	Atomic(dst netip.AddrPort, q QP, rkey uint32, va uint64, cas bool, swapAdd, compare uint64) (uint64, error)
	// ShareBox lists the mailbox window at addr, whose counting state
	// (package shmbox) lies in mem, memory shared with the host's
	// processes; UnshareBox removes it.
	ShareBox(addr uint64, mem []byte) error
	UnshareBox(addr uint64)
	// MailboxPut places a put into the peer's shared window at mailbox
	// and counts it there, as the peer's engine would.
	MailboxPut(dst netip.AddrPort, q QP, mailbox, offset uint64, src [][]byte, ordered bool) error
	// CanPull reports whether peers can read this process's memory (Pull),
	// so that a sender may leave a payload in place for the receiver to
	// fetch.
	CanPull() bool
	// Pull copies len(into) bytes at addr in the memory of the process
	// that sent from src into into: one copy, by the receiver.
	Pull(src netip.AddrPort, addr uint64, into []byte) error
}
