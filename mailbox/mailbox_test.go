package mailbox_test

import (
	"bytes"
	"context"
	"math/rand/v2"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/epoch"
	"github.com/rvma/rvma/internal/spin"
	"github.com/rvma/rvma/internal/testutil"
	"github.com/rvma/rvma/mailbox"
	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

type rig struct {
	a, b *verbstest.Side
	tgt  *mailbox.Target
	in   *mailbox.Initiator
}

func newRig(t *testing.T, env verbstest.Env, cc verbs.ConnectConfig, tc *mailbox.TargetConfig) *rig {
	return rigCQ(t, env, verbs.CQConfig{}, cc, tc)
}

// bubbleRig is newRig on the loop provider for a test in a synctest
// bubble. Its CQs block at once instead of spinning first: a spin lasts a
// span of the clock, and the bubble's clock stands still while any
// goroutine runs.
func bubbleRig(t *testing.T, cc verbs.ConnectConfig, tc *mailbox.TargetConfig) *rig {
	return rigCQ(t, verbstest.Loop(), verbs.CQConfig{Spin: -1}, cc, tc)
}

func rigCQ(t *testing.T, env verbstest.Env, cqc verbs.CQConfig, cc verbs.ConnectConfig, tc *mailbox.TargetConfig) *rig {
	if cc.MinRNRTimer == 0 {
		cc.MinRNRTimer = 100 * time.Microsecond
	}
	a, b := verbstest.Pair(t, env, verbstest.PairConfig{CQ: cqc, Connect: cc, BufSize: 1 << 20})
	r := &rig{a: a, b: b, tgt: mailbox.NewTarget(b.Dev, tc)}
	r.in = mailbox.NewInitiator(a.QP, a.CQ)
	for i := range a.Buf {
		a.Buf[i] = byte(i*31 + 7)
	}
	return r
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func (r *rig) put(t *testing.T, mbox, off uint64, src, n int) error {
	return r.in.Put(ctx(t), mbox, off, r.a.MR.SGE(src, n))
}

func TestThresholdBytes(t *testing.T) {
	r := newRig(t, verbstest.Loop(), verbs.ConnectConfig{}, nil)
	w, err := r.tgt.Init(0xA, mailbox.Config{Threshold: 4096})
	require.NoError(t, err)
	b1, b2 := make([]byte, 4096), make([]byte, 4096)
	id1, _ := w.Post(b1)
	id2, _ := w.Post(b2)
	for _, i := range []int{2, 0, 3, 1} { // any order
		_, ok := w.Poll()
		require.False(t, ok, "no completion before the threshold")
		require.NoError(t, r.put(t, 0xA, uint64(i*1024), i*1024, 1024))
	}
	rec, err := w.Wait(ctx(t))
	require.NoError(t, err)
	require.Equal(t, uint64(0), rec.Epoch)
	require.Equal(t, id1, rec.Buffer)
	require.Equal(t, 4096, rec.Bytes)
	require.Equal(t, 4, rec.Ops)
	require.False(t, rec.Partial)
	require.Equal(t, r.a.Buf[:4096], b1)
	require.Equal(t, uint64(1), w.Epoch())
	// The next buffer is the head now.
	require.NoError(t, r.put(t, 0xA, 0, 0, 4096))
	rec, err = w.Wait(ctx(t))
	require.NoError(t, err)
	require.Equal(t, id2, rec.Buffer)
	require.Equal(t, uint64(1), rec.Epoch)
	require.Equal(t, r.a.Buf[:4096], b2)
	require.Len(t, w.Records(10), 2)
}

func TestThresholdOpsAndOvershoot(t *testing.T) {
	r := newRig(t, verbstest.Loop(), verbs.ConnectConfig{MTU: 512}, nil)
	ops, _ := r.tgt.Init(1, mailbox.Config{Threshold: 3, Count: mailbox.CountOps})
	ops.Post(make([]byte, 8192))
	for i, n := range []int{10, 2000, 1} { // multi-packet puts count once
		require.NoError(t, r.put(t, 1, uint64(i*3000), 0, n))
	}
	rec, err := ops.Wait(ctx(t))
	require.NoError(t, err)
	require.Equal(t, 3, rec.Ops)
	require.Equal(t, 2011, rec.Bytes)

	over, _ := r.tgt.Init(2, mailbox.Config{Threshold: 1000})
	over.Post(make([]byte, 4096))
	require.NoError(t, r.put(t, 2, 0, 0, 1500))
	rec, err = over.Wait(ctx(t))
	require.NoError(t, err, "exceeding the threshold completes the epoch")
	require.Equal(t, 1500, rec.Bytes)
}

func TestRefusals(t *testing.T) {
	cases := []struct {
		name  string
		setup func(r *rig) *mailbox.Window
		mbox  uint64
		off   uint64
		n     int
		want  error
	}{
		{"out of range", func(r *rig) *mailbox.Window {
			w, _ := r.tgt.Init(5, mailbox.Config{Threshold: 100})
			w.Post(make([]byte, 64))
			return w
		}, 5, 32, 33, mailbox.ErrOutOfRange},
		{"offset beyond the buffer", func(r *rig) *mailbox.Window {
			w, _ := r.tgt.Init(5, mailbox.Config{Threshold: 100})
			w.Post(make([]byte, 64))
			return w
		}, 5, 1 << 40, 1, mailbox.ErrOutOfRange},
		{"closed", func(r *rig) *mailbox.Window {
			w, _ := r.tgt.Init(6, mailbox.Config{Threshold: 100})
			w.Post(make([]byte, 64))
			w.Close()
			return w
		}, 6, 0, 8, mailbox.ErrWindowClosed},
		{"no window, no catch-all", func(r *rig) *mailbox.Window { return nil }, 7, 0, 8, mailbox.ErrNoMailbox},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t, verbstest.Loop(), verbs.ConnectConfig{}, nil)
			w := c.setup(r)
			err := r.put(t, c.mbox, c.off, 0, c.n)
			require.ErrorIs(t, err, c.want)
			require.ErrorIs(t, err, verbs.StatusRemoteAccessError)
			if w != nil {
				_, ok := w.Poll()
				require.False(t, ok)
			}
		})
	}
}

