package cm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/rvma/rvma/verbs"
)

// Message types.
const (
	msgREQ byte = 1
	msgREP byte = 2
	msgRTU byte = 3
	msgREJ byte = 4
)

const (
	magic        = "RVCM"
	version      = 1
	headerLen    = 4 + 1 + 1 + 2                      // magic, version, type, body length
	endpointLen  = 16 + 2 + 4 + 4 + 4 + 8 + 1         // addr, port, QPN, PSN, MTU, secret, QP type
	maxPrivate   = 1024                               // private data bytes
	maxBody      = endpointLen + 2 + maxPrivate + 256 // endpoint, private length, private data, slack for REJ text
	maxRejectLen = 256
)

// ErrMalformed reports a CM message that does not decode.
var ErrMalformed = errors.New("cm: malformed message")

// message is one CM message in decoded form.
type message struct {
	typ     byte
	ep      verbs.Endpoint
	qpType  verbs.QPType
	private []byte
	reason  string // REJ
}

// appendMessage encodes m after b.
func appendMessage(b []byte, m *message) []byte {
	start := len(b)
	b = append(b, magic...)
	b = append(b, version, m.typ, 0, 0)
	switch m.typ {
	case msgREQ, msgREP:
		a := m.ep.GID.Addr().As16()
		b = append(b, a[:]...)
		b = binary.BigEndian.AppendUint16(b, m.ep.GID.Port())
		b = binary.BigEndian.AppendUint32(b, m.ep.QPN)
		b = binary.BigEndian.AppendUint32(b, m.ep.PSN)
		b = binary.BigEndian.AppendUint32(b, uint32(m.ep.MTU))
		b = binary.BigEndian.AppendUint64(b, m.ep.Secret)
		b = append(b, byte(m.qpType))
		b = binary.BigEndian.AppendUint16(b, uint16(len(m.private)))
		b = append(b, m.private...)
	case msgREJ:
		r := m.reason
		if len(r) > maxRejectLen {
			r = r[:maxRejectLen]
		}
		b = append(b, r...)
	}
	binary.BigEndian.PutUint16(b[start+6:], uint16(len(b)-start-headerLen))
	return b
}

// parseHeader returns the message type and body length.
func parseHeader(h []byte) (typ byte, n int, err error) {
	if len(h) < headerLen || string(h[:4]) != magic {
		return 0, 0, fmt.Errorf("%w: bad magic", ErrMalformed)
	}
	if h[4] != version {
		return 0, 0, fmt.Errorf("%w: version %d", ErrMalformed, h[4])
	}
	n = int(binary.BigEndian.Uint16(h[6:]))
	if n > maxBody {
		return 0, 0, fmt.Errorf("%w: body of %d bytes", ErrMalformed, n)
	}
	return h[5], n, nil
}

// parseBody decodes a message body of type typ. The private data aliases
// body.
func parseBody(typ byte, body []byte) (*message, error) {
	m := &message{typ: typ}
	switch typ {
	case msgREQ, msgREP:
		if len(body) < endpointLen+2 {
			return nil, fmt.Errorf("%w: short endpoint", ErrMalformed)
		}
		addr := netip.AddrFrom16([16]byte(body[:16])).Unmap()
		port := binary.BigEndian.Uint16(body[16:])
		m.ep = verbs.Endpoint{
			GID:    netip.AddrPortFrom(addr, port),
			QPN:    binary.BigEndian.Uint32(body[18:]),
			PSN:    binary.BigEndian.Uint32(body[22:]),
			MTU:    int(binary.BigEndian.Uint32(body[26:])),
			Secret: binary.BigEndian.Uint64(body[30:]),
		}
		m.qpType = verbs.QPType(body[38])
		n := int(binary.BigEndian.Uint16(body[39:]))
		if n > maxPrivate || len(body) != endpointLen+2+n {
			return nil, fmt.Errorf("%w: private data length %d in a body of %d", ErrMalformed, n, len(body))
		}
		if m.qpType != verbs.RC && m.qpType != verbs.UC {
			return nil, fmt.Errorf("%w: QP type %d", ErrMalformed, body[38])
		}
		if m.ep.QPN == 0 || m.ep.QPN >= 1<<24 || m.ep.MTU < 256 || m.ep.MTU > 1<<24 || m.ep.PSN >= 1<<24 {
			return nil, fmt.Errorf("%w: endpoint %+v", ErrMalformed, m.ep)
		}
		m.private = body[endpointLen+2:]
	case msgRTU:
		if len(body) != 0 {
			return nil, fmt.Errorf("%w: RTU with a body", ErrMalformed)
		}
	case msgREJ:
		if len(body) > maxRejectLen {
			return nil, fmt.Errorf("%w: reject reason of %d bytes", ErrMalformed, len(body))
		}
		m.reason = string(body)
	default:
		return nil, fmt.Errorf("%w: type %d", ErrMalformed, typ)
	}
	return m, nil
}
