package multipath_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/mailbox"
	"github.com/rvma/rvma/multipath"
	"github.com/rvma/rvma/verbs"
)

type side struct {
	dev *verbs.Device
	pd  *verbs.PD
	buf []byte
	mr  *verbs.MR
}

func open(t *testing.T, ctx context.Context, uri string, size int) *side {
	d, err := verbs.Open(ctx, uri, nil)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	pd, err := d.AllocPD()
	require.NoError(t, err)
	buf := make([]byte, size)
	mr, err := pd.RegisterMR(buf, verbs.AccessAll)
	require.NoError(t, err)
	return &side{dev: d, pd: pd, buf: buf, mr: mr}
}

// pair connects a over paths to b and returns both ends.
func pair(t *testing.T, ctx context.Context, a, b *side, cfg *multipath.Config) (*multipath.Conn, *multipath.Conn) {
	ln, err := multipath.Listen(ctx, b.pd, "127.0.0.1:0", nil)
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	acc := make(chan *multipath.Conn, 1)
	go func() {
		c, err := ln.Accept(ctx)
		if err == nil {
			acc <- c
		}
		close(acc)
	}()
	ca, err := multipath.Dial(ctx, a.pd, ln.Addr(), cfg)
	require.NoError(t, err)
	cb := <-acc
	require.NotNil(t, cb)
	return ca, cb
}

func loopPair(t *testing.T, gids string, size int, cfg *multipath.Config) (context.Context, *side, *side, *multipath.Conn) {
	ctx, a, b, ca, _ := loopConns(t, gids, size, cfg)
	return ctx, a, b, ca
}

// loopConns is loopPair, also returning the accepting side's Conn.
func loopConns(t *testing.T, gids string, size int, cfg *multipath.Config) (context.Context, *side, *side, *multipath.Conn, *multipath.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	var r [4]byte
	rand.Read(r[:])
	uri := "loop://mp-" + hex.EncodeToString(r[:]) + "?gids=" + gids
	a, b := open(t, ctx, uri, size), open(t, ctx, uri, size)
	ca, cb := pair(t, ctx, a, b, cfg)
	t.Cleanup(func() { ca.Close(); cb.Close() })
	return ctx, a, b, ca, cb
}

func TestWriteReadOverPaths(t *testing.T) {
	for _, bal := range []multipath.Balancer{multipath.Equal{}, multipath.Proportional{}, multipath.Adaptive{}} {
		ctx, a, b, c := loopPair(t, "3", 8<<20, &multipath.Config{Balancer: bal})
		rand.Read(a.buf)
		req, err := c.Write(a.mr, 0, len(a.buf), b.mr.Addr(), b.mr.RKey())
		require.NoError(t, err)
		require.NoError(t, req.Wait(ctx))
		require.True(t, bytes.Equal(a.buf, b.buf), "%T: written bytes differ", bal)
		paths := c.Paths()
		require.Len(t, paths, 3)
		total := uint64(0)
		for i, p := range paths {
			require.True(t, p.Up)
			require.Positive(t, p.Bytes, "%T: path %d carried nothing", bal, i)
			require.Zero(t, p.Outstanding)
			total += p.Bytes
		}
		require.Equal(t, uint64(len(a.buf)), total, "every byte once")

		// Read it back into the other half of a's buffer after clearing.
		clear(a.buf[4<<20:])
		want := bytes.Clone(b.buf[:4<<20])
		req, err = c.Read(a.mr, 4<<20, 4<<20, b.mr.Addr(), b.mr.RKey())
		require.NoError(t, err)
		require.NoError(t, req.Wait(ctx))
		require.Equal(t, want, a.buf[4<<20:])
	}
}

// Small requests go whole on one path.
func TestSmallRequestsOnePath(t *testing.T) {
	ctx, a, b, c := loopPair(t, "2", 1<<20, &multipath.Config{Small: 4096})
	req, err := c.Write(a.mr, 0, 1000, b.mr.Addr(), b.mr.RKey())
	require.NoError(t, err)
	require.NoError(t, req.Wait(ctx))
	used := 0
	for _, p := range c.Paths() {
		if p.Bytes > 0 {
			used++
			require.Equal(t, uint64(1000), p.Bytes)
		}
	}
	require.Equal(t, 1, used)
	req, err = c.Write(a.mr, 0, 0, b.mr.Addr(), b.mr.RKey())
	require.NoError(t, err)
	require.NoError(t, req.Wait(ctx))
}

