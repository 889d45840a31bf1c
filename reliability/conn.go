package reliability

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/klauspost/reedsolomon"

	"github.com/rvma/rvma/internal/sdrwire"
	"github.com/rvma/rvma/verbs"
)

// Errors.
var (
	ErrClosed   = errors.New("reliability: connection closed")
	ErrPeer     = errors.New("reliability: peer unreachable")
	ErrTooLarge = errors.New("reliability: message larger than the receiver's buffer")
	ErrConfig   = errors.New("reliability: invalid configuration")
)

// Limits of the immediate's split: 10 bits of message id (the sequence
// number modulo 1024, as SDR-RDMA) and 22 bits of chunk index.
const (
	idBits    = 10
	idxBits   = 32 - idBits
	maxChunks = 1 << idxBits
)

// Config configures a Conn. The zero value means defaults.
type Config struct {
	// Chunk is the size of the chunks of messages this end receives: the
	// unit of the bitmap, of loss and of repair. A multiple of the QP's
	// path MTU; default one path MTU.
	Chunk int
	// Slots is how many receives this end keeps posted to its peer (the
	// messages that can be in flight toward it). Default 8; a power of two
	// in 1..64.
	Slots int
	// Scheme repairs this end's sends; Auto (the default) asks the model
	// per message.
	Scheme Scheme
	// K is the number of data chunks per erasure-coding stripe of the
	// messages this end receives (the sender follows it). Default 32,
	// range 1..128.
	K int
	// MaxParity is the parity chunks per stripe this end can receive (its
	// parity area). Default 8, range 1..128, K+MaxParity ≤ 256.
	MaxParity int
	// M forces the parity chunks per stripe of this end's EC sends;
	// default 0: the model picks among 1, 2, 4 and 8.
	M int
	// Rate is the injection rate in bytes per second, which is also the
	// model's link rate; the link's rate is not probed, so set it to the
	// path's rate. Default 0: as fast as the QP takes requests (and the
	// model assumes 1 Gbit/s).
	Rate float64
	// AutoRate lets a RateControl set the injection rate from what the
	// path delivers and how its round trip moves: it starts from the
	// probe train's dispersion (Probe), or from RateConfig.Start without
	// one, and the model takes its bottleneck estimate as the link's
	// rate. Rate is then only the probe train's pace (0: unpaced), and
	// PathRates, if set, each path's share.
	AutoRate bool
	// RateConfig tunes the AutoRate controller.
	RateConfig RateConfig
	// PathRates, with several paths (NewPaths), is each path's share of
	// the injection in bytes per second; Rate is then their sum. Default:
	// Rate split equally (and round robin when Rate is 0).
	PathRates []float64
	// RTT is the round-trip time assumed until pings measure it. Default 10ms.
	RTT time.Duration
	// MinRTT floors the RTT estimate that timeouts are built on, against
	// a timer's granularity and a loaded receiver's delay. Default 1ms.
	MinRTT time.Duration
	// Alpha sets the retransmission timeout for chunks the receiver has not
	// reported on: RTO = RTT + Alpha·RTT. Default 1, range 0.1..10.
	Alpha float64
	// Fallback is how long after a stripe's last chunk could have arrived
	// the sender waits for it to decode before repairing its missing data
	// chunks by selective repeat. Default RTT/4.
	Fallback time.Duration
	// Loss is the per-packet loss probability the model assumes before it
	// has measured any (Probe, and the receiver's statuses as chunks
	// arrive). Default 0.
	Loss float64
	// PeerTimeout fails pending operations with ErrPeer when nothing at all
	// arrived from the peer for this long. Default 10s.
	PeerTimeout time.Duration
	// RecvDepth is the number of receives kept posted on the QP: every
	// chunk consumes one, so it bounds the chunks in flight. Default
	// DefaultRecvDepth; the QP must have MaxRecvWR ≥ RecvDepth (see
	// QPConfig) and its CQ room for RecvDepth completions.
	RecvDepth int
	// RecvWindow is the floor of the receiver's flow-control window (at
	// most the receives' share below): the bytes of chunks it lets the
	// sender have in flight toward it (sent, neither acknowledged nor
	// declared lost). The window starts at seven
	// eighths of RecvDepth's chunks (at most MaxRecvWindow), grows
	// while this end keeps up, at most to about four times what arrives
	// in a round trip and to a round trip's bytes plus seven eighths of
	// RecvDepth's chunks (each chunk that arrived may take a receive
	// before it is handled; one that finds none is dropped), and halves
	// when this end falls behind: when Drops
	// reports packets dropped before they reached it, or when completions
	// pile up unhandled. Default a quarter of RecvDepth's chunks, at most
	// 2 MiB; -1: no window (the sender is limited by its rate only).
	RecvWindow int
	// MaxRecvWindow caps the window. Default 1 GiB.
	MaxRecvWindow int
	// Drops, if set, counts packets toward this end dropped before the
	// Conn saw them (a socket's receive buffer overflowing, for the udp
	// provider); the window shrinks when it grows.
	Drops func() uint64
	// ChunkDelay makes this end take that long over each chunk it
	// receives, as a receiver that cannot keep up: for tests and
	// demonstrations of flow control. Default 0.
	ChunkDelay time.Duration
	// Logger receives diagnostics. Default slog.Default().
	Logger *slog.Logger
}

