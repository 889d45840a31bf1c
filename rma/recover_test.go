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
	dead := make(chan struct{})
	killedComms.Store(c, dead)
	c.teardown()
	c.world.store.Died(c.rank)
	close(dead)
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
	recoveries  int
	others      func(r int) *Comm // the job's current rank r
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

// ringPlan says what happens to a rank during a ring run.
type ringPlan struct {
	killAt  int           // die in this step, between the two puts
	with    []int         // ranks that die at the same instant
	stallAt int           // sleep stall in this step, before the puts
	stall   time.Duration //
}

// recover calls Recover and returns the step to go on from.
func (s *ring) recover(ctx context.Context) (int, error) {
	if err := s.c.Recover(ctx); err != nil {
		return 0, err
	}
	s.recoveries++
	e := int(s.w.Epoch())
	if e > 0 {
		s.compute(e) // the snapshot holds the state before the step's compute
	}
	return e, nil
}

// run runs the steps, recovering from failures.
func (s *ring) run(ctx context.Context, plan ringPlan) ([]float64, error) {
	c, w := s.c, s.w
	e := 0
	if c.Restarted() {
		var err error
		if e, err = s.recover(ctx); err != nil {
			return nil, err
		}
	} else {
		for i := range s.n {
			s.cells[i] = ringInit(c.Rank(), i, s.n)
		}
		if err := w.Snapshot(ctx); err != nil {
			return nil, err
		}
		// A rank that passed this barrier may die before the others do,
		// and a survivor's barrier then fails: the window and its
		// snapshot exist everywhere, so it recovers as from a step (it
		// returned instead, one run in fifteen under load, and the
		// others waited for it in Recover until the test's deadline).
		if err := c.Barrier(ctx); err != nil {
			if !errors.Is(err, ErrPeer) {
				return nil, err
			}
			if e, err = s.recover(ctx); err != nil {
				return nil, err
			}
		}
	}
	for e < s.steps {
		e++
		if e == plan.stallAt && c.Incarnation() == 0 {
			time.Sleep(plan.stall)
		}
		err := w.Put(ctx, w.Bytes()[:8], s.left, s.ghost(e, 1))
		if err == nil && e == plan.killAt && c.Incarnation() == 0 {
			kill(c)
			for _, o := range plan.with {
				kill(s.others(o))
			}
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
			if e, err = s.recover(ctx); err != nil {
				return nil, err
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

// ringJob runs a ring of p ranks under plans, respawning every rank that
// dies (as rvmarun --restart does), and returns each rank's final cells,
// error and recoveries.
type ringJob struct {
	provider string
	p        int
	n, steps int
	nc       NotifyConfig
	plans    map[int]ringPlan
}

func (j ringJob) run(t *testing.T) ([][]float64, []error, []int) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	comms, err := NewWorld(ctx, j.p, &Config{Provider: j.provider, CloseTimeout: time.Second})
	require.NoError(t, err)
	var mu sync.Mutex
	got := make([][]float64, j.p)
	errs := make([]error, j.p)
	recs := make([]int, j.p)
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			plan := j.plans[r]
			for {
				s, err := ringStart(ctx, c, j.n, j.steps, j.nc)
				if err == nil {
					s.others = func(o int) *Comm {
						mu.Lock()
						defer mu.Unlock()
						return comms[o]
					}
					got[r], err = s.run(ctx, plan)
					recs[r] += s.recoveries
				}
				errs[r] = err
				if !errors.Is(err, errKilled) && !c.killed() {
					return
				}
				if c, err = respawn(ctx, c); err != nil {
					errs[r] = err
					return
				}
				mu.Lock()
				comms[r] = c
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, c := range comms {
		wg.Add(1)
		go func() { defer wg.Done(); c.Close(ctx) }()
	}
	wg.Wait()
	return got, errs, recs
}

var killedComms sync.Map

// killed reports whether the test killed c, once the launcher knows.
func (c *Comm) killed() bool {
	dead, ok := killedComms.Load(c)
	if ok {
		<-dead.(chan struct{})
	}
	return ok
}

func TestRecoverAfterKill(t *testing.T) {
	const n, steps = 32, 14
	for _, tc := range []struct {
		name     string
		provider string
		p        int
		plans    map[int]ringPlan
		every    int
	}{
		{"loop/4/rank1", "loop", 4, map[int]ringPlan{1: {killAt: 6}}, 1},
		{"loop/3/rank0", "loop", 3, map[int]ringPlan{0: {killAt: 9}}, 1},
		{"loop/5/rank4-every3", "loop", 5, map[int]ringPlan{4: {killAt: 8}}, 3},
		{"loop/4/first-step", "loop", 4, map[int]ringPlan{2: {killAt: 1}}, 1},
		{"loop/5/two-not-buddies", "loop", 5, map[int]ringPlan{1: {killAt: 7, with: []int{3}}}, 1},
		{"loop/6/two-apart-in-time", "loop", 6, map[int]ringPlan{0: {killAt: 3}, 4: {killAt: 11}}, 2},
		{"udp/4/rank3", "udp", 4, map[int]ringPlan{3: {killAt: 7}}, 2},
		{"shm/4/rank2", "shm", 4, map[int]ringPlan{2: {killAt: 5}}, 1},
		{"shm/8/rank5", "shm", 8, map[int]ringPlan{5: {killAt: 9}}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// History 6: ranks half the ring apart may be that many epochs
			// apart, and a rank may die twice in a test.
			job := ringJob{provider: tc.provider, p: tc.p, n: n, steps: steps, plans: tc.plans,
				nc: NotifyConfig{History: 6, Every: tc.every, Replicate: true}}
			got, errs, recs := job.run(t)
			want := ringReference(tc.p, n, steps)
			for r := range tc.p {
				require.NoError(t, errs[r], "rank %d", r)
				require.Equal(t, want[r], got[r], "rank %d's cells differ from the fault-free run's", r)
				require.NotZero(t, recs[r], "rank %d never recovered", r)
			}
		})
	}
}

// Two ranks that are each other's buddy die together: the state of the
// first is nowhere, and every rank says so rather than compute wrong data.
func TestRecoverBuddyLost(t *testing.T) {
	job := ringJob{provider: "loop", p: 4, n: 16, steps: 10, plans: map[int]ringPlan{1: {killAt: 5, with: []int{2}}},
		nc: NotifyConfig{History: 4, Replicate: true}}
	_, errs, _ := job.run(t)
	for r, err := range errs {
		require.ErrorIs(t, err, ErrLost, "rank %d", r)
		require.ErrorContains(t, err, "its buddy, rank 2, died too")
	}
	// Without replicas a respawned rank's state is lost too.
	job.nc.Replicate = false
	job.plans = map[int]ringPlan{3: {killAt: 4}}
	_, errs, _ = job.run(t)
	for r, err := range errs {
		require.ErrorIs(t, err, ErrLost, "rank %d", r)
	}
}

// A rank that dies during Recover (after the round agreed, or after it
// restored its window) makes the others start over with its next
// incarnation; the answer is still the fault-free one.
func TestRecoverDeathDuringRecovery(t *testing.T) {
	for _, phase := range []string{"joined", "restored"} {
		t.Run(phase, func(t *testing.T) {
			var once sync.Once
			testHook = func(c *Comm, at string) {
				if at == phase && c.rank == 3 && c.inc == 0 {
					once.Do(func() { kill(c) })
				}
			}
			defer func() { testHook = nil }()
			job := ringJob{provider: "loop", p: 5, n: 16, steps: 12, plans: map[int]ringPlan{1: {killAt: 6}},
				nc: NotifyConfig{History: 6, Replicate: true}}
			got, errs, _ := job.run(t)
			want := ringReference(5, 16, 12)
			for r := range 5 {
				require.NoError(t, errs[r], "rank %d", r)
				require.Equal(t, want[r], got[r], "rank %d", r)
			}
		})
	}
}

// A rank that is slow, not dead (a pause well under the RC timeouts that
// declare a peer dead), causes no recovery.
func TestRecoverSlowIsNotDead(t *testing.T) {
	job := ringJob{provider: "udp", p: 4, n: 16, steps: 8, plans: map[int]ringPlan{2: {stallAt: 4, stall: 1500 * time.Millisecond}},
		nc: NotifyConfig{History: 4, Replicate: true}}
	got, errs, recs := job.run(t)
	want := ringReference(4, 16, 8)
	for r := range 4 {
		require.NoError(t, errs[r], "rank %d", r)
		require.Equal(t, want[r], got[r], "rank %d", r)
		require.Zero(t, recs[r], "rank %d recovered from a rank that was only slow", r)
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

// A dead incarnation's packets never land once the others have recovered:
// a WRITE it sent on a link that delays it arrives after Recover and is
// refused (without recovery, the control, it lands), and a new connection
// it tries is refused. The others reach the new incarnation through its
// own rendezvous entry, never the dead one's, even when that one points
// somewhere else.
func TestRecoverRefusesDeadIncarnation(t *testing.T) {
	const delay = 1500 * time.Millisecond
	for _, recover := range []bool{false, true} {
		t.Run(fmt.Sprintf("recover=%v", recover), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			comms, err := NewWorld(ctx, 3, &Config{Provider: "udp", CloseTimeout: time.Second})
			require.NoError(t, err)
			wins := make([]*Win, 3)
			var wg sync.WaitGroup
			for r, c := range comms {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var err error
					wins[r], err = c.Allocate(ctx, 64, nil)
					require.NoError(t, err)
				}()
			}
			wg.Wait()
			z, wz := comms[2], wins[2]
			live := comms[:2]
			marker := []byte("deadbeef")
			require.NoError(t, wz.Lock(ctx, LockShared, 0)) // connected, before the link slows
			require.NoError(t, z.dev.SetFaults(-1, verbs.Faults{Delay: delay}))
			t0 := time.Now()
			// A WRITE now (Rput: a plain Put would wait in its pack for a
			// flush), landing in delay, if at all.
			_, err = wz.Rput(ctx, marker, 0, 0)
			require.NoError(t, err)
			if recover {
				z.world.store.Died(2)
				// A stale entry under the first incarnation's key, as a
				// reused port would leave.
				require.NoError(t, z.world.store.Put(ctx, "rvma-cm-2", "127.0.0.1:9"))
				c2, err := respawn(ctx, z)
				require.NoError(t, err)
				live = append(live, c2)
				w2, err := c2.Allocate(ctx, 64, nil)
				require.NoError(t, err)
				for _, c := range []*Comm{comms[0], comms[1], c2} {
					wg.Add(1)
					go func() { defer wg.Done(); require.NoError(t, c.Recover(ctx)) }()
				}
				wg.Wait()
				if time.Since(t0) > delay-500*time.Millisecond {
					t.Skipf("recovery took %v, longer than the link's delay: nothing to check", time.Since(t0))
				}
				// The new incarnation is reached through its own entry.
				require.NoError(t, wins[0].LockAll(ctx))
				require.NoError(t, wins[0].Put(ctx, []byte("newrank2"), 2, 8))
				require.NoError(t, wins[0].UnlockAll(ctx))
				require.Equal(t, []byte("newrank2"), w2.Bytes()[8:16])
				// The dead incarnation cannot connect again.
				err = wz.Put(ctx, marker, 1, 0)
				if err == nil {
					err = wz.Flush(ctx, 1)
				}
				require.Error(t, err)
			}
			time.Sleep(time.Until(t0.Add(delay + time.Second)))
			// Read through the NIC, which placed the WRITE if it came.
			at := func(r int) []byte {
				b := make([]byte, 8)
				require.NoError(t, wins[r].Lock(ctx, LockShared, r))
				require.NoError(t, wins[r].Get(ctx, b, r, 0))
				require.NoError(t, wins[r].Unlock(ctx, r))
				return b
			}
			if recover {
				require.NotEqual(t, marker, at(0), "a WRITE of the dead incarnation landed after recovery")
				require.NotEqual(t, marker, at(1))
			} else {
				require.Equal(t, marker, at(0), "control: the delayed WRITE should land without recovery")
			}
			if recover {
				z.teardown()
			} else {
				require.NoError(t, z.dev.SetFaults(-1, verbs.Faults{}))
				live = comms
			}
			for _, c := range live {
				wg.Add(1)
				go func() { defer wg.Done(); c.Close(ctx) }()
			}
			wg.Wait()
		})
	}
}

func TestAdmit(t *testing.T) {
	c := &Comm{rank: 1, size: 3}
	c.rec.init(c, boot{inc: 2})
	c.rec.incs[0] = 1
	for _, tc := range []struct {
		from      int
		inc, mine uint32
		want      string
	}{
		{0, 1, 2, ""},
		{0, 0, 2, rejectStale},      // a dead incarnation of rank 0
		{0, 2, 2, rejectRecovering}, // rank 0's next one, before this rank agreed on it
		{2, 0, 1, rejectStale},      // dialed this rank's dead incarnation
	} {
		require.Equal(t, tc.want, c.rec.admit(tc.from, tc.inc, tc.mine), "%+v", tc)
	}
}