// A mailbox put split over paths completes the target's epoch exactly
// once, with every byte in place.
func TestPutOverPaths(t *testing.T) {
	ctx, a, b, c := loopPair(t, "4", 4<<20, &multipath.Config{Balancer: multipath.Equal{}, Err: mailbox.CompletionError})
	win, err := mailbox.NewTarget(b.dev, nil).Init(7, mailbox.Config{Threshold: len(a.buf)})
	require.NoError(t, err)
	dst := make([]byte, len(a.buf))
	_, err = win.Post(dst)
	require.NoError(t, err)
	rand.Read(a.buf)
	req, err := c.Put(a.mr, 0, len(a.buf), 7, 0)
	require.NoError(t, err)
	require.NoError(t, req.Wait(ctx))
	rec, err := win.Wait(ctx)
	require.NoError(t, err)
	require.Equal(t, len(a.buf), rec.Bytes)
	require.GreaterOrEqual(t, rec.Ops, 4, "a put per chunk of each path's sub-flow")
	require.True(t, bytes.Equal(a.buf, dst))
	require.Zero(t, win.Pending())

	// A put to a mailbox that does not exist fails with the mailbox error.
	req, err = c.Put(a.mr, 0, 1024, 99, 0)
	require.NoError(t, err)
	require.ErrorIs(t, req.Wait(ctx), mailbox.ErrNoMailbox)
}

func TestRemoteAccessErrorNamesPath(t *testing.T) {
	ctx, a, b, c := loopPair(t, "2", 1<<20, nil)
	req, err := c.Write(a.mr, 0, 4096, b.mr.Addr(), b.mr.RKey()+1)
	require.NoError(t, err)
	err = req.Wait(ctx)
	require.ErrorIs(t, err, verbs.StatusRemoteAccessError)
	require.Contains(t, err.Error(), "multipath: path")
	// A small request goes whole on one path; refused there, it is not
	// re-issued on the other, which stays up.
	up := 0
	for _, p := range c.Paths() {
		if p.Up {
			up++
		}
	}
	require.Equal(t, 1, up, "a refused request was re-issued on another path")
}

// A path that stops carrying packets fails its sub-flow; the sub-flow is
// written again over the other path, the request succeeds with every byte
// in place, and later requests avoid the dead path.
func TestFailover(t *testing.T) {
	ctx, a, b, c := loopPair(t, "2", 4<<20, &multipath.Config{Balancer: multipath.Equal{},
		Connect: verbs.ConnectConfig{Timeout: 100 * time.Millisecond, RetryCount: 2}})
	require.NoError(t, a.dev.SetFaults(1, verbs.Faults{Drop: 1}))
	rand.Read(a.buf)
	req, err := c.Write(a.mr, 0, len(a.buf), b.mr.Addr(), b.mr.RKey())
	require.NoError(t, err)
	require.NoError(t, req.Wait(ctx))
	require.True(t, bytes.Equal(a.buf, b.buf))
	p := c.Paths()
	require.False(t, p[1].Up)
	require.True(t, p[0].Up)
	require.Equal(t, uint64(len(a.buf)), p[0].Bytes)

	rand.Read(a.buf)
	req, err = c.Write(a.mr, 0, len(a.buf), b.mr.Addr(), b.mr.RKey())
	require.NoError(t, err)
	require.NoError(t, req.Wait(ctx))
	require.True(t, bytes.Equal(a.buf, b.buf))

	// With the last path gone too the request fails, naming the path, and
	// later requests have no path.
	require.NoError(t, a.dev.SetFaults(0, verbs.Faults{Drop: 1}))
	req, err = c.Write(a.mr, 0, len(a.buf), b.mr.Addr(), b.mr.RKey())
	require.NoError(t, err)
	require.Error(t, req.Wait(ctx))
	_, err = c.Write(a.mr, 0, len(a.buf), b.mr.Addr(), b.mr.RKey())
	require.ErrorIs(t, err, multipath.ErrPaths)
}