func (c *Config) setDefaults(mtu int) error {
	if c.Chunk == 0 {
		c.Chunk = mtu
	}
	if c.Chunk%mtu != 0 || c.Chunk <= 0 {
		return fmt.Errorf("%w: chunk %d is not a multiple of the path MTU %d", ErrConfig, c.Chunk, mtu)
	}
	if c.Slots == 0 {
		c.Slots = 8
	}
	if c.Slots < 1 || c.Slots > 64 || c.Slots&(c.Slots-1) != 0 {
		return fmt.Errorf("%w: slots %d (a power of two in 1..64)", ErrConfig, c.Slots)
	}
	if c.K == 0 {
		c.K = 32
	}
	if c.MaxParity == 0 {
		c.MaxParity = 8
	}
	if c.K < 1 || c.K > 128 || c.MaxParity < 1 || c.MaxParity > 128 || c.K+c.MaxParity > 256 {
		return fmt.Errorf("%w: K %d, MaxParity %d", ErrConfig, c.K, c.MaxParity)
	}
	if c.M < 0 || c.M > 128 {
		return fmt.Errorf("%w: M %d", ErrConfig, c.M)
	}
	if c.RTT == 0 {
		c.RTT = 10 * time.Millisecond
	}
	if c.MinRTT == 0 {
		c.MinRTT = time.Millisecond
	}
	if c.Alpha == 0 {
		c.Alpha = 1
	}
	if c.Alpha < 0.1 || c.Alpha > 10 {
		return fmt.Errorf("%w: alpha %g", ErrConfig, c.Alpha)
	}
	if c.PeerTimeout == 0 {
		c.PeerTimeout = 10 * time.Second
	}
	if c.RecvDepth == 0 {
		c.RecvDepth = DefaultRecvDepth
	}
	if c.RecvWindow == 0 {
		c.RecvWindow = min(c.RecvDepth/4*c.Chunk, 2<<20)
	}
	if c.MaxRecvWindow == 0 {
		c.MaxRecvWindow = 1 << 30
	}
	if c.RecvWindow > 0 && (c.RecvWindow < c.Chunk || c.MaxRecvWindow < c.RecvWindow) {
		return fmt.Errorf("%w: receive window %d (at least a chunk, %d, and at most MaxRecvWindow, %d)", ErrConfig, c.RecvWindow, c.Chunk, c.MaxRecvWindow)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// setPathRates checks PathRates against the path count, or splits Rate
// equally; Rate becomes their sum.
func (c *Config) setPathRates(paths int) error {
	if c.PathRates == nil {
		c.PathRates = make([]float64, paths)
		for i := range c.PathRates {
			c.PathRates[i] = c.Rate / float64(paths)
			if c.AutoRate {
				c.PathRates[i] = 1 // equal shares
			}
		}
		return nil
	}
	if len(c.PathRates) != paths {
		return fmt.Errorf("%w: %d path rates for %d paths", ErrConfig, len(c.PathRates), paths)
	}
	c.PathRates = slices.Clone(c.PathRates)
	sum := 0.0
	for i, r := range c.PathRates {
		if r <= 0 {
			return fmt.Errorf("%w: path %d's rate %g", ErrConfig, i, r)
		}
		sum += r
	}
	if !c.AutoRate {
		c.Rate = sum
	}
	return nil
}

// QPConfig returns the attributes a QP needs to carry a Conn: UC, with
// room for cfg.RecvDepth receives.
func QPConfig(cq *verbs.CQ, cfg Config) verbs.QPConfig {
	depth := cfg.RecvDepth
	if depth == 0 {
		depth = DefaultRecvDepth
	}
	return verbs.QPConfig{Type: verbs.UC, SendCQ: cq, MaxRecvWR: depth, MaxSendWR: 1024, MaxSendSGE: 1, MaxRecvSGE: 1}
}

// DefaultRecvDepth is Config.RecvDepth's default.
const DefaultRecvDepth = 4096

const ctlSize = 1024 // bytes per control receive buffer; sdrwire.MaxLen fits

// Conn runs SDR-style reliability over one connected UC QP: the receiver
// posts buffers (Post), the sender's i-th Send lands in the peer's i-th
// posted buffer as chunks written with immediates, the receiver's bitmap
// records what arrived, and losses are repaired by selective repeat or
// erasure coding. Data flows both ways independently.
//
// A Conn is safe for concurrent use. It owns the QP's CQ (it polls it) and
// its receive queue; the caller keeps ownership of the QP, CQ and PD and
// closes them after Close.
type Conn struct {
	cfg   Config
	mtu   int // the paths' smallest
	log   *slog.Logger
	pd    *verbs.PD
	qps   []*verbs.QP // the paths: chunks and control messages go on all
	cq    *verbs.CQ
	epoch time.Time

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	kick   chan struct{} // wakes the injector

	rq      *verbs.MR // control receive buffers
	ctl     *verbs.MR // control send buffers, a ring
	cti     int
	ctlPath int // the path of the next control message

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced on every state change
	err      error
	srtt     time.Duration
	rttvar   time.Duration // mean deviation of the samples, as TCP's
	minRTT   time.Duration // the smallest sample: the path without queues
	measured bool
	heard    time.Duration // when the peer was last heard from

	// receive side
	dec     reedsolomon.Encoder
	slots   []*Recv
	parity  [][]byte // parity area per slot, reused
	post    uint64   // sequence number of the next Post
	floor   uint64   // every receive below floor is complete
	scratch rxScratch
	rw      recvWindow

	// send side
	cts       map[uint64]*sdrwire.Message // clear-to-send of messages not started
	next      uint64                      // sequence number of the next Send
	sends     map[uint64]*Send
	order     []*Send // active sends in sequence order
	retx      []chunkRef
	enc       map[[2]int]reedsolomon.Encoder
	lossN     float64 // decayed packets lost: probes, and data chunks' first sends
	lossD     float64 // decayed packets those were
	peerChunk int     // the chunk size of the last message started
	plan      *plan   // the model's latest choice
	needPlan  *Send   // the send the injector stopped at for want of a plan
	probe     *probeState
	tx        txScratch
	pathBytes []uint64 // chunk bytes sent per path
	sentAll   int64    // their sum
	fw        sendWindow
	rc        *RateControl // AutoRate's; nil: paced at Config.Rate
	shares    []float64    // each path's share of rc's rate

	// testDrop, set by tests before traffic, loses chunk writes by
	// position: idx is the chunk index (parity follows the data), try the
	// transmission count of a data chunk (1 for the first, 0 for parity).
	testDrop func(seq uint64, idx, try int) bool
}

type chunkRef struct {
	s     *Send
	idx   int
	probe bool // a stall's probe: sent whatever the window (scanLocked)
}

// New starts the protocol on qp, a connected UC QP whose send and receive
// completions go to cq (create it with QPConfig). pd is the QP's PD.
func New(pd *verbs.PD, qp *verbs.QP, cq *verbs.CQ, cfg Config) (*Conn, error) {
	return NewPaths(pd, []*verbs.QP{qp}, cq, cfg)
}

// NewPaths starts the protocol over several paths: qps are connected UC
// QPs of one PD (typically one per local address), path i to the peer's
// path i, all completing into cq, which needs room for RecvDepth
// completions per path. Chunks are spread over the paths by
// Config.PathRates; control messages take the paths in turn. Both ends
// must use the same number of paths. The round-trip time and loss
// estimates are the connection's, not per path: the paths are meant to
// have similar delays.
func NewPaths(pd *verbs.PD, qps []*verbs.QP, cq *verbs.CQ, cfg Config) (*Conn, error) {
	if len(qps) == 0 || len(qps) > 64 {
		return nil, fmt.Errorf("%w: %d paths, want 1..64", ErrConfig, len(qps))
	}
	mtu := 0
	for i, qp := range qps {
		if qp.Type() != verbs.UC {
			return nil, fmt.Errorf("%w: path %d's QP is %v, want UC", ErrConfig, i, qp.Type())
		}
		m := qp.PathMTU()
		if m == 0 {
			return nil, fmt.Errorf("%w: path %d's QP is not connected", ErrConfig, i)
		}
		if mtu == 0 || m < mtu {
			mtu = m
		}
	}
	if err := cfg.setDefaults(mtu); err != nil {
		return nil, err
	}
	if err := cfg.setPathRates(len(qps)); err != nil {
		return nil, err
	}
	dec, err := reedsolomon.New(cfg.K, cfg.MaxParity, reedsolomon.WithCauchyMatrix())
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	c := &Conn{
		cfg: cfg, mtu: mtu, peerChunk: cfg.Chunk, log: cfg.Logger, pd: pd, qps: slices.Clone(qps), cq: cq, epoch: time.Now(),
		kick: make(chan struct{}, 1), changed: make(chan struct{}), srtt: max(cfg.RTT, cfg.MinRTT),
		dec: dec, slots: make([]*Recv, cfg.Slots), parity: make([][]byte, cfg.Slots),
		cts: map[uint64]*sdrwire.Message{}, sends: map[uint64]*Send{}, enc: map[[2]int]reedsolomon.Encoder{},
		pathBytes: make([]uint64, len(qps)),
	}
	if cfg.AutoRate {
		c.rc = NewRateControl(cfg.RateConfig)
		sum := 0.0
		for _, r := range cfg.PathRates {
			sum += r
		}
		for _, r := range cfg.PathRates {
			c.shares = append(c.shares, r/sum)
		}
	}
	// Receive slots: RecvDepth per path, path i's ids from i·RecvDepth:
	// every chunk and control message consumes a receive on its path.
	c.rq, err = pd.RegisterMR(make([]byte, len(qps)*cfg.RecvDepth*ctlSize), verbs.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	c.ctl, err = pd.RegisterMR(make([]byte, 16*ctlSize), 0)
	if err != nil {
		c.rq.Deregister()
		return nil, err
	}
	for p, qp := range qps {
		wrs := make([]verbs.RecvWR, cfg.RecvDepth)
		sges := make([]verbs.SGE, cfg.RecvDepth)
		for i := range wrs {
			id := p*cfg.RecvDepth + i
			sges[i] = c.rq.SGE(id*ctlSize, ctlSize)
			wrs[i] = verbs.RecvWR{ID: uint64(id), SGL: sges[i : i+1]}
		}
		if _, err := qp.PostRecv(wrs); err != nil {
			c.rq.Deregister()
			c.ctl.Deregister()
			return nil, fmt.Errorf("reliability: post receives on path %d: %w", p, err)
		}
	}
	c.heard = c.now()
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.wg.Add(3)
	go c.poll()
	go c.inject()
	go c.tick()
	return c, nil
}

func (c *Conn) now() time.Duration { return time.Since(c.epoch) }

// Ready waits for the first RTT measurement, so that the model starts
// from the real path rather than Config.RTT.
func (c *Conn) Ready(ctx context.Context) error {
	var err error
	werr := c.wait(ctx, func() bool { err = c.err; return c.measured || c.err != nil })
	if werr != nil {
		return werr
	}
	return err
}

// RTT is the smoothed round-trip time measured by pings.
func (c *Conn) RTT() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.srtt
}

// Loss is the estimated chunk-loss probability toward the peer.
func (c *Conn) Loss() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lossLocked()
}

func (c *Conn) lossLocked() float64 {
	if c.lossD < 1 {
		return c.cfg.Loss
	}
	// Half a loss a priori (Jeffreys): no loss in n packets says the rate
	// is below about 1/n, not that it is zero, and the model's choice
	// between SR and EC turns on rates that small.
	return (c.lossN + 0.5) / (c.lossD + 1)
}

// lossWindow is the packets over which the loss estimate forgets: the
// weight of an observation decays by e every lossWindow packets after it.
const lossWindow = 1 << 15

// observeLossLocked adds lost packets of n to the loss estimate.
func (c *Conn) observeLossLocked(lost, n float64) {
	if n <= 0 {
		return
	}
	f := math.Exp(-n / lossWindow)
	c.lossN = c.lossN*f + lost
	c.lossD = c.lossD*f + n
}

// Close stops the protocol: pending sends and receives fail with ErrClosed
// and their memory registrations are released. It does not close the QP.
func (c *Conn) Close() error {
	c.fail(ErrClosed)
	c.cancel()
	c.wg.Wait()
	c.rq.Deregister()
	c.ctl.Deregister()
	if c.tx.mr != nil {
		c.tx.mr.Deregister()
	}
	return nil
}

// fail records the first fatal error and ends everything pending.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failLocked(err)
}

