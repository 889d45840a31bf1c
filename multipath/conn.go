package multipath

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rvma/rvma/internal/progress"
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
	// Connect holds the attributes of every path's QP. Default: verbs',
	// except MaxTimeout, 4 × Timeout (80 ms): a path that stops answering
	// should hand its share to the others within about half a second,
	// not after the seconds of backoff a lone connection waits out.
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
	// the paths that failed; a path is used again once its probe, written
	// over the path itself, is acknowledged. Default 1s; negative: never.
	Revive time.Duration
	// ReviveMax caps the back-off of a path whose revivals keep failing:
	// after each failed attempt the wait before the next one doubles,
	// from Revive up to ReviveMax. Default 30 × Revive.
	ReviveMax time.Duration
	// NoProbe makes Dial return without probing the paths. By default
	// Dial probes every path (Probe, one ProbeSize write each) and marks
	// up only those whose probe is acknowledged, so that the first request
	// is already split in proportion to the paths' capacities; with
	// NoProbe every connected path is up at once, and the first requests
	// are split equally until completions have measured the paths. The
	// accepting side never probes on its own at connection time.
	NoProbe bool
	// Key authenticates every path's connection handshake (cm.Config.Key):
	// the dialer and the listener must hold the same. Default none.
	Key []byte
	// Err turns a failed completion into the error its request reports.
	// Default wc.Err(). A caller whose mailbox puts should fail with the
	// mailbox's errors passes mailbox.CompletionError: the mailbox layer
	// sits above this one.
	Err func(*verbs.WorkCompletion) error
	// PrivateData travels to the peer once, in path 0's handshake, and
	// the peer reads it with Conn.PeerData: the way to tell it where to
	// write (an address and a remote key). At most MaxPrivateData bytes;
	// default none. A Listener's goes to every peer that connects.
	PrivateData []byte
}

// MaxPrivateData is the most Config.PrivateData carries: the connection
// manager's limit less the path's own hello.
const MaxPrivateData = 1024 - helloLen

// helloLen is the size of a path's hello: magic, connection id, path,
// paths, the probe region's address and key.
const helloLen = 28

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
	if d.Connect.MaxTimeout == 0 {
		d.Connect.MaxTimeout = 4 * cmp.Or(d.Connect.Timeout, 20*time.Millisecond)
	}
	if d.Revive == 0 {
		d.Revive = time.Second
	}
	if d.ReviveMax < d.Revive {
		d.ReviveMax = 30 * d.Revive
	}
	return d
}

// ErrPaths reports a connection without a usable path.
var ErrPaths = errors.New("multipath: no path up")

// ErrAccepted reports a revival asked of the accepting side: only the
// dialing side revives paths.
var ErrAccepted = errors.New("multipath: only the dialing side revives paths")

// Conn is one logical connection over several paths: a QP per path, all
// in one PD and completing into one CQ.
type Conn struct {
	pd  *verbs.PD
	cq  *verbs.CQ
	eng *progress.Engine
	cfg Config

	qmu sync.RWMutex // guards qps: a revived path gets a new QP
	qps []*verbs.QP

	// The dialer's side re-dials failed paths, one revival of a path at
	// a time.
	addr     string
	id       uint64
	reviveMu []sync.Mutex

	// Background goroutines (the reviver, revived paths' probes) end when
	// stop closes; Close waits for them.
	lifeMu  sync.Mutex // guards closing, and stopped.Add against Wait
	closing bool
	stop    chan struct{}
	stopped sync.WaitGroup

	// Probe regions: ours, whose first half the peer writes its probes
	// into and whose second half ours are sent from (one region for both
	// would have a probe read bytes while the peer's overwrites them),
	// and the peer's. probeMu makes this side's probes one at a time, so
	// the peer's region takes one write at a time.
	probe     *verbs.MR
	probeMu   sync.Mutex
	peerProbe [12]byte // address and rkey
	peerData  []byte   // the peer's Config.PrivateData

	// guarded by the engine's lock (completions update them)
	paths []pathStats
	two   twoSided
}

// ProbeSize is the size of a probe flow: large enough that its time is the
// path's bandwidth, not its latency (Virtuoso probes with at least 512 KiB).
const ProbeSize = 512 << 10

type pathStats struct {
	PathState
	bytes    uint64    // delivered on this path (completed chunks)
	posted   uint64    // data bytes posted on this path
	reissued uint64    // of posted, the undelivered bytes of failed sub-flows
	lastDone time.Time // when the path last finished a sub-flow
	chunk    int       // largest work request posted on the path
	linear   bool      // a loss was seen: grow the chunk linearly
}

