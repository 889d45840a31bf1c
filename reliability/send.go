package reliability

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"time"

	"github.com/klauspost/reedsolomon"

	"github.com/rvma/rvma/internal/sdrwire"
	"github.com/rvma/rvma/verbs"
)

// SendOptions shape one Send. nil means the Conn's defaults.
type SendOptions struct {
	// Scheme overrides Config.Scheme for this message.
	Scheme Scheme
	// M forces the parity chunks per stripe when EC is used.
	M int
	// Stream is the number of bytes this message is the head of (itself
	// and what will follow back to back); the model sizes its choice by
	// it, since selective repeat hides repairs behind later data. Default:
	// the message's own size.
	Stream int64
}

// Decision is one choice of the repair for a message's stripes from a
// data chunk on: made when the first of them was sent, with the link as
// measured then.
type Decision struct {
	At        time.Time
	Chunk     int // the first data chunk it applies to
	Scheme    Scheme
	K, M      int     // EC stripe (M = 0 for SR)
	Loss      float64 // chunk loss the model assumed
	Observed  float64 // packets the loss estimate rests on (decayed): probes and data
	RTT       time.Duration
	Remaining int64    // bytes of the stream left to send, this stripe's included
	Estimate  Estimate // the model's time for the remaining bytes with this choice
	Reason    string
}

// SendResult describes a completed send.
type SendResult struct {
	Seq    uint64
	Bytes  int
	Scheme Scheme // the repair of most of the data chunks
	K, M   int    // that EC stripe (0 for SR)
	// ECChunks is the data chunks sent in stripes with parity.
	ECChunks int
	// Decisions are the choices in the order made: the first, and each
	// that changed the scheme or the parity count (at most maxDecisions).
	Decisions       []Decision
	Estimate        Estimate      // the model's prediction at the first choice
	Reason          string        // why the first choice
	Transmissions   int           // chunks put on the wire, parity and repeats included
	Retransmissions int           // data chunks sent again
	Timeouts        int           // of which after a timeout rather than a report of the gap
	Decoded         int           // data chunks the receiver rebuilt from parity
	Chunk           int           // the receiver's chunk size
	WireBytes       int64         // payload bytes put on the wire: data, parity, repeats
	Partial         bool          // the receiver took the message with chunks missing
	Duration        time.Duration // from the first chunk sent to completion
}

// Send is a message on its way: the Seq-th Send lands in the peer's
// Seq-th posted buffer.
type Send struct {
	c          *Conn
	seq        uint64
	data       []byte
	mr         *verbs.MR
	opt        SendOptions
	ready      bool
	rkey       uint32
	addr       uint64
	prkey      uint32
	paddr      uint64
	chunk      int
	n          int
	k          int     // data chunks per stripe
	sm         []uint8 // parity chunks of each stripe, chosen as it starts; 0: SR
	stripes    int
	rmx        int // the receiver's parity slots per stripe
	stripe, j  int // injection cursor: the stripe, and the position in it (data, then parity)
	obsHigh    int // the receiver's Highest and Skipped already counted in the loss estimate
	obsSkip    int
	sent       []int64
	tries      []uint8
	acked      *Bitmap
	fl         []bool  // data chunks in flight (flow control)
	fly        int64   // their bytes
	pfly       []int32 // parity bytes in flight per stripe
	pflyAll    int64
	pdone      int // stripes whose parity is no longer in flight
	res        SendResult
	start      time.Duration
	lastStatus time.Duration
	probedAt   time.Duration // when a stall last sent a probe (scanLocked)
	done       bool
	doneCh     chan struct{}
	err        error
}

// Send starts sending data as the next message; it returns at once. data
// must not change until the send completes.
func (c *Conn) Send(ctx context.Context, data []byte, opt *SendOptions) (*Send, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("%w: empty message", ErrConfig)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s := &Send{c: c, data: data, doneCh: make(chan struct{})}
	if opt != nil {
		s.opt = *opt
	}
	var err error
	if s.mr, err = c.pd.RegisterMR(data, verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		s.mr.Deregister()
		return nil, c.err
	}
	s.seq = c.next
	c.next++
	c.sends[s.seq] = s
	c.order = append(c.order, s)
	if m := c.cts[s.seq]; m != nil {
		delete(c.cts, s.seq)
		c.startLocked(s, m)
	}
	return s, nil
}

