package main

import (
	"crypto/sha256"
	"encoding/json"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/testbed"
	"github.com/rvma/rvma/internal/testutil"
)

// TestMain lets a test run this binary as haul itself (HAUL_RUN_MAIN=1),
// inside a network namespace with ip netns exec.
func TestMain(m *testing.M) {
	if os.Getenv("HAUL_RUN_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// nsProc is haul run in a namespace.
type nsProc struct {
	cmd            *exec.Cmd
	stdout, stderr testutil.SyncBuffer
	done           chan error
}

// haulIn starts haul with args in namespace ns; it is killed when the
// test ends if it still runs.
func haulIn(t *testing.T, ns string, args ...string) *nsProc {
	self, err := os.Executable()
	require.NoError(t, err)
	p := &nsProc{cmd: exec.Command("ip", append([]string{"netns", "exec", ns, self}, args...)...), done: make(chan error, 1)}
	p.cmd.Env = append(os.Environ(), "HAUL_RUN_MAIN=1")
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	require.NoError(t, p.cmd.Start())
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		p.done <- nil
	})
	return p
}

// wait returns how haul ended, or fails the test after d.
func (p *nsProc) wait(t *testing.T, d time.Duration) error {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		return err
	case <-time.After(d):
		t.Fatalf("%v still ran after %v: %s", p.cmd.Args, d, p.stderr.String())
		return nil
	}
}

// Over a real path (two namespaces, a veth pair shaped by tc's token
// bucket filter), with no --rate: the path's rate falls from 200 to
// 50 Mbit/s mid-transfer (tbf replaced), and the transfer finishes intact
// with the report following the rate down. Needs root (skips otherwise).
func TestAutoRateTestbed(t *testing.T) {
	bed := testbed.New(t, testbed.Config{Rates: []string{"200mbit"}})
	p := bed.Paths[0]
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	want := writeRandom(t, in, 32<<20)
	addr := netip.AddrPortFrom(p.B, 7400).String()
	recv := haulIn(t, bed.NameB, "recv", "--listen", addr, "--out", out, "--json")
	require.Eventually(t, func() bool {
		return bed.In(bed.NameA, func() error {
			c, err := net.Dial("tcp", addr)
			if err == nil {
				c.Close()
			}
			return err
		}) == nil
	}, 10*time.Second, 20*time.Millisecond, "the receiver does not listen")
	send := haulIn(t, bed.NameA, "send", "--to", addr, "--region", "1MiB", "--json", in)
	waitRegions(t, out, 6)
	require.NoError(t, bed.SetRate(0, "50mbit"))
	require.NoError(t, send.wait(t, 2*time.Minute), send.stderr.String())
	require.NoError(t, recv.wait(t, 30*time.Second), recv.stderr.String())
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, sha256.Sum256(want), sha256.Sum256(got))
	var rep report
	require.NoError(t, json.Unmarshal([]byte(send.stdout.String()), &rep), send.stdout.String())
	t.Logf("%.3fs, %.1f Mbit/s goodput; rate %.0f Mbit/s on average, %.0f at the start, %.0f at the end (%.0f..%.0f); repeats %.4f",
		rep.Seconds, rep.Gbps*1e3, rep.Rate.IdealMbps, rep.Rate.StartMbps, rep.Rate.FinalMbps, rep.Rate.LowMbps, rep.Rate.HighMbps, rep.Repeats)
	for _, e := range rep.Rate.Events {
		t.Logf("  at %.3fs (%s, %.0f Mbit/s): %s", e.T, e.Phase, e.Mbps, e.Why)
	}
	require.True(t, rep.OK)
	// Reaching the first rate needs a haul as fast as the path; under the
	// race detector on a loaded machine it is not (the probe train came
	// back at 39 Mbit/s in one CI run), so requireRate only logs there.
	// Ending below the first rate, and saying why, holds on any machine.
	requireRate(t, rep.Rate.HighMbps, 100, "found the first rate")
	require.Less(t, rep.Rate.FinalMbps, 100.0, "followed it down")
	require.True(t, hasEvent(rep, "a queue") || hasEvent(rep, "delivered more"), "the report says why it fell")
}
