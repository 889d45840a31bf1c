//go:build linux

package mailbox_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/mailbox"
	"github.com/rvma/rvma/verbs"
	"github.com/rvma/rvma/verbs/verbstest"
)

// BenchmarkSharedPutNotify is one notified put through a shared window,
// both sides in one goroutine: the work of a direct put, of noticing its
// epoch and of reposting, without the processor-to-processor transfers of
// two processes.
func BenchmarkSharedPutNotify(b *testing.B) {
	a, t := verbstest.Pair(b, verbstest.SHMAlloc(), verbstest.PairConfig{})
	tgt := mailbox.NewTarget(t.Dev, nil)
	w, err := tgt.Init(0xB0B, mailbox.Config{Threshold: 8, History: 1})
	require.NoError(b, err)
	mr, err := t.PD.AllocMR(4096, verbs.AccessLocalWrite)
	require.NoError(b, err)
	for range 16 {
		w.Post(mr.Bytes()[:8])
	}
	wr := []verbs.SendWR{{Opcode: verbs.OpMailboxWrite, SGL: []verbs.SGE{a.MR.SGE(0, 8)}, Mailbox: 0xB0B}}
	d0 := a.Dev.Stats().Direct
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := a.QP.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		rec, ok := w.Poll()
		if !ok {
			b.Fatal("no epoch")
		}
		w.Post(rec.Data)
	}
	b.StopTimer()
	require.Equal(b, uint64(b.N), a.Dev.Stats().Direct-d0)
}

// sharedRig is a pair on shm whose target's windows are shared, with
// buffers from device memory, so the initiator's puts are placed and
// counted by the initiator itself.
type sharedRig struct {
	*rig
	pd *verbs.PD
}

func newSharedRig(t *testing.T) *sharedRig {
	r := newRig(t, verbstest.SHMAlloc(), verbs.ConnectConfig{MinRNRTimer: 100 * time.Microsecond}, nil)
	return &sharedRig{rig: r, pd: r.b.PD}
}

// buf returns n bytes of the target's device memory.
func (r *sharedRig) buf(t *testing.T, n int) []byte {
	mr, err := r.pd.AllocMR(n, verbs.AccessLocalWrite)
	require.NoError(t, err)
	t.Cleanup(func() { mr.Deregister() })
	return mr.Bytes()
}

// direct counts the initiator's direct operations and the target's
// received packets during f.
func (r *sharedRig) direct(f func()) (direct, rx uint64) {
	d0, rx0 := r.a.Dev.Stats().Direct, r.b.Dev.Stats().RxPackets
	f()
	return r.a.Dev.Stats().Direct - d0, r.b.Dev.Stats().RxPackets - rx0
}

