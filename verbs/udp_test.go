package verbs_test

import (
	"bufio"
	"bytes"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

// rcvbufErrors reads the kernel's count of UDP datagrams dropped because a
// socket's receive buffer was full.
func rcvbufErrors() uint64 {
	f, err := os.Open("/proc/net/snmp")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var head []string
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != "Udp:" {
			continue
		}
		if head == nil {
			head = fields
			continue
		}
		for i, h := range head {
			if h == "RcvbufErrors" && i < len(fields) {
				n, _ := strconv.ParseUint(fields[i], 10, 64)
				return n
			}
		}
	}
	return 0
}

// TestOverflowRecovered drives several RC QPs with large windows into one
// receiver at once, so that its socket buffer overflows, and checks that
// every byte arrives: packets the kernel drops are recovered by the
// transport, not fatal.
func TestOverflowRecovered(t *testing.T) {
	const qps, msgs, size = 4, 24, 1 << 20
	// A large window and no pacing: the receiver's socket buffer (14 MiB as
	// root) is smaller than what four QPs put in flight. The timeout is
	// generous because the race detector slows the receiver tenfold.
	cfg := &verbs.ConnectConfig{Window: 4096, Timeout: 50 * time.Millisecond}
	a, b := verbstest.Pair(t, verbstest.UDP(), verbstest.PairConfig{BufSize: qps * size, Connect: *cfg})
	r := rand.New(rand.NewPCG(3, 4))
	for i := range a.Buf {
		a.Buf[i] = byte(r.Uint32())
	}
	before := rcvbufErrors()
	var wg sync.WaitGroup
	errs := make(chan error, qps)
	for q := 0; q < qps; q++ {
		cq, err := a.Dev.CreateCQ(verbs.CQConfig{})
		require.NoError(t, err)
		qp, err := a.PD.CreateQP(verbs.QPConfig{SendCQ: cq})
		require.NoError(t, err)
		pcq, _ := b.Dev.CreateCQ(verbs.CQConfig{})
		peer, err := b.PD.CreateQP(verbs.QPConfig{SendCQ: pcq})
		require.NoError(t, err)
		require.NoError(t, qp.Connect(peer.Endpoint(), cfg))
		require.NoError(t, peer.Connect(qp.Endpoint(), cfg))
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := &verbstest.Side{QP: qp, CQ: cq}
			for m := 0; m < msgs; m++ {
				wr := verbs.SendWR{ID: uint64(m), Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.MR.SGE(q*size, size)},
					RemoteAddr: b.MR.Addr() + uint64(q*size), RKey: b.MR.RKey()}
				if m == msgs-1 {
					wr.Flags = verbs.FlagSignaled
				}
				if _, err := qp.PostSend([]verbs.SendWR{wr}); err != nil {
					errs <- err
					return
				}
			}
			if wc := s.Wait(t); wc.Status != verbs.StatusSuccess {
				errs <- wc.Err()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.True(t, bytes.Equal(a.Buf, b.Buf), "data differs after recovery")
	t.Logf("kernel receive-buffer drops during the test: %d (all recovered)", rcvbufErrors()-before)
}

// TestPeerDeviceGone: the peer's whole device (its sockets) disappears; the
// requester retries, fails with retry exceeded and flushes the rest.
func TestPeerDeviceGone(t *testing.T) {
	a, b := verbstest.Pair(t, verbstest.UDP(), verbstest.PairConfig{Connect: verbs.ConnectConfig{Timeout: time.Millisecond, RetryCount: 2}})
	require.NoError(t, b.Dev.Close())
	a.Post(t, verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.MR.SGE(0, 100)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()})
	a.Post(t, verbs.SendWR{ID: 2, Opcode: verbs.OpRead, SGL: []verbs.SGE{a.MR.SGE(0, 100)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()})
	wc := a.Wait(t)
	require.Equal(t, verbs.StatusRetryExceeded, wc.Status)
	require.Equal(t, uint64(1), wc.WRID)
	require.Equal(t, verbs.StatusFlushed, a.Wait(t).Status)
	require.Equal(t, verbs.StateError, a.QP.State())
}

func TestIPv6(t *testing.T) {
	a, b := verbstest.Pair(t, verbstest.UDP6(), verbstest.PairConfig{})
	require.True(t, a.QP.GID().Addr().Is6())
	copy(a.Buf, "over IPv6")
	a.Post(t, verbs.SendWR{ID: 1, Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{a.MR.SGE(0, 9)},
		RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()})
	require.Equal(t, verbs.StatusSuccess, a.Wait(t).Status)
	require.Equal(t, "over IPv6", string(b.Buf[:9]))
}

func TestBadUDPURIs(t *testing.T) {
	for _, uri := range []string{"udp://", "udp://nonsense", "udp://127.0.0.1:0?mtu=10", "udp://127.0.0.1:0?mtu=x",
		"udp://127.0.0.1:0,bad", "udp://203.0.113.1:0"} {
		_, err := verbs.Open(t.Context(), uri, nil)
		require.ErrorIs(t, err, verbs.ErrInvalidArgument, uri)
	}
}

// TestDropAccounting: every dropped packet is counted once, under exactly
// one reason, so RxDropped equals the sum of the reasons.
func TestDropAccounting(t *testing.T) {
	a, b := verbstest.Pair(t, verbstest.Loop(), verbstest.PairConfig{QP: verbs.QPConfig{Type: verbs.UC}, Connect: verbs.ConnectConfig{MTU: 256}})
	// Packets to a QP that is no longer ready, and UC messages broken by
	// loss, take the "discarded" path.
	require.NoError(t, a.Dev.SetFaults(-1, verbs.Faults{Drop: 0.3, Seed: 5}))
	for i := 0; i < 50; i++ {
		a.Post(t, verbs.SendWR{Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.MR.SGE(0, 2000)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()})
	}
	require.NoError(t, b.QP.SetError())
	require.NoError(t, a.Dev.SetFaults(-1, verbs.Faults{}))
	for i := 0; i < 10; i++ {
		a.Post(t, verbs.SendWR{Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.MR.SGE(0, 100)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()})
	}
	s := b.Dev.Stats()
	require.Positive(t, s.Discarded)
	require.Equal(t, s.RxDropped, s.UnknownQP+s.BadSource+s.BadSecret+s.BadPort+s.OutOfOrder+s.Duplicates+s.Malformed+s.Discarded,
		"%+v", s)
}

// TestBulkWindowAtLargestMTU: on a path of large packets, a bulk message
// puts no more than the bulk window's packets in flight (about 1 MiB),
// while small messages keep the whole window of 128. The responder's ACKs
// are dropped, so what arrives before the retransmission timeout is
// exactly what the window lets out.
func TestBulkWindowAtLargestMTU(t *testing.T) {
	cfg := verbstest.PairConfig{BufSize: 4 << 20, QP: verbs.QPConfig{MaxSendWR: 512},
		Connect: verbs.ConnectConfig{Timeout: 5 * time.Second}}
	arrived := func(b *verbstest.Side, want uint64) uint64 {
		// Wait until the count stops moving, then give stragglers a moment.
		var n uint64
		require.Eventually(t, func() bool {
			m := b.Dev.Stats().RxPackets
			done := m == n && m >= want
			n = m
			return done
		}, 5*time.Second, 50*time.Millisecond)
		time.Sleep(50 * time.Millisecond)
		return b.Dev.Stats().RxPackets
	}
	t.Run("bulk", func(t *testing.T) {
		a, b := verbstest.Pair(t, verbstest.UDPLargest(), cfg)
		mtu := a.QP.PathMTU()
		if mtu <= 4096 {
			t.Skipf("loopback carries only %d bytes a packet here", mtu)
		}
		require.NoError(t, b.Dev.SetFaults(-1, verbs.Faults{Drop: 1}))
		before := b.Dev.Stats().RxPackets
		a.Post(t, verbs.SendWR{Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.MR.SGE(0, 4<<20)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()})
		want := uint64(max(4, (1<<20)/mtu))
		require.Equal(t, want, arrived(b, before+want)-before, "packets of %d bytes in flight", mtu)
	})
	t.Run("small", func(t *testing.T) {
		a, b := verbstest.Pair(t, verbstest.UDPLargest(), cfg)
		require.NoError(t, b.Dev.SetFaults(-1, verbs.Faults{Drop: 1}))
		before := b.Dev.Stats().RxPackets
		for i := range 200 {
			a.Post(t, verbs.SendWR{Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.MR.SGE(i*8, 8)}, RemoteAddr: b.MR.Addr() + uint64(i*8), RKey: b.MR.RKey()})
		}
		require.Equal(t, uint64(128), arrived(b, before+128)-before)
	})
	t.Run("small then bulk", func(t *testing.T) {
		// Small writes ask for no ACK (they ask every 32) and fill more
		// than the bulk window (17 packets of 61440): the bulk write
		// behind them sends one packet asking for an ACK instead of
		// waiting for the delayed one.
		a, b := verbstest.Pair(t, verbstest.UDPLargest(), cfg)
		if a.QP.PathMTU() <= 4096 {
			t.Skipf("loopback carries only %d bytes a packet here", a.QP.PathMTU())
		}
		small := max(4, (1<<20)/a.QP.PathMTU()) + 3
		if small >= 32 {
			t.Skipf("a bulk window of %d packets: small writes would ask for an ACK first", small-3)
		}
		require.NoError(t, b.Dev.SetFaults(-1, verbs.Faults{Drop: 1}))
		before := b.Dev.Stats().RxPackets
		for i := range small {
			a.Post(t, verbs.SendWR{Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.MR.SGE(i*8, 8)}, RemoteAddr: b.MR.Addr() + uint64(i*8), RKey: b.MR.RKey()})
		}
		a.Post(t, verbs.SendWR{Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.MR.SGE(0, 4<<20)}, RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()})
		want := uint64(small + 1)
		require.Equal(t, want, arrived(b, before+want)-before)
	})
}

