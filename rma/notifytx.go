package rma

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rvma/rvma/internal/lockcheck"
	"github.com/rvma/rvma/internal/progress"
	"github.com/rvma/rvma/internal/spin"
	"github.com/rvma/rvma/verbs"
)

// Puts into a per-origin notified window (NotifyConfig.ExpectFrom) are
// counted by the target's mailbox for this origin, epoch after epoch, and
// a put lands in the epoch whose buffer its first byte finds open. The
// origin knows what the target expects of it per epoch, so it knows which
// epoch each of its puts lands in, and whether the target has posted that
// epoch's buffer yet: Depth epochs are posted from the start, and one more
// each time the target's WaitEpoch consumes one. A put for an epoch whose
// buffer is not posted waits at the origin, in order behind the puts
// before it; such puts never reach the network early, where they would
// stall every later message between the pair (RC delivers in order, and a
// receiver not ready holds the whole connection).
//
// The origin learns what the target consumed without a message of its
// own in the common case: the target counts the epochs it consumed (a
// count that only grows, rewinds included) and writes the count into a
// credit word of the window in the origin's memory, with an RDMA WRITE
// (one unsignalled work request; a store on shm); the origin reads the
// word. An origin that finds no posted buffer asks, with a credit request
// the target answers at once or from WaitEpoch; the answer also says where
// the target's epochs stand against the count, which is how an origin
// resumes after a rewind (epochs go back, the count does not).

// errDropped finishes puts that waited for a buffer when Rewind or
// AbandonEpoch dropped them; flushes do not report it.
var errDropped = errors.New("rma: put dropped by a rewind before it was sent")

// txState is this rank's position in one target's per-origin mailbox.
type txState struct {
	// mu guards the fields below. It is held from deciding a put's epoch
	// to posting it, so epochs follow posting order; the engine's lock,
	// a peer's mu and a Win's unsigMu nest inside it, and a Win's mu
	// outside (see Comm).
	mu      lockcheck.Mutex[txLocks]
	synced  bool           // false after a rewind, until the target's answer says where it stands
	epoch   uint64         // the epoch the next put lands in, from 1
	acc     int            // bytes (or puts) of that epoch counted so far
	granted uint64         // the target has posted buffers for the epochs up to here
	queue   []txWR         // puts waiting for their epoch's buffer, in posting order
	batch   []verbs.SendWR // txDrain's scratch
	ask     *amCall        // the credit request in flight, if any
	// since is the epoch of the first put sent on the connection since
	// nothing was last in flight towards the target: a put split over
	// the paths, which may overtake those, waits for them unless they
	// all land in its own epoch.
	since uint64
	// The target's epoch was base when its credit word read word0: the
	// word's growth since then is epochs consumed.
	base, word0 uint64
}

// txMax bounds the puts one origin queues for a target's epochs not yet
// posted; past it a put waits, making progress, for the target to catch up.
const txMax = 4096

// txLocks is the lock class of txStates' mu (see internal/lockcheck).
type txLocks struct{}

func (txLocks) LockClass() string { return "an rma per-origin window's tx.mu" }

// txWR is one queued work request and what it counts.
type txWR struct {
	wr    verbs.SendWR
	units int
	op    *progress.Op
}

func (t *txState) init(depth uint8) {
	t.synced, t.epoch, t.acc, t.granted = true, 1, 0, uint64(depth)
}

// words is registered memory of 8-byte words that peers write with RDMA
// WRITEs and this rank reads with atomic loads: device memory where the
// device shares memory (so that same-host peers write it directly),
// else memory outside the Go heap (the race detector would take the
// NIC's copy into a word for an unsynchronised Go write; an aligned word
// is written whole, as by a real NIC).
type words struct {
	w    []uint64
	mr   *verbs.MR
	mmap []byte
}

func (ws *words) alloc(c *Comm, n int) error {
	var err error
	if ws.mr, ws.mmap, err = c.allocNIC(8 * n); err != nil {
		return fmt.Errorf("rma: credit words: %w", err)
	}
	ws.w = u64s(ws.mr.Bytes())[:n]
	return nil
}

