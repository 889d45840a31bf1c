package reliability

import (
	"fmt"
	"time"
)

// RateControl finds the injection rate (Config.AutoRate): the path's
// bottleneck rate from the start-up probe train's dispersion, then a
// delay-based controller in the spirit of BBR.
//
// It works in rounds of at least a round trip (RateConfig.MinRound).
// Each round ends with a sample: the payload bytes acknowledged in it
// over its length (the delivery rate), the bytes sent, and the smallest
// round trip seen in it. The bottleneck estimate is the largest delivery
// rate of the last BWRounds rounds that delivered anything, and the
// pacing rate a gain times it:
//
//   - Startup (gain 2) while the estimate grows by a quarter a round;
//     three rounds without, or a queue, end it. A dispersed probe train
//     skips it for Cruise: the path's rate is known to start with.
//   - Drain (gain 1/2) until the round's smallest RTT is back within the
//     queue margin of the path's own, or until half the rate should have
//     drained the queue it entered with (a queue that stays is not this
//     sender's).
//   - Cruise (gain 1) for CruiseRounds rounds, then ProbeUp (gain 5/4)
//     for one round and ProbeDown (gain 3/4) for the next, which also
//     measures what the probe delivered (acknowledgements come a round
//     trip after the sends): if the estimate grew by a tenth, the path
//     has more room and it probes again at once, else back to Cruise.
//
// A queue, two rounds in a row whose every RTT sample exceeds the path's
// smallest by the margin (an eighth of it plus QueueDelay), means
// the rate is above the bottleneck: the delivery rate under a standing
// queue is the bottleneck's, so the estimate becomes that (at most
// halved at once) and it drains. Loss is not an input: the reliability
// layer repairs it, repeats are delivered bytes like any others, and a
// random loss of 1e-2 moves the delivery rate by about that much. A
// round with nothing delivered while bytes are in flight (a blackout)
// leaves the estimate as it was and does not age it; the report says
// how long delivery stopped.
//
// It is a state machine with time passed in: it reads no clock, and
// tests drive it with synthetic samples. It is not safe for concurrent
// use (the Conn calls it under its lock).
type RateControl struct {
	cfg   RateConfig
	phase RatePhase
	bw    float64 // the bottleneck estimate, bytes/s
	hist  []float64
	gain  float64

	minRTT       time.Duration // the path's own round trip: the smallest sample of the last MinRTTWindow
	minRTTAt     time.Duration // when it was taken
	nextMin      time.Duration // the smallest since minRTTAt+MinRTTWindow/2: the next window's
	started      bool          // Tick began the rounds
	begun        bool          // Start or Tick said where it starts
	roundAt      time.Duration
	roundSent    int64
	roundDeliv   int64
	roundDelivAt time.Duration
	roundMin     time.Duration // smallest RTT sample this round
	prevSend     float64       // the previous round's send rate

	rounds    int // in this phase
	flat      int // Startup: rounds without growth
	best      float64
	queued    int     // consecutive rounds with a queue
	probeFrom float64 // the estimate before this ProbeUp
	drainBy   time.Duration
	silent    time.Duration
	stalls    int
	longest   time.Duration

	lo, hi  float64 // the estimate's range after Startup
	sumBW   float64 // the estimate times seconds, over rounds that delivered
	sumT    float64
	drains  int // queues drained with the estimate cut by less than a tenth
	events  []RateEvent
	dropped int
}

// RateConfig tunes a RateControl. The zero value means defaults.
type RateConfig struct {
	// Start is the rate in bytes per second to start at when the probe
	// train measured nothing. Default 12.5e6 (100 Mbit/s).
	Start float64
	// Min and Max bound the pacing rate (bytes/s). Default 125e3
	// (1 Mbit/s) and no bound.
	Min, Max float64
	// MinRound is the shortest round. Default 10ms.
	MinRound time.Duration
	// QueueDelay is the least RTT inflation read as a queue. Default 2ms.
	QueueDelay time.Duration
	// BWRounds is the delivery rate's max filter length in rounds that
	// delivered. Default 10.
	BWRounds int
	// CruiseRounds is the rounds at gain 1 between probes. Default 6.
	CruiseRounds int
	// MinRTTWindow is how long the path's smallest RTT holds without a
	// new sample at or below it. Default 10s.
	MinRTTWindow time.Duration
}

