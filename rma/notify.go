package rma

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/rvma/rvma/internal/lockcheck"
	"github.com/rvma/rvma/mailbox"
)

// NotifyConfig makes a window RVMA-notified: puts into it are mailbox
// puts, and the target learns that an epoch is complete when the bytes (or
// puts) it expects have arrived, with no fence and no extra message. The
// window's memory is the mailbox buffer of every epoch.
type NotifyConfig struct {
	// Expect is the number of bytes (or puts, with Count) that complete an
	// epoch, from all origins together. Puts of a later epoch must not
	// start before every origin's puts of this one have arrived: use
	// ExpectFrom when origins run ahead.
	Expect int
	// ExpectFrom gives the expectation per origin rank instead; each origin
	// has its own mailbox, so an origin that runs an epoch ahead is never
	// counted into the current one. A put from an origin not listed is
	// refused at the call (ErrNoEpoch). An origin may run epochs ahead:
	// puts for an epoch whose buffer the target has not posted yet wait at
	// the origin (Put returns at once) and leave when the target's
	// WaitEpoch posts it, so they never hold back the pair's other
	// traffic. Up to 4096 puts wait so per target; past that a put waits
	// itself, making progress, until the target consumes an epoch, which
	// bounds the origin's memory. So an origin that far ahead must not
	// need the target to act first (say, in a barrier the target enters
	// before it calls WaitEpoch).
	ExpectFrom map[int]int
	// Count is what is counted: mailbox.CountBytes (default) or
	// mailbox.CountOps, where each contiguous run of target bytes of a put
	// counts as one (a contiguous put counts one, a strided one a block).
	Count mailbox.Count
	// Depth is how many epochs are posted ahead, so that puts of the next
	// epoch never wait for the target to repost. Default 2, range 1..64.
	// With Expect (one aggregate mailbox), a put for an epoch beyond them
	// waits in the network until the target reposts, holding back what
	// the origin sends the target after it: keep origins within Depth
	// epochs, or use ExpectFrom.
	Depth int
	// History is how many completed epochs are kept, as copies of the
	// window's memory taken when WaitEpoch returns, for Rewind. Default 0
	// (Rewind then fails); each costs a copy of the window per epoch. A
	// copy holds whatever of the next epoch had already arrived, so an
	// application that rewinds must place consecutive epochs' data in
	// different bytes (double buffering, as halo codes do) or keep origins
	// from running ahead. Placement pauses while the copy is taken.
	History int
	// Every takes a snapshot only every Every epochs (epochs that are
	// multiples of it), for checkpoints at an interval. Default 1.
	Every int
	// Replicate keeps a copy of each snapshot in the memory of a buddy
	// rank (the next rank, modulo the size), written there with RDMA
	// WRITEs after WaitEpoch returns, so that a rank that died and was
	// respawned restores its window from it (Comm.Recover). It needs
	// History >= 1, and costs the buddy History copies of the window.
	Replicate bool
}

const (
	notifyAggregate = 1
	notifyPerOrigin = 2
	notifyOps       = 0x80 // flag in the published mode: the target counts puts, not bytes
)

type notifyState struct {
	// Immutable after newNotify (the mailboxes have their own locks).
	w     *Win
	mode  uint8
	cfg   NotifyConfig
	boxes []*mailbox.Window
	// origins lists the ranks of ExpectFrom, in order: the credits go to
	// them at every epoch (a map's range costs more than the rest).
	origins []int

	// snaps, free and the replica state are owned by the goroutine
	// making the window's synchronisation calls (WaitEpoch, TestEpoch,
	// AbandonEpoch, Rewind, Recover): one at a time, as the package
	// documentation requires.
	snaps []*snapshot // oldest first
	free  []*snapshot // buffers not holding a snapshot
	repl  replicas

	// mu guards the fields below, which origins' credit requests read in
	// the poller. It is taken alone (answers are sent after it is
	// released).
	mu      lockcheck.Mutex[notifyLocks]
	epoch   uint64            // epochs completed and waited for
	total   uint64            // epochs consumed ever, as added to the origins' credit words (rewinds do not lower it)
	credits map[int]creditReq // per origin: a credit request waiting for a buffer
}

// notifyLocks is the lock class of notified windows' mu (see
// internal/lockcheck).
type notifyLocks struct{}

func (notifyLocks) LockClass() string { return "an rma notified window's mu" }

