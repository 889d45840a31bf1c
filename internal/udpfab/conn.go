package udpfab

import (
	"log/slog"
	"net/netip"
	"time"

	"github.com/rvma/rvma/internal/spin"
)

// Message is one datagram, or one GSO/GRO train of equal-size datagrams,
// for batch I/O.
type Message struct {
	// Buf holds the bytes to send; for a receive, its capacity is the
	// room to fill.
	Buf []byte
	// Iov, on a send where the platform gathers (canGather), holds the
	// bytes to send in pieces instead of Buf, which then only backs some
	// of them: payloads go from where they lie, between headers in Buf.
	Iov [][]byte
	// N is the number of bytes received.
	N int
	// Addr is the destination of a send and the source of a receive.
	Addr netip.AddrPort
	// Seg is the segment size of a train: on send, Buf holds datagrams of
	// Seg bytes (the last may be shorter) to be sent with GSO; on receive,
	// the kernel coalesced datagrams of Seg bytes (GRO). Zero means one
	// datagram.
	Seg int
}

// size is the bytes the message sends.
func (m *Message) size() int {
	if len(m.Iov) == 0 {
		return len(m.Buf)
	}
	n := 0
	for _, b := range m.Iov {
		n += len(b)
	}
	return n
}

// Batch limits.
const (
	// BatchSize is how many messages one batch call handles.
	BatchSize = 64
	// MaxTrain is the largest GSO train (IPv4 UDP payload limit).
	MaxTrain = 65507
	// MaxSegments is the kernel's limit of datagrams per GSO train.
	MaxSegments = 64
	// socketBuffer is what we ask for, as wireguard-go and quic-go do.
	socketBuffer = 7 << 20
	// maxPieces bounds a gathered message's pieces (Message.Iov): headers
	// and payload for each datagram of a train, and the last trailer.
	maxPieces = 2*MaxSegments + 1
)

// Config holds a socket's options; the zero value (or nil) means
// defaults.
type Config struct {
	// Logger receives the one warning about clamped socket buffers.
	// Default none.
	Logger *slog.Logger
	// NoGSO and NoGRO turn those off by hand (they are probed and fall
	// back on their own). Default false.
	NoGSO, NoGRO bool
}

// defaultSpin is how long a receive spins before it parks: 50µs, or the
// process's override (spin.SetOverride).
func defaultSpin() time.Duration { return spin.Or(50 * time.Microsecond) }

// Features reports what a Conn uses.
type Features struct {
	GSO, GRO   bool
	RecvBuffer int // bytes, as the kernel reports it
	SendBuffer int
}

// Split returns the datagrams of a received message.
func Split(m *Message, f func(d []byte)) {
	b := m.Buf[:m.N]
	if m.Seg <= 0 || m.Seg >= len(b) {
		f(b)
		return
	}
	for len(b) > 0 {
		n := min(m.Seg, len(b))
		f(b[:n:n])
		b = b[n:]
	}
}
