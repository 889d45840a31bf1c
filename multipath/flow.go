package multipath

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rvma/rvma/internal/progress"
	"github.com/rvma/rvma/verbs"
)

// Request is a request in flight; it completes once, when all of its
// sub-flows have.
type Request struct{ op *progress.Op }

// Wait blocks until the request completes or ctx ends.
func (r *Request) Wait(ctx context.Context) error { return r.op.Wait(ctx) }

// Test reports whether the request has completed, and how.
func (r *Request) Test() (bool, error) { return r.op.Test() }

// Write writes n bytes of mr from off to the peer's (raddr, rkey), split
// over the paths by the balancer. When a path fails, the part of its
// sub-flow that it had not delivered (the chunks whose work requests did
// not complete) is written again over the paths still up, split by the
// balancer (a write is idempotent by offset).
func (c *Conn) Write(mr *verbs.MR, off, n int, raddr uint64, rkey uint32) (*Request, error) {
	return c.post(n, true, func(sub, at int) verbs.SendWR {
		return verbs.SendWR{Opcode: verbs.OpWrite, SGL: []verbs.SGE{mr.SGE(off+at, sub)}, RemoteAddr: raddr + uint64(at), RKey: rkey}
	})
}

// Read reads n bytes from the peer's (raddr, rkey) into mr at off; like
// Write, it survives the failure of a path, reading again only what the
// failed path had not.
func (c *Conn) Read(mr *verbs.MR, off, n int, raddr uint64, rkey uint32) (*Request, error) {
	return c.post(n, true, func(sub, at int) verbs.SendWR {
		return verbs.SendWR{Opcode: verbs.OpRead, SGL: []verbs.SGE{mr.SGE(off+at, sub)}, RemoteAddr: raddr + uint64(at), RKey: rkey}
	})
}

// Put puts n bytes of mr from off into the peer's mailbox at offset:
// each path's sub-flow is placed by its own offset and counted once, so
// no reassembly and no ordering between paths is needed. Each chunk of
// each sub-flow is one mailbox write, so a target that counts operations
// rather than bytes sees that many. A sub-flow whose
// path fails is not sent again: part of it may have been counted, and
// counting it twice would complete the target's epoch early (the
// reliability layer's chunk bitmaps are what will make that safe); the
// request fails instead.
func (c *Conn) Put(mr *verbs.MR, off, n int, mbox, offset uint64) (*Request, error) {
	return c.post(n, false, func(sub, at int) verbs.SendWR {
		return verbs.SendWR{Opcode: verbs.OpMailboxWrite, SGL: []verbs.SGE{mr.SGE(off+at, sub)}, Mailbox: mbox, MailboxOffset: offset + uint64(at)}
	})
}

// FetchAdd adds add to the 8-byte word at the peer's (raddr, rkey) on one
// path (the balancer's pick) and returns the previous value in mr at off.
// An atomic whose path fails is not re-issued (it may have executed).
func (c *Conn) FetchAdd(mr *verbs.MR, off int, raddr uint64, rkey uint32, add uint64) (*Request, error) {
	return c.postOn(8, false, true, func(int, int) verbs.SendWR {
		return verbs.SendWR{Opcode: verbs.OpFetchAdd, SGL: []verbs.SGE{mr.SGE(off, 8)}, RemoteAddr: raddr, RKey: rkey, CompareAdd: add}
	})
}

// CompareSwap replaces the 8-byte word at the peer's (raddr, rkey) with
// swap if it equals cmp, on one path, and returns the previous value in mr
// at off.
func (c *Conn) CompareSwap(mr *verbs.MR, off int, raddr uint64, rkey uint32, cmp, swap uint64) (*Request, error) {
	return c.postOn(8, false, true, func(int, int) verbs.SendWR {
		return verbs.SendWR{Opcode: verbs.OpCompareSwap, SGL: []verbs.SGE{mr.SGE(off, 8)}, RemoteAddr: raddr, RKey: rkey, CompareAdd: cmp, Swap: swap}
	})
}

// flow is one request's bookkeeping; guarded by the engine's lock.
type flow struct {
	parent  *progress.Op
	left    int // sub-flows not yet finished
	err     error
	reissue bool // a failed sub-flow's undelivered part may be sent again
	whole   bool // never split or chunked (atomics)
	wr      func(sub, at int) verbs.SendWR
}