// allocNIC returns n bytes of registered memory that peers write and this
// rank reads with atomic loads while they may: device memory where the
// device shares memory, else memory outside the Go heap (mmap, to unmap
// after deregistering), where the race detector does not see the NIC's
// copies as unsynchronised Go writes.
func (c *Comm) allocNIC(n int) (*verbs.MR, []byte, error) {
	if shmPort(c.dev) >= 0 { // AllocMR memory is shared
		mr, err := c.pd.AllocMR(n, verbs.AccessAll)
		return mr, nil, err
	}
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, nil, err
	}
	mr, err := c.pd.RegisterMR(mem, verbs.AccessAll)
	if err != nil {
		unix.Munmap(mem)
		return nil, nil, err
	}
	return mr, mem, nil
}

func (ws *words) free() {
	if ws.mr != nil {
		ws.mr.Deregister()
	}
	if ws.mmap != nil {
		unix.Munmap(ws.mmap)
	}
	*ws = words{}
}

// refresh raises what tx knows is granted from the credit word (tx.mu
// held).
func (w *Win) refresh(tx *txState, target int) {
	lockcheck.AssertHeld(&tx.mu, "rma: refresh")
	if !tx.synced {
		return
	}
	word := atomic.LoadUint64(&w.credits.w[target])
	if word >= tx.word0 {
		tx.granted = max(tx.granted, tx.base+(word-tx.word0)+uint64(w.remote[target].depth))
	}
}

// step returns the epoch that a put counting units lands in after a put
// ending at (epoch, acc), and the position after it: a put that finds its
// epoch complete starts the next one; one that crosses the expectation
// counts whole into its epoch, which it closes.
func step(epoch uint64, acc, units, expect int) (uint64, int) {
	if acc >= expect {
		epoch, acc = epoch+1, 0
	}
	return epoch, acc + units
}

// fits reports whether the work requests of a put, each counting
// units(wr) at the target, can all be posted now: no put waits before
// them, and each lands in a posted buffer. It returns the position after
// them.
func (t *txState) fits(wrs []verbs.SendWR, units counter, expect int) (bool, uint64, int) {
	return t.fitsEach(len(wrs), func(i int) int { return units.of(&wrs[i]) }, expect)
}

// fitsPieces is fits for mailbox writes placed by the CPU, as the
// requests putWRs would make of the same put count.
func (t *txState) fitsPieces(pieces []verbs.MailboxPiece, units counter, expect int) (bool, uint64, int) {
	return t.fitsEach(len(pieces), func(i int) int { return units.ofPiece(&pieces[i]) }, expect)
}

func (t *txState) fitsEach(n int, unitsAt func(int) int, expect int) (bool, uint64, int) {
	if !t.synced || len(t.queue) > 0 {
		return false, 0, 0
	}
	e, a := t.epoch, t.acc
	for i := range n {
		if e, a = step(e, a, unitsAt(i), expect); e > t.granted {
			return false, 0, 0
		}
	}
	return true, e, a
}

// counter is how a target counts a work request: one put (countPuts), or
// its bytes. (A method, not a function value: the requests a put builds
// on its stack then stay there.)
type counter bool

// How a target counts: puts, or bytes.
const (
	countPuts  counter = true
	countBytes counter = false
)

func (c counter) of(wr *verbs.SendWR) int {
	if c == countPuts {
		return 1
	}
	n := len(wr.Inline)
	for _, s := range wr.SGL {
		n += int(s.Length)
	}
	return n
}

func (c counter) ofPiece(p *verbs.MailboxPiece) int {
	if c == countPuts {
		return 1
	}
	n := 0
	for _, b := range p.Src {
		n += len(b)
	}
	return n
}

// units is how target counts a work request.
func (w *Win) units(target int) counter { return counter(w.remote[target].countOps) }

