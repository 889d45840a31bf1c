package rma

import (
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
)

// TestManyActiveMessagesBothWays: two ranks send each other more active
// messages in one epoch than a send queue holds (accumulates on a window
// of the caller's memory travel as messages the target's poller answers).
// A poller that waited for room to send its answers would wait for the
// other rank's poller, itself waiting to answer: both epochs must end,
// with every accumulate applied once.
func TestManyActiveMessagesBothWays(t *testing.T) {
	for _, prov := range []string{"loop", "shm", "udp"} {
		t.Run(prov, func(t *testing.T) {
			comms := newWorld(t, 2, &Config{Provider: prov})
			const n, rounds = 6000, 2
			mems := make([][]byte, 2)
			each(t, comms, func(ctx context.Context, c *Comm) error {
				mems[c.Rank()] = make([]byte, 4*n)
				w, err := c.Create(ctx, mems[c.Rank()], nil)
				if err != nil {
					return err
				}
				one := binary.LittleEndian.AppendUint32(nil, 1)
				for range rounds {
					if err := w.Fence(ctx, 0); err != nil {
						return err
					}
					for i := range n {
						if err := w.Accumulate(ctx, one, Int32, Sum, 1-c.Rank(), 4*i); err != nil {
							return fmt.Errorf("accumulate %d: %w", i, err)
						}
					}
					if err := w.Fence(ctx, 0); err != nil {
						return err
					}
				}
				return w.Free(ctx)
			})
			// Small answers take small buffers, registered by the slab: a
			// staging chunk each held hundreds of megabytes for 16-byte
			// answers and registered a region per message.
			for r, c := range comms {
				s := &c.msg.send
				s.mu.Lock()
				held := s.held
				s.mu.Unlock()
				require.LessOrEqual(t, held, 4<<20, "rank %d: send buffers", r)
			}
			for r, mem := range mems {
				for i := range n {
					require.Equal(t, uint32(rounds), binary.LittleEndian.Uint32(mem[4*i:]), "rank %d element %d", r, i)
				}
			}
		})
	}
}

// A message given in pieces is copied into its fragments as their join
// would be, from any offset, whatever the pieces' sizes (empty ones too).
func TestGatherCopyAt(t *testing.T) {
	for _, sizes := range [][]int{{}, {0}, {5}, {3, 0, 7}, {1, 1, 1, 1}, {0, 0, 9, 0}, {16, 200, 3}} {
		var g gather
		joined := []byte{}
		for i, n := range sizes {
			p := make([]byte, n)
			for j := range p {
				p[j] = byte(31*i + j + 1)
			}
			g = append(g, p)
			joined = append(joined, p...)
		}
		require.Equal(t, len(joined), g.len(), "%v", sizes)
		for off := 0; off <= len(joined); off++ {
			for n := 0; off+n <= len(joined); n++ {
				dst := make([]byte, n)
				g.copyAt(dst, off)
				require.Equal(t, joined[off:off+n], dst, "%v at %d, %d bytes", sizes, off, n)
			}
		}
	}
}

// TestActiveMessagesBounded: an epoch of more accumulates than amMax to
// one target (on a window of the caller's memory: active messages) never
// has more than amMax of them waiting for their replies, whose records
// (and the answers queued at the target) would otherwise grow with the
// epoch: a million took half a gigabyte. Every accumulate is applied.
func TestActiveMessagesBounded(t *testing.T) {
	for _, prov := range []string{"loop", "udp"} {
		t.Run(prov, func(t *testing.T) {
			comms := newWorld(t, 2, &Config{Provider: prov})
			const n = 5 * amMax
			mems := make([][]byte, 2)
			most := 0
			each(t, comms, func(ctx context.Context, c *Comm) error {
				mems[c.Rank()] = make([]byte, 4*1024)
				w, err := c.Create(ctx, mems[c.Rank()], nil)
				if err != nil {
					return err
				}
				if err := w.Fence(ctx, 0); err != nil {
					return err
				}
				if c.Rank() == 0 {
					one := binary.LittleEndian.AppendUint32(nil, 1)
					for i := range n {
						if err := w.Accumulate(ctx, one, Int32, Sum, 1, 4*(i%1024)); err != nil {
							return fmt.Errorf("accumulate %d: %w", i, err)
						}
						c.eng.Locked(func() { most = max(most, len(c.msg.am)) })
					}
				}
				if err := w.Fence(ctx, 0); err != nil {
					return err
				}
				return w.Free(ctx)
			})
			t.Logf("at most %d active messages waiting", most)
			require.LessOrEqual(t, most, amMax)
			for i := range 1024 {
				require.Equal(t, uint32(n/1024), binary.LittleEndian.Uint32(mems[1][4*i:]), "element %d", i)
			}
		})
	}
}

