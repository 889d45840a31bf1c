package rma

import (
	"context"

	"github.com/rvma/rvma/verbs"
)

// A window reaches each peer through one carrier, chosen the first time
// the window moves data to or from that peer, from how the peer is
// reached: its memory mapped here (shm, directCarrier), the RC connection
// (rcCarrier), or, with Config.Paths > 1, the multipath connection for
// large transfers in front of one of those (pathsCarrier). Win's puts
// into plain windows, its gets and its CPU atomics call the carrier
// instead of asking, operation by operation, which way the peer is
// reached. Puts into notified windows take the epoch layer first
// (notifytx.go, longhaul.go), which keeps them in their epochs whatever
// carries them.
//
// A carrier holds no lock across calls; the state it uses (a mapping,
// the QP, the multipath connection, the put packs) has its own.
type carrier interface {
	// put moves x into the peer's window. It returns no request when the
	// put is done already, or travels unsignalled to be completed by the
	// next flush (x.signal false).
	put(ctx context.Context, x xfer) (*Request, error)
	// get moves the peer's window into x.origin; no request when done.
	get(ctx context.Context, x xfer) (*Request, error)
	// mem returns the peer's window mapped here, for CPU atomics, while
	// accesses through it are right; nil otherwise.
	mem() []byte
}

// xfer is one put or get, checked already: the origin buffer and both
// layouts (normalised), the byte offset in the target's window, and
// whether the caller wants a request that completes with it.
type xfer struct {
	origin []byte
	ol, tl Layout
	off    int
	signal bool
}

// carrier returns target's carrier, choosing it at the first call.
func (w *Win) carrier(ctx context.Context, target int) carrier {
	c := w.carriers[target].Load()
	if c == nil {
		c = w.chooseCarrier(ctx, target)
	}
	return *c
}

// chooseCarrier picks target's carrier once (Recover forgets it for a
// rank that changed).
func (w *Win) chooseCarrier(ctx context.Context, target int) *carrier {
	w.carrierMu.Lock()
	defer w.carrierMu.Unlock()
	if c := w.carriers[target].Load(); c != nil {
		return c
	}
	rc := &rcCarrier{w: w, target: target}
	var c carrier = rc
	if w.mapped(ctx, target); w.direct[target].state.Load() == directMapped {
		c = &directCarrier{rc: rc, d: &w.direct[target]}
	}
	if w.c.cfg.Paths > 1 && target != w.c.rank {
		c = &pathsCarrier{w: w, target: target, near: c}
	}
	w.carriers[target].Store(&c)
	return &c
}

// forgetCarriers makes the next access to each changed rank choose its
// carrier again (Recover, while no operation runs).
func (w *Win) forgetCarriers(changed []bool) {
	for r, ch := range changed {
		if ch && w.carriers != nil {
			w.carriers[r].Store(nil)
		}
	}
}

// rcCarrier moves data over the RC connection to the peer: small puts
// packed into write lists (pack.go), strided puts and gets of tiny blocks
// as one message the target unpacks or packs, the rest as WRITEs and
// READs.
type rcCarrier struct {
	w      *Win
	target int
}

func (r *rcCarrier) put(ctx context.Context, x xfer) (*Request, error) {
	w, target := r.w, r.target
	if !x.signal && x.tl.Size() <= packMax && x.ol.Contiguous() && x.tl.Contiguous() && target != w.c.rank {
		packed, err := w.packPut(ctx, target, x.off, x.origin[:x.tl.Size()])
		if err != nil {
			return nil, opErr("put", target, err)
		}
		if packed {
			return nil, nil
		}
	}
	if !x.tl.Contiguous() && x.tl.Block < smallBlock {
		return w.putPacked(ctx, x.origin, x.ol, target, x.off, x.tl)
	}
	return w.postPut(ctx, target, x)
}