func (c *Conn) failLocked(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	for _, r := range c.slots {
		if r != nil && !r.done {
			r.err = err
			r.finishLocked(false)
		}
	}
	// finishLocked removes each send from c.order: iterate over a copy.
	for _, s := range slices.Clone(c.order) {
		s.finishLocked(err)
	}
	c.broadcastLocked()
}

func (c *Conn) broadcastLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// wait blocks until cond (called with c.mu held) is true.
func (c *Conn) wait(ctx context.Context, cond func() bool) error {
	c.mu.Lock()
	for !cond() {
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
		c.mu.Lock()
	}
	c.mu.Unlock()
	return nil
}

// sendCtlLocked sends one control message. Control messages are small and
// stateless: losing one costs only the wait for the next.
func (c *Conn) sendCtlLocked(m *sdrwire.Message) {
	off := c.cti * ctlSize
	c.cti = (c.cti + 1) % 16
	b := sdrwire.Append(c.ctl.Bytes()[off:off], m)
	sge := c.ctl.SGE(off, len(b))
	wr := verbs.SendWR{Opcode: verbs.OpSend, SGL: []verbs.SGE{sge}}
	// Control messages take the paths in turn: each path then carries
	// traffic both ways (a relay that learns its ends from packets, as
	// linkem does, needs that), and losing one path does not silence the
	// control channel.
	qp := c.qps[c.ctlPath]
	c.ctlPath = (c.ctlPath + 1) % len(c.qps)
	if _, err := qp.PostSend([]verbs.SendWR{wr}); err != nil && !errors.Is(err, verbs.ErrQueueFull) {
		c.failLocked(fmt.Errorf("reliability: %w", err))
	}
}