func TestSilentClose(t *testing.T) {
	r := newRig(t, verbstest.Loop(), verbs.ConnectConfig{}, nil)
	w, _ := r.tgt.Init(6, mailbox.Config{Threshold: 8, Silent: true})
	buf := make([]byte, 64)
	w.Post(buf)
	require.NoError(t, w.Close())
	require.NoError(t, r.put(t, 6, 0, 0, 8), "discarded without a NACK")
	require.Equal(t, make([]byte, 64), buf, "nothing placed")
	_, err := w.Wait(ctx(t))
	require.ErrorIs(t, err, mailbox.ErrWindowClosed)
	require.NoError(t, r.put(t, 6, 0, 0, 8), "the connection still works")
}

func TestCatchAllAndAppended(t *testing.T) {
	r := newRig(t, verbstest.Loop(), verbs.ConnectConfig{MTU: 256}, nil)
	ca, err := r.tgt.InitCatchAll(mailbox.Config{Threshold: 60, Placement: mailbox.Appended})
	require.NoError(t, err)
	buf := make([]byte, 1000)
	ca.Post(buf)
	var want []byte
	for i, n := range []int{10, 20, 30} {
		require.NoError(t, r.put(t, uint64(100+i), 999, i*100, n), "the offset is ignored when appending")
		want = append(want, r.a.Buf[i*100:i*100+n]...)
	}
	rec, err := ca.Wait(ctx(t))
	require.NoError(t, err)
	require.Equal(t, 60, rec.Bytes)
	require.Equal(t, want, buf[:60])
	_, err = r.tgt.InitCatchAll(mailbox.Config{Threshold: 1})
	require.ErrorIs(t, err, mailbox.ErrExists)
}

