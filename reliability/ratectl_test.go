package reliability

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// rateLink is a synthetic path for RateControl, stepped a millisecond at
// a time: a drop-tail queue in front of a line of rate(t) bytes/s, a
// propagation round trip, random loss after the line, and blackouts in
// which the line delivers nothing (what enters is lost). Every step's
// delivered bytes come back a round trip (and their queueing) later,
// with an RTT sample. The sender paces at the controller's rate within a
// window of in-flight bytes, as flow control keeps it.
type rateLink struct {
	rate     func(t time.Duration) float64 // bytes/s
	base     time.Duration
	loss     float64
	jitter   time.Duration // uniform in [0, jitter) added to each RTT sample
	down     func(t time.Duration) bool
	queueCap float64 // bytes
	window   float64 // in-flight bytes the sender keeps within
	seed     uint64
}

// rateTrace is what a run saw, a point per millisecond.
type rateTrace struct {
	bw, pace, deliv []float64 // bytes/s: the estimate, the pacing, the delivery rate
	rtt             []time.Duration
	rc              *RateControl
}

const step = time.Millisecond

func (l rateLink) run(rc *RateControl, d time.Duration) *rateTrace {
	rng := rand.New(rand.NewPCG(l.seed, 1))
	n := int(d / step)
	type due struct {
		bytes float64
		rtt   time.Duration
	}
	ring := make([]due, 0) // per step, deliveries due
	at := func(i int) *due {
		for len(ring) <= i {
			ring = append(ring, due{})
		}
		return &ring[i]
	}
	tr := &rateTrace{rc: rc}
	var q, sent, deliv, pipe float64
	var lastRTT time.Duration
	for i := range n {
		t := time.Duration(i) * step
		// Acknowledgements due now.
		if i < len(ring) && ring[i].bytes > 0 {
			deliv += ring[i].bytes
			pipe -= ring[i].bytes
			lastRTT = ring[i].rtt
			if l.jitter > 0 {
				lastRTT += time.Duration(rng.Int64N(int64(l.jitter)))
			}
			rc.OnRTT(t, lastRTT)
		}
		// Send at the pacing rate within the window.
		out := rc.Rate() * step.Seconds()
		if l.window > 0 {
			out = max(0, min(out, l.window-pipe-q))
		}
		sent += out
		// The queue and the line.
		c := l.rate(t) * step.Seconds()
		room := l.queueCap - q
		q += min(out, room)
		// What leaves the line now waited about the queue ahead of it.
		delay := time.Duration(q / l.rate(t) * float64(time.Second))
		served := min(q, c)
		q -= served
		if l.down != nil && l.down(t) {
			served = 0 // lost after the line
		} else if l.loss > 0 {
			served *= 1 - l.loss*(0.5+rng.Float64()) // about loss, varying
		}
		if served > 0 {
			j := i + int(l.base/step)
			d := at(j)
			d.bytes += served
			d.rtt = l.base + delay
			pipe += served
		}
		rc.Tick(t, RateSample{Sent: int64(sent), Delivered: int64(deliv), InFlight: int64(pipe + q)})
		tr.bw = append(tr.bw, rc.Bottleneck())
		tr.pace = append(tr.pace, rc.Rate())
		tr.rtt = append(tr.rtt, lastRTT)
		tr.deliv = append(tr.deliv, 0)
		if i < len(ring) {
			tr.deliv[i] = ring[i].bytes / step.Seconds()
		}
	}
	return tr
}

// mean is the average of v over [from, to).
func (tr *rateTrace) mean(v []float64, from, to time.Duration) float64 {
	a, b := int(from/step), int(to/step)
	s := 0.0
	for _, x := range v[a:b] {
		s += x
	}
	return s / float64(b-a)
}

// low and high are v's extremes over [from, to).
func low(v []float64, from, to time.Duration) float64 {
	m := v[int(from/step)]
	for _, x := range v[int(from/step):int(to/step)] {
		m = min(m, x)
	}
	return m
}

func maxRTT(v []time.Duration, from, to time.Duration) time.Duration {
	var m time.Duration
	for _, x := range v[int(from/step):int(to/step)] {
		m = max(m, x)
	}
	return m
}

const mbit = 1e6 / 8 // bytes/s

func constRate(r float64) func(time.Duration) float64 {
	return func(time.Duration) float64 { return r }
}

func stepRate(a, b float64, at time.Duration) func(time.Duration) float64 {
	return func(t time.Duration) float64 {
		if t < at {
			return a
		}
		return b
	}
}