// poll handles the CQ: chunks, control messages, failures.
func (c *Conn) poll() {
	defer c.wg.Done()
	wcs := make([]verbs.WorkCompletion, 64)
	repost := make([][]verbs.RecvWR, len(c.qps)) // per path
	for i := range repost {
		repost[i] = make([]verbs.RecvWR, 0, 64)
	}
	sges := make([]verbs.SGE, 64)
	var msg sdrwire.Message
	for {
		n, err := c.cq.WaitPoll(c.ctx, wcs)
		if err != nil {
			if c.ctx.Err() == nil {
				c.fail(fmt.Errorf("reliability: completion queue: %w", err))
			}
			return
		}
		now := c.now()
		for i := range repost {
			repost[i] = repost[i][:0]
		}
		c.mu.Lock()
		c.heard = now
		for i := range wcs[:n] {
			wc := &wcs[i]
			if wc.Status != verbs.StatusSuccess {
				if c.ctx.Err() == nil {
					c.failLocked(fmt.Errorf("reliability: %w", wc.Err()))
				}
				continue
			}
			switch wc.Opcode {
			case verbs.WCRecvWriteImm:
				c.onChunkLocked(wc.Imm, now)
			case verbs.WCRecv:
				b := c.rq.Bytes()[int(wc.WRID)*ctlSize:][:wc.ByteLen]
				if err := sdrwire.Parse(b, &msg); errors.Is(err, sdrwire.ErrVersion) {
					c.failLocked(fmt.Errorf("%w: %w", ErrPeer, err))
				} else if err != nil {
					c.log.Debug("reliability: bad control message", "err", err)
				} else {
					c.onControlLocked(&msg, now)
				}
			default:
				continue
			}
			sges[i] = c.rq.SGE(int(wc.WRID)*ctlSize, ctlSize)
			p := int(wc.WRID) / c.cfg.RecvDepth
			repost[p] = append(repost[p], verbs.RecvWR{ID: wc.WRID, SGL: sges[i : i+1]})
		}
		if c.cfg.RecvWindow > 0 && c.cq.Len() > c.cfg.RecvDepth/4 {
			c.rw.behind = true // completions arrive faster than handled
		}
		c.mu.Unlock()
		if d := c.cfg.ChunkDelay; d > 0 {
			chunks := 0
			for i := range wcs[:n] {
				if wcs[i].Opcode == verbs.WCRecvWriteImm {
					chunks++
				}
			}
			if chunks > 0 {
				time.Sleep(time.Duration(chunks) * d)
			}
		}
		for p, wrs := range repost {
			if len(wrs) == 0 {
				continue
			}
			if _, err := c.qps[p].PostRecv(wrs); err != nil && c.ctx.Err() == nil {
				c.fail(fmt.Errorf("reliability: repost receives on path %d: %w", p, err))
			}
		}
	}
}

