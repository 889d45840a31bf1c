package mailbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rvma/rvma/epoch"
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
	return &Window{t: t, addr: addr, cfg: cfg, history: epoch.New(cfg.History),
		notify: make(chan struct{}, 1), pins: map[peer]*pin{}}, nil
}

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

	mu      sync.Mutex
	posted  []*buffer
	nextID  int
	epoch   uint64
	closed  bool
	pins    map[peer]*pin
	pending []epoch.Record // completions not yet taken by Wait/Poll
	npend   atomic.Int32   // len(pending), read without the lock by spinning waiters
	history *epoch.History
	notify  chan struct{}
}

type buffer struct {
	id      int
	data    []byte
	bytes   int
	ops     int
	tail    int // Appended: next free byte
	written [][2]int
	byPeer  map[peer]int
	retired bool
	full    bool // the threshold is met: new puts go to the next buffer
	open    int  // puts half-placed in this buffer
	gen     int  // abandons so far: reservations of an earlier generation are void
	// Bytes and puts reserved and not yet committed: they count toward
	// fullness at once, so that puts reserved later, though they may
	// finish first, go to the next buffer.
	resBytes, resOps int
}

type pin struct {
	buf  *buffer
	base int // Appended: where the put's first byte goes
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
	w.posted = append(w.posted, &buffer{id: w.nextID, data: buf})
	return w.nextID, nil
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
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		if w.cfg.Silent {
			return verbs.MailboxAccepted
		}
		return codeClosed
	}
	key := peer{m.Source, m.SrcQP}
	var b *buffer
	base := 0
	if m.First {
		var code verbs.MailboxResult
		if b, base, code = w.begin(m.Offset, int(m.MsgLen)); code != verbs.MailboxAccepted {
			return code
		}
		if !m.Last {
			w.pins[key] = &pin{buf: b, base: base}
			b.open++
		}
	} else {
		p := w.pins[key]
		if p == nil {
			return codeEpochCrossed // its epoch was abandoned or handed off
		}
		if m.Last {
			delete(w.pins, key)
			p.buf.open--
		}
		if p.buf.retired {
			return codeEpochCrossed
		}
		b, base = p.buf, p.base
	}
	off := base + int(m.MsgOff)
	n := m.Len()
	if off+n > len(b.data) {
		return codeOutOfRange
	}
	if n > 0 && !w.t.charge(key, n) {
		return codeLimit
	}
	if err := m.Place(b.data[off : off+n]); err != nil {
		return codeLost
	}
	if n > 0 && w.t.cfg.MaxOutstanding > 0 {
		if b.byPeer == nil {
			b.byPeer = map[peer]int{}
		}
		b.byPeer[key] += n
	}
	w.count(b, off, n, m.Last)
	return verbs.MailboxAccepted
}

// begin finds where a put of n bytes at offset starts: the first buffer
// that is not full, and the put's base in it; w.mu is held.
func (w *Window) begin(offset uint64, n int) (*buffer, int, verbs.MailboxResult) {
	var b *buffer
	for _, c := range w.posted {
		if !c.full {
			b = c
			break
		}
	}
	if b == nil {
		return nil, 0, verbs.MailboxNotReady
	}
	switch w.cfg.Placement {
	case Steered:
		if offset > uint64(len(b.data)) || uint64(n) > uint64(len(b.data))-offset {
			return nil, 0, codeOutOfRange
		}
		return b, int(offset), verbs.MailboxAccepted
	default: // Appended
		if n > len(b.data)-b.tail {
			return nil, 0, codeOutOfRange
		}
		base := b.tail
		b.tail += n
		return b, base, verbs.MailboxAccepted
	}
}

// count records n bytes placed at off in b (and one put when last), and
// completes the epochs that are done; w.mu is held.
func (w *Window) count(b *buffer, off, n int, last bool) {
	if n > 0 {
		if len(b.written) < 1024 {
			b.written = append(b.written, [2]int{off, n})
		} else {
			b.written[len(b.written)-1] = [2]int{0, len(b.data)} // too many: abandon zeroes all
		}
	}
	b.bytes += n
	if last {
		b.ops++
	}
	w.settle(b)
}

