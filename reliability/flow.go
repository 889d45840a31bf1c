package reliability

import "time"

// Receiver-driven flow control.
//
// The receiver advertises a window in every status (sdrwire's Window):
// the bytes of chunks it lets the sender have in flight toward it. The
// sender counts a chunk in flight from its send until the receiver's
// bitmap acknowledges it, or until it is declared lost (queued to be sent
// again: the repeat counts afresh), or its message completes; a stripe's
// parity until the receiver's cumulative point passes the stripe. It
// sends nothing, repeats included, that would take its bytes in flight
// past the latest window (one chunk always may go when none is in
// flight).
//
// The receiver starts at what its posted receives hold (less an eighth
// for control messages), the most it takes without a drop while it keeps
// up, so that a long path fills within a round trip or two; its floor is
// Config.RecvWindow. Every half round trip (at least 5 ms) it looks at
// what arrived: if
// packets were dropped before it saw them (Config.Drops) or completions
// piled up unhandled (a quarter of the receive queue), it halves the
// window, and does not cut again for a round trip (the sender has not
// seen the cut yet); otherwise it doubles it, up to four times the bytes
// that arrive in a round trip at the best rate of the last few intervals
// (plus the floor; the smallest round trip seen, so that the delay of a
// backlog does not count), to Config.MaxRecvWindow, and to a round trip's
// bytes plus seven eighths of the chunks its posted receives take (a
// chunk that finds no receive is dropped). A receiver that keeps up
// so opens the window to what the path holds within a few round trips;
// one that falls behind slows the sender to what it takes, and the
// excess waits at the sender instead of being dropped in its socket.

// recvWindow is the receiver's side (under Conn.mu).
type recvWindow struct {
	wnd    float64       // bytes; 0: not started
	at     time.Duration // last update
	rxAt   int64         // rx at the last update
	rx     int64         // distinct chunk bytes arrived
	peak   float64       // bytes/s, the best recent interval's arrival rate, decaying
	hold   time.Duration // no cut before this
	drops  uint64        // Config.Drops at the last update
	seen   bool          // drops is a baseline
	behind bool          // completions piled up since the last update
	cuts   int
	lost   uint64 // packets Config.Drops counted during the transfer
	min    float64
	max    float64
}

// advertised is the window a status carries now (0: none).
func (w *recvWindow) advertised(cfg *Config) uint64 {
	if cfg.RecvWindow < 0 {
		return 0
	}
	if w.wnd == 0 {
		return uint64(cfg.recvStart())
	}
	return uint64(w.wnd)
}

// recvStart is the window to start from: all the backlog the receives
// hold, which the receiver takes without a drop unless it falls behind,
// and so a path's bandwidth-delay product within a round trip or two.
func (cfg *Config) recvStart() float64 {
	return min(cfg.recvCap(), float64(cfg.MaxRecvWindow))
}

// recvCap is the most backlog a receive window may allow: every chunk
// that arrived may take a posted receive before it is handled (UC drops
// one that finds none), so what the receive queue holds, less an eighth
// (at least one) for control messages, and at least one chunk.
func (cfg *Config) recvCap() float64 {
	return float64(max(1, cfg.RecvDepth-max(1, cfg.RecvDepth/8))) * float64(cfg.Chunk)
}

// windowLocked updates the receive window (called every tick).
func (c *Conn) windowLocked(now time.Duration) {
	w, cfg := &c.rw, &c.cfg
	if cfg.RecvWindow < 0 {
		return
	}
	rq := cfg.recvCap()
	floor := min(float64(cfg.RecvWindow), rq)
	if w.wnd == 0 {
		start := cfg.recvStart()
		w.wnd, w.at, w.min, w.max = start, now, start, start
	}
	iv := max(c.srtt/2, 5*time.Millisecond)
	if now-w.at < iv {
		return
	}
	dt := (now - w.at).Seconds()
	rate := float64(w.rx-w.rxAt) / dt
	w.at, w.rxAt = now, w.rx
	w.peak = max(rate, w.peak*0.8)
	var dropped uint64
	if cfg.Drops != nil {
		d := cfg.Drops()
		if w.seen && d > w.drops {
			dropped = d - w.drops
		}
		w.drops, w.seen = d, true
	}
	w.lost += dropped
	behind := w.behind
	w.behind = false
	switch {
	case dropped > 0 || behind:
		if now >= w.hold {
			w.wnd = max(floor, w.wnd/2)
			w.hold = now + c.srtt + iv
			w.cuts++
		}
	case now >= w.hold:
		// The path's own round trip, not the smoothed one: a receiver
		// that falls behind delays its pongs, and a window sized by
		// that delay would grow with the backlog it causes.
		rtt := c.minRTT
		if rtt == 0 {
			rtt = c.srtt
		}
		// Beyond the bytes a round trip holds on the path, the window is
		// backlog at this end, each chunk of which may take a posted
		// receive before it is handled: so it stays within what the
		// receives hold (rq) on top of the path's own bytes.
		limit := min(float64(cfg.MaxRecvWindow), rq+w.peak*rtt.Seconds(), floor+4*w.peak*max(rtt, cfg.MinRTT).Seconds())
		if w.wnd < limit {
			w.wnd = min(w.wnd*2, limit)
		}
	}
	w.min, w.max = min(w.min, w.wnd), max(w.max, w.wnd)
}

