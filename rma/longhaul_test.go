package rma

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/mailbox"
	"github.com/rvma/rvma/reliability"
	"github.com/rvma/rvma/verbs"
)

// Notified puts toward long-haul peers travel over the reliability layer
// through a lossy, duplicating, reordering link: every epoch completes
// with exactly its own bytes, counted once, though puts of later epochs
// are in flight before earlier ones complete.
func TestLongHaulNotified(t *testing.T) {
	for _, scheme := range []reliability.Scheme{reliability.SR, reliability.EC} {
		t.Run(scheme.String(), func(t *testing.T) {
			comms := newWorld(t, 3, &Config{LongHaul: &LongHaulConfig{
				Peers:       func(r int) bool { return r != 2 }, // rank 2 is near: RC
				Reliability: reliability.Config{Scheme: scheme, RTT: 2 * time.Millisecond, MinRTT: time.Millisecond}}})
			for i, c := range comms {
				require.NoError(t, c.Device().SetFaults(-1, verbs.Faults{Drop: 0.03, Duplicate: 0.03, Reorder: 0.05, Seed: uint64(i + 1)}))
			}
			const size, epochs = 96 << 10, 4
			each(t, comms, func(ctx context.Context, c *Comm) error {
				w, err := c.Allocate(ctx, epochs*size, &WinConfig{Notify: &NotifyConfig{
					ExpectFrom: map[int]int{(c.Rank() + 2) % 3: size}, Depth: epochs}})
				if err != nil {
					return err
				}
				next, prev := (c.Rank()+1)%3, (c.Rank()+2)%3
				var reqs []*Request
				for e := range epochs {
					data := bytes.Repeat([]byte{byte(16*c.Rank() + e + 1)}, size)
					// A strided half (every other 1 KiB of the first
					// half, then the gaps) and a contiguous half.
					r1, err := w.RputLayout(ctx, data[:size/4], Layout{}, next, e*size, Layout{Count: size / 4096, Block: 1024, Stride: 2048})
					if err != nil {
						return err
					}
					r2, err := w.RputLayout(ctx, data[size/4:size/2], Layout{}, next, e*size+1024, Layout{Count: size / 4096, Block: 1024, Stride: 2048})
					if err != nil {
						return err
					}
					r3, err := w.Rput(ctx, data[size/2:], next, e*size+size/2)
					if err != nil {
						return err
					}
					reqs = append(reqs, r1, r2, r3)
				}
				for e := range epochs {
					if _, err := w.WaitEpoch(ctx); err != nil {
						return fmt.Errorf("epoch %d: %w", e, err)
					}
					want := bytes.Repeat([]byte{byte(16*prev + e + 1)}, size)
					if !bytes.Equal(w.Bytes()[e*size:(e+1)*size], want) {
						return fmt.Errorf("rank %d: epoch %d completed without all its bytes", c.Rank(), e)
					}
				}
				if _, done, err := w.TestEpoch(); err != nil || done {
					return fmt.Errorf("a further epoch completed (%v, %v): bytes counted twice", done, err)
				}
				if err := WaitAll(ctx, reqs...); err != nil {
					return err
				}
				if lh := c.LongHaul(next); (lh != nil) != (next != 2) {
					return fmt.Errorf("rank %d: long-haul connection to %d: %v", c.Rank(), next, lh != nil)
				}
				if err := c.Barrier(ctx); err != nil {
					return err
				}
				return w.Free(ctx)
			})
		})
	}
}

// A put into a per-origin window for an epoch the target has not posted
// waits at the origin, as over RC, and goes once the target consumes an
// epoch: it is neither refused nor counted into the wrong epoch.
func TestLongHaulWaitsForBuffer(t *testing.T) {
	comms := newWorld(t, 2, &Config{LongHaul: &LongHaulConfig{Reliability: reliability.Config{RTT: 2 * time.Millisecond}}})
	each(t, comms, func(ctx context.Context, c *Comm) error {
		w, err := c.Allocate(ctx, 4096, &WinConfig{Notify: &NotifyConfig{ExpectFrom: map[int]int{0: 4096}, Count: mailbox.CountBytes}})
		if err != nil {
			return err
		}
		if c.Rank() == 0 {
			var third *Request
			for e := range 3 {
				r, err := w.Rput(ctx, bytes.Repeat([]byte{byte(e + 1)}, 4096), 1, 0)
				if err != nil {
					return err
				}
				if e < 2 {
					if err := r.Wait(ctx); err != nil {
						return fmt.Errorf("epoch %d: %w", e, err)
					}
				}
				third = r
			}
			time.Sleep(50 * time.Millisecond)
			if done, err := third.Test(); done {
				return fmt.Errorf("the put for an epoch not posted completed (%v) before the target consumed one", err)
			}
			if err := c.Send(ctx, 1, 1, nil); err != nil { // the put waiting does not hold a message back
				return err
			}
			if err := third.Wait(ctx); err != nil {
				return err
			}
		} else {
			if _, err := c.Recv(ctx, 0, 1); err != nil {
				return err
			}
			for e := range 3 {
				got, err := w.WaitEpoch(ctx)
				if err != nil {
					return err
				}
				if got != uint64(e+1) {
					return fmt.Errorf("epoch %d completed as %d", e+1, got)
				}
			}
			// Every epoch lands in the same memory: the last one's bytes.
			if got := w.Bytes(); !bytes.Equal(got, bytes.Repeat([]byte{3}, 4096)) {
				return fmt.Errorf("the window holds %d.., want 3", got[0])
			}
		}
		return w.Free(ctx)
	})
}