// putNotified is the epoch layer's put into target's notified window,
// above whatever carries the bytes. Into a per-origin window, see
// putPerOrigin. Into an aggregate window this origin cannot know where
// epochs end, so its puts keep RC's order, behind any split over the
// paths; towards a long-haul peer they take the reliability layer, so
// that the peer assigns them to epochs in the order they start
// (putPerOrigin's too).
func (w *Win) putNotified(ctx context.Context, target int, x xfer) (*Request, error) {
	switch {
	case w.remote[target].notify == notifyPerOrigin:
		return w.putPerOrigin(ctx, x.origin, x.ol, target, x.off, x.tl, x.signal)
	case w.c.longHaul(target):
		return w.haulPut(ctx, "put", x.origin, x.ol, target, x.off, x.tl)
	}
	if err := w.waitBridged(ctx, target); err != nil {
		return nil, opErr("put", target, err)
	}
	return w.postPut(ctx, target, x)
}

// putPerOrigin sends a put into target's per-origin notified window, now
// if its epochs' buffers are posted, else queued until they are: over the
// paths when it may be split, over the reliability layer to a long-haul
// peer, else on the RC connection. The epochs and the queue are one layer
// above whichever carries the bytes.
func (w *Win) putPerOrigin(ctx context.Context, origin []byte, ol Layout, target, off int, tl Layout, signal bool) (*Request, error) {
	const name = "put"
	rw := &w.remote[target]
	qp, err := w.c.conn(ctx, target) // credit requests travel on it, whatever carries the puts
	if err != nil {
		return nil, err
	}
	haul := w.c.longHaul(target)
	if haul {
		if _, err := w.c.haulInitiator(ctx, target); err != nil {
			return nil, err
		}
	}
	spread := !haul && !rw.countOps && w.spreads(target, tl.Size(), ol, tl)
	if spread {
		if _, err := w.c.pathConn(ctx, target); err != nil {
			return nil, err
		}
	}
	if !haul && !spread && qp.CanPlace() {
		if req, done, err := w.placePerOrigin(qp, origin, ol, target, off, tl, signal); done {
			return req, err
		}
	}
	// Built on the stack, data aliasing origin: txSubmit copies them if
	// they must wait in the queue.
	var one [1]verbs.SendWR
	var wrs []verbs.SendWR
	w.c.reg.hold()
	defer w.c.reg.release() // after the post; a queued request holds on its own
	if haul {
		wrs = w.haulWRs(one[:0], origin, ol, target, off, tl)
	} else if wrs, err = w.putWRs(one[:0], origin, ol, target, off, tl); err != nil {
		return nil, opErr(name, target, err)
	}
	units := w.units(target)
	tx := &w.tx[target]
	for {
		tx.mu.Lock()
		w.refresh(tx, target)
		ok, e, a := tx.fits(wrs, units, rw.expect)
		if !ok && len(tx.queue) >= txMax {
			// The target is behind by txMax requests: make progress until
			// its credit drains some, rather than queue without end (an
			// origin that streams puts would hold all of them).
			tx.mu.Unlock()
			if err := w.txRoom(ctx, tx, target); err != nil {
				return nil, opErr(name, target, err)
			}
			continue
		}
		newEpoch := tx.acc >= rw.expect
		whole := ok && !newEpoch && a <= rw.expect // within the current epoch, closing nothing
		if spread && ok && a <= rw.expect {
			if (newEpoch || tx.since < e) && w.pending(target) {
				// A piece of a split put could overtake an earlier
				// epoch's puts, still on the connection, and be counted
				// into it.
				tx.mu.Unlock()
				if err := w.Flush(ctx, target); err != nil {
					return nil, err
				}
				continue
			}
			req, err := w.spread(ctx, name, target, origin[:ol.Size()], off, false)
			if err == nil {
				tx.epoch, tx.acc = e, a
			}
			tx.mu.Unlock()
			return req, err
		}
		if !haul && !whole && w.bridging(target) {
			// Puts split over the paths are not ordered before this one,
			// which starts or closes an epoch, or waits. (Long-haul puts
			// are placed in the order they start.)
			tx.mu.Unlock()
			if err := w.waitBridged(ctx, target); err != nil {
				return nil, opErr(name, target, err)
			}
			continue
		}
		req, err := w.txSubmit(tx, qp, target, wrs, units, signal, ok, e, a)
		tx.mu.Unlock()
		return req, err
	}
}

