// Package progress dispatches the completions of one CQ to the requests
// waiting for them, so that any number of goroutines can wait on requests
// that share a CQ while exactly one of them polls it.
//
// An Engine owns its CQ: nothing else may poll it. Send completions are
// matched to Ops by work-request id; receive completions go, in CQ order,
// to the Config.OnRecv callback of whoever holds the poller role, which
// makes the engine the progress engine of a layer that also reacts to
// incoming messages (rma's active messages).
//
// Two waiting modes. Without a background goroutine a waiter that finds
// the poller role free blocks on the CQ itself, which saves a goroutine
// wake-up per request (the mailbox initiator's latency path). With
// Config.Background a goroutine blocks on the CQ whenever nobody else polls,
// so incoming messages are handled even while the application computes;
// waiters then poll for Config.Spin and sleep until the round they are
// waiting for has been dispatched.
//
// An Engine and its Ops are safe for concurrent use. OnDone callbacks,
// Wait conditions and Locked functions run under the engine's lock and
// must not call its other methods (but FinishLocked); OnRecv runs without
// it and must not wait for an Op. Built with -tags rvmadebug, the engine
// panics where one of these rules is broken, instead of deadlocking.
package progress

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/rvma/rvma/internal/lockcheck"
	"github.com/rvma/rvma/internal/spin"
	"github.com/rvma/rvma/verbs"
)

// Config configures New. The zero value means defaults.
type Config struct {
	// OnRecv handles a receive completion. It runs in the goroutine that
	// holds the poller role, one completion at a time in CQ order, without
	// the engine's lock: it may start and finish Ops and post work, but must
	// not wait for an Op.
	OnRecv func(wc *verbs.WorkCompletion)
	// AfterPoll runs in the poller after each poll that took completions,
	// after OnRecv, under the same rules: completions free send queue
	// slots, so work that could not be posted before may go now.
	AfterPoll func()
	// Background starts a goroutine that polls the CQ while no waiter does.
	Background bool
	// Spin is how long a waiter polls before it sleeps, in Background mode.
	// Default 20µs; negative: do not spin.
	Spin time.Duration
	// Err maps a failed send completion to an error. Default: wc.Err().
	Err func(wc *verbs.WorkCompletion) error
}

// Engine is the progress engine of one CQ.
type Engine struct {
	// Immutable after New: read without a lock.
	cq   *verbs.CQ
	cfg  Config
	spin time.Duration
	stop chan struct{} // closed by Close
	done chan struct{} // closed when the background goroutine has returned
	// finished is the Op that Done returns.
	finished *Op

	// poller is the poller role: the goroutine that swaps it from false
	// to true polls the CQ and runs OnRecv, alone, until it stores false.
	// wcs is owned by the holder of the role.
	poller atomic.Bool
	wcs    []verbs.WorkCompletion
	// inCallback is set while the holder of the poller role runs OnRecv
	// or AfterPoll (see Drain).
	inCallback atomic.Bool

	// mu guards the fields below, every Op's left, done and err, and the
	// callers' state that OnDone callbacks, Wait conditions and Locked
	// functions touch (rma keeps its windows' counters there). Those run
	// under mu, so they must not call the engine's methods that take it
	// (Start, Posted, Finish, Wake, Locked, Wait, Progress, Test, Err):
	// FinishLocked is theirs. mu is not held while the CQ is polled or
	// OnRecv runs. Under -tags rvmadebug, taking it again in the
	// goroutine that holds it panics (see internal/lockcheck).
	mu    lockcheck.Mutex[engineLocks]
	next  uint64
	ops   map[uint64]*Op
	round chan struct{} // closed, and replaced, when waiters should look again
	// sleepers says that a waiter may sleep on round: only then does a
	// round's end close it and make the next (an allocation per finished
	// Op otherwise).
	sleepers bool
	// dispatching is set while poll finishes Ops: a round that ends
	// otherwise (Finish, Posted, Wake from another goroutine) wakes, in
	// direct mode, a waiter blocked on the CQ for the engine.
	dispatching bool
}

