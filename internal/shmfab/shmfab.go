//go:build linux

package shmfab

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math/bits"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rvma/rvma/internal/fabric"
	"github.com/rvma/rvma/internal/futex"
	"github.com/rvma/rvma/internal/shmbox"
	"github.com/rvma/rvma/internal/spin"
	"github.com/rvma/rvma/internal/wire"
)

// Sizes and limits.
const (
	// DefaultMTU is a port's payload size unless the URI says otherwise:
	// large, since a ring entry costs about the same whatever its size.
	DefaultMTU = 64 << 10
	// MaxMTU bounds the configurable payload size (a quarter of a ring).
	MaxMTU = RingBytes / 4

	// Rings is the number of senders a port accepts at once (one ring
	// each); RingBytes is each ring's size. A ring's pages are touched
	// only as its sender writes, so memory follows use: up to RingBytes
	// per peer that sends packets, against a segment of Rings·RingBytes
	// of address space. (32 rings of 4 MiB refused the 33rd rank of a
	// host and cost 4 MiB a peer.)
	Rings     = 256
	RingBytes = 1 << 20

	// Regions is how many memory regions a port exports for direct access
	// (see Export); more stay reachable through packets.
	Regions = 4096
	// QPs is how many queue pairs a port lists as reachable directly (see
	// Attach); more work through packets alone.
	QPs = 4096
	// Boxes is how many mailbox windows a port shares for direct puts
	// (see ShareBox); more are reached through packets.
	Boxes = 1024

	magic       = 0x52564d4153484d33 // "RVMASHM3": the layout's version
	hdrBytes    = 4096
	slotBytes   = 256 // per ring: producer line, consumer line, busy word
	regionBytes = 64
	qpBytes     = 32
	boxBytes    = 48
	tableOff    = hdrBytes + Rings*slotBytes
	qpsOff      = tableOff + Regions*regionBytes
	boxesOff    = qpsOff + QPs*qpBytes
	ringsOff    = boxesOff + Boxes*boxBytes
	segBytes    = ringsOff + Rings*RingBytes
	wrapMark    = 0xFFFFFFFF
	claiming    = uint64(1) << 63 // owner flag while a sender sets its ring up
	retired     = uint64(1) << 62 // owner flag once the sender closed: drain, then free
	flags       = claiming | retired
)

// Header offsets.
const (
	offMagic    = 0
	offName     = 8
	offPID      = 16
	offInst     = 20  // the port's instance, its address's port number
	offDoorbell = 64  // futex word: bumped by a sender that found the owner asleep
	offSleeping = 128 // the owner is (about to be) blocked on the doorbell
	offImpaired = 192 // faults are injected: peers use packets only
	offActive   = 256 // Rings bits, in 64-bit words: bit i is set while ring i is claimed (the receiver scans only those)
)

// Ring slot offsets (from the slot's start).
const (
	offOwner = 0  // sender token (pid<<32 | instance<<16 | fd of its segment), 0 when free
	offSrc   = 8  // sender's address: 16 bytes and a 2-byte port
	offHead  = 64 // bytes written, producer's line
	offTail  = 128
	offBusy  = 192 // the exported region the sender is accessing directly, plus one
)

// prefix marks shm GIDs: fd72:766d:6173:686d ("\xfdrvmashm"), then the
// owner's pid and the segment's file descriptor.
var prefix = [8]byte{0xfd, 'r', 'v', 'm', 'a', 's', 'h', 'm'}

// ErrClosed is returned for operations on a closed port.
var ErrClosed = errors.New("shmfab: port closed")

// pushWait bounds how long a send waits for room in a full ring before
// it drops the packet, as a full socket buffer would.
const pushWait = 2 * time.Millisecond

// quietFor and stillLooks are how long, and for how many looks, the
// application must neither poll nor spin, with one Go processor, before
// the receiver sleeps on its doorbell.
const (
	quietFor   = 200 * time.Microsecond
	stillLooks = 64
)

// sleepMax bounds a sleep on the doorbell, so that dead senders are
// noticed and Close is never missed for long (a variable for tests).
var sleepMax = 100 * time.Millisecond

// kernelOrder models for the race detector the ordering the shared ring
// gives between a sender and a receiver in one process (as udpfab's does
// for the kernel): each mapping of a segment has its own addresses, so Go
// cannot see that the ring's release/acquire pairs synchronise.
var kernelOrder atomic.Uint64