// A mailbox put whose path fails is not sent again (it could be counted
// twice): the request fails, and the target's epoch stays incomplete.
func TestPutNotReissued(t *testing.T) {
	ctx, a, b, c := loopPair(t, "2", 1<<20, &multipath.Config{Balancer: multipath.Equal{},
		Connect: verbs.ConnectConfig{Timeout: 100 * time.Millisecond, RetryCount: 2}})
	win, err := mailbox.NewTarget(b.dev, nil).Init(8, mailbox.Config{Threshold: len(a.buf)})
	require.NoError(t, err)
	_, err = win.Post(make([]byte, len(a.buf)))
	require.NoError(t, err)
	require.NoError(t, a.dev.SetFaults(1, verbs.Faults{Drop: 1}))
	req, err := c.Put(a.mr, 0, len(a.buf), 8, 0)
	require.NoError(t, err)
	err = req.Wait(ctx)
	require.ErrorIs(t, err, verbs.StatusRetryExceeded)
	require.Contains(t, err.Error(), "path 1")
	require.Zero(t, win.Pending(), "half a put completed an epoch")
}

func TestProbe(t *testing.T) {
	ctx, a, _, c := loopPair(t, "3", 1<<20, nil)
	require.NoError(t, a.dev.SetFaults(2, verbs.Faults{Drop: 1}))
	short, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, c.Probe(short))
	p := c.Paths()
	require.Positive(t, p[0].Capacity)
	require.Positive(t, p[1].Capacity)
	require.False(t, p[2].Up, "the probe of a dead path marks it down")
}

// Two-sided messages over three paths: the sender writes into the buffer
// the receiver posted, over all paths, then one SEND with immediate; the
// receiver sees one completion per message, in order, data in place.
func TestSendRecvHybrid(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var r [4]byte
	rand.Read(r[:])
	uri := "loop://mp-" + hex.EncodeToString(r[:]) + "?gids=3"
	a, b := open(t, ctx, uri, 4<<20), open(t, ctx, uri, 8<<20)
	ca, cb := pair(t, ctx, a, b, &multipath.Config{Balancer: multipath.Equal{}})
	defer ca.Close()
	defer cb.Close()

	require.NoError(t, cb.PostRecv(ctx, b.mr, 0, 4<<20, 7))
	require.NoError(t, cb.PostRecv(ctx, b.mr, 4<<20, 1<<20, 8))
	rand.Read(a.buf)
	require.NoError(t, ca.Send(ctx, a.mr, 0, 3<<20))
	require.NoError(t, ca.Send(ctx, a.mr, 1000, 1<<20))
	m, err := cb.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, multipath.Message{ID: 7, Len: 3 << 20}, m)
	require.True(t, bytes.Equal(a.buf[:3<<20], b.buf[:3<<20]))
	m, err = cb.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, multipath.Message{ID: 8, Len: 1 << 20}, m)
	require.True(t, bytes.Equal(a.buf[1000:1000+1<<20], b.buf[4<<20:5<<20]))
	used := 0
	for _, p := range ca.Paths() {
		if p.Bytes > 0 {
			used++
		}
	}
	require.Equal(t, 3, used, "the message travelled over every path")

	// Too long for the next posted buffer: refused before anything moves.
	require.NoError(t, cb.PostRecv(ctx, b.mr, 0, 100, 9))
	require.ErrorIs(t, ca.Send(ctx, a.mr, 0, 101), multipath.ErrTooLong)
	// The refused message left the buffer for the next one.
	require.NoError(t, ca.Send(ctx, a.mr, 0, 100))
	m, err = cb.Recv(ctx)
	require.NoError(t, err)
	require.Equal(t, multipath.Message{ID: 9, Len: 100}, m)
	// No buffer posted: Send waits, bounded by its context.
	short, cancel2 := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel2()
	require.ErrorIs(t, ca.Send(short, a.mr, 0, 10), context.DeadlineExceeded)
}

// On a lossy path the chunk size backs off (the growth rule itself is
// TestNextChunk's; a clean path's growth is not asserted here, because a
// slow machine's retransmission timeouts look like losses).
func TestChunkSizes(t *testing.T) {
	ctx, a, b, c := loopPair(t, "2", 4<<20, &multipath.Config{Balancer: multipath.Equal{},
		MinChunk: 64 << 10, MaxChunk: 1 << 20, Connect: verbs.ConnectConfig{MTU: 4096, Timeout: 5 * time.Millisecond}})
	require.NoError(t, a.dev.SetFaults(1, verbs.Faults{Drop: 0.02, Seed: 7}))
	for range 6 {
		rand.Read(a.buf)
		req, err := c.Write(a.mr, 0, len(a.buf), b.mr.Addr(), b.mr.RKey())
		require.NoError(t, err)
		require.NoError(t, req.Wait(ctx))
		require.True(t, bytes.Equal(a.buf, b.buf))
	}
	p := c.Paths()
	require.LessOrEqual(t, p[1].Chunk, 256<<10, "the lossy path backed off")
	t.Logf("chunks: clean %d, lossy %d", p[0].Chunk, p[1].Chunk)
}