// The controller against synthetic paths: it finds the rate, follows it
// down and up, does not read random loss as congestion, and rides out a
// blackout. Bounds are on a deterministic simulation, not on a clock.
func TestRateControl(t *testing.T) {
	base := 40 * time.Millisecond
	newLink := func(rate func(time.Duration) float64) rateLink {
		return rateLink{rate: rate, base: base, queueCap: 200 * mbit * 0.1, window: 4 * 200 * mbit * base.Seconds(), seed: 7}
	}
	for _, tc := range []struct {
		name       string
		link       rateLink
		dispersion float64 // the probe train's echoes; 0: none
		d          time.Duration
		check      func(t *testing.T, tr *rateTrace)
	}{{
		name: "steady, from the train's dispersion", link: newLink(constRate(100 * mbit)), dispersion: 95 * mbit, d: 10 * time.Second,
		check: func(t *testing.T, tr *rateTrace) {
			bw := tr.rc.Bottleneck()
			require.InDelta(t, 100*mbit, bw, 15*mbit, "estimate %s", mbps(bw))
			require.Greater(t, tr.mean(tr.deliv, 2*time.Second, 10*time.Second), 0.85*100*mbit)
			// No standing queue: the RTT stays within half the path's.
			require.Less(t, maxRTT(tr.rtt, 3*time.Second, 10*time.Second), base*3/2)
		},
	}, {
		name: "steady, startup from 10 Mbit/s", link: newLink(constRate(100 * mbit)), d: 10 * time.Second,
		check: func(t *testing.T, tr *rateTrace) {
			require.InDelta(t, 100*mbit, tr.rc.Bottleneck(), 15*mbit)
			require.Greater(t, tr.mean(tr.deliv, 3*time.Second, 10*time.Second), 0.85*100*mbit)
			require.NotEqual(t, RateStartup, tr.rc.Phase())
			require.Less(t, maxRTT(tr.rtt, 4*time.Second, 10*time.Second), base*3/2)
		},
	}, {
		name: "rate steps down mid-transfer", link: newLink(stepRate(200*mbit, 50*mbit, 5*time.Second)), dispersion: 190 * mbit, d: 12 * time.Second,
		check: func(t *testing.T, tr *rateTrace) {
			require.Greater(t, tr.bw[int(5*time.Second/step)-1], 170*mbit, "found the first rate")
			require.InDelta(t, 50*mbit, tr.rc.Bottleneck(), 12*mbit, "followed it down")
			require.Greater(t, tr.mean(tr.deliv, 7*time.Second, 12*time.Second), 0.8*50*mbit)
			// The queue the step built drained.
			require.Less(t, maxRTT(tr.rtt, 9*time.Second, 12*time.Second), base*3/2)
			requireEvent(t, tr.rc, "a queue")
		},
	}, {
		name: "rate steps up mid-transfer", link: newLink(stepRate(50*mbit, 200*mbit, 5*time.Second)), dispersion: 48 * mbit, d: 12 * time.Second,
		check: func(t *testing.T, tr *rateTrace) {
			require.InDelta(t, 50*mbit, tr.bw[int(5*time.Second/step)-1], 10*mbit)
			require.Greater(t, tr.rc.Bottleneck(), 0.8*200*mbit, "followed it up")
			require.Greater(t, tr.mean(tr.deliv, 9*time.Second, 12*time.Second), 0.75*200*mbit)
			requireEvent(t, tr.rc, "probing found more")
		},
	}, {
		name: "random loss 1e-2, no queue", link: func() rateLink {
			l := newLink(constRate(100 * mbit))
			l.loss = 1e-2
			return l
		}(), dispersion: 95 * mbit, d: 20 * time.Second,
		check: func(t *testing.T, tr *rateTrace) {
			// Loss is not congestion: the estimate never falls below
			// 80% of the path's rate once found, and what is delivered
			// stays near the rate less the loss.
			require.Greater(t, low(tr.bw, time.Second, 20*time.Second), 0.8*100*mbit)
			require.Greater(t, low(tr.pace, time.Second, 20*time.Second), 0.8*0.5*100*mbit, "never below a drain's half")
			require.Greater(t, tr.mean(tr.deliv, 2*time.Second, 20*time.Second), 0.85*100*mbit)
		},
	}, {
		name: "random loss 1e-2 and RTT jitter, no queue", link: func() rateLink {
			l := newLink(constRate(100 * mbit))
			l.loss, l.jitter = 1e-2, 10*time.Millisecond
			return l
		}(), dispersion: 95 * mbit, d: 20 * time.Second,
		check: func(t *testing.T, tr *rateTrace) {
			// Jitter is no queue either: some round's samples come
			// near the path's own round trip.
			require.Greater(t, low(tr.bw, time.Second, 20*time.Second), 0.8*100*mbit)
			require.Greater(t, tr.mean(tr.deliv, 2*time.Second, 20*time.Second), 0.85*100*mbit)
		},
	}, {
		name: "5 s blackout, then recovery", link: func() rateLink {
			l := newLink(constRate(100 * mbit))
			l.down = func(t time.Duration) bool { return t >= 3*time.Second && t < 8*time.Second }
			return l
		}(), dispersion: 95 * mbit, d: 12 * time.Second,
		check: func(t *testing.T, tr *rateTrace) {
			before := tr.bw[int(3*time.Second/step)]
			require.Greater(t, before, 0.85*100*mbit)
			// The estimate holds through it and the rate is back soon after.
			require.Greater(t, low(tr.bw, 3*time.Second, 12*time.Second), 0.8*before)
			require.Greater(t, tr.mean(tr.deliv, 9*time.Second, 12*time.Second), 0.8*100*mbit)
			st := tr.rc.Stats()
			require.Equal(t, 1, st.Stalls)
			require.InDelta(t, 5*time.Second, st.LongestStall, float64(300*time.Millisecond))
			requireEvent(t, tr.rc, "delivery resumed after")
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			rc := NewRateControl(RateConfig{Start: 10 * mbit})
			if tc.dispersion > 0 {
				rc.Start(0, tc.dispersion, 1000*mbit)
			} else {
				rc.Start(0, 0, 0)
			}
			tr := tc.link.run(rc, tc.d)
			defer func() {
				if t.Failed() || testing.Verbose() {
					for _, e := range rc.Stats().Events {
						t.Logf("%v %v %s: %s", e.At, e.Phase, mbps(e.Rate), e.Why)
					}
				}
			}()
			tc.check(t, tr)
		})
	}
}

