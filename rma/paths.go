package rma

import (
	"context"
	"errors"
	"fmt"

	"github.com/rvma/rvma/mailbox"
	"github.com/rvma/rvma/multipath"
	"github.com/rvma/rvma/reliability"
	"github.com/rvma/rvma/verbs"
)

// Multipath (Config.Paths > 1). Each rank dials its own multipath
// connection to a peer on its first large put or get there, and the peer's
// listener accepts it: a connection is used in one direction only, so two
// ranks never race to set up the same one, and the target side does
// nothing (RDMA writes and reads, and mailbox puts, need no receiver
// involvement). Everything else keeps the per-peer RC connection, which
// orders messages behind the operations they follow.

// listenPaths starts the multipath listener and publishes its address.
func (c *Comm) listenPaths(ctx context.Context) error {
	cfg := c.cfg.Multipath
	cfg.Key = c.key
	cfg.Err = mailbox.CompletionError
	ln, err := multipath.Listen(ctx, c.pd, c.cfg.cmAddr(), &cfg)
	if err != nil {
		return err
	}
	c.mpLn = ln
	if err := c.store.Put(ctx, c.rendezvousKey("mp", c.rank, c.inc), ln.Addr()); err != nil {
		return err
	}
	c.mpWG.Add(1)
	go func() {
		defer c.mpWG.Done()
		for {
			in, err := ln.Accept(context.Background()) // ends when the listener closes
			if err != nil {
				return
			}
			c.mpMu.Lock()
			c.mpIn = append(c.mpIn, in)
			c.mpMu.Unlock()
		}
	}()
	return nil
}

// closePaths closes the multipath listener and every multipath
// connection, dialed or accepted.
func (c *Comm) closePaths() {
	if c.mpLn == nil {
		return
	}
	c.mpLn.Close()
	c.mpWG.Wait()
	c.mpMu.Lock()
	for _, in := range c.mpIn {
		in.Close()
	}
	c.mpIn = nil
	c.mpMu.Unlock()
	for _, p := range c.peers {
		p.closePath()
	}
}

// closePath closes the peer's multipath connection, if any; the next
// large operation dials again.
func (p *peer) closePath() {
	p.mpMu.Lock()
	defer p.mpMu.Unlock()
	if p.mp != nil {
		p.mp.Close()
		p.mp = nil
	}
}

// pathConn returns this rank's multipath connection to rank r, dialing
// and probing it on first use; nil when operations towards r do not
// travel over paths (one path, or r is this rank).
func (c *Comm) pathConn(ctx context.Context, r int) (*multipath.Conn, error) {
	if c.cfg.Paths < 2 || r == c.rank {
		return nil, nil
	}
	p := c.peers[r]
	p.mpMu.Lock()
	defer p.mpMu.Unlock()
	if p.mp != nil {
		return p.mp, nil
	}
	if c.closed() {
		return nil, ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	addr, err := c.lookup(ctx, "mp", r, c.rec.incOf(r))
	if err == nil {
		cfg := c.cfg.Multipath
		cfg.Key = c.key
		cfg.Err = mailbox.CompletionError // notified puts fail with the mailbox's errors
		// Dial probes every path, so the first split is proportional.
		p.mp, err = multipath.Dial(ctx, c.pd, addr, &cfg)
	}
	if err != nil {
		return nil, opErr("connect", r, fmt.Errorf("%w: paths: %w", ErrPeer, err))
	}
	return p.mp, nil
}

// Paths returns the state of every path of this rank's connection to rank
// r (state, capacity estimate, bytes carried, chunk size), or nil when it
// has none: Config.Paths is 1, r is this rank, or no put or get large
// enough to be split has gone to r yet.
func (c *Comm) Paths(r int) []multipath.Stats {
	if r < 0 || r >= c.size {
		return nil
	}
	p := c.peers[r]
	p.mpMu.Lock()
	mc := p.mp
	p.mpMu.Unlock()
	if mc == nil {
		return nil
	}
	return mc.Paths()
}

// peerErr maps the failure of an operation bridged from another layer to
// rma's errors: a multipath connection with no path left, a transport that
// gave up, a reliability connection whose peer went silent or that
// closed, or the Comm ending, are peer failures; refusals (a mailbox's)
// stay what they are.
func peerErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, multipath.ErrPaths), errors.Is(err, verbs.StatusRetryExceeded), errors.Is(err, verbs.StatusFlushed),
		errors.Is(err, reliability.ErrPeer), errors.Is(err, reliability.ErrClosed), errors.Is(err, context.Canceled):
		return fmt.Errorf("%w: %w", ErrPeer, err)
	}
	return err
}

// spreads reports whether a transfer of n bytes towards target, whose
// layouts are both contiguous, may go over the paths. Puts into notified
// windows are decided further by putPerOrigin (which keeps each piece in
// its epoch).
func (w *Win) spreads(target, n int, ol, tl Layout) bool {
	return w.c.cfg.Paths > 1 && target != w.c.rank && w.c.splittable(n, ol, tl)
}

// splittable reports whether a transfer of n bytes is one the paths
// split: large enough, and contiguous on both sides.
func (c *Comm) splittable(n int, ol, tl Layout) bool {
	return n >= c.splitFrom() && ol.Contiguous() && tl.Contiguous()
}

// splitFrom is the smallest transfer split over the paths.
func (c *Comm) splitFrom() int {
	if c.cfg.Multipath.Small > 0 {
		return c.cfg.Multipath.Small
	}
	return 64 << 10 // multipath's default
}

// spread moves b (contiguous) to or from target's window at offset off
// over the paths, as one operation tracked like any other: flushes wait
// for it, and its failure is reported by the next flush.
func (w *Win) spread(ctx context.Context, name string, target int, b []byte, off int, get bool) (*Request, error) {
	mc, err := w.c.pathConn(ctx, target)
	if err != nil {
		return nil, err
	}
	// The region stays registered while the paths move the data.
	w.c.reg.hold()
	held := true
	defer func() {
		if held {
			w.c.reg.release()
		}
	}()
	mr, moff, err := w.c.reg.region(b)
	if err != nil {
		return nil, opErr(name, target, err)
	}
	rw := &w.remote[target]
	var req *multipath.Request
	switch {
	case get:
		req, err = mc.Read(mr, moff, len(b), rw.addr+uint64(off), rw.rkey)
	case rw.notify != 0:
		req, err = mc.Put(mr, moff, len(b), w.mailboxAddr(target), uint64(off))
	default:
		req, err = mc.Write(mr, moff, len(b), rw.addr+uint64(off), rw.rkey)
	}
	if err != nil {
		return nil, opErr(name, target, peerErr(err))
	}
	// The waiter polls the paths' CQ.
	held = false
	return w.bridge(name, target, &w.c.peers[target].pathsDone, func(ctx context.Context) error {
		defer w.c.reg.release()
		return peerErr(req.Wait(ctx))
	}), nil
}