// TestActiveMessagesToDeadPeer: an origin past amMax waits for replies
// that a dead rank never sends; the connection's failure ends the wait,
// and the accumulates and the flush fail with ErrPeer in bounded time.
func TestActiveMessagesToDeadPeer(t *testing.T) {
	comms := newWorld(t, 2, &Config{Provider: "loop", Connect: verbs.ConnectConfig{Timeout: time.Millisecond, RetryCount: 2}})
	wins := make([]*Win, 2)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		var err error
		if wins[c.Rank()], err = c.Create(ctx, make([]byte, 4096), nil); err != nil {
			return err
		}
		return wins[c.Rank()].LockAll(ctx)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	one := binary.LittleEndian.AppendUint32(nil, 1)
	require.NoError(t, wins[0].Accumulate(ctx, one, Int32, Sum, 1, 0)) // connected
	require.NoError(t, wins[0].Flush(ctx, 1))
	comms[1].teardown() // rank 1 dies
	t0 := time.Now()
	var last error
	sent := 0
	for i := range 2 * amMax {
		if last = wins[0].Accumulate(ctx, one, Int32, Sum, 1, 4*(i%1024)); last != nil {
			break
		}
		sent++
	}
	if last == nil {
		last = wins[0].Flush(ctx, 1)
	}
	require.ErrorIs(t, last, ErrPeer)
	require.NoError(t, ctx.Err(), "waited out the context")
	t.Logf("failed %v after the peer died, after %d accumulates", time.Since(t0), sent)
}

// TestBacklogBehindUnsignalled: a message that finds the send queue full
// of unsignalled requests (a notified window's credit writes are) waits in
// the backlog; their acknowledgements free the room but complete nothing,
// so no poll posts it. It must still leave without waiting for the probe
// tick (stretched to an hour here): a credit answer waited a second so.
func TestBacklogBehindUnsignalled(t *testing.T) {
	for _, prov := range []string{"loop", "udp"} {
		t.Run(prov, func(t *testing.T) {
			comms := newWorld(t, 2, &Config{Provider: prov, probeEvery: time.Hour})
			got := make(chan struct{})
			each(t, comms, func(ctx context.Context, c *Comm) error {
				w, err := c.Allocate(ctx, 4096, nil)
				if err != nil {
					return err
				}
				if c.Rank() == 1 {
					msg, err := c.Recv(ctx, 0, 7)
					if err != nil {
						return err
					}
					if string(msg) != "hello" {
						return fmt.Errorf("got %q", msg)
					}
					close(got)
				} else {
					qp, err := c.conn(ctx, 1)
					if err != nil {
						return err
					}
					rw := &w.remote[1]
					wrs := make([]verbs.SendWR, 1024)
					for i := range wrs {
						wrs[i] = verbs.SendWR{Opcode: verbs.OpWrite, Flags: verbs.FlagInline, Inline: make([]byte, 8),
							RemoteAddr: rw.addr, RKey: rw.rkey}
					}
					for full := false; !full; {
						_, err := qp.PostSend(wrs)
						if full = isQueueFull(err); err != nil && !full {
							return err
						}
					}
					if _, err := c.sendMsgNoWait(1, kindMsg, 7, []byte("hello"), nil); err != nil {
						return err
					}
					// Nothing else here that would complete anything (and so
					// flush the backlog) before the message arrived.
					select {
					case <-got:
					case <-ctx.Done():
						return fmt.Errorf("the message did not leave the backlog: %w", ctx.Err())
					}
				}
				return w.Free(ctx)
			})
		})
	}
}