// Seq is the message's sequence number.
func (s *Send) Seq() uint64 { return s.seq }

// Done is closed when the send completes or fails.
func (s *Send) Done() <-chan struct{} { return s.doneCh }

// Wait blocks until the receiver has every chunk (or took the message).
func (s *Send) Wait(ctx context.Context) (SendResult, error) {
	select {
	case <-s.doneCh:
	case <-ctx.Done():
		return SendResult{}, ctx.Err()
	}
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.res, s.err
}

// startLocked takes the receiver's clear-to-send and picks the scheme.
func (c *Conn) startLocked(s *Send, m *sdrwire.Message) {
	if uint64(len(s.data)) > m.Len {
		s.finishLocked(fmt.Errorf("%w: %d bytes into %d", ErrTooLarge, len(s.data), m.Len))
		return
	}
	s.ready = true
	s.rkey, s.addr, s.prkey, s.paddr = m.RKey, m.Addr, m.ParRKey, m.ParAddr
	s.chunk, s.k, s.rmx = int(m.Chunk), int(m.K), int(m.MaxM)
	s.n = (len(s.data) + s.chunk - 1) / s.chunk
	s.sent = make([]int64, s.n)
	s.tries = make([]uint8, s.n)
	s.acked = NewBitmap(s.n)
	s.stripes = (s.n + s.k - 1) / s.k
	s.sm = make([]uint8, s.stripes)
	s.fl = make([]bool, s.n)
	s.pfly = make([]int32, s.stripes)
	s.res = SendResult{Seq: s.seq, Bytes: len(s.data), Chunk: s.chunk}
	c.peerChunk = s.chunk
	c.wake()
}

// Link is the model's view of the path toward the peer now, for chunks
// of the size the peer last asked for.
func (c *Conn) Link() Link {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.linkLocked(c.peerChunk)
}

func (c *Conn) linkLocked(chunk int) Link {
	rate := c.cfg.Rate
	if c.rc != nil {
		rate = c.rc.Bottleneck()
	} else if rate == 0 {
		rate = 125e6
	}
	pkts := max(1, (chunk+c.mtu-1)/c.mtu)
	return Link{Rate: rate, RTT: c.srtt, Loss: min(ChunkLoss(c.lossLocked(), pkts), 0.5)}
}

// Predict is the model's completion time for size bytes in chunks of
// chunk bytes over the link as the Conn sees it now (Link), by SR when m
// is 0 and by EC(k, m) otherwise, with the Conn's own repair delays.
func (c *Conn) Predict(size int64, chunk, k, m int) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.linkLocked(chunk)
	repair, fallback := c.repairDelays()
	if m == 0 {
		return SRTime(l, size, chunk, repair)
	}
	return ECTime(l, size, chunk, k, m, fallback, repair)
}

func (c *Conn) repairDelays() (repair, fallback time.Duration) {
	repair = c.srtt + max(c.srtt/16, 4*c.rttvar) + time.Millisecond
	fallback = c.cfg.Fallback
	if fallback == 0 {
		fallback = c.srtt / 4
	}
	return repair, fallback
}

// maxDecisions bounds a SendResult's Decisions.
const maxDecisions = 64

// planKey is what a plan was made for besides the link: the scheme and
// parity asked for, and the stripe shape.
type planKey struct {
	scheme           Scheme
	m, k, chunk, rmx int
}

// plan is the model's latest choice. The model takes from 0.1 to 1 ms, so
// it is not asked per stripe: a plan holds while the bytes left stay
// within a factor of planSpan of those it was made for and the link's
// estimate within a factor of planDrift (rechecked at most every quarter
// RTT), which asks it a few dozen times in a transfer of any size.
type plan struct {
	key    planKey
	size   int64 // bytes left it was made for
	link   Link
	seen   float64 // packets the loss estimate rested on
	at     time.Duration
	m      int
	est    Estimate
	reason string
}

const (
	planSpan  = 0.7
	planDrift = 1.5
)

