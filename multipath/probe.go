package multipath

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/cm"
)

// A path is up only once a probe written over its own QP has been
// acknowledged. Connecting a QP proves nothing about the path: the
// connection manager talks over TCP to the listener's address, which is
// reached over whichever route the host picks (path 0's, in a testbed), so
// a revival "succeeds" on a path that still drops everything. Until its
// probe comes back, a path carries no data.

// reviveTimeout bounds a revival: the dialer's attempt (connection and probe)
// and the accepting side's probe. A dead path fails sooner, when its
// probe's retries run out; a slow one needs the time.
const reviveTimeout = 10 * time.Second

// Probe measures each path that is up, one after another, with a timed
// write of ProbeSize bytes into the peer's probe region, and sets the
// path's capacity estimate from it. A path whose probe fails is marked
// down. Dial probes by itself (Config.NoProbe).
func (c *Conn) Probe(ctx context.Context) error {
	for i := range c.cfg.Paths {
		if !c.up(i) {
			continue
		}
		if err := c.probePath(ctx, i, c.qp(i)); ctx.Err() != nil {
			return err
		}
	}
	return nil
}

// probeAll probes every path, up or not (Dial's paths are not up until
// probed), and reports ErrPaths if none answered.
func (c *Conn) probeAll(ctx context.Context) error {
	var last error
	for i := range c.cfg.Paths {
		if err := c.probePath(ctx, i, c.qp(i)); err != nil {
			if ctx.Err() != nil {
				return err
			}
			last = err
		}
	}
	for i := range c.cfg.Paths {
		if c.up(i) {
			return nil
		}
	}
	return fmt.Errorf("%w: %w", ErrPaths, last)
}

// up reports whether path i is up.
func (c *Conn) up(i int) bool {
	up := false
	c.eng.Locked(func() { up = c.paths[i].Up })
	return up
}

// probePath times one probe on qp, path i's QP. Acknowledged, it sets the
// path's capacity and marks it up; failed, it marks the path down. Either
// only if qp is still the path's QP (a revival may have replaced it).
func (c *Conn) probePath(ctx context.Context, i int, qp *verbs.QP) error {
	raddr, rkey := binary.BigEndian.Uint64(c.peerProbe[:]), binary.BigEndian.Uint32(c.peerProbe[8:])
	c.probeMu.Lock()
	start := time.Now()
	op, id := c.eng.Start(1, nil)
	if _, err := qp.PostSend([]verbs.SendWR{{ID: id, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{c.probe.SGE(ProbeSize, ProbeSize)}, RemoteAddr: raddr, RKey: rkey}}); err != nil {
		c.eng.Posted(op, id, 1, 0, err)
	}
	err := op.Wait(ctx)
	if err != nil && ctx.Err() != nil {
		// Given up on: flush the probe so that its Op completes, and the
		// QP is not used half-probed.
		qp.SetError()
	}
	el := time.Since(start).Seconds()
	c.probeMu.Unlock()
	c.eng.Locked(func() {
		if c.qp(i) != qp {
			return
		}
		p := &c.paths[i]
		if err != nil {
			p.Up = false
			return
		}
		p.Capacity = ProbeSize / el
		p.Up = true
	})
	if err != nil {
		return fmt.Errorf("multipath: probe path %d: %w", i, err)
	}
	return nil
}

// install makes qp path i's QP (after a revival) and destroys the old one,
// flushed first so that what it still held completes and moves to other
// paths. The path is down until its probe over qp succeeds; its counters
// carry on. It reports false, destroying qp, if the Conn is closing.
func (c *Conn) install(i int, qp *verbs.QP) bool {
	c.lifeMu.Lock()
	defer c.lifeMu.Unlock()
	if c.closing {
		qp.Destroy()
		return false
	}
	c.eng.Locked(func() {
		p := &c.paths[i]
		p.Up, p.Capacity = false, 0
		p.chunk, p.linear, p.lastDone = c.cfg.MinChunk, false, time.Time{}
	})
	c.qmu.Lock()
	old := c.qps[i]
	c.qps[i] = qp
	c.qmu.Unlock()
	if old != nil {
		old.SetError()
		old.Destroy()
	}
	if i == 0 {
		c.postCtlRecvs(qp)
	}
	return true
}

// Revive connects path i anew (it failed: its QP is in error) and probes
// it over the new QP; the path is up again only once that probe is
// acknowledged, and carries nothing before. A path that is up is left
// alone. Only the dialing side revives (ErrAccepted otherwise); it does
// so periodically by itself (Config.Revive), backing off while attempts
// fail.
func (c *Conn) Revive(ctx context.Context, i int) error {
	if c.addr == "" {
		return ErrAccepted
	}
	if i < 0 || i >= c.cfg.Paths {
		return fmt.Errorf("multipath: revive path %d of %d: %w", i, c.cfg.Paths, verbs.ErrInvalidArgument)
	}
	c.reviveMu[i].Lock()
	defer c.reviveMu[i].Unlock()
	if c.up(i) {
		return nil
	}
	qp, err := c.newQP(i)
	if err != nil {
		return fmt.Errorf("multipath: revive path %d: %w", i, err)
	}
	if _, err := cm.Dial(ctx, c.addr, qp, &cm.Config{Connect: &c.cfg.Connect, PrivateData: hello(c.id, i, c.cfg.Paths, c.probeRef()), Key: c.cfg.Key}); err != nil {
		qp.Destroy()
		return fmt.Errorf("multipath: revive path %d: %w", i, err)
	}
	if !c.install(i, qp) {
		return fmt.Errorf("multipath: revive path %d: %w", i, verbs.ErrClosed)
	}
	return c.probePath(ctx, i, qp)
}

// reviver tries, every Config.Revive, to revive the paths that are down
// and due: a path whose attempts keep failing backs off.
func (c *Conn) reviver() {
	t := time.NewTicker(c.cfg.Revive)
	defer t.Stop()
	waits := make([]backoff, c.cfg.Paths)
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		for i := range waits {
			c.reviveDue(i, &waits[i])
		}
	}
}

// reviveDue attempts path i's revival if it is down and its back-off has
// run out.
func (c *Conn) reviveDue(i int, b *backoff) {
	if c.up(i) {
		b.reset()
		return
	}
	if !b.due(time.Now()) {
		return
	}
	ctx, cancel := c.stopCtx(reviveTimeout)
	defer cancel()
	if err := c.Revive(ctx, i); err != nil {
		b.failed(time.Now(), c.cfg.Revive, c.cfg.ReviveMax)
		return
	}
	b.reset()
}

// backoff schedules one path's revival attempts: after each failure the
// wait doubles, from base up to limit; a success resets it.
type backoff struct {
	wait time.Duration // after the last failure; 0: none yet
	next time.Time     // no attempt before
}

func (b *backoff) due(now time.Time) bool { return !now.Before(b.next) }

func (b *backoff) failed(now time.Time, base, limit time.Duration) {
	b.wait = min(max(2*b.wait, base), limit)
	b.next = now.Add(b.wait)
}

func (b *backoff) reset() { *b = backoff{} }
