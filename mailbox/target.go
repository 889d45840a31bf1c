package mailbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rvma/rvma/epoch"
	"github.com/rvma/rvma/internal/futex"
	"github.com/rvma/rvma/internal/shmbox"
	"github.com/rvma/rvma/internal/spin"
	"github.com/rvma/rvma/verbs"
)

// Refusal codes: the verbs.MailboxResult a target answers, which reaches the
// initiator as WorkCompletion.VendorErr.
const (
	codeNoMailbox    = verbs.MailboxRefused     // no window at the address, and no catch-all
	codeClosed       = verbs.MailboxRefused + 1 // the window is closed
	codeOutOfRange   = verbs.MailboxRefused + 2 // the put would cross the end of the buffer
	codeEpochCrossed = verbs.MailboxRefused + 3 // a multi-packet put straddled an epoch
	codeLimit        = verbs.MailboxRefused + 4 // the peer exceeded its outstanding-bytes limit
	codeLost         = verbs.MailboxRefused + 5 // the payload could not be pulled from the initiator (shm)
)

// Errors.
var (
	ErrWindowClosed  = errors.New("mailbox: window closed")
	ErrNoMailbox     = errors.New("mailbox: no window at that address")
	ErrOutOfRange    = errors.New("mailbox: put crosses the end of the buffer")
	ErrEpochCrossed  = errors.New("mailbox: put straddled an epoch boundary")
	ErrLimit         = errors.New("mailbox: limit exceeded")
	ErrNoBuffer      = errors.New("mailbox: no buffer posted within the retry bound")
	ErrExists        = errors.New("mailbox: a window already exists at that address")
	ErrBadConfig     = errors.New("mailbox: invalid configuration")
	ErrNothingToTake = errors.New("mailbox: the head buffer holds nothing")
)

// Count is what a threshold counts.
type Count uint8

// Threshold units.
const (
	CountBytes Count = iota // payload bytes placed
	CountOps                // puts completed (their last packet placed)
)

// Placement is how a window places arriving bytes.
type Placement uint8

// Placements.
const (
	// Steered places each put at the offset its initiator named.
	Steered Placement = iota
	// Appended places each put after the previous one in the buffer,
	// ignoring the offset.
	Appended
)

// Config configures a window. Threshold is required; the zero value of the
// other fields means defaults.
type Config struct {
	Threshold int       // bytes or operations that complete an epoch; >= 1
	Count     Count     // default CountBytes
	Placement Placement // default Steered
	History   int       // completed buffers retained for rewind; default 4, range 1..1024
	// Silent makes a closed window discard later puts without refusing
	// them (no NACK), against floods.
	Silent bool
}

// TargetConfig sets a target's limits. The zero value means no limits.
type TargetConfig struct {
	// MaxPosted caps the buffers posted to one window (0: unlimited).
	MaxPosted int
	// MaxOutstanding caps the bytes one peer may have placed in epochs
	// not yet completed, over all windows (0: unlimited). Puts beyond it
	// are refused.
	MaxOutstanding int
}

// Target receives mailbox puts for one device.
type Target struct {
	dev *verbs.Device
	cfg TargetConfig

	mu       sync.RWMutex
	windows  map[uint64]*Window
	catchAll *Window

	omu         sync.Mutex
	outstanding map[peer]int
}

type peer struct {
	gid netip.AddrPort
	qpn uint32
}

// NewTarget installs a target as dev's mailbox handler.
func NewTarget(dev *verbs.Device, cfg *TargetConfig) *Target {
	t := &Target{dev: dev, windows: map[uint64]*Window{}, outstanding: map[peer]int{}}
	if cfg != nil {
		t.cfg = *cfg
	}
	dev.SetMailboxHandler(t)
	return t
}

// Init creates a window at a mailbox address.
func (t *Target) Init(addr uint64, cfg Config) (*Window, error) {
	w, err := t.newWindow(addr, cfg)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.windows[addr] != nil {
		return nil, fmt.Errorf("%w: %#x", ErrExists, addr)
	}
	t.windows[addr] = w
	return w, nil
}

