package multipath

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rvma/rvma/internal/progress"
	"github.com/rvma/rvma/mailbox"
	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/cm"
)

// Config configures Dial and Listen. The zero value means defaults.
type Config struct {
	// Paths is the number of paths Dial opens, one QP per local GID
	// (GID i mod the device's count). Default: the device's GID count;
	// range 1..64. The listener follows the dialer.
	Paths int
	// Balancer spreads requests over the paths. Default Proportional.
	Balancer Balancer
	// Small is the size below which a request goes whole on one path
	// (Balancer.Pick), so that mice are not stuck behind elephants.
	// Default 64 KiB.
	Small int
	// Connect holds the attributes of every path's QP. Default: verbs'.
	Connect verbs.ConnectConfig
	// EWMA is the weight of a new capacity sample. Default 0.25, range
	// (0, 1].
	EWMA float64
	// MinChunk and MaxChunk bound a path's chunk size: a sub-flow is posted
	// as work requests of at most the path's chunk, which starts at
	// MinChunk, doubles after every sub-flow the path carried without a
	// loss, halves on a loss and then grows by MinChunk per clean sub-flow
	// (Virtuoso §3.5: large chunks on a lossy path make long tails).
	// Defaults 64 KiB and 4 MiB.
	MinChunk, MaxChunk int
	// Revive is how often the dialer's side tries to reconnect and probe
	// the paths that failed; a path that answers is used again. Default
	// 1s; negative: never.
	Revive time.Duration
}

func (c *Config) defaults(gids int) Config {
	var d Config
	if c != nil {
		d = *c
	}
	if d.Paths == 0 {
		d.Paths = gids
	}
	if d.Balancer == nil {
		d.Balancer = Proportional{}
	}
	if d.Small == 0 {
		d.Small = 64 << 10
	}
	if d.EWMA <= 0 || d.EWMA > 1 {
		d.EWMA = 0.25
	}
	if d.MinChunk <= 0 {
		d.MinChunk = 64 << 10
	}
	if d.MaxChunk < d.MinChunk {
		d.MaxChunk = max(4<<20, d.MinChunk)
	}
	if d.Revive == 0 {
		d.Revive = time.Second
	}
	return d
}

// ErrPaths reports a connection without a usable path.
var ErrPaths = errors.New("multipath: no path up")

// Conn is one logical connection over several paths: a QP per path, all
// in one PD and completing into one CQ.
type Conn struct {
	pd  *verbs.PD
	cq  *verbs.CQ
	eng *progress.Engine
	cfg Config

	qmu sync.RWMutex // guards qps: a revived path gets a new QP
	qps []*verbs.QP

	// The dialer's side re-dials failed paths.
	addr    string
	id      uint64
	stop    chan struct{}
	stopped sync.WaitGroup
	closeMu sync.Once

	// Probe regions: ours (the peer writes probes into it, and ours are
	// sent from it) and the peer's.
	probe     *verbs.MR
	peerProbe [12]byte // address and rkey

	// guarded by the engine's lock (completions update them)
	paths []pathStats
	two   twoSided
}

// ProbeSize is the size of a probe flow: large enough that its time is the
// path's bandwidth, not its latency (Virtuoso probes with at least 512 KiB).
const ProbeSize = 512 << 10

type pathStats struct {
	PathState
	bytes    uint64    // completed on this path
	lastDone time.Time // when the path last finished a sub-flow
	chunk    int       // largest work request posted on the path
	linear   bool      // a loss was seen: grow the chunk linearly
}

// Stats is a path's state, the bytes it carried and its chunk size.
type Stats struct {
	PathState
	Bytes uint64
	Chunk int
}

const magic = 0x52564d50 // "RVMP"

// private data: magic, connection id, path index, path count, then the
// sender's probe region (address, rkey)
func hello(id uint64, path, paths int, probe []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, magic)
	b = binary.BigEndian.AppendUint64(b, id)
	b = binary.BigEndian.AppendUint16(b, uint16(path))
	b = binary.BigEndian.AppendUint16(b, uint16(paths))
	return append(b, probe...)
}

