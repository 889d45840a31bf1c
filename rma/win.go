package rma

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rvma/rvma/internal/lockcheck"
	"github.com/rvma/rvma/internal/progress"
	"github.com/rvma/rvma/internal/spin"
	"github.com/rvma/rvma/mailbox"
	"github.com/rvma/rvma/verbs"
)

// WinConfig configures a window. The zero value means defaults.
type WinConfig struct {
	// DispUnit is the unit of target displacements, in bytes, as MPI's
	// disp_unit. Default 1.
	DispUnit int
	// Notify makes the window RVMA-notified (see NotifyConfig); nil: a
	// plain MPI-style window.
	Notify *NotifyConfig
}

// Layout describes where the bytes of one side of a transfer are: Count
// blocks of Block bytes, Stride bytes apart (MPI's vector type, in bytes).
// The zero Layout is the whole buffer, contiguous.
type Layout struct {
	Count, Block, Stride int
}

// Contiguous reports whether the layout is one block.
func (l Layout) Contiguous() bool { return l.Count <= 1 || l.Block == l.Stride }

// Size is the number of bytes the layout moves.
func (l Layout) Size() int { return l.Count * l.Block }

// Extent is the span from the first byte to the last.
func (l Layout) Extent() int {
	if l.Count == 0 {
		return 0
	}
	return (l.Count-1)*l.Stride + l.Block
}

func (l Layout) norm(n int) (Layout, error) {
	if l == (Layout{}) {
		return Layout{Count: 1, Block: n, Stride: n}, nil
	}
	if _, ok := l.checkedExtent(); !ok {
		return l, fmt.Errorf("%w: layout %+v is negative, overlaps itself or spans more than the address space", ErrDatatype, l)
	}
	return l, nil
}

// checkedExtent is Extent for layouts from anywhere (a peer's message
// included): false if it is negative or overflows. With Stride >= Block
// (as norm requires) the extent bounds the size, so Size cannot overflow
// either.
func (l Layout) checkedExtent() (int, bool) {
	if l.Count < 0 || l.Block < 0 || (l.Count > 1 && l.Stride < l.Block) {
		return 0, false
	}
	if l.Count == 0 {
		return 0, true
	}
	hi, lo := bits.Mul64(uint64(l.Count-1), uint64(l.Stride))
	sum, carry := bits.Add64(lo, uint64(l.Block), 0)
	if hi != 0 || carry != 0 || sum > math.MaxInt {
		return 0, false
	}
	return int(sum), true
}

// remoteWin is what an origin knows of a target's window.
type remoteWin struct {
	addr     uint64
	rkey     uint32
	size     uint64
	unit     uint32
	lockAddr uint64
	lockKey  uint32
	credAddr uint64 // notified windows: the target's credit words, one per origin (notifytx.go)
	credKey  uint32
	notify   uint8 // 0 plain, 1 aggregate mailbox, 2 per-origin mailboxes
	countOps bool  // the target counts puts, not bytes
	misalign uint8 // the window's first byte's address modulo 8 in the target's memory
	depth    uint8 // notified windows: epochs the target posts ahead
	expect   int   // per-origin windows: what the target expects of this rank per epoch
}

// A window's description, as every rank publishes it at creation: the
// fields of remoteWin, then 12 bytes (rank, expectation) per origin of a
// per-origin notified window. A rank whose part of the creation failed
// publishes descFailed instead, so that the others fail too rather than
// wait for it.
const (
	remoteWinLen = 8 + 4 + 8 + 4 + 8 + 4 + 8 + 4 + 1 + 1 + 1
	descFailed   = 0xff
)

func (rw *remoteWin) encode(expectFrom map[int]int) []byte {
	b := make([]byte, remoteWinLen, remoteWinLen+12*len(expectFrom))
	binary.LittleEndian.PutUint64(b[0:], rw.addr)
	binary.LittleEndian.PutUint32(b[8:], rw.rkey)
	binary.LittleEndian.PutUint64(b[12:], rw.size)
	binary.LittleEndian.PutUint32(b[20:], rw.unit)
	binary.LittleEndian.PutUint64(b[24:], rw.lockAddr)
	binary.LittleEndian.PutUint32(b[32:], rw.lockKey)
	binary.LittleEndian.PutUint64(b[36:], rw.credAddr)
	binary.LittleEndian.PutUint32(b[44:], rw.credKey)
	b[48] = rw.notify
	if rw.countOps {
		b[48] |= notifyOps
	}
	b[49], b[50] = rw.misalign, rw.depth
	for _, o := range slices.Sorted(maps.Keys(expectFrom)) {
		b = binary.LittleEndian.AppendUint32(b, uint32(o))
		b = binary.LittleEndian.AppendUint64(b, uint64(expectFrom[o]))
	}
	return b
}

// decodeWin reads rank r's window description as rank me sees it.
func decodeWin(b []byte, r, me int) (remoteWin, error) {
	if len(b) == 1 && b[0] == descFailed {
		return remoteWin{}, opErr("create window", r, fmt.Errorf("%w: its part of the window could not be created", ErrRemote))
	}
	if len(b) < remoteWinLen || (len(b)-remoteWinLen)%12 != 0 {
		return remoteWin{}, opErr("create window", r, fmt.Errorf("%w: bad window description", ErrDatatype))
	}
	rw := remoteWin{addr: binary.LittleEndian.Uint64(b[0:]), rkey: binary.LittleEndian.Uint32(b[8:]),
		size: binary.LittleEndian.Uint64(b[12:]), unit: binary.LittleEndian.Uint32(b[20:]),
		lockAddr: binary.LittleEndian.Uint64(b[24:]), lockKey: binary.LittleEndian.Uint32(b[32:]),
		credAddr: binary.LittleEndian.Uint64(b[36:]), credKey: binary.LittleEndian.Uint32(b[44:]),
		notify: b[48] &^ notifyOps, countOps: b[48]&notifyOps != 0, misalign: b[49] % 8, depth: b[50]}
	for e := b[remoteWinLen:]; len(e) > 0; e = e[12:] {
		if int(binary.LittleEndian.Uint32(e)) == me {
			rw.expect = int(min(binary.LittleEndian.Uint64(e[4:]), math.MaxInt32))
		}
	}
	return rw, nil
}