// InitCatchAll creates the window that receives puts to addresses that
// have no window.
func (t *Target) InitCatchAll(cfg Config) (*Window, error) {
	w, err := t.newWindow(0, cfg)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.catchAll != nil {
		return nil, fmt.Errorf("%w: catch-all", ErrExists)
	}
	t.catchAll = w
	return w, nil
}

func (t *Target) newWindow(addr uint64, cfg Config) (*Window, error) {
	if cfg.History == 0 {
		cfg.History = 4
	}
	if cfg.Threshold < 1 || cfg.History < 1 || cfg.History > 1024 || cfg.Count > CountOps || cfg.Placement > Appended {
		return nil, fmt.Errorf("%w: %+v", ErrBadConfig, cfg)
	}
	w := &Window{t: t, addr: addr, cfg: cfg, history: epoch.New(cfg.History),
		notify: make(chan struct{}), pins: map[peer]pin{}, bySlot: make([]*buffer, boxSlots)}
	// The window's counters live in a box (package shmbox). On a device
	// with shm ports the box is shared with the host's processes, whose
	// puts are then placed and counted by their initiators; the catch-all
	// and windows of targets that limit each peer's bytes (which direct
	// puts would escape) keep theirs private.
	var mem []byte
	if addr != 0 && t.dev != nil && t.cfg.MaxOutstanding == 0 {
		if m, err := t.dev.ShareMailbox(addr, shmbox.Size(boxSlots)); err == nil {
			mem, w.shared = m, true
		}
	}
	if mem == nil {
		words := make([]uint64, shmbox.Size(boxSlots)/8)
		mem = unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), 8*len(words))
	}
	w.box = shmbox.New(mem, boxSlots, cfg.Threshold, cfg.Count == CountOps, cfg.Placement == Appended)
	return w, nil
}

// boxSlots is how many posted buffers a window's box holds; more wait in
// the window until a slot frees (puts go to the first of the box's
// buffers that is not full).
const boxSlots = 64

func (t *Target) lookup(addr uint64) *Window {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if w := t.windows[addr]; w != nil {
		return w
	}
	return t.catchAll
}

// charge adds n placed bytes to a peer's outstanding count; false if the
// limit forbids it.
func (t *Target) charge(p peer, n int) bool {
	if t.cfg.MaxOutstanding == 0 {
		return true
	}
	t.omu.Lock()
	defer t.omu.Unlock()
	if t.outstanding[p]+n > t.cfg.MaxOutstanding {
		return false
	}
	t.outstanding[p] += n
	return true
}

func (t *Target) release(byPeer map[peer]int) {
	if t.cfg.MaxOutstanding == 0 {
		return
	}
	t.omu.Lock()
	defer t.omu.Unlock()
	for p, n := range byPeer {
		if t.outstanding[p] -= n; t.outstanding[p] <= 0 {
			delete(t.outstanding, p)
		}
	}
}

// HandleMailboxWrite implements verbs.MailboxHandler: it places one packet
// of a put and counts it.
func (t *Target) HandleMailboxWrite(m *verbs.MailboxWrite) verbs.MailboxResult {
	w := t.lookup(m.Mailbox)
	if w == nil {
		return codeNoMailbox
	}
	return w.place(m)
}

