package rma

import (
	"cmp"
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/rvma/rvma/verbs"
)

// Tags of synchronisation messages: internal, per window.
func (w *Win) syncTag(kind uint32) uint32 { return 3<<30 | w.c.tagGen() | (w.id&0x3fffff)<<4 | kind }

const (
	syncPost     = 1
	syncComplete = 2
)

// Fence ends the current fence epoch and starts the next: every operation
// this rank started on the window has completed at its target, and every
// rank has entered the fence, before it returns. Pass ModeNoSucceed when
// no epoch follows; the other assertions are accepted as hints. If an
// operation failed on any rank, Fence fails on every rank: with that
// operation's error where it failed, ErrRemote elsewhere.
func (w *Win) Fence(ctx context.Context, assert int) error {
	err := w.FlushAll(ctx)
	aerr := w.c.agree(ctx, "fence", err)
	w.mu.Lock()
	w.fence = assert&ModeNoSucceed == 0
	w.setAllOK()
	w.mu.Unlock()
	if err != nil {
		return opErr("fence", -1, err)
	}
	return aerr
}

func checkGroup(c *Comm, op string, group []int) error {
	seen := map[int]bool{}
	for _, r := range group {
		if err := c.checkRank(op, r); err != nil {
			return err
		}
		if seen[r] {
			return opErr(op, r, fmt.Errorf("%w: rank listed twice in the group", ErrSync))
		}
		seen[r] = true
	}
	return nil
}

// Post starts an exposure epoch for the origins in group: they may access
// this rank's window between their Start and Complete.
func (w *Win) Post(ctx context.Context, group []int, assert int) error {
	if err := checkGroup(w.c, "post", group); err != nil {
		return err
	}
	w.mu.Lock()
	if w.postGroup != nil {
		w.mu.Unlock()
		return opErr("post", -1, fmt.Errorf("%w: an exposure epoch is already open", ErrSync))
	}
	w.postGroup = append([]int{}, group...) // non-nil: an empty group is an open epoch
	w.mu.Unlock()
	// Every origin hears of the epoch, even when one cannot, so that only
	// that one waits in vain.
	var reqs []*Request
	var first error
	for _, r := range group {
		if words := w.syncPeer(ctx, r); words != nil {
			signal(words, postIdx(w.c.rank))
			continue
		}
		op, err := w.c.sendMsg(ctx, r, kindMsg, w.syncTag(syncPost), nil, nil)
		if err != nil {
			first = cmp.Or(first, opErr("post", r, err))
			continue
		}
		reqs = append(reqs, &Request{op: op, name: "post", rank: r})
	}
	return cmp.Or(first, WaitAll(ctx, reqs...))
}

// Start starts an access epoch to the targets in group; it waits until
// each of them has posted.
func (w *Win) Start(ctx context.Context, group []int, assert int) error {
	if err := checkGroup(w.c, "start", group); err != nil {
		return err
	}
	w.mu.Lock()
	if w.startGroup != nil {
		w.mu.Unlock()
		return opErr("start", -1, fmt.Errorf("%w: an access epoch is already open", ErrSync))
	}
	w.mu.Unlock()
	for _, r := range group {
		if _, err := w.takeSync(ctx, "start", r, postIdx(r), w.postsTaken, w.syncTag(syncPost)); err != nil {
			return err
		}
	}
	w.mu.Lock()
	w.startGroup = append([]int{}, group...)
	w.setAllOK()
	w.mu.Unlock()
	return nil
}

// Complete ends the access epoch: it tells each target, in a message
// ordered after this rank's operations on the same connection (so it
// needs no extra round trip), and waits until the operations completed.
// Gets, and operations that travel outside the connection (over the
// paths, or long-haul), are not ordered before the message: when some
// are in flight towards a target, they complete first. Each target hears
// of the end of the epoch even if an operation towards it failed (its
// Wait then fails with ErrRemote), so no target waits for this rank in
// vain.
func (w *Win) Complete(ctx context.Context) error {
	w.mu.Lock()
	group := w.startGroup
	w.startGroup = nil
	w.setAllOK()
	w.mu.Unlock()
	if group == nil {
		return opErr("complete", -1, fmt.Errorf("%w: complete without start", ErrSync))
	}
	var first error
	for _, r := range group {
		var failed [1]byte
		if err := w.sendPack(ctx, r); err != nil {
			first, failed[0] = cmp.Or(first, opErr("complete", r, err)), 1
		}
		if words := w.syncPeer(ctx, r); words != nil {
			// A token is not ordered after the operations, as a message
			// on their connection is: they complete at the target first
			// (those through the mapping already have).
			if err := w.Flush(ctx, r); err != nil {
				first, failed[0] = cmp.Or(first, opErr("complete", r, err)), 1
			}
			if failed[0] != 0 {
				signal(words, failedIdx(w.c.size, w.c.rank))
			}
			signal(words, doneIdx(w.c.size, w.c.rank))
			continue
		}
		if w.unordered(r) {
			if err := w.Flush(ctx, r); err != nil {
				first, failed[0] = cmp.Or(first, opErr("complete", r, err)), 1
			}
		}
		if _, err := w.c.sendMsg(ctx, r, kindMsg, w.syncTag(syncComplete), failed[:], nil); err != nil {
			first = cmp.Or(first, opErr("complete", r, err))
		}
	}
	// The messages' acknowledgements are not waited for: MPI's complete
	// asks only that the epoch's operations have completed at this rank
	// (the flushes below do more: at the target too), and a target whose
	// message is lost learns of it in its Wait, as ErrPeer. Waiting cost
	// a turn of each target's progress (halo3d's pscw variant, exchange
	// only, 70-104 -> 49-80 us an iteration, 4 ranks on 2 cores).
	for _, r := range group {
		first = cmp.Or(first, w.Flush(ctx, r))
	}
	return first
}