// planFor returns the parity count for the next stripe of s, and false if
// the plan does not cover it: the injector then makes a new plan (planLocked
// and makePlan) before it goes on.
func (c *Conn) planFor(s *Send, now time.Duration) (int, bool) {
	p := c.plan
	key := s.planKey(&c.cfg)
	left := s.left()
	if p == nil || p.key != key || float64(left) < planSpan*float64(p.size) || float64(left)*planSpan > float64(p.size) {
		return 0, false
	}
	if now-p.at >= max(c.srtt/4, 2*time.Millisecond) {
		l := c.linkLocked(s.chunk)
		if drift(l.Loss, p.link.Loss, 1e-5) || drift(l.RTT.Seconds(), p.link.RTT.Seconds(), 0) {
			return 0, false
		}
	}
	if d := s.res.Decisions; len(d) == 0 || (d[len(d)-1].M != p.m && len(d) < maxDecisions) {
		sc := SR
		if p.m > 0 {
			sc = EC
		}
		s.res.Decisions = append(s.res.Decisions, Decision{At: c.epoch.Add(now), Chunk: s.stripe * s.k, Scheme: sc, K: s.k, M: p.m,
			Loss: p.link.Loss, Observed: p.seen, RTT: p.link.RTT, Remaining: left, Estimate: p.est, Reason: p.reason})
		if len(d) == 0 {
			s.res.Estimate, s.res.Reason = p.est, p.reason
		}
	}
	return p.m, true
}

// drift says whether a moved from b by more than a factor of planDrift,
// ignoring differences below floor.
func drift(a, b, floor float64) bool {
	a, b = max(a, floor), max(b, floor)
	return a > b*planDrift || b > a*planDrift
}

// left is the stream's bytes not yet sent, from the current stripe on.
func (s *Send) left() int64 {
	return max(s.opt.Stream, int64(len(s.data))) - int64(s.stripe)*int64(s.k)*int64(s.chunk)
}

func (s *Send) planKey(cfg *Config) planKey {
	scheme, m := s.opt.Scheme, s.opt.M
	if scheme == Auto {
		scheme = cfg.Scheme
	}
	if m == 0 {
		m = cfg.M
	}
	return planKey{scheme, m, s.k, s.chunk, s.rmx}
}

// planRequest is a snapshot for makePlan, which runs without the lock.
type planRequest struct {
	key              planKey
	size             int64
	link             Link
	seen             float64
	repair, fallback time.Duration
	at               time.Duration
}

// planLocked snapshots what a plan for s's next stripe needs.
func (c *Conn) planLocked(s *Send, now time.Duration) planRequest {
	repair, fallback := c.repairDelays()
	return planRequest{key: s.planKey(&c.cfg), size: s.left(), link: c.linkLocked(s.chunk), seen: c.lossD,
		repair: repair, fallback: fallback, at: now}
}

// makePlan asks the model: SR, or EC with each parity count the receiver
// has room for (or the one forced), for the bytes left.
func makePlan(r planRequest) *plan {
	k := r.key
	var ms []int
	for _, v := range []int{1, 2, 4, 8} {
		if v <= k.rmx && (k.m == 0 || v == k.m) {
			ms = append(ms, v)
		}
	}
	if k.m > 0 && len(ms) == 0 {
		ms = []int{min(k.m, k.rmx)}
	}
	p := &plan{key: k, size: r.size, link: r.link, seen: r.seen, at: r.at}
	// The model compares SR and EC for all the bytes left, which is right
	// for a stream's tail but not its body: a stripe followed by more than
	// a repair's time of data has its losses repaired behind that data, at
	// the cost of their repeats only, and the tail's turn to choose comes
	// (this is asked again as the bytes left shrink). So the body goes by
	// selective repeat unless parity would cost less wire than repeats.
	tail := int64(2 * (r.repair + r.fallback).Seconds() * r.link.Rate)
	if k.scheme == Auto && r.size > tail && r.link.Loss < 1/float64(k.k) {
		p.est = Estimate{Scheme: SR, Time: SRTime(r.link, r.size, k.chunk, r.repair), Wire: 1 / (1 - r.link.Loss)}
		p.reason = fmt.Sprintf("%d bytes left, more than the %d bytes of two repairs' time (%v at %.0f Mbit/s): repairs hide behind later data and cost their repeats (chunk loss %.2g, measured over %.0f packets), less than parity (%.1f%% at least)",
			r.size, tail, (r.repair + r.fallback).Round(time.Microsecond), r.link.Rate*8/1e6, r.link.Loss, r.seen, 100/float64(k.k))
		return p
	}
	best, all := Choose(r.link, r.size, k.chunk, k.k, ms, r.repair, r.fallback)
	switch k.scheme {
	case SR:
		p.est, p.reason = all[0], "forced"
	case EC:
		e := all[1]
		for _, v := range all[1:] {
			if v.Time < e.Time {
				e = v
			}
		}
		p.est, p.reason = e, fmt.Sprintf("forced; parity by the model at chunk loss %.2g", r.link.Loss)
	default:
		p.est = best
		p.reason = fmt.Sprintf("model at chunk loss %.2g (measured over %.0f packets), RTT %v, %.0f Mbit/s, %d bytes left: %v",
			r.link.Loss, r.seen, r.link.RTT.Round(time.Microsecond), r.link.Rate*8/1e6, r.size, all)
	}
	p.m = p.est.M
	return p
}

