package rma

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rvma/rvma/internal/kvs"
	"github.com/rvma/rvma/verbs"
)

// Recovery from a rank's death (rvmarun --restart): the launcher respawns
// the rank as a new incarnation, which publishes itself in the
// rendezvous under keys of its own and calls Recover; the survivors' waits
// fail with ErrPeer (the launcher tells every rank of a death at once,
// through the rendezvous), and they call Recover too. Recover:
//
//  1. joins a round of the rendezvous (kvs.Recoverer), which decides the
//     membership alone: the launcher sees deaths first, and a rank that
//     dies during the round is replaced by its next incarnation, never
//     counted. Each rank brings what it can restore: the epochs of each
//     notified window it retains, and those of its ward's replicas.
//  2. drops every connection to a rank whose incarnation changed (its
//     QP flushed and destroyed, so nothing of the dead incarnation lands
//     any more), and every broken one; waits out its own operations.
//  3. computes, from the one view every rank got, the epoch each notified
//     window rewinds to: the latest every rank retains (a respawned rank
//     through its buddy's replica), and agrees on the windows' layout
//     again (a respawned rank's memory is new).
//  4. restores: survivors rewind, a respawned rank reads its window from
//     its buddy; then replicas are made again where a buddy is new.
//
// Collective and synchronisation messages carry the round's generation
// (modulo 16), so that those of an interrupted collective are dropped.

// ErrLost reports state that no rank retains: a respawned rank whose
// buddy died with it, or a window without replicas.
var ErrLost = errors.New("rma: state of a dead rank lost")

// ErrFinished reports that Recover found a rank of the job finished (it
// exited with success): there is no job left to recover into.
var ErrFinished = errors.New("rma: the job has finished")

// ErrNoRecovery reports that the launcher cannot respawn ranks: Recover
// needs rvmarun (with --restart) or an in-process world.
var ErrNoRecovery = errors.New("rma: recovery not supported by this launcher")

// testHook, set by tests only, runs at points of Recover ("joined",
// "restored") to make a rank die there.
var testHook func(c *Comm, phase string)

// recovery is a Comm's recovery state.
type recovery struct {
	c              *Comm
	store, watcher kvs.Recoverer // nil: no recovery
	gen            atomic.Uint32 // the last round applied, as tags carry it (modulo 16)
	fresh          atomic.Bool   // a respawned rank that has not recovered yet
	seen           atomic.Uint64 // faults the watcher has seen
	stopWatch      context.CancelFunc
	wg             sync.WaitGroup

	// mu guards the fields below.
	mu     sync.Mutex
	stats  RecoveryStats
	incs   []uint32        // each rank's incarnation, as last agreed
	ack    uint64          // faults up to here are recovered from
	fault  context.Context // ends at the first fault after ack
	cancel context.CancelCauseFunc
	merged *merged // the last context interruptible made, kept for the next wait with the same one
}

// merged is a context that ends with outer or with fault, shared by the
// waits in flight that asked for it (refs, under recovery.mu): a program
// waits with the same context again and again, and making one per wait
// would allocate per operation.
type merged struct {
	outer, fault context.Context
	ctx          context.Context
	cancel       context.CancelCauseFunc
	stop         func() bool
	refs         int
}

func (m *merged) release() {
	m.stop()
	m.cancel(nil)
}

func (r *recovery) init(c *Comm, b boot) {
	r.c, r.store, r.watcher = c, b.recover, b.watch
	r.incs = make([]uint32, c.size)
	r.incs[c.rank] = b.inc
	r.fresh.Store(b.inc > 0)
	r.fault, r.cancel = context.WithCancelCause(context.Background())
	if b.inc > 0 {
		r.cancel(opErr("recover", c.rank, fmt.Errorf("%w: this rank was respawned (incarnation %d): call Recover", ErrPeer, b.inc)))
	}
}