// Port is one GID of an shm device: a shared-memory segment whose rings
// other ports' packets arrive in. It implements fabric.Port.
type Port struct {
	noCMA atomic.Bool // NoCMA
	name  uint64
	addr  netip.AddrPort
	mtu   int
	fd    int
	mem   []byte
	tok   uint64

	hmu     sync.Mutex
	handler fabric.Handler

	pmu      sync.Mutex // guards peers and sends
	peers    map[netip.AddrPort]*peer
	lastDst  netip.AddrPort // the peer direct access reached last
	lastPeer *peer

	closed atomic.Bool
	done   chan struct{}

	// The reader role: whoever holds rmu drains the rings and runs the
	// handler (the background goroutine, or a Progress caller), so the
	// handler never runs twice at once and rx is shared.
	rmu sync.Mutex
	rx  []*wire.Packet
	// polls counts Progress calls: while it moves a poller is active, and
	// the background goroutine naps without asking senders to wake it,
	// so a send costs no futex call. A count, not a time: reading the
	// clock on every poll cost more than the rest of it.
	polls atomic.Uint64
	// reaps counts the background goroutine's checks for dead processes
	// (every 100 ms); direct access looks for its peer's process when it
	// moves.
	reaps atomic.Uint64

	sent, received, malformed, dropped atomic.Uint64

	// The tables of direct access (memory.go): exported regions by
	// remote key, listed QPs by number, shared mailbox windows by address.
	emu     sync.Mutex
	regions table[uint32]
	qps     table[uint32]
	boxes   table[uint64]
	// dmu serialises this port's direct accesses to peers' memory, which
	// use the busy word of its ring slot in the peer's segment.
	dmu    sync.Mutex
	iov    []unix.Iovec
	direct atomic.Uint64
}

// peer is another port's segment, mapped for sending into.
type peer struct {
	mem  []byte
	pid  int
	ring int // our ring in it, -1 until claimed
	head uint64
	dead bool

	// Direct access (memory.go), guarded by the port's dmu: where each
	// remote key sits in the peer's table, and the peer's allocations
	// mapped here, by allocation id.
	rkeys   map[uint32]int
	qps     map[uint32]int
	boxes   map[uint64]*shmbox.Box // mapped windows' boxes, by mailbox address
	maps    map[uint64][]byte
	noCMA   bool   // cross-memory attach to the peer failed: use packets
	checked uint64 // Port.reaps when the peer's process was last seen alive

	// watched: a mapping of the peer's memory was handed out (Map), so
	// the receiver checks every 100 ms whether its process lives, and
	// sets gone once it does not.
	watched, gone atomic.Bool
}

var _ fabric.Port = (*Port)(nil)

// nameHash is the fabric name as the segment header records it: ports of
// different names do not exchange packets.
func nameHash(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}

// Open creates a port on the named fabric: an anonymous shared-memory
// segment (memfd) that other processes reach through /proc/PID/fd/FD, both
// of which its address names. Nothing is left behind in /dev/shm: the
// segment disappears with the last process that maps it.
func Open(name string, mtu int) (*Port, error) {
	if mtu < 256 || mtu > MaxMTU {
		return nil, fmt.Errorf("shmfab: MTU %d: want 256..%d", mtu, MaxMTU)
	}
	fd, err := unix.MemfdCreate("rvma-shm", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("shmfab: memfd: %w", err)
	}
	if err := unix.Ftruncate(fd, segBytes); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shmfab: size segment: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, segBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shmfab: map segment: %w", err)
	}
	pid := os.Getpid()
	var a [16]byte
	copy(a[:], prefix[:])
	binary.BigEndian.PutUint32(a[8:], uint32(pid))
	binary.BigEndian.PutUint32(a[12:], uint32(fd))
	// The instance tells apart ports that reuse a closed one's descriptor:
	// a sender that knew the old port must not reach the new one by it.
	inst := uint16(instances.Add(1))
	if inst == 0 {
		inst = uint16(instances.Add(1))
	}
	p := &Port{name: nameHash(name), addr: netip.AddrPortFrom(netip.AddrFrom16(a), inst), mtu: mtu, fd: fd, mem: mem,
		tok: uint64(pid)<<32 | uint64(inst)<<16 | uint64(fd&0xffff), peers: map[netip.AddrPort]*peer{}, done: make(chan struct{}),
		rx: make([]*wire.Packet, 0, 64), regions: newTable[uint32](Regions), qps: newTable[uint32](QPs), boxes: newTable[uint64](Boxes)}
	binary.LittleEndian.PutUint64(mem[offName:], p.name)
	binary.LittleEndian.PutUint32(mem[offPID:], uint32(pid))
	binary.LittleEndian.PutUint32(mem[offInst:], uint32(inst))
	atomic.StoreUint64(u64(mem, offMagic), magic) // last: the segment is ready
	// The spin is read now, not when the goroutine first runs: a port
	// keeps the setting it was opened under.
	go p.receive(spin.Or(50 * time.Microsecond))
	return p, nil
}