// engineLocks is the lock class of engines' mu (see internal/lockcheck).
type engineLocks struct{}

func (engineLocks) LockClass() string { return "a progress engine's mu" }

// inOnRecv marks a goroutine running an engine's OnRecv, which must not
// wait for an Op (it holds the poller role that would finish it).
type inOnRecv struct{}

func (inOnRecv) LockClass() string { return "a progress engine's OnRecv (the poller role)" }

// Done returns an Op that has finished without error: the Op of every
// operation that completed in the call that started it.
func (e *Engine) Done() *Op { return e.finished }

// Op is a request of one or more work requests in flight.
type Op struct {
	// Immutable after Start.
	e      *Engine
	onDone func(error)
	tr     Tracker

	// Guarded by e.mu.
	left int
	done bool
	err  error
}

// New returns an engine for cq.
func New(cq *verbs.CQ, cfg Config) *Engine {
	e := &Engine{cq: cq, cfg: cfg, spin: cfg.Spin, ops: map[uint64]*Op{}, round: make(chan struct{}),
		wcs: make([]verbs.WorkCompletion, 64), stop: make(chan struct{}), done: make(chan struct{})}
	e.finished = &Op{e: e, done: true}
	if e.spin == 0 {
		e.spin = spin.Or(20 * time.Microsecond)
	}
	if e.cfg.Err == nil {
		e.cfg.Err = func(wc *verbs.WorkCompletion) error { return wc.Err() }
	}
	if cfg.Background {
		go e.background()
	} else {
		close(e.done)
	}
	return e
}

// Close stops the background goroutine; Ops still in flight stay pending.
func (e *Engine) Close() {
	select {
	case <-e.stop:
	default:
		close(e.stop)
	}
	<-e.done
}

// Tracker is what StartOp's caller is told of its Op, under the engine's
// lock: Started when it is registered, Finished with its error when it
// finishes. An interface rather than a function, so that an Op embedded
// in the caller's record needs no closure.
type Tracker interface {
	Started()
	Finished(error)
}

// StartOp is Start for an Op the caller owns (zero, or finished and no
// longer referenced), typically embedded in its own record: one
// allocation, or none where the caller reuses its records. tr, if not
// nil, is told of the Op.
func (e *Engine) StartOp(op *Op, n int, tr Tracker) uint64 {
	*op = Op{e: e, left: n, tr: tr}
	e.mu.Lock()
	if tr != nil {
		tr.Started()
	}
	base := e.next + 1
	e.next += uint64(max(n, 1))
	for i := range n {
		e.ops[base+uint64(i)] = op
	}
	e.mu.Unlock()
	return base
}

// Start registers an Op of n work requests (n >= 0) and returns the id of
// the first; the others are id+1..id+n-1. onDone, if not nil, runs under the
// engine's lock when the Op finishes, with its error. An Op with n == 0 is
// finished by Finish.
func (e *Engine) Start(n int, onDone func(error)) (*Op, uint64) {
	op := &Op{e: e, left: n, onDone: onDone}
	e.mu.Lock()
	base := e.next + 1
	e.next += uint64(max(n, 1))
	for i := range n {
		e.ops[base+uint64(i)] = op
	}
	e.mu.Unlock()
	return op, base
}

// Posted reports that only the first k of the Op's work requests were
// posted (a partial PostSend), and finishes it with err if none are left.
func (e *Engine) Posted(op *Op, base uint64, n, k int, err error) {
	e.mu.Lock()
	for i := k; i < n; i++ {
		delete(e.ops, base+uint64(i))
	}
	op.left -= n - k
	if op.err == nil {
		op.err = err
	}
	if op.left <= 0 {
		e.finishLocked(op, op.err)
	}
	e.mu.Unlock()
}