// sub is one sub-flow: n bytes at offset at of its request, on one path,
// posted as work requests of at most chunk bytes, each its own Op, so that
// a failure tells which chunks arrived. Guarded by the engine's lock once
// created.
type sub struct {
	f       *flow
	path    int
	qp      *verbs.QP // the path's QP when the sub-flow was assigned
	at, n   int
	chunk   int
	left    int // chunks not yet completed
	posted  time.Time
	losses  uint64 // the QP's loss count when posted
	err     error  // the first failure, a flush only if nothing else
	missing []span // failed chunks, in offset order, adjacent ones merged
}

// span is a byte range of a request.
type span struct{ at, n int }

// maxSubWRs bounds a sub-flow's work requests (its chunk grows to fit),
// so that a few large sub-flows fit a QP's send queue (newQP's MaxSendWR).
const maxSubWRs = 1024

func (c *Conn) states() []PathState {
	states := make([]PathState, len(c.paths))
	for i, p := range c.paths {
		states[i] = p.PathState
	}
	return states
}

// post splits n bytes into sub-flows and posts them; wr builds the work
// request for sub bytes at offset at.
func (c *Conn) post(n int, reissue bool, wr func(sub, at int) verbs.SendWR) (*Request, error) {
	return c.postOn(n, reissue, false, wr)
}

// postOn is post; with whole the request goes on one path, never split
// or chunked (atomics).
func (c *Conn) postOn(n int, reissue, whole bool, wr func(sub, at int) verbs.SendWR) (*Request, error) {
	f := &flow{reissue: reissue, whole: whole, wr: wr}
	var subs []*sub
	ok := false
	c.eng.Locked(func() {
		shares := c.assignLocked(n, whole)
		if ok = shares != nil; ok {
			subs = c.subsLocked(f, shares, 0)
		}
	})
	if !ok {
		return nil, ErrPaths
	}
	// Nothing completes before it is posted, below.
	f.parent, _ = c.eng.Start(0, nil)
	if len(subs) == 0 { // an empty request
		c.eng.Finish(f.parent, nil)
	}
	for _, s := range subs {
		c.submit(s)
	}
	return &Request{op: f.parent}, nil
}

// assignLocked decides which paths carry n bytes (the balancer's split,
// or its pick for a small or whole request) and counts them as
// outstanding there at once, so that the next decision, in the same burst
// of failures or requests, sees them. It returns nil if no path is up (or
// the balancer gave bytes to a path that is down).
func (c *Conn) assignLocked(n int, whole bool) []int {
	states := c.states()
	var shares []int
	if whole || n < c.cfg.Small {
		shares = make([]int, len(states))
		if i := c.cfg.Balancer.Pick(states); i >= 0 && i < len(shares) {
			shares[i] = n
		}
	} else {
		shares = c.cfg.Balancer.Split(n, states)
	}
	if len(shares) != len(c.paths) || sumInts(shares) != n {
		return nil
	}
	for i, s := range shares {
		if s != 0 && (s < 0 || !c.paths[i].Up) {
			return nil // a down path's QP would flush it back at once
		}
	}
	for i, s := range shares {
		c.paths[i].Outstanding += s
	}
	return shares
}

// subsLocked makes f's sub-flows for shares of the bytes from base, and
// counts them in f and in the paths' posted bytes.
func (c *Conn) subsLocked(f *flow, shares []int, base int) []*sub {
	var subs []*sub
	at := base
	for i, n := range shares {
		if n == 0 {
			continue
		}
		p := &c.paths[i]
		chunk := max(p.chunk, (n+maxSubWRs-1)/maxSubWRs)
		if f.whole {
			chunk = n
		}
		s := &sub{f: f, path: i, qp: c.qp(i), at: at, n: n, chunk: chunk, left: (n + chunk - 1) / chunk}
		p.posted += uint64(n)
		subs = append(subs, s)
		at += n
	}
	f.left += len(subs)
	return subs
}

// span returns the offset and length of chunk k.
func (s *sub) span(k int) (int, int) {
	off := k * s.chunk
	return s.at + off, min(s.chunk, s.n-off)
}

// submit posts a sub-flow's chunks, each its own Op.
func (c *Conn) submit(s *sub) {
	s.posted, s.losses = time.Now(), lossCount(s.qp)
	wrs := make([]verbs.SendWR, s.left)
	ops := make([]*progress.Op, s.left)
	for k := range wrs {
		at, n := s.span(k)
		op, id := c.eng.Start(1, func(err error) { c.chunkDone(s, k, err) })
		wrs[k] = s.f.wr(n, at)
		wrs[k].ID, wrs[k].Flags = id, verbs.FlagSignaled
		ops[k] = op
	}
	if k, err := s.qp.PostSend(wrs); err != nil {
		for j := k; j < len(wrs); j++ {
			c.eng.Posted(ops[j], wrs[j].ID, 1, 0, err)
		}
	}
}

