package reliability

import (
	"context"
	"fmt"
	"math"
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

// SendResult describes a completed send.
type SendResult struct {
	Seq             uint64
	Bytes           int
	Scheme          Scheme
	K, M            int           // EC stripe (0 for SR)
	Estimate        Estimate      // the model's prediction for the choice
	Reason          string        // why the scheme was chosen
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
	k, m       int // stripe; m = 0 for SR
	rmx        int // the receiver's parity slots per stripe
	pos        int // injection cursor
	total      int // positions: data, and parity with EC
	sent       []int64
	tries      []uint8
	acked      *Bitmap
	res        SendResult
	start      time.Duration
	lastStatus time.Duration
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
	s.res = SendResult{Seq: s.seq, Bytes: len(s.data), Chunk: s.chunk}
	c.chooseLocked(s)
	stripes := (s.n + s.k - 1) / s.k
	s.total = s.n + stripes*s.m
	s.res.Scheme, s.res.K, s.res.M = SR, 0, 0
	if s.m > 0 {
		s.res.Scheme, s.res.K, s.res.M = EC, s.k, s.m
	}
	c.wake()
}

// Link is the model's view of the path toward the peer now.
func (c *Conn) Link() Link {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.linkLocked()
}

func (c *Conn) linkLocked() Link {
	rate := c.cfg.Rate
	if rate == 0 {
		rate = 125e6
	}
	return Link{Rate: rate, RTT: c.srtt, Loss: min(c.lossLocked(), 0.5)}
}

// Predict is the model's completion time for size bytes in chunks of
// chunk bytes over the link as the Conn sees it now (Link), by SR when m
// is 0 and by EC(k, m) otherwise, with the Conn's own repair delays.
func (c *Conn) Predict(size int64, chunk, k, m int) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.linkLocked()
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

func (c *Conn) chooseLocked(s *Send) {
	scheme, m := s.opt.Scheme, s.opt.M
	if scheme == Auto {
		scheme = c.cfg.Scheme
	}
	if m == 0 {
		m = c.cfg.M
	}
	size := max(s.opt.Stream, int64(len(s.data)))
	l := c.linkLocked()
	repair, fallback := c.repairDelays()
	var ms []int
	for _, v := range []int{1, 2, 4, 8} {
		if v <= s.rmx && (m == 0 || v == m) {
			ms = append(ms, v)
		}
	}
	if m > 0 && len(ms) == 0 {
		ms = []int{min(m, s.rmx)}
	}
	best, all := Choose(l, size, s.chunk, s.k, ms, repair, fallback)
	switch scheme {
	case SR:
		s.res.Estimate, s.res.Reason = all[0], "forced"
	case EC:
		e := all[1]
		for _, v := range all[1:] {
			if v.Time < e.Time {
				e = v
			}
		}
		s.res.Estimate, s.res.Reason = e, "forced"
	default:
		s.res.Estimate = best
		s.res.Reason = fmt.Sprintf("model at chunk loss %.2g, RTT %v, %.0f Mbit/s over %d bytes: %v", l.Loss, l.RTT.Round(time.Microsecond), l.Rate*8/1e6, size, all)
	}
	s.m = s.res.Estimate.M
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
	delete(c.sends, s.seq)
	for i, o := range c.order {
		if o == s {
			c.order = append(c.order[:i], c.order[i+1:]...)
			break
		}
	}
	if err == nil {
		s.res.Duration = c.now() - s.start
		// The loss estimate: with SR every repeat is a loss; with EC the
		// rebuilt chunks are too (parity loses at the same rate).
		lost := float64(s.res.Retransmissions + s.res.Decoded)
		c.lossN = c.lossN*0.7 + lost
		c.lossD = c.lossD*0.7 + float64(s.n)
	}
	close(s.doneCh)
	c.broadcastLocked()
}

// onStatusLocked is the sender's state machine for a receiver's status.
func (c *Conn) onStatusLocked(m *sdrwire.Message, now time.Duration) {
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
		return
	}
	s.lastStatus = now
	cum := min(int(m.Cum), s.n)
	for i := s.acked.NextClear(0); i < cum; i = s.acked.NextClear(i) {
		s.acked.Set(i)
	}
	s.acked.Merge(cum, m.Words)
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
}

// wait is how long after its last send a chunk reported missing is
// repaired: a round trip and a margin for the report's age, plus, for a
// first send under EC, the time its stripe gets to decode.
func (s *Send) wait(i int, repair, fallback time.Duration) time.Duration {
	if s.m > 0 && s.tries[i] == 1 {
		return repair + fallback
	}
	return repair
}

func (c *Conn) queueLocked(s *Send, i int) {
	s.sent[i] = -1 // queued
	c.retx = append(c.retx, chunkRef{s, i})
}

