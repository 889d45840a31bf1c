package cm

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
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

// flagAuth marks a message that carries a MAC (and a masked secret).
const flagAuth byte = 1

const (
	magic        = "RVCM"
	version      = 2
	headerLen    = 4 + 1 + 1 + 2                   // magic, version, type, body length
	nonceLen     = 16                              // REQ and REP: fresh per handshake
	macLen       = sha256.Size                     // HMAC-SHA256
	endpointLen  = 16 + 2 + 4 + 4 + 4 + 8 + 16 + 1 // addr, port, QPN, PSN, MTU, secret, MAC key, QP type
	maxPrivate   = 1024                            // private data bytes
	maxBody      = 1 + nonceLen + endpointLen + 2 + maxPrivate + macLen
	maxRejectLen = 256
)

// ErrMalformed reports a CM message that does not decode.
var ErrMalformed = errors.New("cm: malformed message")

// message is one CM message in decoded form. With flagAuth, ep.Secret is
// as sent (masked) and mac holds the MAC; raw is the whole encoding as
// received, which the next MAC of the handshake covers.
type message struct {
	typ     byte
	flags   byte
	nonce   [nonceLen]byte
	ep      verbs.Endpoint
	qpType  verbs.QPType
	private []byte
	reason  string // REJ
	mac     []byte
	raw     []byte
}

func (m *message) auth() bool { return m.flags&flagAuth != 0 }