// TestSmallAndBulkMixed: rounds of small unsignaled writes then a bulk
// one, at the largest MTU, where the bulk window and the ACKs the
// requester forces meet: every write completes in order and every byte
// arrives.
func TestSmallAndBulkMixed(t *testing.T) {
	a, b := verbstest.Pair(t, verbstest.UDPLargest(), verbstest.PairConfig{BufSize: 1 << 20, QP: verbs.QPConfig{MaxSendWR: 512},
		Connect: verbs.ConnectConfig{Timeout: time.Second}})
	r := rand.New(rand.NewPCG(7, 8))
	for i := range a.Buf {
		a.Buf[i] = byte(r.Uint32())
	}
	for round := range 20 {
		for i := range 24 {
			a.Post(t, verbs.SendWR{Opcode: verbs.OpWrite, SGL: []verbs.SGE{a.MR.SGE(i*8, 8)}, RemoteAddr: b.MR.Addr() + uint64(i*8), RKey: b.MR.RKey()})
		}
		a.Post(t, verbs.SendWR{ID: uint64(round), Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{a.MR.SGE(0, 1<<20)},
			RemoteAddr: b.MR.Addr(), RKey: b.MR.RKey()})
		wc := a.Wait(t)
		require.Equal(t, verbs.StatusSuccess, wc.Status)
		require.Equal(t, uint64(round), wc.WRID)
	}
	require.True(t, bytes.Equal(a.Buf, b.Buf))
}
