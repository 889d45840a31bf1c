package rma

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sync"
	"testing"
	"time"

	"github.com/rvma/rvma/verbs"
	"github.com/stretchr/testify/require"
)

// collWorld is newWorld whose cleanup tears the ranks down without
// Close's barrier, which would first connect each rank to the rest of its
// Barrier peers: set-ups these tests do not check, which take seconds at
// 64 ranks under -race. Each test's collectives have all returned by
// then, so no connection is still in use.
func collWorld(t *testing.T, n int, cfg *Config) []*Comm {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	comms, err := NewWorld(ctx, n, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		var wg sync.WaitGroup
		for _, c := range comms {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.teardown()
			}()
		}
		wg.Wait()
	})
	return comms
}

// contribution is rank r's Allgather input in call i: lengths differ
// between ranks and calls, some are empty, and with big one rank's spans
// several fragments.
func contribution(r, i int, big bool) []byte {
	n := (r*7 + i*3) % 13
	if big && r == 1 {
		n = 3*fragMax + 5
	}
	b := make([]byte, n)
	for j := range b {
		b[j] = byte(r*31 + i*17 + j)
	}
	return b
}

// connectedPeers counts the ranks c holds a connection to.
func connectedPeers(c *Comm) int {
	n := 0
	for _, p := range c.peers {
		p.mu.Lock()
		if p.qp != nil {
			n++
		}
		p.mu.Unlock()
	}
	return n
}

// sendsInFlight counts c's messages not yet acknowledged or failed: each
// holds staging buffers until its Op finishes.
func sendsInFlight(c *Comm) int {
	s := &c.msg.send
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.made - len(s.free[0]) - len(s.free[1])
}

// requireFewPeers checks the connections of a world whose first
// collective was an Allgather: each rank connected to its partners only,
// one a round with recursive doubling, else at most two (gathering at rank
// 0 connected it to every other rank).
func requireFewPeers(t *testing.T, comms []*Comm) {
	t.Helper()
	n := len(comms)
	if n == 64 {
		t.Logf("%d ranks: rank 0 connected to %d peers", n, connectedPeers(comms[0]))
	}
	for r, c := range comms {
		if n&(n-1) == 0 {
			require.Equal(t, ceilLog2(n), connectedPeers(c), "rank %d", r)
		} else {
			require.LessOrEqual(t, connectedPeers(c), 2*ceilLog2(n), "rank %d", r)
		}
	}
}

// ceilLog2 is the number of rounds of a doubling algorithm over n ranks.
func ceilLog2(n int) int { return bits.Len(uint(n - 1)) }

func TestAllgather(t *testing.T) {
	type world struct {
		provider string
		sizes    []int
	}
	for _, w := range []world{
		{"loop", []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 17, 33, 64}},
		{"udp", []int{3, 7, 8}},
		{"shm", []int{3, 7, 8}},
	} {
		for _, n := range w.sizes {
			t.Run(fmt.Sprintf("%s/%d", w.provider, n), func(t *testing.T) {
				big := n == 3 || n == 8
				comms := collWorld(t, n, &Config{Provider: w.provider})
				got := make([][][]byte, n)
				for i := range 2 {
					each(t, comms, func(ctx context.Context, c *Comm) (err error) {
						got[c.Rank()], err = c.Allgather(ctx, contribution(c.Rank(), i, big))
						return err
					})
					want := make([][]byte, n)
					for r := range want {
						want[r] = contribution(r, i, big)
					}
					for r := range n {
						require.Equal(t, want, got[r], "call %d, rank %d's result", i, r)
					}
					if i == 0 {
						requireFewPeers(t, comms)
					}
				}
			})
		}
	}
}

func TestAllreduce(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 8} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			comms := collWorld(t, n, nil)
			// Rank r's values: sums that wrap (int64) and that depend on
			// the order of addition (float64), signed zeros for min and
			// max.
			ints := func(r int) []int64 {
				return []int64{int64(r), -int64(r) * 1000, math.MaxInt64 - int64(r), int64(r%3) - 1}
			}
			floats := func(r int) []float64 {
				return []float64{0.1 * float64(r+1), math.Pow(-1e8, float64(r%5)), 1 / float64(r+3), math.Copysign(0, float64(r%2)-0.5)}
			}
			for _, op := range []ReduceOp{ReduceSum, ReduceMin, ReduceMax} {
				gotI := make([][]int64, n)
				gotF := make([][]float64, n)
				each(t, comms, func(ctx context.Context, c *Comm) error {
					gotI[c.Rank()], gotF[c.Rank()] = ints(c.Rank()), floats(c.Rank())
					if err := c.AllreduceInt64(ctx, op, gotI[c.Rank()]); err != nil {
						return err
					}
					return c.AllreduceFloat64(ctx, op, gotF[c.Rank()])
				})
				// The reduction in rank order.
				wantI, wantF := ints(0), floats(0)
				for r := 1; r < n; r++ {
					for i, v := range ints(r) {
						wantI[i] = reduce(op, wantI[i], v)
					}
					for i, v := range floats(r) {
						wantF[i] = reduce(op, wantF[i], v)
					}
				}
				for r := range n {
					require.Equal(t, wantI, gotI[r], "op %d, rank %d", op, r)
					for i := range wantF {
						require.Equal(t, math.Float64bits(wantF[i]), math.Float64bits(gotF[r][i]), "op %d, rank %d, value %d", op, r, i)
					}
				}
			}
		})
	}
}