// scanLocked repairs chunks nobody reported on within the timeout (the
// tail of a message, or lost reports), and asks the receiver for news.
func (c *Conn) scanLocked(now time.Duration) {
	repair, fallback := c.repairDelays()
	rto := c.srtt + max(time.Duration(c.cfg.Alpha*float64(c.srtt)), 4*c.rttvar) + time.Millisecond
	queued := false
	for _, s := range c.order {
		if !s.ready {
			continue
		}
		late := false
		for i := s.acked.NextClear(0); i < s.n; i = s.acked.NextClear(i + 1) {
			if s.sent[i] <= 0 {
				continue
			}
			w := rto
			if s.m > 0 && s.tries[i] == 1 {
				w += fallback
			}
			if now >= time.Duration(s.sent[i])+max(w, repair) {
				s.res.Timeouts++
				c.queueLocked(s, i)
				queued, late = true, true
			}
		}
		if late {
			c.log.Debug("reliability: repeat on timeout", "seq", s.seq, "pos", s.pos, "total", s.total, "acked", s.acked.Count(), "cum", s.acked.NextClear(0), "lastStatus", now-s.lastStatus, "srtt", c.srtt, "now", now)
		}
		if late {
			c.sendCtlLocked(&sdrwire.Message{Type: sdrwire.TypeQuery, Seq: s.seq})
		}
	}
	if queued {
		c.wake()
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
	for {
		p := rr
		if c.cfg.Rate > 0 {
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
		bytes := c.fillLocked(c.now(), c.cfg.PathRates[p])
		wire := bytes + len(tx.wrs)*packetOverhead
		var err error
		if len(tx.wrs) > 0 {
			_, err = c.qps[p].PostSend(tx.wrs)
			c.pathBytes[p] += uint64(bytes)
		}
		c.mu.Unlock()
		if err != nil {
			if c.ctx.Err() == nil {
				c.fail(fmt.Errorf("reliability: post chunks on path %d: %w", p, err))
			}
			return
		}
		if bytes == 0 {
			select {
			case <-c.kick:
			case <-c.ctx.Done():
				return
			}
			continue
		}
		if c.cfg.Rate > 0 {
			now := c.now()
			next[p] = max(next[p], now-2*time.Millisecond) + time.Duration(float64(wire)/c.cfg.PathRates[p]*1e9)
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
		r.s.res.Retransmissions++
		bytes += c.addData(r.s, r.idx, now)
	}
	for _, s := range c.order {
		if !s.ready || s.pos >= s.total {
			continue
		}
		if s.pos == 0 && s.res.Transmissions == 0 {
			s.start = now
		}
		for s.pos < s.total && len(tx.wrs) < limit {
			idx, parity, stripe, j := s.position(s.pos)
			if !parity {
				s.pos++
				bytes += c.addData(s, idx, now)
				continue
			}
			if j == 0 && len(tx.wrs) > 0 {
				return bytes // parity starts a batch of its own
			}
			if j == 0 {
				c.encode(s, stripe)
			}
			s.pos++
			bytes += c.addParity(s, stripe, j)
			if j == s.m-1 {
				return bytes
			}
		}
		if len(tx.wrs) >= limit {
			break
		}
	}
	return bytes
}

// position maps an injection position to a data chunk or a stripe's
// parity: with EC each stripe's data goes out, then its parity.
func (s *Send) position(p int) (idx int, parity bool, stripe, j int) {
	if s.m == 0 {
		return p, false, 0, 0
	}
	full := s.n / s.k
	per := s.k + s.m
	if p < full*per {
		stripe, j = p/per, p%per
	} else {
		stripe, j = full, p-full*per
	}
	kk := min(s.k, s.n-stripe*s.k)
	if j < kk {
		return stripe*s.k + j, false, stripe, j
	}
	return 0, true, stripe, j - kk
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
	if c.testDrop != nil && c.testDrop(s.seq, s.n+p, 0) {
		tx.wrs = tx.wrs[:k]
	}
	return s.chunk
}

// encode computes stripe's parity into the scratch area, coding chunks
// past the message's end (and the short last chunk's tail) as zeros.
func (c *Conn) encode(s *Send, stripe int) {
	tx := &c.tx
	need := (s.m + 2) * s.chunk
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
	key := [2]int{s.k, s.m}
	enc := c.enc[key]
	if enc == nil {
		var err error
		if enc, err = reedsolomon.New(s.k, s.m, reedsolomon.WithCauchyMatrix()); err != nil {
			c.failLocked(fmt.Errorf("reliability: encoder: %w", err))
			return
		}
		c.enc[key] = enc
	}
	buf := tx.mr.Bytes()
	pad := buf[s.m*s.chunk : (s.m+1)*s.chunk] // padded copy of a short chunk
	zero := buf[(s.m+1)*s.chunk : (s.m+2)*s.chunk]
	clear(zero)
	if cap(tx.shards) < s.k+s.m {
		tx.shards = make([][]byte, s.k+s.m)
	}
	sh := tx.shards[:s.k+s.m]
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
	for j := 0; j < s.m; j++ {
		sh[s.k+j] = buf[j*s.chunk : (j+1)*s.chunk]
	}
	if err := enc.Encode(sh); err != nil {
		c.failLocked(fmt.Errorf("reliability: encode: %w", err))
	}
}