// probeRef is our probe region as the peer addresses it.
func (c *Conn) probeRef() []byte {
	b := binary.BigEndian.AppendUint64(nil, c.probe.Addr())
	return binary.BigEndian.AppendUint32(b, c.probe.RKey())
}

func newConn(pd *verbs.PD, cfg Config) (*Conn, error) {
	cq, err := pd.Device().CreateCQ(verbs.CQConfig{Capacity: 1 << 14})
	if err != nil {
		return nil, err
	}
	c := &Conn{pd: pd, cq: cq, cfg: cfg, paths: make([]pathStats, cfg.Paths), stop: make(chan struct{})}
	for i := range c.paths {
		c.paths[i].chunk = cfg.MinChunk
	}
	if c.probe, err = pd.RegisterMR(make([]byte, ProbeSize), verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		cq.Close()
		return nil, err
	}
	c.eng = progress.New(cq, progress.Config{OnRecv: c.onRecv, Err: func(wc *verbs.WorkCompletion) error {
		if wc.Opcode == verbs.WCMailboxWrite {
			return mailbox.CompletionError(wc)
		}
		return wc.Err()
	}})
	return c, nil
}

// qp returns path i's current QP.
func (c *Conn) qp(i int) *verbs.QP {
	c.qmu.RLock()
	defer c.qmu.RUnlock()
	return c.qps[i]
}

// install makes qp path i's QP (after a revival), destroys the old one and
// marks the path up with fresh estimates.
func (c *Conn) install(i int, qp *verbs.QP) {
	c.qmu.Lock()
	old := c.qps[i]
	c.qps[i] = qp
	c.qmu.Unlock()
	if old != nil {
		old.Destroy()
	}
	if i == 0 {
		c.postCtlRecvs(qp)
	}
	c.eng.Locked(func() { c.paths[i] = pathStats{PathState: PathState{Up: true}, chunk: c.cfg.MinChunk} })
}

func (c *Conn) newQP(path int) (*verbs.QP, error) {
	gids := len(c.pd.Device().GIDs())
	return c.pd.CreateQP(verbs.QPConfig{Type: verbs.RC, SendCQ: c.cq, GID: path % gids, MaxSendWR: 4096, MaxRecvWR: ctlSlots})
}

// Dial opens a logical connection to a listener at address, one path per
// local GID (Config.Paths).
func Dial(ctx context.Context, pd *verbs.PD, address string, cfg *Config) (*Conn, error) {
	conf := cfg.defaults(len(pd.Device().GIDs()))
	if conf.Paths < 1 || conf.Paths > 64 {
		return nil, fmt.Errorf("multipath: %d paths, want 1..64", conf.Paths)
	}
	c, err := newConn(pd, conf)
	if err != nil {
		return nil, err
	}
	var idb [8]byte
	rand.Read(idb[:])
	id := binary.BigEndian.Uint64(idb[:])
	for i := range conf.Paths {
		qp, err := c.newQP(i)
		if err == nil {
			var res *cm.Result
			res, err = cm.Dial(ctx, address, qp, &cm.Config{Connect: &conf.Connect, PrivateData: hello(id, i, conf.Paths, c.probeRef())})
			if err == nil && len(res.PrivateData) == len(c.peerProbe) {
				copy(c.peerProbe[:], res.PrivateData)
			}
		}
		if err != nil {
			if qp != nil {
				qp.Destroy()
			}
			c.Close()
			return nil, fmt.Errorf("multipath: dial path %d: %w", i, err)
		}
		c.qps = append(c.qps, qp)
		c.paths[i].Up = true
		if i == 0 {
			if err := c.setupTwoSided(); err != nil {
				c.Close()
				return nil, err
			}
		}
	}
	c.addr, c.id = address, id
	if conf.Revive > 0 {
		c.stopped.Add(1)
		go c.reviver()
	}
	return c, nil
}