// instances numbers the process's ports (see Open).
var instances atomic.Uint32

func u64(b []byte, off int) *uint64 { return (*uint64)(unsafe.Pointer(&b[off])) }
func u32(b []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }

func slot(i int) int { return hdrBytes + i*slotBytes }
func ring(i int) int { return ringsOff + i*RingBytes }

// Addr is the port's address and GID.
func (p *Port) Addr() netip.AddrPort { return p.addr }

// MaxPayload is the largest payload the port carries.
func (p *Port) MaxPayload() int { return p.mtu }

// SetHandler installs the receiver of arriving packets.
func (p *Port) SetHandler(h fabric.Handler) {
	p.hmu.Lock()
	p.handler = h
	p.hmu.Unlock()
}

// Stats returns the port's counters.
func (p *Port) Stats() fabric.Stats {
	return fabric.Stats{Sent: p.sent.Load(), Received: p.received.Load(), Dropped: p.malformed.Load(),
		Undeliverable: p.dropped.Load(), Direct: p.direct.Load()}
}

// Close stops the port: its receiver ends, its segment and its peers'
// mappings are released.
func (p *Port) Close() error {
	if p.closed.Swap(true) {
		return ErrClosed
	}
	p.wake()
	<-p.done
	// A Progress call may be running the handler: wait for it. Later
	// ones see the port closed and return.
	p.rmu.Lock()
	//lint:ignore SA2001 an empty critical section: waiting for the holder is the point
	p.rmu.Unlock()
	p.unexportAll()
	p.dmu.Lock()
	defer p.dmu.Unlock()
	p.pmu.Lock()
	for _, pe := range p.peers {
		p.release(pe)
		for _, m := range pe.maps {
			unix.Munmap(m)
		}
		unix.Munmap(pe.mem)
	}
	p.peers, p.lastPeer = nil, nil
	p.pmu.Unlock()
	unix.Munmap(p.mem)
	return unix.Close(p.fd)
}

// release hands our ring in a peer's segment back: the receiver frees it
// once it has drained what is still in it (our last acknowledgements).
func (p *Port) release(pe *peer) {
	if pe.ring >= 0 && !pe.dead {
		atomic.CompareAndSwapUint64(u64(pe.mem, slot(pe.ring)+offOwner), p.tok, p.tok|retired)
	}
}

// Send transmits packets toward their Dst: each is encoded into our ring
// in the destination's segment. A packet to an unknown, foreign or dead
// port, or one that still finds the ring full after a bounded spin (see
// push), is dropped, as a datagram would be.
func (p *Port) Send(pkts []*wire.Packet) {
	p.pmu.Lock()
	var last *peer
	for _, pkt := range pkts {
		pe := p.peerFor(pkt.Dst)
		if pe != nil && p.push(pe, pkt) {
			p.sent.Add(1)
		} else {
			p.dropped.Add(1)
		}
		pkt.Release()
		if last != nil && pe != last {
			p.doorbell(last)
		}
		last = pe
	}
	if last != nil {
		p.doorbell(last)
	}
	p.pmu.Unlock()
}

// doorbell wakes pe's receiver if it sleeps (after our head store: both
// sides' accesses are sequentially consistent, so either it sees the new
// head before it sleeps or we see it asleep).
func (p *Port) doorbell(pe *peer) {
	if pe.dead || atomic.LoadUint32(u32(pe.mem, offSleeping)) == 0 {
		return
	}
	atomic.AddUint32(u32(pe.mem, offDoorbell), 1)
	futex.Wake(u32(pe.mem, offDoorbell))
}

