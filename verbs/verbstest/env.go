// Package verbstest is the verbs conformance suite and its fixtures. Every
// provider runs the same suite: a provider's test calls Run with an Env that
// opens its devices.
//
//	func TestConformance(t *testing.T) { verbstest.Run(t, verbstest.Loop()) }
package verbstest

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/shmfab"
	"github.com/rvma/rvma/verbs"
)

// Env opens devices that can reach each other.
type Env interface {
	// Name is the provider's name, for test output.
	Name() string
	// Open opens a new device; the test closes it at cleanup.
	Open(t testing.TB) *verbs.Device
}

var fabricSeq atomic.Uint64

type loopEnv struct{ fabric string }

// Loop returns an Env of loop devices on a fabric private to the caller.
func Loop() Env { return loopEnv{fabric: fmt.Sprintf("verbstest-%d", fabricSeq.Add(1))} }

func (e loopEnv) Name() string { return "loop" }
func (e loopEnv) Open(t testing.TB) *verbs.Device {
	d, err := verbs.Open(context.Background(), "loop://"+e.fabric+"?gids=2", nil)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}

type shmEnv struct {
	fabric         string
	alloc, packets bool
}

// SHM returns an Env of shm devices (two GIDs each) on a fabric name
// private to the caller. Pair's buffers are ordinary memory, which peers
// reach with cross-memory attach where the system allows it.
func SHM() Env { return shmEnv{fabric: fmt.Sprintf("verbstest-%d-%d", os.Getpid(), fabricSeq.Add(1))} }

// SHMAlloc is SHM with Pair's buffers from PD.AllocMR: shared memory,
// which peers reach with plain copies and CPU atomics.
func SHMAlloc() Env {
	e := SHM().(shmEnv)
	e.alloc = true
	return e
}

// SHMPackets is SHM with cross-memory attach turned off while its devices
// are open: ordinary memory is reached through the rings only.
func SHMPackets() Env {
	e := SHM().(shmEnv)
	e.packets = true
	return e
}

func (e shmEnv) Name() string { return "shm" }
func (e shmEnv) Open(t testing.TB) *verbs.Device {
	if e.packets {
		prev := shmfab.ForceCMA(false)
		t.Cleanup(func() { shmfab.ForceCMA(prev) })
	}
	d, err := verbs.Open(context.Background(), "shm://"+e.fabric+"?gids=2", nil)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}

func (e shmEnv) Alloc() bool { return e.alloc }

type udpEnv struct{ addr, query string }

// UDP returns an Env of udp devices on loopback, two GIDs each (two ports
// of 127.0.0.1).
func UDP() Env { return udpEnv{addr: "127.0.0.1"} }

// UDP6 returns an Env of udp devices on the IPv6 loopback.
func UDP6() Env { return udpEnv{addr: "[::1]"} }

// UDPLargest returns an Env of udp devices on loopback whose ports carry
// the largest payload the interface allows (mtu=max: 61440 on a lo of
// 65536), as rma opens them.
func UDPLargest() Env { return udpEnv{addr: "127.0.0.1", query: "?mtu=max"} }

func (e udpEnv) Name() string {
	if e.query != "" {
		return "udp" + e.query
	}
	return "udp"
}
func (e udpEnv) Open(t testing.TB) *verbs.Device {
	d, err := verbs.Open(context.Background(), "udp://"+e.addr+":0,"+e.addr+":0"+e.query, nil)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return d
}

// Side is one end of a connected pair: a device with a PD, a CQ, a QP and a
// registered buffer.
type Side struct {
	Dev *verbs.Device
	PD  *verbs.PD
	CQ  *verbs.CQ
	QP  *verbs.QP
	Buf []byte
	MR  *verbs.MR
}

// PairConfig shapes a Pair. The zero value means an RC pair with 64 KiB
// buffers and default attributes.
type PairConfig struct {
	QP      verbs.QPConfig
	CQ      verbs.CQConfig
	Connect verbs.ConnectConfig
	BufSize int
	Access  verbs.Access // default AccessAll
}

// Pair opens two devices and connects a QP on each to the other.
func Pair(t testing.TB, env Env, cfg PairConfig) (a, b *Side) {
	if cfg.BufSize == 0 {
		cfg.BufSize = 64 << 10
	}
	if cfg.Access == 0 {
		cfg.Access = verbs.AccessAll
	}
	mk := func() *Side {
		s := &Side{Dev: env.Open(t)}
		var err error
		s.PD, err = s.Dev.AllocPD()
		require.NoError(t, err)
		s.CQ, err = s.Dev.CreateCQ(cfg.CQ)
		require.NoError(t, err)
		qc := cfg.QP
		qc.SendCQ = s.CQ
		s.QP, err = s.PD.CreateQP(qc)
		require.NoError(t, err)
		if a, ok := env.(interface{ Alloc() bool }); ok && a.Alloc() {
			s.MR, err = s.PD.AllocMR(cfg.BufSize, cfg.Access)
			require.NoError(t, err)
			s.Buf = s.MR.Bytes()
			t.Cleanup(func() { s.MR.Deregister() })
			return s
		}
		s.Buf = make([]byte, cfg.BufSize)
		s.MR, err = s.PD.RegisterMR(s.Buf, cfg.Access)
		require.NoError(t, err)
		return s
	}
	a, b = mk(), mk()
	require.NoError(t, a.QP.Connect(b.QP.Endpoint(), &cfg.Connect))
	require.NoError(t, b.QP.Connect(a.QP.Endpoint(), &cfg.Connect))
	return a, b
}

// Wait polls s's CQ until one completion arrives (or fails the test after
// 10 s) and returns it.
func (s *Side) Wait(t testing.TB) verbs.WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wc [1]verbs.WorkCompletion
	n, err := s.CQ.WaitPoll(ctx, wc[:])
	require.NoError(t, err, "waiting for a completion")
	require.Equal(t, 1, n)
	return wc[0]
}

// WaitN collects n completions.
func (s *Side) WaitN(t testing.TB, n int) []verbs.WorkCompletion {
	t.Helper()
	out := make([]verbs.WorkCompletion, 0, n)
	for len(out) < n {
		out = append(out, s.Wait(t))
	}
	return out
}

// Post posts one send request and fails the test if posting fails.
func (s *Side) Post(t testing.TB, wr verbs.SendWR) {
	t.Helper()
	n, err := s.QP.PostSend([]verbs.SendWR{wr})
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// PostRecv posts one receive of n bytes at offset off of s's buffer.
func (s *Side) PostRecv(t testing.TB, id uint64, off, n int) {
	t.Helper()
	_, err := s.QP.PostRecv([]verbs.RecvWR{{ID: id, SGL: []verbs.SGE{s.MR.SGE(off, n)}}})
	require.NoError(t, err)
}

// NoCompletion asserts that no completion arrives within d.
func (s *Side) NoCompletion(t testing.TB, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wc [1]verbs.WorkCompletion
	n, err := s.CQ.WaitPoll(ctx, wc[:])
	require.ErrorIs(t, err, context.DeadlineExceeded, "unexpected completion %+v", wc[0])
	require.Zero(t, n)
}