// placePerOrigin places a put into target's per-origin notified window
// with the CPU, when the window is shared with this process and the put's
// epochs are posted: its runs are counted as putWRs' requests would be,
// with no request, completion or tracked operation. A put of several runs
// (a halo's face) so costs a copy per run. It reports done false, having
// changed nothing, when the put must take the requests' path; done with
// no request when the put has completed.
func (w *Win) placePerOrigin(qp *verbs.QP, origin []byte, ol Layout, target, off int, tl Layout, signal bool) (*Request, bool, error) {
	rw := &w.remote[target]
	sc := putScratchPool.Get().(*putScratch)
	defer sc.release()
	sc.split(origin, ol, off, tl, rw.countOps)
	units := w.units(target)
	tx := &w.tx[target]
	tx.mu.Lock()
	defer tx.mu.Unlock()
	w.refresh(tx, target)
	ok, e, a := tx.fitsPieces(sc.pieces, units, rw.expect)
	if !ok || w.bridging(target) {
		return nil, false, nil
	}
	k := qp.PlaceMailbox(w.mailboxAddr(target), sc.pieces)
	if k == 0 {
		return nil, false, nil
	}
	w.sending(tx, target) // placed puts are not pending: as if before them
	if k == len(sc.pieces) {
		tx.epoch, tx.acc = e, a
		return nil, true, nil
	}
	// The window declined the rest (a full buffer's successor not shared,
	// the batch's size bound): they follow as requests, in order.
	_, pe, pa := tx.fitsPieces(sc.pieces[:k], units, rw.expect)
	tx.epoch, tx.acc = pe, pa
	w.c.reg.hold()
	defer w.c.reg.release()
	wrs, err := w.putWRs(nil, origin, ol, target, off, tl)
	if err != nil {
		// The placed runs have landed and are counted, the rest will not:
		// the put failed, as one whose requests failed midway.
		return nil, true, opErr("put", target, err)
	}
	req, err := w.txSubmit(tx, qp, target, wrs[k:], units, signal, true, e, a)
	return req, true, err
}

// putScratch holds a put's runs while they are placed.
type putScratch struct {
	runs   []putRun
	srcs   [][]byte
	pieces []verbs.MailboxPiece
}

var putScratchPool = sync.Pool{New: func() any { return new(putScratch) }}

// split makes the put's runs and their mailbox writes, as putWRs's
// requests would be.
func (sc *putScratch) split(origin []byte, ol Layout, off int, tl Layout, countOps bool) {
	sc.runs, sc.srcs = putRuns(sc.runs[:0], sc.srcs[:0], origin, ol, off, tl, countOps)
	for _, r := range sc.runs {
		sc.pieces = append(sc.pieces, verbs.MailboxPiece{Offset: uint64(r.dst), Src: sc.srcs[r.first : r.first+r.n : r.first+r.n]})
	}
}

// release lets go of the caller's memory and returns sc to its pool.
func (sc *putScratch) release() {
	clear(sc.srcs)
	clear(sc.pieces)
	sc.runs, sc.srcs, sc.pieces = sc.runs[:0], sc.srcs[:0], sc.pieces[:0]
	putScratchPool.Put(sc)
}

// txRoom waits, making progress, until fewer than txMax puts wait in tx's
// queue. It reads the credit word as it goes (txDrain), as a stream of
// puts does: the target writes the word as it consumes epochs, with no
// message to wake a sleeper, and a credit answer may wait in the target's
// backlog.
func (w *Win) txRoom(ctx context.Context, tx *txState, target int) error {
	for i := 0; ; i++ {
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := w.c.eng.Progress(); err != nil {
			return err
		}
		tx.mu.Lock()
		w.txDrain(tx, target)
		room := len(tx.queue) < txMax
		tx.mu.Unlock()
		if room {
			return nil
		}
		if i < 256 {
			spin.Pause(i)
		} else {
			time.Sleep(20 * time.Microsecond) // a target that is slow to consume
		}
	}
}