func TestIncEpochPartial(t *testing.T) {
	r := newRig(t, verbstest.Loop(), verbs.ConnectConfig{}, nil)
	w, _ := r.tgt.Init(9, mailbox.Config{Threshold: 1 << 20})
	w.Post(make([]byte, 4096))
	require.NoError(t, r.put(t, 9, 0, 0, 100))
	rec, err := w.IncEpoch()
	require.NoError(t, err)
	require.True(t, rec.Partial)
	require.Equal(t, 100, rec.Bytes)
	got, err := w.Wait(ctx(t))
	require.NoError(t, err)
	require.Equal(t, rec.Buffer, got.Buffer)
	_, err = w.IncEpoch()
	require.ErrorIs(t, err, mailbox.ErrNothingToTake)
}

// On the bubble's clock the RNR timer runs exactly as configured: 2ms are
// twenty retries of 100µs, taken in no time.
func TestBackPressure(t *testing.T) {
	t.Run("retried until a buffer is posted", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := bubbleRig(t, verbs.ConnectConfig{}, nil)
			w, _ := r.tgt.Init(3, mailbox.Config{Threshold: 8})
			h, err := r.in.PutAsync(3, 0, r.a.MR.SGE(0, 8))
			require.NoError(t, err)
			time.Sleep(2 * time.Millisecond)
			done, err := h.Test()
			require.NoError(t, err)
			require.False(t, done, "no buffer: the put waits")
			require.Positive(t, r.a.Dev.Stats().RNRNaks, "the put was refused and retried")
			buf := make([]byte, 8)
			w.Post(buf)
			require.NoError(t, h.Wait(ctx(t)))
			require.Equal(t, r.a.Buf[:8], buf)
		})
	})
	t.Run("bounded", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := bubbleRig(t, verbs.ConnectConfig{RNRRetry: 2}, nil)
			r.tgt.Init(3, mailbox.Config{Threshold: 8})
			require.ErrorIs(t, r.put(t, 3, 0, 0, 8), mailbox.ErrNoBuffer)
		})
	})
}

func TestLimits(t *testing.T) {
	r := newRig(t, verbstest.Loop(), verbs.ConnectConfig{}, &mailbox.TargetConfig{MaxPosted: 2, MaxOutstanding: 100})
	w, _ := r.tgt.Init(1, mailbox.Config{Threshold: 1000})
	_, err := w.Post(make([]byte, 1000))
	require.NoError(t, err)
	_, err = w.Post(make([]byte, 1000))
	require.NoError(t, err)
	_, err = w.Post(make([]byte, 1000))
	require.ErrorIs(t, err, mailbox.ErrLimit)
	require.NoError(t, r.put(t, 1, 0, 0, 60))
	require.ErrorIs(t, r.put(t, 1, 100, 0, 60), mailbox.ErrLimit, "the peer would have 120 bytes outstanding")
}

// A put is never split across epochs: one that crosses the threshold
// completes the epoch at its end; one cut short by IncEpoch is refused.
func TestEpochBoundaries(t *testing.T) {
	r := newRig(t, verbstest.Loop(), verbs.ConnectConfig{MTU: 256}, nil)
	w, _ := r.tgt.Init(4, mailbox.Config{Threshold: 100})
	b1, b2 := make([]byte, 4096), make([]byte, 4096)
	w.Post(b1)
	w.Post(b2)
	require.NoError(t, r.put(t, 4, 0, 0, 1000), "the first packet reaches the threshold; the rest follows it")
	rec, err := w.Wait(ctx(t))
	require.NoError(t, err)
	require.Equal(t, 1000, rec.Bytes)
	require.Equal(t, r.a.Buf[:1000], b1[:1000])
	require.NoError(t, r.put(t, 4, 0, 2000, 50))
	require.Equal(t, r.a.Buf[2000:2050], b2[:50], "the next put starts the next epoch")
}

func TestWaitWakesOnlyItsWindow(t *testing.T) {
	r := newRig(t, verbstest.Loop(), verbs.ConnectConfig{}, nil)
	w1, _ := r.tgt.Init(1, mailbox.Config{Threshold: 8})
	w2, _ := r.tgt.Init(2, mailbox.Config{Threshold: 8})
	w1.Post(make([]byte, 8))
	w2.Post(make([]byte, 8))
	require.NoError(t, r.put(t, 2, 0, 0, 8))
	c, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	_, err := w1.Wait(c)
	require.ErrorIs(t, err, context.DeadlineExceeded, "another window's completion does not wake w1")
	_, err = w2.Wait(ctx(t))
	require.NoError(t, err)
}