// reviver periodically re-dials and probes the paths that are down.
func (c *Conn) reviver() {
	defer c.stopped.Done()
	t := time.NewTicker(c.cfg.Revive)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		for i := range c.cfg.Paths {
			down := false
			c.eng.Locked(func() { down = !c.paths[i].Up })
			if down {
				ctx, cancel := context.WithTimeout(context.Background(), c.cfg.Revive)
				go func() { // Close must not wait a whole attempt
					select {
					case <-c.stop:
						cancel()
					case <-ctx.Done():
					}
				}()
				c.Revive(ctx, i)
				cancel()
			}
		}
	}
}

// Revive connects path i anew (it failed: its QP is in error) and probes
// it; on success the path is up again. The dialer's side does this
// periodically by itself (Config.Revive).
func (c *Conn) Revive(ctx context.Context, i int) error {
	if c.addr == "" {
		return fmt.Errorf("multipath: only the dialing side revives paths")
	}
	qp, err := c.newQP(i)
	if err != nil {
		return err
	}
	if _, err := cm.Dial(ctx, c.addr, qp, &cm.Config{Connect: &c.cfg.Connect, PrivateData: hello(c.id, i, c.cfg.Paths, c.probeRef())}); err != nil {
		qp.Destroy()
		return fmt.Errorf("multipath: revive path %d: %w", i, err)
	}
	c.install(i, qp)
	return c.probePath(ctx, i)
}

// Listener accepts logical connections. A goroutine answers the
// connection manager's requests: paths of new connections, and paths that
// the dialer revives on connections already accepted.
type Listener struct {
	ln    *cm.Listener
	pd    *verbs.PD
	cfg   *Config
	ready chan *Conn
	done  chan struct{}

	// used by the serving goroutine only
	pending map[uint64]*Conn // connections whose paths are arriving
	conns   map[uint64]*Conn // accepted connections, for revivals
}

// Listen accepts connections on a TCP address for the connection manager.
func Listen(ctx context.Context, pd *verbs.PD, address string, cfg *Config) (*Listener, error) {
	ln, err := cm.Listen(ctx, address)
	if err != nil {
		return nil, err
	}
	l := &Listener{ln: ln, pd: pd, cfg: cfg, ready: make(chan *Conn, 16), done: make(chan struct{}),
		pending: map[uint64]*Conn{}, conns: map[uint64]*Conn{}}
	go l.serve()
	return l, nil
}

// Addr returns the listening address.
func (l *Listener) Addr() string { return l.ln.Addr().String() }

// Close stops listening; accepted connections stay up but their paths are
// no longer revived.
func (l *Listener) Close() error {
	err := l.ln.Close()
	<-l.done
	return err
}

// Accept returns the next connection whose every path has arrived.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	select {
	case c, ok := <-l.ready:
		if !ok {
			return nil, fmt.Errorf("multipath: listener closed")
		}
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *Listener) serve() {
	defer close(l.done)
	defer close(l.ready)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for {
		req, err := l.ln.Accept(ctx)
		if err != nil {
			return
		}
		p := req.PrivateData()
		if len(p) != 28 || binary.BigEndian.Uint32(p) != magic {
			req.Reject("not a multipath connection")
			continue
		}
		id, path, paths := binary.BigEndian.Uint64(p[4:]), int(binary.BigEndian.Uint16(p[12:])), int(binary.BigEndian.Uint16(p[14:]))
		if paths < 1 || paths > 64 || path >= paths {
			req.Reject("bad path numbers")
			continue
		}
		actx, acancel := context.WithTimeout(ctx, 10*time.Second)
		if c := l.conns[id]; c != nil { // a revived path
			if path < len(c.qps) {
				if qp, err := c.newQP(path); err == nil {
					if err := req.Accept(actx, qp, &cm.Config{Connect: &c.cfg.Connect, PrivateData: c.probeRef()}); err == nil {
						c.install(path, qp)
					} else {
						qp.Destroy()
					}
				}
			} else {
				req.Reject("bad path numbers")
			}
			acancel()
			continue
		}
		c := l.pending[id]
		if c == nil {
			conf := l.cfg.defaults(paths)
			conf.Paths = paths
			if c, err = newConn(l.pd, conf); err != nil {
				req.Reject(err.Error())
				acancel()
				continue
			}
			c.qps = make([]*verbs.QP, paths)
			l.pending[id] = c
		}
		qp, err := c.newQP(path)
		if err == nil {
			copy(c.peerProbe[:], p[16:])
			err = req.Accept(actx, qp, &cm.Config{Connect: &c.cfg.Connect, PrivateData: c.probeRef()})
		}
		acancel()
		if err != nil {
			if qp != nil {
				qp.Destroy()
			}
			continue // the dialer sees the failure
		}
		c.qps[path] = qp
		c.paths[path].Up = true
		if path == 0 {
			if err := c.setupTwoSided(); err != nil {
				continue
			}
		}
		done := true
		for _, q := range c.qps {
			done = done && q != nil
		}
		if done {
			delete(l.pending, id)
			l.conns[id] = c
			select {
			case l.ready <- c:
			case <-ctx.Done():
				return
			}
		}
	}
}

