package rma

import (
	"context"
	"encoding/binary"
	"sync"

	"github.com/rvma/rvma/verbs"
)

// Small puts into a plain window of another host travel together: each is
// appended to the target's pack (its offset, length and bytes) and the
// pack leaves as one active message, which the target applies and
// answers, when it is full or at the next synchronisation towards the
// target (a flush; Complete sends it ahead of its message, which the
// target handles after it). A stream of 8-byte puts then costs one packet
// per few hundred instead of one each, as MPI's TCP transports aggregate.
// Puts are not ordered with each other before a synchronisation (MPI), so
// a packed put may be overtaken by a larger one sent as a WRITE.

const (
	packMax   = 256  // the largest put packed
	packCap   = 4000 // bytes of entries per pack: one packet at the loopback MTU
	packEntry = 8 + 2
	// packFew is the most puts a flush finds in a pack and sends as
	// WRITEs rather than as a message: a lone put and its flush then
	// cost what they did before packing (no trip through the target's
	// progress engine).
	packFew = 2
)

// putPack is the puts towards one target waiting to travel together.
type putPack struct {
	mu  sync.Mutex
	buf []byte // entries: offset (8 bytes), length (2), bytes
	n   int    // entries in buf
}

// packPut appends a put of b at byte off of target's window to its pack,
// sending the pack first if b would not fit.
func (w *Win) packPut(ctx context.Context, target, off int, b []byte) error {
	p := &w.packs[target]
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.buf)+packEntry+len(b) > packCap {
		if err := w.sendPackLocked(ctx, target, p); err != nil {
			return err
		}
	}
	if p.buf == nil {
		p.buf = make([]byte, 0, packCap)
	}
	p.buf = binary.LittleEndian.AppendUint64(p.buf, uint64(off))
	p.buf = binary.LittleEndian.AppendUint16(p.buf, uint16(len(b)))
	p.buf = append(p.buf, b...)
	p.n++
	return nil
}

// sendPack sends target's pack, if it holds puts (as WRITEs if few, for
// the flush's marker to follow: see packFew); the active message counts
// among the window's operations until the target answers, so a flush
// waits for it.
func (w *Win) sendPack(ctx context.Context, target int) error {
	if w.packs == nil {
		return nil
	}
	p := &w.packs[target]
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == 0 || p.n > packFew {
		return w.sendPackLocked(ctx, target, p)
	}
	qp, err := w.c.conn(ctx, target)
	if err != nil {
		return err
	}
	var wrs [packFew]verbs.SendWR
	k := 0
	for d := p.buf; len(d) > 0; k++ {
		off, n := binary.LittleEndian.Uint64(d), int(binary.LittleEndian.Uint16(d[8:]))
		wrs[k] = w.putTo(target, int(off))
		wrs[k].Flags |= verbs.FlagInline | verbs.FlagDefer
		wrs[k].Inline = d[packEntry : packEntry+n] // copied at post
		d = d[packEntry+n:]
	}
	p.buf, p.n = p.buf[:0], 0
	return w.postUnsignalled(qp, target, wrs[:k])
}

func (w *Win) sendPackLocked(ctx context.Context, target int, p *putPack) error {
	if p.n == 0 {
		return nil
	}
	_, err := w.am(ctx, "put", target, amHdr{kind: amPuts}, nil, p.buf)
	p.buf, p.n = p.buf[:0], 0 // the message was copied
	return err
}

// dropPacks forgets the puts waiting in packs (Recover).
func (w *Win) dropPacks() {
	for i := range w.packs {
		p := &w.packs[i]
		p.mu.Lock()
		p.buf, p.n = p.buf[:0], 0
		p.mu.Unlock()
	}
}

// applyPuts places a pack's puts into mem, once every entry is checked:
// a bad one refuses the whole pack, nothing placed.
func applyPuts(mem, data []byte) byte {
	for d := data; len(d) > 0; {
		if len(d) < packEntry {
			return amBadType
		}
		off, n := binary.LittleEndian.Uint64(d), int(binary.LittleEndian.Uint16(d[8:]))
		if len(d) < packEntry+n {
			return amBadType
		}
		if !fits(off, n, len(mem)) {
			return amBounds
		}
		d = d[packEntry+n:]
	}
	for d := data; len(d) > 0; {
		off, n := binary.LittleEndian.Uint64(d), int(binary.LittleEndian.Uint16(d[8:]))
		copy(mem[off:off+uint64(n)], d[packEntry:packEntry+n])
		d = d[packEntry+n:]
	}
	return amOK
}
