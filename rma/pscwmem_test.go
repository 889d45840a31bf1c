package rma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// pscwRounds runs rounds epochs in which every rank exposes its window to
// all (itself included), puts its rank and round into its slot of every
// window, accumulates 1 into every window's counter, and after Wait finds
// every slot and the count; some epochs end with Test. messagesTo, when
// set, makes this rank reach those peers over messages, as one whose
// mapping failed would.
func pscwRounds(ctx context.Context, c *Comm, rounds int, messagesTo []int) (*Win, error) {
	n, me := c.Size(), c.Rank()
	w, err := c.Allocate(ctx, 8*(n+1), nil)
	if err != nil {
		return nil, err
	}
	for _, r := range messagesTo {
		w.syncMap[r].state.Store(directNone)
	}
	all := make([]int, n)
	for r := range all {
		all[r] = r
	}
	one := binary.LittleEndian.AppendUint64(nil, 1)
	for round := 1; round <= rounds; round++ {
		if err := w.Post(ctx, all, 0); err != nil {
			return nil, err
		}
		if err := w.Start(ctx, all, 0); err != nil {
			return nil, err
		}
		v := binary.LittleEndian.AppendUint64(nil, uint64(round<<16|me))
		for r := range n {
			if err := w.Put(ctx, v, r, 8*me); err != nil {
				return nil, err
			}
			if err := w.Accumulate(ctx, one, Int64, Sum, r, 8*n); err != nil {
				return nil, err
			}
		}
		if err := w.Complete(ctx); err != nil {
			return nil, err
		}
		if round%3 == 0 {
			for {
				done, err := w.Test()
				if err != nil {
					return nil, err
				}
				if done {
					break
				}
				time.Sleep(10 * time.Microsecond)
			}
		} else if err := w.Wait(ctx); err != nil {
			return nil, err
		}
		mem := w.Bytes()
		for r := range n {
			if got := binary.LittleEndian.Uint64(mem[8*r:]); got != uint64(round<<16|r) {
				return nil, fmt.Errorf("rank %d, round %d: rank %d's slot holds %#x: Wait returned before its epoch completed", me, round, r, got)
			}
		}
		if got := binary.LittleEndian.Uint64(mem[8*n:]); got != uint64(round*n) {
			return nil, fmt.Errorf("rank %d, round %d: count %d, want %d", me, round, got, round*n)
		}
	}
	return w, nil
}

// On shm, post, start, complete and wait run through the ranks' words:
// every epoch's data is there when Wait or Test says so, the tokens count
// every epoch, and a rank that reaches some peers over messages (its
// mapping failed) mixes with the others' tokens.
func TestPSCWThroughMemory(t *testing.T) {
	const n = 4
	for _, tc := range []struct {
		name  string
		mixed bool
	}{{"tokens", false}, {"mixed with messages", true}} {
		const rounds = 60
		t.Run(tc.name, func(t *testing.T) {
			comms := newWorld(t, n, &Config{Provider: "shm"})
			wins := make([]*Win, n)
			each(t, comms, func(ctx context.Context, c *Comm) error {
				var msgs []int
				if tc.mixed && c.Rank() == 1 {
					msgs = []int{0, 2}
				}
				w, err := pscwRounds(ctx, c, rounds, msgs)
				wins[c.Rank()] = w
				return err
			})
			for me, w := range wins {
				require.NotNil(t, w.syncMem, "shm windows keep sync words")
				for r := range n {
					viaMsg := tc.mixed && r == 1 && (me == 0 || me == 2)
					want := uint64(rounds)
					if viaMsg {
						want = 0
					}
					require.Equal(t, want, w.syncMem[postIdx(r)], "rank %d: posts of rank %d as tokens", me, r)
					require.Equal(t, want, w.syncMem[doneIdx(n, r)], "rank %d: completes of rank %d as tokens", me, r)
					require.Equal(t, uint64(rounds), w.postsTaken[r]+uint64(rounds)-want, "rank %d: posts of %d taken", me, r)
					require.Zero(t, w.syncMem[failedIdx(n, r)])
				}
			}
		})
	}
}

// A rank waiting in Start for a post that a closed rank will never make
// fails with ErrPeer naming it, in bounded time, as over messages.
func TestPSCWThroughMemoryPeerGone(t *testing.T) {
	comms := newWorld(t, 2, &Config{Provider: "shm"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wins := allocateAll(ctx, t, comms, 8)
	require.NotNil(t, wins[0].syncPeer(ctx, 1), "rank 1's words are mapped")
	comms[1].teardown()
	t0 := time.Now()
	err := wins[0].Start(ctx, []int{1}, 0)
	var e *OpError
	require.True(t, errors.Is(err, ErrPeer), "start towards a closed rank: %v", err)
	require.True(t, errors.As(err, &e))
	require.Equal(t, 1, e.Rank)
	require.Less(t, time.Since(t0), 20*time.Second)
}

// After Recover the windows' epochs go over messages, which carry the
// recovery's generation: a token left from before (an origin completed
// while the epoch failed elsewhere) must not end a later epoch.
func TestPSCWStaleTokenAfterRecover(t *testing.T) {
	comms := newWorld(t, 2, &Config{Provider: "shm"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wins := allocateAll(ctx, t, comms, 8)
	w := wins[0]
	require.NotNil(t, w.syncMem)
	signal(w.syncMem, doneIdx(2, 1)) // rank 1's complete of an epoch that failed
	comms[0].recovered.Store(true)
	require.NoError(t, w.Post(ctx, []int{1}, 0))
	done, err := w.Test()
	require.NoError(t, err)
	require.False(t, done, "a token from before the recovery ended the epoch")
}

// allocateAll creates a window of n bytes on every rank of comms.
func allocateAll(ctx context.Context, t *testing.T, comms []*Comm, n int) []*Win {
	wins := make([]*Win, len(comms))
	errs := make(chan error, len(comms))
	for i, c := range comms {
		go func() {
			w, err := c.Allocate(ctx, n, nil)
			wins[i] = w
			errs <- err
		}()
	}
	for range comms {
		require.NoError(t, <-errs)
	}
	return wins
}
