// Package sdrwire is the codec of the reliability layer's control
// messages: the receiver's status of a posted buffer (clear-to-send, the
// chunk bitmap, completion), the sender's query, RTT pings, and the probe
// train that measures the path's loss before a transfer. Each message
// travels in one SEND; all integers are big-endian.
//
// Parse never panics on hostile input and does not retain its argument.
package sdrwire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Message types.
const (
	TypePing   = 1 // Stamp: the sender's clock
	TypePong   = 2 // Stamp: echoed
	TypeStatus = 3 // a receive slot's state
	TypeQuery  = 4 // Seq: ask for that message's status now
	TypeProbe  = 5 // Stamp, Seq: the probe's index; Pad bytes of padding
	TypeEcho   = 6 // Stamp, Seq: a probe's, echoed
)

// Status flags.
const (
	FlagComplete = 1 << 0 // every data chunk is in place, or the receiver took the message early
	FlagTaken    = 1 << 1 // the receiver took the message with chunks missing
)

// MaxWords bounds the bitmap slice of one status (6144 chunks), so that a
// status fits in one 1 KiB packet.
const MaxWords = 96

// MaxLen is the largest encoded message.
const MaxLen = statusFixed + 8*MaxWords

// Version is the wire format's version, the first byte of every message.
// Version 2 added the status's Skipped and the probes; version 3 the
// status's Window (receiver-driven flow control).
const Version = 3

const (
	version     = Version
	hdrLen      = 2
	statusFixed = hdrLen + 8 + 8 + 1 + 4 + 2 + 2 + 8 + 4 + 8 + 4 + 8 + 8 + 4 + 4 + 4 + 4 + 4 + 8 + 2
	probeFixed  = hdrLen + 8 + 8
)

var zeros [MaxLen]byte // probes' padding

// ErrMalformed reports a control message that cannot be parsed.
var ErrMalformed = errors.New("sdrwire: malformed control message")

// ErrVersion reports a message of another version of the format: the peer
// runs an older or newer build, and the two cannot work together. It
// wraps ErrMalformed.
var ErrVersion = fmt.Errorf("%w: another version of the wire format", ErrMalformed)

// VersionError is the version a message was in, when Parse fails with
// ErrVersion.
type VersionError struct{ Got uint8 }

func (e *VersionError) Error() string {
	return fmt.Sprintf("sdrwire: the peer speaks wire format version %d, this end %d (upgrade both ends to the same release)", e.Got, Version)
}

func (e *VersionError) Unwrap() error { return ErrVersion }

// Message is one control message; which fields matter depends on Type.
type Message struct {
	Type  uint8
	Stamp int64  // ping, pong, probe, echo
	Seq   uint64 // status, query: the message's sequence number; probe, echo: the probe's index
	Pad   int    // probe: bytes of padding, so that probes are about as large as chunks
	Floor uint64 // status: every message below Floor is complete at the receiver

	// Status: where to write (clear-to-send) and how far the message got.
	Flags   uint8
	Chunk   uint32 // bytes per chunk
	K       uint16 // data chunks per erasure-coding stripe
	MaxM    uint16 // parity chunks per stripe the parity area holds
	Len     uint64 // message buffer length in bytes
	RKey    uint32
	Addr    uint64
	ParRKey uint32
	ParAddr uint64
	ParLen  uint64
	Arrived uint32 // distinct chunks (data and parity) that arrived
	Decoded uint32 // data chunks rebuilt from parity
	Cum     uint32 // every data chunk below Cum is present
	Highest uint32 // one more than the highest data chunk seen; 0: none
	// Skipped counts the data positions that Highest jumped over when a
	// chunk arrived: first transmissions lost, when the path keeps order.
	// The sender's loss estimate is Skipped over Highest.
	Skipped uint32
	// Window is the bytes of chunks the receiver will take in flight (sent
	// and neither acknowledged nor declared lost) across all its slots,
	// grown while it keeps up and cut when it drops; 0: no limit.
	Window uint64
	Words  []uint64
}

