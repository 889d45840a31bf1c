package mailbox_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/mailbox"
	"github.com/rvma/rvma/reliability"
	"github.com/rvma/rvma/verbs"
)

var relSeq atomic.Uint64

type relEnd struct {
	dev   *verbs.Device
	conns mailbox.Reliable
}

// relPair connects two pairs of reliability.Conns (header and data) over
// a loop fabric with faults on both directions; the second end runs a
// mailbox target.
func relPair(t *testing.T, faults verbs.Faults) (a, b *relEnd, tgt *mailbox.Target) {
	name := fmt.Sprintf("loop://mbrel-%d?mtu=4096", relSeq.Add(1))
	cfg := reliability.Config{RTT: 2 * time.Millisecond, MinRTT: time.Millisecond}
	open := func() (*verbs.Device, *verbs.PD) {
		dev, err := verbs.Open(context.Background(), name, nil)
		require.NoError(t, err)
		pd, err := dev.AllocPD()
		require.NoError(t, err)
		return dev, pd
	}
	da, pa := open()
	db, pb := open()
	a, b = &relEnd{dev: da}, &relEnd{dev: db}
	conn := func() (*reliability.Conn, *reliability.Conn) {
		mk := func(dev *verbs.Device, pd *verbs.PD) (*verbs.QP, *verbs.CQ) {
			cq, err := dev.CreateCQ(verbs.CQConfig{Capacity: 16384})
			require.NoError(t, err)
			qp, err := pd.CreateQP(reliability.QPConfig(cq, cfg))
			require.NoError(t, err)
			return qp, cq
		}
		qa, ca := mk(da, pa)
		qb, cb := mk(db, pb)
		require.NoError(t, qa.Connect(qb.Endpoint(), nil))
		require.NoError(t, qb.Connect(qa.Endpoint(), nil))
		x, err := reliability.New(pa, qa, ca, cfg)
		require.NoError(t, err)
		y, err := reliability.New(pb, qb, cb, cfg)
		require.NoError(t, err)
		return x, y
	}
	a.conns.Header, b.conns.Header = conn()
	a.conns.Data, b.conns.Data = conn()
	if faults.Active() {
		fb := faults
		fb.Seed += 1000
		require.NoError(t, da.SetFaults(-1, faults))
		require.NoError(t, db.SetFaults(-1, fb))
	}
	tgt = mailbox.NewTarget(db, nil)
	t.Cleanup(func() {
		for _, e := range []*relEnd{a, b} {
			e.conns.Header.Close()
			e.conns.Data.Close()
		}
		da.Close()
		db.Close()
	})
	return a, b, tgt
}

