// Package shmbox is the counting state of a mailbox window, kept in memory
// that several processes may share: the ring of posted buffers with each
// buffer's counters (bytes and puts placed, reservations, puts in
// progress, fullness, the ranges written), the threshold, and the lock
// that serialises updates. The target's mailbox window (package mailbox)
// updates it for the puts that arrive as packets, and initiators on the
// same host (package shmfab) update it for the puts they place
// themselves, with the same functions under the same lock, so that the
// counting is exact whoever places the bytes.
//
// The lock is a word holding its owner's process id, so that a process
// killed while holding it is noticed (the pid is gone) and the lock taken
// over; no update leaves the counters inconsistent for the next holder
// (a put dies half-counted at worst, like a put whose packets were lost).
//
// A Box is not safe for concurrent use except through its lock: every
// method but Lock, Unlock, Close, Closed and the Wake functions needs it
// held. Under the lock words are stored plainly: the lock's atomics order
// them for the next holder, while an atomic store is a full fence on
// amd64, which serialised the cache misses of a put's stores.
package shmbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/rvma/rvma/internal/futex"
	"github.com/rvma/rvma/internal/spin"
)

// Header and slot layout: little-endian words.
const (
	magic = 0x52564d41424f5820 // "RVMABOX "

	// Version is the layout's version, checked by Open: a process of
	// another rvma release that lays its boxes out otherwise is refused
	// (ErrVersion) instead of misread. Bump it with any change of a
	// word's place or meaning (3: hSleeping counts waiters).
	Version = 3

	// Header: each group of words that one side writes often on its own
	// cache line, so the two processes pass lines back and forth as
	// little as they can (a line moves in about 80 ns here).
	hMagic     = 0 // read-mostly line: magic, threshold, flags, slots
	hThreshold = 8
	hFlags     = 16
	hSlots     = 24
	hVersion   = 32
	hLock      = 64
	hPosted    = 128 // posting sequence of the next buffer
	hCompleted = 136 // posting sequence of the head (first not retired)
	hWake      = 192 // futex word: bumped when an epoch may have completed
	hSleeping  = 196 // how many of the target's waiters are (about to be) blocked on hWake
	hdrBytes   = 256

	// Slot: where the buffer is (written at Post, then read), the
	// counters (written by every put), the ranges written.
	sSeq     = 0
	sDirect  = 8 // the buffer lies in shared memory that initiators can map
	sAllocID = 16
	sAllocFD = 24
	sOff     = 32
	sLen     = 40
	sBytes   = 64
	sOps     = 72
	sTail    = 80
	sResB    = 88
	sResOps  = 96
	sOpen    = 104
	sFull    = 112
	sNRanges = 120
	sRanges  = 128 // MaxRanges pairs of (offset, length)

	// MaxRanges is how many written ranges a slot records for Abandon;
	// past it the whole buffer counts as written.
	MaxRanges = 8
	slotBytes = sRanges + MaxRanges*16

	flagOps      = 1
	flagAppended = 2
	flagClosed   = 4
)

// Result is the outcome of Begin.
type Result uint8

// Results.
const (
	OK         Result = iota
	NoBuffer          // nothing posted, or every posted buffer is full
	OutOfRange        // the put does not fit the buffer
)

// Errors of Open.
var (
	ErrCorrupt = errors.New("shmbox: corrupt box")
	ErrVersion = errors.New("shmbox: box of another layout version")
)

// Location is where a posted buffer's bytes are, for initiators that map
// them: an allocation (shmfab.Alloc) of the target process, by id and
// descriptor, and the offset in it.
type Location struct {
	Direct  bool // false: initiators cannot reach the buffer (puts go as packets)
	AllocID uint64
	AllocFD int
	Off     int
	Len     int
}

// Box is a view of a box's memory.
type Box struct {
	mem   []byte
	slots int
}

// Size is the memory a box of n slots takes.
func Size(slots int) int { return hdrBytes + slots*slotBytes }