// pending reports whether operations towards target are in flight or
// unflushed.
func (w *Win) pending(target int) bool {
	return w.out[target].Load() > 0 || w.unsig[target].Load() > 0
}

// waitBridged waits until no operation towards target travels outside
// the RC connection.
func (w *Win) waitBridged(ctx context.Context, target int) error {
	return w.c.eng.Wait(ctx, func() bool { return w.bridged[target].Load() == 0 })
}

// txSubmit posts a put's work requests (tx.mu held): as any put when they
// fit (ok, ending at epoch e, acc a), else as one tracked operation whose
// requests are posted as their buffers are posted.
func (w *Win) txSubmit(tx *txState, qp *verbs.QP, target int, wrs []verbs.SendWR, units counter, signal, ok bool, e uint64, a int) (*Request, error) {
	lockcheck.AssertHeld(&tx.mu, "rma: txSubmit")
	if ok && w.c.longHaul(target) {
		tx.epoch, tx.acc = e, a
		o, base := w.track(len(wrs), target)
		req := o.request("put")
		for i := range wrs {
			wrs[i].ID = base + uint64(i)
		}
		if k, err := w.haulStart(target, wrs, func(int) *progress.Op { return &o.op }); k < len(wrs) {
			w.c.eng.Posted(&o.op, base+uint64(k), len(wrs)-k, 0, opErr("put", target, err))
			if k == 0 {
				return nil, opErr("put", target, err)
			}
		}
		return req, nil
	}
	if ok {
		w.sending(tx, target)
		tx.epoch, tx.acc = e, a
		if !signal {
			return nil, w.postUnsignalled(qp, target, wrs)
		}
		return w.postOps("put", qp, target, wrs, nil)
	}
	o, base := w.track(len(wrs), target)
	op := &o.op
	req := o.request("put")
	for i := range wrs {
		wrs[i].ID, wrs[i].Flags = base+uint64(i), wrs[i].Flags|verbs.FlagSignaled
		// Queued past this call: inline data must not alias the caller's
		// origin buffer, which verbs would have copied at post.
		wrs[i].Inline = bytes.Clone(wrs[i].Inline)
		tx.queue = append(tx.queue, txWR{wr: wrs[i], units: units.of(&wrs[i]), op: op})
		w.c.reg.hold() // released when it leaves the queue
	}
	w.txDrain(tx, target)
	return req, nil
}

// sending notes that puts are about to go on the connection, from tx's
// position (tx.mu held): if nothing is in flight towards target, the
// first of them starts what a split put must not overtake.
func (w *Win) sending(tx *txState, target int) {
	if !w.pending(target) {
		tx.since, _ = step(tx.epoch, tx.acc, 0, w.remote[target].expect)
	}
}