// LockType is MPI's lock type.
type LockType uint8

// Lock types.
const (
	LockExclusive LockType = iota + 1
	LockShared
)

// Assertions accepted by Fence, Post and Start (MPI's MPI_MODE_*). rvma
// uses NoSucceed (no epoch follows the fence) and ignores the others,
// which are hints.
const (
	ModeNoCheck = 1 << iota
	ModeNoStore
	ModeNoPut
	ModeNoPrecede
	ModeNoSucceed
)

// Win is a window: memory of every rank that the others may access.
type Win struct {
	// Set by create before it returns, then read-only: no lock. The
	// poller's active-message handler (handleAM, apply) reads mem,
	// notify and unalignedMu as soon as setup publishes the window in
	// c.wins (under winMu), so those are set before it; remote and tx
	// are set after, and read only by the application's calls and what
	// they start (a credit request's answer, in the poller).
	c      *Comm
	id     uint32
	mem    []byte
	mr     *verbs.MR
	unit   int
	remote []remoteWin
	direct []directPeer // per target: its window mapped here (shm; direct.go)
	// carriers holds, per target, how data reaches it (carrier.go),
	// chosen at the first access under carrierMu.
	carriers  []atomic.Pointer[carrier]
	carrierMu sync.Mutex
	packs     []putPack    // plain windows, per target: small puts waiting to travel together (pack.go)
	credMap   []directPeer // notified windows, per origin: its credit words mapped here (shm)
	lockMem   []uint64     // this rank's lock word, then one result slot per target (atomics)
	lockMR    *verbs.MR
	syncMem   []uint64     // after lockMem, shm only: tokens of post/start/complete/wait (pscwmem.go)
	syncMap   []directPeer // per peer: its sync words mapped here
	// Tokens taken so far, per peer: posts (Start), completes and failed
	// completes (Wait, Test); under the epoch calls' order, as MPI's.
	postsTaken, donesTaken, failsTaken []uint64
	credits                            words // notified windows: a credit word per target, written by peers, read with atomic loads (notifytx.go)
	// Per-origin notified windows: where this rank's puts stand in each
	// target's epochs, and the puts waiting for the target to post a
	// buffer; each txState has its own lock.
	tx     []txState
	notify *notifyState
	desc   []byte // this rank's description of the window, as published (again by Recover)

	// mu guards the epoch state below and freed. Lock order: mu before
	// a txState's mu, c.winMu and the registration cache's lock (see
	// release); access and the synchronisation calls take it briefly and
	// never wait under it.
	mu         lockcheck.Mutex[winLocks]
	fence      bool
	startGroup []int
	postGroup  []int
	locks      map[int]LockType
	lockAll    bool
	freed      bool

	// Per target, changed under the engine's lock: operations in flight,
	// the first failure since the last flush (reported by it; failedN
	// counts them), operations completing outside the RC connection (see
	// bridge), READs in flight (not ordered before a later message: see
	// Complete), accumulate active messages in flight (a NIC atomic must
	// not overtake them), and NIC atomics in flight (an origin's CPU
	// atomic must not overtake them either). The counters are atomic so
	// that a flush or an atomic finds "nothing in flight" without the
	// lock.
	out     []atomic.Int32
	outN    atomic.Int32
	failed  []error
	failedN atomic.Int32
	bridged []atomic.Int32
	reads   []atomic.Int32
	amOut   []atomic.Int32
	nicOut  []atomic.Int32

	// unsigMu is held while unsig, the unsignalled puts per target since
	// the last flush marker, changes, and across posting those puts and
	// the marker, so that a marker follows the puts it counts (the
	// engine's lock nests inside it). A load without it tells a flush
	// that no marker is due.
	unsigMu sync.Mutex
	unsig   []atomic.Int32

	// ok says, per target, which accesses the window's epochs allow now
	// (okPlain, okNotified; see setOK): what access finds under mu,
	// loaded without it on the hot path.
	ok []atomic.Uint32

	// unalignedMu makes atomics on unaligned elements of this rank's
	// memory atomic (see apply); it guards no field.
	unalignedMu sync.Mutex
}

// winLocks is the lock class of windows' mu (see internal/lockcheck).
type winLocks struct{}

func (winLocks) LockClass() string { return "an rma window's mu" }

// Allocate creates a window of size bytes that the library allocates
// (page-aligned, zeroed) as device memory (verbs.PD.AllocMR): on shm it is
// shared with the ranks of the host, so their puts, gets and atomics on
// it are single copies or CPU atomics made by the origin, as MPI's
// shared-memory windows are. Prefer it to Create for windows that peers
// access. The memory is valid until Free. It is collective.
func (c *Comm) Allocate(ctx context.Context, size int, cfg *WinConfig) (*Win, error) {
	var mr *verbs.MR
	var mem []byte
	var err error
	switch {
	case size < 0:
		err = fmt.Errorf("%w: size %d", ErrOutOfBounds, size)
	case size > 0:
		if mr, err = c.pd.AllocMR(size, verbs.AccessAll); err == nil {
			mem = mr.Bytes()
		}
	}
	return c.create(ctx, mem, mr, cfg, err)
}