func (r *rcCarrier) get(ctx context.Context, x xfer) (*Request, error) {
	if !x.tl.Contiguous() && x.tl.Block < smallBlock && x.ol.Contiguous() && x.tl.Size() <= gatherMax {
		return r.w.getGathered(ctx, x.origin, r.target, x.off, x.tl)
	}
	return r.w.postGet(ctx, r.target, x)
}

func (r *rcCarrier) mem() []byte { return nil }

// pathsCarrier sends contiguous transfers of Multipath.Small bytes and
// more over the multipath connection, split across the paths, and the
// rest through near, the carrier the peer has without paths.
type pathsCarrier struct {
	w      *Win
	target int
	near   carrier
}

func (p *pathsCarrier) far(x xfer) bool {
	return p.w.c.splittable(x.tl.Size(), x.ol, x.tl)
}

func (p *pathsCarrier) put(ctx context.Context, x xfer) (*Request, error) {
	if p.far(x) {
		return p.w.spread(ctx, "put", p.target, x.origin[:x.ol.Size()], x.off, false)
	}
	return p.near.put(ctx, x)
}

func (p *pathsCarrier) get(ctx context.Context, x xfer) (*Request, error) {
	if p.far(x) {
		return p.w.spread(ctx, "get", p.target, x.origin[:x.ol.Size()], x.off, true)
	}
	return p.near.get(ctx, x)
}

func (p *pathsCarrier) mem() []byte { return p.near.mem() }

// postPut posts x as WRITEs (mailbox writes into a notified window) on
// the RC connection to target: signalled with a request if x.signal,
// else unsignalled for the next flush's marker to complete.
func (w *Win) postPut(ctx context.Context, target int, x xfer) (*Request, error) {
	qp, err := w.c.conn(ctx, target)
	if err != nil {
		return nil, err
	}
	var one [1]verbs.SendWR // a contiguous put's only request, on the stack
	w.c.reg.hold()
	defer w.c.reg.release() // after the post
	wrs, err := w.putWRs(one[:0], x.origin, x.ol, target, x.off, x.tl)
	if err != nil {
		return nil, opErr("put", target, err)
	}
	if !x.signal {
		if w.remote[target].notify == 0 {
			// Nothing happens at the target before a synchronisation
			// (fence, complete, unlock, flush) whose marker follows: the
			// put may wait for it, so a run of small puts leaves in one
			// batch. A notified window's puts are their own signal.
			wrs[len(wrs)-1].Flags |= verbs.FlagDefer
		}
		return nil, w.postUnsignalled(qp, target, wrs)
	}
	return w.postOps("put", qp, target, wrs, nil)
}

// postGet posts x as READs on the RC connection to target.
func (w *Win) postGet(ctx context.Context, target int, x xfer) (*Request, error) {
	qp, err := w.c.conn(ctx, target)
	if err != nil {
		return nil, err
	}
	rw := &w.remote[target]
	var wrs []verbs.SendWR
	last := -1
	var perr error
	var mr *verbs.MR // the previous block's region: most blocks share one
	w.c.reg.hold()
	defer w.c.reg.release() // after the post
	segments(x.ol, x.tl, func(s seg) {
		var sge verbs.SGE
		var err error
		if mr, sge, err = w.c.reg.sgeNear(mr, x.origin[s.o:s.o+s.n]); err != nil {
			perr = err
			return
		}
		if n := len(wrs); n > 0 && len(wrs[n-1].SGL) < maxSGE && last == s.t {
			wrs[n-1].SGL = append(wrs[n-1].SGL, sge)
		} else {
			wrs = append(wrs, verbs.SendWR{Opcode: verbs.OpRead, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{sge},
				RemoteAddr: rw.addr + uint64(x.off+s.t), RKey: rw.rkey})
		}
		last = s.t + s.n
	})
	if perr != nil {
		return nil, opErr("get", target, perr)
	}
	if len(wrs) == 0 {
		return nil, nil
	}
	return w.postOps("get", qp, target, wrs, w.reads)
}