// finishLocked ends the send with err (nil: delivered).
func (s *Send) finishLocked(err error) {
	if s.done {
		return
	}
	s.done = true
	s.err = err
	s.mr.Deregister()
	c := s.c
	c.flyDone(s, err == nil)
	delete(c.sends, s.seq)
	for i, o := range c.order {
		if o == s {
			c.order = append(c.order[:i], c.order[i+1:]...)
			break
		}
	}
	if err == nil {
		s.res.Duration = c.now() - s.start
		s.summarise()
	}
	close(s.doneCh)
	c.broadcastLocked()
}

// onStatusLocked is the sender's state machine for a receiver's status.
func (c *Conn) onStatusLocked(m *sdrwire.Message, now time.Duration) {
	defer func(d int64) {
		if c.fw.delivered != d {
			c.fw.deliveredAt = now
		}
	}(c.fw.delivered)
	c.peerWindowLocked(m.Window)
	if s := c.sends[m.Seq]; s != nil && s.ready {
		s.res.Decoded = max(s.res.Decoded, int(m.Decoded))
		s.res.Partial = m.Flags&sdrwire.FlagTaken != 0
	}
	// Everything below the receiver's floor is complete. A message that
	// never started was taken before any of it was sent: partial.
	for len(c.order) > 0 && c.order[0].seq < m.Floor {
		if !c.order[0].ready {
			c.order[0].res = SendResult{Seq: c.order[0].seq, Partial: true}
		}
		c.order[0].finishLocked(nil)
	}
	s := c.sends[m.Seq]
	if s == nil {
		if m.Seq >= c.next && m.Flags&sdrwire.FlagComplete == 0 {
			cp := *m
			cp.Words = nil
			c.cts[m.Seq] = &cp
		}
		return
	}
	if !s.ready {
		c.startLocked(s, m)
		return
	}
	if m.Flags&sdrwire.FlagComplete != 0 {
		s.finishLocked(nil)
		c.windowOpenLocked()
		return
	}
	s.lastStatus = now
	// The loss estimate: data positions the receiver's highest chunk
	// passed, and how many of them it skipped (lost on their first send).
	if h, k := int(m.Highest), int(m.Skipped); h > s.obsHigh && k >= s.obsSkip && k-s.obsSkip <= h-s.obsHigh {
		pkts := max(1, (s.chunk+c.mtu-1)/c.mtu)
		c.observeLossLocked(float64(k-s.obsSkip), float64((h-s.obsHigh)*pkts))
		s.obsHigh, s.obsSkip = h, k
	}
	// The chunks it acknowledges are round trips too, the receiver's
	// handling included, which pings (answered ahead of a backlog of
	// chunks) miss: the status's freshest first send is one sample.
	cum := min(int(m.Cum), s.n)
	var fresh int64
	progress := c.fw.ackedSent
	for i := s.acked.NextClear(0); i < cum; i = s.acked.NextClear(i) {
		fresh = max(fresh, c.ackLocked(s, i))
	}
	for w, v := range m.Words {
		for v != 0 {
			j := bits.TrailingZeros64(v)
			v &= v - 1
			if i := cum + 64*w + j; i < s.n {
				fresh = max(fresh, c.ackLocked(s, i))
			}
		}
	}
	if fresh > 0 {
		c.rttSampleLocked(now - time.Duration(fresh))
	}
	if fresh > 0 || c.fw.ackedSent != progress {
		// A chunk sent after all those acknowledged before arrived: the
		// stall is over, repeats included (a tail lost on its first
		// send is acknowledged only on a repeat), so the timeout
		// backs off no further.
		c.fw.backoff = 0
	}
	c.parityPast(s, cum)
	known := min(int(m.Highest), cum+64*len(m.Words), s.n)
	repair, fallback := c.repairDelays()
	queued := false
	for i := s.acked.NextClear(cum); i < known; i = s.acked.NextClear(i + 1) {
		if s.sent[i] > 0 && now >= time.Duration(s.sent[i])+s.wait(i, repair, fallback) {
			c.queueLocked(s, i)
			queued = true
		}
	}
	if queued {
		c.wake()
	}
	c.windowOpenLocked()
}