// Create creates a window over the caller's memory, which the window
// shares with the caller (MPI's unified model). It is collective.
// Atomics on elements not aligned to their size are applied by the
// target's progress engine rather than the NIC (Allocate's memory is
// always aligned).
func (c *Comm) Create(ctx context.Context, mem []byte, cfg *WinConfig) (*Win, error) {
	return c.create(ctx, mem, nil, cfg, nil)
}

// create makes a window over mem, registered already as mr when the
// library allocated it (else registered here). A failure on any rank
// fails the call on every rank: each publishes its description, or that
// its part failed, in the one collective step.
func (c *Comm) create(ctx context.Context, mem []byte, mr *verbs.MR, cfg *WinConfig, early error) (*Win, error) {
	var conf WinConfig
	if cfg != nil {
		conf = *cfg
	}
	if conf.DispUnit == 0 {
		conf.DispUnit = 1
	}
	c.winMu.Lock()
	c.nextWin++
	id := c.nextWin
	c.winMu.Unlock()
	w := &Win{c: c, id: id, mem: mem, unit: conf.DispUnit, locks: map[int]LockType{}, mr: mr,
		out: make([]atomic.Int32, c.size), bridged: make([]atomic.Int32, c.size), reads: make([]atomic.Int32, c.size),
		amOut: make([]atomic.Int32, c.size), nicOut: make([]atomic.Int32, c.size), unsig: make([]atomic.Int32, c.size),
		failed: make([]error, c.size)}
	me, local := remoteWin{}, early
	if local == nil {
		me, local = w.setup(conf)
	}
	desc := []byte{descFailed}
	if local == nil {
		var expectFrom map[int]int
		if conf.Notify != nil {
			expectFrom = conf.Notify.ExpectFrom
		}
		desc = me.encode(expectFrom)
	}
	w.desc = desc
	if c.rec.fresh.Load() {
		// A respawned rank: the others are not creating windows; Recover
		// exchanges the descriptions.
		if local != nil {
			w.release()
			return nil, opErr("create window", -1, local)
		}
		return w, nil
	}
	all, err := c.Allgather(ctx, desc)
	if err == nil && local != nil {
		err = opErr("create window", -1, local)
	}
	if err != nil {
		w.release()
		return nil, err
	}
	w.remote = make([]remoteWin, c.size)
	w.direct = make([]directPeer, c.size)
	w.carriers = make([]atomic.Pointer[carrier], c.size)
	if w.notify != nil {
		w.credMap = make([]directPeer, c.size)
	}
	w.packs = make([]putPack, c.size)
	for r, b := range all {
		if w.remote[r], err = decodeWin(b, r, c.rank); err != nil {
			w.release()
			return nil, err
		}
		if w.remote[r].notify == notifyPerOrigin && w.tx == nil {
			w.tx = make([]txState, c.size) // only windows with per-origin mailboxes need them
		}
	}
	for r := range w.tx {
		w.tx[r].init(w.remote[r].depth)
	}
	w.ok = make([]atomic.Uint32, c.size)
	w.mu.Lock()
	w.setAllOK()
	w.mu.Unlock()
	if w.notify != nil {
		if err := w.notify.exchangeReplicas(ctx); err != nil {
			w.release()
			return nil, err
		}
	}
	return w, nil
}

// setup registers the window's memory and lock words and creates its
// mailboxes, and returns what describes it to the other ranks.
func (w *Win) setup(conf WinConfig) (remoteWin, error) {
	c := w.c
	var me remoteWin
	if conf.DispUnit < 0 || conf.DispUnit > math.MaxUint32 {
		return me, fmt.Errorf("%w: disp unit %d, want 1..2^32-1", ErrDatatype, conf.DispUnit)
	}
	var err error
	if len(w.mem) > 0 && w.mr == nil {
		if w.mr, err = c.pd.RegisterMR(w.mem, verbs.AccessAll); err != nil {
			return me, err
		}
	}
	if w.mr != nil {
		c.reg.addWin(w.mr)
		me.addr, me.rkey = w.mr.Addr(), w.mr.RKey()
		me.misalign = uint8(uintptr(unsafe.Pointer(&w.mem[0])) % 8)
	}
	// The lock words are device memory too: on shm, peers' lock atomics
	// are then CPU atomics on them.
	lockBytes := 8 * (1 + c.size)
	memSync := shmPort(c.dev) >= 0 && c.size <= maxMemSyncRanks
	if memSync {
		lockBytes += 8 * syncWordsLen(c.size)
	}
	if w.lockMR, err = c.pd.AllocMR(lockBytes, verbs.AccessAll); err != nil {
		return me, err
	}
	w.lockMem = u64s(w.lockMR.Bytes())[:1+c.size]
	if memSync {
		w.syncMem = u64s(w.lockMR.Bytes())[1+c.size:]
		w.syncMap = make([]directPeer, c.size)
		w.postsTaken, w.donesTaken, w.failsTaken = make([]uint64, c.size), make([]uint64, c.size), make([]uint64, c.size)
	}
	me.size, me.unit, me.lockAddr, me.lockKey = uint64(len(w.mem)), uint32(w.unit), w.lockMR.Addr(), w.lockMR.RKey()
	if conf.Notify != nil {
		if w.notify, err = newNotify(w, *conf.Notify); err != nil {
			return me, err
		}
		me.notify, me.countOps, me.depth = w.notify.mode, conf.Notify.Count == mailbox.CountOps, uint8(w.notify.cfg.Depth)
		if err = w.credits.alloc(c, c.size); err != nil {
			return me, err
		}
		me.credAddr, me.credKey = w.credits.mr.Addr(), w.credits.mr.RKey()
	}
	c.winMu.Lock()
	c.wins[w.id] = w
	c.winMu.Unlock()
	return me, nil
}

