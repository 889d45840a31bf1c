package main

import (
	"fmt"
	"io"
	"time"

	"github.com/rvma/rvma/reliability"
)

// rateRep is the report's account of the injection rate: the one given,
// or, with --rate auto, what the controller found and how it moved.
type rateRep struct {
	Mode string `json:"mode"` // "auto" or "fixed"
	// IdealMbps is the rate the ideal time is computed at: --rate, or the
	// controller's bottleneck estimate, its mean over the transfer.
	IdealMbps float64 `json:"ideal_mbps"`
	// With auto: the first estimate (from the probe train, or the
	// default without one), the last, and its range after start-up.
	StartMbps float64 `json:"start_mbps,omitempty"`
	FinalMbps float64 `json:"final_mbps,omitempty"`
	LowMbps   float64 `json:"low_mbps,omitempty"`
	HighMbps  float64 `json:"high_mbps,omitempty"`
	MinRTTms  float64 `json:"min_rtt_ms,omitempty"`
	// Stalls is the times nothing was delivered for a second or more
	// (the path down, or the receiver stalled); LongestStall the longest.
	Stalls       int         `json:"stalls,omitempty"`
	LongestStall float64     `json:"longest_stall_seconds,omitempty"`
	Events       []rateEvent `json:"events,omitempty"`
	// Drains is the queues drained with the estimate cut by less than a
	// tenth, not listed in Events (a probe's own, mostly).
	Drains  int `json:"small_drains"`
	Dropped int `json:"events_dropped,omitempty"`
}

// rateEvent is one move of the estimate, seconds from the transfer's
// start (negative: during the probe train, before it).
type rateEvent struct {
	T     float64 `json:"t"`
	Mbps  float64 `json:"mbps"`
	Phase string  `json:"phase"`
	Why   string  `json:"why"`
}

func rateReport(c *reliability.Conn, o *sendOpts, start time.Time) rateRep {
	st, ok := c.RateStats()
	if !ok {
		// No controller to count stalls: the connection's flow control
		// does.
		f := c.Flow()
		return rateRep{Mode: "fixed", IdealMbps: o.rate * 8 / 1e6 * float64(max(o.workers, 1)), Stalls: f.Stalls, LongestStall: f.LongestStall.Seconds()}
	}
	mean := st.Mean
	if mean == 0 {
		mean = st.Bottleneck
	}
	r := rateRep{Mode: "auto", IdealMbps: mean * 8 / 1e6, FinalMbps: st.Bottleneck * 8 / 1e6,
		LowMbps: st.Low * 8 / 1e6, HighMbps: st.High * 8 / 1e6, MinRTTms: float64(st.MinRTT.Microseconds()) / 1e3,
		Stalls: st.Stalls, LongestStall: st.LongestStall.Seconds(), Dropped: st.Dropped, Drains: st.Drains}
	for _, e := range st.Events {
		r.Events = append(r.Events, rateEvent{T: e.Time.Sub(start).Seconds(), Mbps: e.Rate * 8 / 1e6, Phase: e.Phase.String(), Why: e.Why})
	}
	if len(st.Events) > 0 {
		r.StartMbps = r.Events[0].Mbps
	}
	return r
}

// maxRateLines is how many of the controller's events the text report
// lists (the JSON one has them all): the first ones and the last.
const maxRateLines = 12

// printRate writes the rate's lines of the text report.
func printRate(w io.Writer, r *rateRep) {
	if r.Mode != "auto" {
		fmt.Fprintf(w, "haul: rate %.0f Mbit/s, as given (--rate)\n", r.IdealMbps)
		printStalls(w, r)
		return
	}
	fmt.Fprintf(w, "haul: rate auto: found %.0f Mbit/s on average; started at %.0f, ended at %.0f (%.0f to %.0f after start-up), path RTT %.1f ms; %d moves, and %d queues drained with less of a cut\n",
		r.IdealMbps, r.StartMbps, r.FinalMbps, r.LowMbps, r.HighMbps, r.MinRTTms, len(r.Events)+r.Dropped, r.Drains)
	for i, e := range r.Events {
		if len(r.Events) > maxRateLines && i == maxRateLines-2 {
			fmt.Fprintf(w, "haul:   ... %d more\n", len(r.Events)-maxRateLines+1+r.Dropped)
		}
		if len(r.Events) > maxRateLines && i >= maxRateLines-2 && i < len(r.Events)-1 {
			continue
		}
		fmt.Fprintf(w, "haul:   at %.3fs: %s\n", e.T, e.Why)
	}
	printStalls(w, r)
}

func printStalls(w io.Writer, r *rateRep) {
	if r.Stalls > 0 {
		fmt.Fprintf(w, "haul: delivery stopped %d times for a second or more, the longest %.1fs (the path went down, or the receiver stalled); the transfer went on when it came back\n",
			r.Stalls, r.LongestStall)
	}
}
