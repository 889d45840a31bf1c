package wire

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
)

// Header sizes in bytes (IBTA Vol. 1, 9.2 - 9.5; MBXETH is rvma's).
const (
	BTHLen          = 12
	RETHLen         = 16
	AETHLen         = 4
	ImmLen          = 4
	AtomicETHLen    = 28
	AtomicAckETHLen = 8
	MBXETHLen       = 24
	ICRCLen         = 4
	// MACTrailerLen is the trailer of a packet with a MAC: the sender's
	// packet counter and the tag.
	MACTrailerLen = 8 + TagLen

	// MaxHeaderLen bounds every header stack plus the trailer.
	MaxHeaderLen = BTHLen + RETHLen + AtomicETHLen + AETHLen + AtomicAckETHLen + MBXETHLen + ImmLen + MACTrailerLen
	// DefaultPKey is the default partition key, as on every RoCE port.
	DefaultPKey = 0xFFFF
)

// placedBit marks Packet.Placed, and macBit a packet whose trailer is a
// MAC (Packet.Auth), in the BTH's first reserved byte.
const (
	placedBit = 0x01
	macBit    = 0x02
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors from Parse.
var (
	ErrShort   = errors.New("wire: packet too short")
	ErrOpcode  = errors.New("wire: unknown opcode")
	ErrPayload = errors.New("wire: payload not allowed for opcode")
	ErrPad     = errors.New("wire: bad pad count")
	ErrVersion = errors.New("wire: unsupported transport header version")
	ErrPKey    = errors.New("wire: partition key mismatch")
)

// EncodedLen returns the size of p on the wire.
func (p *Packet) EncodedLen() int {
	return headerLen(p.Opcode) + len(p.Payload) + padLen(len(p.Payload)) + p.trailerLen()
}

func (p *Packet) trailerLen() int {
	if p.Auth != nil {
		return MACTrailerLen
	}
	return ICRCLen
}

func padLen(n int) int { return (4 - n&3) & 3 }

func headerLen(o Opcode) int {
	n := BTHLen
	if o.HasRETH() {
		n += RETHLen
	}
	if o.HasAtomicETH() {
		n += AtomicETHLen
	}
	if o.HasAETH() {
		n += AETHLen
	}
	if o == AtomicAck {
		n += AtomicAckETHLen
	}
	if o.IsMailbox() {
		n += MBXETHLen
	}
	if o.HasImm() {
		n += ImmLen
	}
	return n
}

// Append encodes p after b in the RoCEv2 layout: BTH, the extension headers
// its opcode calls for (RETH, AtomicETH, AETH, AtomicAckETH, MBXETH, ImmDt
// in that order), the payload padded to four bytes, and the trailer.
//
// The trailer sits where RoCEv2 puts its ICRC, but it is not the IBTA
// invariant CRC. It is CRC-32C over the receiver's 64-bit connection secret
// (little-endian), then every header byte (BTH and extension headers), then
// the payload length as four big-endian bytes. It proves that the sender
// knew the secret, so a blind injector, who cannot see the connection's
// packets, cannot make a packet that is accepted, and it pins the headers
// and the length. The payload itself is protected by the UDP checksum, as
// for every protocol over UDP; covering it again would cost a second pass
// over every byte on both ends (17% of the CPU of a bulk transfer) for no
// security, since a CRC does not stop an on-path attacker anyway. The
// trailer is an integrity and authentication check against blind
// injection, not cryptography.
//
// A packet with p.Auth has a MAC instead (see MAC): the trailer is the
// sender's packet counter, then an AES-GMAC tag over every byte before
// it: headers, payload, pad and counter. It proves the sender knew the
// receiver's key and that nothing was changed; the counter lets the
// receiver refuse a replay.
func Append(b []byte, p *Packet) []byte {
	start := len(b)
	b = appendHeaders(b, p)
	hdr := len(b) - start
	b = append(b, p.Payload...)
	b = append(b, zeros[:padLen(len(p.Payload))]...)
	if p.Auth != nil {
		return p.Auth.seal(b, start, &p.scratch)
	}
	return binary.BigEndian.AppendUint32(b, trailer(p.Secret, b[start:start+hdr], len(p.Payload)))
}

// AppendSplit is Append for a payload sent from where it lies, so that
// nothing copies it: it appends p's headers and then its pad and trailer,
// computed as if p.Payload stood between, and returns at, the offset in
// the result where the payload belongs. The packet on the wire is then
// b[start:at] (its headers), p.Payload, and the rest of b (pad and
// trailer); p.Payload must not change until it is sent. A packet whose
// MAC has no way to hash pieces (a CPU without the hash's assembly) is
// appended whole, at -1.
func AppendSplit(b []byte, p *Packet) (_ []byte, at int) {
	if p.Auth != nil && p.Auth.hash == nil {
		return Append(b, p), -1
	}
	start := len(b)
	b = appendHeaders(b, p)
	at = len(b)
	b = append(b, zeros[:padLen(len(p.Payload))]...)
	if p.Auth != nil {
		return p.Auth.sealSplit(b, start, at, p.Payload, &p.scratch), at
	}
	return binary.BigEndian.AppendUint32(b, trailer(p.Secret, b[start:at], len(p.Payload))), at
}

// appendHeaders appends p's BTH and the extension headers its opcode
// calls for.
func appendHeaders(b []byte, p *Packet) []byte {
	op := p.Opcode
	var b1 byte
	if p.Solicit {
		b1 |= 0x80
	}
	b1 |= byte(padLen(len(p.Payload))) << 4 // M = 0, TVer = 0
	var r byte                              // reserved in IBTA; rvma's flags
	if p.Placed {
		r = placedBit
	}
	if p.Auth != nil {
		r |= macBit
	}
	b = append(b, byte(op), b1, DefaultPKey>>8, DefaultPKey&0xFF, r,
		byte(p.DestQP>>16), byte(p.DestQP>>8), byte(p.DestQP))
	var a byte
	if p.AckReq {
		a = 0x80
	}
	b = append(b, a, byte(p.PSN>>16), byte(p.PSN>>8), byte(p.PSN))
	if op.HasRETH() {
		b = binary.BigEndian.AppendUint64(b, p.VA)
		b = binary.BigEndian.AppendUint32(b, p.RKey)
		b = binary.BigEndian.AppendUint32(b, p.DMALen)
	}
	if op.HasAtomicETH() {
		b = binary.BigEndian.AppendUint64(b, p.VA)
		b = binary.BigEndian.AppendUint32(b, p.RKey)
		b = binary.BigEndian.AppendUint64(b, p.SwapAdd)
		b = binary.BigEndian.AppendUint64(b, p.Compare)
	}
	if op.HasAETH() {
		b = append(b, p.Syndrome, byte(p.MSN>>16), byte(p.MSN>>8), byte(p.MSN))
	}
	if op == AtomicAck {
		b = binary.BigEndian.AppendUint64(b, p.Orig)
	}
	if op.IsMailbox() {
		b = binary.BigEndian.AppendUint64(b, p.Mailbox)
		b = binary.BigEndian.AppendUint64(b, p.Offset)
		b = binary.BigEndian.AppendUint32(b, p.MsgOff)
		b = binary.BigEndian.AppendUint32(b, p.MsgLen)
	}
	if op.HasImm() {
		b = binary.BigEndian.AppendUint32(b, p.Imm)
	}
	return b
}

// trailer computes the trailer of a packet with the given headers and
// payload length.
func trailer(secret uint64, hdr []byte, payloadLen int) uint32 {
	crc := ^crc32.Update(secretSeed(secret), castagnoli, hdr)
	for i := 3; i >= 0; i-- { // byte-wise so nothing escapes to the heap
		crc = castagnoli[byte(crc)^byte(payloadLen>>(8*i))] ^ crc>>8
	}
	return ^crc
}

var zeros [4]byte

// secretSeed is the CRC state after the secret's eight bytes
// (little-endian), computed byte by byte so that nothing escapes to the
// heap; it equals crc32.Update(0, castagnoli, secret's bytes).
func secretSeed(secret uint64) uint32 {
	crc := ^uint32(0)
	for i := 0; i < 8; i++ {
		crc = castagnoli[byte(crc)^byte(secret>>(8*i))] ^ crc>>8
	}
	return ^crc
}

// Parse decodes b into p. The payload and p.Raw alias b. Parse checks the
// structure only; whether the trailer matches a connection's secret is
// checked by Verify once the destination QP is known.
func Parse(b []byte, p *Packet) error {
	if len(b) < BTHLen+ICRCLen {
		return ErrShort
	}
	tl := ICRCLen
	if b[4]&macBit != 0 {
		tl = MACTrailerLen
	}
	op := Opcode(b[0])
	if !op.Valid() {
		return ErrOpcode
	}
	if b[1]&0x0F != 0 {
		return ErrVersion
	}
	// Every rvma port is in the default partition; IBTA receivers drop
	// packets of a partition they are not a member of.
	if b[2] != DefaultPKey>>8 || b[3] != DefaultPKey&0xFF {
		return ErrPKey
	}
	hl := headerLen(op)
	if len(b) < hl+tl {
		return ErrShort
	}
	pad := int(b[1]>>4) & 3
	body := len(b) - hl - tl
	// Payload plus pad fills whole four-byte words (IBTA 9.2.1).
	if pad > body || body&3 != 0 {
		return ErrPad
	}
	if !op.HasPayload() && body != 0 {
		return ErrPayload
	}
	p.Opcode = op
	p.Solicit = b[1]&0x80 != 0
	p.DestQP = uint32(b[5])<<16 | uint32(b[6])<<8 | uint32(b[7])
	p.AckReq = b[8]&0x80 != 0
	p.Placed = b[4]&placedBit != 0
	p.PSN = uint32(b[9])<<16 | uint32(b[10])<<8 | uint32(b[11])
	h := b[BTHLen:hl]
	if op.HasRETH() {
		p.VA = binary.BigEndian.Uint64(h)
		p.RKey = binary.BigEndian.Uint32(h[8:])
		p.DMALen = binary.BigEndian.Uint32(h[12:])
		h = h[RETHLen:]
	}
	if op.HasAtomicETH() {
		p.VA = binary.BigEndian.Uint64(h)
		p.RKey = binary.BigEndian.Uint32(h[8:])
		p.SwapAdd = binary.BigEndian.Uint64(h[12:])
		p.Compare = binary.BigEndian.Uint64(h[20:])
		h = h[AtomicETHLen:]
	}
	if op.HasAETH() {
		p.Syndrome = h[0]
		p.MSN = uint32(h[1])<<16 | uint32(h[2])<<8 | uint32(h[3])
		h = h[AETHLen:]
	}
	if op == AtomicAck {
		p.Orig = binary.BigEndian.Uint64(h)
		h = h[AtomicAckETHLen:]
	}
	if op.IsMailbox() {
		p.Mailbox = binary.BigEndian.Uint64(h)
		p.Offset = binary.BigEndian.Uint64(h[8:])
		p.MsgOff = binary.BigEndian.Uint32(h[16:])
		p.MsgLen = binary.BigEndian.Uint32(h[20:])
		h = h[MBXETHLen:]
	}
	if op.HasImm() {
		p.Imm = binary.BigEndian.Uint32(h)
	}
	p.Payload = b[hl : hl+body-pad : hl+body-pad]
	p.Raw = b[:hl]
	if tl == MACTrailerLen {
		p.Signed = b[:len(b)-TagLen]
		p.Seq = binary.BigEndian.Uint64(b[len(b)-MACTrailerLen:])
		p.HasMAC = true
		return nil
	}
	p.Signed, p.Seq, p.HasMAC = nil, 0, false
	p.ICRC = binary.BigEndian.Uint32(b[len(b)-ICRCLen:])
	return nil
}

// Verify reports whether p carries the connection secret the receiving QP
// expects: a decoded packet's trailer must match the one its headers,
// payload length and the secret give; an in-process packet carries the
// secret itself.
func (p *Packet) Verify(secret uint64) bool {
	if p.HasMAC {
		return false // a MAC is checked by VerifyMAC, with the key it needs
	}
	if p.Raw == nil {
		return p.Secret == secret
	}
	return trailer(secret, p.Raw, len(p.Payload)) == p.ICRC
}
