package reliability

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
)

var fabricSeq atomic.Uint64

type end struct {
	dev  *verbs.Device
	pd   *verbs.PD
	cq   *verbs.CQ
	qp   *verbs.QP
	conn *Conn
}

// pair connects two Conns over loop devices with a 4 KiB MTU; faults
// apply to both directions.
func pair(t testing.TB, faults verbs.Faults, ca, cb Config) (a, b *end) {
	return pairCQ(t, verbs.CQConfig{Capacity: 16384}, faults, ca, cb)
}

// bubblePair is pair for a test in a synctest bubble. Its CQs block at
// once instead of spinning first: a spin lasts a span of the clock, and
// the bubble's clock stands still while any goroutine runs.
func bubblePair(t testing.TB, faults verbs.Faults, ca, cb Config) (a, b *end) {
	return pairCQ(t, verbs.CQConfig{Capacity: 16384, Spin: -1}, faults, ca, cb)
}

func pairCQ(t testing.TB, cqc verbs.CQConfig, faults verbs.Faults, ca, cb Config) (a, b *end) {
	name := fmt.Sprintf("rel-%d", fabricSeq.Add(1))
	mk := func(cfg Config) *end {
		e := &end{}
		var err error
		e.dev, err = verbs.Open(context.Background(), "loop://"+name+"?mtu=4096", nil)
		require.NoError(t, err)
		e.pd, err = e.dev.AllocPD()
		require.NoError(t, err)
		e.cq, err = e.dev.CreateCQ(cqc)
		require.NoError(t, err)
		e.qp, err = e.pd.CreateQP(QPConfig(e.cq, cfg))
		require.NoError(t, err)
		return e
	}
	a, b = mk(ca), mk(cb)
	require.NoError(t, a.qp.Connect(b.qp.Endpoint(), nil))
	require.NoError(t, b.qp.Connect(a.qp.Endpoint(), nil))
	if faults.Active() {
		fa, fb := faults, faults
		fb.Seed = faults.Seed + 1000
		require.NoError(t, a.dev.SetFaults(-1, fa))
		require.NoError(t, b.dev.SetFaults(-1, fb))
	}
	var err error
	a.conn, err = New(a.pd, a.qp, a.cq, ca)
	require.NoError(t, err)
	b.conn, err = New(b.pd, b.qp, b.cq, cb)
	require.NoError(t, err)
	t.Cleanup(func() {
		a.conn.Close()
		b.conn.Close()
		a.dev.Close()
		b.dev.Close()
	})
	return a, b
}