// A put the target refuses (an aggregate window, whose origins do not
// follow its epochs: no buffer is posted, since the target does not wait)
// fails its request with ErrRefused, and the next flush reports it once.
func TestLongHaulRefused(t *testing.T) {
	comms := newWorld(t, 2, &Config{LongHaul: &LongHaulConfig{Reliability: reliability.Config{RTT: 2 * time.Millisecond}}})
	each(t, comms, func(ctx context.Context, c *Comm) error {
		w, err := c.Allocate(ctx, 4096, &WinConfig{Notify: &NotifyConfig{Expect: 4096, Count: mailbox.CountBytes}})
		if err != nil {
			return err
		}
		if c.Rank() == 0 {
			for e := range 3 {
				r, err := w.Rput(ctx, make([]byte, 4096), 1, 0)
				if err != nil {
					return err
				}
				err = r.Wait(ctx)
				if e < 2 && err != nil {
					return fmt.Errorf("epoch %d: %w", e, err)
				}
				if e == 2 && !errors.Is(err, mailbox.ErrRefused) {
					return fmt.Errorf("a put with no buffer posted: %v, want ErrRefused", err)
				}
			}
			// The next flush reports it too, once.
			if err := w.Flush(ctx, 1); !errors.Is(err, mailbox.ErrRefused) {
				return fmt.Errorf("flush after the refusal: %v", err)
			}
			if err := w.Flush(ctx, 1); err != nil {
				return err
			}
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		if c.Rank() == 1 {
			for range 2 {
				if _, err := w.WaitEpoch(ctx); err != nil {
					return err
				}
			}
		}
		if err := c.Barrier(ctx); err != nil {
			return err
		}
		return w.Free(ctx)
	})
}

func TestLongHaulEnv(t *testing.T) {
	t.Setenv(EnvLongHaul, "1, 3")
	lh, err := longHaulFromEnv()
	require.NoError(t, err)
	require.True(t, lh.Peers(3))
	require.False(t, lh.Peers(2))
	t.Setenv(EnvLongHaul, "all")
	lh, err = longHaulFromEnv()
	require.NoError(t, err)
	require.Nil(t, lh.Peers)
	t.Setenv(EnvLongHaul, "x")
	_, err = longHaulFromEnv()
	require.ErrorIs(t, err, ErrBootstrap)
}

// A long-haul peer that dies: puts toward it fail with ErrPeer once the
// reliability layer has heard nothing for its PeerTimeout.
func TestLongHaulDeadPeer(t *testing.T) {
	comms := newWorld(t, 2, &Config{Connect: verbs.ConnectConfig{Timeout: time.Millisecond, RetryCount: 2},
		LongHaul: &LongHaulConfig{Reliability: reliability.Config{RTT: 2 * time.Millisecond, PeerTimeout: 300 * time.Millisecond}}})
	wins := make([]*Win, 2)
	each(t, comms, func(ctx context.Context, c *Comm) error {
		var err error
		wins[c.Rank()], err = c.Allocate(ctx, 1<<16, &WinConfig{Notify: &NotifyConfig{ExpectFrom: map[int]int{1 - c.Rank(): 1 << 16}}})
		if err != nil {
			return err
		}
		// Connect both ways before rank 1 goes.
		if err := wins[c.Rank()].Put(ctx, make([]byte, 1<<16), 1-c.Rank(), 0); err != nil {
			return err
		}
		_, err = wins[c.Rank()].WaitEpoch(ctx)
		return err
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	t0 := time.Now()
	comms[1].teardown() // rank 1 dies
	require.NoError(t, wins[0].Put(ctx, make([]byte, 1<<16), 1, 0))
	err := wins[0].Flush(ctx, 1)
	require.ErrorIs(t, err, ErrPeer)
	t.Logf("failure reported %v after the peer died", time.Since(t0))
}

// TestLongHaulMTU: over UDP, rank connections carry the interface's
// largest packets, but long-haul ones keep RoCE's 4096 on both ends
// (their unit of loss and repair), unless the configuration sets an MTU.
func TestLongHaulMTU(t *testing.T) {
	for _, tc := range []struct {
		name string
		mtu  int
		want int
	}{{"default", 0, haulMTU}, {"configured", 2048, 2048}} {
		t.Run(tc.name, func(t *testing.T) {
			comms := newWorld(t, 2, &Config{Provider: "udp", MTU: tc.mtu, LongHaul: &LongHaulConfig{
				Reliability: reliability.Config{RTT: 2 * time.Millisecond, MinRTT: time.Millisecond}}})
			each(t, comms, func(ctx context.Context, c *Comm) error {
				w, err := c.Allocate(ctx, 8, &WinConfig{Notify: &NotifyConfig{ExpectFrom: map[int]int{1 - c.Rank(): 8}}})
				if err != nil {
					return err
				}
				if err := w.Put(ctx, []byte("8 bytes!"), 1-c.Rank(), 0); err != nil {
					return err
				}
				if _, err := w.WaitEpoch(ctx); err != nil {
					return err
				}
				if err := c.Barrier(ctx); err != nil {
					return err
				}
				return w.Free(ctx)
			})
			for _, c := range comms {
				p := c.peers[1-c.Rank()]
				p.haulMu.Lock()
				h := p.haul
				p.haulMu.Unlock()
				require.NotNil(t, h, "rank %d dialed its long-haul links", c.Rank())
				require.Equal(t, tc.want, h.data.qp.PathMTU())
				require.Equal(t, tc.want, h.hdr.qp.PathMTU())
				if tc.mtu == 0 {
					require.GreaterOrEqual(t, c.Device().MaxMTU(0), haulMTU, "the rank's port")
				}
			}
		})
	}
}