// Close stops reviving paths and destroys the paths' QPs and the CQ.
func (c *Conn) Close() error {
	c.closeMu.Do(func() { close(c.stop) })
	c.stopped.Wait()
	var errs []error
	c.qmu.Lock()
	for _, qp := range c.qps {
		if qp != nil {
			errs = append(errs, qp.Destroy())
		}
	}
	c.qmu.Unlock()
	errs = append(errs, c.cq.Close(), c.probe.Deregister())
	if c.two.ctl != nil {
		errs = append(errs, c.two.ctl.Deregister())
	}
	return errors.Join(errs...)
}

// Probe measures each path that is up, one after another, with a timed
// write of ProbeSize bytes into the peer's probe region, and sets the
// path's capacity estimate from it. A path whose probe fails is marked
// down.
func (c *Conn) Probe(ctx context.Context) error {
	for i := range c.cfg.Paths {
		up := false
		c.eng.Locked(func() { up = c.paths[i].Up })
		if !up {
			continue
		}
		if err := c.probePath(ctx, i); ctx.Err() != nil {
			return err
		}
	}
	return nil
}

// probePath times one probe on path i.
func (c *Conn) probePath(ctx context.Context, i int) error {
	raddr, rkey := binary.BigEndian.Uint64(c.peerProbe[:]), binary.BigEndian.Uint32(c.peerProbe[8:])
	start := time.Now()
	op, id := c.eng.Start(1, nil)
	if _, err := c.qp(i).PostSend([]verbs.SendWR{{ID: id, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled,
		SGL: []verbs.SGE{c.probe.SGE(0, ProbeSize)}, RemoteAddr: raddr, RKey: rkey}}); err != nil {
		c.eng.Posted(op, id, 1, 0, err)
	}
	err := op.Wait(ctx)
	el := time.Since(start).Seconds()
	c.eng.Locked(func() {
		p := &c.paths[i]
		if err != nil {
			p.Up = false
			return
		}
		p.Capacity = ProbeSize / el
	})
	return err
}

// Paths returns every path's state and the bytes it carried.
func (c *Conn) Paths() []Stats {
	out := make([]Stats, len(c.paths))
	c.eng.Locked(func() {
		for i, p := range c.paths {
			out[i] = Stats{PathState: p.PathState, Bytes: p.bytes, Chunk: p.chunk}
		}
	})
	return out
}

// Request is a request in flight; it completes once, when all of its
// sub-flows have.
type Request struct{ op *progress.Op }

// Wait blocks until the request completes or ctx ends.
func (r *Request) Wait(ctx context.Context) error { return r.op.Wait(ctx) }

// Test reports whether the request has completed, and how.
func (r *Request) Test() (bool, error) { return r.op.Test() }

// Write writes n bytes of mr from off to the peer's (raddr, rkey), split
// over the paths by the balancer. A sub-flow whose path fails is written
// again over the paths still up (a write is idempotent by offset).
func (c *Conn) Write(mr *verbs.MR, off, n int, raddr uint64, rkey uint32) (*Request, error) {
	return c.post(n, true, func(sub, at int) verbs.SendWR {
		return verbs.SendWR{Opcode: verbs.OpWrite, SGL: []verbs.SGE{mr.SGE(off+at, sub)}, RemoteAddr: raddr + uint64(at), RKey: rkey}
	})
}