func reduce[T int64 | float64](op ReduceOp, a, b T) T {
	switch op {
	case ReduceMin:
		return min(a, b)
	case ReduceMax:
		return max(a, b)
	}
	return a + b
}

// TestAllgatherErrors: a rank missing from the call fails the ranks that
// wait for it, each with an OpError naming Allgather and the peer it
// waited for, and with none of its messages left in flight; the
// communicator's later collectives still work.
func TestAllgatherErrors(t *testing.T) {
	const absent = 2
	for _, tc := range []struct {
		n      int
		waited map[int]int // rank -> the peer its Allgather fails on
	}{
		{3, map[int]int{0: 2, 1: 2}},       // Bruck: 0 receives from 2 first, 1 in its second round
		{4, map[int]int{0: 2, 1: 3, 3: 2}}, // recursive doubling: 3 never reaches its second round
	} {
		t.Run(fmt.Sprint(tc.n), func(t *testing.T) {
			comms := collWorld(t, tc.n, nil)
			// Connected first, so that the rounds before the missing rank
			// cannot be what times out.
			each(t, comms, func(ctx context.Context, c *Comm) error {
				_, err := c.Allgather(ctx, []byte{1})
				return err
			})
			errs := make([]error, tc.n)
			var wg sync.WaitGroup
			for r, c := range comms {
				if r == absent {
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
					defer cancel()
					_, errs[r] = c.Allgather(ctx, []byte{2})
				}()
			}
			wg.Wait()
			for r, peer := range tc.waited {
				var oe *OpError
				require.ErrorAs(t, errs[r], &oe, "rank %d", r)
				require.Equal(t, "allgather", oe.Op, "rank %d", r)
				require.Equal(t, peer, oe.Rank, "rank %d", r)
				require.ErrorIs(t, errs[r], context.DeadlineExceeded, "rank %d", r)
				require.Zero(t, sendsInFlight(comms[r]), "rank %d", r)
			}
			// The missing rank catches up (its call may fail too), and
			// the next collective works on every rank.
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			comms[absent].Allgather(ctx, []byte{2})
			cancel()
			each(t, comms, func(ctx context.Context, c *Comm) error {
				all, err := c.Allgather(ctx, []byte{byte(c.Rank())})
				if err != nil {
					return err
				}
				for r, b := range all {
					if len(b) != 1 || int(b[0]) != r {
						return errors.New("allgather after a failure returned wrong data")
					}
				}
				return nil
			})
		})
	}
}

// TestCloseLostAcks: Close succeeds on every rank while packets are lost,
// including the acknowledgements of Close's last barrier messages, whose
// receivers may have torn down before the sender retransmits (the
// last-ACK problem). The short RC timeouts make a sender that waits for
// such an ACK fail within milliseconds rather than seconds.
func TestCloseLostAcks(t *testing.T) {
	for i := range 12 {
		n := 2 + i%4
		cfg := &Config{Provider: "loop", Connect: verbs.ConnectConfig{Timeout: time.Millisecond, MaxTimeout: 2 * time.Millisecond}}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		comms, err := NewWorld(ctx, n, cfg)
		require.NoError(t, err)
		each(t, comms, func(ctx context.Context, c *Comm) error { return c.Barrier(ctx) })
		for r, c := range comms {
			require.NoError(t, c.dev.SetFaults(-1, verbs.Faults{Drop: 0.15, Seed: uint64(100*i + r + 1)}))
		}
		errs := make([]error, n)
		var wg sync.WaitGroup
		for r, c := range comms {
			wg.Go(func() { errs[r] = c.Close(ctx) })
		}
		wg.Wait()
		cancel()
		for r, err := range errs {
			require.NoError(t, err, "round %d: rank %d of %d", i, r, n)
		}
	}
}