// New lays out a box in mem (Size(slots) bytes, 8-aligned, zeroed).
func New(mem []byte, slots, threshold int, countOps, appended bool) *Box {
	b := &Box{mem: mem[:Size(slots)], slots: slots}
	var f uint64
	if countOps {
		f |= flagOps
	}
	if appended {
		f |= flagAppended
	}
	b.put(hThreshold, uint64(threshold))
	b.put(hFlags, f)
	b.put(hSlots, uint64(slots))
	b.put(hVersion, Version)
	atomic.StoreUint64(b.u64(hMagic), magic)
	return b
}

// Open views a box another process laid out, checking what a hostile or
// corrupt header could make unsafe.
func Open(mem []byte) (*Box, error) {
	if len(mem) < hdrBytes || uintptr(unsafe.Pointer(&mem[0]))%8 != 0 {
		return nil, ErrCorrupt
	}
	b := &Box{mem: mem}
	n := binary.LittleEndian.Uint64(mem[hSlots:])
	if atomic.LoadUint64(b.u64(hMagic)) != magic {
		return nil, ErrCorrupt
	}
	if v := b.get(hVersion); v != Version {
		return nil, fmt.Errorf("%w: %d, this process lays out %d", ErrVersion, v, Version)
	}
	if n == 0 || n > 1<<16 || uint64(Size(int(n))) > uint64(len(mem)) {
		return nil, ErrCorrupt
	}
	b.slots = int(n)
	b.mem = mem[:Size(b.slots)]
	return b, nil
}

func (b *Box) u64(off int) *uint64     { return (*uint64)(unsafe.Pointer(&b.mem[off])) }
func (b *Box) u32(off int) *uint32     { return (*uint32)(unsafe.Pointer(&b.mem[off])) }
func (b *Box) get(off int) uint64      { return atomic.LoadUint64(b.u64(off)) }
func (b *Box) put(off int, v uint64)   { *b.u64(off) = v }
func (b *Box) add(off int, d int)      { *b.u64(off) += uint64(d) }
func (b *Box) slot(i int) int          { return hdrBytes + i*slotBytes }
func (b *Box) sget(i, f int) uint64    { return b.get(b.slot(i) + f) }
func (b *Box) sput(i, f int, v uint64) { b.put(b.slot(i)+f, v) }

var pid = uint64(os.Getpid())

// Lock takes the box's lock, taking it over from a holder whose process
// has died.
func (b *Box) Lock() {
	w := b.u64(hLock)
	for i := 0; ; i++ {
		h := atomic.LoadUint64(w)
		if h == 0 && atomic.CompareAndSwapUint64(w, 0, pid) {
			return
		}
		if h != 0 && h != pid && i%4096 == 4095 && !futex.Alive(int(h)) && atomic.CompareAndSwapUint64(w, h, pid) {
			return
		}
		spin.Pause(i)
	}
}

// Unlock releases the lock.
func (b *Box) Unlock() { atomic.StoreUint64(b.u64(hLock), 0) }

// Threshold returns the count that completes an epoch.
func (b *Box) Threshold() int { return int(b.get(hThreshold)) }

// Close marks the window closed: initiators stop placing (their puts go
// as packets, which the target refuses).
func (b *Box) Close() { atomic.StoreUint64(b.u64(hFlags), b.get(hFlags)|flagClosed) }

// Closed reports Close.
func (b *Box) Closed() bool { return b.get(hFlags)&flagClosed != 0 }

// Live returns the number of posted buffers not yet retired, and the
// slot of the head.
func (b *Box) Live() (n, head int) {
	c := b.get(hCompleted)
	live := b.get(hPosted) - c
	if live > uint64(b.slots) {
		live = uint64(b.slots) // a corrupt header: never look past the ring
	}
	return int(live), int(c % uint64(b.slots))
}

// Room reports whether another buffer can be posted.
func (b *Box) Room() bool { n, _ := b.Live(); return n < b.slots }