// Read reads n bytes from the peer's (raddr, rkey) into mr at off; like
// Write, it survives the failure of a path.
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
	reissue bool
	wr      func(sub, at int) verbs.SendWR
}

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
	var shares []int
	c.eng.Locked(func() {
		states := c.states()
		if n < c.cfg.Small || whole {
			shares = make([]int, len(c.paths))
			if i := c.cfg.Balancer.Pick(states); i >= 0 {
				shares[i] = n
			}
		} else {
			shares = c.cfg.Balancer.Split(n, states)
		}
	})
	if sumInts(shares) != n {
		return nil, ErrPaths
	}
	parent, _ := c.eng.Start(0, nil)
	f := &flow{parent: parent, reissue: reissue, wr: wr}
	c.eng.Locked(func() {
		for _, s := range shares {
			if s > 0 {
				f.left++
			}
		}
	})
	if f.left == 0 { // an empty request
		c.eng.Finish(parent, nil)
		return &Request{op: parent}, nil
	}
	at := 0
	for i, s := range shares {
		if s > 0 {
			c.submit(f, i, s, at)
		}
		at += s
	}
	return &Request{op: parent}, nil
}

// submit posts one sub-flow of share bytes at offset at on path, as work
// requests of at most the path's chunk size.
func (c *Conn) submit(f *flow, path, share, at int) {
	posted := time.Now()
	qp := c.qp(path)
	losses := lossCount(qp)
	var chunk int
	c.eng.Locked(func() {
		chunk = c.paths[path].chunk
		c.paths[path].Outstanding += share
	})
	n := (share + chunk - 1) / chunk
	op, id := c.eng.Start(n, func(err error) { c.subDone(f, path, share, at, posted, losses, err) })
	wrs := make([]verbs.SendWR, n)
	for k := range wrs {
		off := k * chunk
		wrs[k] = f.wr(min(chunk, share-off), at+off)
		wrs[k].ID, wrs[k].Flags = id+uint64(k), verbs.FlagSignaled
	}
	if k, err := qp.PostSend(wrs); err != nil {
		c.eng.Posted(op, id, n, k, err)
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

// subDone accounts for a finished sub-flow; the engine's lock is held.
func (c *Conn) subDone(f *flow, path, share, at int, posted time.Time, losses uint64, err error) {
	p := &c.paths[path]
	p.Outstanding -= share
	if err == nil {
		p.chunk, p.linear = nextChunk(p.chunk, c.cfg.MinChunk, c.cfg.MaxChunk, p.linear, lossCount(c.qp(path)) > losses)
	}
	if err != nil {
		p.Up = false // the QP is in error: the path is gone until revived
		// Only a transport failure moves to another path: a refused
		// request (wrong key, out of bounds) would be refused there too.
		transport := errors.Is(err, verbs.StatusRetryExceeded) || errors.Is(err, verbs.StatusFlushed)
		if f.reissue && transport {
			if alt := c.cfg.Balancer.Pick(c.states()); alt >= 0 {
				// Posting needs the engine's lock, held here: do it
				// from another goroutine.
				go c.submit(f, alt, share, at)
				return
			}
		}
		if f.err == nil {
			f.err = fmt.Errorf("multipath: path %d: %w", path, err)
		}
	} else {
		p.bytes += uint64(share)
		now := time.Now()
		start := posted
		if p.lastDone.After(start) {
			start = p.lastDone // it waited behind earlier sub-flows
		}
		if el := now.Sub(start).Seconds(); el > 0 && share >= 64<<10 {
			sample := float64(share) / el
			if p.Capacity == 0 {
				p.Capacity = sample
			} else {
				p.Capacity += c.cfg.EWMA * (sample - p.Capacity)
			}
		}
		p.lastDone = now
	}
	if f.left--; f.left == 0 {
		c.eng.FinishLocked(f.parent, f.err)
	}
}

func sumInts(xs []int) int {
	s := 0
	for _, x := range xs {
		s += x
	}
	return s
}