// Bytes returns the window's local memory. Memory from Allocate is
// released by Free and must not be used afterwards.
func (w *Win) Bytes() []byte { return w.mem }

// Free frees the window. It is collective: it waits for this rank's
// operations and for every rank to stop using the window. The window is
// freed on every rank even when an operation failed; the failure is
// returned on every rank (ErrRemote on those where it did not happen).
func (w *Win) Free(ctx context.Context) error {
	err := w.FlushAll(ctx)
	err = cmp.Or(err, w.c.agree(ctx, "free", err))
	w.release()
	return err
}

func (w *Win) release() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.freed {
		return
	}
	w.freed = true
	w.setAllOK()
	w.resetTx()
	w.c.winMu.Lock()
	delete(w.c.wins, w.id)
	w.c.winMu.Unlock()
	if w.notify != nil {
		w.notify.close()
	}
	if w.mr != nil {
		w.c.reg.removeWin(w.mr)
		w.mr.Deregister()
	}
	if w.lockMR != nil {
		w.lockMR.Deregister()
	}
	w.credits.free()
}

// What access allows towards a target, kept per target in w.ok.
const (
	okPlain    = 1 << iota // any operation: an epoch covers the target
	okNotified             // a put: the above, or the target's notified window expects this rank
)

// setOK recomputes what access allows towards target (w.mu held), after
// the epochs, the window's state or the target's description changed.
func (w *Win) setOK(target int) {
	lockcheck.AssertHeld(&w.mu, "rma: setOK")
	if w.ok == nil {
		return // not connected yet (a respawned rank before Recover)
	}
	var s uint32
	if !w.freed {
		if w.fence || w.lockAll || w.locks[target] != 0 || slices.Contains(w.startGroup, target) {
			s |= okPlain
		}
		rw := &w.remote[target]
		switch {
		case rw.notify == 0:
			s |= s << 1 // okNotified as okPlain
		case rw.notify != notifyPerOrigin || rw.expect != 0:
			s |= okNotified
		}
	}
	w.ok[target].Store(s)
}

// setAllOK is setOK for every target.
func (w *Win) setAllOK() {
	for t := range w.ok {
		w.setOK(t)
	}
}

// access checks that an operation may go to target now; w.mu is not held
// (under -tags rvmadebug, taking it again panics). What the epochs allow
// is loaded without the lock; only a refusal takes the slow path, which
// says why.
func (w *Win) access(op string, target int, notified bool) error {
	if uint(target) < uint(len(w.ok)) {
		bit := uint32(okPlain)
		if notified {
			bit = okNotified
		}
		if w.ok[target].Load()&bit != 0 && !w.c.rec.fresh.Load() {
			return nil
		}
	}
	if err := w.c.checkRank(op, target); err != nil {
		return err
	}
	if err := w.c.usable(op); err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.freed {
		return opErr(op, target, ErrClosed)
	}
	if notified && w.notifyTarget(target) {
		// A notified window's mailboxes are always open, but a per-origin
		// window has none for an origin it does not expect.
		return w.checkExpect(op, target)
	}
	if w.fence || w.lockAll || w.locks[target] != 0 {
		return nil
	}
	for _, r := range w.startGroup {
		if r == target {
			return nil
		}
	}
	return opErr(op, target, ErrNoEpoch)
}

func (w *Win) notifyTarget(target int) bool { return w.remote[target].notify != 0 }

// span checks [disp*unit, +extent) against the target's window and
// returns the byte offset.
func (w *Win) span(op string, target, disp, extent int) (int, error) {
	rw := &w.remote[target]
	off, ok := byteSpan(disp, int(rw.unit), extent, rw.size)
	if !ok {
		return 0, opErr(op, target, fmt.Errorf("%w: %d bytes at displacement %d (unit %d) of a %d-byte window",
			ErrOutOfBounds, extent, disp, rw.unit, rw.size))
	}
	return off, nil
}

// byteSpan returns disp*unit if [disp*unit, +extent) lies within size
// bytes. No step can overflow: a displacement whose byte offset does not
// fit in 64 bits is simply out of bounds.
func byteSpan(disp, unit, extent int, size uint64) (int, bool) {
	if disp < 0 || unit < 0 || extent < 0 {
		return 0, false
	}
	hi, off := bits.Mul64(uint64(disp), uint64(unit))
	if hi != 0 || off > size || off > math.MaxInt || uint64(extent) > size-off {
		return 0, false
	}
	return int(off), true
}

// winOp is an operation of the window towards one target: its Op, the
// Request handed out for it, and what it counts in while in flight (one
// allocation for all three).
type winOp struct {
	op     progress.Op
	req    Request
	w      *Win
	target int
	kind   []atomic.Int32 // w.reads, w.amOut, w.nicOut, or nil
	reuse  bool           // no Request of it was handed out: back to w.c.ops once finished
}

// Started counts the operation in (the engine's lock held).
func (o *winOp) Started() {
	o.w.out[o.target].Add(1)
	o.w.outN.Add(1)
	if o.kind != nil {
		o.kind[o.target].Add(1)
	}
}

// Finished records its failure and counts it out (the engine's lock
// held). The failure is recorded before the counts fall: a flush that
// finds nothing in flight without the lock then sees it.
func (o *winOp) Finished(err error) {
	w := o.w
	if !errors.Is(err, errDropped) {
		w.fail(o.target, err)
	}
	w.out[o.target].Add(-1)
	w.outN.Add(-1)
	if o.kind != nil {
		o.kind[o.target].Add(-1)
	}
	if o.reuse {
		*o = winOp{}
		w.c.ops.Put(o)
	}
}