// Window is one mailbox: posted buffers, a threshold, completion records
// and a history.
type Window struct {
	t    *Target
	addr uint64
	cfg  Config

	mu sync.Mutex
	// The counters of the posted buffers, locked under mu (mu first).
	box      *shmbox.Box
	shared   bool          // box is in shared memory, listed on the shm ports
	seenWake atomic.Uint32 // the box's wake word when last settled
	bySlot   []*buffer     // the buffer in each box slot
	lastBuf  *byte         // locate's cache
	lastLoc  shmbox.Location
	posted   []*buffer // head first; the first ones are in the box
	spare    []*buffer // retired buffer records, for the next posts
	nextID   int
	epoch    uint64
	closed   bool
	pins     map[peer]pin
	pending  []epoch.Record // completions, those from pendHead on not yet taken by Wait/Poll
	pendHd   int
	npend    atomic.Int32 // records not taken, read without the lock by spinning waiters
	history  *epoch.History
	// notify is closed, and replaced, when waiters asleep on it (sleepers
	// of them) should look again: every one of them, since a close must
	// reach them all and one settle may complete several epochs.
	notify   chan struct{}
	sleepers int
	// waited is how long Wait waited lately where ranks share cores
	// (spin.Scarce), in ns, averaged: long waits sleep at once.
	waited atomic.Int64
	// packets counts the writes that reached this window as packets
	// (place); packetsSeen is its value at the last Wait's start. A wait
	// gives the core away every round (spin.PauseShared) only while none
	// arrive: packets need this process's goroutines.
	packets, packetsSeen atomic.Uint64
}

// sleepAfter is how long Wait's recent waits must have lasted, where
// ranks share cores, for the next to sleep at once rather than spin: a
// waiter for a peer that computes meanwhile takes half of a shared core
// from it by spinning, while a wake-up costs tens of microseconds.
const sleepAfter = 200 * time.Microsecond

// buffer is a posted buffer; its counters (bytes, puts, reservations,
// puts in progress, fullness, ranges written) are its box slot's.
type buffer struct {
	id      int
	data    []byte
	slot    int // in the box; -1 while waiting for a slot
	byPeer  map[peer]int
	retired bool
	// gen counts the record's abandons and reuses: a reservation or a
	// pin of an earlier generation is void.
	gen int
}

// pin is a put of several packets under way: its buffer, of generation
// gen, and where its first byte goes (Appended windows).
type pin struct {
	buf  *buffer
	gen  int
	base int
}

// Addr returns the window's mailbox address (0 for the catch-all).
func (w *Window) Addr() uint64 { return w.addr }

// Post adds a buffer to the window's queue and returns its id.
func (w *Window) Post(buf []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0, ErrWindowClosed
	}
	if max := w.t.cfg.MaxPosted; max > 0 && len(w.posted) >= max {
		return 0, fmt.Errorf("%w: %d buffers posted", ErrLimit, len(w.posted))
	}
	w.nextID++
	// A retired record is reused (no allocation per epoch): its new
	// generation voids what still points at it.
	var b *buffer
	if n := len(w.spare); n > 0 {
		b, w.spare = w.spare[n-1], w.spare[:n-1]
		*b = buffer{gen: b.gen + 1, byPeer: b.byPeer}
		clear(b.byPeer)
	} else {
		b = new(buffer)
	}
	b.id, b.data, b.slot = w.nextID, buf, -1
	w.posted = append(w.posted, b)
	w.box.Lock()
	w.fill()
	w.box.Unlock()
	return w.nextID, nil
}

// locate says where buf is for the box: in memory initiators can map, or
// not. Windows repost the same memory, so the last answer is kept.
func (w *Window) locate(buf []byte) shmbox.Location {
	loc := shmbox.Location{Len: len(buf)}
	if !w.shared || len(buf) == 0 {
		return loc
	}
	if &buf[0] == w.lastBuf && len(buf) == w.lastLoc.Len {
		return w.lastLoc
	}
	if id, fd, off, ok := w.t.dev.SharedLocation(buf); ok {
		loc = shmbox.Location{Direct: true, AllocID: id, AllocFD: fd, Off: off, Len: len(buf)}
	}
	w.lastBuf, w.lastLoc = &buf[0], loc
	return loc
}

// fill moves waiting buffers into free box slots, in order; w.mu and the
// box lock are held.
func (w *Window) fill() {
	n, _ := w.box.Live() // the first n posted buffers are in the box
	for _, b := range w.posted[n:] {
		if !w.box.Room() {
			return
		}
		b.slot = w.box.Post(w.locate(b.data))
		w.bySlot[b.slot] = b
	}
}