// settle marks b full once its counted and reserved bytes (or puts) meet
// the threshold, and completes the epochs that are done; w.mu is held.
func (w *Window) settle(b *buffer) {
	count := b.bytes + b.resBytes
	if w.cfg.Count == CountOps {
		count = b.ops + b.resOps
	}
	b.full = count >= w.cfg.Threshold
	// Epochs complete in order, at put boundaries.
	for len(w.posted) > 0 && w.posted[0].full && w.posted[0].open == 0 {
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
	b, base, code := w.begin(offset, n)
	switch code {
	case verbs.MailboxAccepted:
	case verbs.MailboxNotReady:
		return nil, ErrNoBuffer
	default:
		return nil, ErrOutOfRange
	}
	b.open++
	b.resBytes += n
	b.resOps++
	w.settle(b)
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
	if r.b.gen != r.gen {
		return ErrEpochCrossed // abandoned: the buffer holds a new epoch
	}
	r.b.open--
	r.b.resBytes -= len(r.Data)
	r.b.resOps--
	if r.b.retired {
		return ErrEpochCrossed
	}
	if count {
		w.count(r.b, r.base, min(max(n, 0), len(r.Data)), true)
	} else {
		w.settle(r.b)
	}
	return nil
}

// complete retires the head buffer; w.mu is held.
func (w *Window) complete(partial bool) epoch.Record {
	b := w.posted[0]
	w.posted = w.posted[1:]
	b.retired = true
	r := epoch.Record{Epoch: w.epoch, Buffer: b.id, Bytes: b.bytes, Ops: b.ops, Partial: partial, Data: b.data}
	w.epoch++
	w.history.Add(r)
	w.pending = append(w.pending, r)
	w.npend.Add(1)
	w.t.release(b.byPeer)
	select {
	case w.notify <- struct{}{}:
	default:
	}
	return r
}

// IncEpoch ends the current epoch by hand: the head buffer, however full,
// completes as a partial epoch (stream semantics, unknown sizes, recovery).
func (w *Window) IncEpoch() (epoch.Record, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.posted) == 0 {
		return epoch.Record{}, ErrNothingToTake
	}
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
	if zero {
		for _, r := range b.written {
			clear(b.data[r[0] : r[0]+r[1]])
		}
	}
	w.t.release(b.byPeer)
	for k, p := range w.pins {
		if p.buf == b {
			delete(w.pins, k)
		}
	}
	*b = buffer{id: b.id, data: b.data, gen: b.gen + 1}
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
	defer w.mu.Unlock()
	if len(w.pending) == 0 {
		return epoch.Record{}, false
	}
	r := w.pending[0]
	w.pending = w.pending[1:]
	w.npend.Add(-1)
	return r, true
}

// Pending returns the number of completion records not yet taken by Poll
// or Wait.
func (w *Window) Pending() int { return int(w.npend.Load()) }

// Wait returns the next completion record of this window. It spins for a
// few microseconds, driving the device's progress, then blocks until the
// window completes an epoch, the window closes or ctx ends.
func (w *Window) Wait(ctx context.Context) (epoch.Record, error) {
	deadline := time.Now().Add(spin.Or(20 * time.Microsecond))
	for i := 0; ; i++ {
		// Look without the lock: the placing goroutine needs it.
		if w.npend.Load() > 0 {
			if r, ok := w.Poll(); ok {
				return r, nil
			}
		}
		if i&63 == 63 {
			if time.Now().After(deadline) {
				break
			}
			spin.Pause(i >> 6) // let a placing goroutine (or process) run when processors are scarce
		}
		w.t.dev.Progress()
	}
	for {
		if r, ok := w.Poll(); ok {
			return r, nil
		}
		w.mu.Lock()
		closed := w.closed
		w.mu.Unlock()
		if closed {
			return epoch.Record{}, ErrWindowClosed
		}
		select {
		case <-w.notify:
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
	w.mu.Unlock()
	select {
	case w.notify <- struct{}{}:
	default:
	}
	// The window stays registered so that later puts meet "closed".
	return nil
}