// serve runs ServeReliable until the test ends, collecting refusals.
func serve(t *testing.T, tgt *mailbox.Target, conns mailbox.Reliable) *[]error {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var refused []error
	done := make(chan error, 1)
	go func() {
		done <- tgt.ServeReliable(ctx, conns, &mailbox.ServeConfig{NotReady: 50 * time.Millisecond,
			OnError: func(_, _ uint64, _ int, err error) {
				mu.Lock()
				refused = append(refused, err)
				mu.Unlock()
			}})
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return &refused
}

// relWindow connects a reliable pair with faults, creates a window at
// mbox on the target completing per size bytes with epochs buffers
// posted, serves it, and returns the window, its buffers, an initiator
// and the refusals the target reports.
func relWindow(t *testing.T, faults verbs.Faults, mbox uint64, size, epochs int) (*mailbox.Window, [][]byte, *mailbox.ReliableInitiator, *[]error) {
	a, b, tgt := relPair(t, faults)
	w, err := tgt.Init(mbox, mailbox.Config{Threshold: size})
	require.NoError(t, err)
	bufs := make([][]byte, epochs)
	for i := range bufs {
		bufs[i] = make([]byte, size)
		_, err := w.Post(bufs[i])
		require.NoError(t, err)
	}
	return w, bufs, mailbox.NewReliableInitiator(a.conns), serve(t, tgt, b.conns)
}

// Puts over a lossy, duplicating, reordering link land in the mailbox
// buffer intact and count exactly once: every epoch completes with its own
// bytes, none early, none twice.
func TestReliablePuts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		faults verbs.Faults
		scheme reliability.Scheme
	}{
		{"clean", verbs.Faults{}, reliability.Auto},
		{"sr-loss-dup", verbs.Faults{Drop: 0.05, Duplicate: 0.05, Reorder: 0.05, Seed: 3}, reliability.SR},
		{"ec-loss-dup", verbs.Faults{Drop: 0.05, Duplicate: 0.05, Reorder: 0.05, Seed: 4}, reliability.EC},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const size, epochs = 512 << 10, 3
			w, bufs, in, refused := relWindow(t, tc.faults, 7, size, epochs)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			rng := rand.New(rand.NewPCG(9, 9))
			want := make([][]byte, epochs)
			for e := range epochs {
				want[e] = make([]byte, size)
				for i := range want[e] {
					want[e][i] = byte(rng.Uint32())
				}
				// Three puts per epoch, out of offset order, odd sizes.
				cuts := []int{0, 100_000, 300_001, size}
				for _, p := range []int{2, 0, 1} {
					res, err := in.Put(ctx, 7, uint64(cuts[p]), want[e][cuts[p]:cuts[p+1]], &reliability.SendOptions{Scheme: tc.scheme})
					require.NoError(t, err)
					require.Equal(t, cuts[p+1]-cuts[p], res.Bytes)
				}
				rec, err := w.Wait(ctx)
				require.NoError(t, err)
				require.Equal(t, uint64(e), rec.Epoch)
				require.Equal(t, size, rec.Bytes, "bytes counted once")
				require.Equal(t, 3, rec.Ops)
				require.True(t, bytes.Equal(want[e], bufs[e]), "epoch %d: buffer differs", e)
				_, more := w.Poll()
				require.False(t, more, "a further epoch completed: something counted twice")
			}
			require.Empty(t, *refused)
		})
	}
}

// Puts of several epochs in flight at once over a lossy link: each counts
// in the epoch its start order gives it, though a later one may finish
// first.
func TestReliablePutsPipelined(t *testing.T) {
	const size, epochs, per = 64 << 10, 8, 4
	w, bufs, in, refused := relWindow(t, verbs.Faults{Drop: 0.05, Reorder: 0.1, Duplicate: 0.02, Seed: 11}, 5, size, epochs)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var puts []*mailbox.ReliablePut
	data := make([][]byte, epochs)
	for e := range epochs {
		data[e] = bytes.Repeat([]byte{byte(e + 1)}, size)
		for q := range per {
			// Sizes differ so that puts finish out of order.
			p, err := in.Start(ctx, 5, uint64(q*size/per), data[e][q*size/per:(q+1)*size/per], nil)
			require.NoError(t, err)
			puts = append(puts, p)
		}
	}
	for _, p := range puts {
		_, err := p.Wait(ctx)
		require.NoError(t, err)
	}
	for e := range epochs {
		rec, err := w.Wait(ctx)
		require.NoError(t, err)
		require.Equal(t, size, rec.Bytes)
		require.Equal(t, per, rec.Ops)
		require.Equal(t, data[e], bufs[e], "epoch %d holds another epoch's bytes", e)
	}
	require.Empty(t, *refused)
}

// Refused puts (no window, out of range, nothing posted) fail at the
// initiator with ErrRefused, and the connection goes on working.
func TestReliablePutRefused(t *testing.T) {
	a, b, tgt := relPair(t, verbs.Faults{})
	w, err := tgt.Init(7, mailbox.Config{Threshold: 8})
	require.NoError(t, err)
	refused := serve(t, tgt, b.conns)
	in := mailbox.NewReliableInitiator(a.conns)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	data := []byte("12345678")
	_, err = in.Put(ctx, 99, 0, data, nil)
	require.ErrorIs(t, err, mailbox.ErrRefused, "no window")
	_, err = in.Put(ctx, 7, 0, data, nil)
	require.ErrorIs(t, err, mailbox.ErrRefused, "nothing posted")
	buf := make([]byte, 8)
	_, err = w.Post(buf)
	require.NoError(t, err)
	_, err = in.Put(ctx, 7, 4, data, nil)
	require.ErrorIs(t, err, mailbox.ErrRefused, "out of range")
	_, err = in.Put(ctx, 7, 0, data, nil)
	require.NoError(t, err)
	rec, err := w.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, 8, rec.Bytes)
	require.Equal(t, data, buf)
	require.Len(t, *refused, 3)
	require.ErrorIs(t, (*refused)[0], mailbox.ErrNoMailbox)
	require.ErrorIs(t, (*refused)[1], mailbox.ErrNoBuffer)
	require.ErrorIs(t, (*refused)[2], mailbox.ErrOutOfRange)
}