// Posted returns the number of buffers waiting, the head included.
func (w *Window) Posted() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.posted)
}

// Epoch returns the current epoch: the number of buffers completed so far.
func (w *Window) Epoch() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.epoch
}

func (w *Window) place(m *verbs.MailboxWrite) verbs.MailboxResult {
	w.packets.Add(1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		if w.cfg.Silent {
			return verbs.MailboxAccepted
		}
		return codeClosed
	}
	w.box.Lock()
	defer w.box.Unlock()
	key := peer{m.Source, m.SrcQP}
	var b *buffer
	base := 0
	if m.First {
		slot, bs, r := w.box.Begin(m.Offset, int(m.MsgLen))
		switch r {
		case shmbox.NoBuffer:
			return verbs.MailboxNotReady
		case shmbox.OutOfRange:
			return codeOutOfRange
		}
		b, base = w.bySlot[slot], bs
		if !m.Last {
			w.pins[key] = pin{buf: b, gen: b.gen, base: base}
			w.box.Opened(b.slot)
		}
	} else {
		p, ok := w.pins[key]
		if !ok {
			return codeEpochCrossed // its epoch was abandoned or handed off
		}
		if m.Last {
			delete(w.pins, key)
		}
		if p.buf.retired || p.buf.gen != p.gen {
			return codeEpochCrossed
		}
		if m.Last {
			w.box.Ended(p.buf.slot)
		}
		b, base = p.buf, p.base
	}
	off := base + int(m.MsgOff)
	n := m.Len()
	if off+n > len(b.data) {
		w.settle()
		return codeOutOfRange
	}
	if n > 0 && !w.t.charge(key, n) {
		w.settle()
		return codeLimit
	}
	var err error
	if n >= bigPlace {
		// A long copy (or pull) without the box's lock, so that the
		// host's initiators are not held up; the put in progress keeps
		// the epoch from completing meanwhile.
		w.box.Opened(b.slot)
		w.box.Unlock()
		err = m.Place(b.data[off : off+n])
		w.box.Lock()
		w.box.Ended(b.slot)
	} else {
		err = m.Place(b.data[off : off+n])
	}
	if err != nil {
		w.settle()
		return codeLost
	}
	if n > 0 && w.t.cfg.MaxOutstanding > 0 {
		if b.byPeer == nil {
			b.byPeer = map[peer]int{}
		}
		b.byPeer[key] += n
	}
	w.box.Count(b.slot, off, n, m.Last)
	w.settle()
	return verbs.MailboxAccepted
}

// bigPlace is the payload from which place copies without the box's lock.
const bigPlace = 16 << 10

// settle completes the epochs that are done, in order; w.mu and the box
// lock are held.
func (w *Window) settle() {
	for w.box.Completable() {
		w.complete(false)
	}
}

// Reservation is a put whose bytes a transport places itself, straight
// into the window's buffer (the reliability layer's chunks land in Data),
// and that counts once, when committed: duplicates and repairs of its
// chunks never count twice.
type Reservation struct {
	w    *Window
	b    *buffer
	gen  int
	base int
	done bool
	// Data is where the put's bytes go: len(Data) is the put's size.
	Data []byte
}

// Reserve starts a put of n bytes at offset (Steered; Appended windows
// ignore it) into the buffer a put arriving now would start in. The epoch
// cannot complete while the reservation is open. Errors: ErrWindowClosed,
// ErrNoBuffer (nothing posted, or every buffer full), ErrOutOfRange.
func (w *Window) Reserve(offset uint64, n int) (*Reservation, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, ErrWindowClosed
	}
	w.box.Lock()
	defer w.box.Unlock()
	slot, base, r := w.box.Begin(offset, n)
	switch r {
	case shmbox.NoBuffer:
		return nil, ErrNoBuffer
	case shmbox.OutOfRange:
		return nil, ErrOutOfRange
	}
	b := w.bySlot[slot]
	w.box.Reserve(slot, n)
	return &Reservation{w: w, b: b, gen: b.gen, base: base, Data: b.data[base : base+n : base+n]}, nil
}