// Post appends a buffer at loc; the caller checked Room. It returns the
// buffer's slot.
func (b *Box) Post(loc Location) int {
	seq := b.get(hPosted)
	i := int(seq % uint64(b.slots))
	s := b.mem[b.slot(i) : b.slot(i)+slotBytes]
	clear(s)
	d := uint64(0)
	if loc.Direct {
		d = 1
	}
	b.sput(i, sSeq, seq)
	b.sput(i, sDirect, d)
	b.sput(i, sAllocID, loc.AllocID)
	b.sput(i, sAllocFD, uint64(loc.AllocFD))
	b.sput(i, sOff, uint64(loc.Off))
	b.sput(i, sLen, uint64(loc.Len))
	b.put(hPosted, seq+1)
	return i
}

// Location returns where slot i's buffer is.
func (b *Box) Location(i int) Location {
	return Location{Direct: b.sget(i, sDirect) == 1, AllocID: b.sget(i, sAllocID), AllocFD: int(b.sget(i, sAllocFD)),
		Off: int(b.sget(i, sOff)), Len: int(b.sget(i, sLen))}
}

// Find returns the slot a put arriving now starts in: the first live
// buffer that is not full.
func (b *Box) Find() (int, bool) {
	n, head := b.Live()
	for k := range n {
		i := (head + k) % b.slots
		if b.sget(i, sFull) == 0 {
			return i, true
		}
	}
	return 0, false
}

// Begin places a put of n bytes at offset: in the first buffer that is
// not full, at offset (Steered) or after the previous put (Appended, whose
// tail it advances). It returns the slot and the put's first byte.
func (b *Box) Begin(offset uint64, n int) (slot, base int, r Result) {
	i, ok := b.Find()
	if !ok {
		return 0, 0, NoBuffer
	}
	base, r = b.BeginIn(i, offset, n)
	return i, base, r
}

// BeginIn is Begin into slot i, which the caller found with Find, under
// the lock, and has not seen full since: a batch of puts finds their slot
// once.
func (b *Box) BeginIn(i int, offset uint64, n int) (base int, r Result) {
	size := b.sget(i, sLen)
	if b.get(hFlags)&flagAppended == 0 {
		if offset > size || uint64(n) > size-offset {
			return 0, OutOfRange
		}
		return int(offset), OK
	}
	tail := b.sget(i, sTail)
	if tail > size || uint64(n) > size-tail {
		return 0, OutOfRange
	}
	b.sput(i, sTail, tail+uint64(n))
	return int(tail), OK
}

// Full reports whether slot i's buffer has reached its threshold.
func (b *Box) Full(i int) bool { return b.sget(i, sFull) != 0 }

// Count records n bytes placed at off in slot i, and one put when last,
// and settles the slot's fullness.
func (b *Box) Count(i, off, n int, last bool) {
	b.Note(i, off, n)
	ops := 0
	if last {
		ops = 1
	}
	b.Add(i, n, ops)
}

// Note records that n bytes were placed at off in slot i (for the
// snapshots of history), without counting them: Add does. A batch of puts
// notes each and adds once, so the target's counters (which it polls)
// change once.
func (b *Box) Note(i, off, n int) {
	if n == 0 {
		return
	}
	k := b.sget(i, sNRanges)
	switch {
	case k < MaxRanges:
		b.sput(i, sRanges+int(k)*16, uint64(off))
		b.sput(i, sRanges+int(k)*16+8, uint64(n))
		b.sput(i, sNRanges, k+1)
	case k == MaxRanges:
		b.sput(i, sNRanges, k+1) // too many: the whole buffer counts as written
	}
}

// Add counts bytes and puts toward slot i's fullness and settles it.
func (b *Box) Add(i, bytes, ops int) {
	if bytes > 0 {
		b.add(b.slot(i)+sBytes, bytes)
	}
	if ops > 0 {
		b.add(b.slot(i)+sOps, ops)
	}
	b.Settle(i)
}

// Fills reports whether counting bytes and ops more would make slot i
// full (the test Settle makes): a batch that has placed that much stops
// placing into the slot there, as puts counted one by one would.
func (b *Box) Fills(i, bytes, ops int) bool {
	c := b.sget(i, sBytes) + b.sget(i, sResB) + uint64(bytes)
	if b.get(hFlags)&flagOps != 0 {
		c = b.sget(i, sOps) + b.sget(i, sResOps) + uint64(ops)
	}
	return int64(c) >= int64(b.get(hThreshold))
}

