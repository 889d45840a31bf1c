package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// workersRun sends a file of size bytes in regions of 1 MiB over
// loopback with --workers n at rate, and returns the sender's report
// once both ends are done and the file is checked.
func workersRun(t *testing.T, size, n int, rate string) report {
	t.Helper()
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	want := writeRandom(t, in, size)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := start(ctx, "recv", "--listen", addr, "--out", out, "--json")
	waitListening(t, addr)
	s := start(ctx, "send", "--to", addr, "--rate", rate, "--region", "1MiB", "--workers", fmt.Sprint(n), "--json", in)
	serr, rerr := s.wait(t), r.wait(t)
	require.NoError(t, serr, s.stderr.String())
	require.NoError(t, rerr, r.stderr.String())
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, sha256.Sum256(want), sha256.Sum256(got))
	var rep report
	require.NoError(t, json.Unmarshal([]byte(s.stdout.String()), &rep), s.stdout.String())
	require.True(t, rep.OK)
	return rep
}

// --workers spreads the regions over that many connections: the file
// arrives intact, and each worker carried its share.
func TestWorkers(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			rep := workersRun(t, 12<<20+12345, n, "2gbit")
			require.Equal(t, n, rep.Workers)
			require.Len(t, rep.WorkerBytes, n)
			for w, b := range rep.WorkerBytes {
				// 12 whole regions and a short one: each worker has 12/n whole ones at least.
				require.GreaterOrEqual(t, b, uint64(12/n)<<20, "worker %d", w)
			}
		})
	}
}

// A transfer interrupted under one worker count resumes under another:
// the receiver and the sender split what is left alike.
func TestWorkersResume(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	want := writeRandom(t, in, 16<<20)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	ctx := context.Background()
	r := start(ctx, "recv", "--listen", addr, "--out", out, "--json", "--peer-timeout", silentPeer, "--wait", "1m")
	waitListening(t, addr)
	sctx, kill := context.WithCancel(ctx)
	s := start(sctx, "send", "--to", addr, "--rate", "40mbit", "--region", "1MiB", "--workers", "2", in)
	waitRegions(t, out, 3, r, s)
	kill()
	require.Error(t, s.wait(t))
	s = start(ctx, "send", "--to", addr, "--rate", "2gbit", "--region", "1MiB", "--workers", "3", "--json", in)
	require.NoError(t, s.wait(t), s.stderr.String())
	require.NoError(t, r.wait(t), r.stderr.String())
	var rep report
	require.NoError(t, json.Unmarshal([]byte(s.stdout.String()), &rep), s.stdout.String())
	require.True(t, rep.OK)
	require.GreaterOrEqual(t, rep.Resumed, int64(3<<20))
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, sha256.Sum256(want), sha256.Sum256(got))
}

// Regions too large to stage (a budget made small here) land in the
// mapping, as before staging, under one worker and two.
func TestRegionsInPlace(t *testing.T) {
	defer func(b int) { plainStaging = b }(plainStaging)
	plainStaging = 1 << 20
	for _, n := range []int{1, 2} {
		rep := workersRun(t, 5<<20+99, n, "2gbit")
		require.Equal(t, n, rep.Workers)
	}
}

// With relays, --via names one per path of each worker.
func TestWorkersVia(t *testing.T) {
	_, err := parseSend([]string{"--to", "127.0.0.1:1", "--workers", "2", "--via", "127.0.0.1:2", "f"}, &testWriter{t})
	require.ErrorContains(t, err, "1 relays for 2 paths")
	o, err := parseSend([]string{"--to", "127.0.0.1:1", "--workers", "2", "--rate", "1gbit", "--via", "127.0.0.1:2,127.0.0.1:3", "f"}, &testWriter{t})
	require.NoError(t, err)
	require.InDelta(t, 1e9/8/2, o.rate, 1, "the workers share the rate")
	_, err = parseSend([]string{"--to", "127.0.0.1:1", "--workers", "17", "f"}, &testWriter{t})
	require.ErrorContains(t, err, "--workers 17")
}

type testWriter struct{ t *testing.T }

func (w *testWriter) Write(b []byte) (int, error) { w.t.Log(string(b)); return len(b), nil }

// An encrypted transfer over two workers, with a chunk tampered with in
// a region of each: both are fetched again (on the first worker's
// connection, after every region arrived) and the file is intact.
func TestWorkersEncrypted(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	key := keyFile(t, dir, "key")
	want := writeRandom(t, in, 6<<20+777)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var tampered atomic.Int32
	r := &proc{done: make(chan error, 1)}
	go func() {
		o, err := parseRecv([]string{"--listen", addr, "--out", out, "--key-file", key, "--encrypt", "--json"}, &r.stderr)
		if err == nil {
			o.sealedHook = func(round uint32, region int, sealed []byte) {
				if round == 0 && (region == 1 || region == 2) {
					sealed[100] ^= 1
					tampered.Add(1)
				}
			}
			err = receive(ctx, o, &r.stdout, &r.stderr)
		}
		r.done <- err
	}()
	waitListening(t, addr)
	s := start(ctx, "send", "--to", addr, "--rate", "2gbit", "--region", "1MiB", "--workers", "2", "--key-file", key, "--encrypt", "--json", in)
	require.NoError(t, s.wait(t), s.stderr.String())
	require.NoError(t, r.wait(t), r.stderr.String())
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Equal(t, sha256.Sum256(want), sha256.Sum256(got))
	var rep report
	require.NoError(t, json.Unmarshal([]byte(s.stdout.String()), &rep), s.stdout.String())
	require.True(t, rep.Encrypted)
	require.EqualValues(t, 2, tampered.Load())
	require.Equal(t, 2, rep.AuthFailed)
}
