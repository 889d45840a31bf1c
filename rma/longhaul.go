package rma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/rvma/rvma/internal/progress"
	"github.com/rvma/rvma/mailbox"
	"github.com/rvma/rvma/reliability"
	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/cm"
)

// EnvLongHaul selects the peers reached over the reliability layer when
// Config.LongHaul is nil: "all", or a comma-separated list of ranks.
const EnvLongHaul = "RVMA_LONGHAUL"

// LongHaulConfig sends the puts into notified windows toward some peers
// over the reliability layer (SDR-RDMA: unreliable-connected writes, a
// chunk bitmap per put, selective repeat or erasure coding chosen by a
// model of the link) instead of the RC connection, whose go-back-N
// collapses on long, lossy links. Each rank connects its own reliability
// connection to such a peer on its first put there; the peer places the
// puts straight into the window's mailbox buffers and counts each once,
// when all of its chunks are in place. Everything else (plain windows,
// gets, accumulates, atomics, synchronisation) stays on the RC connection.
type LongHaulConfig struct {
	// Peers selects the ranks reached this way. Default (nil): every other
	// rank.
	Peers func(rank int) bool
	// Reliability configures every such connection: chunk size, rate to
	// pace at, scheme, RTT prior, peer timeout. Default: reliability's.
	Reliability reliability.Config
}

// longHaulFromEnv reads RVMA_LONGHAUL.
func longHaulFromEnv() (*LongHaulConfig, error) {
	v := strings.TrimSpace(os.Getenv(EnvLongHaul))
	switch v {
	case "":
		return nil, nil
	case "all":
		return &LongHaulConfig{}, nil
	}
	set := map[int]bool{}
	for _, f := range strings.Split(v, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || r < 0 {
			return nil, fmt.Errorf("%w: %s=%q: want \"all\" or ranks, comma-separated", ErrBootstrap, EnvLongHaul, v)
		}
		set[r] = true
	}
	return &LongHaulConfig{Peers: func(r int) bool { return set[r] }}, nil
}

// longHaul reports whether notified puts towards r use the reliability
// layer.
func (c *Comm) longHaul(r int) bool {
	lh := c.cfg.LongHaul
	return lh != nil && r != c.rank && (lh.Peers == nil || lh.Peers(r))
}

// haulLink is one reliability connection and what it runs on.
type haulLink struct {
	cq   *verbs.CQ
	qp   *verbs.QP
	conn *reliability.Conn
}

func (h *haulLink) close() {
	if h == nil {
		return
	}
	if h.conn != nil {
		h.conn.Close()
	}
	if h.qp != nil {
		h.qp.Destroy()
	}
	if h.cq != nil {
		h.cq.Close()
	}
}

// haulPeer is the header and data connections toward (or from) a peer.
// It is built under the dialing peer's haulMu, or under c.haulMu while
// half of an accepted pair waits in c.haulHalf; once complete it is
// read-only.
type haulPeer struct {
	hdr, data *haulLink
	in        *mailbox.ReliableInitiator // the dialing side's
}

func (h *haulPeer) close() {
	h.hdr.close()
	h.data.close()
}

func (h *haulPeer) conns() mailbox.Reliable {
	return mailbox.Reliable{Header: h.hdr.conn, Data: h.data.conn}
}

// newHaulLink creates the CQ and UC QP of a reliability connection.
func (c *Comm) newHaulLink() (*haulLink, error) {
	h := &haulLink{}
	var err error
	if h.cq, err = c.dev.CreateCQ(verbs.CQConfig{Capacity: 4 * reliability.DefaultRecvDepth}); err != nil {
		return nil, err
	}
	if h.qp, err = c.pd.CreateQP(reliability.QPConfig(h.cq, c.cfg.LongHaul.Reliability)); err != nil {
		h.close()
		return nil, err
	}
	return h, nil
}

// Long-haul connection requests carry the dialer's rank and which of the
// pair they are.
const (
	haulHeader = 'H'
	haulData   = 'D'
)

func haulHello(rank int, which byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(rank)), which)
}

// haulMTU caps a long-haul connection's packets where neither Config.MTU
// nor Connect.MTU sets them: RoCE's 4096, not the interface's largest
// (rma's UDP ports carry 61440 on loopback). A long-haul link's unit of
// loss and repair is a packet (a chunk): larger ones lose more a loss,
// pace in coarser steps and make erasure groups of megabytes (a notified
// 8-byte put took 433 us against 245 with 61440).
const haulMTU = 4096