// Finish finishes an Op from outside the CQ (a reply message, a post that
// failed in another goroutine). In direct mode it wakes the waiter that
// blocks on the CQ for the engine, which would otherwise not see it until
// the CQ next delivers something.
func (e *Engine) Finish(op *Op, err error) {
	e.mu.Lock()
	e.finishLocked(op, err)
	e.mu.Unlock()
}

// FinishLocked is Finish for callers that hold the engine's lock (OnDone
// callbacks, Locked functions).
func (e *Engine) FinishLocked(op *Op, err error) {
	lockcheck.AssertHeld(&e.mu, "progress: FinishLocked")
	e.finishLocked(op, err)
}

func (e *Engine) finishLocked(op *Op, err error) {
	if op.done {
		return
	}
	op.done = true
	if op.err == nil {
		op.err = err
	}
	if op.onDone != nil {
		op.onDone(op.err)
	}
	if op.tr != nil {
		op.tr.Finished(op.err)
	}
	e.nextRound()
}

// nextRound wakes the waiters of the current round; e.mu is held.
func (e *Engine) nextRound() {
	if !e.cfg.Background && !e.dispatching {
		// Not the poller's doing: in direct mode the poller may block on
		// the CQ with its condition read before this, and only the CQ
		// wakes it.
		e.cq.Wake()
	}
	e.wakeSleepers()
}

// wakeSleepers wakes the waiters asleep on the current round; e.mu is
// held.
func (e *Engine) wakeSleepers() {
	lockcheck.AssertHeld(&e.mu, "progress: a round ends")
	if !e.sleepers {
		return // nobody sleeps on round: spinning waiters look again anyway
	}
	close(e.round)
	e.round = make(chan struct{})
	e.sleepers = false
}

// Locked runs f under the engine's lock, for state that OnDone callbacks
// update.
func (e *Engine) Locked(f func()) {
	e.mu.Lock()
	f()
	e.mu.Unlock()
}

// AssertLocked panics, in a build with -tags rvmadebug, unless the calling
// goroutine holds the engine's lock; rule names what needs it. Otherwise
// it does nothing.
func (e *Engine) AssertLocked(rule string) { lockcheck.AssertHeld(&e.mu, rule) }

// AssertUnlocked panics, in a build with -tags rvmadebug, if the calling
// goroutine holds the engine's lock; rule names what must not run under
// it. Otherwise it does nothing.
func (e *Engine) AssertUnlocked(rule string) { lockcheck.AssertNotHolding(&e.mu, rule) }

// Wake wakes the waiters so that they re-evaluate their conditions, after
// the caller changed state they wait on.
func (e *Engine) Wake() {
	e.mu.Lock()
	e.nextRound()
	e.mu.Unlock()
}

// wakeAsleep is Wake for the poller itself, which needs no CQ wake-up:
// it wakes the waiters asleep on the round only.
func (e *Engine) wakeAsleep() {
	e.mu.Lock()
	e.wakeSleepers()
	e.mu.Unlock()
}

// poll takes what the CQ holds and dispatches it; the caller holds the
// poller role. It reports how many completions it took.
func (e *Engine) poll() (int, error) {
	n, err := e.cq.Poll(e.wcs)
	if n == 0 {
		return 0, err
	}
	recv := false
	e.mu.Lock()
	e.dispatching = true
	for i := range e.wcs[:n] {
		wc := &e.wcs[i]
		if wc.Opcode >= verbs.WCRecv {
			recv = true
			continue
		}
		op := e.ops[wc.WRID]
		if op == nil {
			continue
		}
		delete(e.ops, wc.WRID)
		if wc.Status != verbs.StatusSuccess && op.err == nil {
			op.err = e.cfg.Err(wc)
		}
		op.left--
		if op.left == 0 {
			e.finishLocked(op, nil)
		}
	}
	e.dispatching = false
	e.mu.Unlock()
	recv = recv && e.cfg.OnRecv != nil
	if recv || e.cfg.AfterPoll != nil {
		e.inCallback.Store(true)
		defer e.inCallback.Store(false) // also when OnRecv panics
		if lockcheck.Enabled {
			lockcheck.Enter[inOnRecv]()
			defer lockcheck.Exit[inOnRecv]()
		}
	}
	if recv {
		for i := range e.wcs[:n] {
			if e.wcs[i].Opcode >= verbs.WCRecv {
				e.cfg.OnRecv(&e.wcs[i])
			}
		}
		// The handler changed state that waiters' conditions read.
		// (Finished Ops have advanced the round already.) The poller,
		// this goroutine, looks again anyway.
		e.wakeAsleep()
	}
	if e.cfg.AfterPoll != nil {
		e.cfg.AfterPoll()
	}
	return n, err
}