func newNotify(w *Win, cfg NotifyConfig) (*notifyState, error) {
	if cfg.Depth == 0 {
		cfg.Depth = 2
	}
	if cfg.Every == 0 {
		cfg.Every = 1
	}
	if cfg.Depth < 1 || cfg.Depth > 64 || cfg.History < 0 || cfg.Every < 1 || (cfg.Replicate && cfg.History < 1) {
		return nil, fmt.Errorf("%w: notify depth %d, history %d, every %d, replicate %v (replicas need a history)",
			ErrSync, cfg.Depth, cfg.History, cfg.Every, cfg.Replicate)
	}
	n := &notifyState{w: w, cfg: cfg, credits: map[int]creditReq{}}
	if err := n.allocSnapshots(); err != nil {
		return nil, err
	}
	mcfg := mailbox.Config{Count: cfg.Count, Placement: mailbox.Steered, History: 1}
	init := func(origin, expect int) error {
		if expect < 1 {
			return fmt.Errorf("%w: expectation %d from rank %d", ErrSync, expect, origin)
		}
		mcfg.Threshold = expect
		mb, err := w.c.target.Init(mailboxOf(w.id, origin), mcfg)
		if err != nil {
			return err
		}
		n.boxes = append(n.boxes, mb)
		for range cfg.Depth {
			if _, err := mb.Post(w.mem); err != nil {
				return err
			}
		}
		return nil
	}
	var err error
	switch {
	case len(cfg.ExpectFrom) > 0:
		n.mode = notifyPerOrigin
		n.origins = slices.Sorted(maps.Keys(cfg.ExpectFrom))
		for _, o := range n.origins {
			if err = w.c.checkRank("notify", o); err != nil {
				break
			}
			if err = init(o, cfg.ExpectFrom[o]); err != nil {
				break
			}
		}
	default:
		n.mode = notifyAggregate
		err = init(-1, cfg.Expect)
	}
	if err != nil {
		n.close()
		return nil, err
	}
	return n, nil
}

// quiesce runs f while none of the window's mailboxes is placing a put
// (a snapshot must not race with the next epoch's puts).
func (n *notifyState) quiesce(i int, f func()) {
	if i == len(n.boxes) {
		f()
		return
	}
	n.boxes[i].Quiesce(func() { n.quiesce(i+1, f) })
}

func (n *notifyState) close() {
	for _, b := range n.boxes {
		b.Close()
	}
	n.repl.free()
}

func (w *Win) notifyState(op string) (*notifyState, error) {
	if w.notify == nil {
		return nil, opErr(op, -1, fmt.Errorf("%w: not a notified window", ErrSync))
	}
	return w.notify, nil
}

// WaitEpoch waits until this rank's next epoch is complete (every expected
// byte or put has arrived) and returns its number (1 for the first). The
// data is in the window's memory. Only this window's waiters wake.
func (w *Win) WaitEpoch(ctx context.Context) (uint64, error) {
	n, err := w.notifyState("wait_epoch")
	if err != nil {
		return 0, err
	}
	if err := w.c.usable("wait_epoch"); err != nil {
		return 0, err
	}
	ictx, in := w.c.interruptible(ctx)
	defer in.end()
	for _, b := range n.boxes {
		if _, err := b.Wait(ictx); err != nil {
			return 0, opErr("wait_epoch", -1, in.err(err))
		}
	}
	for _, b := range n.boxes {
		if _, err := b.Post(w.mem); err != nil {
			return 0, opErr("wait_epoch", -1, err)
		}
	}
	epoch := n.consumed()
	if n.cfg.History > 0 && epoch%uint64(n.cfg.Every) == 0 {
		if err := n.snapshot(ctx, epoch); err != nil {
			return epoch, opErr("wait_epoch", -1, err)
		}
	}
	return epoch, nil
}

// snapshot retains the window's memory as epoch e's, and replicates it.
func (n *notifyState) snapshot(ctx context.Context, e uint64) error {
	if i := n.find(e); i >= 0 {
		n.free = append(n.free, n.snaps[i])
		n.snaps = slices.Delete(n.snaps, i, i+1)
	}
	s, err := n.takeBuffer(ctx)
	if err != nil {
		return err
	}
	n.quiesce(0, func() { copy(s.mem, n.w.mem) })
	s.epoch = e
	n.snaps = append(n.snaps, s)
	n.replicate(s)
	return nil
}

// Snapshot retains the window's memory now as the current epoch's (epoch
// 0 before the first WaitEpoch), as WaitEpoch does at the end of an
// epoch: call it once the application has initialised the window, so
// that a failure before the first snapshot can rewind to the start.
// Call it when no origin is putting into the window. It needs History.
func (w *Win) Snapshot(ctx context.Context) error {
	n, err := w.notifyState("snapshot")
	if err != nil {
		return err
	}
	if n.cfg.History == 0 {
		return opErr("snapshot", -1, fmt.Errorf("%w: the window keeps no history", ErrNotRetained))
	}
	if err := w.c.usable("snapshot"); err != nil {
		return err
	}
	return opErr("snapshot", -1, n.snapshot(ctx, w.Epoch()))
}