// windowOpenLocked wakes the injector if it waits for the window and
// there is room now.
func (c *Conn) windowOpenLocked() {
	if f := &c.fw; f.blocked && (f.peer == 0 || float64(f.inflight+int64(c.peerChunk)) <= f.peer || f.inflight == 0) {
		c.wake()
	}
}

// wait is how long after its last send a chunk reported missing is
// repaired: a round trip and a margin for the report's age, plus, for a
// first send under EC, the time its stripe gets to decode.
func (s *Send) wait(i int, repair, fallback time.Duration) time.Duration {
	if s.sm[i/s.k] > 0 && s.tries[i] == 1 {
		return repair + fallback
	}
	return repair
}

func (c *Conn) queueLocked(s *Send, i int) {
	c.retx = append(c.retx, c.requeue(s, i))
}

// requeue takes chunk i out of flight to be sent again: declared lost
// (or probed), its repeat counts afresh.
func (c *Conn) requeue(s *Send, i int) chunkRef {
	c.unfly(s, i, false)
	s.sent[i] = -1 // queued
	return chunkRef{s: s, idx: i}
}

// queueProbeLocked queues chunk i as a stall's probe: ahead of the
// repeats, and sent even when the window is full, as TCP's tail loss
// probe ignores its congestion window. A stall declares nothing lost, so
// a window the receiver cut below what is still in flight would
// otherwise hold the probe back until that flight is acknowledged, which
// a lost tail never is.
func (c *Conn) queueProbeLocked(s *Send, i int) {
	r := c.requeue(s, i)
	r.probe = true
	c.retx = slices.Insert(c.retx, 0, r)
}

// scanLocked repairs chunks nobody reported on within the timeout (the
// tail of a message, or lost reports), and asks the receiver for news.
func (c *Conn) scanLocked(now time.Duration) {
	repair, fallback := c.repairDelays()
	rto := c.srtt + max(time.Duration(c.cfg.Alpha*float64(c.srtt)), 4*c.rttvar) + time.Millisecond
	// A chunk sent before one the receiver acknowledged (less a
	// reordering margin) was passed: lost, or the receiver would have
	// reported on it. One sent after is behind the others, in the path
	// or at a receiver that is slow to handle them, unless nothing was
	// acknowledged for an RTO: a stall. Then the tail may be lost, or the
	// receiver may only be descheduled for a while (a few milliseconds
	// on a loaded host, beyond a loopback RTO), so a stall declares
	// nothing lost: it sends each message's two highest overdue chunks
	// again as probes, as TCP's tail loss probe does, and asks for a
	// status.
	// The probe's arrival lifts the receiver's highest chunk above a lost
	// tail, whose chunks its next status then reports as gaps; a
	// receiver that was only slow answers with everything.
	// A timeout on a stall backs off as TCP's does (doubling, until the
	// receiver acknowledges a chunk sent after all it acknowledged before).
	passed := time.Duration(c.fw.ackedSent) - max(c.minRTT/4, time.Millisecond)
	rto <<= c.fw.backoff
	stalled := now-c.fw.ackedAt >= rto
	queued, backoff := false, false
	for _, s := range c.order {
		if !s.ready {
			continue
		}
		late := false
		probe := [2]int{-1, -1} // the two highest overdue chunks
		// Chunks past the injection cursor's stripe were never sent: the
		// scan stops there rather than walk a large message's every
		// chunk each time.
		end := min(s.n, (s.stripe+1)*s.k)
		for i := s.acked.NextClear(0); i < end; i = s.acked.NextClear(i + 1) {
			if s.sent[i] <= 0 {
				continue
			}
			w := rto
			if s.sm[i/s.k] > 0 && s.tries[i] == 1 {
				w += fallback
			}
			if now < time.Duration(s.sent[i])+max(w, repair) {
				continue
			}
			if time.Duration(s.sent[i]) < passed {
				s.res.Timeouts++
				c.queueLocked(s, i)
				queued, late = true, true
			} else if stalled {
				probe = [2]int{i, probe[0]}
			}
		}
		// Two probes (one may be lost too) per message and timeout: a
		// stall outlasting the longest backoff still sends no more.
		if probe[0] >= 0 && (s.probedAt == 0 || now-s.probedAt >= rto) {
			s.probedAt = now
			backoff = true
			for _, i := range probe {
				if i >= 0 {
					s.res.Timeouts++
					c.queueProbeLocked(s, i)
				}
			}
			queued, late = true, true
		}
		if late {
			c.log.Debug("reliability: repeat on timeout", "seq", s.seq, "stripe", s.stripe, "stripes", s.stripes, "acked", s.acked.Count(), "cum", s.acked.NextClear(0), "lastStatus", now-s.lastStatus, "srtt", c.srtt, "now", now)
		}
		if late {
			c.sendCtlLocked(&sdrwire.Message{Type: sdrwire.TypeQuery, Seq: s.seq})
		}
	}
	if queued {
		c.wake()
	}
	if backoff && c.fw.backoff < 6 {
		c.fw.backoff++
	}
}