// nextChunk is a path's chunk size after a sub-flow: halved on a loss
// (and growing linearly from then on), doubled while the path has been
// clean, within [lo, hi].
func nextChunk(chunk, lo, hi int, linear, lost bool) (int, bool) {
	switch {
	case lost:
		return max(lo, chunk/2), true
	case linear:
		return min(hi, chunk+lo), true
	default:
		return min(hi, 2*chunk), false
	}
}

func lossCount(qp *verbs.QP) uint64 {
	s := qp.Stats()
	return s.Timeouts + s.SeqNaks
}

// chunkDone accounts for one completed chunk; the engine's lock is held.
func (c *Conn) chunkDone(s *sub, k int, err error) {
	at, n := s.span(k)
	p := &c.paths[s.path]
	p.Outstanding -= n
	if err == nil {
		p.bytes += uint64(n)
	} else {
		s.fail(at, n, err)
	}
	if s.left--; s.left == 0 {
		c.subDone(s)
	}
}

// fail records a failed chunk.
func (s *sub) fail(at, n int, err error) {
	if s.err == nil || errors.Is(s.err, verbs.StatusFlushed) && !errors.Is(err, verbs.StatusFlushed) {
		s.err = err // the cause, not the flushes it caused
	}
	if k := len(s.missing) - 1; k >= 0 && s.missing[k].at+s.missing[k].n == at {
		s.missing[k].n += n
		return
	}
	s.missing = append(s.missing, span{at, n})
}

// movable reports whether a failure is the path's, so that the bytes may
// go over another: the transport gave up, or the QP was flushed or is
// gone. A refusal (wrong key, out of bounds) would be refused there too.
func movable(err error) bool {
	return errors.Is(err, verbs.StatusRetryExceeded) || errors.Is(err, verbs.StatusFlushed) ||
		errors.Is(err, verbs.ErrQPState) || errors.Is(err, verbs.ErrClosed)
}

// subDone accounts for a finished sub-flow; the engine's lock is held.
func (c *Conn) subDone(s *sub) {
	f := s.f
	// Completions of a QP that a revival has replaced say nothing of the
	// path's new QP.
	current := s.qp == c.qp(s.path)
	switch {
	case s.err == nil:
		if current {
			c.measured(s)
		}
	case f.reissue && movable(s.err):
		if current {
			c.paths[s.path].Up = false // the QP is in error until revived
		}
		if !c.reissueLocked(s) && f.err == nil {
			f.err = fmt.Errorf("multipath: path %d: %w (%w)", s.path, s.err, ErrPaths)
		}
	default:
		// A full send queue leaves the QP as it was; anything else put
		// it in error.
		if current && !errors.Is(s.err, verbs.ErrQueueFull) {
			c.paths[s.path].Up = false
		}
		if f.err == nil {
			f.err = fmt.Errorf("multipath: path %d: %w", s.path, s.err)
		}
	}
	if f.left--; f.left == 0 {
		c.eng.FinishLocked(f.parent, f.err)
	}
}

// reissueLocked sends what a failed sub-flow did not deliver over the
// paths still up, split by the balancer; it reports false if some of it
// found no path.
func (c *Conn) reissueLocked(s *sub) bool {
	var subs []*sub
	ok := true
	for _, m := range s.missing {
		shares := c.assignLocked(m.n, false)
		if shares == nil {
			ok = false
			break
		}
		for i, n := range shares {
			c.paths[i].reissued += uint64(n)
		}
		subs = append(subs, c.subsLocked(s.f, shares, m.at)...)
	}
	if len(subs) > 0 {
		// Posting needs the engine's lock, held here: do it from
		// another goroutine.
		go func() {
			for _, r := range subs {
				c.submit(r)
			}
		}()
	}
	return ok
}

// measured updates a path after a sub-flow it delivered whole: its chunk
// size, and its capacity from the time the path spent on the sub-flow.
func (c *Conn) measured(s *sub) {
	p := &c.paths[s.path]
	p.chunk, p.linear = nextChunk(p.chunk, c.cfg.MinChunk, c.cfg.MaxChunk, p.linear, lossCount(s.qp) > s.losses)
	now := time.Now()
	start := s.posted
	if p.lastDone.After(start) {
		start = p.lastDone // it waited behind earlier sub-flows
	}
	if el := now.Sub(start).Seconds(); el > 0 && s.n >= 64<<10 {
		sample := float64(s.n) / el
		if p.Capacity == 0 {
			p.Capacity = sample
		} else {
			p.Capacity += c.cfg.EWMA * (sample - p.Capacity)
		}
	}
	p.lastDone = now
}

func sumInts(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}
