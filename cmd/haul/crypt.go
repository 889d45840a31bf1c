package main

// Payload encryption (--encrypt).
//
// Every session (one sender's connection) has a key of its own: HKDF-SHA256
// of the pre-shared key, salted with two fresh 32-byte nonces, the sender's
// (in its offer) and the receiver's (in its answer). Both travel in the CM's
// private data, which the handshake's MACs cover, so neither side can be
// made to reuse a key: a new session, a resumed or restarted one included,
// encrypts under a new key even if one side's nonce were repeated.
//
// A chunk's GCM nonce is its region index, its index within the region and
// the repair round that carries it (0: the first transmission). The sender
// seals each (region, chunk, round) once per session, so a nonce never
// covers two plaintexts, even if the file changes while it is sent; the
// reliability layer's retransmissions resend the same sealed bytes.
//
// A sealed chunk is exactly one reliability chunk: C-16 bytes of ciphertext
// and the 16-byte tag, C being the receiver's chunk size (its answer says
// it). The reliability layer's erasure coding therefore computes parity over
// ciphertext, deliberately: parity of the plaintext would be a linear
// function of it sent in the clear, and a chunk rebuilt from parity is then
// verified by its own tag like one that arrived, so a forged or corrupted
// parity chunk can only make a chunk fail (and be sent again), never reach
// the output.
//
// The receiver lands the sealed regions in staging buffers, never in the
// output: only chunks whose tag verifies are copied there. Those that fail
// are counted and asked for again at the end of the regions, in repair
// rounds (see parseRepair), since the reliability layer has already
// delivered them.

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

const (
	tagSize      = 16 // GCM's tag
	sessionNonce = 32 // each side's contribution to the session key
	keyInfo      = "haul v1 AES-256-GCM payload key, transfer "

	// fbSize is every message the receiver sends an encrypting sender
	// (repair requests and the verdict), padded: a posted buffer completes
	// only when a message covers all of its chunks.
	fbSize          = 64 << 10
	repairMagic     = "HRPR"
	repairHdr       = 4 + 4 + 4 // magic, round, count
	maxRepairChunks = (fbSize - repairHdr) / 8
	// maxRepairRounds bounds the rounds of one session: a round that
	// repairs nothing ends it, so this only stops a peer that lets one
	// chunk through per round.
	maxRepairRounds = 32
	// stagingBudget bounds the sealed regions each side holds at once.
	stagingBudget = 512 << 20
)

// errRepair marks a repair request that does not decode.
var errRepair = errors.New("malformed repair request")

// chunkID names a chunk of the file: its region, its index there.
type chunkID struct{ region, chunk uint32 }

func (a chunkID) less(b chunkID) bool {
	return a.region < b.region || a.region == b.region && a.chunk < b.chunk
}

// layout is how a transfer's regions are cut into sealed chunks of wire
// bytes each.
type layout struct {
	size, region int64
	wire         int
}

func (l layout) plain() int          { return l.wire - tagSize }
func (l layout) regions() int        { return regions(l.size, l.region) }
func (l layout) regionLen(i int) int { return int(min(l.region, l.size-int64(i)*l.region)) }
func (l layout) chunks(i int) int    { return (l.regionLen(i) + l.plain() - 1) / l.plain() }

// sealedLen is region i sealed: its bytes and a tag per chunk.
func (l layout) sealedLen(i int) int { return l.regionLen(i) + tagSize*l.chunks(i) }

// chunkLen is the plaintext bytes of chunk j of region i.
func (l layout) chunkLen(i, j int) int { return min(l.plain(), l.regionLen(i)-j*l.plain()) }

// check says whether ids name chunks of the transfer.
func (l layout) check(ids []chunkID) error {
	for _, id := range ids {
		if int64(id.region) >= int64(l.regions()) || int(id.chunk) >= l.chunks(int(id.region)) {
			return fmt.Errorf("%w: chunk %d of region %d is not in the transfer", errRepair, id.chunk, id.region)
		}
	}
	return nil
}

// staging is how many sealed regions a side keeps in flight: the slots,
// within stagingBudget, and at least two so that one is sealed or opened
// while another is on the wire.
func (l layout) staging(slots int) int {
	return max(2, min(slots, stagingBudget/max(l.sealedLen(0), 1)))
}

func newNonce() []byte {
	b := make([]byte, sessionNonce)
	rand.Read(b)
	return b
}

