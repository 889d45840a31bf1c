package main

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/rvma/rvma/internal/kvs"
)

// Restarts and kills (issue 18): --restart K starts a rank whose process
// died again, as its next incarnation, up to K times per rank; --kill
// kills a rank at a given or seeded-random time, so that the restarts
// can be shown and tested.

// serverRecorder records deaths and incarnations in rvmarun's own
// rendezvous.
type serverRecorder struct{ srv *kvs.Server }

func (s serverRecorder) Died(rank int) error { s.srv.Died(rank); return nil }

func (s serverRecorder) Joining() bool { return s.srv.Joining() }

func (s serverRecorder) Finished(rank int) { s.srv.Finished(rank) }

func (s serverRecorder) Respawned(rank int, inc uint32) error {
	s.srv.Respawned(rank, inc)
	return nil
}

// clientRecorder records them from a host's daemon, through the
// rendezvous's died and respawned requests (kvs.Client), on a connection
// it opens at the first death.
type clientRecorder struct {
	addr string
	key  []byte
	c    *kvs.Client // used by the group's supervise only
}

// recordTimeout bounds a record, the connection included.
const recordTimeout = 10 * time.Second

func (c *clientRecorder) do(f func(context.Context, *kvs.Client) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), recordTimeout)
	defer cancel()
	if c.c == nil {
		cl, err := kvs.Dial(ctx, c.addr, c.key)
		if err != nil {
			return fmt.Errorf("the rendezvous at %s: %w", c.addr, err)
		}
		c.c = cl
	}
	err := f(ctx, c.c)
	if err != nil {
		c.c.Close()
		c.c = nil
	}
	return err
}

func (c *clientRecorder) Died(rank int) error {
	return c.do(func(ctx context.Context, cl *kvs.Client) error { return cl.Died(ctx, rank) })
}

func (c *clientRecorder) Respawned(rank int, inc uint32) error {
	return c.do(func(ctx context.Context, cl *kvs.Client) error { return cl.Respawned(ctx, rank, inc) })
}

// Joining is false: a host's daemon cannot tell, and respawns; a rank
// respawned while the job starts fails to join it, and its restarts run
// out.
func (c *clientRecorder) Joining() bool { return false }

// Finished is not recorded from a daemon: a rank respawned on another
// host after one finished waits in Recover until its timeout.
func (c *clientRecorder) Finished(int) {}

func (c *clientRecorder) Close() {
	if c.c != nil {
		c.c.Close()
	}
}

// killSpec is a --kill: SIGKILL to rank's process group at, after the
// ranks started.
type killSpec struct {
	rank int
	at   time.Duration
}

// Bounds of a --kill random@SEED's time.
const (
	killMinDefault = 500 * time.Millisecond
	killMaxDefault = 3 * time.Second
)

const killUsage = "want RANK@DURATION (1@2.5s), random@SEED or random@SEED:MIN-MAX (random@7:1s-2s)"

// parseKill reads a --kill for a job of n ranks: RANK@DURATION, or
// random@SEED[:MIN-MAX], a rank and a time in [MIN,MAX] (default
// 0.5s-3s, to the millisecond) drawn from SEED, the same for the same
// seed and job size.
func parseKill(spec string, n int) (killSpec, error) {
	bad := func(format string, a ...any) (killSpec, error) {
		return killSpec{}, fmt.Errorf("--kill %q: %s", spec, fmt.Sprintf(format, a...))
	}
	what, when, ok := strings.Cut(spec, "@")
	if !ok {
		return bad(killUsage)
	}
	if what == "random" {
		seedText, bounds, hasBounds := strings.Cut(when, ":")
		seed, err := strconv.ParseInt(seedText, 10, 64)
		if err != nil {
			return bad("SEED %q: want an integer", seedText)
		}
		lo, hi := killMinDefault, killMaxDefault
		if hasBounds {
			loText, hiText, ok := strings.Cut(bounds, "-")
			if !ok {
				return bad("%q: want MIN-MAX, two durations (1s-2s)", bounds)
			}
			var err1, err2 error
			lo, err1 = time.ParseDuration(loText)
			hi, err2 = time.ParseDuration(hiText)
			switch {
			case err1 != nil || err2 != nil:
				return bad("%q: want MIN-MAX, two durations (1s-2s)", bounds)
			case lo < 0 || hi < lo:
				return bad("%q: want 0 <= MIN <= MAX", bounds)
			}
		}
		rng := rand.New(rand.NewPCG(uint64(seed), 0x7276_6d61_6b69_6c6c))
		k := killSpec{rank: rng.IntN(n), at: lo + time.Duration(rng.Int64N(int64(hi-lo)+1))}
		k.at = max(lo, k.at.Truncate(time.Millisecond))
		return k, nil
	}
	rank, err := strconv.Atoi(what)
	switch {
	case err != nil:
		return bad(killUsage)
	case rank < 0 || rank >= n:
		return bad("rank %d: the job's ranks are 0 to %d", rank, n-1)
	}
	at, err := time.ParseDuration(when)
	switch {
	case err != nil:
		return bad("%q: want a duration (2.5s, 800ms)", when)
	case at < 0:
		return bad("%q: want a duration of 0 or more", when)
	}
	return killSpec{rank: rank, at: at}, nil
}

// scheduleKills calls kill for each of ks at its time, counted from now,
// in time order; it returns early when done closes.
func scheduleKills(ks []killSpec, kill func(killSpec), done <-chan struct{}) {
	ks = slices.Clone(ks)
	slices.SortStableFunc(ks, func(a, b killSpec) int { return cmp.Compare(a.at, b.at) })
	start := time.Now()
	for _, k := range ks {
		select {
		case <-time.After(k.at - time.Since(start)):
			kill(k)
		case <-done:
			return
		}
	}
}