// RatePhase is a RateControl's state.
type RatePhase int

const (
	RateStartup RatePhase = iota
	RateDrain
	RateCruise
	RateProbeUp
	RateProbeDown
)

func (p RatePhase) String() string {
	switch p {
	case RateStartup:
		return "startup"
	case RateDrain:
		return "drain"
	case RateCruise:
		return "cruise"
	case RateProbeUp:
		return "probe-up"
	case RateProbeDown:
		return "probe-down"
	}
	return fmt.Sprintf("phase(%d)", int(p))
}

// RateEvent is one move of the estimate worth reporting.
type RateEvent struct {
	At    time.Duration // on the clock passed in
	Time  time.Time     // the same, set by Conn.RateStats
	Phase RatePhase     // after the event
	Rate  float64       // the bottleneck estimate after it, bytes/s
	Why   string
}

// RateSample is what a round's end reads: counters kept since the start,
// in payload bytes (parity and repeats included).
type RateSample struct {
	Sent      int64 // put on the wire
	Delivered int64 // acknowledged by the receiver
	// DeliveredAt is when Delivered last moved (0: unknown): the
	// acknowledgements come in batches, and a round's delivery rate
	// counts from one batch to another, not from tick to tick.
	DeliveredAt time.Duration
	InFlight    int64 // sent and neither acknowledged nor declared lost
}

// maxRateEvents bounds the events kept; later ones are counted.
const maxRateEvents = 64

// NewRateControl returns a controller in Startup at cfg.Start.
func NewRateControl(cfg RateConfig) *RateControl {
	if cfg.Start <= 0 {
		cfg.Start = 12.5e6
	}
	if cfg.Min <= 0 {
		cfg.Min = 125e3
	}
	if cfg.MinRound <= 0 {
		cfg.MinRound = 10 * time.Millisecond
	}
	if cfg.QueueDelay <= 0 {
		cfg.QueueDelay = 2 * time.Millisecond
	}
	if cfg.BWRounds <= 0 {
		cfg.BWRounds = 10
	}
	if cfg.CruiseRounds <= 0 {
		cfg.CruiseRounds = 6
	}
	if cfg.MinRTTWindow <= 0 {
		cfg.MinRTTWindow = 10 * time.Second
	}
	r := &RateControl{cfg: cfg, phase: RateStartup, gain: 2}
	r.bw = r.clamp(cfg.Start)
	return r
}

func (r *RateControl) clamp(v float64) float64 {
	v = max(v, r.cfg.Min)
	if r.cfg.Max > 0 {
		v = min(v, r.cfg.Max)
	}
	return v
}

// Start takes the probe train's measurement at now: the rate its echoes
// came back at (bytes/s; 0: none) and the rate it was sent at (0:
// unpaced, as fast as the host could). An echo rate well below the send
// rate is the path's bottleneck: the controller starts there, probing up.
// One about equal to it says only that the path is at least that fast:
// it starts there in Startup.
func (r *RateControl) Start(now time.Duration, dispersion, train float64) {
	r.begun = true
	switch {
	case dispersion <= 0:
		r.event(now, fmt.Sprintf("start at %s: the probe train measured no dispersion", mbps(r.bw)))
	case train > 0 && dispersion < 0.8*train:
		r.bw = r.clamp(dispersion)
		r.hist = append(r.hist[:0], r.bw)
		r.setPhase(RateCruise) // a few rounds at it before probing
		r.event(now, fmt.Sprintf("start at %s: the probe train, sent at %s, came back dispersed to it (the bottleneck)", mbps(r.bw), mbps(train)))
	default:
		// Echoes that came back faster than the train went out were
		// bunched on the way (a late first echo): the send rate is the
		// bound then.
		if train > 0 {
			dispersion = min(dispersion, train)
		}
		r.bw = r.clamp(dispersion)
		r.setPhase(RateStartup)
		how := "unpaced"
		if train > 0 {
			how = "sent at " + mbps(train)
		}
		r.event(now, fmt.Sprintf("start at %s: the probe train (%s) came back at that rate, a lower bound: startup", mbps(r.bw), how))
	}
}