// Commit counts the first n bytes of the reservation as placed (all of
// them: len(Data)) and the put as done, completing the epoch if its
// threshold is met. It fails with ErrEpochCrossed if the epoch was
// abandoned meanwhile (nothing is counted then).
func (r *Reservation) Commit(n int) error { return r.end(n, true) }

// Abort ends the reservation without counting anything; bytes already
// placed stay where they are.
func (r *Reservation) Abort() { r.end(0, false) }

func (r *Reservation) end(n int, count bool) error {
	w := r.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if r.done {
		return nil
	}
	r.done = true
	if r.b.gen != r.gen || r.b.retired {
		return ErrEpochCrossed // abandoned or ended by hand: the slot holds a new epoch
	}
	w.box.Lock()
	defer w.box.Unlock()
	w.box.Unreserve(r.b.slot, len(r.Data))
	if count {
		w.box.Count(r.b.slot, r.base, min(max(n, 0), len(r.Data)), true)
	}
	w.settle()
	return nil
}

// complete retires the head buffer; w.mu is held.
// complete retires the head buffer; w.mu and the box lock are held.
func (w *Window) complete(partial bool) epoch.Record {
	b := w.posted[0]
	if n := len(w.posted); n <= 64 {
		// Few posted (the usual): move them down, so that the next
		// posts reuse the array instead of growing a new one.
		copy(w.posted, w.posted[1:])
		w.posted[n-1] = nil
		w.posted = w.posted[:n-1]
	} else {
		w.posted[0] = nil
		w.posted = w.posted[1:]
	}
	b.retired = true
	bytes, ops := w.box.Counts(b.slot)
	w.box.Retire()
	w.bySlot[b.slot] = nil
	r := epoch.Record{Epoch: w.epoch, Buffer: b.id, Bytes: bytes, Ops: ops, Partial: partial, Data: b.data}
	w.epoch++
	w.history.Add(r)
	w.pending = append(w.pending, r)
	w.npend.Add(1)
	w.t.release(b.byPeer)
	w.spare = append(w.spare, b)
	w.fill()
	w.wake()
	return r
}

// wake wakes the window's waiters, all of them; w.mu is held.
func (w *Window) wake() {
	if w.sleepers > 0 {
		close(w.notify)
		w.notify, w.sleepers = make(chan struct{}), 0
	}
	// A waiter of this process that spins sees the record (npend); those
	// asleep on the box's word need the word bumped and a wake-up.
	if w.shared && w.box.Sleeping() && w.box.Wake() {
		futex.WakeAll(w.box.WakeWord())
	}
}

// IncEpoch ends the current epoch by hand: the head buffer, however full,
// completes as a partial epoch (stream semantics, unknown sizes, recovery).
func (w *Window) IncEpoch() (epoch.Record, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.posted) == 0 {
		return epoch.Record{}, ErrNothingToTake
	}
	w.box.Lock()
	defer w.box.Unlock()
	return w.complete(true), nil
}

// Abandon discards the current epoch's partial data: every byte placed in
// the head buffer since it became the head is zeroed and the counts reset,
// so a failed timestep leaves no trace. Puts in progress into it are
// refused from now on.
func (w *Window) Abandon() error { return w.abandon(true) }

// Quiesce runs f while no packet is being placed into the window (its
// placement lock is held), so f may read or copy the window's buffers
// without racing with arriving puts; puts wait, they are not refused.
func (w *Window) Quiesce(f func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.box.Lock()
	defer w.box.Unlock()
	f()
}

// Discard is Abandon without zeroing: the counts reset and puts in
// progress are refused, but the bytes stay. It is for windows whose posted
// buffers alias one another (rma's notified windows post the same memory
// for every epoch), where zeroing would erase data of other epochs and the
// caller restores the memory itself.
func (w *Window) Discard() error { return w.abandon(false) }