// Reserve counts n bytes and one put toward slot i's fullness before they
// are placed (Count then Unreserve them), and marks a put in progress.
func (b *Box) Reserve(i, n int) {
	b.add(b.slot(i)+sResB, n)
	b.add(b.slot(i)+sResOps, 1)
	b.add(b.slot(i)+sOpen, 1)
	b.Settle(i)
}

// Unreserve ends a reservation made with Reserve.
func (b *Box) Unreserve(i, n int) {
	b.add(b.slot(i)+sResB, -n)
	b.add(b.slot(i)+sResOps, -1)
	b.add(b.slot(i)+sOpen, -1)
	b.Settle(i)
}

// Opened marks a put in progress in slot i (the first packet of several
// was placed).
func (b *Box) Opened(i int) { b.add(b.slot(i)+sOpen, 1) }

// Ended ends a put in progress in slot i.
func (b *Box) Ended(i int) { b.add(b.slot(i)+sOpen, -1) }

// Settle marks slot i full once its counted and reserved bytes (or puts)
// meet the threshold.
func (b *Box) Settle(i int) {
	c := b.sget(i, sBytes) + b.sget(i, sResB)
	if b.get(hFlags)&flagOps != 0 {
		c = b.sget(i, sOps) + b.sget(i, sResOps)
	}
	f := uint64(0)
	if int64(c) >= int64(b.get(hThreshold)) {
		f = 1
	}
	b.sput(i, sFull, f)
}

// Completable reports whether the head buffer has completed its epoch:
// full, with no put in progress.
func (b *Box) Completable() bool {
	n, head := b.Live()
	return n > 0 && b.sget(head, sFull) == 1 && b.sget(head, sOpen) == 0
}

// Counts returns slot i's bytes and puts placed.
func (b *Box) Counts(i int) (bytes, ops int) { return int(b.sget(i, sBytes)), int(b.sget(i, sOps)) }

// Ranges calls f with every range written into slot i, or with the whole
// buffer when there were too many to record.
func (b *Box) Ranges(i int, f func(off, n int)) {
	k := b.sget(i, sNRanges)
	if k > MaxRanges {
		f(0, int(b.sget(i, sLen)))
		return
	}
	for j := range int(k) {
		f(int(b.sget(i, sRanges+j*16)), int(b.sget(i, sRanges+j*16+8)))
	}
}

// Retire ends the head buffer's epoch: the next buffer becomes the head.
func (b *Box) Retire() { b.put(hCompleted, b.get(hCompleted)+1) }

// Reset zeroes slot i's counts (an abandoned epoch), keeping its buffer:
// the counters follow the location in the slot.
func (b *Box) Reset(i int) { clear(b.mem[b.slot(i)+sBytes : b.slot(i)+slotBytes]) }

// Wake tells the target that an epoch may have completed, and reports
// whether a waiter sleeps (the caller then wakes all on WakeWord).
func (b *Box) Wake() (sleeping bool) {
	atomic.AddUint32(b.u32(hWake), 1)
	return atomic.LoadUint32(b.u32(hSleeping)) != 0
}

// Sleeping reports whether a waiter of the target announced that it sleeps.
func (b *Box) Sleeping() bool { return atomic.LoadUint32(b.u32(hSleeping)) != 0 }

// WakeWord is the futex word Wake bumps.
func (b *Box) WakeWord() *uint32 { return b.u32(hWake) }

// SetSleeping announces (on) or withdraws a waiter that blocks on
// WakeWord, so that Wake callers wake it. The target's waiters are
// counted, not flagged: one waking must not hide another still asleep.
func (b *Box) SetSleeping(on bool) {
	d := ^uint32(0) // -1
	if on {
		d = 1
	}
	atomic.AddUint32(b.u32(hSleeping), d)
}

func (b *Box) String() string {
	n, head := b.Live()
	return fmt.Sprintf("box{live %d head %d}", n, head)
}