// OnRTT takes a round-trip sample.
func (r *RateControl) OnRTT(now, rtt time.Duration) {
	if rtt <= 0 {
		return
	}
	if r.roundMin == 0 || rtt < r.roundMin {
		r.roundMin = rtt
	}
	switch {
	case r.minRTT == 0 || rtt <= r.minRTT:
		r.minRTT, r.minRTTAt, r.nextMin = rtt, now, 0
	case now-r.minRTTAt >= r.cfg.MinRTTWindow/2 && (r.nextMin == 0 || rtt < r.nextMin):
		r.nextMin = rtt
	}
	if now-r.minRTTAt >= r.cfg.MinRTTWindow && r.nextMin > 0 {
		// The path's round trip grew (a new route), or the old minimum
		// was a fluke: the last half window's smallest takes over.
		r.minRTT, r.minRTTAt, r.nextMin = r.nextMin, now, 0
	}
}

// Tick ends a round if one is due at now, with the counters as they are.
func (r *RateControl) Tick(now time.Duration, s RateSample) {
	if !r.begun && s.Sent > 0 {
		r.begun = true
		r.event(now, fmt.Sprintf("start at %s without a probe train: startup", mbps(r.bw)))
	}
	if !r.started {
		r.started = true
		r.roundAt, r.roundSent, r.roundDeliv, r.roundDelivAt = now, s.Sent, s.Delivered, s.DeliveredAt
		return
	}
	dt := now - r.roundAt
	if dt < r.round() {
		return
	}
	sent, deliv, rtt := s.Sent-r.roundSent, s.Delivered-r.roundDeliv, r.roundMin
	ddt := dt
	if r.roundDelivAt > 0 && s.DeliveredAt-r.roundDelivAt > dt/2 {
		ddt = s.DeliveredAt - r.roundDelivAt
	}
	r.roundAt, r.roundSent, r.roundDeliv, r.roundDelivAt, r.roundMin = now, s.Sent, s.Delivered, s.DeliveredAt, 0
	r.endRound(now, dt, ddt, sent, deliv, s.InFlight, rtt)
}

func (r *RateControl) round() time.Duration {
	return max(r.minRTT, r.cfg.MinRound)
}