// TestSharedWindow runs the mailbox semantics through a shared window:
// what the initiator places itself must count exactly as packets would,
// and what it cannot place goes as packets and meets the same refusals.
func TestSharedWindow(t *testing.T) {
	t.Run("threshold in any order, no packets", func(t *testing.T) {
		r := newSharedRig(t)
		w, err := r.tgt.Init(0xA, mailbox.Config{Threshold: 4096})
		require.NoError(t, err)
		b1, b2 := r.buf(t, 4096), r.buf(t, 4096)
		w.Post(b1)
		w.Post(b2)
		direct, rx := r.direct(func() {
			for _, i := range []int{2, 0, 3, 1} {
				_, ok := w.Poll()
				require.False(t, ok, "no completion before the threshold")
				require.NoError(t, r.put(t, 0xA, uint64(i*1024), i*1024, 1024))
			}
		})
		require.Equal(t, uint64(4), direct)
		require.Zero(t, rx, "placed and counted by the initiator")
		rec, err := w.Wait(ctx(t))
		require.NoError(t, err)
		require.Equal(t, 4096, rec.Bytes)
		require.Equal(t, 4, rec.Ops)
		require.Equal(t, r.a.Buf[:4096], b1)
		require.NoError(t, r.put(t, 0xA, 0, 0, 4096))
		rec, err = w.Wait(ctx(t))
		require.NoError(t, err)
		require.Equal(t, uint64(1), rec.Epoch)
		require.Equal(t, r.a.Buf[:4096], b2)
	})

	t.Run("ops, overshoot, appended", func(t *testing.T) {
		r := newSharedRig(t)
		ops, _ := r.tgt.Init(1, mailbox.Config{Threshold: 3, Count: mailbox.CountOps})
		ops.Post(r.buf(t, 8192))
		for i, n := range []int{10, 2000, 1} {
			require.NoError(t, r.put(t, 1, uint64(i*3000), 0, n))
		}
		rec, err := ops.Wait(ctx(t))
		require.NoError(t, err)
		require.Equal(t, 3, rec.Ops)
		require.Equal(t, 2011, rec.Bytes)

		app, _ := r.tgt.Init(2, mailbox.Config{Threshold: 60, Placement: mailbox.Appended})
		b := r.buf(t, 1000)
		app.Post(b)
		var want []byte
		for i, n := range []int{10, 20, 30} {
			require.NoError(t, r.put(t, 2, 999, i*100, n))
			want = append(want, r.a.Buf[i*100:i*100+n]...)
		}
		rec, err = app.Wait(ctx(t))
		require.NoError(t, err)
		require.Equal(t, 60, rec.Bytes)
		require.Equal(t, want, b[:60])
	})

	t.Run("refusals go as packets", func(t *testing.T) {
		r := newSharedRig(t)
		w, _ := r.tgt.Init(5, mailbox.Config{Threshold: 100})
		w.Post(r.buf(t, 64))
		var err error
		direct, rx := r.direct(func() { err = r.put(t, 5, 32, 0, 33) })
		require.ErrorIs(t, err, mailbox.ErrOutOfRange)
		require.Zero(t, direct)
		require.NotZero(t, rx)

		r = newSharedRig(t)
		w, _ = r.tgt.Init(6, mailbox.Config{Threshold: 100})
		w.Post(r.buf(t, 64))
		require.NoError(t, w.Close())
		require.ErrorIs(t, r.put(t, 6, 0, 0, 8), mailbox.ErrWindowClosed)
	})

	t.Run("no buffer: waits, then lands", func(t *testing.T) {
		r := newSharedRig(t)
		w, _ := r.tgt.Init(3, mailbox.Config{Threshold: 8})
		h, err := r.in.PutAsync(3, 0, r.a.MR.SGE(0, 8))
		require.NoError(t, err)
		time.Sleep(2 * time.Millisecond)
		done, err := h.Test()
		require.NoError(t, err)
		require.False(t, done, "no buffer: the put waits")
		b := r.buf(t, 8)
		w.Post(b)
		require.NoError(t, h.Wait(ctx(t)))
		rec, err := w.Wait(ctx(t))
		require.NoError(t, err)
		require.Equal(t, 8, rec.Bytes)
		require.Equal(t, r.a.Buf[:8], b)
	})

	t.Run("IncEpoch and Abandon see direct puts", func(t *testing.T) {
		r := newSharedRig(t)
		w, _ := r.tgt.Init(9, mailbox.Config{Threshold: 1 << 20})
		b1, b2 := r.buf(t, 4096), r.buf(t, 4096)
		w.Post(b1)
		w.Post(b2)
		require.NoError(t, r.put(t, 9, 0, 0, 100))
		rec, err := w.IncEpoch()
		require.NoError(t, err)
		require.True(t, rec.Partial)
		require.Equal(t, 100, rec.Bytes)
		require.NoError(t, r.put(t, 9, 200, 0, 50))
		require.Equal(t, r.a.Buf[:50], b2[200:250])
		require.NoError(t, w.Abandon())
		require.Equal(t, make([]byte, 4096), b2, "the abandoned epoch's bytes are zeroed")
		require.NoError(t, r.put(t, 9, 0, 0, 10))
		rec, err = w.IncEpoch()
		require.NoError(t, err)
		require.Equal(t, 10, rec.Bytes, "counts restarted")
	})

	t.Run("a reservation sends later puts to the next buffer", func(t *testing.T) {
		r := newSharedRig(t)
		w, _ := r.tgt.Init(4, mailbox.Config{Threshold: 64})
		b1, b2 := r.buf(t, 64), r.buf(t, 64)
		w.Post(b1)
		w.Post(b2)
		res, err := w.Reserve(0, 64)
		require.NoError(t, err)
		require.NoError(t, r.put(t, 4, 0, 0, 64))
		require.Equal(t, r.a.Buf[:64], b2, "the head is full of the reservation")
		copy(res.Data, "reserved")
		require.NoError(t, res.Commit(64))
		rec, err := w.Wait(ctx(t))
		require.NoError(t, err)
		require.Equal(t, "reserved", string(rec.Data[:8]))
		rec, err = w.Wait(ctx(t))
		require.NoError(t, err)
		require.Equal(t, uint64(1), rec.Epoch)
	})
}

