package rma

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/kvs"
	"github.com/rvma/rvma/verbs"
)

// kill ends rank c as kill -9 would: nothing is said to the others, whose
// launcher then notices the death.
func kill(c *Comm) {
	c.teardown()
	c.world.store.Died(c.rank)
}

// respawn starts rank old's next incarnation, as rvmarun --restart does.
func respawn(ctx context.Context, old *Comm) (*Comm, error) {
	wd := old.world
	dev, err := verbs.Open(ctx, wd.uri, &wd.cfg.Device)
	if err != nil {
		return nil, err
	}
	inc := old.inc + 1
	wd.store.Respawned(old.rank, inc)
	c, err := newComm(ctx, boot{rank: old.rank, size: old.size, store: wd.store, key: wd.key, inc: inc, recover: wd.store, watch: wd.store}, dev, wd.cfg)
	if err != nil {
		dev.Close()
		return nil, err
	}
	c.world = wd
	return c, nil
}

// ring is a rank's part of a periodic 1-D stencil whose state lives in a
// notified window: cells, then the ghost cells of even and odd steps.
type ring struct {
	c           *Comm
	w           *Win
	n, steps    int
	cells       []float64
	left, right int
}

func ringStart(ctx context.Context, c *Comm, n, steps int, nc NotifyConfig) (*ring, error) {
	p := c.Size()
	s := &ring{c: c, n: n, steps: steps, left: (c.Rank() + p - 1) % p, right: (c.Rank() + 1) % p}
	nc.ExpectFrom = map[int]int{s.left: 8, s.right: 8}
	if p == 2 {
		nc.ExpectFrom = map[int]int{s.left: 16}
	}
	var err error
	if s.w, err = c.Allocate(ctx, 8*(n+4), &WinConfig{Notify: &nc}); err != nil {
		return nil, err
	}
	s.cells = unsafe.Slice((*float64)(unsafe.Pointer(&s.w.Bytes()[0])), n+4)
	return s, nil
}

func (s *ring) ghost(e, side int) int { return 8*s.n + 16*(e%2) + 8*side }

func ringInit(rank, i, n int) float64 { return float64(((rank*n+i)*7919)%1000) / 1000 }

func (s *ring) compute(e int) {
	gl, gr := s.cells[s.ghost(e, 0)/8], s.cells[s.ghost(e, 1)/8]
	c := s.cells[:s.n]
	prev := gl
	for i := range c {
		r := gr
		if i < len(c)-1 {
			r = c[i+1]
		}
		v := (prev + c[i] + r) / 3
		prev = c[i]
		c[i] = v
	}
}

var errKilled = errors.New("killed")

// run runs the steps, recovering from failures; killAt > 0 makes this
// rank die in that step, between its two puts.
func (s *ring) run(ctx context.Context, killAt int) ([]float64, error) {
	c, w := s.c, s.w
	if c.Restarted() {
		if err := c.Recover(ctx); err != nil {
			return nil, err
		}
	} else {
		for i := range s.n {
			s.cells[i] = ringInit(c.Rank(), i, s.n)
		}
		if err := w.Snapshot(ctx); err != nil {
			return nil, err
		}
		if err := c.Barrier(ctx); err != nil {
			return nil, err
		}
	}
	e := int(w.Epoch())
	if e > 0 {
		s.compute(e)
	}
	for e < s.steps {
		e++
		err := w.Put(ctx, w.Bytes()[:8], s.left, s.ghost(e, 1))
		if err == nil && e == killAt {
			kill(c)
			return nil, errKilled
		}
		if err == nil {
			err = w.Put(ctx, w.Bytes()[8*(s.n-1):8*s.n], s.right, s.ghost(e, 0))
		}
		if err == nil {
			_, err = w.WaitEpoch(ctx)
		}
		if err != nil {
			if !errors.Is(err, ErrPeer) {
				return nil, err
			}
			if err := c.Recover(ctx); err != nil {
				return nil, err
			}
			if e = int(w.Epoch()); e > 0 {
				s.compute(e)
			}
			continue
		}
		s.compute(e)
	}
	if err := c.Barrier(ctx); err != nil {
		return nil, err
	}
	return append([]float64(nil), s.cells[:s.n]...), nil
}

// ringReference is the fault-free answer, computed serially.
func ringReference(p, n, steps int) [][]float64 {
	all := make([]float64, p*n)
	for r := range p {
		for i := range n {
			all[r*n+i] = ringInit(r, i, n)
		}
	}
	next := make([]float64, len(all))
	for range steps {
		for i := range all {
			next[i] = (all[(i-1+len(all))%len(all)] + all[i] + all[(i+1)%len(all)]) / 3
		}
		all, next = next, all
	}
	out := make([][]float64, p)
	for r := range p {
		out[r] = all[r*n : (r+1)*n]
	}
	return out
}

