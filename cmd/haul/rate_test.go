package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/fabric"
	"github.com/rvma/rvma/internal/linkem"
)

// autoRun sends a file of size bytes in regions of 1 MiB through a
// linkem link of cfg with no --rate (auto), calls during, if any, with
// the link and the receiver's output path once the transfer is under
// way, and returns the sender's report once both ends are done and the
// file is checked.
func autoRun(t *testing.T, cfg linkem.Config, size int, during func(l *linkem.Link, out string, ps ...*proc), sendArgs ...string) report {
	t.Helper()
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	want := writeRandom(t, in, size)
	l, err := linkem.Start(cfg)
	require.NoError(t, err)
	defer l.Close()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := start(ctx, "recv", "--listen", addr, "--out", out, "--via", l.AddrB().String(), "--json")
	waitListening(t, addr)
	args := append([]string{"send", "--to", addr, "--via", l.AddrA().String(), "--region", "1MiB", "--json"}, sendArgs...)
	s := start(ctx, append(args, in)...)
	if during != nil {
		during(l, out, s, r)
	}
	serr, rerr := s.wait(t), r.wait(t)
	require.NoError(t, serr, s.stderr.String())
	require.NoError(t, rerr, r.stderr.String())
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, sha256.Sum256(want), sha256.Sum256(got))
	var rep report
	require.NoError(t, json.Unmarshal([]byte(s.stdout.String()), &rep), s.stdout.String())
	require.True(t, rep.OK)
	if len(sendArgs) == 0 {
		require.Equal(t, "auto", rep.Rate.Mode)
	}
	ab, _ := l.Stats()
	t.Logf("%.3fs, %.1f Mbit/s goodput; rate found %.0f Mbit/s on average, %.0f at the start, %.0f at the end (%.0f..%.0f), %d small drains; wire overhead %.3f, repeats %.4f; link A→B: %v",
		rep.Seconds, rep.Gbps*1e3, rep.Rate.IdealMbps, rep.Rate.StartMbps, rep.Rate.FinalMbps, rep.Rate.LowMbps, rep.Rate.HighMbps, rep.Rate.Drains, rep.Overhead, rep.Repeats, ab)
	for _, e := range rep.Rate.Events {
		t.Logf("  at %.3fs (%s, %.0f Mbit/s): %s", e.T, e.Phase, e.Mbps, e.Why)
	}
	return rep
}

const mbitps = 1e6 / 8 // bytes/s

// requireGoodput asserts a goodput of at least frac of the link's (in
// Mbit/s), a bound a loaded machine meets; under the race detector,
// which makes haul itself slower than the link, it is only logged.
func requireGoodput(t *testing.T, rep report, link, frac float64) {
	t.Helper()
	if raceEnabled {
		t.Logf("race detector: goodput %.1f Mbit/s of a %.0f Mbit/s link not asserted", rep.Gbps*1e3, link)
		return
	}
	require.Greater(t, rep.Gbps*1e3, frac*link, "goodput")
}

// requireRate asserts that an estimate reached low Mbit/s. An estimate
// is what the link delivered; under the race detector the receiver, not
// the link, sets that (as it sets goodput, see requireGoodput), so there
// the level is only logged.
func requireRate(t *testing.T, mbps, low float64, what string) {
	t.Helper()
	if raceEnabled {
		t.Logf("race detector: %s: %.1f Mbit/s (%.0f wanted) not asserted", what, mbps, low)
		return
	}
	require.Greater(t, mbps, low, what)
}

// With no --rate, haul finds a link's rate: the transfer is intact, its
// goodput a fair share of the link (a bound a loaded machine meets: the
// time is not asserted tightly), the estimate on average not above what
// the link can carry by much, and nothing overruns it into repeats.
func TestAutoRate(t *testing.T) {
	const link = 100 // Mbit/s
	size := 24 << 20
	if testing.Short() {
		size = 8 << 20
	}
	rep := autoRun(t, linkem.Config{Rate: link * mbitps, Faults: fabric.Faults{Delay: 5 * time.Millisecond}}, size, nil)
	requireGoodput(t, rep, link, 0.3)
	// On average: the first, from the probe train, can be high on a
	// loaded machine (echoes bunched by a receiver that was descheduled).
	require.Less(t, rep.Rate.IdealMbps, 1.5*link, "the estimate stays near what the link carries")
	require.Positive(t, rep.Rate.StartMbps)
	require.NotNil(t, rep.Probe)
	require.Less(t, rep.Repeats, 0.1)
}

// Random loss is not congestion: at 1e-2 the rate found stays near the
// link's, and the losses are repaired.
func TestAutoRateLoss(t *testing.T) {
	const link = 100
	rep := autoRun(t, linkem.Config{Rate: link * mbitps, Faults: fabric.Faults{Delay: 5 * time.Millisecond, Drop: 0.01, Seed: 5}}, 16<<20, nil)
	requireRate(t, rep.Rate.IdealMbps, 0.5*link, "the mean estimate did not collapse")
	for _, e := range rep.Rate.Events {
		require.NotContains(t, e.Why, "loss", "the controller moved on a loss: %+v", e)
	}
	requireGoodput(t, rep, link, 0.3)
	require.Positive(t, rep.Repaired)
}