// Progress polls once if no other goroutine is polling, and reports
// whether it took completions.
func (e *Engine) Progress() (bool, error) {
	if !e.poller.CompareAndSwap(false, true) {
		return false, nil
	}
	n, err := e.poll()
	e.letGo()
	return n > 0, err
}

// Drain polls until the CQ holds at most limit completions, so that a
// caller posting many signalled requests does not overrun it. Where
// another goroutine holds the poller role it waits for that one to take
// them (a poll at a time, it may fall behind a poster), unless that one
// runs OnRecv or AfterPoll: it may be the caller itself, or wait for what
// the caller holds, so Drain returns and the CQ may stay above limit.
func (e *Engine) Drain(limit int) error {
	for i := 0; e.cq.Len() > limit; i++ {
		took, err := e.Progress()
		if err != nil {
			return err
		}
		if !took {
			if e.inCallback.Load() {
				return nil
			}
			spin.Pause(i)
		}
	}
	return nil
}

// letGo gives the poller role up. In direct mode it wakes the waiters: one
// that found the role taken may have gone to sleep meanwhile, and with no
// background poller it would sleep with nobody polling; one of them takes
// the role.
func (e *Engine) letGo() {
	e.poller.Store(false)
	if !e.cfg.Background {
		e.wakeAsleep()
	}
}