// request is the operation's Request.
func (o *winOp) request(name string) *Request {
	o.req = Request{op: &o.op, name: name, rank: o.target}
	return &o.req
}

// track registers an operation of n work requests to target; it counts
// in w.out until it finishes.
func (w *Win) track(n, target int) (*winOp, uint64) { return w.trackAs(n, target, nil) }

// trackAs is track that also raises kind[target] (w.reads, w.amOut,
// w.nicOut) while the operation is in flight.
func (w *Win) trackAs(n, target int, kind []atomic.Int32) (*winOp, uint64) {
	o := &winOp{w: w, target: target, kind: kind}
	return o, w.c.eng.StartOp(&o.op, n, o)
}

// trackInternal is track for an operation whose Request nobody gets (a
// flush's marker): its record is reused once it finishes.
func (w *Win) trackInternal(n, target int) (*winOp, uint64) {
	o, _ := w.c.ops.Get().(*winOp)
	if o == nil {
		o = &winOp{}
	}
	o.w, o.target, o.reuse = w, target, true
	return o, w.c.eng.StartOp(&o.op, n, o)
}

// seg is one contiguous piece of a transfer.
type seg struct{ o, t, n int }

// segments pairs the blocks of the origin and target layouts.
func segments(ol, tl Layout, emit func(seg)) {
	oi, ti, oo, to := 0, 0, 0, 0 // block index and offset within it
	for oi < ol.Count && ti < tl.Count {
		n := min(ol.Block-oo, tl.Block-to)
		if n > 0 {
			emit(seg{o: oi*ol.Stride + oo, t: ti*tl.Stride + to, n: n})
		}
		oo += n
		to += n
		if oo == ol.Block {
			oi, oo = oi+1, 0
		}
		if to == tl.Block {
			ti, to = ti+1, 0
		}
	}
}

// smallBlock is the target block size below which a strided put travels
// packed, as one active message the target unpacks, rather than as one
// WRITE per block. Packing saves packets but costs two copies and a trip
// through the target's progress engine; measured on halo3d's y faces (64
// blocks of 512 B), the WRITEs win, so only tiny blocks are packed.
const smallBlock = 64

// Rput starts a put of origin into target's window at disp (in the
// target's displacement units) and returns its request; the put has
// completed at the target when the request has, or at the next
// synchronisation. origin must not change until then.
func (w *Win) Rput(ctx context.Context, origin []byte, target, disp int) (*Request, error) {
	return w.orDone(w.put(ctx, origin, Layout{}, target, disp, Layout{}, true))
}

// orDone returns the request of an operation that may have completed in
// the call that started it (then its request is nil, and so is err): one
// finished request serves them all.
func (w *Win) orDone(req *Request, err error) (*Request, error) {
	if req == nil && err == nil {
		return w.c.doneReq, nil
	}
	return req, err
}

// Put is Rput without a request: it completes at the next
// synchronisation (fence, complete, unlock, flush, or, on a notified
// window, the target's epoch). It asks for no completion of its own, as
// MPI_Put needs none: a flush sends one zero-length marker behind all of
// a target's unsignalled puts and waits for it (RC completes in order), so
// a stream of puts costs no completion processing. An error of such a put
// surfaces at that flush.
func (w *Win) Put(ctx context.Context, origin []byte, target, disp int) error {
	_, err := w.put(ctx, origin, Layout{}, target, disp, Layout{}, false)
	return err
}

// PutLayout is Put with layouts for both sides: non-contiguous data moves
// without a put per element.
func (w *Win) PutLayout(ctx context.Context, origin []byte, ol Layout, target, disp int, tl Layout) error {
	_, err := w.put(ctx, origin, ol, target, disp, tl, false)
	return err
}

// RputLayout is Rput with layouts.
func (w *Win) RputLayout(ctx context.Context, origin []byte, ol Layout, target, disp int, tl Layout) (*Request, error) {
	return w.orDone(w.put(ctx, origin, ol, target, disp, tl, true))
}

// check validates a put or get before anything moves: the epoch, both
// layouts against each other and the origin buffer, and the target span;
// it returns the normalised layouts and the target byte offset.
func (w *Win) check(name string, origin []byte, ol Layout, target, disp int, tl Layout, notified bool) (Layout, Layout, int, error) {
	if err := w.access(name, target, notified); err != nil {
		return ol, tl, 0, err
	}
	ol, err := ol.norm(len(origin))
	if err == nil {
		tl, err = tl.norm(ol.Size())
	}
	if err == nil && (ol.Extent() > len(origin) || ol.Size() != tl.Size()) {
		err = fmt.Errorf("%w: origin layout moves %d of %d bytes, target layout %d", ErrDatatype, ol.Size(), len(origin), tl.Size())
	}
	if err != nil {
		return ol, tl, 0, opErr(name, target, err)
	}
	off, err := w.span(name, target, disp, tl.Extent())
	return ol, tl, off, err
}

// put implements the puts; without signal it posts unsignalled work
// requests and returns no request, and none either when the put completed
// in the call (a copy).
func (w *Win) put(ctx context.Context, origin []byte, ol Layout, target, disp int, tl Layout, signal bool) (*Request, error) {
	const name = "put"
	ol, tl, off, err := w.check(name, origin, ol, target, disp, tl, true)
	if err != nil {
		return nil, err
	}
	if tl.Size() == 0 {
		return nil, nil
	}
	x := xfer{origin: origin, ol: ol, tl: tl, off: off, signal: signal}
	if w.remote[target].notify != 0 {
		return w.putNotified(ctx, target, x)
	}
	return w.carrier(ctx, target).put(ctx, x)
}