// payload is one session's encryption.
type payload struct {
	key    []byte
	l      layout
	cpu    atomic.Int64 // nanoseconds of CPU sealing or opening
	failed atomic.Int64 // receiver: chunks whose tag did not verify
}

// newPayload derives the session's key from the pre-shared key, both
// nonces and the transfer's SHA-256 (so that a key is bound to its file).
func newPayload(psk, senderNonce, recvNonce []byte, sha string, l layout) (*payload, error) {
	if len(senderNonce) != sessionNonce || len(recvNonce) != sessionNonce {
		return nil, fmt.Errorf("session nonces of %d and %d bytes, want %d", len(senderNonce), len(recvNonce), sessionNonce)
	}
	if l.wire <= tagSize || l.wire > 1<<24 {
		return nil, fmt.Errorf("chunk of %d bytes cannot carry a sealed chunk", l.wire)
	}
	salt := append(bytes.Clone(senderNonce), recvNonce...)
	key, err := hkdf.Key(sha256.New, psk, salt, keyInfo+sha, 32)
	if err != nil {
		return nil, err
	}
	return &payload{key: key, l: l}, nil
}

func (p *payload) aead() cipher.AEAD {
	b, err := aes.NewCipher(p.key)
	if err != nil {
		panic(err) // a 32-byte key
	}
	a, err := cipher.NewGCM(b)
	if err != nil {
		panic(err)
	}
	return a
}

func gcmNonce(id chunkID, round uint32) []byte {
	var n [12]byte
	binary.BigEndian.PutUint32(n[0:], id.region)
	binary.BigEndian.PutUint32(n[4:], id.chunk)
	binary.BigEndian.PutUint32(n[8:], round)
	return n[:]
}

// CPU returns the CPU time spent sealing or opening.
func (p *payload) CPU() time.Duration { return time.Duration(p.cpu.Load()) }

// parallel runs f over [0, n) split among a few goroutines, each with a
// GCM of its own, and adds the CPU time their threads spent to p.cpu.
func (p *payload) parallel(n int, f func(a cipher.AEAD, lo, hi int)) {
	p.split(n, true, f)
}

// split runs f over [0, n) split among a few goroutines; timed, it adds
// the CPU time their threads spent to p.cpu.
func (p *payload) split(n int, timed bool, f func(a cipher.AEAD, lo, hi int)) {
	w := min(n, runtime.GOMAXPROCS(0), 4)
	var wg sync.WaitGroup
	for k := range w {
		wg.Go(func() {
			var a cipher.AEAD
			if timed {
				// The thread's own clock: the goroutine stays on it.
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				defer func(t time.Duration) { p.cpu.Add(int64(threadCPU() - t)) }(threadCPU())
				a = p.aead()
			}
			f(a, n*k/w, n*(k+1)/w)
		})
	}
	wg.Wait()
}

func threadCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// sealRegion seals region i (pt, its plaintext) into dst, sealedLen(i)
// bytes, for the first transmission.
func (p *payload) sealRegion(dst, pt []byte, i int) {
	l := p.l
	p.parallel(l.chunks(i), func(a cipher.AEAD, lo, hi int) {
		for j := lo; j < hi; j++ {
			off := j * l.plain()
			n := l.chunkLen(i, j)
			a.Seal(dst[j*l.wire:j*l.wire], gcmNonce(chunkID{uint32(i), uint32(j)}, 0), pt[off:off+n], nil)
		}
	})
}

// openRegion opens region i's sealed bytes (ct, opened in place) and
// copies each chunk that verifies to its place in out, the region's
// plaintext; it returns the chunks that did not verify, whose place in out
// is left untouched.
func (p *payload) openRegion(ct, out []byte, i int) []uint32 {
	l := p.l
	n := l.chunks(i)
	ok := make([]bool, n)
	p.parallel(n, func(a cipher.AEAD, lo, hi int) {
		for j := lo; j < hi; j++ {
			c := ct[j*l.wire : j*l.wire+l.chunkLen(i, j)+tagSize]
			_, err := a.Open(c[:0], gcmNonce(chunkID{uint32(i), uint32(j)}, 0), c, nil)
			ok[j] = err == nil
		}
	})
	// The copy, apart: its first writes fault the output's pages in,
	// which a plain transfer pays too (in the receive path), so they are
	// not the encryption's cost.
	p.split(n, false, func(_ cipher.AEAD, lo, hi int) {
		for j := lo; j < hi; j++ {
			if ok[j] {
				copy(out[j*l.plain():], ct[j*l.wire:j*l.wire+l.chunkLen(i, j)])
			}
		}
	})
	var bad []uint32
	for j, v := range ok {
		if !v {
			bad = append(bad, uint32(j))
		}
	}
	p.failed.Add(int64(len(bad)))
	return bad
}