// completeErr is what origin r's complete message m says: ErrRemote if
// an operation of its epoch failed.
func completeErr(op string, r int, m []byte) error {
	if len(m) > 0 && m[0] != 0 {
		return opErr(op, r, ErrRemote)
	}
	return nil
}

// completeFailed is what origin r's complete says, its message m or (m
// nil) a token in this rank's words: ErrRemote if an operation of its
// epoch failed.
func (w *Win) completeFailed(op string, r int, m []byte) error {
	if m != nil || !w.memSyncAllowed() {
		return completeErr(op, r, m)
	}
	if atomic.LoadUint64(&w.syncMem[failedIdx(w.c.size, r)]) > w.failsTaken[r] {
		w.failsTaken[r]++
		return opErr(op, r, ErrRemote)
	}
	return nil
}

// unordered reports whether operations towards target are in flight that
// a message on the RC connection would not follow: READs (the target may
// read its memory for them after it handled the message) and operations
// bridged from other connections.
func (w *Win) unordered(target int) bool {
	return w.reads[target].Load()+w.bridged[target].Load() > 0
}

// Wait ends the exposure epoch: it returns once every origin of the
// posted group has completed its access epoch (ErrRemote if an origin's
// operations failed).
func (w *Win) Wait(ctx context.Context) error {
	w.mu.Lock()
	group := w.postGroup
	w.mu.Unlock()
	if group == nil {
		return opErr("wait", -1, fmt.Errorf("%w: wait without post", ErrSync))
	}
	var first error
	for _, r := range group {
		m, err := w.takeSync(ctx, "wait", r, doneIdx(w.c.size, r), w.donesTaken, w.syncTag(syncComplete))
		if err != nil {
			return err
		}
		first = cmp.Or(first, w.completeFailed("wait", r, m))
	}
	w.mu.Lock()
	w.postGroup = nil
	w.mu.Unlock()
	return first
}

// Test is Wait without blocking: it reports whether the exposure epoch
// has ended (and ends it if so).
func (w *Win) Test() (bool, error) {
	w.mu.Lock()
	group := w.postGroup
	w.mu.Unlock()
	if group == nil {
		return false, opErr("test", -1, fmt.Errorf("%w: test without post", ErrSync))
	}
	w.c.eng.Progress()
	tag := w.syncTag(syncComplete)
	all := true
	var first error
	// A token in this rank's words, or a message, from every origin: then
	// take one of each (tokens first).
	token := func(r int) bool {
		return w.memSyncAllowed() && atomic.LoadUint64(&w.syncMem[doneIdx(w.c.size, r)]) > w.donesTaken[r]
	}
	w.c.eng.Locked(func() {
		for _, r := range group {
			if !token(r) && len(w.c.msg.inbox[inboxKey{r, tag}]) == 0 {
				all = false
				return
			}
		}
		for _, r := range group {
			if token(r) {
				w.donesTaken[r]++
				first = cmp.Or(first, w.completeFailed("test", r, nil))
				continue
			}
			first = cmp.Or(first, completeErr("test", r, w.c.msg.pop(inboxKey{r, tag})))
		}
	})
	if all {
		w.mu.Lock()
		w.postGroup = nil
		w.mu.Unlock()
	}
	return all, first
}

// The lock word of every rank's window: the exclusive bit, or the number
// of shared holders.
const lockExcl = 1 << 63

