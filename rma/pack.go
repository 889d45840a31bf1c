package rma

import (
	"context"
	"sync"

	"github.com/rvma/rvma/verbs"
)

// Small puts into a plain window of another host travel together: each is
// appended to the target's pack (its address, length and bytes) and the
// pack leaves as one WRITE_LIST (verbs.OpWriteList: one packet that the
// target's NIC places run by run, checking each, with no part for its
// progress engine) when it is full or at the next synchronisation towards
// the target (a flush, whose marker follows it on the connection; Complete
// sends it ahead of its message). A stream of 8-byte puts then costs one
// packet per few hundred instead of one each, as MPI's TCP transports
// aggregate. Puts are not ordered with each other before a
// synchronisation (MPI), so a packed put may be overtaken by a larger one
// sent as a WRITE.

const (
	packMax = 256  // the largest put packed
	packCap = 4000 // the longest list: one packet at the loopback MTU (less if the connection's MTU is)
)

// putPack is the puts towards one target waiting to travel together.
type putPack struct {
	mu  sync.Mutex
	buf []byte // a write list (verbs.AppendWriteList)
	n   int    // runs in buf
	cap int    // the list's longest, from the connection's MTU; 0 until the first put
}

// packPut appends a put of b at byte off of target's window to its pack,
// sending the pack first if b would not fit; false if b does not fit even
// an empty list (a connection of a tiny MTU): the put goes as a WRITE.
// The connection is looked up only to size the list and to send it.
func (w *Win) packPut(ctx context.Context, target, off int, b []byte) (bool, error) {
	p := &w.packs[target]
	p.mu.Lock()
	defer p.mu.Unlock()
	need := verbs.WriteListEntry + len(b)
	if p.cap == 0 || len(p.buf)+need > p.cap {
		qp, err := w.c.conn(ctx, target)
		if err != nil {
			return false, err
		}
		if p.cap == 0 {
			p.cap = min(packCap, qp.MTU())
			p.buf = make([]byte, 0, p.cap)
		}
		if need > p.cap {
			return false, nil
		}
		if len(p.buf)+need > p.cap {
			if err := w.sendPackLocked(qp, target, p); err != nil {
				return false, err
			}
		}
	}
	p.buf = verbs.AppendWriteList(p.buf, w.remote[target].addr+uint64(off), b)
	p.n++
	return true, nil
}

// sendPack posts target's pack, if it holds puts, as one unsignalled
// request: the flush's marker follows it.
func (w *Win) sendPack(ctx context.Context, target int) error {
	if w.packs == nil {
		return nil
	}
	p := &w.packs[target]
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n == 0 {
		return nil
	}
	qp, err := w.c.conn(ctx, target)
	if err != nil {
		return err
	}
	return w.sendPackLocked(qp, target, p)
}

func (w *Win) sendPackLocked(qp *verbs.QP, target int, p *putPack) error {
	if p.n == 0 {
		return nil
	}
	wr := [1]verbs.SendWR{{Opcode: verbs.OpWriteList, Flags: verbs.FlagInline | verbs.FlagDefer, Inline: p.buf, RKey: w.remote[target].rkey}}
	p.buf, p.n = p.buf[:0], 0 // copied at post
	return w.postUnsignalled(qp, target, wr[:])
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