// Append encodes m onto b.
func Append(b []byte, m *Message) []byte {
	b = append(b, version, m.Type)
	switch m.Type {
	case TypePing, TypePong:
		b = binary.BigEndian.AppendUint64(b, uint64(m.Stamp))
	case TypeQuery:
		b = binary.BigEndian.AppendUint64(b, m.Seq)
	case TypeProbe, TypeEcho:
		b = binary.BigEndian.AppendUint64(b, uint64(m.Stamp))
		b = binary.BigEndian.AppendUint64(b, m.Seq)
		if m.Type == TypeProbe {
			pad := min(max(m.Pad, 0), MaxLen-probeFixed)
			b = append(b, zeros[:pad]...)
		}
	case TypeStatus:
		words := m.Words
		if len(words) > MaxWords {
			words = words[:MaxWords]
		}
		b = binary.BigEndian.AppendUint64(b, m.Seq)
		b = binary.BigEndian.AppendUint64(b, m.Floor)
		b = append(b, m.Flags)
		b = binary.BigEndian.AppendUint32(b, m.Chunk)
		b = binary.BigEndian.AppendUint16(b, m.K)
		b = binary.BigEndian.AppendUint16(b, m.MaxM)
		b = binary.BigEndian.AppendUint64(b, m.Len)
		b = binary.BigEndian.AppendUint32(b, m.RKey)
		b = binary.BigEndian.AppendUint64(b, m.Addr)
		b = binary.BigEndian.AppendUint32(b, m.ParRKey)
		b = binary.BigEndian.AppendUint64(b, m.ParAddr)
		b = binary.BigEndian.AppendUint64(b, m.ParLen)
		b = binary.BigEndian.AppendUint32(b, m.Arrived)
		b = binary.BigEndian.AppendUint32(b, m.Decoded)
		b = binary.BigEndian.AppendUint32(b, m.Cum)
		b = binary.BigEndian.AppendUint32(b, m.Highest)
		b = binary.BigEndian.AppendUint32(b, m.Skipped)
		b = binary.BigEndian.AppendUint64(b, m.Window)
		b = binary.BigEndian.AppendUint16(b, uint16(len(words)))
		for _, w := range words {
			b = binary.BigEndian.AppendUint64(b, w)
		}
	}
	return b
}

// Parse decodes b into m, reusing m.Words' storage.
func Parse(b []byte, m *Message) error {
	if len(b) < hdrLen {
		return fmt.Errorf("%w: %d bytes", ErrMalformed, len(b))
	}
	if b[0] != version {
		return &VersionError{Got: b[0]}
	}
	m.Type = b[1]
	p := b[hdrLen:]
	switch m.Type {
	case TypePing, TypePong, TypeQuery:
		if len(p) != 8 {
			return fmt.Errorf("%w: type %d with %d bytes", ErrMalformed, m.Type, len(p))
		}
		v := binary.BigEndian.Uint64(p)
		m.Stamp, m.Seq = int64(v), v
		return nil
	case TypeProbe, TypeEcho:
		if len(b) < probeFixed || len(b) > MaxLen || (m.Type == TypeEcho && len(b) != probeFixed) {
			return fmt.Errorf("%w: type %d with %d bytes", ErrMalformed, m.Type, len(p))
		}
		m.Stamp = int64(binary.BigEndian.Uint64(p))
		m.Seq = binary.BigEndian.Uint64(p[8:])
		m.Pad = len(b) - probeFixed
		return nil
	case TypeStatus:
	default:
		return fmt.Errorf("%w: type %d", ErrMalformed, m.Type)
	}
	if len(b) < statusFixed {
		return fmt.Errorf("%w: status of %d bytes", ErrMalformed, len(b))
	}
	be := binary.BigEndian
	m.Seq = be.Uint64(p)
	m.Floor = be.Uint64(p[8:])
	p = p[8:]
	m.Flags = p[8]
	m.Chunk = be.Uint32(p[9:])
	m.K = be.Uint16(p[13:])
	m.MaxM = be.Uint16(p[15:])
	m.Len = be.Uint64(p[17:])
	m.RKey = be.Uint32(p[25:])
	m.Addr = be.Uint64(p[29:])
	m.ParRKey = be.Uint32(p[37:])
	m.ParAddr = be.Uint64(p[41:])
	m.ParLen = be.Uint64(p[49:])
	m.Arrived = be.Uint32(p[57:])
	m.Decoded = be.Uint32(p[61:])
	m.Cum = be.Uint32(p[65:])
	m.Highest = be.Uint32(p[69:])
	m.Skipped = be.Uint32(p[73:])
	m.Window = be.Uint64(p[77:])
	n := int(be.Uint16(p[85:]))
	p = p[87:]
	if n > MaxWords || len(p) != 8*n {
		return fmt.Errorf("%w: %d bitmap words in %d bytes", ErrMalformed, n, len(p))
	}
	m.Words = m.Words[:0]
	for i := 0; i < n; i++ {
		m.Words = append(m.Words, be.Uint64(p[8*i:]))
	}
	return nil
}