func payload(n int, seed uint64) []byte {
	b := make([]byte, n)
	rng := rand.New(rand.NewPCG(seed, 7))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// transfer sends msgs from a to b, with receives posted as the slots
// allow, and checks every byte.
func transfer(t *testing.T, a, b *end, sizes []int, opt *SendOptions) []SendResult {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	bufs := make([][]byte, len(sizes))
	errc := make(chan error, 1)
	recvs := make(chan *Recv, len(sizes))
	go func() {
		for i, n := range sizes {
			bufs[i] = make([]byte, n)
			r, err := b.conn.Post(ctx, bufs[i])
			if err != nil {
				errc <- err
				return
			}
			recvs <- r
		}
		errc <- nil
	}()
	var sends []*Send
	var want [][]byte
	for i, n := range sizes {
		data := payload(n, uint64(i+1))
		want = append(want, data)
		s, err := a.conn.Send(ctx, data, opt)
		require.NoError(t, err)
		sends = append(sends, s)
	}
	var res []SendResult
	for _, s := range sends {
		r, err := s.Wait(ctx)
		require.NoError(t, err)
		res = append(res, r)
	}
	require.NoError(t, <-errc)
	for i := range sizes {
		r := <-recvs
		require.NoError(t, r.Wait(ctx))
		require.True(t, r.Bitmap().Full())
		require.True(t, bytes.Equal(want[i], bufs[i]), "message %d differs", i)
	}
	return res
}

func TestTransferClean(t *testing.T) {
	for _, scheme := range []Scheme{SR, EC} {
		t.Run(scheme.String(), func(t *testing.T) {
			a, b := pair(t, verbs.Faults{}, Config{Scheme: scheme, M: 4}, Config{})
			res := transfer(t, a, b, []int{1, 4096, 4097, 100000, 1 << 20, 3<<20 + 5}, nil)
			for _, r := range res {
				require.Equal(t, scheme, r.Scheme)
				require.Zero(t, r.Decoded) // nothing was lost
			}
		})
	}
}

// Seeded loss, bursts, reordering and duplication: every byte arrives,
// whatever the scheme.
func TestTransferFaults(t *testing.T) {
	cases := []struct {
		name   string
		faults verbs.Faults
	}{
		{"loss 1%", verbs.Faults{Drop: 0.01, Seed: 1}},
		{"loss 5%", verbs.Faults{Drop: 0.05, Seed: 2}},
		{"loss 20%", verbs.Faults{Drop: 0.2, Seed: 3}},
		{"bursts", verbs.Faults{BurstEnter: 0.005, BurstExit: 0.2, Seed: 4}},
		{"reorder", verbs.Faults{Reorder: 0.05, Seed: 5}},
		{"duplicate", verbs.Faults{Duplicate: 0.05, Seed: 6}},
		{"all", verbs.Faults{Drop: 0.02, Reorder: 0.02, Duplicate: 0.02, Jitter: 200 * time.Microsecond, Seed: 7}},
	}
	for _, tc := range cases {
		for _, scheme := range []Scheme{SR, EC, Auto} {
			t.Run(tc.name+"/"+scheme.String(), func(t *testing.T) {
				a, b := pair(t, tc.faults, Config{Scheme: scheme, RTT: 2 * time.Millisecond}, Config{})
				sizes := []int{1 << 20, 300000, 2<<20 + 3, 5000, 1 << 20}
				if raceEnabled {
					sizes = []int{256 << 10, 100000, 5000}
				}
				transfer(t, a, b, sizes, nil)
			})
		}
	}
}

// A receiver that stops handling anything for a while (descheduled on a
// loaded host: far longer than a loopback RTO) has lost nothing: the
// sender probes with two chunks per message and backs off instead of
// sending everything in flight again, and every byte arrives.
func TestReceiverStallNotLoss(t *testing.T) {
	a, b := pair(t, verbs.Faults{}, Config{Scheme: SR, RTT: time.Millisecond}, Config{})
	// The stall: the receiver's goroutines need its lock for every
	// completion and status; hold it once the first chunks have landed.
	stalled := make(chan struct{})
	go func() {
		defer close(stalled)
		for deadline := time.Now().Add(10 * time.Second); b.cq.Len() <= 64; time.Sleep(100 * time.Microsecond) {
			if time.Now().After(deadline) {
				t.Error("no chunk landed in 10 s")
				return
			}
		}
		b.conn.mu.Lock()
		time.Sleep(300 * time.Millisecond)
		b.conn.mu.Unlock()
	}()
	res := transfer(t, a, b, []int{4 << 20, 4 << 20, 4 << 20}, nil)
	<-stalled
	chunks, repeats := 0, 0
	for _, r := range res {
		chunks += r.Transmissions - r.Retransmissions
		repeats += r.Retransmissions
	}
	// Probes: at most two per message per timeout, whose doublings fit
	// the stall about eight times, against the hundreds of chunks in
	// flight that the old rule sent again (about a thousand here).
	require.LessOrEqual(t, repeats, 2*3*8, "of %d chunks", chunks)
}

// A lost tail under a window the receiver cut below what is in flight: a
// stall declares nothing lost, so only the probes can reveal the tail,
// and they go whatever the window. Before they did, each round freed two
// chunks of the flight, at timeouts doubling to 64 RTOs: 9 s of the
// bubble's clock for this megabyte, against a quarter of a second.
func TestProbeIgnoresWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := bubblePair(t, verbs.Faults{}, Config{Scheme: SR}, Config{RecvDepth: 128, RecvWindow: 64 << 10})
		var lost atomic.Int64
		a.conn.testDrop = func(seq uint64, idx, try int) bool {
			if idx >= 32 && try <= 2 { // the tail, and its first probes
				if lost.Add(1) == 64 {
					// The receiver cuts its window to the floor, as when
					// its socket overflowed, and keeps it there.
					go func() {
						b.conn.mu.Lock()
						b.conn.rw.wnd, b.conn.rw.hold = 64<<10, time.Hour
						b.conn.mu.Unlock()
					}()
				}
				return true
			}
			return false
		}
		start := time.Now()
		transfer(t, a, b, []int{1 << 20}, nil)
		require.Less(t, time.Since(start), 2*time.Second, "on the bubble's clock")
	})
}