// txDrain posts the queued puts whose buffers are posted and asks for
// credit for the rest (tx.mu held). It may run in the poller.
func (w *Win) txDrain(tx *txState, target int) {
	lockcheck.AssertHeld(&tx.mu, "rma: txDrain")
	if !tx.synced {
		w.askCredit(tx, target, 0)
		return
	}
	w.refresh(tx, target)
	expect := w.remote[target].expect
	n, e, a := 0, tx.epoch, tx.acc
	for ; n < len(tx.queue); n++ {
		ne, na := step(e, a, tx.queue[n].units, expect)
		if ne > tx.granted {
			break
		}
		e, a = ne, na
	}
	if n > 0 {
		batch := tx.batch[:0]
		for i := range n {
			batch = append(batch, tx.queue[i].wr)
		}
		w.sending(tx, target)
		k, err := 0, error(nil)
		p := w.c.peers[target]
		p.mu.Lock()
		qp := p.qp
		p.mu.Unlock()
		switch {
		case w.c.longHaul(target):
			k, err = w.haulStart(target, batch, func(i int) *progress.Op { return tx.queue[i].op })
		case qp == nil:
			err = ErrClosed
		default:
			k, err = w.c.post(qp, batch)
		}
		for i := k; i < n; i++ {
			w.c.eng.Posted(tx.queue[i].op, tx.queue[i].wr.ID, 1, 0, opErr("put", target, err))
		}
		tx.epoch, tx.acc = e, a
		// Drop the posted ones without copying the rest (a long queue
		// drained an epoch at a time would cost its square), and let go
		// of what they referenced.
		clear(batch)
		tx.batch = batch[:0]
		if n == len(tx.queue) {
			clear(tx.queue)
			tx.queue = tx.queue[:0]
		} else {
			clear(tx.queue[:n])
			tx.queue = tx.queue[n:]
		}
		w.c.reg.releaseN(n)
	}
	if len(tx.queue) > 0 {
		want, _ := step(tx.epoch, tx.acc, tx.queue[0].units, expect)
		w.askCredit(tx, target, want)
	}
}

// askCredit asks target to answer once the buffer of epoch want is
// posted (want 0: at once, with where it stands), unless a request is in
// flight already (tx.mu held). The request is no operation of the window
// (flushes wait for the puts, not for it).
func (w *Win) askCredit(tx *txState, target int, want uint64) {
	lockcheck.AssertHeld(&tx.mu, "rma: askCredit")
	if tx.ask != nil {
		return
	}
	var call *amCall
	call = &amCall{result: make([]byte, 16), free: true, after: func(err error) {
		w.c.eng.AssertUnlocked("rma: a credit answer takes tx.mu, which precedes the engine's lock")
		tx.mu.Lock()
		defer tx.mu.Unlock()
		if tx.ask != call {
			return // dropped by a rewind
		}
		tx.ask = nil
		if err != nil {
			w.txFail(tx, target, err)
			return
		}
		consumed, total := binary.LittleEndian.Uint64(call.result), binary.LittleEndian.Uint64(call.result[8:])
		depth := uint64(w.remote[target].depth)
		if !tx.synced {
			tx.synced, tx.epoch, tx.acc, tx.granted = true, consumed+1, 0, consumed+depth
			tx.base, tx.word0 = consumed, total
		} else {
			tx.granted = max(tx.granted, consumed+depth)
		}
		w.txDrain(tx, target)
	}}
	tx.ask = call
	if _, err := w.amCall(context.Background(), "put", target, amHdr{kind: amCredit, off: want}, call); err != nil {
		tx.ask = nil
		w.txFail(tx, target, err)
	}
}

// txFail fails every queued put (tx.mu held).
func (w *Win) txFail(tx *txState, target int, err error) {
	lockcheck.AssertHeld(&tx.mu, "rma: txFail")
	for _, q := range tx.queue {
		w.c.eng.Posted(q.op, q.wr.ID, 1, 0, opErr("put", target, err))
	}
	w.c.reg.releaseN(len(tx.queue))
	tx.queue = nil
}

// resetTx forgets where this rank's puts stand in every target's epochs
// (after Rewind or AbandonEpoch, which every rank calls before origins
// redo their puts, and when the window is freed): queued puts are
// dropped, and the next put first asks the target where it stands.
func (w *Win) resetTx() {
	for t := range w.tx { // none unless a target has per-origin mailboxes
		rw := &w.remote[t]
		if rw.notify != notifyPerOrigin || rw.expect == 0 {
			continue
		}
		tx := &w.tx[t]
		tx.mu.Lock()
		for _, q := range tx.queue {
			w.c.eng.Posted(q.op, q.wr.ID, 1, 0, errDropped)
		}
		w.c.reg.releaseN(len(tx.queue))
		tx.queue = nil
		if call := tx.ask; call != nil {
			tx.ask = nil
			w.c.eng.Locked(func() {
				if w.c.msg.am[call.id] == call {
					w.c.msg.dropAM(call)
					w.c.eng.FinishLocked(call.req.op, nil)
				}
			})
		}
		tx.synced = false
		tx.mu.Unlock()
	}
}