// Lock starts a passive-target access epoch to target: shared locks
// coexist, an exclusive lock excludes every other lock. It waits (with
// backoff) until the lock is granted. The lock lives in the target's
// memory and is taken with the NIC's atomics, so the target does nothing.
func (w *Win) Lock(ctx context.Context, lt LockType, target int) error {
	if err := w.c.checkRank("lock", target); err != nil {
		return err
	}
	w.mu.Lock()
	if w.locks[target] != 0 || w.lockAll {
		w.mu.Unlock()
		return opErr("lock", target, fmt.Errorf("%w: already locked", ErrSync))
	}
	w.mu.Unlock()
	if err := w.acquire(ctx, lt, target); err != nil {
		return err
	}
	w.mu.Lock()
	w.locks[target] = lt
	w.setOK(target)
	w.mu.Unlock()
	return nil
}

func (w *Win) acquire(ctx context.Context, lt LockType, target int) error {
	// A holder that died never releases: a fault ends the wait.
	ictx, in := w.c.interruptible(ctx)
	defer in.end()
	backoff := time.Microsecond
	for {
		if lt == LockExclusive {
			old, err := w.lockOp(ctx, target, verbs.OpCompareSwap, 0, lockExcl)
			if err != nil {
				return err
			}
			if old == 0 {
				return nil
			}
		} else {
			old, err := w.lockOp(ctx, target, verbs.OpFetchAdd, 1, 0)
			if err != nil {
				return err
			}
			if old&lockExcl == 0 {
				return nil
			}
			if _, err := w.lockOp(ctx, target, verbs.OpFetchAdd, ^uint64(0), 0); err != nil {
				return err
			}
		}
		select {
		case <-ictx.Done():
			return opErr("lock", target, in.err(ictx.Err()))
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Millisecond)
	}
}

// lockOp runs one atomic on target's lock word and returns the old value.
func (w *Win) lockOp(ctx context.Context, target int, opc verbs.Opcode, cmpAdd, swap uint64) (uint64, error) {
	qp, err := w.c.conn(ctx, target)
	if err != nil {
		return 0, err
	}
	slot := w.lockMR.SGE(8*(1+target), 8)
	op, base := w.c.eng.Start(1, nil)
	rw := &w.remote[target]
	if _, err := w.c.post(qp, []verbs.SendWR{{ID: base, Opcode: opc, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{slot},
		RemoteAddr: rw.lockAddr, RKey: rw.lockKey, CompareAdd: cmpAdd, Swap: swap}}); err != nil {
		w.c.eng.Posted(op, base, 1, 0, err)
		return 0, opErr("lock", target, err)
	}
	if err := op.Wait(ctx); err != nil {
		return 0, opErr("lock", target, err)
	}
	return atomicAdd(&w.lockMem[1+target], 0), nil
}

// Unlock ends the passive-target epoch to target: its operations complete
// at the target, then the lock is released.
func (w *Win) Unlock(ctx context.Context, target int) error {
	if err := w.c.checkRank("unlock", target); err != nil {
		return err
	}
	w.mu.Lock()
	lt := w.locks[target]
	w.mu.Unlock()
	if lt == 0 {
		return opErr("unlock", target, fmt.Errorf("%w: not locked", ErrSync))
	}
	// The lock is released even when an operation failed: others wait
	// for it.
	err := w.Flush(ctx, target)
	err = cmp.Or(err, w.release1(ctx, lt, target))
	w.mu.Lock()
	delete(w.locks, target)
	w.setOK(target)
	w.mu.Unlock()
	return err
}

func (w *Win) release1(ctx context.Context, lt LockType, target int) error {
	dec := ^uint64(0) // -1: one shared holder fewer
	if lt == LockExclusive {
		dec = 1 + ^uint64(lockExcl) // -lockExcl, modulo 2^64
	}
	_, err := w.lockOp(ctx, target, verbs.OpFetchAdd, dec, 0)
	return err
}

// LockAll takes a shared lock on every rank.
func (w *Win) LockAll(ctx context.Context) error {
	w.mu.Lock()
	if w.lockAll || len(w.locks) > 0 {
		w.mu.Unlock()
		return opErr("lock_all", -1, fmt.Errorf("%w: already locked", ErrSync))
	}
	w.mu.Unlock()
	for r := range w.c.size {
		if err := w.acquire(ctx, LockShared, r); err != nil {
			for q := range r {
				w.release1(ctx, LockShared, q)
			}
			return err
		}
	}
	w.mu.Lock()
	w.lockAll = true
	w.setAllOK()
	w.mu.Unlock()
	return nil
}

// UnlockAll completes every operation and releases LockAll's locks.
func (w *Win) UnlockAll(ctx context.Context) error {
	w.mu.Lock()
	if !w.lockAll {
		w.mu.Unlock()
		return opErr("unlock_all", -1, fmt.Errorf("%w: not locked", ErrSync))
	}
	w.mu.Unlock()
	err := w.FlushAll(ctx)
	for r := range w.c.size {
		err = cmp.Or(err, w.release1(ctx, LockShared, r))
	}
	w.mu.Lock()
	w.lockAll = false
	w.setAllOK()
	w.mu.Unlock()
	return err
}