// Stats is a path's state, its counters and its chunk size. The counters
// cover the connection's life: they never go down, also not when the path
// fails and is revived (a revival starts a new QP, not a new path).
type Stats struct {
	PathState
	// Bytes is what the path delivered: the bytes of the work requests it
	// completed (probes not counted).
	Bytes uint64
	// Posted is what was posted on the path (probes not counted): what
	// it delivered (Bytes), what is in flight (Outstanding) and what a
	// failure of the path kept from arriving (sent again elsewhere, for
	// a Write or Read).
	Posted uint64
	// Reissued is the part of Posted that another path's failed
	// sub-flows had not delivered, re-sent on this path.
	Reissued uint64
	// Chunk is the path's chunk size: its largest work request.
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

// PeerData is the peer's Config.PrivateData, as it was when the
// connection was made (nil if it sent none). The slice is the caller's.
func (c *Conn) PeerData() []byte { return bytes.Clone(c.peerData) }

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
	c := &Conn{pd: pd, cq: cq, cfg: cfg, paths: make([]pathStats, cfg.Paths), reviveMu: make([]sync.Mutex, cfg.Paths),
		stop: make(chan struct{})}
	for i := range c.paths {
		c.paths[i].chunk = cfg.MinChunk
	}
	if c.probe, err = pd.RegisterMR(make([]byte, 2*ProbeSize), verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		cq.Close()
		return nil, err
	}
	errOf := cfg.Err
	if errOf == nil {
		errOf = (*verbs.WorkCompletion).Err
	}
	c.eng = progress.New(cq, progress.Config{OnRecv: c.onRecv, Err: errOf})
	return c, nil
}

// qp returns path i's current QP.
func (c *Conn) qp(i int) *verbs.QP {
	c.qmu.RLock()
	defer c.qmu.RUnlock()
	return c.qps[i]
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
	if len(conf.PrivateData) > MaxPrivateData {
		return nil, fmt.Errorf("multipath: private data of %d bytes, max %d", len(conf.PrivateData), MaxPrivateData)
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
			h := hello(id, i, conf.Paths, c.probeRef())
			if i == 0 {
				h = append(h, conf.PrivateData...)
			}
			res, err = cm.Dial(ctx, address, qp, &cm.Config{Connect: &conf.Connect, PrivateData: h, Key: conf.Key})
			if err == nil && len(res.PrivateData) >= len(c.peerProbe) {
				copy(c.peerProbe[:], res.PrivateData)
				if i == 0 {
					c.peerData = bytes.Clone(res.PrivateData[len(c.peerProbe):])
				}
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
		c.paths[i].Up = conf.NoProbe // otherwise its probe brings it up
		if i == 0 {
			if err := c.setupTwoSided(); err != nil {
				c.Close()
				return nil, err
			}
		}
	}
	c.addr, c.id = address, id
	if !conf.NoProbe {
		if err := c.probeAll(ctx); err != nil {
			c.Close()
			return nil, fmt.Errorf("multipath: dial: %w", err)
		}
	}
	if conf.Revive > 0 {
		c.spawn(c.reviver)
	}
	return c, nil
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
	var key []byte
	if cfg != nil {
		key = cfg.Key
		if len(cfg.PrivateData) > MaxPrivateData {
			return nil, fmt.Errorf("multipath: private data of %d bytes, max %d", len(cfg.PrivateData), MaxPrivateData)
		}
	}
	ln, err := cm.Listen(ctx, address, &cm.ListenerConfig{Key: key})
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
		if len(p) < helloLen || binary.BigEndian.Uint32(p) != magic {
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
			l.revived(actx, req, c, path)
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
			reply := c.probeRef()
			if path == 0 {
				c.peerData = bytes.Clone(p[helloLen:])
				if l.cfg != nil {
					reply = append(reply, l.cfg.PrivateData...)
				}
			}
			err = req.Accept(actx, qp, &cm.Config{Connect: &c.cfg.Connect, PrivateData: reply})
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

// revived accepts the dialer's revival of path on c. The new QP replaces
// the old one, but the path stays down until this side's own probe over
// it is acknowledged: the request came over the connection manager's TCP
// connection, which says nothing of the path.
func (l *Listener) revived(ctx context.Context, req *cm.Request, c *Conn, path int) {
	if path >= len(c.qps) {
		req.Reject("bad path numbers")
		return
	}
	qp, err := c.newQP(path)
	if err != nil {
		req.Reject(err.Error())
		return
	}
	if err := req.Accept(ctx, qp, &cm.Config{Connect: &c.cfg.Connect, PrivateData: c.probeRef()}); err != nil {
		qp.Destroy()
		return
	}
	if !c.install(path, qp) {
		return
	}
	c.spawn(func() {
		pctx, cancel := c.stopCtx(reviveTimeout)
		defer cancel()
		c.probePath(pctx, path, qp)
	})
}

// spawn runs f in a goroutine that Close waits for; once Close has begun
// it runs nothing and reports false.
func (c *Conn) spawn(f func()) bool {
	c.lifeMu.Lock()
	defer c.lifeMu.Unlock()
	if c.closing {
		return false
	}
	c.stopped.Add(1)
	go func() {
		defer c.stopped.Done()
		f()
	}()
	return true
}

// stopCtx is a context that ends after d or when the Conn closes.
func (c *Conn) stopCtx(d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	go func() {
		select {
		case <-c.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// Close stops reviving paths and destroys the paths' QPs and the CQ.
func (c *Conn) Close() error {
	c.lifeMu.Lock()
	if !c.closing {
		c.closing = true
		close(c.stop)
	}
	c.lifeMu.Unlock()
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

// Paths returns every path's state and counters.
func (c *Conn) Paths() []Stats {
	out := make([]Stats, len(c.paths))
	c.eng.Locked(func() {
		for i, p := range c.paths {
			out[i] = Stats{PathState: p.PathState, Bytes: p.bytes, Posted: p.posted, Reissued: p.reissued, Chunk: p.chunk}
		}
	})
	return out
}