// sealRepair seals the chunks ids for repair round round into dst, one
// per wire-sized slot; plain returns a region's plaintext.
func (p *payload) sealRepair(dst []byte, ids []chunkID, round uint32, plain func(region int) []byte) {
	l := p.l
	p.parallel(len(ids), func(a cipher.AEAD, lo, hi int) {
		for k := lo; k < hi; k++ {
			id := ids[k]
			i, j := int(id.region), int(id.chunk)
			off := j * l.plain()
			slot := dst[k*l.wire : (k+1)*l.wire]
			clear(slot) // the short last chunk's slot is padded with zeros
			a.Seal(slot[:0], gcmNonce(id, round), plain(i)[off:off+l.chunkLen(i, j)], nil)
		}
	})
}

// openRepair opens a repair round's slots (in place) and copies each
// chunk that verifies into out(region); it reports which did.
func (p *payload) openRepair(ct []byte, ids []chunkID, round uint32, out func(region int) []byte) []bool {
	l := p.l
	ok := make([]bool, len(ids))
	p.parallel(len(ids), func(a cipher.AEAD, lo, hi int) {
		for k := lo; k < hi; k++ {
			id := ids[k]
			c := ct[k*l.wire : k*l.wire+l.chunkLen(int(id.region), int(id.chunk))+tagSize]
			_, err := a.Open(c[:0], gcmNonce(id, round), c, nil)
			ok[k] = err == nil
		}
	})
	for k, id := range ids {
		i, j := int(id.region), int(id.chunk)
		if ok[k] {
			copy(out(i)[j*l.plain():], ct[k*l.wire:k*l.wire+l.chunkLen(i, j)])
		} else {
			p.failed.Add(1)
		}
	}
	return ok
}

// A repair request is the receiver's list of chunks that failed their tag,
// in fbSize bytes: "HRPR", the round (1, 2, ...), the count, then each
// chunk as its region and index, all big-endian uint32s, in increasing
// order (so that none is listed twice: the sender seals each once per
// round), and zeros to the end.

// appendRepair encodes a repair request after b, without the padding.
func appendRepair(b []byte, round uint32, ids []chunkID) []byte {
	b = append(b, repairMagic...)
	b = binary.BigEndian.AppendUint32(b, round)
	b = binary.BigEndian.AppendUint32(b, uint32(len(ids)))
	for _, id := range ids {
		b = binary.BigEndian.AppendUint32(b, id.region)
		b = binary.BigEndian.AppendUint32(b, id.chunk)
	}
	return b
}

func isRepair(b []byte) bool { return bytes.HasPrefix(b, []byte(repairMagic)) }

// parseRepair decodes a repair request (untrusted input); bytes after it
// must be zeros.
func parseRepair(b []byte) (round uint32, ids []chunkID, err error) {
	if len(b) < repairHdr || !isRepair(b) {
		return 0, nil, fmt.Errorf("%w: no header", errRepair)
	}
	round = binary.BigEndian.Uint32(b[4:])
	n := binary.BigEndian.Uint32(b[8:])
	switch {
	case round < 1 || round > maxRepairRounds:
		return 0, nil, fmt.Errorf("%w: round %d", errRepair, round)
	case n < 1 || n > maxRepairChunks || len(b) < repairHdr+8*int(n):
		return 0, nil, fmt.Errorf("%w: %d chunks in %d bytes", errRepair, n, len(b))
	}
	body := b[repairHdr : repairHdr+8*int(n)]
	for _, c := range b[repairHdr+len(body):] {
		if c != 0 {
			return 0, nil, fmt.Errorf("%w: bytes after the list", errRepair)
		}
	}
	ids = make([]chunkID, n)
	for k := range ids {
		ids[k] = chunkID{binary.BigEndian.Uint32(body[8*k:]), binary.BigEndian.Uint32(body[8*k+4:])}
		if k > 0 && !ids[k-1].less(ids[k]) {
			return 0, nil, fmt.Errorf("%w: chunks out of order", errRepair)
		}
	}
	return round, ids, nil
}