// TestSharedWindowMixed: puts placed by the initiator and puts that
// arrive as packets (from a QP whose port injects faults, duplicates
// included) count into one window exactly.
func TestSharedWindowMixed(t *testing.T) {
	r := newSharedRig(t)
	// A second initiator QP on the initiator's other GID, whose port
	// injects faults, so that it speaks packets only.
	tcq, err := r.b.Dev.CreateCQ(verbs.CQConfig{})
	require.NoError(t, err)
	tqp, err := r.b.PD.CreateQP(verbs.QPConfig{SendCQ: tcq, GID: 1})
	require.NoError(t, err)
	scq, err := r.a.Dev.CreateCQ(verbs.CQConfig{})
	require.NoError(t, err)
	sqp, err := r.a.PD.CreateQP(verbs.QPConfig{SendCQ: scq, GID: 1})
	require.NoError(t, err)
	require.NoError(t, tqp.Connect(sqp.Endpoint(), nil))
	require.NoError(t, sqp.Connect(tqp.Endpoint(), nil))
	require.NoError(t, r.a.Dev.SetFaults(1, verbs.Faults{Duplicate: 0.3, Seed: 7}))
	slow := mailbox.NewInitiator(sqp, scq)

	const puts, size = 200, 64
	for i := range size {
		r.a.Buf[4096+i] = 0xEE
	}
	w, _ := r.tgt.Init(0xC, mailbox.Config{Threshold: 2 * puts * size, History: 2})
	b := r.buf(t, 2*puts*size)
	w.Post(b)
	errs := make(chan error, 2)
	go func() {
		for i := range puts {
			if err := r.in.Put(ctx(t), 0xC, uint64(i*size), r.a.MR.SGE(0, size)); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	go func() {
		for i := range puts {
			if err := slow.Put(ctx(t), 0xC, uint64((puts+i)*size), r.a.MR.SGE(4096, size)); err != nil {
				errs <- err
				return
			}
		}
		errs <- nil
	}()
	require.NoError(t, <-errs)
	require.NoError(t, <-errs)
	rec, err := w.Wait(ctx(t))
	require.NoError(t, err)
	require.Equal(t, 2*puts*size, rec.Bytes)
	require.Equal(t, 2*puts, rec.Ops)
	for i := range puts {
		require.Equal(t, r.a.Buf[:size], b[i*size:(i+1)*size], "direct put %d", i)
		require.Equal(t, r.a.Buf[4096:4096+size], b[(puts+i)*size:(puts+i+1)*size], "packet put %d", i)
	}
	require.Equal(t, uint64(puts), r.a.Dev.Stats().Direct, "the faulty port's puts went as packets")
	require.GreaterOrEqual(t, r.b.Dev.Stats().RxPackets, uint64(puts))
	_, ok := w.Poll()
	require.False(t, ok, "exactly one epoch")
}

// TestSharedWindowBatch: mailbox writes posted together are placed by the
// initiator as one batch (one look-up, one lock), and count exactly as the
// same writes one by one: into the buffer that is not full when each
// arrives, the rest of a batch moving on to the next buffer when one
// fills, going as packets when none is posted, and stopping at a request
// that fails, which fails the QP as always.
func TestSharedWindowBatch(t *testing.T) {
	// wr is a signalled mailbox write of n bytes of the initiator's buffer
	// at src, to offset off.
	wr := func(r *sharedRig, id uint64, mbox, off uint64, src, n int) verbs.SendWR {
		return verbs.SendWR{ID: id, Opcode: verbs.OpMailboxWrite, Flags: verbs.FlagSignaled,
			SGL: []verbs.SGE{r.a.MR.SGE(src, n)}, Mailbox: mbox, MailboxOffset: off}
	}
	post := func(t *testing.T, r *sharedRig, wrs []verbs.SendWR) {
		n, err := r.a.QP.PostSend(wrs)
		require.NoError(t, err)
		require.Equal(t, len(wrs), n)
	}
	success := func(t *testing.T, r *sharedRig, n int) {
		for i, wc := range r.a.WaitN(t, n) {
			require.Equal(t, verbs.StatusSuccess, wc.Status, "request %d", i)
		}
	}

	t.Run("strided, one epoch, no packets", func(t *testing.T) {
		r := newSharedRig(t)
		w, err := r.tgt.Init(0xA, mailbox.Config{Threshold: 16 * 256, History: 1})
		require.NoError(t, err)
		b := r.buf(t, 16*512)
		w.Post(b)
		var wrs []verbs.SendWR
		for i := range 16 {
			wrs = append(wrs, wr(r, uint64(i), 0xA, uint64(512*i), 256*i, 256))
		}
		direct, rx := r.direct(func() { post(t, r, wrs) })
		require.Equal(t, uint64(16), direct)
		require.Zero(t, rx, "placed and counted by the initiator")
		success(t, r, 16)
		rec, err := w.Wait(ctx(t))
		require.NoError(t, err)
		require.Equal(t, 16*256, rec.Bytes)
		require.Equal(t, 16, rec.Ops)
		for i := range 16 {
			require.Equal(t, r.a.Buf[256*i:256*(i+1)], b[512*i:512*i+256], "run %d", i)
			require.Equal(t, make([]byte, 256), b[512*i+256:512*(i+1)], "gap %d", i)
		}
	})

	t.Run("a batch fills one buffer and goes on in the next", func(t *testing.T) {
		for _, count := range []mailbox.Count{mailbox.CountBytes, mailbox.CountOps} {
			r := newSharedRig(t)
			th := 1024
			if count == mailbox.CountOps {
				th = 4
			}
			w, err := r.tgt.Init(0xB, mailbox.Config{Threshold: th, Count: count})
			require.NoError(t, err)
			b1, b2 := r.buf(t, 1024), r.buf(t, 1024)
			w.Post(b1)
			w.Post(b2)
			var wrs []verbs.SendWR
			for i := range 7 {
				wrs = append(wrs, wr(r, uint64(i), 0xB, uint64(256*(i%4)), 256*i, 256))
			}
			direct, rx := r.direct(func() { post(t, r, wrs) })
			require.Equal(t, uint64(7), direct)
			require.Zero(t, rx)
			success(t, r, 7)
			rec, err := w.Wait(ctx(t))
			require.NoError(t, err)
			require.Equal(t, 1024, rec.Bytes, "the first four fill the first buffer")
			require.Equal(t, r.a.Buf[:1024], b1)
			_, ok := w.Poll()
			require.False(t, ok, "three of four in the second")
			require.Equal(t, r.a.Buf[1024:1024+768], b2[:768])
			require.NoError(t, r.put(t, 0xB, 768, 0, 256))
			rec, err = w.Wait(ctx(t))
			require.NoError(t, err)
			require.Equal(t, 1024, rec.Bytes)
			require.Equal(t, 4, rec.Ops)
		}
	})

	t.Run("no buffer left: the rest go as packets", func(t *testing.T) {
		r := newSharedRig(t)
		w, _ := r.tgt.Init(0xC, mailbox.Config{Threshold: 512})
		b1 := r.buf(t, 512)
		w.Post(b1)
		var wrs []verbs.SendWR
		for i := range 4 {
			wrs = append(wrs, wr(r, uint64(i), 0xC, uint64(256*(i%2)), 256*i, 256))
		}
		direct, _ := r.direct(func() { post(t, r, wrs) })
		require.Equal(t, uint64(2), direct, "the two that fill the only buffer")
		rec, err := w.Wait(ctx(t))
		require.NoError(t, err)
		require.Equal(t, r.a.Buf[:512], b1)
		b2 := r.buf(t, 512)
		w.Post(b2) // the other two were waiting for it (not ready, retried)
		success(t, r, 4)
		rec, err = w.Wait(ctx(t))
		require.NoError(t, err)
		require.Equal(t, 512, rec.Bytes)
		require.Equal(t, r.a.Buf[512:1024], b2)
	})

	t.Run("a bad key stops the batch and fails the QP", func(t *testing.T) {
		r := newSharedRig(t)
		w, _ := r.tgt.Init(0xD, mailbox.Config{Threshold: 6 * 64})
		b := r.buf(t, 6*64)
		w.Post(b)
		var wrs []verbs.SendWR
		for i := range 6 {
			wrs = append(wrs, wr(r, uint64(i), 0xD, uint64(64*i), 64*i, 64))
		}
		wrs[3].SGL[0].LKey ^= 0x77
		direct, _ := r.direct(func() { post(t, r, wrs) })
		require.Equal(t, uint64(3), direct, "the three before the bad one")
		want := []verbs.Status{verbs.StatusSuccess, verbs.StatusSuccess, verbs.StatusSuccess,
			verbs.StatusLocalProtectionError, verbs.StatusFlushed, verbs.StatusFlushed}
		for i, wc := range r.a.WaitN(t, len(wrs)) {
			require.Equal(t, uint64(i), wc.WRID)
			require.Equal(t, want[i], wc.Status, "request %d", i)
		}
		require.Equal(t, verbs.StateError, r.a.QP.State())
		require.Equal(t, r.a.Buf[:3*64], b[:3*64])
		require.Equal(t, make([]byte, 3*64), b[3*64:], "nothing after the bad one")
	})
}

// TestPlaceMailbox: QP.PlaceMailbox places gathered pieces from memory
// nobody registered, counted as posted mailbox writes would be, with no
// packet and no completion; and it declines, placing nothing, wherever a
// posted request would not be placed at once: behind a request still to
// take effect, into a mailbox the target does not share, on a port that
// cannot reach the target's memory. It stops at a piece that moves
// nothing.
func TestPlaceMailbox(t *testing.T) {
	// pieces makes n pieces of 2 x 64 bytes of src, to offsets 256 apart.
	pieces := func(src []byte, n int) []verbs.MailboxPiece {
		var ps []verbs.MailboxPiece
		for i := range n {
			at := 128 * i
			ps = append(ps, verbs.MailboxPiece{Offset: uint64(256 * i), Src: [][]byte{src[at : at+64], src[at+64 : at+128]}})
		}
		return ps
	}
	src := make([]byte, 16*128) // plain Go memory
	for i := range src {
		src[i] = byte(i*13 + 1)
	}

	t.Run("placed, counted once, no packet, no completion", func(t *testing.T) {
		r := newSharedRig(t)
		require.True(t, r.a.QP.CanPlace())
		w, err := r.tgt.Init(0xA, mailbox.Config{Threshold: 16 * 128})
		require.NoError(t, err)
		b := r.buf(t, 16*256)
		w.Post(b)
		var k int
		direct, rx := r.direct(func() { k = r.a.QP.PlaceMailbox(0xA, pieces(src, 16)) })
		require.Equal(t, 16, k)
		require.Equal(t, uint64(16), direct)
		require.Zero(t, rx)
		rec, err := w.Wait(ctx(t))
		require.NoError(t, err)
		require.Equal(t, 16*128, rec.Bytes)
		require.Equal(t, 16, rec.Ops)
		for i := range 16 {
			require.Equal(t, src[128*i:128*(i+1)], b[256*i:256*i+128], "piece %d", i)
			require.Equal(t, make([]byte, 128), b[256*i+128:256*(i+1)], "gap %d", i)
		}
		require.Zero(t, r.a.CQ.Len(), "placed writes make no completion")
	})

	t.Run("not behind a request still to take effect", func(t *testing.T) {
		r := newSharedRig(t)
		w, _ := r.tgt.Init(0xB, mailbox.Config{Threshold: 256})
		other, _ := r.tgt.Init(0xC, mailbox.Config{Threshold: 128})
		ob := r.buf(t, 256)
		other.Post(ob)
		// No buffer posted in 0xB: this write goes as packets and waits.
		_, err := r.a.QP.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.OpMailboxWrite, Flags: verbs.FlagSignaled,
			SGL: []verbs.SGE{r.a.MR.SGE(0, 256)}, Mailbox: 0xB}})
		require.NoError(t, err)
		require.Zero(t, r.a.QP.PlaceMailbox(0xC, pieces(src, 1)), "it would overtake the write")
		require.Equal(t, make([]byte, 256), ob)
		b := r.buf(t, 256)
		w.Post(b)
		require.Equal(t, verbs.StatusSuccess, r.a.Wait(t).Status)
		_, err = w.Wait(ctx(t))
		require.NoError(t, err)
		require.Equal(t, r.a.Buf[:256], b)
		require.Equal(t, 1, r.a.QP.PlaceMailbox(0xC, pieces(src, 1)), "nothing to overtake now")
		_, err = other.Wait(ctx(t))
		require.NoError(t, err)
		require.Equal(t, src[:128], ob[:128])
	})

	t.Run("a mailbox the target does not share", func(t *testing.T) {
		r := newSharedRig(t)
		require.Zero(t, r.a.QP.PlaceMailbox(0xEE, pieces(src, 2)))
	})

	t.Run("stops at an empty piece", func(t *testing.T) {
		r := newSharedRig(t)
		w, _ := r.tgt.Init(0xC, mailbox.Config{Threshold: 3 * 128})
		w.Post(r.buf(t, 3*256))
		ps := pieces(src, 3)
		ps[1].Src = [][]byte{nil}
		require.Equal(t, 1, r.a.QP.PlaceMailbox(0xC, ps))
	})

	t.Run("a port that cannot reach the target's memory", func(t *testing.T) {
		r := newRig(t, verbstest.Loop(), verbs.ConnectConfig{}, nil)
		w, _ := r.tgt.Init(0xD, mailbox.Config{Threshold: 128})
		w.Post(make([]byte, 256))
		require.False(t, r.a.QP.CanPlace())
		require.Zero(t, r.a.QP.PlaceMailbox(0xD, pieces(src, 1)))
	})
}