// endRound takes a round of dt that sent sent bytes and delivered deliv
// over ddt (from one acknowledgement to another).
func (r *RateControl) endRound(now, dt, ddt time.Duration, sent, deliv, inflight int64, rtt time.Duration) {
	sec := dt.Seconds()
	sendRate := float64(sent) / sec
	if deliv <= 0 {
		if inflight > 0 || sent > 0 {
			// Nothing came back though bytes are out: the path (or the
			// receiver) went silent. The estimate holds, unaged: a path
			// that comes back comes back at its rate.
			r.silent += dt
			if (r.phase == RateProbeUp || r.phase == RateStartup) && r.silent >= max(4*r.round(), 100*time.Millisecond) {
				r.setPhase(RateCruise) // no probing into a void
			}
			if r.silent >= time.Second && r.silent-dt < time.Second {
				r.event(now, fmt.Sprintf("nothing delivered for %v: the path is down or the receiver stalled; the estimate stays at %s", r.silent.Round(time.Millisecond), mbps(r.bw)))
			}
		}
		r.prevSend = sendRate
		return
	}
	if r.silent >= time.Second {
		r.stalls++
		r.longest = max(r.longest, r.silent)
		r.event(now, fmt.Sprintf("delivery resumed after %v without any; the estimate is %s", r.silent.Round(time.Millisecond), mbps(r.bw)))
	}
	r.silent = 0
	// A round's acknowledgements are for what went out about a round
	// earlier: the delivery rate may exceed this round's send rate (the
	// round after a probe) but not both rounds' (a burst of late
	// acknowledgements, after a blackout, is no rate).
	raw := float64(deliv) / ddt.Seconds()
	sentRate := max(sendRate, r.prevSend) // what this round's acknowledgements can be for
	rate := min(raw, sentRate*1.05)
	pacing := r.Rate()
	// A round that sent below its rate (the window, or nothing left to
	// send), or drained on purpose, says nothing of the path when it
	// delivered less than the estimate.
	limited := (sendRate < 0.8*pacing && r.prevSend < 0.8*pacing) || r.phase == RateDrain
	r.prevSend = sendRate
	if rate > 0 && (!limited || rate >= r.bw) {
		r.hist = append(r.hist, rate)
		if len(r.hist) > r.cfg.BWRounds {
			r.hist = r.hist[1:]
		}
	}
	r.sumBW += r.bw * sec
	r.sumT += sec
	old := r.bw
	if len(r.hist) > 0 {
		m := 0.0
		for _, v := range r.hist {
			m = max(m, v)
		}
		r.bw = r.clamp(m)
	}
	if r.phase != RateStartup && r.bw < 0.8*old {
		r.event(now, fmt.Sprintf("%s → %s: no round of the last %d delivered more", mbps(old), mbps(r.bw), r.cfg.BWRounds))
	}

	queue := rtt > 0 && r.minRTT > 0 && rtt > r.minRTT+r.minRTT/8+r.cfg.QueueDelay
	if queue {
		r.queued++
	} else {
		r.queued = 0
	}
	r.rounds++
	// A standing queue: the path delivers its own rate, and this sender
	// exceeds it. What the queue lets through is the line's rate (faster
	// than this sender's while it drains). Draining, the estimate is cut
	// again only if the path delivers well below even the drain's rate:
	// else the delivery rate is the drain's own, and the RTT may be
	// high for another reason (a receiver busy for a moment).
	if r.queued >= 2 && r.phase != RateDrain || queue && r.phase == RateDrain && raw < 0.8*sentRate {
		nb := r.clamp(max(raw, r.bw/2))
		if nb < r.bw || r.phase != RateDrain {
			was := r.bw
			r.bw = min(nb, r.bw)
			r.hist = append(r.hist[:0], r.bw)
			if r.phase != RateDrain {
				r.setPhase(RateDrain)
				// Half the rate drains a queue in about twice its delay.
				r.drainBy = now + max(8*r.round(), 3*(rtt-r.minRTT))
			}
			// Small corrections (a probe's queue, mostly) are counted,
			// not listed.
			if r.bw < 0.9*was {
				r.event(now, fmt.Sprintf("%s → %s: RTT %v over the path's %v, a queue: draining", mbps(was), mbps(r.bw), roundRTT(rtt), roundRTT(r.minRTT)))
			} else {
				r.drains++
			}
			r.track()
			return
		}
	}
	switch r.phase {
	case RateStartup:
		if r.bw >= 1.25*r.best {
			r.best, r.flat = r.bw, 0
		} else if !limited {
			r.flat++
		}
		if r.flat >= 3 {
			r.setPhase(RateDrain)
			r.drainBy = now
			r.event(now, fmt.Sprintf("startup found %s (three rounds without growth)", mbps(r.bw)))
		}
	case RateDrain:
		// Out when the queue is gone, or when half the rate should have
		// drained it: one that stays is not this sender's (or the path's
		// round trip grew, which MinRTTWindow learns).
		if !queue || (r.rounds >= 8 && now >= r.drainBy) {
			r.setPhase(RateCruise)
		}
	case RateCruise:
		if r.rounds >= r.cfg.CruiseRounds {
			r.probeFrom = r.bw
			r.setPhase(RateProbeUp)
		}
	case RateProbeUp:
		r.setPhase(RateProbeDown)
	case RateProbeDown:
		if r.bw >= 1.1*r.probeFrom {
			r.event(now, fmt.Sprintf("%s → %s: probing found more", mbps(r.probeFrom), mbps(r.bw)))
			r.probeFrom = r.bw
			r.setPhase(RateProbeUp)
		} else {
			r.setPhase(RateCruise)
		}
	}
	r.track()
}