// packetOverhead is what a chunk's packet adds on the wire beyond its
// payload: IPv4 20, UDP 8, BTH 12, RETH 16, immediate 4, ICRC 4. Pacing
// counts it, or a sender paced at a link's rate would overrun the link.
const packetOverhead = 64

type txScratch struct {
	wrs    []verbs.SendWR
	sges   []verbs.SGE
	mr     *verbs.MR // parity and the padded last chunk
	shards [][]byte
}

// inject is the sender's one goroutine on the wire: repeats first, then
// new chunks of the oldest messages, each batch on the path whose pacing
// lets it go first (Config.PathRates), or round robin when unpaced.
func (c *Conn) inject() {
	defer c.wg.Done()
	tx := &c.tx
	tx.wrs = make([]verbs.SendWR, 0, 64)
	tx.sges = make([]verbs.SGE, 64)
	next := make([]time.Duration, len(c.qps)) // pacing: when each path's next byte may go
	rr := 0
	pace := time.NewTimer(time.Hour)
	defer pace.Stop()
	paced := c.cfg.Rate > 0 || c.rc != nil
	for {
		p := rr
		if paced {
			for i := range next {
				if next[i] < next[p] {
					p = i
				}
			}
		} else {
			rr = (rr + 1) % len(c.qps)
		}
		c.mu.Lock()
		if c.err != nil {
			c.mu.Unlock()
			return
		}
		rate := c.pathRateLocked(p)
		bytes := c.fillLocked(c.now(), rate)
		wire := bytes + len(tx.wrs)*packetOverhead
		var req *planRequest
		if s := c.needPlan; s != nil {
			c.needPlan = nil
			r := c.planLocked(s, c.now())
			req = &r
		}
		var err error
		if len(tx.wrs) > 0 {
			_, err = c.qps[p].PostSend(tx.wrs)
			c.pathBytes[p] += uint64(bytes)
			c.sentAll += int64(bytes)
			c.sentLocked(c.now())
		}
		c.mu.Unlock()
		if err != nil {
			if c.ctx.Err() == nil {
				c.fail(fmt.Errorf("reliability: post chunks on path %d: %w", p, err))
			}
			return
		}
		if req != nil {
			// The model runs without the lock: it takes up to a
			// millisecond, which the poller must not wait for.
			pl := makePlan(*req)
			c.mu.Lock()
			c.plan = pl
			c.mu.Unlock()
			if bytes == 0 {
				continue
			}
		}
		if bytes == 0 {
			select {
			case <-c.kick:
			case <-c.ctx.Done():
				return
			}
			continue
		}
		if paced {
			now := c.now()
			next[p] = max(next[p], now-2*time.Millisecond) + time.Duration(float64(wire)/rate*1e9)
			if d := slices.Min(next) - now; d > time.Millisecond {
				pace.Reset(d)
				select {
				case <-pace.C:
				case <-c.ctx.Done():
					return
				}
			}
		}
	}
}