func (c *Conn) onControlLocked(m *sdrwire.Message, now time.Duration) {
	switch m.Type {
	case sdrwire.TypePing:
		c.sendCtlLocked(&sdrwire.Message{Type: sdrwire.TypePong, Stamp: m.Stamp})
	case sdrwire.TypePong:
		c.rttSampleLocked(now - time.Duration(m.Stamp))
		c.broadcastLocked()
	case sdrwire.TypeProbe:
		c.sendCtlLocked(&sdrwire.Message{Type: sdrwire.TypeEcho, Stamp: m.Stamp, Seq: m.Seq})
	case sdrwire.TypeEcho:
		c.onEchoLocked(m, now)
	case sdrwire.TypeQuery:
		if r := c.slots[int(m.Seq%uint64(c.cfg.Slots))]; r != nil {
			c.sendStatusLocked(r, now)
		}
	case sdrwire.TypeStatus:
		c.onStatusLocked(m, now)
	}
}

// rttSampleLocked adds a round trip to the RTT estimate, as TCP does.
func (c *Conn) rttSampleLocked(sample time.Duration) {
	if sample <= 0 || sample > time.Minute {
		return
	}
	if c.minRTT == 0 || sample < c.minRTT {
		c.minRTT = sample
	}
	if c.rc != nil {
		c.rc.OnRTT(c.now(), sample)
	}
	if !c.measured {
		c.srtt, c.rttvar, c.measured = sample, sample/2, true
	} else {
		dev := sample - c.srtt
		c.srtt += dev / 8
		c.rttvar += (max(dev, -dev) - c.rttvar) / 4
	}
	c.srtt = max(c.srtt, c.cfg.MinRTT)
}