// putWRs makes the work requests of a put: one per run of consecutive
// target bytes, of up to maxSGE origin pieces, except that a window that
// counts puts gets exactly one per run (it counts each run as one put), a
// longer run then travelling from a copy. Into a notified window every
// request is a mailbox write; the target's mailbox counts them in the
// order they arrive.
//
// They are appended to dst. A caller that passes room for them (a
// contiguous put makes one) gets inline data aliasing origin, which is
// right when they are posted before the call returns (verbs copies inline
// data at post); one that keeps them longer copies it. With dst nil the
// inline data is always copied.
func (w *Win) putWRs(dst []verbs.SendWR, origin []byte, ol Layout, target, off int, tl Layout) ([]verbs.SendWR, error) {
	rw := &w.remote[target]
	if dst != nil && ol.Contiguous() && tl.Contiguous() && ol.Size() <= inlineMax {
		// A small contiguous put, the common case, without the pieces'
		// bookkeeping: one inline request, nothing allocated.
		wr := w.putTo(target, off)
		wr.Flags |= verbs.FlagInline
		wr.Inline = origin[:ol.Size()]
		return append(dst, wr), nil
	}
	// One request per run of consecutive target bytes, in two passes that
	// allocate twice per call, not per run: a strided put of 64 rows (a
	// halo's face) is common, and its requests were two allocations
	// each.
	runs, srcs := putRuns(nil, nil, origin, ol, off, tl, rw.countOps)
	// Small puts travel inline (copied at post time), which spares
	// registering the origin: callers often put from fresh small slices.
	inline := ol.Size() <= inlineMax
	wrs := slices.Grow(dst, len(runs))
	var sges []verbs.SGE // every request's gather list, one array
	if !inline {
		sges = make([]verbs.SGE, 0, len(srcs))
	}
	var mr *verbs.MR // the region of the last piece: the next one is usually in it too
	for _, r := range runs {
		wrs = append(wrs, w.putTo(target, r.dst))
		wr := &wrs[len(wrs)-1]
		ps := srcs[r.first : r.first+r.n]
		if len(ps) > maxSGE {
			ps = [][]byte{slices.Concat(ps...)}
		}
		if inline {
			for _, src := range ps {
				wr.Inline = append(wr.Inline, src...)
			}
			wr.Flags |= verbs.FlagInline
			continue
		}
		first := len(sges)
		for _, src := range ps {
			var sge verbs.SGE
			var err error
			if mr, sge, err = w.c.reg.sgeNear(mr, src); err != nil {
				return nil, err
			}
			sges = append(sges, sge)
		}
		wr.SGL = sges[first:len(sges):len(sges)]
	}
	return wrs, nil
}

// putRun is a run of consecutive target bytes of a put: its target
// offset, and its origin pieces srcs[first:first+n].
type putRun struct{ dst, first, n int }

// putRuns appends a put's runs and their origin pieces to runs and srcs:
// one run per stretch of consecutive target bytes, of up to maxSGE
// pieces, except that a window that counts puts gets exactly one per
// stretch (it counts each as one put).
func putRuns(runs []putRun, srcs [][]byte, origin []byte, ol Layout, off int, tl Layout, countOps bool) ([]putRun, [][]byte) {
	next := -1 // the target offset where the last run ends
	segments(ol, tl, func(s seg) {
		dst, src := off+s.t, origin[s.o:s.o+s.n]
		if n := len(runs); n > 0 && (runs[n-1].n < maxSGE || countOps) && next == dst {
			runs[n-1].n++
		} else {
			runs = append(runs, putRun{dst: dst, first: len(srcs), n: 1})
		}
		srcs = append(srcs, src)
		next = dst + s.n
	})
	return runs, srcs
}

// putTo is a signalled request writing at byte off of target's window:
// a WRITE, or a mailbox write into a notified window.
func (w *Win) putTo(target, off int) verbs.SendWR {
	rw := &w.remote[target]
	if rw.notify != 0 {
		return verbs.SendWR{Opcode: verbs.OpMailboxWrite, Flags: verbs.FlagSignaled, Mailbox: w.mailboxAddr(target), MailboxOffset: uint64(off)}
	}
	return verbs.SendWR{Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled, RemoteAddr: rw.addr + uint64(off), RKey: rw.rkey}
}

// postUnsignalled posts puts that produce no completion; they count in
// w.unsig until a flush puts a marker behind them. w.unsigMu is held
// across the post so a concurrent flush cannot slip its marker in front.
func (w *Win) postUnsignalled(qp *verbs.QP, target int, wrs []verbs.SendWR) error {
	for i := range wrs {
		wrs[i].Flags &^= verbs.FlagSignaled
	}
	w.unsigMu.Lock()
	defer w.unsigMu.Unlock()
	k, err := w.c.post(qp, wrs)
	if k > 0 {
		w.unsig[target].Add(int32(k))
	}
	if err != nil {
		return opErr("put", target, err)
	}
	return nil
}