func (w *Window) abandon(zero bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.posted) == 0 {
		return ErrNothingToTake
	}
	b := w.posted[0]
	w.box.Lock()
	defer w.box.Unlock()
	if zero {
		w.box.Ranges(b.slot, func(off, n int) {
			if off >= 0 && n >= 0 && off+n <= len(b.data) {
				clear(b.data[off : off+n])
			}
		})
	}
	w.t.release(b.byPeer)
	for k, p := range w.pins {
		if p.buf == b {
			delete(w.pins, k)
		}
	}
	w.box.Reset(b.slot)
	b.byPeer = nil
	b.gen++
	return nil
}

// Records returns up to n completion records from the history, most
// recent first.
func (w *Window) Records(n int) []epoch.Record {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.history.Last(n)
}

// Rewind rolls the window back k epochs (k >= 1: 1 is the last completed
// epoch) and returns that epoch's record, whose buffer holds the data of
// the last consistent step; the k most recent records leave the history.
func (w *Window) Rewind(k int) (epoch.Record, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	r, _, err := w.history.Rewind(k)
	return r, err
}

// Poll returns the next completion record of this window, if there is one.
func (w *Window) Poll() (epoch.Record, bool) {
	w.mu.Lock()
	w.settleShared()
	if w.pendHd == len(w.pending) {
		w.mu.Unlock()
		return epoch.Record{}, false
	}
	r := w.pending[w.pendHd]
	w.pending[w.pendHd] = epoch.Record{}
	if w.pendHd++; w.pendHd == len(w.pending) {
		w.pending, w.pendHd = w.pending[:0], 0 // all taken: reuse the array
	}
	w.npend.Add(-1)
	w.mu.Unlock()
	return r, true
}

// settleShared completes the epochs that initiators on the host completed
// in the box since it last looked; w.mu is held.
func (w *Window) settleShared() {
	if v := atomic.LoadUint32(w.box.WakeWord()); v != w.seenWake.Load() {
		w.seenWake.Store(v)
		w.box.Lock()
		w.settle()
		w.box.Unlock()
	}
}

// Pending returns the number of completion records not yet taken by Poll
// or Wait, those of epochs that initiators on the host completed in a
// shared window included (they count only once settled: without that, a
// caller that polls Pending before Poll would wait for them forever).
func (w *Window) Pending() int {
	if atomic.LoadUint32(w.box.WakeWord()) != w.seenWake.Load() {
		w.mu.Lock()
		w.settleShared()
		w.mu.Unlock()
	}
	return int(w.npend.Load())
}

// ready reports, without the lock, whether Poll may have a record.
func (w *Window) ready() bool {
	return w.npend.Load() > 0 || atomic.LoadUint32(w.box.WakeWord()) != w.seenWake.Load()
}

// othersOnly reports whether a Wait starting now waits for other
// processes only, where ranks share cores (scarce): the window is shared
// and no write has reached it as a packet since the last Wait began
// (packets from other hosts, or from this host's origins that could not
// place, are handled by this process's goroutines). It returns the packet
// count that the wait watches.
func (w *Window) othersOnly(scarce bool) (bool, uint64) {
	n := w.packets.Load()
	before := w.packetsSeen.Swap(n)
	return scarce && w.shared && n == before, n
}