// tick sends statuses, pings, and retransmits on timeouts.
func (c *Conn) tick() {
	defer c.wg.Done()
	var lastPing, lastScan time.Duration
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		c.mu.Lock()
		rtt := c.srtt
		c.mu.Unlock()
		t := min(max(rtt/8, time.Millisecond), 25*time.Millisecond)
		timer.Reset(t)
		select {
		case <-c.ctx.Done():
			return
		case <-timer.C:
		}
		now := c.now()
		c.mu.Lock()
		if c.err != nil {
			c.mu.Unlock()
			continue
		}
		// Pings are tiny; frequent ones track a queue that builds up.
		if now-lastPing >= 50*time.Millisecond || (!c.measured && now-lastPing >= 20*time.Millisecond) {
			lastPing = now
			c.sendCtlLocked(&sdrwire.Message{Type: sdrwire.TypePing, Stamp: int64(now)})
		}
		for _, r := range c.slots {
			if r != nil && r.statusDue(now, rtt, t) {
				c.sendStatusLocked(r, now)
			}
		}
		c.windowLocked(now)
		c.stallLocked(now)
		if c.rc != nil {
			c.rc.Tick(now, RateSample{Sent: c.sentAll, Delivered: c.fw.delivered, DeliveredAt: c.fw.deliveredAt, InFlight: c.fw.inflight})
		}
		if now-lastScan >= rtt/4 {
			lastScan = now
			c.scanLocked(now)
		}
		if len(c.order) > 0 || c.pendingRecvLocked() {
			if now-c.heard > c.cfg.PeerTimeout {
				c.failLocked(fmt.Errorf("%w: nothing heard for %v", ErrPeer, (now - c.heard).Round(time.Millisecond)))
			}
		} else {
			c.heard = now
		}
		c.mu.Unlock()
	}
}

func (c *Conn) pendingRecvLocked() bool {
	for _, r := range c.slots {
		if r != nil && !r.done {
			return true
		}
	}
	return false
}

func (c *Conn) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}