// marker posts a signalled zero-length WRITE behind target's unsignalled
// puts, if there are any: when it completes, they have (RC completes in
// order, and a failed put fails the marker too).
func (w *Win) marker(ctx context.Context, target int) error {
	if err := w.directFlushed(target); err != nil {
		return err
	}
	if err := w.sendPack(ctx, target); err != nil {
		return err
	}
	if w.unsig[target].Load() == 0 {
		return nil
	}
	w.unsigMu.Lock()
	defer w.unsigMu.Unlock()
	if w.unsig[target].Load() == 0 {
		return nil
	}
	qp, err := w.c.conn(ctx, target)
	if err != nil {
		return err
	}
	if qp.Idle() {
		// All done already: on shared memory the puts were copies.
		w.unsig[target].Store(0)
		return nil
	}
	rw := &w.remote[target]
	o, base := w.trackInternal(1, target)
	wr := [1]verbs.SendWR{{Opcode: verbs.OpWrite, Flags: verbs.FlagSignaled, ID: base, RemoteAddr: rw.lockAddr, RKey: rw.lockKey}}
	if k, err := w.c.post(qp, wr[:]); err != nil {
		w.c.eng.Posted(&o.op, base, 1, k, err)
		return err
	}
	w.unsig[target].Store(0)
	return nil
}

// inlineMax is the largest put sent inline (the QPs' MaxInline default).
const inlineMax = 256

// postOps posts wrs as one tracked operation (counted in kind too, if not
// nil: see trackAs).
func (w *Win) postOps(name string, qp *verbs.QP, target int, wrs []verbs.SendWR, kind []atomic.Int32) (*Request, error) {
	o, base := w.trackAs(len(wrs), target, kind)
	req := o.request(name) // before the post: the op may finish at once
	for i := range wrs {
		wrs[i].ID = base + uint64(i)
	}
	k, err := w.c.post(qp, wrs)
	if err != nil {
		w.c.eng.Posted(&o.op, base, len(wrs), k, err)
		if k == 0 {
			return nil, opErr(name, target, err)
		}
	}
	return req, nil
}

// Rget starts a get of len(origin) bytes from target's window at disp
// into origin.
func (w *Win) Rget(ctx context.Context, origin []byte, target, disp int) (*Request, error) {
	return w.orDone(w.get(ctx, origin, Layout{}, target, disp, Layout{}))
}

// Get is Rget completing at the next synchronisation.
func (w *Win) Get(ctx context.Context, origin []byte, target, disp int) error {
	_, err := w.get(ctx, origin, Layout{}, target, disp, Layout{})
	return err
}

// RgetLayout is Rget with layouts for both sides.
func (w *Win) RgetLayout(ctx context.Context, origin []byte, ol Layout, target, disp int, tl Layout) (*Request, error) {
	return w.orDone(w.get(ctx, origin, ol, target, disp, tl))
}

// get implements the gets; it returns no request when the get completed
// in the call (a copy from a window mapped here).
func (w *Win) get(ctx context.Context, origin []byte, ol Layout, target, disp int, tl Layout) (*Request, error) {
	const name = "get"
	ol, tl, off, err := w.check(name, origin, ol, target, disp, tl, false)
	if err != nil {
		return nil, err
	}
	if tl.Size() == 0 {
		return nil, nil
	}
	return w.carrier(ctx, target).get(ctx, xfer{origin: origin, ol: ol, tl: tl, off: off})
}

// Register registers origin's backing array for the operations that
// will move pieces of it, ahead of them: each then finds it in the
// registration cache rather than registering the rest of the array from
// where it starts. A hint for callers whose buffers reach rma in pieces
// (a C library's datatype walked run by run): pieces of one Go slice
// already share its array's registration. The cache may evict it as any
// other.
func (w *Win) Register(origin []byte) error {
	if len(origin) == 0 {
		return nil
	}
	_, _, err := w.c.reg.region(origin)
	return err
}

// Run is one contiguous piece of an indexed transfer: Len bytes at
// Origin in the origin buffer, at Target past the displacement (in the
// target's displacement units, as the displacement).
type Run struct {
	Origin, Target, Len int
}

// PutRuns puts each run of origin as Put would (origin[r.Origin:][:r.Len]
// to target at disp+r.Target): the pieces of a datatype that no Layout
// describes (MPI's indexed and struct types), in one call that looks up
// or registers origin once rather than once per piece. The runs may come
// in any order. It checks every run before it moves anything; an error
// of a put itself surfaces as Put's do, and the runs before it have
// started.
func (w *Win) PutRuns(ctx context.Context, origin []byte, runs []Run, target, disp int) error {
	return w.c.reg.runs(ctx, "put", origin, runs, target, disp, w.Put)
}

// GetRuns is PutRuns for gets: each run of origin is filled as Get would
// fill it.
func (w *Win) GetRuns(ctx context.Context, origin []byte, runs []Run, target, disp int) error {
	return w.c.reg.runs(ctx, "get", origin, runs, target, disp, w.Get)
}

// runs checks runs, registers origin, then moves each run with op.
func (r *regCache) runs(ctx context.Context, name string, origin []byte, runs []Run, target, disp int,
	op func(context.Context, []byte, int, int) error) error {
	moves := false
	for i, run := range runs {
		if run.Len < 0 || run.Origin < 0 || run.Origin > len(origin)-run.Len {
			return opErr(name, target, fmt.Errorf("%w: run %d {origin %d, length %d} outside the %d-byte origin buffer",
				ErrDatatype, i, run.Origin, run.Len, len(origin)))
		}
		if run.Target < 0 || disp > 0 && run.Target > math.MaxInt-disp {
			return opErr(name, target, fmt.Errorf("%w: run %d at displacement %d + %d", ErrOutOfBounds, i, disp, run.Target))
		}
		moves = moves || run.Len > 0
	}
	if !moves {
		return nil
	}
	if len(runs) > 1 {
		// Registered whole now, each piece's lookup finds it first;
		// piece by piece, each registers the rest of origin from itself.
		if _, _, err := r.region(origin); err != nil {
			return opErr(name, target, err)
		}
	}
	for _, run := range runs {
		if run.Len == 0 {
			continue
		}
		if err := op(ctx, origin[run.Origin:run.Origin+run.Len], target, disp+run.Target); err != nil {
			return err
		}
	}
	return nil
}

