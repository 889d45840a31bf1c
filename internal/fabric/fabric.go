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