// TestScarceLongWaitSleeps: where ranks share cores, a wait for a peer
// that computes meanwhile takes the core from it if it spins (yielding
// does not give the core away for long). Once a window's waits have been
// long, the next sleeps at once: a 200 ms wait costs the process next to
// no processor time, where spinning to the 150 ms that RVMA_SPIN allows
// cost about that much. A window in process memory sleeps on its channel,
// one in shared memory (its puts placed by the origin) on the box's futex.
func TestScarceLongWaitSleeps(t *testing.T) {
	t.Run("process", func(t *testing.T) {
		r := newRig(t, verbstest.Loop(), verbs.ConnectConfig{}, nil)
		scarceWaits(t, r, func() []byte { return make([]byte, 8) })
	})
	t.Run("shared", func(t *testing.T) {
		r := newSharedRig(t)
		scarceWaits(t, r.rig, func() []byte { return r.buf(t, 8) })
	})
}

// scarceWaits does long waits on a window of r's target, then checks
// that a 200 ms wait uses next to no processor time. The spin is set
// after r's devices opened: their ports and CQs keep their own short
// spins, which would count too.
func scarceWaits(t *testing.T, r *rig, buf func() []byte) {
	require.NoError(t, spin.Set("150ms"))
	t.Cleanup(spin.Reset)
	w, err := r.tgt.Init(1, mailbox.Config{Threshold: 8})
	require.NoError(t, err)
	wait := func(after time.Duration) {
		w.Post(buf())
		go func() {
			time.Sleep(after)
			_ = r.put(t, 1, 0, 0, 8)
		}()
		rec, err := w.Wait(ctx(t))
		require.NoError(t, err)
		require.Equal(t, 8, rec.Bytes)
	}
	for range 6 {
		wait(2 * time.Millisecond) // long waits: far above a wake-up's cost
	}
	before := cpuTime(t)
	wait(200 * time.Millisecond)
	used := cpuTime(t) - before
	require.Less(t, used, 50*time.Millisecond, "the wait spun")
}