// pathRateLocked is path p's pacing rate in wire bytes per second (0:
// unpaced): its share of the controller's, which counts payload.
func (c *Conn) pathRateLocked(p int) float64 {
	if c.rc == nil {
		return c.cfg.PathRates[p]
	}
	ch := float64(max(c.peerChunk, 1))
	return c.rc.Rate() * c.shares[p] * (ch + packetOverhead) / ch
}

// RateStats returns the AutoRate controller's account, its events'
// times set; false without AutoRate.
func (c *Conn) RateStats() (RateStats, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rc == nil {
		return RateStats{}, false
	}
	st := c.rc.Stats()
	for i := range st.Events {
		st.Events[i].Time = c.epoch.Add(st.Events[i].At)
	}
	return st, true
}

// PathBytes returns the chunk payload bytes sent on each path so far,
// repeats and parity included.
func (c *Conn) PathBytes() []uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.pathBytes)
}

// fillLocked builds the next batch of chunk writes in c.tx.wrs and returns
// its payload bytes. A batch holds parity of at most one stripe, since
// parity is encoded into one scratch area.
func (c *Conn) fillLocked(now time.Duration, rate float64) int {
	tx := &c.tx
	tx.wrs = tx.wrs[:0]
	bytes := 0
	limit := cap(tx.wrs)
	if rate > 0 {
		// About a millisecond of the path's data per batch, so pacing
		// stays smooth.
		limit = max(1, min(limit, int(rate/1e3)/max(c.cfg.Chunk, 1)))
	}
	for len(c.retx) > 0 && len(tx.wrs) < limit {
		r := c.retx[0]
		c.retx = c.retx[1:]
		if r.s.done || r.s.acked.Test(r.idx) || r.s.sent[r.idx] != -1 {
			continue
		}
		if !r.probe && !c.room(r.s.chunk) {
			c.retx = append([]chunkRef{r}, c.retx...)
			return bytes
		}
		r.s.res.Retransmissions++
		bytes += c.addData(r.s, r.idx, now)
	}
	for _, s := range c.order {
		if !s.ready || s.stripe >= s.stripes {
			continue
		}
		if s.res.Transmissions == 0 {
			s.start = now
		}
		for s.stripe < s.stripes && len(tx.wrs) < limit {
			st := s.stripe
			if s.j == 0 {
				m, ok := c.planFor(s, now)
				if !ok {
					c.needPlan = s
					return bytes
				}
				s.sm[st] = uint8(m)
			}
			kk, m := min(s.k, s.n-st*s.k), int(s.sm[st])
			// A stripe's parity goes out whole once begun (it shares one
			// scratch area): the window is checked before each data chunk
			// and before the parity.
			if s.j <= kk && !c.room(s.chunk) {
				return bytes
			}
			if s.j < kk {
				bytes += c.addData(s, st*s.k+s.j, now)
				s.advance(kk + m)
				continue
			}
			// Parity: a stripe's goes out in one batch of its own, since
			// it is encoded into one scratch area.
			j := s.j - kk
			if j == 0 && len(tx.wrs) > 0 {
				return bytes
			}
			if j == 0 {
				c.encode(s, st, m)
			}
			bytes += c.addParity(s, st, j)
			s.advance(kk + m)
			if j == m-1 {
				return bytes
			}
		}
		if len(tx.wrs) >= limit {
			break
		}
	}
	return bytes
}

// advance moves the injection cursor past one position of a stripe of
// per positions.
func (s *Send) advance(per int) {
	if s.j++; s.j >= per {
		s.stripe, s.j = s.stripe+1, 0
	}
}

// summarise sets the result's scheme to that of most data chunks.
func (s *Send) summarise() {
	var by [256]int // data chunks by parity count
	for st, m := range s.sm {
		by[m] += min(s.k, s.n-st*s.k)
	}
	top := 0
	for m, n := range by {
		if n > by[top] {
			top = m
		}
	}
	s.res.ECChunks = s.n - by[0]
	s.res.Scheme, s.res.K, s.res.M = SR, 0, 0
	if top > 0 {
		s.res.Scheme, s.res.K, s.res.M = EC, s.k, top
	}
}