func TestRecoverAfterKill(t *testing.T) {
	const n, steps = 32, 14
	for _, tc := range []struct {
		name         string
		provider     string
		p            int
		victim, step int
		every        int
	}{
		{"loop/4/rank1", "loop", 4, 1, 6, 1},
		{"loop/3/rank0", "loop", 3, 0, 9, 1},
		{"loop/5/rank4-every3", "loop", 5, 4, 8, 3},
		{"loop/4/first-step", "loop", 4, 2, 1, 1},
		{"udp/4/rank3", "udp", 4, 3, 7, 2},
		{"shm/4/rank2", "shm", 4, 2, 5, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			comms, err := NewWorld(ctx, tc.p, &Config{Provider: tc.provider, CloseTimeout: time.Second})
			require.NoError(t, err)
			got := make([][]float64, tc.p)
			errs := make([]error, tc.p)
			var wg sync.WaitGroup
			// History 4: ranks two apart on the ring may be two epochs apart.
			nc := NotifyConfig{History: 4, Every: tc.every, Replicate: true}
			for r, c := range comms {
				wg.Add(1)
				go func() {
					defer wg.Done()
					s, err := ringStart(ctx, c, n, steps, nc)
					if err != nil {
						errs[r] = err
						return
					}
					killAt := 0
					if r == tc.victim {
						killAt = tc.step
					}
					got[r], errs[r] = s.run(ctx, killAt)
					if errors.Is(errs[r], errKilled) {
						c2, err := respawn(ctx, c)
						if err != nil {
							errs[r] = err
							return
						}
						comms[r] = c2
						s2, err := ringStart(ctx, c2, n, steps, nc)
						if err != nil {
							errs[r] = err
							return
						}
						got[r], errs[r] = s2.run(ctx, 0)
					}
				}()
			}
			wg.Wait()
			for _, c := range comms {
				wg.Add(1)
				go func() { defer wg.Done(); c.Close(ctx) }()
			}
			wg.Wait()
			want := ringReference(tc.p, n, steps)
			for r := range tc.p {
				require.NoError(t, errs[r], "rank %d", r)
				require.Equal(t, want[r], got[r], "rank %d's cells differ from the fault-free run's", r)
			}
		})
	}
}

// TestRecoverPlan checks the agreement's arithmetic: the epoch every rank
// retains, and the errors when none is or a state is lost.
func TestRecoverPlan(t *testing.T) {
	c := &Comm{rank: 0, size: 3}
	wins := []*Win{{id: 1}}
	for _, tc := range []struct {
		name   string
		values []string
		want   uint64
		err    error
	}{
		{"survivors", []string{"S;1:h:3.4/", "S;1:h:4.5/", "S;1:h:2.3.4/"}, 4, nil},
		{"respawned from buddy", []string{"S;1:r:4.5/1.2", "F;1:r:/7", "S;1:r:4.5.6/4.5"}, 5, nil},
		{"buddy lost too", []string{"S;1:r:4/4", "F;1:r:/4", "F;1:r:/"}, 0, ErrLost},
		{"no replicas", []string{"S;1:h:4/", "F;1:h:/", "S;1:h:4/"}, 0, ErrLost},
		{"nothing common", []string{"S;1:h:3/", "S;1:h:4/", "S;1:h:4/"}, 0, ErrNotRetained},
		{"plain window", []string{"S;1:p:/", "F;1:p:/", "S;1:p:/"}, 0, nil},
		{"windows differ", []string{"S;1:h:4/", "S", "S;1:h:4/"}, 0, ErrSync},
		{"kinds differ", []string{"S;1:h:4/", "S;1:r:4/", "S;1:h:4/"}, 0, ErrSync},
		{"garbage", []string{"S;1:h:4/", "X", "S;1:h:4/"}, 0, ErrDatatype},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := c.plan(kvs.View{Inc: make([]uint32, 3), Values: tc.values}, wins)
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, []uint64{tc.want}, plan)
		})
	}
}

func FuzzParseRetained(f *testing.F) {
	f.Add("S;1:h:3.4/5")
	f.Add("F;2:r:/")
	f.Fuzz(func(t *testing.T, s string) {
		fresh, wins, err := parseRetained(s)
		if err != nil {
			return
		}
		// What parses encodes back to something that parses the same.
		var b []byte
		b = fmt.Appendf(b, "%c", map[bool]byte{true: 'F', false: 'S'}[fresh])
		for _, w := range wins {
			b = fmt.Appendf(b, ";%d:%c:", w.id, w.kind)
			for i, e := range w.own {
				if i > 0 {
					b = append(b, '.')
				}
				b = fmt.Appendf(b, "%d", e)
			}
			b = append(b, '/')
			for i, e := range w.ward {
				if i > 0 {
					b = append(b, '.')
				}
				b = fmt.Appendf(b, "%d", e)
			}
		}
		fresh2, wins2, err := parseRetained(string(b))
		require.NoError(t, err)
		require.Equal(t, fresh, fresh2)
		require.Equal(t, len(wins), len(wins2))
		_ = math.MaxInt
	})
}