// cpuTime is the processor time the process used so far.
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestManySenders: several initiators put into one mailbox at once; every
// epoch completes exactly once with exactly its bytes.
func TestManySenders(t *testing.T) {
	for _, env := range []verbstest.Env{verbstest.Loop(), verbstest.UDP()} {
		t.Run(env.Name(), func(t *testing.T) {
			const senders, epochs, chunk = 4, 20, 256
			server := env.Open(t)
			tgt := mailbox.NewTarget(server, nil)
			w, err := tgt.Init(0x5EED, mailbox.Config{Threshold: senders * chunk, History: epochs})
			require.NoError(t, err)
			bufs := make([][]byte, epochs)
			for i := range bufs {
				bufs[i] = make([]byte, senders*chunk)
				_, err := w.Post(bufs[i])
				require.NoError(t, err)
			}
			pd, _ := server.AllocPD()
			var wg sync.WaitGroup
			errs := make(chan error, senders)
			for s := 0; s < senders; s++ {
				c := &verbstest.Side{Dev: env.Open(t)}
				c.PD, _ = c.Dev.AllocPD()
				c.CQ, _ = c.Dev.CreateCQ(verbs.CQConfig{})
				c.QP, _ = c.PD.CreateQP(verbs.QPConfig{SendCQ: c.CQ})
				scq, _ := server.CreateCQ(verbs.CQConfig{})
				sqp, _ := pd.CreateQP(verbs.QPConfig{SendCQ: scq})
				cfg := &verbs.ConnectConfig{MinRNRTimer: 50 * time.Microsecond}
				require.NoError(t, c.QP.Connect(sqp.Endpoint(), cfg))
				require.NoError(t, sqp.Connect(c.QP.Endpoint(), cfg))
				c.Buf = bytes.Repeat([]byte{byte(s + 1)}, chunk)
				c.MR, _ = c.PD.RegisterMR(c.Buf, 0)
				in := mailbox.NewInitiator(c.QP, c.CQ)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for e := 0; e < epochs; e++ {
						if err := in.Put(context.Background(), 0x5EED, uint64(s*chunk), c.MR.SGE(0, chunk)); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			for e := 0; e < epochs; e++ {
				rec, err := w.Wait(ctx(t))
				require.NoError(t, err)
				require.Equal(t, uint64(e), rec.Epoch)
				require.Equal(t, senders*chunk, rec.Bytes, "epoch %d", e)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			_, ok := w.Poll()
			require.False(t, ok, "exactly one completion per epoch")
		})
	}
}

// TestFaultsDoNotChangeTheOutcome: loss, duplication and reordering on the
// RC path never change what lands or how often an epoch completes.
func TestFaultsDoNotChangeTheOutcome(t *testing.T) {
	r := newRig(t, verbstest.Loop(), verbs.ConnectConfig{MTU: 512, Timeout: 2 * time.Millisecond}, nil)
	require.NoError(t, r.a.Dev.SetFaults(-1, verbs.Faults{Drop: 0.05, Duplicate: 0.2, Reorder: 0.2, Seed: 8}))
	require.NoError(t, r.b.Dev.SetFaults(-1, verbs.Faults{Drop: 0.05, Duplicate: 0.2, Reorder: 0.2, Seed: 9}))
	w, _ := r.tgt.Init(0xF, mailbox.Config{Threshold: 8192, History: 50})
	const epochs = 30
	bufs := make([][]byte, epochs)
	for i := range bufs {
		bufs[i] = make([]byte, 8192)
		w.Post(bufs[i])
	}
	rnd := rand.New(rand.NewPCG(1, 1))
	for e := 0; e < epochs; e++ {
		order := rnd.Perm(4)
		for _, i := range order {
			require.NoError(t, r.put(t, 0xF, uint64(i*2048), e*1000+i*2048, 2048))
		}
		rec, err := w.Wait(ctx(t))
		require.NoError(t, err)
		require.Equal(t, 8192, rec.Bytes, "counted once")
		require.Equal(t, 4, rec.Ops)
		require.Equal(t, r.a.Buf[e*1000:e*1000+8192], bufs[e])
	}
	_, ok := w.Poll()
	require.False(t, ok)
}

// TestRewindAfterFailedEpoch: a timestep fails mid-epoch; abandoning it and
// rewinding returns exactly the last completed data.
func TestRewindAfterFailedEpoch(t *testing.T) {
	r := newRig(t, verbstest.Loop(), verbs.ConnectConfig{}, nil)
	w, _ := r.tgt.Init(0xB, mailbox.Config{Threshold: 1024, History: 3})
	for i := 0; i < 4; i++ {
		w.Post(make([]byte, 1024))
	}
	for step := 0; step < 2; step++ {
		require.NoError(t, r.put(t, 0xB, 0, step*1024, 1024))
		_, err := w.Wait(ctx(t))
		require.NoError(t, err)
	}
	// Step 2 fails half way.
	require.NoError(t, r.put(t, 0xB, 0, 5000, 300))
	require.NoError(t, w.Abandon())
	_, ok := w.Poll()
	require.False(t, ok)
	rec, err := w.Rewind(1)
	require.NoError(t, err)
	require.Equal(t, uint64(1), rec.Epoch)
	require.Equal(t, r.a.Buf[1024:2048], rec.Data, "the last completed step's data")
	// The abandoned epoch left no trace and counts from zero again.
	require.NoError(t, r.put(t, 0xB, 0, 7000, 1024))
	rec, err = w.Wait(ctx(t))
	require.NoError(t, err)
	require.Equal(t, 1024, rec.Bytes)
	require.Equal(t, r.a.Buf[7000:8024], rec.Data)
	_, err = w.Rewind(10)
	require.Error(t, err)
}

func TestBadConfig(t *testing.T) {
	r := newRig(t, verbstest.Loop(), verbs.ConnectConfig{}, nil)
	_, err := r.tgt.Init(1, mailbox.Config{})
	require.ErrorIs(t, err, mailbox.ErrBadConfig)
	_, err = r.tgt.Init(1, mailbox.Config{Threshold: 1, History: 5000})
	require.ErrorIs(t, err, mailbox.ErrBadConfig)
	_, err = r.tgt.Init(1, mailbox.Config{Threshold: 1})
	require.NoError(t, err)
	_, err = r.tgt.Init(1, mailbox.Config{Threshold: 1})
	require.ErrorIs(t, err, mailbox.ErrExists)
}

// TestConcurrentWaiters: many goroutines wait on their own puts through one
// initiator; each returns as soon as its put completes (none is stranded
// behind a waiter that took its completion).
func TestConcurrentWaiters(t *testing.T) {
	r := newRig(t, verbstest.Loop(), verbs.ConnectConfig{}, nil)
	w, _ := r.tgt.Init(1, mailbox.Config{Threshold: 1 << 30, Placement: mailbox.Appended})
	w.Post(make([]byte, 1<<20))
	const waiters, each = 8, 50
	testutil.Rounds(t, waiters, each, func(g, _ int) error {
		h, err := r.in.PutAsync(1, 0, r.a.MR.SGE(g*64, 64))
		if err != nil {
			return err
		}
		c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return h.Wait(c)
	})
	rec, err := w.IncEpoch()
	require.NoError(t, err)
	require.Equal(t, waiters*each, rec.Ops)
}

// Discard resets a partial epoch's counts but keeps its bytes.
func TestDiscardKeepsBytes(t *testing.T) {
	r := newRig(t, verbstest.Loop(), verbs.ConnectConfig{}, nil)
	w, _ := r.tgt.Init(0xD, mailbox.Config{Threshold: 1024})
	buf := make([]byte, 1024)
	w.Post(buf)
	require.NoError(t, r.put(t, 0xD, 0, 100, 300))
	require.NoError(t, w.Discard())
	require.Equal(t, r.a.Buf[100:400], buf[:300], "discard keeps what was placed")
	require.NoError(t, r.put(t, 0xD, 0, 2000, 1024))
	rec, err := w.Wait(ctx(t))
	require.NoError(t, err)
	require.Equal(t, 1024, rec.Bytes, "counted from zero after the discard")
}

// TestEveryWaiterWakes: several goroutines wait on one window; a close
// must reach every one of them, and epochs completed together must each
// reach a waiter. A single wake-up token once went to one waiter and left
// the others asleep until their contexts ended.
func TestEveryWaiterWakes(t *testing.T) {
	const waiters = 3
	for _, tc := range []struct {
		name string
		act  func(t *testing.T, w *mailbox.Window)
		want func(t *testing.T, recs []epoch.Record, errs []error)
	}{
		{"close", func(t *testing.T, w *mailbox.Window) { require.NoError(t, w.Close()) },
			func(t *testing.T, _ []epoch.Record, errs []error) {
				for i, err := range errs {
					require.ErrorIs(t, err, mailbox.ErrWindowClosed, "waiter %d", i)
				}
			}},
		{"epochs", func(t *testing.T, w *mailbox.Window) {
			for range waiters {
				_, err := w.IncEpoch()
				require.NoError(t, err)
			}
		}, func(t *testing.T, recs []epoch.Record, errs []error) {
			seen := map[uint64]bool{}
			for i, err := range errs {
				require.NoError(t, err, "waiter %d", i)
				seen[recs[i].Epoch] = true
			}
			require.Len(t, seen, waiters, "each waiter took its own epoch")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, verbstest.Loop(), verbs.ConnectConfig{}, nil)
			w, err := r.tgt.Init(1, mailbox.Config{Threshold: 1 << 20})
			require.NoError(t, err)
			for range waiters {
				_, err := w.Post(make([]byte, 64))
				require.NoError(t, err)
			}
			recs, errs := make([]epoch.Record, waiters), make([]error, waiters)
			var wg sync.WaitGroup
			for i := range waiters {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					recs[i], errs[i] = w.Wait(c)
				}()
			}
			require.Eventually(t, func() bool { return w.Sleepers() == waiters }, 5*time.Second, time.Millisecond)
			tc.act(t, w)
			wg.Wait()
			tc.want(t, recs, errs)
		})
	}
}