// Wait returns the next completion record of this window. It spins for a
// few microseconds, driving the device's progress, then blocks until the
// window completes an epoch, the window closes or ctx ends.
func (w *Window) Wait(ctx context.Context) (epoch.Record, error) {
	var deadline time.Time // set at the first look at the clock: it costs as much as a put
	var patient time.Time  // past it, the spin yields often
	// Where ranks share cores, the one this waits for may need this core:
	// yield from the start, and sleep at once if waits have been long.
	scarce := spin.Scarce()
	long := scarce
	if scarce {
		begun := time.Now()
		defer func() { w.noteWait(time.Since(begun)) }()
	}
	var stop func() bool // a shared window's wake on ctx's end, once it sleeps
	othersOnly, packets := w.othersOnly(scarce)
	for i := 0; !scarce || i < 64 || time.Duration(w.waited.Load()) < sleepAfter; i++ {
		// Look without the lock: the placing goroutine needs it.
		if w.ready() {
			if r, ok := w.Poll(); ok {
				return r, nil
			}
		}
		if i&63 == 63 {
			now := time.Now()
			if deadline.IsZero() {
				deadline, patient = now.Add(spin.Or(20*time.Microsecond)), now.Add(20*time.Microsecond)
			} else if now.After(deadline) {
				break
			}
			long = long || now.After(patient)
			if long || i&255 == 255 {
				// Let the process's other goroutines run now and then (a
				// rank bound to one core has one processor); every 64
				// rounds cost 12% of a notified put's latency.
				spin.Pause(i >> 8)
			}
		}
		if othersOnly && i&15 == 15 && w.packets.Load() != packets {
			othersOnly = false // a packet came: its handlers need the processor
		}
		switch {
		case long && othersOnly:
			// Origins of this host place into a shared window's memory
			// themselves: this waits for other processes only, so where
			// ranks share cores the kernel gets the core every round
			// (halo3d's notified exchange, 4 ranks on 2 cores: 23-30 us an
			// iteration before, 13-19 after; docs/PERFORMANCE.md).
			spin.PauseShared(i)
		case long:
			// A long spin (RVMA_SPIN above the default: rvmarun's, with a
			// few ranks per core) lets a placing goroutine or process run
			// often: the kernel gets the core every 16 rounds, as often as
			// a rank waiting on a counter gives it.
			spin.Pause(i)
		}
		if !w.shared || i&15 == 15 {
			// A shared window's puts from this host need no progress:
			// look at the box more often than at the rings.
			w.t.dev.Progress()
		}
	}
	for {
		if r, ok := w.Poll(); ok {
			return r, nil
		}
		w.mu.Lock()
		closed, pending := w.closed, w.pendHd < len(w.pending)
		var notify chan struct{}
		if !closed && !pending && !w.shared {
			// Registered under the lock that wake takes: a record or a
			// close after the look above closes this channel.
			notify = w.notify
			w.sleepers++
		}
		w.mu.Unlock()
		if pending {
			continue // completed since Poll looked
		}
		if closed {
			return epoch.Record{}, ErrWindowClosed
		}
		if w.shared {
			// Initiators of other processes complete epochs too: sleep on
			// the box's futex word, which they and this process bump (and
			// so does ctx's end, so that it ends the wait at once).
			if stop == nil {
				word := w.box.WakeWord()
				stop = context.AfterFunc(ctx, func() { futex.WakeAll(word) })
				defer stop()
			}
			v := atomic.LoadUint32(w.box.WakeWord())
			w.box.SetSleeping(true)
			if !w.ready() && !w.box.Closed() { // Close sets the flag, then looks for sleepers
				futex.Wait(w.box.WakeWord(), v, 10*time.Millisecond)
			}
			w.box.SetSleeping(false)
			if err := ctx.Err(); err != nil {
				return epoch.Record{}, err
			}
			continue
		}
		select {
		case <-notify:
		case <-ctx.Done():
			return epoch.Record{}, ctx.Err()
		}
	}
}

// Close closes the window: later puts are refused (or, with Silent,
// discarded) and waiters return ErrWindowClosed once they have taken the
// completions already made. The window stays at its address, so that puts
// after the close meet "closed" rather than the catch-all.
func (w *Window) Close() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return ErrWindowClosed
	}
	w.closed = true
	w.box.Close()
	w.wake()
	w.mu.Unlock()
	// The window stays registered so that later puts meet "closed".
	return nil
}

// noteWait adds a wait of d to Wait's average (a quarter each).
func (w *Window) noteWait(d time.Duration) {
	old := w.waited.Load()
	w.waited.Store(old + (int64(d)-old)/4)
}