// appendMessage encodes m after b. With flagAuth and no m.mac, the MAC's
// place is left zero for seal to fill.
func appendMessage(b []byte, m *message) []byte {
	start := len(b)
	b = append(b, magic...)
	b = append(b, version, m.typ, 0, 0)
	switch m.typ {
	case msgREQ, msgREP:
		b = append(b, m.flags)
		b = append(b, m.nonce[:]...)
		a := m.ep.GID.Addr().As16()
		b = append(b, a[:]...)
		b = binary.BigEndian.AppendUint16(b, m.ep.GID.Port())
		b = binary.BigEndian.AppendUint32(b, m.ep.QPN)
		b = binary.BigEndian.AppendUint32(b, m.ep.PSN)
		b = binary.BigEndian.AppendUint32(b, uint32(m.ep.MTU))
		b = binary.BigEndian.AppendUint64(b, m.ep.Secret)
		b = append(b, m.ep.MACKey[:]...)
		b = append(b, byte(m.qpType))
		b = binary.BigEndian.AppendUint16(b, uint16(len(m.private)))
		b = append(b, m.private...)
		b = appendMAC(b, m)
	case msgRTU:
		b = append(b, m.flags)
		b = appendMAC(b, m)
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

func appendMAC(b []byte, m *message) []byte {
	if !m.auth() {
		return b
	}
	if len(m.mac) == macLen {
		return append(b, m.mac...)
	}
	return append(b, make([]byte, macLen)...)
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

// parseBody decodes a message body of type typ. The private data and MAC
// alias body.
func parseBody(typ byte, body []byte) (*message, error) {
	m := &message{typ: typ}
	switch typ {
	case msgREQ, msgREP:
		if len(body) < 1+nonceLen+endpointLen+2 {
			return nil, fmt.Errorf("%w: short endpoint", ErrMalformed)
		}
		m.flags = body[0]
		if m.flags&^flagAuth != 0 {
			return nil, fmt.Errorf("%w: flags %#x", ErrMalformed, m.flags)
		}
		copy(m.nonce[:], body[1:])
		e := body[1+nonceLen:]
		addr := netip.AddrFrom16([16]byte(e[:16])).Unmap()
		port := binary.BigEndian.Uint16(e[16:])
		m.ep = verbs.Endpoint{
			GID:    netip.AddrPortFrom(addr, port),
			QPN:    binary.BigEndian.Uint32(e[18:]),
			PSN:    binary.BigEndian.Uint32(e[22:]),
			MTU:    int(binary.BigEndian.Uint32(e[26:])),
			Secret: binary.BigEndian.Uint64(e[30:]),
			MACKey: [16]byte(e[38:54]),
		}
		m.qpType = verbs.QPType(e[54])
		n := int(binary.BigEndian.Uint16(e[55:]))
		tail := 0
		if m.auth() {
			tail = macLen
		}
		if n > maxPrivate || len(e) != endpointLen+2+n+tail {
			return nil, fmt.Errorf("%w: private data length %d in a body of %d", ErrMalformed, n, len(body))
		}
		if m.qpType != verbs.RC && m.qpType != verbs.UC {
			return nil, fmt.Errorf("%w: QP type %d", ErrMalformed, e[54])
		}
		if m.ep.QPN == 0 || m.ep.QPN >= 1<<24 || m.ep.MTU < 256 || m.ep.MTU > 1<<24 || m.ep.PSN >= 1<<24 {
			return nil, fmt.Errorf("%w: endpoint %+v", ErrMalformed, m.ep)
		}
		m.private = e[endpointLen+2 : endpointLen+2+n]
		if m.auth() {
			m.mac = e[endpointLen+2+n:]
		}
	case msgRTU:
		if len(body) < 1 {
			return nil, fmt.Errorf("%w: RTU without flags", ErrMalformed)
		}
		m.flags = body[0]
		want := 1
		if m.auth() {
			want += macLen
		}
		if m.flags&^flagAuth != 0 || len(body) != want {
			return nil, fmt.Errorf("%w: RTU of %d bytes with flags %#x", ErrMalformed, len(body), m.flags)
		}
		if m.auth() {
			m.mac = body[1:]
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

func readMessage(r io.Reader) (*message, error) {
	raw := make([]byte, headerLen, headerLen+64)
	if _, err := io.ReadFull(r, raw); err != nil {
		return nil, err
	}
	typ, n, err := parseHeader(raw)
	if err != nil {
		return nil, err
	}
	raw = append(raw, make([]byte, n)...)
	if _, err := io.ReadFull(r, raw[headerLen:]); err != nil {
		return nil, err
	}
	m, err := parseBody(typ, raw[headerLen:])
	if err != nil {
		return nil, err
	}
	m.raw = raw
	return m, nil
}

// The handshake's MACs and masks are HMAC-SHA256 under the job's key, each
// with a label of its own, so that no value computed for one purpose is
// valid for another. A REQ's MAC covers the REQ; a REP's covers the REQ
// and the REP; the RTU's covers both again, with the listener's fresh
// nonce in them, which is what makes a replayed REQ useless: its sender
// cannot confirm. The secrets that the data path's packets carry travel
// masked, so that whoever reads the exchange does not learn them.
const (
	labelREQ       = "rvma-cm v2 REQ"
	labelREP       = "rvma-cm v2 REP"
	labelRTU       = "rvma-cm v2 RTU"
	labelSecretREQ = "rvma-cm v2 secret REQ"
	labelSecretREP = "rvma-cm v2 secret REP"
)

func mac(key []byte, label string, parts ...[]byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(label))
	for _, p := range parts {
		// Length-prefixed, so that parts cannot be shifted between each
		// other.
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(p)))
		h.Write(n[:])
		h.Write(p)
	}
	return h.Sum(nil)
}

// mask XORs a REQ's (keyed by its nonce only) or a REP's (both nonces)
// secret and MAC key with a pad drawn from the job's key, so that they
// travel hidden; applied twice it unmasks.
func mask(ep *verbs.Endpoint, key []byte, typ byte, req, rep *[nonceLen]byte) {
	var pad []byte
	if typ == msgREQ {
		pad = mac(key, labelSecretREQ, req[:])
	} else {
		pad = mac(key, labelSecretREP, req[:], rep[:])
	}
	ep.Secret ^= binary.BigEndian.Uint64(pad)
	for i := range ep.MACKey {
		ep.MACKey[i] ^= pad[8+i]
	}
}

// seal encodes m with its MAC over prior (the handshake's earlier
// messages) and m itself.
func seal(key []byte, label string, m *message, prior ...[]byte) []byte {
	m.flags |= flagAuth
	m.mac = nil
	b := appendMessage(nil, m)
	signed := b[:len(b)-macLen]
	copy(b[len(signed):], mac(key, label, append(prior, signed)...))
	m.raw = b
	return b
}

// verify checks m's MAC over prior and m.
func verify(key []byte, label string, m *message, prior ...[]byte) bool {
	if !m.auth() || len(m.raw) < macLen {
		return false
	}
	signed := m.raw[:len(m.raw)-macLen]
	return hmac.Equal(m.mac, mac(key, label, append(prior, signed)...))
}
