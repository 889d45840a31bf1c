package reliability

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/rvma/rvma/internal/sdrwire"
)

// ProbeResult is what a probe train measured.
type ProbeResult struct {
	Sent, Echoed int
	// Loss is the per-packet loss one way, from the echoes missing: both
	// directions are taken to lose alike (a round trip loses 1−(1−p)²).
	Loss     float64
	MinRTT   time.Duration
	Median   time.Duration // RTT
	Duration time.Duration // from the first probe sent to the end of the wait for echoes
	// Dispersion is the rate in bytes per second (wire bytes) at which
	// the echoes came back, first to last: the path's bottleneck rate
	// (packet-train dispersion) when the train went out faster than it,
	// else the rate it was sent at (Config.Rate), a lower bound. 0: fewer
	// than two echoes.
	Dispersion float64
	// SendRate is the rate the train went out at, first probe to last,
	// in the same wire bytes per second: a Dispersion well below it is
	// the bottleneck's. 0: a train of one.
	SendRate float64
}

func (r ProbeResult) String() string {
	return fmt.Sprintf("%d of %d probes echoed (loss %.2g a packet), RTT %v median, %v min, in %v; sent at %.0f Mbit/s, echoes dispersed at %.0f Mbit/s",
		r.Echoed, r.Sent, r.Loss, r.Median.Round(time.Microsecond), r.MinRTT.Round(time.Microsecond), r.Duration.Round(time.Millisecond), r.SendRate*8/1e6, r.Dispersion*8/1e6)
}

type probeState struct {
	stamps    []int64 // when each probe went out; 0: echoed already
	rtts      []time.Duration
	arrivals  []time.Duration // of the echoes, in order
	sentFirst time.Duration   // the first probe's send, and the last's
	sentLast  time.Duration
}

// probeBatch is how many probes go out under one lock: the control ring
// holds 16 messages, and each is on the wire once posted.
const probeBatch = 8