// A stripe that lost exactly m chunks decodes without a repeat; one that
// lost m+1 falls back to selective repeat of its missing data chunks.
func TestStripeDecodeAndFallback(t *testing.T) {
	const k, m = 8, 3
	for _, tc := range []struct {
		name       string
		drop       func(idx int) bool // first transmissions lost, by chunk index
		decoded    int
		retransmit int
	}{
		{"m data lost", func(i int) bool { return i == 1 || i == 4 || i == 7 }, 3, 0},
		{"m mixed lost", func(i int) bool { return i == 2 || i == 64+0 || i == 64+2 }, 1, 0}, // 64 data chunks; parity of stripe 0 at 64..
		// The three repeats go out together; the first to land completes
		// the stripe's k, which rebuilds the other two.
		{"m+1 lost", func(i int) bool { return i == 0 || i == 1 || i == 2 || i == 64+1 }, 2, 3},
		{"m+1 in the short last stripe", func(i int) bool { return i >= 64 && i < 64+4 }, 0, 0}, // parity only: data intact
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := pair(t, verbs.Faults{}, Config{Scheme: EC, M: m, RTT: 100 * time.Millisecond, MinRTT: 100 * time.Millisecond}, Config{K: k, MaxParity: m})
			a.conn.mu.Lock()
			a.conn.testDrop = func(seq uint64, idx, try int) bool { return try <= 1 && tc.drop(idx) }
			a.conn.mu.Unlock()
			res := transfer(t, a, b, []int{64 * 4096}, nil)
			require.Equal(t, EC, res[0].Scheme)
			require.Equal(t, tc.retransmit, res[0].Retransmissions)
			require.Equal(t, tc.decoded, res[0].Decoded)
		})
	}
}

// A chunk of an old message can never land in a new one: the old keys die
// at completion, and an immediate naming another message is ignored.
func TestLateChunksRejected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := bubblePair(t, verbs.Faults{}, Config{Scheme: SR}, Config{Slots: 1})
		ctx := context.Background()
		buf0 := make([]byte, 8192)
		r0, err := b.conn.Post(ctx, buf0)
		require.NoError(t, err)
		b.conn.mu.Lock()
		oldKey, oldAddr := r0.mr.RKey(), r0.mr.Addr()
		b.conn.mu.Unlock()
		s0, err := a.conn.Send(ctx, payload(8192, 1), nil)
		require.NoError(t, err)
		_, err = s0.Wait(ctx)
		require.NoError(t, err)
		require.NoError(t, r0.Wait(ctx))

		buf1 := make([]byte, 8192)
		r1, err := b.conn.Post(ctx, buf1) // the same slot, the next generation
		require.NoError(t, err)
		b.conn.mu.Lock()
		newKey, newAddr := r1.mr.RKey(), r1.mr.Addr()
		b.conn.mu.Unlock()

		junk, err := a.pd.RegisterMR(bytes.Repeat([]byte{0xEE}, 4096), verbs.AccessLocalWrite)
		require.NoError(t, err)
		stale := func(rkey uint32, addr uint64, id uint32) {
			wr := verbs.SendWR{Opcode: verbs.OpWriteImm, SGL: []verbs.SGE{junk.SGE(0, 4096)}, RemoteAddr: addr, RKey: rkey, Imm: id << idxBits} // chunk 0
			_, err := a.qp.PostSend([]verbs.SendWR{wr})
			require.NoError(t, err)
		}
		stale(oldKey, oldAddr, 0) // message 0's key: refused by the NIC
		stale(newKey, newAddr, 0) // message 1's memory but message 0's id: not counted
		// Once every goroutine is idle, the NIC and the poller have
		// handled both.
		synctest.Wait()
		require.Equal(t, 0, r1.Bitmap().Count())
		require.Equal(t, payload(8192, 1), buf0)

		want := payload(8192, 2)
		s1, err := a.conn.Send(ctx, want, nil)
		require.NoError(t, err)
		_, err = s1.Wait(ctx)
		require.NoError(t, err)
		require.NoError(t, r1.Wait(ctx))
		require.Equal(t, want, buf1)
	})
}