// start runs the watcher, once the Comm is set up.
func (r *recovery) start() {
	if r.watcher == nil || r.c.size == 1 {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.stopWatch = cancel
	r.wg.Add(1)
	go r.watch(ctx)
}

func (r *recovery) stop() {
	// Waits interrupted by faults end with the Comm too.
	r.mu.Lock()
	r.cancel(opErr("wait", -1, ErrClosed))
	r.mu.Unlock()
	if r.stopWatch != nil {
		r.stopWatch()
		if cl, ok := r.watcher.(*kvs.Client); ok {
			cl.Close()
		}
		r.wg.Wait()
	}
}

// watch waits for faults the launcher announces: a death (the dead
// rank's connection is given up at once, failing what waits on it) or a
// round opened by another rank; either interrupts this rank's waits.
func (r *recovery) watch(ctx context.Context) {
	defer r.wg.Done()
	var since uint64
	for {
		f, err := r.watcher.Faults(ctx, since)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, kvs.ErrClosed) {
				r.c.cfg.Logger.Debug("rma: fault watch ended", "rank", r.c.rank, "err", err)
			}
			return
		}
		since = f.N
		r.seen.Store(f.N)
		dead := -1
		// Ranks whose incarnation we are connected to is gone: dead now,
		// or already respawned (one answer may hold both the death and
		// the respawn).
		type gone struct {
			rank int
			inc  uint32
		}
		var lost []gone
		r.mu.Lock()
		for i := range f.Inc {
			if i != r.c.rank && (f.Dead[i] || f.Inc[i] != r.incs[i]) {
				if dead < 0 {
					dead = i
				}
				lost = append(lost, gone{i, r.incs[i]})
			}
		}
		if f.N > r.ack {
			cause := fmt.Errorf("%w: a rank is recovering", ErrPeer)
			if dead >= 0 {
				cause = opErr("wait", dead, fmt.Errorf("%w: rank %d died", ErrPeer, dead))
			}
			r.cancel(cause)
		}
		r.mu.Unlock()
		for _, g := range lost {
			r.c.breakPeer(g.rank, g.inc)
		}
	}
}

// incOf is rank's incarnation as last agreed.
func (r *recovery) incOf(rank int) uint32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.incs[rank]
}

// admit checks a dialer's incarnations: its own against what this rank
// last agreed, and the one it believes this rank is against this one's.
func (r *recovery) admit(rank int, inc, mine uint32) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case mine != r.incs[r.c.rank]:
		return rejectStale // it dialed a dead incarnation's address
	case inc < r.incs[rank]:
		return rejectStale
	case inc > r.incs[rank]:
		return rejectRecovering // this rank has not applied the round yet
	}
	return ""
}