// Probe sends a train of n probes about as large as a control message can
// be, paced at Config.Rate, waits for their echoes, and adds what it saw
// to the loss and RTT estimates the model chooses with. It is the "short
// probe train" of a transfer's start: at 1 Gbit/s, 1000 probes take about
// 7 ms and one RTT, and measure a loss of 1e-3 to within about a factor
// of two. It waits at most until every probe is echoed, or
// 5/4 of the slowest round trip seen after the last went out; it fails with ErrPeer
// if none is echoed within Config.PeerTimeout.
func (c *Conn) Probe(ctx context.Context, n int) (ProbeResult, error) {
	if n < 1 || n > 1<<16 {
		return ProbeResult{}, fmt.Errorf("%w: %d probes, want 1..65536", ErrConfig, n)
	}
	c.mu.Lock()
	if c.probe != nil {
		c.mu.Unlock()
		return ProbeResult{}, fmt.Errorf("%w: a probe is running", ErrConfig)
	}
	if c.err != nil {
		defer c.mu.Unlock()
		return ProbeResult{}, c.err
	}
	ps := &probeState{stamps: make([]int64, n)}
	c.probe = ps
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.probe = nil
		c.mu.Unlock()
	}()
	per := float64(sdrwire.MaxLen+packetOverhead) / max(c.cfg.Rate, 1) * float64(time.Second)
	start := c.now()
	for i := 0; i < n; {
		if c.cfg.Rate > 0 {
			if d := start + time.Duration(float64(i)*per) - c.now(); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return ProbeResult{}, ctx.Err()
				}
			}
		}
		c.mu.Lock()
		if c.err != nil {
			defer c.mu.Unlock()
			return ProbeResult{}, c.err
		}
		for end := min(i+probeBatch, n); i < end; i++ {
			now := c.now()
			ps.stamps[i] = int64(now)
			if i == 0 {
				ps.sentFirst = now
			}
			ps.sentLast = now
			c.sendCtlLocked(&sdrwire.Message{Type: sdrwire.TypeProbe, Stamp: int64(now), Seq: uint64(i), Pad: sdrwire.MaxLen}) // Append clamps it: the largest message
		}
		c.mu.Unlock()
	}
	last := c.now()
	var res ProbeResult
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.err == nil && len(ps.rtts) < n {
		wait := c.cfg.PeerTimeout
		if len(ps.rtts) > 0 {
			// The last probe's echo is due a round trip after it left.
			m := slices.Max(ps.rtts)
			wait = m + m/4 + time.Millisecond
		}
		d := last + wait - c.now()
		if d <= 0 {
			break
		}
		ch := c.changed
		c.mu.Unlock()
		timer.Reset(d)
		select {
		case <-ch:
		case <-timer.C:
		case <-ctx.Done():
		}
		c.mu.Lock()
		if err := ctx.Err(); err != nil {
			return res, err
		}
	}
	if c.err != nil {
		return res, c.err
	}
	res.Sent, res.Echoed, res.Duration = n, len(ps.rtts), c.now()-start
	if res.Echoed == 0 {
		return res, fmt.Errorf("%w: none of %d probes echoed in %v", ErrPeer, n, c.cfg.PeerTimeout)
	}
	rt := float64(n-res.Echoed) / float64(n)
	res.Loss = 1 - math.Sqrt(1-rt)
	sorted := slices.Clone(ps.rtts)
	slices.Sort(sorted)
	res.MinRTT, res.Median = sorted[0], sorted[len(sorted)/2]
	res.Dispersion = dispersion(ps.arrivals, float64(sdrwire.MaxLen+packetOverhead))
	if d := ps.sentLast - ps.sentFirst; n > 1 && d > 0 {
		res.SendRate = float64(n-1) * float64(sdrwire.MaxLen+packetOverhead) / d.Seconds()
	}
	if c.rc != nil {
		// The controller counts payload: chunks, each with its packet's
		// overhead on the wire.
		ch := float64(max(c.peerChunk, 1))
		f := ch / (ch + packetOverhead)
		c.rc.Start(c.now(), res.Dispersion*f, res.SendRate*f)
	}
	// n round trips are about 2n one-way trials of a packet.
	c.observeLossLocked(res.Loss*float64(2*n), float64(2*n))
	c.broadcastLocked()
	return res, nil
}

// dispersion is the rate in bytes per second at which echoes of size
// bytes arrived at times at (in order): the slower of first to last and
// of the middle 80% (0: fewer than two). A train's echoes can come
// bunched, after a first one held up (a receiver descheduled for a
// moment): the middle then shows the spacing the path gave them, and
// the slower of the two errs low, which probing corrects, rather than
// high, which would start above the path's rate.
func dispersion(at []time.Duration, size float64) float64 {
	n := len(at)
	if n < 2 {
		return 0
	}
	rate := func(i, j int) float64 {
		if d := at[j] - at[i]; j > i && d > 0 {
			return float64(j-i) * size / d.Seconds()
		}
		return 0
	}
	r := rate(0, n-1)
	if n >= 10 {
		if m := rate(n/10, n-1-n/10); m > 0 && (r == 0 || m < r) {
			r = m
		}
	}
	return r
}

// onEchoLocked takes a probe's echo: a round trip for the probe's count
// and for the RTT estimate.
func (c *Conn) onEchoLocked(m *sdrwire.Message, now time.Duration) {
	ps := c.probe
	if ps == nil || m.Seq >= uint64(len(ps.stamps)) || ps.stamps[m.Seq] != m.Stamp || m.Stamp == 0 {
		return // late, of an earlier train, or forged: ignored
	}
	ps.stamps[m.Seq] = 0
	ps.arrivals = append(ps.arrivals, now)
	sample := now - time.Duration(m.Stamp)
	ps.rtts = append(ps.rtts, sample)
	first := !c.measured
	c.rttSampleLocked(sample)
	// Wake Ready on the first RTT, and Probe on its train's first echo
	// (which sets its deadline) and last.
	if first || len(ps.rtts) == 1 || len(ps.rtts) == len(ps.stamps) {
		c.broadcastLocked()
	}
}