// A link whose rate changes mid-transfer, down and then up: the
// transfer finishes intact and the report follows the rate.
func TestAutoRateChanges(t *testing.T) {
	t.Run("down", func(t *testing.T) {
		rep := autoRun(t, linkem.Config{Rate: 200 * mbitps, Faults: fabric.Faults{Delay: 5 * time.Millisecond}}, 32<<20,
			func(l *linkem.Link, out string, ps ...*proc) {
				waitRegions(t, out, 4, ps...)
				l.SetRate(40 * mbitps)
			})
		// The last estimate is the new rate's, give or take; the report
		// says why it fell.
		require.Less(t, rep.Rate.FinalMbps, 80.0, "followed the rate down")
		require.True(t, hasEvent(rep, "a queue") || hasEvent(rep, "delivered more"), "the report says why it fell")
	})
	t.Run("up", func(t *testing.T) {
		rep := autoRun(t, linkem.Config{Rate: 40 * mbitps, Faults: fabric.Faults{Delay: 5 * time.Millisecond}}, 24<<20,
			func(l *linkem.Link, out string, ps ...*proc) {
				waitRegions(t, out, 4, ps...)
				l.SetRate(200 * mbitps)
			})
		require.True(t, hasEvent(rep, "probing found more"))
		requireRate(t, rep.Rate.HighMbps, 60, "followed the rate up")
	})
}

// A link that drops everything for 5 s then recovers: the transfer
// waits it out and finishes intact, the estimate is not torn down, and
// the report says that delivery stopped and for how long.
func TestAutoRateBlackout(t *testing.T) {
	const link = 100
	rep := autoRun(t, linkem.Config{Rate: link * mbitps, Faults: fabric.Faults{Delay: 5 * time.Millisecond}}, 24<<20,
		func(l *linkem.Link, out string, ps ...*proc) {
			waitRegions(t, out, 4, ps...)
			l.SetDown(true)
			time.Sleep(5 * time.Second)
			l.SetDown(false)
		})
	require.GreaterOrEqual(t, rep.Rate.Stalls, 1)
	require.InDelta(t, 5, rep.Rate.LongestStall, 1.5, "the report says how long delivery stopped")
	require.True(t, hasEvent(rep, "delivery resumed"))
	requireRate(t, rep.Rate.FinalMbps, 0.3*link, "the estimate survived the blackout")
}

// The same blackout under a fixed --rate, which has no controller to
// notice it: the sender's flow control counts the stall, the transfer
// finishes intact, and the report says delivery stopped and for how long
// rather than blaming the receiver for the repeats.
func TestFixedRateBlackout(t *testing.T) {
	const link = 100
	rep := autoRun(t, linkem.Config{Rate: link * mbitps, Faults: fabric.Faults{Delay: 5 * time.Millisecond}}, 24<<20,
		func(l *linkem.Link, out string, ps ...*proc) {
			waitRegions(t, out, 4, ps...)
			l.SetDown(true)
			time.Sleep(5 * time.Second)
			l.SetDown(false)
		}, "--rate", "90mbit")
	require.Equal(t, "fixed", rep.Rate.Mode)
	require.GreaterOrEqual(t, rep.Rate.Stalls, 1)
	require.InDelta(t, 5, rep.Rate.LongestStall, 1.5, "the report says how long delivery stopped")
}

func hasEvent(rep report, part string) bool {
	for _, e := range rep.Rate.Events {
		if strings.Contains(e.Why, part) {
			return true
		}
	}
	return false
}

// The text report states the rate found, how it moved (the first events
// and the last, when there are many), and a stall.
func TestPrintRate(t *testing.T) {
	r := rateRep{Mode: "auto", IdealMbps: 180, StartMbps: 200, FinalMbps: 50, LowMbps: 45, HighMbps: 210, MinRTTms: 20, Stalls: 1, LongestStall: 5.1}
	for i := range 20 {
		r.Events = append(r.Events, rateEvent{T: float64(i), Why: fmt.Sprintf("move %d", i)})
	}
	var b bytes.Buffer
	printRate(&b, &r)
	out := b.String()
	require.Contains(t, out, "rate auto: found 180 Mbit/s on average; started at 200, ended at 50 (45 to 210 after start-up)")
	require.Contains(t, out, "move 0\n")
	require.Contains(t, out, "move 19\n")
	require.NotContains(t, out, "move 15\n")
	require.Contains(t, out, "... 9 more")
	require.Contains(t, out, "delivery stopped 1 times for a second or more, the longest 5.1s")

	b.Reset()
	printRate(&b, &rateRep{Mode: "fixed", IdealMbps: 500})
	require.Equal(t, "haul: rate 500 Mbit/s, as given (--rate)\n", b.String())
}

// --rate is auto unless a rate is given; the receiver paces its few
// messages at the old default whatever it is told.
func TestParseRate(t *testing.T) {
	for _, tc := range []struct {
		args []string
		auto bool
		rate float64
	}{
		{nil, true, 125e6},
		{[]string{"--rate", "auto"}, true, 125e6},
		{[]string{"--rate", "500mbit"}, false, 62.5e6},
	} {
		o, err := parseSend(append(append([]string{"--to", "127.0.0.1:1"}, tc.args...), "f"), io.Discard)
		require.NoError(t, err)
		require.Equal(t, tc.auto, o.auto, tc.args)
		require.Equal(t, tc.rate, o.rate, tc.args)
		cfg := o.relCfg(32, 0, 8, 0, 1)
		require.Equal(t, tc.auto, cfg.AutoRate)
		r, err := parseRecv(append([]string{"--listen", "127.0.0.1:1", "--out", "f"}, tc.args...), io.Discard)
		require.NoError(t, err)
		require.False(t, r.auto)
	}
}