// haulConnect is the QP attributes of long-haul connections, both ends
// alike (their path MTU must agree).
func (c *Comm) haulConnect() *verbs.ConnectConfig {
	cc := c.cfg.Connect
	if cc.MTU == 0 && c.cfg.MTU == 0 {
		cc.MTU = haulMTU
	}
	return &cc
}

// haulInitiator returns this rank's reliability connections to r, dialing
// them on first use.
func (c *Comm) haulInitiator(ctx context.Context, r int) (*mailbox.ReliableInitiator, error) {
	p := c.peers[r]
	p.haulMu.Lock()
	defer p.haulMu.Unlock()
	if p.haul != nil {
		return p.haul.in, nil
	}
	if c.closed() {
		return nil, ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	fail := func(err error) error { return opErr("connect", r, fmt.Errorf("%w: long-haul: %w", ErrPeer, err)) }
	addr, err := c.lookup(ctx, "cm", r, c.rec.incOf(r))
	if err != nil {
		return nil, fail(err)
	}
	h := &haulPeer{}
	for _, which := range []byte{haulHeader, haulData} {
		l, err := c.newHaulLink()
		if err == nil {
			_, err = cm.Dial(ctx, addr, l.qp, &cm.Config{Connect: c.haulConnect(), PrivateData: haulHello(c.rank, which), Key: c.key})
			if err == nil {
				if l.conn, err = reliability.New(c.pd, l.qp, l.cq, c.cfg.LongHaul.Reliability); err == nil {
					err = l.conn.Ready(ctx) // a first RTT measurement
				}
			}
			if err != nil {
				l.close()
			}
		}
		if err != nil {
			h.close()
			return nil, fail(err)
		}
		if which == haulHeader {
			h.hdr = l
		} else {
			h.data = l
		}
	}
	h.in = mailbox.NewReliableInitiator(h.conns())
	p.haul = h
	return h.in, nil
}

// acceptHaul accepts one of the two connections a peer dials for its
// long-haul puts; once both have arrived, their puts go into this rank's
// mailbox target until the Comm closes.
func (c *Comm) acceptHaul(ctx context.Context, req *cm.Request, r int, which byte) {
	l, err := c.newHaulLink()
	if err != nil {
		req.Reject(err.Error())
		return
	}
	if err = req.Accept(ctx, l.qp, &cm.Config{Connect: c.haulConnect()}); err == nil {
		l.conn, err = reliability.New(c.pd, l.qp, l.cq, c.cfg.LongHaul.Reliability)
	}
	if err != nil {
		c.cfg.Logger.Debug("rma: long-haul accept failed", "rank", c.rank, "peer", r, "err", err)
		l.close()
		return
	}
	c.haulMu.Lock()
	if c.closed() {
		c.haulMu.Unlock()
		l.close()
		return
	}
	h := c.haulHalf[r]
	if h == nil {
		h = &haulPeer{}
		c.haulHalf[r] = h
	}
	old := &h.hdr
	if which == haulData {
		old = &h.data
	}
	(*old).close() // a redial replaces a half-made pair
	*old = l
	if h.hdr == nil || h.data == nil {
		c.haulMu.Unlock()
		return
	}
	delete(c.haulHalf, r)
	c.haulIn = append(c.haulIn, h)
	c.haulWG.Add(1)
	c.haulMu.Unlock()
	go func() {
		defer c.haulWG.Done()
		err := c.target.ServeReliable(c.bg, h.conns(), &mailbox.ServeConfig{
			OnError: func(mbox, off uint64, n int, err error) {
				c.cfg.Logger.Warn("rma: long-haul put refused", "rank", c.rank, "peer", r, "mailbox", mbox, "offset", off, "bytes", n, "err", err)
			}})
		if err != nil && !errors.Is(err, reliability.ErrClosed) {
			c.cfg.Logger.Debug("rma: long-haul connection ended", "rank", c.rank, "peer", r, "err", err)
		}
	}()
}

// closeHauls ends every long-haul connection, served or dialed; c.bg has
// ended, so the serving goroutines return.
// closeHaul closes the peer's reliability connection, if any; the next
// long-haul put dials again.
func (p *peer) closeHaul() {
	p.haulMu.Lock()
	defer p.haulMu.Unlock()
	if p.haul != nil {
		p.haul.close()
		p.haul = nil
	}
}

func (c *Comm) closeHauls() {
	c.haulMu.Lock()
	in := c.haulIn
	c.haulIn = nil
	for _, h := range c.haulHalf {
		in = append(in, h)
	}
	c.haulHalf = nil
	c.haulMu.Unlock()
	c.haulWG.Wait()
	for _, h := range in {
		h.close()
	}
	for _, p := range c.peers {
		p.closeHaul()
	}
}

// LongHaul returns this rank's reliability connection that carries the
// payloads of its puts to rank r (for its RTT, loss estimate and link
// model), or nil if puts to r do not use one
// or none has been made yet.
func (c *Comm) LongHaul(r int) *reliability.Conn {
	if r < 0 || r >= c.size {
		return nil
	}
	p := c.peers[r]
	p.haulMu.Lock()
	defer p.haulMu.Unlock()
	if p.haul == nil {
		return nil
	}
	return p.haul.data.conn
}

// haulPut puts origin (through layout ol) into target's aggregate
// notified window over the reliability layer (per-origin windows take
// putPerOrigin, which keeps them within the target's posted epochs).
func (w *Win) haulPut(ctx context.Context, name string, origin []byte, ol Layout, target, off int, tl Layout) (*Request, error) {
	if _, err := w.c.haulInitiator(ctx, target); err != nil {
		return nil, err
	}
	wrs := w.haulWRs(nil, origin, ol, target, off, tl)
	o, base := w.track(len(wrs), target)
	req := o.request(name)
	for i := range wrs {
		wrs[i].ID = base + uint64(i)
	}
	if k, err := w.haulStart(target, wrs, func(int) *progress.Op { return &o.op }); k < len(wrs) {
		w.c.eng.Posted(&o.op, base+uint64(k), len(wrs)-k, 0, opErr(name, target, err))
		if k == 0 {
			return nil, opErr(name, target, err)
		}
	}
	return req, nil
}

// haulWRs describes the long-haul puts of a put of origin (through ol) at
// byte off of target's window (through tl), appended to dst: one mailbox
// put per run of consecutive target bytes, its bytes in Inline (aliasing
// origin, or a copy where the run gathers several origin pieces).
func (w *Win) haulWRs(dst []verbs.SendWR, origin []byte, ol Layout, target, off int, tl Layout) []verbs.SendWR {
	mbox := w.mailboxAddr(target)
	first, next := len(dst), -1
	segments(ol, tl, func(s seg) {
		at, src := off+s.t, origin[s.o:s.o+s.n]
		if n := len(dst); n > first && next == at {
			// Consecutive target bytes from separate origin pieces: one
			// put, from a copy.
			r := &dst[n-1]
			r.Inline = append(r.Inline[:len(r.Inline):len(r.Inline)], src...)
		} else {
			dst = append(dst, verbs.SendWR{Opcode: verbs.OpMailboxWrite, Mailbox: mbox, MailboxOffset: uint64(at), Inline: src})
		}
		next = at + s.n
	})
	return dst
}

// haulStart starts the long-haul puts wrs describe (see haulWRs), in
// order: the target assigns each to an epoch as it starts. Each finishes
// its work request (by ID) of op(i) once the target counted it; it runs
// outside the RC connection, so Complete does not rely on that ordering
// while it does (see bridging). It returns how many it started, and why
// not the rest.
func (w *Win) haulStart(target int, wrs []verbs.SendWR, op func(i int) *progress.Op) (int, error) {
	in, err := w.c.haulInitiator(w.c.bg, target)
	if err != nil {
		return 0, err
	}
	for i := range wrs {
		p, err := in.Start(w.c.bg, wrs[i].Mailbox, wrs[i].MailboxOffset, wrs[i].Inline, nil)
		if err != nil {
			return i, peerErr(err)
		}
		o, id := op(i), wrs[i].ID
		w.bridgeOp(target, &w.c.peers[target].haulDone, func() error {
			_, err := p.Wait(w.c.bg)
			return err
		}, func(err error) { w.c.eng.Posted(o, id, 1, 0, opErr("put", target, peerErr(err))) })
	}
	return len(wrs), nil
}