// TestEpoch reports, without blocking, whether the next epoch is complete;
// if so it is consumed as by WaitEpoch.
func (w *Win) TestEpoch() (uint64, bool, error) {
	n, err := w.notifyState("test_epoch")
	if err != nil {
		return 0, false, err
	}
	w.c.dev.Progress()
	for _, b := range n.boxes {
		if b.Pending() == 0 {
			return 0, false, nil
		}
	}
	e, err := w.WaitEpoch(context.Background())
	return e, err == nil, err
}

// Epoch returns the number of epochs completed (and waited for) so far.
func (w *Win) Epoch() uint64 {
	if w.notify == nil {
		return 0
	}
	w.notify.mu.Lock()
	defer w.notify.mu.Unlock()
	return w.notify.epoch
}

// AbandonEpoch discards the current, partial epoch of a notified window:
// whatever arrived for it, and completions not yet waited for, are
// dropped and the counts reset, so that the epoch can be redone from
// scratch. Bytes already placed in the window's memory stay (Rewind
// restores them from a snapshot). Call it when no origin is putting into
// the window. As Rewind, it also resets this rank's standing as an origin
// of the window (see Rewind).
func (w *Win) AbandonEpoch() error {
	n, err := w.notifyState("abandon_epoch")
	if err != nil {
		return err
	}
	if err := n.abandon(); err != nil {
		return err
	}
	n.grant(true)
	w.resetTx()
	return nil
}

func (n *notifyState) abandon() error {
	for _, b := range n.boxes {
		// Completions of epochs nobody waited for go too, so the redo
		// starts from empty mailboxes.
		for {
			if _, ok := b.Poll(); !ok {
				break
			}
		}
		if err := b.Discard(); err != nil && !errors.Is(err, mailbox.ErrNothingToTake) {
			return opErr("abandon_epoch", -1, err)
		}
		for b.Posted() < n.cfg.Depth {
			if _, err := b.Post(n.w.mem); err != nil {
				return opErr("abandon_epoch", -1, err)
			}
		}
	}
	return nil
}

// ErrNotRetained reports a rewind further back than the history holds.
var ErrNotRetained = errors.New("rma: epoch not retained")

// Rewind rolls a notified window back k epochs (k >= 1: 1 is the last
// completed epoch): the current, partial epoch is abandoned (whatever
// arrived for it is discarded, counts reset), and the window's memory is
// restored to what it held when epoch Epoch()-k+1 completed. It returns
// the epoch the window is now at. Call it when no origin is putting into
// the window (after the ranks agreed to rewind, and a barrier); origins
// then redo their puts from that epoch on.
//
// Every rank rewinds (or abandons) its part of the window in that
// protocol, so Rewind also resets where this rank stands as an origin in
// the other ranks' per-origin mailboxes: its next put there first asks
// the target which epoch it is at (one round trip), and puts of its own
// still waiting for a target's buffer are dropped (their requests fail;
// flushes do not report them). Flush before rewinding what must arrive.
func (w *Win) Rewind(k int) (uint64, error) {
	n, err := w.notifyState("rewind")
	if err != nil {
		return 0, err
	}
	n.mu.Lock()
	cur := n.epoch
	n.mu.Unlock()
	if k < 1 || uint64(k) > cur || n.find(cur-uint64(k)+1) < 0 {
		return 0, opErr("rewind", -1, fmt.Errorf("%w: %d epochs back from epoch %d, %s kept", ErrNotRetained, k, cur, n.kept()))
	}
	if err := n.rewindTo(cur - uint64(k) + 1); err != nil {
		return 0, err
	}
	w.resetTx()
	return w.Epoch(), nil
}

// rewindTo abandons the current epoch and restores the snapshot of epoch
// e, which becomes the window's epoch; later snapshots are dropped.
func (n *notifyState) rewindTo(e uint64) error {
	i := n.find(e)
	if i < 0 {
		return opErr("rewind", -1, fmt.Errorf("%w: epoch %d, %s kept", ErrNotRetained, e, n.kept()))
	}
	if err := n.abandon(); err != nil {
		return err
	}
	snap := n.snaps[i]
	n.quiesce(0, func() { copy(n.w.mem, snap.mem) })
	n.free = append(n.free, n.snaps[i+1:]...)
	n.snaps = n.snaps[:i+1]
	n.mu.Lock()
	n.epoch = e
	n.mu.Unlock()
	n.grant(true)
	return nil
}

// find returns the index of epoch e's snapshot, or -1.
func (n *notifyState) find(e uint64) int {
	for i, s := range n.snaps {
		if s.epoch == e {
			return i
		}
	}
	return -1
}

// kept names the epochs retained, for errors.
func (n *notifyState) kept() string {
	if len(n.snaps) == 0 {
		return "none"
	}
	es := make([]string, len(n.snaps))
	for i, s := range n.snaps {
		es[i] = strconv.FormatUint(s.epoch, 10)
	}
	return "epochs " + strings.Join(es, ", ")
}