// interruptible returns ctx that also ends at the next fault the launcher
// announces, and what turns the error the wait returned into the fault's
// ErrPeer when the fault ended it; end releases it. A context that never
// ends (Background) is replaced by the fault's own, and one merged with
// the fault is kept for the next wait with the same context: nothing is
// allocated per wait.
func (c *Comm) interruptible(ctx context.Context) (context.Context, interrupt) {
	r := &c.rec
	if r.store == nil {
		return ctx, interrupt{}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	fault := r.fault
	in := interrupt{r: r, outer: ctx, fault: fault}
	if ctx.Done() == nil {
		return fault, in
	}
	if m := r.merged; m != nil && m.outer == ctx && m.fault == fault {
		m.refs++
		in.m = m
		return m.ctx, in
	}
	m := &merged{outer: ctx, fault: fault, refs: 1}
	m.ctx, m.cancel = context.WithCancelCause(ctx)
	m.stop = context.AfterFunc(fault, func() { m.cancel(context.Cause(fault)) })
	if old := r.merged; old == nil || old.refs == 0 {
		if old != nil {
			old.release()
		}
		r.merged = m // kept for the next wait
	}
	in.m = m
	return m.ctx, in
}

// interrupt is what interruptible returns besides the context.
type interrupt struct {
	r            *recovery
	outer, fault context.Context // nil fault: no recovery
	m            *merged         // the merged context, if one was needed
}

// err is the fault's ErrPeer if the fault ended the wait, else err.
func (in interrupt) err(err error) error {
	if err != nil && in.fault != nil && in.outer.Err() == nil && in.fault.Err() != nil {
		return context.Cause(in.fault)
	}
	return err
}

// end releases the merged context, unless it is kept for the next wait.
func (in interrupt) end() {
	if in.m == nil {
		return
	}
	in.r.mu.Lock()
	defer in.r.mu.Unlock()
	in.m.refs--
	if in.m.refs == 0 && in.r.merged != in.m {
		in.m.release()
	}
}

// usable refuses operations of a respawned rank before Recover: its
// windows are not connected to the others' yet.
func (c *Comm) usable(op string) error {
	if c.rec.fresh.Load() {
		return opErr(op, -1, fmt.Errorf("%w: a respawned rank (incarnation %d) must call Recover first", ErrSync, c.inc))
	}
	return nil
}

// Incarnation returns this process's incarnation of its rank: 0, or how
// many times the launcher respawned the rank.
func (c *Comm) Incarnation() uint32 { return c.inc }

// Restarted reports whether this process is a respawned rank that has not
// called Recover yet: its windows are created but not connected to the
// others' until Recover restores them.
func (c *Comm) Restarted() bool { return c.rec.fresh.Load() }

// breakPeer gives up rank r's connection to incarnation inc (any, if
// anyInc): its work requests complete as flushed (ErrPeer), and so do the
// active messages waiting for its reply.
func (c *Comm) breakPeer(r int, inc uint32) {
	p := c.peers[r]
	p.mu.Lock()
	qp := p.qp
	if qp != nil && inc != anyInc && p.inc != inc {
		qp = nil // a connection to a later incarnation: news of the death came late
	}
	p.mu.Unlock()
	if qp != nil {
		qp.SetError()
		c.failAMs(r)
	}
}

const anyInc = ^uint32(0)

// failAMs finishes the active messages towards r still waiting for a
// reply: a dead rank never sends it.
func (c *Comm) failAMs(r int) {
	var after []*amCall
	err := opErr("active message", r, fmt.Errorf("%w: the connection was given up", ErrPeer))
	c.eng.Locked(func() {
		for _, call := range c.msg.am {
			if call.req != nil && call.req.rank == r {
				c.msg.dropAM(call)
				c.eng.FinishLocked(call.req.op, err)
				if call.after != nil {
					after = append(after, call)
				}
			}
		}
	})
	for _, call := range after {
		go call.after(err)
	}
}

// dropPeer forgets rank r's connection, so that the next operation
// towards r connects again (to the incarnation last agreed).
func (c *Comm) dropPeer(r int) {
	c.breakPeer(r, anyInc) // active messages travel on the QP: none without one
	p := c.peers[r]
	p.mu.Lock()
	qp := p.qp
	if qp != nil || p.err != nil {
		p.qp, p.err = nil, nil
		p.ready = make(chan struct{})
	}
	p.mu.Unlock()
	if qp != nil {
		c.dropQP(qp)
	}
	p.closePath()
	p.closeHaul()
	c.hostMu.Lock()
	delete(c.hosts, r)
	c.hostMu.Unlock()
}

// Recover brings the job back after a rank died (see the package
// documentation for the loop around it). It is collective over every
// rank: the survivors, which call it when an operation or wait failed
// with ErrPeer, and the dead rank's new incarnation, which calls it after
// creating its windows as the first incarnation did. It returns once
// every notified window with History is back at the latest epoch that
// every rank retains (Win.Epoch says which), every window's layout is
// agreed again, and every rank may compute again. A rank that dies
// during Recover makes it start over, with its next incarnation. ErrLost
// means a rank's state is lost (a respawned rank and its buddy died
// together, or a window without replicas); ErrNotRetained that no epoch
// is retained by every rank: then the job cannot go on.
func (c *Comm) Recover(ctx context.Context) error {
	if c.rec.store == nil {
		return opErr("recover", -1, ErrNoRecovery)
	}
	if c.closed() {
		return opErr("recover", -1, ErrClosed)
	}
	// A respawned rank's words are new, and messages carry the recovery's
	// generation: barriers go over messages from now on, on every rank.
	c.hb.disable()
	c.recovered.Store(true) // and so do post, start, complete and wait
	t0 := time.Now()
	var st RecoveryStats
	for {
		st.Rounds++
		err := c.recoverOnce(ctx, &st)
		if err == nil || ctx.Err() != nil || !errors.Is(err, ErrPeer) {
			if err == nil {
				st.Total = time.Since(t0)
				c.rec.mu.Lock()
				c.rec.stats = st
				c.rec.mu.Unlock()
			}
			return err
		}
		c.cfg.Logger.Info("rma: recovery interrupted; starting over", "rank", c.rank, "err", err)
	}
}

// RecoveryStats is where the last successful Recover spent its time
// (the last round's phases, when a death made it start over).
type RecoveryStats struct {
	Rounds    int           // rounds joined (more than 1: a rank died during recovery)
	Agree     time.Duration // the round: until every rank's current incarnation had joined
	Quiet     time.Duration // giving up connections, waiting out this rank's operations
	Reconnect time.Duration // the barrier that connects to new incarnations
	Exchange  time.Duration // agreeing on the windows' layout and replicas again
	Restore   time.Duration // rewinding, or reading the window from the buddy
	Total     time.Duration
}

// RecoveryStats returns the phases of the last Recover that succeeded.
func (c *Comm) RecoveryStats() RecoveryStats {
	c.rec.mu.Lock()
	defer c.rec.mu.Unlock()
	return c.rec.stats
}

func (c *Comm) recoverOnce(ctx context.Context, st *RecoveryStats) error {
	r := &c.rec
	wins := c.liveWins()
	t := time.Now()
	phase := func(d *time.Duration) {
		now := time.Now()
		*d, t = now.Sub(t), now
	}
	view, err := r.store.Join(ctx, c.rank, c.inc, c.retained(wins))
	phase(&st.Agree)
	if err != nil {
		if errors.Is(err, kvs.ErrStale) {
			return opErr("recover", c.rank, fmt.Errorf("%w: the launcher counts this incarnation dead: %w", ErrClosed, err))
		}
		if errors.Is(err, kvs.ErrFinished) {
			return opErr("recover", -1, fmt.Errorf("%w: %w", ErrFinished, err))
		}
		return opErr("recover", -1, err)
	}
	if len(view.Inc) != c.size {
		return opErr("recover", -1, fmt.Errorf("%w: a view of %d ranks", ErrBootstrap, len(view.Inc)))
	}
	plan, planErr := c.plan(view, wins)
	if testHook != nil {
		testHook(c, "joined")
	}

	// Connections to incarnations that died, and broken ones, go; the
	// next operation towards such a rank connects to its current one.
	r.mu.Lock()
	changed := make([]bool, c.size)
	for i := range c.size {
		changed[i] = i != c.rank && view.Inc[i] != r.incs[i]
	}
	copy(r.incs, view.Inc)
	r.mu.Unlock()
	for i := range c.size {
		if changed[i] || (i != c.rank && c.broken(i)) {
			c.dropPeer(i)
		}
	}
	// Collectives start counting again, in the round's generation (a
	// respawned rank's count starts at 0, and survivors may have been
	// interrupted in different ones).
	r.gen.Store(uint32(view.Gen))
	c.collSeq.Store(0)
	c.purgeStale()
	for _, w := range wins {
		w.quiet(ctx, changed)
	}
	// Faults up to the view's are what this round recovers from; one
	// the watcher saw since interrupts at once.
	r.mu.Lock()
	r.ack = view.Faults
	r.fault, r.cancel = context.WithCancelCause(context.Background())
	if r.seen.Load() > view.Faults {
		r.cancel(fmt.Errorf("%w: a rank failed during recovery", ErrPeer))
	}
	r.mu.Unlock()

	phase(&st.Quiet)
	if planErr != nil {
		// Every rank computed the same error from the same view.
		return opErr("recover", -1, planErr)
	}
	// Everything this rank had in flight is done: nothing of before
	// lands after the others restore.
	if err := c.Barrier(ctx); err != nil {
		return opErr("recover", -1, err)
	}
	phase(&st.Reconnect)
	for _, w := range wins {
		if err := w.rejoin(ctx, changed); err != nil {
			return opErr("recover", -1, err)
		}
	}
	phase(&st.Exchange)
	for i, w := range wins {
		if err := w.restore(ctx, plan[i], changed); err != nil {
			return opErr("recover", -1, err)
		}
	}
	if testHook != nil {
		testHook(c, "restored")
	}
	if err := c.Barrier(ctx); err != nil {
		return opErr("recover", -1, err)
	}
	phase(&st.Restore)
	r.fresh.Store(false)
	return nil
}

// liveWins are the Comm's windows in creation order.
func (c *Comm) liveWins() []*Win {
	c.winMu.Lock()
	defer c.winMu.Unlock()
	ws := make([]*Win, 0, len(c.wins))
	for _, w := range c.wins {
		ws = append(ws, w)
	}
	slices.SortFunc(ws, func(a, b *Win) int { return int(a.id) - int(b.id) })
	return ws
}

// purgeStale drops collective and synchronisation messages of a round
// before the current one (they may have arrived for a collective that
// the failure interrupted).
func (c *Comm) purgeStale() {
	c.eng.Locked(func() {
		for k := range c.msg.inbox {
			if c.staleTag(k.tag) {
				delete(c.msg.inbox, k)
			}
		}
	})
}

// The generation bits of internal tags: collectives (bit 31) and window
// synchronisation (bits 31 and 30) carry the recovery round modulo 16 in
// bits 26-29.
const (
	tagGenShift = 26
	tagGenMask  = 0xf
)

func (c *Comm) tagGen() uint32 { return (c.rec.gen.Load() & tagGenMask) << tagGenShift }

// staleTag reports whether an internal message's tag is of an earlier
// round than this rank's; one of the next round (from a rank that
// applied it first) is kept.
func (c *Comm) staleTag(tag uint32) bool {
	if tag&(1<<31) == 0 {
		return false // the application's
	}
	g := (tag >> tagGenShift) & tagGenMask
	behind := (c.rec.gen.Load() - g) & tagGenMask
	return behind != 0 && behind < 8
}

// winRetained is what one rank can restore of one window.
type winRetained struct {
	id   uint32
	kind byte     // 'p' nothing kept, 'h' history, 'r' history and a replica at the buddy
	own  []uint64 // epochs of its own snapshots
	ward []uint64 // epochs of its ward's replicas it holds
}

// retained encodes what this rank can restore, as its value in the round:
// "F" (respawned) or "S", then ";id:kind:own/ward" per window, epochs
// separated by dots.
func (c *Comm) retained(wins []*Win) string {
	var b strings.Builder
	if c.rec.fresh.Load() {
		b.WriteByte('F')
	} else {
		b.WriteByte('S')
	}
	for _, w := range wins {
		wr := w.retained(c.rec.fresh.Load())
		fmt.Fprintf(&b, ";%d:%c:", wr.id, wr.kind)
		for i, e := range wr.own {
			if i > 0 {
				b.WriteByte('.')
			}
			b.WriteString(strconv.FormatUint(e, 10))
		}
		b.WriteByte('/')
		for i, e := range wr.ward {
			if i > 0 {
				b.WriteByte('.')
			}
			b.WriteString(strconv.FormatUint(e, 10))
		}
	}
	return b.String()
}

func parseRetained(s string) (fresh bool, wins []winRetained, err error) {
	parts := strings.Split(s, ";")
	switch parts[0] {
	case "F":
		fresh = true
	case "S":
	default:
		return false, nil, fmt.Errorf("bad recovery value %.40q", s)
	}
	epochs := func(s string) ([]uint64, error) {
		if s == "" {
			return nil, nil
		}
		var es []uint64
		for _, f := range strings.Split(s, ".") {
			e, err := strconv.ParseUint(f, 10, 64)
			if err != nil {
				return nil, err
			}
			es = append(es, e)
		}
		return es, nil
	}
	for _, p := range parts[1:] {
		f := strings.SplitN(p, ":", 3)
		if len(f) != 3 || len(f[1]) != 1 {
			return false, nil, fmt.Errorf("bad window in recovery value %.40q", p)
		}
		id, err := strconv.ParseUint(f[0], 10, 32)
		if err != nil {
			return false, nil, fmt.Errorf("bad window id in recovery value: %w", err)
		}
		own, ward, _ := strings.Cut(f[2], "/")
		wr := winRetained{id: uint32(id), kind: f[1][0]}
		if wr.own, err = epochs(own); err != nil {
			return false, nil, fmt.Errorf("bad epochs in recovery value: %w", err)
		}
		if wr.ward, err = epochs(ward); err != nil {
			return false, nil, fmt.Errorf("bad epochs in recovery value: %w", err)
		}
		wins = append(wins, wr)
	}
	return fresh, wins, nil
}

// plan computes, from the round's view, the epoch each window rewinds to
// (0 for windows without history). Every rank computes the same plan, or
// the same error, from the same view.
func (c *Comm) plan(view kvs.View, wins []*Win) ([]uint64, error) {
	fresh := make([]bool, c.size)
	all := make([][]winRetained, c.size)
	for r, v := range view.Values {
		var err error
		if fresh[r], all[r], err = parseRetained(v); err != nil {
			return nil, opErr("recover", r, fmt.Errorf("%w: %w", ErrDatatype, err))
		}
	}
	for r := range all {
		if len(all[r]) != len(wins) {
			return nil, opErr("recover", r, fmt.Errorf("%w: rank %d has %d windows, rank %d %d: a respawned rank must create the windows the first incarnation had, in the same order",
				ErrSync, r, len(all[r]), c.rank, len(wins)))
		}
	}
	plan := make([]uint64, len(wins))
	for i, w := range wins {
		kind := all[0][i].kind
		for r := range all {
			if wr := all[r][i]; wr.id != w.id || wr.kind != kind {
				return nil, opErr("recover", r, fmt.Errorf("%w: window %d differs between ranks %d and %d (id %d, kind %c against %d, %c)",
					ErrSync, i, r, c.rank, wr.id, wr.kind, w.id, kind))
			}
		}
		if kind == 'p' {
			continue
		}
		var common []uint64
		for r := range all {
			avail := all[r][i].own
			if fresh[r] {
				b := (r + 1) % c.size
				if kind != 'r' || fresh[b] || b == r {
					how := "its window keeps no replica (NotifyConfig.Replicate)"
					if kind == 'r' {
						how = fmt.Sprintf("its buddy, rank %d, died too", b)
					}
					return nil, opErr("recover", r, fmt.Errorf("%w: window %d of rank %d: %s", ErrLost, w.id, r, how))
				}
				avail = all[b][i].ward
			}
			if r == 0 {
				common = slices.Clone(avail)
			} else {
				common = slices.DeleteFunc(common, func(e uint64) bool { return !slices.Contains(avail, e) })
			}
		}
		if len(common) == 0 {
			return nil, opErr("recover", -1, fmt.Errorf("%w: no epoch of window %d is retained by every rank", ErrNotRetained, w.id))
		}
		plan[i] = slices.Max(common)
	}
	return plan, nil
}

// recoverDeadline bounds how long quiet waits for this rank's own
// operations: those towards dead ranks were flushed, the rest complete
// within the RC timeouts.
const recoverDeadline = 30 * time.Second

// quiet ends this rank's traffic on the window: puts waiting for a
// buffer or in a pack are dropped, those in flight complete or fail (towards ranks
// whose connection was dropped, at once), and the synchronisation state
// and failures recorded are forgotten.
func (w *Win) quiet(ctx context.Context, changed []bool) {
	w.resetTx()
	w.dropPacks()
	ctx, cancel := context.WithTimeout(ctx, recoverDeadline)
	defer cancel()
	if !w.c.rec.fresh.Load() {
		// Its error is the failure being recovered from; it may return at
		// the first target that failed, so wait for the rest too: nothing
		// of before may fail after the failures are forgotten.
		w.FlushAll(ctx)
		w.c.eng.Wait(ctx, func() bool { return w.outN.Load() == 0 })
	}
	w.mu.Lock()
	w.fence, w.startGroup, w.postGroup, w.lockAll = false, nil, nil, false
	clear(w.locks)
	w.setAllOK()
	w.mu.Unlock()
	w.unsigMu.Lock()
	for i := range w.unsig {
		w.unsig[i].Store(0)
	}
	w.unsigMu.Unlock()
	w.c.eng.Locked(func() {
		for r := range w.failed {
			w.takeFailed(r)
		}
	})
	w.forgetCarriers(changed)
	for r, ch := range changed {
		if ch && w.direct != nil {
			w.direct[r] = directPeer{}
			if w.syncMap != nil {
				w.syncMap[r] = directPeer{}
			}
		}
		if ch && w.credMap != nil {
			w.credMap[r] = directPeer{}
		}
	}
}

// rejoin agrees on the window's layout again, after every rank has
// quieted: the ranks' descriptions (a respawned rank's memory is new),
// then where each buddy keeps its ward's replicas. Every lock is
// released: no rank holds one across a recovery.
func (w *Win) rejoin(ctx context.Context, changed []bool) error {
	c := w.c
	all, err := c.Allgather(ctx, w.desc)
	if err != nil {
		return err
	}
	remote := make([]remoteWin, c.size)
	for r, b := range all {
		if remote[r], err = decodeWin(b, r, c.rank); err != nil {
			return err
		}
	}
	if w.remote == nil {
		w.remote = remote
		w.direct = make([]directPeer, c.size)
		w.carriers = make([]atomic.Pointer[carrier], c.size)
		if w.notify != nil {
			w.credMap = make([]directPeer, c.size)
		}
		w.packs = make([]putPack, c.size)
		for r := range remote {
			if remote[r].notify == notifyPerOrigin && w.tx == nil {
				w.tx = make([]txState, c.size)
			}
		}
		for r := range w.tx {
			w.tx[r].init(remote[r].depth)
		}
	} else {
		copy(w.remote, remote)
	}
	w.mu.Lock()
	if w.ok == nil {
		w.ok = make([]atomic.Uint32, c.size)
	}
	w.setAllOK()
	w.mu.Unlock()
	w.resetTx()
	atomic.StoreUint64(&w.lockMem[0], 0)
	if w.notify != nil {
		for r, ch := range changed {
			// A new incarnation counts its consumed epochs from 0.
			if ch && w.credits.w != nil {
				atomic.StoreUint64(&w.credits.w[r], 0)
			}
		}
		if err := w.notify.exchangeReplicas(ctx); err != nil {
			return err
		}
	}
	return nil
}

// restore brings a notified window to epoch e: a survivor from its own
// snapshot, a respawned rank from its buddy's replica.
func (w *Win) restore(ctx context.Context, e uint64, changed []bool) error {
	n := w.notify
	if n == nil || n.cfg.History == 0 {
		return nil
	}
	if w.c.rec.fresh.Load() {
		return n.restoreFromBuddy(ctx, e)
	}
	if err := n.rewindTo(e); err != nil {
		return err
	}
	w.resetTx()
	// A buddy that is new has no replica of this rank's window: make one
	// of the epoch restored.
	if b := n.buddy(); b >= 0 && changed[b] {
		n.replicate(n.snaps[len(n.snaps)-1])
	}
	return nil
}

// rdma posts wrs towards rank r and waits for them.
func (c *Comm) rdma(ctx context.Context, r int, wrs []verbs.SendWR) error {
	qp, err := c.conn(ctx, r)
	if err != nil {
		return err
	}
	op, base := c.eng.Start(len(wrs), nil)
	for i := range wrs {
		wrs[i].ID = base + uint64(i)
		wrs[i].Flags |= verbs.FlagSignaled
	}
	k, err := c.post(qp, wrs)
	if err != nil {
		c.eng.Posted(op, base, len(wrs), k, err)
	}
	return op.Wait(ctx)
}