// Reservations: reserved bytes count toward fullness at once (a later
// reservation goes to the next buffer), the epoch waits for open ones,
// Commit counts once, Abort counts nothing, and a reservation of an
// abandoned epoch fails.
func TestReservation(t *testing.T) {
	_, _, tgt := relPair(t, verbs.Faults{})
	w, err := tgt.Init(1, mailbox.Config{Threshold: 16})
	require.NoError(t, err)
	_, err = w.Reserve(0, 8)
	require.ErrorIs(t, err, mailbox.ErrNoBuffer)
	buf := make([]byte, 16)
	_, err = w.Post(buf)
	require.NoError(t, err)
	_, err = w.Reserve(12, 8)
	require.ErrorIs(t, err, mailbox.ErrOutOfRange)
	r1, err := w.Reserve(0, 8)
	require.NoError(t, err)
	r2, err := w.Reserve(8, 8)
	require.NoError(t, err)
	_, err = w.Reserve(0, 4)
	require.ErrorIs(t, err, mailbox.ErrNoBuffer, "the reserved bytes fill the buffer")
	next := make([]byte, 16)
	_, err = w.Post(next)
	require.NoError(t, err)
	r3, err := w.Reserve(0, 16) // the next epoch's
	require.NoError(t, err)
	copy(r3.Data, "0123456789abcdef")
	require.NoError(t, r3.Commit(16))
	_, done := w.Poll()
	require.False(t, done, "the next epoch completed before this one")
	copy(r1.Data, "abcdefgh")
	require.NoError(t, r1.Commit(8))
	require.NoError(t, r1.Commit(8), "a second commit is a no-op")
	_, done = w.Poll()
	require.False(t, done, "the epoch completed with a reservation open")
	r2.Abort()
	_, done = w.Poll()
	require.False(t, done, "an aborted reservation counted")
	r4, err := w.Reserve(8, 8)
	require.NoError(t, err, "the aborted bytes are free again")
	copy(r4.Data, "ijklmnop")
	require.NoError(t, r4.Commit(8))
	rec, done := w.Poll()
	require.True(t, done)
	require.Equal(t, 16, rec.Bytes)
	require.Equal(t, 2, rec.Ops)
	require.Equal(t, "abcdefghijklmnop", string(buf))
	rec, done = w.Poll()
	require.True(t, done)
	require.Equal(t, "0123456789abcdef", string(rec.Data))

	_, err = w.Post(make([]byte, 16))
	require.NoError(t, err)
	r5, err := w.Reserve(0, 4)
	require.NoError(t, err)
	require.NoError(t, w.Abandon())
	require.ErrorIs(t, r5.Commit(4), mailbox.ErrEpochCrossed)

	// A reservation outlives its epoch, ended by hand, and the next post
	// reuses the buffer's record: the reservation counts nothing and the
	// new epoch stays open.
	r6, err := w.Reserve(0, 4)
	require.NoError(t, err)
	_, err = w.IncEpoch()
	require.NoError(t, err)
	_, done = w.Poll()
	require.True(t, done)
	fresh := make([]byte, 16)
	_, err = w.Post(fresh)
	require.NoError(t, err)
	require.ErrorIs(t, r6.Commit(4), mailbox.ErrEpochCrossed)
	_, done = w.Poll()
	require.False(t, done, "a stale reservation counted in the next epoch")
	r7, err := w.Reserve(0, 16)
	require.NoError(t, err, "the stale reservation held no bytes of the next epoch")
	copy(r7.Data, "qrstuvwxyzABCDEF")
	require.NoError(t, r7.Commit(16))
	rec, done = w.Poll()
	require.True(t, done)
	require.Equal(t, 16, rec.Bytes)
	require.Equal(t, 1, rec.Ops)
	require.Equal(t, "qrstuvwxyzABCDEF", string(fresh))
	require.NoError(t, w.Close())
	_, err = w.Reserve(0, 4)
	require.ErrorIs(t, err, mailbox.ErrWindowClosed)
}