// A wait on a shared window gives the core away every round, where ranks
// share cores, only while its writes are all placed by their origins:
// once one arrives as a packet, which this process's goroutines must
// handle, the next wait spins as any other.
func TestSharedWindowWaitsForOthersOnly(t *testing.T) {
	r := newSharedRig(t)
	w, err := r.tgt.Init(0xB, mailbox.Config{Threshold: 1024})
	require.NoError(t, err)
	require.False(t, w.OthersOnly(false), "every rank has a core: spin as always")
	require.True(t, w.OthersOnly(true), "nothing has come as a packet")

	w.Post(r.buf(t, 1024))
	direct, rx := r.direct(func() { require.NoError(t, r.put(t, 0xB, 0, 0, 1024)) })
	require.Equal(t, uint64(1), direct)
	require.Zero(t, rx)
	_, err = w.Wait(ctx(t))
	require.NoError(t, err)
	require.True(t, w.OthersOnly(true), "placed by the origin")

	// A buffer outside the device's memory: the put comes as packets.
	w.Post(make([]byte, 1024))
	direct, rx = r.direct(func() { require.NoError(t, r.put(t, 0xB, 0, 0, 1024)) })
	require.Zero(t, direct)
	require.NotZero(t, rx)
	// What the next Wait decides as it begins:
	require.False(t, w.OthersOnly(true), "a packet came since the last wait began")
	require.True(t, w.OthersOnly(true), "none since")
	_, err = w.Wait(ctx(t))
	require.NoError(t, err)

	inproc := newRig(t, verbstest.Loop(), verbs.ConnectConfig{}, nil)
	private, err := inproc.tgt.Init(0xC, mailbox.Config{Threshold: 8})
	require.NoError(t, err)
	require.False(t, private.OthersOnly(true), "a window in process memory")
}