func requireEvent(t *testing.T, rc *RateControl, part string) {
	t.Helper()
	var all []string
	for _, e := range rc.Stats().Events {
		if strings.Contains(e.Why, part) {
			return
		}
		all = append(all, e.Why)
	}
	require.Failf(t, "no event says "+part, "events: %q", all)
}

// A train that came back about as fast as it went says only that the
// path is at least that fast: startup, from there. One dispersed well
// below its send rate is the bottleneck: no startup.
func TestRateControlStart(t *testing.T) {
	rc := NewRateControl(RateConfig{})
	rc.Start(0, 990*mbit, 1000*mbit)
	require.Equal(t, RateStartup, rc.Phase())
	require.InDelta(t, 2*990*mbit, rc.Rate(), 1)

	rc = NewRateControl(RateConfig{})
	rc.Start(0, 2000*mbit, 1000*mbit)
	require.Equal(t, RateStartup, rc.Phase())
	require.InDelta(t, 1000*mbit, rc.Bottleneck(), 1, "bunched echoes: no faster than the train went")

	rc = NewRateControl(RateConfig{})
	rc.Start(0, 200*mbit, 1000*mbit)
	require.Equal(t, RateCruise, rc.Phase())
	require.InDelta(t, 200*mbit, rc.Rate(), 1)

	rc = NewRateControl(RateConfig{Start: 10 * mbit, Max: 15 * mbit})
	rc.Start(0, 0, 0)
	require.InDelta(t, 15*mbit, rc.Rate(), 1, "Max bounds the pacing")
}

// Nothing sent and nothing in flight is idle, not a stall.
func TestRateControlIdle(t *testing.T) {
	rc := NewRateControl(RateConfig{})
	rc.Start(0, 100*mbit, 1000*mbit)
	for ms := range 3000 {
		rc.Tick(time.Duration(ms)*time.Millisecond, RateSample{})
	}
	require.Zero(t, rc.Stats().Stalls)
	require.InDelta(t, 100*mbit, rc.Bottleneck(), 1)
}

// The train's dispersion is the slower of its whole span and its
// middle: echoes bunched behind a late first one do not read as a path
// faster than it is.
func TestDispersion(t *testing.T) {
	ms := time.Millisecond
	even := make([]time.Duration, 100)
	for i := range even {
		even[i] = time.Duration(i) * ms // 1000 bytes a millisecond: 1 MB/s
	}
	require.InDelta(t, 1e6, dispersion(even, 1000), 1)
	bunched := append([]time.Duration(nil), even...)
	for i := range 8 {
		bunched[i] = 8 * ms // the first 8 held up, then all at once
	}
	require.Greater(t, 99*1000/(bunched[99]-bunched[0]).Seconds(), 1.05e6, "the span alone reads high")
	require.InDelta(t, 1e6, dispersion(bunched, 1000), 1e4, "the middle's spacing, not the span's")
	require.Zero(t, dispersion(even[:1], 1000))
	require.InDelta(t, 1e6, dispersion(even[:3], 1000), 1)
}