func imm(s *Send, idx int) uint32 {
	return uint32(s.seq%(1<<idBits))<<idxBits | uint32(idx)
}

func (c *Conn) addData(s *Send, idx int, now time.Duration) int {
	tx := &c.tx
	off := idx * s.chunk
	n := min(s.chunk, len(s.data)-off)
	j := len(tx.wrs)
	tx.sges[j] = s.mr.SGE(off, n)
	tx.wrs = append(tx.wrs, verbs.SendWR{Opcode: verbs.OpWriteImm, SGL: tx.sges[j : j+1],
		RemoteAddr: s.addr + uint64(off), RKey: s.rkey, Imm: imm(s, idx)})
	s.sent[idx] = int64(max(now, 1))
	if s.tries[idx] < math.MaxUint8 {
		s.tries[idx]++
	}
	s.res.Transmissions++
	s.res.WireBytes += int64(n)
	c.fly(s, idx, n)
	if c.testDrop != nil && c.testDrop(s.seq, idx, int(s.tries[idx])) {
		tx.wrs = tx.wrs[:j]
	}
	return n
}

func (c *Conn) addParity(s *Send, stripe, j int) int {
	tx := &c.tx
	k := len(tx.wrs)
	tx.sges[k] = tx.mr.SGE(j*s.chunk, s.chunk)
	p := stripe*s.rmx + j
	tx.wrs = append(tx.wrs, verbs.SendWR{Opcode: verbs.OpWriteImm, SGL: tx.sges[k : k+1],
		RemoteAddr: s.paddr + uint64(p*s.chunk), RKey: s.prkey, Imm: imm(s, s.n+p)})
	s.res.Transmissions++
	s.res.WireBytes += int64(s.chunk)
	if stripe >= s.pdone { // else the receiver has the stripe's data already
		s.pfly[stripe] += int32(s.chunk)
		s.pflyAll += int64(s.chunk)
		c.fw.inflight += int64(s.chunk)
	}
	if c.testDrop != nil && c.testDrop(s.seq, s.n+p, 0) {
		tx.wrs = tx.wrs[:k]
	}
	return s.chunk
}

// encode computes stripe's parity into the scratch area, coding chunks
// past the message's end (and the short last chunk's tail) as zeros.
func (c *Conn) encode(s *Send, stripe, m int) {
	tx := &c.tx
	need := (m + 2) * s.chunk
	if tx.mr == nil || tx.mr.Len() < need {
		if tx.mr != nil {
			tx.mr.Deregister()
		}
		mr, err := c.pd.RegisterMR(make([]byte, max(need, 10*s.chunk)), verbs.AccessLocalWrite)
		if err != nil {
			c.failLocked(fmt.Errorf("reliability: parity buffer: %w", err))
			return
		}
		tx.mr = mr
	}
	key := [2]int{s.k, m}
	enc := c.enc[key]
	if enc == nil {
		var err error
		if enc, err = reedsolomon.New(s.k, m, reedsolomon.WithCauchyMatrix()); err != nil {
			c.failLocked(fmt.Errorf("reliability: encoder: %w", err))
			return
		}
		c.enc[key] = enc
	}
	buf := tx.mr.Bytes()
	pad := buf[m*s.chunk : (m+1)*s.chunk] // padded copy of a short chunk
	zero := buf[(m+1)*s.chunk : (m+2)*s.chunk]
	clear(zero)
	if cap(tx.shards) < s.k+m {
		tx.shards = make([][]byte, s.k+m)
	}
	sh := tx.shards[:s.k+m]
	for i := 0; i < s.k; i++ {
		off := (stripe*s.k + i) * s.chunk
		switch {
		case off >= len(s.data):
			sh[i] = zero
		case off+s.chunk > len(s.data):
			clear(pad)
			copy(pad, s.data[off:])
			sh[i] = pad
		default:
			sh[i] = s.data[off : off+s.chunk]
		}
	}
	for j := 0; j < m; j++ {
		sh[s.k+j] = buf[j*s.chunk : (j+1)*s.chunk]
	}
	if err := enc.Encode(sh); err != nil {
		c.failLocked(fmt.Errorf("reliability: encode: %w", err))
	}
}