// creditRequest answers an origin's credit request at the target (in the
// poller): at once if the buffer of epoch want is posted, else when
// WaitEpoch posts it (see grant).
func (n *notifyState) creditRequest(src int, id, want uint64) (reply bool, result []byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if want <= n.epoch+uint64(n.cfg.Depth) {
		return true, n.standing()
	}
	n.credits[src] = creditReq{id: id, want: want}
	return false, nil
}

type creditReq struct{ id, want uint64 }

// standing is a credit answer: the epochs consumed, and the credit words'
// count at the same time (n.mu held).
func (n *notifyState) standing() []byte {
	lockcheck.AssertHeld(&n.mu, "rma: a credit answer is made")
	return binary.LittleEndian.AppendUint64(binary.LittleEndian.AppendUint64(nil, n.epoch), n.total)
}

// consumed records one more epoch consumed (in WaitEpoch), writes the new
// count into each expected origin's credit word, and answers the credit
// requests it satisfies.
func (n *notifyState) consumed() uint64 {
	n.mu.Lock()
	n.epoch++
	n.total++
	epoch, total := n.epoch, n.total
	n.mu.Unlock()
	for _, o := range n.origins {
		n.w.credit(o, total)
	}
	n.grant(false)
	return epoch
}

// credit writes count into origin o's credit word of the window: an
// unsignalled 8-byte WRITE (on shm a store, unordered so that it neither
// waits for this rank's puts in flight nor holds later ones back: the
// count only grows), nothing if no connection to o
// exists yet (an origin that has not put has its Depth epochs still).
// It counts among the window's unsignalled writes, so that Free's flush
// waits for it: o deregisters its credit words once Free agrees, and a
// write arriving after that would break the connection.
func (w *Win) credit(o int, count uint64) {
	c := w.c
	if o == c.rank {
		atomic.StoreUint64(&w.credits.w[o], count)
		return
	}
	p := c.peers[o]
	p.mu.Lock()
	qp := p.qp
	p.mu.Unlock()
	if qp == nil {
		return
	}
	if word := w.creditWord(o, qp); word != nil {
		atomic.StoreUint64(word, count) // o's memory, mapped here: complete at once
		return
	}
	rw := &w.remote[o]
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], count)
	// An error here is the connection's, and the next operation on it
	// reports it.
	_ = w.postUnsignalled(qp, o, []verbs.SendWR{{Opcode: verbs.OpWrite, Flags: verbs.FlagInline | verbs.FlagUnordered, Inline: b[:],
		RemoteAddr: rw.credAddr + uint64(8*c.rank), RKey: rw.credKey}})
}

// grant answers the credit requests that the buffers now posted satisfy
// (all of them after a rewind: the origins then ask again).
func (n *notifyState) grant(all bool) {
	type answer struct {
		src int
		id  uint64
	}
	var answers []answer
	var standing []byte
	n.mu.Lock()
	for src, r := range n.credits {
		if all || r.want <= n.epoch+uint64(n.cfg.Depth) {
			answers = append(answers, answer{src, r.id})
			delete(n.credits, src)
		}
	}
	if len(answers) > 0 {
		standing = n.standing()
	}
	n.mu.Unlock()
	for _, a := range answers {
		n.w.c.replyAM(a.src, a.id, amOK, standing)
	}
}

// checkExpect is what access refuses for a per-origin window that does not
// expect this rank.
func (w *Win) checkExpect(op string, target int) error {
	if rw := &w.remote[target]; rw.notify == notifyPerOrigin && rw.expect == 0 {
		return opErr(op, target, fmt.Errorf("%w: rank %d is not in the target's NotifyConfig.ExpectFrom", ErrNoEpoch, w.c.rank))
	}
	return nil
}