// Wait blocks until cond (evaluated under the engine's lock) holds, or ctx
// ends, driving the CQ meanwhile. Once cond returns true Wait returns
// without evaluating it again, so cond may consume what it found.
func (e *Engine) Wait(ctx context.Context, cond func() bool) error {
	lockcheck.AssertNotHeld[inOnRecv]("progress: Wait called from an OnRecv: the poller would wait for itself")
	var spinUntil time.Time
	for i := 0; ; i++ {
		e.mu.Lock()
		ok, round := cond(), e.round
		e.mu.Unlock()
		if ok {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if waitHook != nil {
			waitHook(e, beforeRole)
		}
		if e.poller.CompareAndSwap(false, true) {
			n, err := e.poll()
			met := false
			if err == nil && n == 0 && !e.cfg.Background {
				// Nobody else polls: block on the CQ ourselves. Not if the
				// condition holds: the poller this one took the role from
				// may have met it after it was last looked at, and nothing
				// more may ever arrive on the CQ.
				if met = e.holds(cond); !met {
					err = e.cq.Wait(ctx)
					if err == nil {
						_, err = e.poll()
					}
				}
			}
			e.letGo()
			if err != nil {
				if e.cfg.Background {
					e.Wake()
				}
				return err
			}
			if met {
				// Return now: a condition may take what it found (a
				// message, a buffer), so it is not evaluated again.
				return nil
			}
			if n > 0 || !e.cfg.Background {
				continue
			}
		}
		if e.cfg.Background && e.spin > 0 {
			if spinUntil.IsZero() {
				spinUntil = time.Now().Add(e.spin)
			}
			if i&15 != 15 || time.Now().Before(spinUntil) {
				spin.Pause(i)
				continue
			}
		}
		// About to sleep: look once more, and say so under the lock, so
		// that the next round's end closes the channel slept on.
		if waitHook != nil {
			waitHook(e, beforeSleep)
		}
		e.mu.Lock()
		ok = cond()
		if !ok {
			e.sleepers = true
			round = e.round
		}
		e.mu.Unlock()
		if ok {
			return nil
		}
		if !e.cfg.Background && !e.poller.Load() {
			// The holder let the role go after this waiter failed to take
			// it, and may have woken the round before this waiter slept
			// on it: with nobody polling, the sleep could last forever.
			// Checked after registering as a sleeper, so a holder that
			// lets go later wakes this round (see Progress and Wait).
			continue
		}
		select {
		case <-round:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// waitHook, set by tests only, runs at the points of Wait where another
// goroutine's move opened a lost wake-up before.
var waitHook func(e *Engine, at waitPoint)

type waitPoint int

const (
	beforeRole  waitPoint = iota // the condition was false; the role not tried yet
	beforeSleep                  // the role was taken by another; not registered as a sleeper yet
)

// holds evaluates cond under the engine's lock.
func (e *Engine) holds(cond func() bool) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return cond()
}

// Wait blocks until the Op finishes or ctx ends, and returns its error.
func (op *Op) Wait(ctx context.Context) error {
	if err := op.e.Wait(ctx, func() bool { return op.done }); err != nil {
		return err
	}
	return op.Err()
}

// Test reports whether the Op has finished, and its error; it polls the CQ
// if nobody else does.
func (op *Op) Test() (bool, error) {
	_, perr := op.e.Progress()
	op.e.mu.Lock()
	defer op.e.mu.Unlock()
	if op.done {
		return true, op.err
	}
	return false, perr
}

// Err returns the Op's error once it has finished.
func (op *Op) Err() error {
	op.e.mu.Lock()
	defer op.e.mu.Unlock()
	return op.err
}

// spinAfter keeps polling for the spin time after the background
// goroutine found work: a request answered now (an active message, a
// message of a collective) is often followed by the next within
// microseconds, and a goroutine woken from the CQ's channel costs tens of
// them. It returns the poll's error, or nil once the spin time passes
// without work, or a waiter takes the poller role.
func (e *Engine) spinAfter() error {
	if e.spin <= 0 {
		return nil
	}
	last, idle := time.Now(), 0
	for i := 0; ; i++ {
		select {
		case <-e.stop:
			return nil
		default:
		}
		if !e.poller.CompareAndSwap(false, true) {
			return nil // a waiter polls
		}
		n, err := e.poll()
		e.poller.Store(false)
		if err != nil {
			return err
		}
		if n > 0 {
			last, idle = time.Now(), 0
		} else if idle++; idle >= spinRounds || i&15 == 15 && time.Since(last) > e.spin {
			// The rounds bound it where the clock does not move while
			// goroutines run (testing/synctest's bubbles).
			return nil
		}
		spin.Pause(i)
	}
}

// spinRounds bounds spinAfter's empty polls in a row, whatever the clock.
const spinRounds = 1 << 12

func (e *Engine) background() {
	defer close(e.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-e.stop
		cancel()
	}()
	for {
		if err := e.cq.Wait(ctx); err != nil {
			return
		}
		if e.poller.CompareAndSwap(false, true) {
			n, err := e.poll()
			e.poller.Store(false)
			if err != nil {
				return
			}
			if n > 0 && e.spinAfter() != nil {
				return
			}
			continue
		}
		// A waiter holds the poller role. In Background mode it never
		// blocks while holding it, so wait for it to let go and look
		// again: it may have polled just before this completion arrived
		// and be about to sleep, and then nobody else would take it.
		for i := 0; e.poller.Load(); i++ {
			select {
			case <-e.stop:
				return
			default:
				spin.Pause(i)
			}
		}
	}
}