// peerFor maps the segment of the port at dst; p.pmu is held.
func (p *Port) peerFor(dst netip.AddrPort) *peer {
	if p.peers == nil {
		return nil
	}
	if pe, ok := p.peers[dst]; ok {
		if pe.dead {
			return nil
		}
		return pe
	}
	a := dst.Addr().As16()
	if !dst.Addr().Is6() || [8]byte(a[:8]) != prefix {
		p.peers[dst] = &peer{dead: true}
		return nil
	}
	pid, fd := int(binary.BigEndian.Uint32(a[8:])), int(binary.BigEndian.Uint32(a[12:]))
	pe := &peer{pid: pid, ring: -1}
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/%d", pid, fd), os.O_RDWR, 0)
	if err == nil {
		pe.mem, err = unix.Mmap(int(f.Fd()), 0, segBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		f.Close()
	}
	if err != nil || atomic.LoadUint64(u64(pe.mem, offMagic)) != magic ||
		binary.LittleEndian.Uint64(pe.mem[offName:]) != p.name || int(binary.LittleEndian.Uint32(pe.mem[offPID:])) != pid ||
		binary.LittleEndian.Uint32(pe.mem[offInst:]) != uint32(dst.Port()) {
		if pe.mem != nil {
			unix.Munmap(pe.mem)
		}
		p.peers[dst] = &peer{dead: true}
		return nil
	}
	p.peers[dst] = pe
	return pe
}

// claim takes a free ring in pe's segment for this port.
func (p *Port) claim(pe *peer) bool {
	for i := range Rings {
		o := u64(pe.mem, slot(i)+offOwner)
		if !atomic.CompareAndSwapUint64(o, 0, p.tok|claiming) {
			continue
		}
		s := pe.mem[slot(i):]
		a := p.addr.Addr().As16()
		copy(s[offSrc:], a[:])
		binary.BigEndian.PutUint16(s[offSrc+16:], p.addr.Port())
		// The receiver reset head and tail when it freed the ring.
		pe.head = atomic.LoadUint64(u64(pe.mem, slot(i)+offHead))
		atomic.StoreUint64(o, p.tok)
		atomic.OrUint64(activeWord(pe.mem, i), activeBit(i))
		pe.ring = i
		return true
	}
	return false
}

// push encodes pkt into our ring in pe's segment; p.pmu is held.
func (p *Port) push(pe *peer, pkt *wire.Packet) bool {
	if pe.ring < 0 && !p.claim(pe) {
		return false
	}
	s := slot(pe.ring)
	if atomic.LoadUint64(u64(pe.mem, s+offOwner)) != p.tok {
		// The receiver reclaimed the ring (it thought us dead): claim anew.
		pe.ring = -1
		if !p.claim(pe) {
			return false
		}
		s = slot(pe.ring)
	}
	n := pkt.EncodedLen()
	need := uint64(4+n+7) &^ 7
	head := pe.head
	pos := head % RingBytes
	skip := uint64(0)
	if pos+need > RingBytes {
		skip = RingBytes - pos
	}
	tailp := u64(pe.mem, s+offTail)
	var since time.Time
	for i := 0; RingBytes-(head-atomic.LoadUint64(tailp)) < skip+need; i++ {
		// Full: the receiver is behind. Wait a little, unless it is gone.
		if i > 0 && i%1024 == 0 && !futex.Alive(pe.pid) {
			pe.dead = true
			return false
		}
		// Bounded in time, not in tries: on a loaded host each Pause may
		// take a scheduler slice, and a sender waiting seconds here is
		// often the peer's receiver, whose own ring then fills too (two
		// receivers each waiting on the other: every packet, ACKs
		// included, stuck until RC gives the connection up). A dropped
		// packet is retransmitted.
		if i == 0 {
			since = time.Now()
		} else if i%16 == 0 && time.Since(since) > pushWait {
			return false
		}
		spin.Pause(i)
	}
	data := pe.mem[ring(pe.ring):][:RingBytes]
	if skip > 0 {
		// Entries are 8-aligned, so there is always room for the marker.
		binary.LittleEndian.PutUint32(data[pos:], wrapMark)
		head += skip
		pos = 0
	}
	binary.LittleEndian.PutUint32(data[pos:], uint32(n))
	wire.Append(data[pos+4:pos+4:pos+4+uint64(n)], pkt)
	// For the race detector: after the payload was read, before it is
	// published (see kernelOrder).
	kernelOrder.Add(1)
	head += need
	pe.head = head
	atomic.StoreUint64(u64(pe.mem, s+offHead), head)
	return true
}

// wake wakes the port's own receiver.
func (p *Port) wake() {
	atomic.AddUint32(u32(p.mem, offDoorbell), 1)
	futex.Wake(u32(p.mem, offDoorbell))
}

// Progress drains the rings in the caller's goroutine, unless another
// goroutine is draining them, and returns how many packets it handled. A
// caller that busy-polls (a CQ, or memory a remote write changes) gets its
// packets with no goroutine hand-off.
func (p *Port) Progress() int {
	p.polls.Add(1)
	if !p.rmu.TryLock() {
		return 0
	}
	defer p.rmu.Unlock()
	if p.closed.Load() {
		return 0
	}
	return p.drain()
}

// receive is the port's background receiver: it drains the rings into the
// handler, spins a little when they are empty, then sleeps on the
// doorbell; every so often it frees the rings of senders that died. While
// pollers drive Progress it only naps.
func (p *Port) receive(spinFor time.Duration) {
	defer close(p.done)
	idleSince := time.Now()
	lastCheck := time.Now()
	// What the application did since the last look: polls of this port,
	// and spin rounds (spin.Pause) less this goroutine's own (own).
	polls, rounds, own := p.polls.Load(), spin.Rounds(), uint64(0)
	stirred, still := time.Now(), 0 // when they last moved; looks since
	db := u32(p.mem, offDoorbell)
	single := runtime.GOMAXPROCS(0) == 1
	for !p.closed.Load() {
		now := time.Now()
		if now.Sub(lastCheck) > 100*time.Millisecond {
			p.reap()
			p.watch()
			p.reaps.Add(1)
			lastCheck = now
			single = runtime.GOMAXPROCS(0) == 1 // it may have changed
		}
		p.rmu.Lock()
		n := p.drain()
		p.rmu.Unlock()
		if n > 0 {
			idleSince = time.Now()
			continue
		}
		if now.Sub(idleSince) < spinFor {
			own++
			spin.Pause(int(now.Sub(idleSince) / time.Microsecond))
			continue
		}
		pn, r := p.polls.Load(), spin.Rounds()-own
		polled := pn != polls
		if polled || r != rounds {
			polls, rounds, stirred, still = pn, r, now, 0
		}
		still++
		if single && (now.Sub(stirred) < quietFor || still < stillLooks) {
			// One processor, and the application polled or spun (any
			// spin.Pause) lately: a futex wait here would hold the
			// processor (a system call keeps it until the runtime takes
			// it back, a tick of 20 us to 10 ms later) that the waiter
			// needs the moment its data comes, and it would stall as
			// long (halo3d's notify variant lost a fifth so, where four
			// ranks share two cores). A timer's sleep lasts a
			// millisecond. Yield instead, until the application has
			// been still for quietFor and stillLooks looks: the
			// scheduler may run this goroutine twice in a row, and its
			// thread may have been off the core meanwhile. Now and then
			// give the core to the kernel too: ranks sharing it wait.
			if still%16 == 0 {
				spin.Yield()
			} else {
				runtime.Gosched()
			}
			continue
		}
		if polled {
			// The application polls and drains the rings itself: nap.
			futex.Wait(db, atomic.LoadUint32(db), 20*time.Microsecond)
			continue
		}
		v := atomic.LoadUint32(db)
		atomic.StoreUint32(u32(p.mem, offSleeping), 1)
		if !p.pending() && !p.closed.Load() {
			futex.Wait(db, v, sleepMax)
		}
		atomic.StoreUint32(u32(p.mem, offSleeping), 0)
	}
}

// activeWord is the word of the active mask holding ring i's bit.
func activeWord(mem []byte, i int) *uint64 { return u64(mem, offActive+8*(i/64)) }

func activeBit(i int) uint64 { return 1 << (i % 64) }

// active calls f for each claimed ring, in order, until f returns false.
func (p *Port) active(f func(i int) bool) {
	for w := range Rings / 64 {
		for act := atomic.LoadUint64(u64(p.mem, offActive+8*w)); act != 0; act &= act - 1 {
			if !f(64*w + bits.TrailingZeros64(act)) {
				return
			}
		}
	}
}

// pending reports whether any ring holds data.
func (p *Port) pending() bool {
	found := false
	p.active(func(i int) bool {
		s := slot(i)
		if atomic.LoadUint64(u64(p.mem, s+offOwner)) == 0 {
			return true
		}
		found = atomic.LoadUint64(u64(p.mem, s+offHead)) != atomic.LoadUint64(u64(p.mem, s+offTail))
		return !found
	})
	return found
}

// drain hands what the rings hold to the handler, up to a batch per ring,
// and returns how many packets it handled; p.rmu is held.
func (p *Port) drain() int {
	handled := 0
	p.active(func(i int) bool {
		handled += p.drainRing(i)
		return true
	})
	return handled
}

// drainRing drains ring i (see drain) and returns how many packets it
// handled.
func (p *Port) drainRing(i int) int {
	handled := 0
	s := slot(i)
	owner := atomic.LoadUint64(u64(p.mem, s+offOwner))
	if owner == 0 || owner&claiming != 0 {
		return 0
	}
	headp, tailp := u64(p.mem, s+offHead), u64(p.mem, s+offTail)
	head, tail := atomic.LoadUint64(headp), atomic.LoadUint64(tailp)
	if head == tail {
		if owner&retired != 0 && atomic.CompareAndSwapUint64(u64(p.mem, s+offOwner), owner, 0) {
			p.inactive(i) // drained: free
		}
		return 0
	}
	kernelOrder.Load()
	if head-tail > RingBytes || head < tail {
		// A sender wrote nonsense: discard what it wrote.
		p.malformed.Add(1)
		atomic.StoreUint64(tailp, head)
		return 1
	}
	var a [16]byte
	copy(a[:], p.mem[s+offSrc:])
	src := netip.AddrPortFrom(netip.AddrFrom16(a), binary.BigEndian.Uint16(p.mem[s+offSrc+16:]))
	data := p.mem[ring(i):][:RingBytes]
	p.rx = p.rx[:0]
	for tail != head && len(p.rx) < cap(p.rx) {
		pos := tail % RingBytes
		n := uint64(wrapMark)
		if RingBytes-pos >= 4 {
			n = uint64(binary.LittleEndian.Uint32(data[pos:]))
		}
		if n == wrapMark {
			if tail+RingBytes-pos > head {
				// A wrap past what was written: garbage.
				p.malformed.Add(1)
				tail = head
				break
			}
			tail += RingBytes - pos
			continue
		}
		need := (4 + n + 7) &^ 7
		if n == 0 || pos+need > RingBytes || tail+need > head {
			p.malformed.Add(1)
			tail = head
			break
		}
		pkt := wire.Get()
		if err := wire.Parse(data[pos+4:pos+4+n], pkt); err != nil {
			pkt.Release()
			p.malformed.Add(1)
		} else {
			pkt.Src, pkt.Dst = src, p.addr
			p.rx = append(p.rx, pkt)
		}
		tail += need
	}
	if len(p.rx) > 0 {
		handled = len(p.rx)
		p.received.Add(uint64(len(p.rx)))
		p.hmu.Lock()
		h := p.handler
		p.hmu.Unlock()
		if h != nil {
			h.HandlePackets(p.rx)
		}
		for _, pkt := range p.rx {
			pkt.Release()
		}
	}
	// Only now may the sender reuse the space: the payloads aliased it.
	atomic.StoreUint64(tailp, tail)
	return handled
}

// reap frees the rings of senders whose process is gone.
func (p *Port) reap() {
	for i := range Rings {
		s := slot(i)
		o := u64(p.mem, s+offOwner)
		owner := atomic.LoadUint64(o)
		if owner == 0 {
			continue
		}
		pid := int((owner &^ flags) >> 32)
		if futex.Alive(pid) {
			continue
		}
		// Head and tail restart at the same point; then the slot is free.
		atomic.StoreUint64(u64(p.mem, s+offBusy), 0)
		atomic.StoreUint64(u64(p.mem, s+offTail), atomic.LoadUint64(u64(p.mem, s+offHead)))
		if atomic.CompareAndSwapUint64(o, owner, 0) {
			p.inactive(i)
		}
	}
}

// watch marks gone the watched peers whose process is gone (see Map).
func (p *Port) watch() {
	p.pmu.Lock()
	defer p.pmu.Unlock()
	for _, pe := range p.peers {
		if pe.watched.Load() && !pe.gone.Load() && !futex.Alive(pe.pid) {
			pe.gone.Store(true)
		}
	}
}

// inactive clears ring i's bit in the active mask after its slot was
// freed; if a sender claimed it again meanwhile, the bit is set again.
func (p *Port) inactive(i int) {
	m := activeWord(p.mem, i)
	atomic.AndUint64(m, ^activeBit(i))
	if atomic.LoadUint64(u64(p.mem, slot(i)+offOwner)) != 0 {
		atomic.OrUint64(m, activeBit(i))
	}
}
