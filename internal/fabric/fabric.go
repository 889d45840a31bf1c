// Package fabric is the seam between rvma's transport engine (package verbs)
// and the providers that move packets: the in-process loop fabric, UDP
// sockets and shared-memory rings. A provider gives the engine one Port per
// local address (GID); the engine gives each Port a Handler for the packets
// that arrive.
//
// The interfaces are batch-first, after wireguard-go's conn.Bind: Send takes
// a slice of packets and HandlePackets receives one; a batch of one is the
// degenerate case. What a provider offers beyond moving packets is named by
// small interfaces (Progresser, StatsReporter, Exporter, Accessor,
// BoxSharer, Puller, Allocator, Mapper, Impairable) that a Port implements
// or not.
package fabric

import (
	"net/netip"
	"sync/atomic"

	"github.com/rvma/rvma/internal/wire"
)

// Handler consumes packets arriving at a Port. A Port calls HandlePackets
// from one goroutine at a time; the packets are valid only during the call
// (the Port releases them afterwards), so a handler that needs data past the
// call copies it. Each packet's Src is the address of the port that sent
// it, whatever the sender wrote there.
type Handler interface {
	HandlePackets(pkts []*wire.Packet)
}

// Port is one local address of a device.
//
// Every provider's ports pass the contract test in package fabrictest
// (fabrictest.TestPort).
type Port interface {
	// Addr is the port's address, which is also its GID.
	Addr() netip.AddrPort
	// MaxPayload is the largest packet payload the port carries.
	MaxPayload() int
	// Send transmits packets toward their Dst. It takes ownership of every
	// packet, whatever happens to it, and never blocks on the receiver for
	// longer than the receiver takes to process what it is given.
	// Delivery is not guaranteed: that is the transport's job. Send may be
	// called from the port's own handler, and after Close (the packets are
	// then dropped).
	Send(pkts []*wire.Packet)
	// SetHandler installs the receiver of arriving packets. It must be
	// called before the first packet can arrive.
	SetHandler(h Handler)
	// Close stops the port. When it returns, no call of the handler is in
	// progress and none will start; packets sent to the port afterwards
	// are dropped. It must not be called from the port's handler (it would
	// wait for itself). A second Close returns an error and does nothing.
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
	Direct         uint64 // operations executed in a peer's memory without packets (Accessor, Puller)
}

// StatsReporter is implemented by ports that count what they do.
type StatsReporter interface {
	Stats() Stats
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

// What a provider may offer beyond moving packets. A port whose peers can
// reach each other's registered memory without packets (shared memory)
// implements the interfaces below: the initiator of a WRITE, READ or
// atomic copies the bytes itself, as one host's CPU would, and the
// target's engine never sees the operation. Every method that acts on a
// peer may decline with an error; the engine then sends the operation as
// packets, whose handling at the target decides errors (a wrong key, a
// range out of bounds), so declining is always safe. The engine finds each
// ability once per port, by these names (see FaultPort).

// Exporter publishes, for peers to reach directly, the registered memory
// of this process and the queue pairs that may act on it.
type Exporter interface {
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
}

// Accessor reaches the memory peers exported (Exporter), and their shared
// mailbox windows (BoxSharer), with no packet.
type Accessor interface {
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
	// MailboxPuts places puts into the peer's shared window at mailbox
	// and counts each there, as the peer's engine would (ordered as
	// Write), in order, and returns how many it placed: it stops at the
	// first it declines (that one and the rest are the caller's to send).
	// A batch costs one look-up and one lock, so a strided put's runs
	// cost little more than their copies.
	MailboxPuts(dst netip.AddrPort, q QP, mailbox uint64, puts []BoxPut, ordered bool) (int, error)
}

// BoxPut is one put of Accessor.MailboxPuts: Src (a gather list) at
// Offset of the window.
type BoxPut struct {
	Offset uint64
	Src    [][]byte
}

// BoxSharer lists this process's mailbox windows whose counting state
// lies in memory shared with the host's processes, so that their
// Accessors place and count puts into them.
type BoxSharer interface {
	// ShareBox lists the mailbox window at addr, whose counting state
	// (package shmbox) lies in mem, memory from Allocator.Alloc;
	// UnshareBox removes it.
	ShareBox(addr uint64, mem []byte) error
	UnshareBox(addr uint64)
}

// Puller lets a receiver copy a payload straight out of its sender's
// memory, so that a large message is copied once.
type Puller interface {
	// CanPull reports whether peers can read this process's memory, so
	// that a sender may leave a payload in place for the receiver to
	// fetch.
	CanPull() bool
	// Pull copies len(into) bytes at addr in the memory of the process
	// that sent from src into into: one copy, by the receiver.
	Pull(src netip.AddrPort, addr uint64, into []byte) error
}

// Allocator provides memory that the host's processes can map, for
// registered regions and shared mailbox state that peers reach directly.
type Allocator interface {
	// Alloc returns n zeroed, page-aligned bytes; Free returns them.
	Alloc(n int) ([]byte, error)
	Free(b []byte) error
	// Locate says where buf lies when it is inside memory from Alloc: the
	// allocation's id and descriptor and buf's offset in it, which peers
	// need to map it. ok is false for any other memory.
	Locate(buf []byte) (id uint64, fd, off int, ok bool)
}

// Mapper hands out a peer's exported memory mapped into this process, for
// a caller that accesses it many times with plain loads and stores (an
// MPI window's puts). Only memory the peer took from its Allocator
// qualifies, and the access is checked once, at Map, like an Accessor's:
// afterwards nothing stands between the caller and the bytes, so the
// caller must stop when the peer withdraws the region (the mapping stays
// valid memory until this port closes, but is no longer the peer's).
type Mapper interface {
	// Map returns the bytes [va, va+n) of region rkey of the peer at dst,
	// for its QP q, if need is among the region's rights, and a flag
	// that turns true (within about 100 ms) once the peer's process is
	// gone.
	Map(dst netip.AddrPort, q QP, rkey uint32, va uint64, n int, need Rights) ([]byte, *atomic.Bool, error)
}

// Impairable is implemented by ports with direct paths (Accessor) that
// would bypass fault injection: while impaired, peers reach the port
// through packets only.
type Impairable interface {
	Impair(on bool)
}
