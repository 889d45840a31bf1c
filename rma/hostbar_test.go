package rma

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/kvs"
	"github.com/rvma/rvma/internal/launch"
)

// envHostRole makes the test binary play a rank of TestHostBarrier.
const envHostRole = "RVMA_RMA_TEST_HOSTBAR"

func TestMain(m *testing.M) {
	if role := os.Getenv(envHostRole); role != "" {
		if err := playHostBarrier(role); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// spawnRanks runs n ranks of this test binary as processes on shm, each
// playing role, and returns their outputs and exit errors.
func spawnRanks(t *testing.T, n int, role string) ([]string, []error) {
	spinEnv := "RVMA_SPIN=20us" // a core each
	switch role {
	case "scarce", "meet-scarce":
		spinEnv = "RVMA_SPIN=50ms" // rvmarun's setting when a few ranks share a core
	case "meet-blocking":
		spinEnv = "RVMA_SPIN=0s" // and when many do: waits block at once
	}
	key := launch.NewKey()
	srv, err := kvs.ListenConfig("127.0.0.1:0", n, &kvs.ServerConfig{Key: key})
	require.NoError(t, err)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	outs := make([]bytes.Buffer, n)
	cmds := make([]*exec.Cmd, n)
	for r := range n {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envHostRole+"="+role, EnvRank+"="+strconv.Itoa(r), EnvSize+"="+strconv.Itoa(n),
			EnvKVS+"="+srv.Addr(), launch.EnvKey+"="+launch.EncodeKey(key), "RVMA_PROVIDER=shm", "GOMAXPROCS=1", spinEnv)
		cmd.Stdout, cmd.Stderr = &outs[r], &outs[r]
		require.NoError(t, cmd.Start())
		cmds[r] = cmd
	}
	// Each is reaped as it exits, as a launcher does: a zombie still
	// counts as alive.
	errs := make([]error, n)
	done := make(chan int, n)
	for r, cmd := range cmds {
		go func() {
			errs[r] = cmd.Wait()
			done <- r
		}()
	}
	for range n {
		<-done
	}
	res := make([]string, n)
	for r := range n {
		res[r] = outs[r].String()
	}
	return res, errs
}

// TestHostBarrier: ranks of one host, as processes, meet in barriers
// through each other's memory; the barrier holds every rank until all
// entered (each puts its round into every rank's window, each finds all
// of them there after the barrier, rounds after random delays); agree
// spreads an error to every rank; fences work through it; and a rank
// whose process is gone fails the others' barrier with ErrPeer naming it,
// in bounded time, rather than leaving them waiting, and so does one that
// closed its Comm alone; a barrier after Close fails; only a failure marks
// the Comm troubled (which bounds Close). All of it also where ranks
// share cores: a few a core spin giving the core away each round, many
// block at once.
func TestHostBarrier(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	for _, tc := range []struct {
		role  string
		ranks int
	}{{"meet", 2}, {"meet", 5}, {"meet-scarce", 4}, {"meet-blocking", 3}, {"dead", 4}, {"closed", 3}, {"after-close", 2}, {"scarce", 3}} {
		t.Run(fmt.Sprintf("%s/%d", tc.role, tc.ranks), func(t *testing.T) {
			outs, errs := spawnRanks(t, tc.ranks, tc.role)
			for r := range tc.ranks {
				if (tc.role == "dead" || tc.role == "closed") && r == tc.ranks-1 {
					continue // it exits without closing, or closes alone
				}
				require.NoError(t, errs[r], "rank %d: %s", r, outs[r])
				require.Contains(t, outs[r], "ok", "rank %d", r)
			}
		})
	}
}

// playHostBarrier is a rank of TestHostBarrier.
func playHostBarrier(role string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Init(ctx, nil)
	if err != nil {
		return err
	}
	if err := c.Barrier(ctx); err != nil {
		return err
	}
	if got := c.hb.state.Load(); got != hbOn {
		return fmt.Errorf("rank %d: barriers still go over messages", c.rank)
	}
	if c.troubled.Load() {
		return fmt.Errorf("rank %d: a barrier that failed nothing marked the Comm troubled", c.rank)
	}
	switch role {
	case "closed":
		// The last rank closes its Comm alone and stays alive: the others'
		// barrier fails naming it, as over messages, rather than waiting.
		if c.rank == c.size-1 {
			c.teardown()
			time.Sleep(5 * time.Second)
			return nil
		}
		err := c.Barrier(ctx)
		var e *OpError
		if !errors.Is(err, ErrPeer) || !errors.As(err, &e) || e.Rank != c.size-1 {
			return fmt.Errorf("rank %d: barrier with a closed rank: %v, want ErrPeer naming rank %d", c.rank, err, c.size-1)
		}
		c.teardown()
		fmt.Println("ok")
		return nil
	case "after-close":
		if err := c.Close(ctx); err != nil {
			return err
		}
		if err := c.Barrier(ctx); err == nil {
			return fmt.Errorf("rank %d: a barrier after Close succeeded", c.rank)
		}
		fmt.Println("ok")
		return nil
	case "scarce":
		for i := range 50 {
			if err := c.Barrier(ctx); err != nil {
				return fmt.Errorf("barrier %d: %w", i, err)
			}
		}
	case "meet", "meet-scarce", "meet-blocking":
		w, err := c.Allocate(ctx, 8*c.size, nil)
		if err != nil {
			return err
		}
		if err := w.LockAll(ctx); err != nil {
			return err
		}
		rng := rand.New(rand.NewPCG(uint64(c.rank), 7))
		mem := w.Bytes()
		for i := uint64(1); i <= 2000; i++ {
			if d := rng.IntN(4); d == 0 {
				time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
			}
			v := binary.LittleEndian.AppendUint64(nil, i)
			for r := range c.size {
				if err := w.Put(ctx, v, r, 8*c.rank); err != nil {
					return err
				}
			}
			if err := w.FlushAll(ctx); err != nil {
				return err
			}
			if err := c.Barrier(ctx); err != nil {
				return err
			}
			for r := range c.size {
				if got := binary.LittleEndian.Uint64(mem[8*r:]); got < i {
					return fmt.Errorf("rank %d, round %d: rank %d's put of this round is not here (%d): the barrier let this rank through early", c.rank, i, r, got)
				}
			}
			// Nobody puts the next round before all have looked.
			if err := c.Barrier(ctx); err != nil {
				return err
			}
		}
		if err := w.UnlockAll(ctx); err != nil {
			return err
		}
		for i := range 100 {
			if err := w.Fence(ctx, 0); err != nil {
				return fmt.Errorf("fence %d: %w", i, err)
			}
		}
		// agree: an error of one rank reaches all.
		var mine error
		if c.rank == 1 {
			mine = errors.New("rank 1's part failed")
		}
		err = c.agree(ctx, "test", mine)
		switch {
		case c.rank == 1 && err != nil:
			return fmt.Errorf("rank 1: agree: %w, want nil (its own error is its caller's)", err)
		case c.rank != 1 && !errors.Is(err, ErrRemote):
			return fmt.Errorf("rank %d: agree: %v, want ErrRemote", c.rank, err)
		}
		if !c.troubled.Load() {
			return fmt.Errorf("rank %d: a failed agree did not mark the Comm troubled (Close would wait without bound)", c.rank)
		}
		if err := w.Free(ctx); err != nil {
			return err
		}
	case "dead":
		if c.rank == c.size-1 {
			os.Exit(3) // gone, without a word
		}
		t0 := time.Now()
		err := c.Barrier(ctx)
		var e *OpError
		if !errors.Is(err, ErrPeer) || !errors.As(err, &e) || e.Rank != c.size-1 {
			return fmt.Errorf("rank %d: barrier with a dead rank: %v, want ErrPeer naming rank %d", c.rank, err, c.size-1)
		}
		if d := time.Since(t0); d > 30*time.Second {
			return fmt.Errorf("rank %d: the dead rank was found after %v", c.rank, d)
		}
		c.teardown()
		fmt.Println("ok")
		return nil
	}
	if err := c.Close(ctx); err != nil {
		return err
	}
	fmt.Println("ok")
	return nil
}

// TestBarrierLeavesCommUntroubled: barriers that fail nothing, over
// messages (the ranks share a process), including the first, which
// chooses how barriers run, do not mark the Comm troubled, which would bound Close to
// CloseTimeout; a failed agree does.
func TestBarrierLeavesCommUntroubled(t *testing.T) {
	comms := newWorld(t, 3, &Config{Provider: "loop"})
	each(t, comms, func(ctx context.Context, c *Comm) error {
		for range 3 {
			if err := c.Barrier(ctx); err != nil {
				return err
			}
		}
		if c.hb.state.Load() != hbOff {
			return fmt.Errorf("rank %d: barriers through memory between goroutines", c.rank)
		}
		if c.troubled.Load() {
			return fmt.Errorf("rank %d: troubled after barriers that failed nothing", c.rank)
		}
		var mine error
		if c.rank == 0 {
			mine = errors.New("failed here")
		}
		_ = c.agree(ctx, "test", mine)
		if !c.troubled.Load() {
			return fmt.Errorf("rank %d: a failed agree left the Comm untroubled", c.rank)
		}
		return nil
	})
}

// TestFirstBarrierFailed: when the Comm's first barrier, which chooses how
// barriers run, fails (here its context ends), later barriers fail at once
// with ErrSync rather than run a way the other ranks may not have chosen,
// until Recover.
func TestFirstBarrierFailed(t *testing.T) {
	comms := newWorld(t, 2, &Config{Provider: "loop"})
	each(t, comms, func(ctx context.Context, c *Comm) error {
		first, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		if c.rank == 0 {
			cancel() // rank 0's ends at once; rank 1's while it waits for rank 0
		}
		if err := c.Barrier(first); err == nil {
			return fmt.Errorf("rank %d: the first barrier succeeded with its context ended", c.rank)
		}
		for range 2 {
			if err := c.Barrier(ctx); !errors.Is(err, ErrSync) {
				return fmt.Errorf("rank %d: a barrier after the failed first: %v, want ErrSync", c.rank, err)
			}
		}
		return nil
	})
}
