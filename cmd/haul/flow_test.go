package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/fabric"
	"github.com/rvma/rvma/internal/linkem"
)

// startRecvOpts runs haul recv with its options set by set.
func startRecvOpts(ctx context.Context, set func(*recvOpts), args ...string) *proc {
	p := &proc{done: make(chan error, 1)}
	go func() {
		o, err := parseRecv(args[1:], &p.stderr)
		if err == nil {
			set(o)
			err = receive(ctx, o, &p.stdout, &p.stderr)
		}
		p.done <- err
	}()
	return p
}

// slowRun sends a file of size bytes over loopback, unpaced (100 Gbit/s),
// to a receiver that takes delay over each chunk, with flow control on or
// off, and returns the sender's report and the receiver's.
func slowRun(t *testing.T, size int, delay time.Duration, window bool) (report, map[string]any) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	want := writeRandom(t, in, size)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r := startRecvOpts(ctx, func(o *recvOpts) { o.chunkDelay, o.noWindow = delay, !window },
		"recv", "--listen", addr, "--out", out, "--json", "--peer-timeout", "30s")
	waitListening(t, addr)
	s := start(ctx, "send", "--to", addr, "--rate", "100gbit", "--json", "--probes", "0", "--peer-timeout", "30s", in)
	serr, rerr := s.wait(t), r.wait(t)
	require.NoError(t, serr, s.stderr.String())
	require.NoError(t, rerr, r.stderr.String())
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, sha256.Sum256(want), sha256.Sum256(got))
	var rep report
	require.NoError(t, json.Unmarshal([]byte(s.stdout.String()), &rep), s.stdout.String())
	var rr map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout.String()), &rr), r.stdout.String())
	return rep, rr
}

// A receiver that cannot keep up with an unpaced sender slows it through
// its window instead of dropping what it cannot take: the transfer
// finishes intact, and the sender waits for the window. The run without
// the window is logged beside it for comparison (repeats and wire
// overhead); nothing about time is asserted.
func TestSlowReceiver(t *testing.T) {
	size := 128 << 20
	if testing.Short() || raceEnabled {
		size = 32 << 20
	}
	const delay = 40 * time.Microsecond // about 100 MB/s of 4 KiB chunks
	with, rw := slowRun(t, size, delay, true)
	t.Logf("with flow control: %.3fs, %.3f Gbit/s, wire overhead %.3f, repeats %.4f, %d timeouts, window %d..%d bytes (%d cuts), waited %.3fs; receiver: %v",
		with.Seconds, with.Gbps, with.Overhead, with.Repeats, with.Timeouts, with.Flow.WindowMin, with.Flow.WindowMax, with.Flow.Cuts, with.Flow.Waited, rw)
	require.Positive(t, with.Flow.WindowMax, "the receiver advertised a window")
	// A quarter of the size: without a window the repeats make it many
	// times slower, and under the race detector on a loaded machine 128
	// MiB outlasted the wait for haul to end (a minute).
	without, rwo := slowRun(t, size/4, delay, false)
	t.Logf("without flow control: %.3fs, %.3f Gbit/s, wire overhead %.3f, repeats %.4f, %d timeouts; receiver: %v",
		without.Seconds, without.Gbps, without.Overhead, without.Repeats, without.Timeouts, rwo)
	require.Zero(t, without.Flow.WindowMax)
}

// The probe train, sent faster than a 200 Mbit/s link, comes back
// dispersed to about the link's rate: the report carries it (logged, not
// asserted: it is a measurement of time).
func TestProbeDispersion(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	writeRandom(t, in, 2<<20)
	l, err := linkem.Start(linkem.Config{Rate: 25e6, Faults: fabric.Faults{Delay: 5 * time.Millisecond}})
	require.NoError(t, err)
	defer l.Close()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := start(ctx, "recv", "--listen", addr, "--out", out, "--via", l.AddrB().String(), "--json")
	waitListening(t, addr)
	s := start(ctx, "send", "--to", addr, "--via", l.AddrA().String(), "--rate", "2gbit", "--json", in)
	require.NoError(t, s.wait(t), s.stderr.String())
	require.NoError(t, r.wait(t), r.stderr.String())
	var rep report
	require.NoError(t, json.Unmarshal([]byte(s.stdout.String()), &rep), s.stdout.String())
	require.NotNil(t, rep.Probe)
	require.Positive(t, rep.Probe.DispersionMbps)
	t.Logf("link 200 Mbit/s, train paced at 2 Gbit/s: echoes dispersed at %.0f Mbit/s (%d of %d echoed)", rep.Probe.DispersionMbps, rep.Probe.Echoed, rep.Probe.Sent)
}