// track keeps the estimate's range once Startup is over.
func (r *RateControl) track() {
	if r.phase == RateStartup {
		return
	}
	if r.lo == 0 || r.bw < r.lo {
		r.lo = r.bw
	}
	r.hi = max(r.hi, r.bw)
}

func (r *RateControl) setPhase(p RatePhase) {
	r.phase, r.rounds = p, 0
	switch p {
	case RateStartup:
		r.gain, r.best, r.flat = 2, r.bw, 0
	case RateDrain:
		r.gain = 0.5
	case RateCruise:
		r.gain = 1
	case RateProbeUp:
		r.gain = 1.25
	case RateProbeDown:
		r.gain = 0.75
	}
}

func (r *RateControl) event(now time.Duration, why string) {
	if len(r.events) >= maxRateEvents {
		r.dropped++
		return
	}
	r.events = append(r.events, RateEvent{At: now, Phase: r.phase, Rate: r.bw, Why: why})
}

// Rate is the pacing rate now, bytes/s of payload.
func (r *RateControl) Rate() float64 { return r.clamp(r.gain * r.bw) }

// Bottleneck is the bottleneck estimate, bytes/s of payload.
func (r *RateControl) Bottleneck() float64 { return r.bw }

// Phase is the state now.
func (r *RateControl) Phase() RatePhase { return r.phase }

// MinRTT is the path's round trip as the controller takes it.
func (r *RateControl) MinRTT() time.Duration { return r.minRTT }

// RateStats is a RateControl's account.
type RateStats struct {
	Rate, Bottleneck float64 // now, bytes/s
	Low, High        float64 // the estimate's range after Startup (0: still in it)
	Mean             float64 // the estimate's mean over the rounds that delivered
	Phase            RatePhase
	MinRTT           time.Duration
	Stalls           int           // times delivery stopped for a second or more
	LongestStall     time.Duration // the longest of them (ongoing included)
	Events           []RateEvent
	Dropped          int // events not kept (beyond the first 64)
	// Drains is the queues drained with the estimate cut by less than a
	// tenth (not in Events): a probe's own, mostly.
	Drains int
}

// Stats returns the controller's account (Events is a copy).
func (r *RateControl) Stats() RateStats {
	st := RateStats{Rate: r.Rate(), Bottleneck: r.bw, Low: r.lo, High: r.hi, Phase: r.phase, MinRTT: r.minRTT,
		Stalls: r.stalls, LongestStall: r.longest, Events: append([]RateEvent(nil), r.events...), Dropped: r.dropped, Drains: r.drains}
	if r.sumT > 0 {
		st.Mean = r.sumBW / r.sumT
	}
	if r.silent >= time.Second {
		st.Stalls++
		st.LongestStall = max(st.LongestStall, r.silent)
	}
	return st
}

// roundRTT rounds a round trip for a message: to 10µs below 10ms.
func roundRTT(d time.Duration) time.Duration {
	if d < 10*time.Millisecond {
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(100 * time.Microsecond)
}

func mbps(v float64) string { return fmt.Sprintf("%.0f Mbit/s", v*8/1e6) }