// The receiver may take a message with chunks missing; the sender learns
// it and stops.
func TestPartialCompletion(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := bubblePair(t, verbs.Faults{}, Config{Scheme: SR}, Config{})
		a.conn.mu.Lock()
		a.conn.testDrop = func(seq uint64, idx, try int) bool { return idx == 3 } // never arrives
		a.conn.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		buf := make([]byte, 10*4096)
		r, err := b.conn.Post(ctx, buf)
		require.NoError(t, err)
		data := payload(len(buf), 3)
		s, err := a.conn.Send(ctx, data, nil)
		require.NoError(t, err)
		synctest.Wait() // all but chunk 3 have landed; its repeats are dropped too
		require.Equal(t, 9, r.Bitmap().Count())
		r.Take()
		require.NoError(t, r.Wait(ctx))
		require.Equal(t, []Range{{3, 4}}, r.Bitmap().Gaps(nil))
		require.True(t, r.Stats().Partial)
		require.Equal(t, data[:3*4096], buf[:3*4096])
		require.Equal(t, data[4*4096:], buf[4*4096:])
		res, err := s.Wait(ctx)
		require.NoError(t, err)
		require.True(t, res.Partial)
	})
}

func TestErrors(t *testing.T) {
	t.Run("too large", func(t *testing.T) {
		a, b := pair(t, verbs.Faults{}, Config{}, Config{})
		ctx := context.Background()
		_, err := b.conn.Post(ctx, make([]byte, 100))
		require.NoError(t, err)
		s, err := a.conn.Send(ctx, make([]byte, 101), nil)
		require.NoError(t, err)
		_, err = s.Wait(ctx)
		require.ErrorIs(t, err, ErrTooLarge)
	})
	t.Run("peer vanishes", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			const timeout = 300 * time.Millisecond
			a, b := bubblePair(t, verbs.Faults{}, Config{PeerTimeout: timeout}, Config{})
			ctx := context.Background()
			_, err := b.conn.Post(ctx, make([]byte, 1<<20))
			require.NoError(t, err)
			synctest.Wait() // the receive's clear-to-send has reached a
			a.conn.mu.Lock()
			require.Len(t, a.conn.cts, 1)
			a.conn.mu.Unlock()
			require.NoError(t, b.dev.SetFaults(-1, verbs.Faults{Drop: 1})) // b falls silent
			require.NoError(t, a.dev.SetFaults(-1, verbs.Faults{Drop: 1}))
			s, err := a.conn.Send(ctx, make([]byte, 1<<20), nil)
			require.NoError(t, err)
			start := time.Now()
			_, err = s.Wait(ctx)
			require.ErrorIs(t, err, ErrPeer)
			// On the bubble's clock: at the first tick (25ms apart at
			// most) after nothing was heard for the timeout.
			const tick = 25 * time.Millisecond
			require.GreaterOrEqual(t, time.Since(start), timeout-tick)
			require.Less(t, time.Since(start), timeout+2*tick)
			_, err = a.conn.Send(ctx, make([]byte, 10), nil)
			require.ErrorIs(t, err, ErrPeer)
		})
	})
	t.Run("closed", func(t *testing.T) {
		a, _ := pair(t, verbs.Faults{}, Config{}, Config{})
		ctx := context.Background()
		var sends []*Send
		for i := 0; i < 3; i++ { // no receive posted: all pending
			s, err := a.conn.Send(ctx, make([]byte, 10), nil)
			require.NoError(t, err)
			sends = append(sends, s)
		}
		require.NoError(t, a.conn.Close())
		for _, s := range sends {
			wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := s.Wait(wctx)
			cancel()
			require.ErrorIs(t, err, ErrClosed)
		}
		_, err := a.conn.Post(ctx, make([]byte, 10))
		require.ErrorIs(t, err, ErrClosed)
	})
	t.Run("config", func(t *testing.T) {
		for _, cfg := range []Config{{Slots: 3}, {Chunk: 1000}, {K: 200, MaxParity: 100}, {Alpha: 50}} {
			e := &end{}
			var err error
			e.dev, err = verbs.Open(context.Background(), fmt.Sprintf("loop://cfg-%d", fabricSeq.Add(1)), nil)
			require.NoError(t, err)
			defer e.dev.Close()
			_, err = New(nil, mustUC(t, e.dev), nil, cfg)
			require.ErrorIs(t, err, ErrConfig, "%+v", cfg)
		}
	})
}