// sendWindow is the sender's side (under Conn.mu).
type sendWindow struct {
	peer        float64       // the receiver's latest window; 0: none
	inflight    int64         // chunk bytes in flight
	delivered   int64         // chunk bytes acknowledged, in all
	deliveredAt time.Duration // when the status that last moved it arrived
	ackedSent   int64         // the latest send time of a chunk acknowledged
	ackedAt     time.Duration // when ackedSent last moved, or the flight began
	backoff     uint          // the RTO's doublings since ackedSent last moved
	blocked     bool          // the injector stopped at the window
	since       time.Duration
	waited      time.Duration
	min, max    float64
	cuts        int
	stalled     bool          // chunks in flight, none acknowledged for stallAfter
	stalls      int           // times it stalled so
	longest     time.Duration // the longest stall (the current one included)
}

// stallAfter is how long chunks in flight go unacknowledged before the
// sender counts a stall: the path down, or the receiver stopped. The
// rate controller counts its own (it sees deliveries); this one is for
// a sender paced at a fixed rate.
const stallAfter = time.Second

// stallLocked notes whether the sender is in a stall (called every tick).
func (c *Conn) stallLocked(now time.Duration) {
	f := &c.fw
	d := now - f.ackedAt
	if f.inflight == 0 || d < stallAfter {
		f.stalled = false
		return
	}
	if !f.stalled {
		f.stalled = true
		f.stalls++
	}
	f.longest = max(f.longest, d)
}

// room says whether n more bytes may go.
func (c *Conn) room(n int) bool {
	f := &c.fw
	if f.peer == 0 || f.inflight == 0 || float64(f.inflight+int64(n)) <= f.peer {
		return true
	}
	if !f.blocked {
		f.blocked, f.since = true, c.now()
	}
	return false
}

// sentLocked notes that the injector sent something: a wait for the
// window, if any, is over.
func (c *Conn) sentLocked(now time.Duration) {
	if f := &c.fw; f.blocked {
		f.blocked = false
		f.waited += now - f.since
	}
}

// peerWindowLocked takes the window of a receiver's status.
func (c *Conn) peerWindowLocked(w uint64) {
	f := &c.fw
	v := float64(w)
	if f.peer != 0 && v < f.peer {
		f.cuts++
	}
	if f.peer == 0 && v > 0 {
		f.min, f.max = v, v
	}
	f.peer = v
	if v > 0 {
		f.min, f.max = min(f.min, v), max(f.max, v)
	}
}

// fly counts data chunk i of s in flight; unfly takes it out (acked:
// delivered too).
func (c *Conn) fly(s *Send, i, n int) {
	if !s.fl[i] {
		if c.fw.inflight == 0 {
			c.fw.ackedAt = c.now()
		}
		s.fl[i] = true
		s.fly += int64(n)
		c.fw.inflight += int64(n)
	}
}

func (c *Conn) unfly(s *Send, i int, acked bool) {
	if s.fl == nil || !s.fl[i] {
		return
	}
	s.fl[i] = false
	n := int64(min(s.chunk, len(s.data)-i*s.chunk))
	s.fly -= n
	c.fw.inflight -= n
	if acked {
		c.fw.delivered += n
	}
}

// ackLocked sets chunk i of s acknowledged; it returns when the chunk
// was sent if that was its only send and it was in flight (a round trip
// that measures), else 0.
func (c *Conn) ackLocked(s *Send, i int) int64 {
	if !s.acked.Set(i) {
		return 0
	}
	var t int64
	if s.tries[i] == 1 && s.fl[i] && s.sent[i] > 0 {
		t = s.sent[i]
	}
	if f := &c.fw; s.sent[i] > f.ackedSent {
		f.ackedSent, f.ackedAt = s.sent[i], c.now()
	}
	c.unfly(s, i, true)
	return t
}

// parityPast releases the parity of the stripes the receiver's
// cumulative point cum passed.
func (c *Conn) parityPast(s *Send, cum int) {
	for s.pdone < s.stripes && min((s.pdone+1)*s.k, s.n) <= cum {
		n := int64(s.pfly[s.pdone])
		s.pfly[s.pdone] = 0
		s.pflyAll -= n
		c.fw.inflight -= n
		c.fw.delivered += n
		s.pdone++
	}
}

// flyDone takes a finished send's chunks out of flight (delivered: the
// receiver has them, as its completion says).
func (c *Conn) flyDone(s *Send, delivered bool) {
	c.fw.inflight -= s.fly + s.pflyAll
	if delivered {
		c.fw.delivered += s.fly + s.pflyAll
	}
	s.fly, s.pflyAll = 0, 0
}

// FlowStats describes flow control on a Conn: as a sender, the windows
// its peer advertised and how long it waited for them; as a receiver,
// its own.
type FlowStats struct {
	PeerWindow, PeerMin, PeerMax int64 // bytes; 0: none advertised
	PeerCuts                     int   // times the peer's window shrank
	Waited                       time.Duration
	InFlight                     int64 // chunk bytes in flight now
	// Stalls is the times chunks were in flight and none was
	// acknowledged for a second or more (the path down, or the receiver
	// stopped); LongestStall the longest (an ongoing one included).
	Stalls       int
	LongestStall time.Duration

	Window, WindowMin, WindowMax int64 // this end's, as a receiver
	Cuts                         int   // times this end halved it
	Dropped                      uint64
}

// Flow returns the flow-control figures.
func (c *Conn) Flow() FlowStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, w := &c.fw, &c.rw
	waited := f.waited
	if f.blocked {
		waited += c.now() - f.since
	}
	return FlowStats{PeerWindow: int64(f.peer), PeerMin: int64(f.min), PeerMax: int64(f.max), PeerCuts: f.cuts,
		Waited: waited, InFlight: f.inflight, Stalls: f.stalls, LongestStall: f.longest,
		Window: int64(w.wnd), WindowMin: int64(w.min), WindowMax: int64(w.max), Cuts: w.cuts, Dropped: w.lost}
}