// A failed path is re-dialled and probed in the background and used again
// once it answers.
func TestRevive(t *testing.T) {
	ctx, a, b, c := loopPair(t, "2", 2<<20, &multipath.Config{Balancer: multipath.Equal{}, Revive: 100 * time.Millisecond,
		Connect: verbs.ConnectConfig{Timeout: 100 * time.Millisecond, RetryCount: 2}})
	require.NoError(t, a.dev.SetFaults(1, verbs.Faults{Drop: 1}))
	req, err := c.Write(a.mr, 0, len(a.buf), b.mr.Addr(), b.mr.RKey())
	require.NoError(t, err)
	require.NoError(t, req.Wait(ctx))
	require.False(t, c.Paths()[1].Up)
	require.NoError(t, a.dev.SetFaults(1, verbs.Faults{}))
	require.Eventually(t, func() bool { return c.Paths()[1].Up }, 20*time.Second, 5*time.Millisecond, "path 1 never came back")
	before := c.Paths()[1].Bytes
	rand.Read(a.buf)
	req, err = c.Write(a.mr, 0, len(a.buf), b.mr.Addr(), b.mr.RKey())
	require.NoError(t, err)
	require.NoError(t, req.Wait(ctx))
	require.True(t, bytes.Equal(a.buf, b.buf))
	require.Greater(t, c.Paths()[1].Bytes, before, "the revived path carries data again")
}

// Atomics go whole on one path, even when everything else is split.
func TestAtomics(t *testing.T) {
	ctx, a, b, c := loopPair(t, "2", 4096, &multipath.Config{Small: 1})
	binary.LittleEndian.PutUint64(b.buf, 40)
	req, err := c.FetchAdd(a.mr, 0, b.mr.Addr(), b.mr.RKey(), 2)
	require.NoError(t, err)
	require.NoError(t, req.Wait(ctx))
	require.Equal(t, uint64(40), binary.LittleEndian.Uint64(a.buf))
	require.Equal(t, uint64(42), binary.LittleEndian.Uint64(b.buf))
	req, err = c.CompareSwap(a.mr, 8, b.mr.Addr(), b.mr.RKey(), 42, 7)
	require.NoError(t, err)
	require.NoError(t, req.Wait(ctx))
	require.Equal(t, uint64(42), binary.LittleEndian.Uint64(a.buf[8:]))
	require.Equal(t, uint64(7), binary.LittleEndian.Uint64(b.buf))
}

// Private data crosses once, both ways, up to MaxPrivateData; more is
// refused before anything is sent.
func TestPrivateData(t *testing.T) {
	ctx := context.Background()
	devA, err := verbs.Open(ctx, "loop://mp-private?gids=2", nil)
	require.NoError(t, err)
	defer devA.Close()
	devB, err := verbs.Open(ctx, "loop://mp-private?gids=2", nil)
	require.NoError(t, err)
	defer devB.Close()
	pdA, _ := devA.AllocPD()
	pdB, _ := devB.AllocPD()
	big := bytes.Repeat([]byte{0xAB}, multipath.MaxPrivateData+1)
	_, err = multipath.Listen(ctx, pdB, "127.0.0.1:0", &multipath.Config{PrivateData: big})
	require.ErrorContains(t, err, "private data")
	fromB := bytes.Repeat([]byte("B"), multipath.MaxPrivateData)
	ln, err := multipath.Listen(ctx, pdB, "127.0.0.1:0", &multipath.Config{PrivateData: fromB})
	require.NoError(t, err)
	defer ln.Close()
	_, err = multipath.Dial(ctx, pdA, ln.Addr(), &multipath.Config{PrivateData: big})
	require.ErrorContains(t, err, "private data")
	accepted := make(chan *multipath.Conn, 1)
	go func() {
		c, _ := ln.Accept(ctx)
		accepted <- c
	}()
	fromA := []byte("from A")
	conn, err := multipath.Dial(ctx, pdA, ln.Addr(), &multipath.Config{PrivateData: fromA})
	require.NoError(t, err)
	defer conn.Close()
	peer := <-accepted
	require.NotNil(t, peer)
	defer peer.Close()
	require.Equal(t, fromB, conn.PeerData())
	require.Equal(t, fromA, peer.PeerData())
	conn.PeerData()[0] = 'X' // the caller's copy
	require.Equal(t, fromB, conn.PeerData())
}