// mustUC returns a UC QP connected to itself, for configuration checks.
func mustUC(t *testing.T, dev *verbs.Device) *verbs.QP {
	pd, err := dev.AllocPD()
	require.NoError(t, err)
	cq, err := dev.CreateCQ(verbs.CQConfig{})
	require.NoError(t, err)
	qp, err := pd.CreateQP(verbs.QPConfig{Type: verbs.UC, SendCQ: cq})
	require.NoError(t, err)
	require.NoError(t, qp.Connect(qp.Endpoint(), nil))
	return qp
}

// The receive window starts at what the posted receives hold (less an
// eighth for control messages) and never lets more backlog build at the
// receiver than that on top of what the path itself holds in a round
// trip, however fast chunks arrive: a chunk that finds no receive is
// dropped.
func TestRecvWindowBoundByReceives(t *testing.T) {
	const rq = 7 * 512 * 4096 // 4096 receives of 4 KiB chunks, less an eighth
	for _, tc := range []struct {
		name  string
		cfg   Config
		rtt   time.Duration
		rate  float64 // bytes/s arriving
		wantB float64 // the most advertised
	}{
		{"bursty loopback", Config{Chunk: 4096, RecvDepth: 4096}, 150 * time.Microsecond, 5e9, rq + 5e9*150e-6},
		{"long haul", Config{Chunk: 4096, RecvDepth: 4096}, 100 * time.Millisecond, 250e6, rq + 250e6*0.1},
		{"window asked above", Config{Chunk: 8192, RecvDepth: 1024, RecvWindow: 64 << 20}, time.Millisecond, 20e9, 7*128*8192 + 20e9*1e-3},
		{"slow path", Config{Chunk: 4096, RecvDepth: 4096}, time.Millisecond, 10e6, rq}, // where it starts
		{"capped", Config{Chunk: 4096, RecvDepth: 4096, MaxRecvWindow: 4 << 20}, 100 * time.Millisecond, 250e6, 4 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			require.NoError(t, cfg.setDefaults(4096))
			c := &Conn{cfg: cfg, srtt: tc.rtt, minRTT: tc.rtt}
			var most uint64
			for now := time.Duration(0); now < 10*time.Second; now += time.Millisecond {
				c.rw.rx = int64(tc.rate * now.Seconds())
				c.windowLocked(now)
				most = max(most, c.rw.advertised(&c.cfg))
			}
			require.InEpsilon(t, tc.wantB, float64(most), 1e-6, "most advertised")
		})
	}
}

// A receiver that falls behind halves its window, once per round trip,
// down to RecvWindow's floor, from where it started.
func TestRecvWindowShrinksToFloor(t *testing.T) {
	cfg := Config{Chunk: 4096, RecvDepth: 4096}
	require.NoError(t, cfg.setDefaults(4096))
	c := &Conn{cfg: cfg, srtt: 10 * time.Millisecond, minRTT: 10 * time.Millisecond}
	c.windowLocked(0)
	start := c.rw.advertised(&c.cfg)
	require.EqualValues(t, 7*512*4096, start)
	var seen []uint64
	for now := time.Duration(0); now < 2*time.Second; now += time.Millisecond {
		c.rw.behind = true
		c.windowLocked(now)
		if w := c.rw.advertised(&c.cfg); len(seen) == 0 || seen[len(seen)-1] != w {
			seen = append(seen, w)
		}
	}
	require.EqualValues(t, 2<<20, seen[len(seen)-1], "the floor")
	for i := 1; i < len(seen); i++ {
		require.Equal(t, max(seen[i-1]/2, 2<<20), seen[i], "halves: %v", seen)
	}
	require.GreaterOrEqual(t, c.rw.cuts, len(seen)-1)
}