// mailboxAddr is the mailbox this rank puts into at target's notified
// window: derived from the window's identity, never exchanged.
func (w *Win) mailboxAddr(target int) uint64 {
	if w.remote[target].notify == notifyAggregate {
		return mailboxOf(w.id, -1)
	}
	return mailboxOf(w.id, w.c.rank)
}

func mailboxOf(win uint32, origin int) uint64 {
	if origin < 0 {
		return uint64(win)<<32 | 0xffffffff
	}
	return uint64(win)<<32 | uint64(origin)
}

// Flush waits until every operation this rank started on the window
// towards target has completed at the target.
func (w *Win) Flush(ctx context.Context, target int) error {
	if err := w.c.checkRank("flush", target); err != nil {
		return err
	}
	if err := w.marker(ctx, target); err != nil {
		return opErr("flush", target, err)
	}
	if w.out[target].Load() == 0 && w.failedN.Load() == 0 {
		idle()
		return nil // nothing in flight, nothing failed: no lock
	}
	var failed error
	if err := w.c.eng.Wait(ctx, func() bool {
		if w.out[target].Load() != 0 {
			return false
		}
		failed = w.takeFailed(target)
		return true
	}); err != nil {
		return opErr("flush", target, err)
	}
	return opErr("flush", target, failed)
}

// FlushAll is Flush towards every rank.
func (w *Win) FlushAll(ctx context.Context) error {
	for r := range w.c.size {
		if err := w.marker(ctx, r); err != nil {
			return opErr("flush", r, err)
		}
	}
	if w.outN.Load() == 0 && w.failedN.Load() == 0 {
		idle()
		return nil
	}
	var failed error
	rank := -1
	if err := w.c.eng.Wait(ctx, func() bool {
		if w.outN.Load() != 0 {
			return false
		}
		for r := range w.failed {
			if err := w.takeFailed(r); err != nil && failed == nil {
				failed, rank = err, r
			}
		}
		return true
	}); err != nil {
		return opErr("flush", -1, err)
	}
	return opErr("flush", rank, failed)
}

// fail records err, if it is the first failure towards target since the
// last flush there, for that flush to report (the engine's lock held).
func (w *Win) fail(target int, err error) {
	if err != nil && w.failed[target] == nil {
		w.failed[target] = err
		w.failedN.Add(1)
	}
}

// idle is what a synchronisation call that had nothing to wait for does:
// nothing, unless processors are scarce (more ranks than cores), where it
// yields. A program that polls a flag in its window with flushes (MPI's
// passive-target idiom) otherwise keeps its core from the ranks it waits
// for until the kernel preempts it, milliseconds later, as MPI libraries
// yield when idle under oversubscription.
func idle() {
	if spin.Scarce() {
		spin.Yield()
	}
}

// takeFailed returns and forgets the failure recorded towards target
// (the engine's lock held).
func (w *Win) takeFailed(target int) error {
	err := w.failed[target]
	if err != nil {
		w.failed[target] = nil
		w.failedN.Add(-1)
	}
	return err
}

// FlushLocal waits until the origin buffers of operations towards target
// may be reused. rvma keeps origin buffers until the target acknowledges
// them (a retransmission may read them again), so it equals Flush.
func (w *Win) FlushLocal(ctx context.Context, target int) error { return w.Flush(ctx, target) }

// FlushLocalAll equals FlushAll (see FlushLocal).
func (w *Win) FlushLocalAll(ctx context.Context) error { return w.FlushAll(ctx) }

var syncWord uint64

// Sync synchronises the window's memory with the caller's view (MPI's
// win_sync). Memory is unified, so it is only a memory barrier.
func (w *Win) Sync() {
	atomicAdd(&syncWord, 0)
}

// errOf maps a failed completion to an error: mailbox refusals to the
// mailbox package's sentinels, and the failures of a peer that stopped
// answering (retries or receiver-not-ready retries exhausted, the
// connection flushed) to ErrPeer.
func (c *Comm) errOf(wc *verbs.WorkCompletion) error {
	c.troubled.Store(true)
	switch wc.Status {
	case verbs.StatusRetryExceeded, verbs.StatusFlushed:
		return fmt.Errorf("%w: %w", ErrPeer, wc.Err())
	}
	if wc.Opcode == verbs.WCMailboxWrite {
		return mailbox.CompletionError(wc)
	}
	return wc.Err()
}

// bridge tracks an operation that completes outside the Comm's CQ (on
// the paths, or over the reliability layer): q, that carrier's
// completer, runs wait and its result finishes an ordinary Op, so that
// flushes wait for it and report its failure. Until then, Complete does
// not rely on the RC connection's ordering towards target (see
// bridging).
func (w *Win) bridge(name string, target int, q *completer, wait func(ctx context.Context) error) *Request {
	o, _ := w.track(0, target)
	req := o.request(name)
	w.bridgeOp(target, q, func() error { return wait(w.c.bg) }, func(err error) { w.c.eng.Finish(&o.op, err) })
	return req
}

// bridgeOp counts an operation towards target as bridged until wait,
// which q runs, has returned; finish then finishes its Op.
func (w *Win) bridgeOp(target int, q *completer, wait func() error, finish func(error)) {
	w.c.eng.Locked(func() { w.bridged[target].Add(1) })
	q.add(&w.c.bridges, func() {
		err := wait()
		w.c.eng.Locked(func() { w.bridged[target].Add(-1) })
		finish(err)
	})
}

// bridging reports whether bridged operations towards target are in
// flight: they are not ordered before a message on the RC connection.
func (w *Win) bridging(target int) bool { return w.bridged[target].Load() > 0 }
