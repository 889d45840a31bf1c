package udpfab

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rvma/rvma/internal/fabric"
	"github.com/rvma/rvma/internal/spin"
	"github.com/rvma/rvma/internal/wire"
)

// MaxMTU is the largest payload a udp port carries: a UDP datagram's limit
// less the largest header stack.
const MaxMTU = 65000 - wire.MaxHeaderLen

// DefaultMTU is RoCE's largest standard path MTU.
const DefaultMTU = 4096

// kernelOrder models, for the Go memory model and the race detector, the
// ordering a datagram gives: everything a goroutine did before sending
// happens before what the receiver does after receiving it. The kernel
// provides that (a syscall is a full barrier, and delivery follows the
// send); Go cannot see it through a socket, so a send releases this word
// and a receive acquires it. Without it, a process that holds both ends of
// a connection (tests, in-process worlds) would see a data race between a
// remote write's placement and the reads its completion allows.
var kernelOrder atomic.Uint64

// Port is one GID of a udp device. It implements fabric.Port.
type Port struct {
	conn *Conn
	addr netip.AddrPort
	mtu  int
	log  *slog.Logger

	hmu     sync.Mutex
	handler fabric.Handler

	smu    sync.Mutex // guards the send batch
	trains []Message
	bufs   [][]byte
	ntrain int
	tstate []trainState
	iovs   [][][]byte     // each train's pieces (canGather)
	held   []*wire.Packet // packets whose payloads a train sends in place

	closed atomic.Bool
	done   chan struct{}

	// The reader role: whoever holds rmu reads the socket and runs the
	// handler (the background goroutine, or a Progress caller), so the
	// handler never runs twice at once and the receive buffers are shared.
	rmu    sync.Mutex
	missed atomic.Bool
	rxMsgs []Message
	rxPkts []*wire.Packet

	// polled is set by Progress; the background reader clears it while it
	// spins and stops spinning when it finds it set again (pollers are
	// active, so a spinning reader would only take processor time).
	polled atomic.Bool
	// empty counts Progress's reads in a row that found nothing; past
	// idleAfter, Progress reads only every idleEvery-th call (calls).
	empty, calls atomic.Uint32
	start        time.Time
	// Spin is how long the background reader keeps polling after traffic
	// before it parks (default 50µs, or the process's spin override).
	Spin time.Duration

	sent, received, malformed, sendDropped atomic.Uint64
}

var _ fabric.Port = (*Port)(nil)

// Open binds a port to addr with the given MTU (payload bytes).
func Open(addr netip.AddrPort, mtu int, cfg *Config) (*Port, error) {
	if mtu < 256 || mtu > MaxMTU {
		return nil, fmt.Errorf("udpfab: MTU %d: want 256..%d", mtu, MaxMTU)
	}
	if cfg == nil {
		cfg = &Config{}
	}
	log := cfg.Logger
	c, err := Listen(addr, cfg)
	if err != nil {
		return nil, fmt.Errorf("udpfab: listen %v: %w", addr, err)
	}
	p := &Port{conn: c, addr: c.LocalAddr(), mtu: mtu, log: log, done: make(chan struct{}),
		trains: make([]Message, BatchSize), bufs: make([][]byte, BatchSize), tstate: make([]trainState, BatchSize),
		start: time.Now(), Spin: defaultSpin()}
	for i := range p.bufs {
		p.bufs[i] = make([]byte, 0, MaxTrain)
	}
	if canGather {
		p.iovs = make([][][]byte, BatchSize)
		for i := range p.iovs {
			p.iovs[i] = make([][]byte, 0, maxPieces)
		}
		p.held = make([]*wire.Packet, 0, 4*BatchSize)
	}
	// The socket's own spin is off: the port decides when its background
	// reader spins (not while pollers call Progress).
	c.Spin = 0
	size := MaxTrain
	if !c.Features().GRO {
		size = min(MaxTrain, mtu+wire.MaxHeaderLen+64)
	}
	p.rxMsgs = make([]Message, BatchSize)
	for i := range p.rxMsgs {
		p.rxMsgs[i].Buf = make([]byte, size)
	}
	p.rxPkts = make([]*wire.Packet, 0, 4*BatchSize)
	go p.receive()
	return p, nil
}

// Addr returns the bound address (with the port chosen if 0 was asked).
func (p *Port) Addr() netip.AddrPort { return p.addr }

// MaxPayload returns the port's MTU.
func (p *Port) MaxPayload() int { return p.mtu }

// Features reports the socket features in use.
func (p *Port) Features() Features { return p.conn.Features() }

// SetHandler installs the packet handler; packets that arrive before it
// are dropped.
func (p *Port) SetHandler(h fabric.Handler) {
	p.hmu.Lock()
	p.handler = h
	p.hmu.Unlock()
}

// Stats returns the port's counters.
func (p *Port) Stats() fabric.Stats {
	return fabric.Stats{Sent: p.sent.Load(), Received: p.received.Load(),
		Dropped: p.malformed.Load(), Undeliverable: p.sendDropped.Load()}
}

// Malformed returns the number of datagrams that did not decode.
func (p *Port) Malformed() uint64 { return p.malformed.Load() }

// gatherMin is the shortest payload a train sends from where it lies
// instead of copying it in: below it a piece costs more than the copy.
const gatherMin = 2048

// trainState is what Send knows of a train being built.
type trainState struct {
	size int // bytes of the train, payloads sent in place included
	mark int // bytes of the train's buffer already among its pieces
}

// Send encodes packets into GSO trains and sends them in one batch.
// Consecutive packets to one destination with the same encoded size share
// a train; a shorter packet ends its train, as GSO requires. Where the
// socket gathers, a payload of gatherMin bytes or more is not copied: the
// train sends it from where it lies, between its headers and trailer in
// the train's buffer, and the packet is held until the batch is sent: if
// the packet says the payload is steady (wire.Packet.Steady).
func (p *Port) Send(pkts []*wire.Packet) {
	if p.closed.Load() {
		for _, pk := range pkts {
			pk.Release()
		}
		return
	}
	gso := p.conn.Features().GSO
	p.smu.Lock()
	defer p.smu.Unlock()
	var cur *Message
	var ts *trainState
	for _, pk := range pkts {
		n := pk.EncodedLen()
		if cur == nil || !gso || cur.Addr != pk.Dst || cur.Seg == 0 && ts.size > 0 ||
			ts.size%cur.Seg != 0 || n > cur.Seg || ts.size+n > MaxTrain || ts.size/cur.Seg >= MaxSegments {
			if p.ntrain == len(p.trains) {
				p.flush()
			}
			cur, ts = &p.trains[p.ntrain], &p.tstate[p.ntrain]
			*cur = Message{Buf: p.bufs[p.ntrain][:0], Addr: pk.Dst, Seg: n}
			*ts = trainState{}
			if canGather {
				cur.Iov = p.iovs[p.ntrain][:0]
			}
			p.ntrain++
			if !gso {
				cur.Seg = 0
			}
		}
		ts.size += n
		if canGather && pk.Steady && len(pk.Payload) >= gatherMin {
			var at int
			// The buffer never grows past its capacity (MaxTrain), so the
			// pieces cut from it stay where they are.
			if cur.Buf, at = wire.AppendSplit(cur.Buf, pk); at >= 0 {
				raceRead(pk.Payload) // the kernel reads it, where the detector cannot see
				cur.Iov = append(cur.Iov, cur.Buf[ts.mark:at], pk.Payload)
				ts.mark = at
				p.held = append(p.held, pk)
				continue
			}
		} else {
			cur.Buf = wire.Append(cur.Buf, pk)
		}
		pk.Release()
	}
	p.flush()
}

// flush sends the pending trains and releases the packets they held; p.smu
// is held.
func (p *Port) flush() {
	if p.ntrain == 0 {
		return
	}
	msgs := p.trains[:p.ntrain]
	var segs uint64
	for i := range msgs {
		m, ts := &msgs[i], &p.tstate[i]
		if len(m.Iov) > 0 {
			if tail := m.Buf[ts.mark:]; len(tail) > 0 {
				m.Iov = append(m.Iov, tail)
			}
		} else {
			m.Iov = nil
		}
		if m.Seg > 0 && ts.size <= m.Seg {
			m.Seg = 0 // a train of one is a plain datagram
		}
		if m.Seg > 0 {
			segs += uint64((ts.size + m.Seg - 1) / m.Seg)
		} else {
			segs++
		}
	}
	kernelOrder.Add(1)
	dropped, err := p.conn.WriteBatch(msgs)
	if err != nil && !errClosed(err) && p.log != nil {
		p.log.Warn("udp send failed", "port", p.addr, "err", err)
	}
	p.sent.Add(segs)
	p.sendDropped.Add(uint64(dropped))
	for i := range msgs {
		clear(msgs[i].Iov) // no payload kept alive by a piece
	}
	clear(p.trains[:p.ntrain])
	p.ntrain = 0
	for i, pk := range p.held {
		pk.Release()
		p.held[i] = nil
	}
	p.held = p.held[:0]
}

// receive is the port's background receiver: asynchronous progress for
// when no goroutine polls. It parks on the network poller until a datagram
// arrives and takes the reader role for each batch.
func (p *Port) receive() {
	errs := 0
	for {
		p.spinAfterTraffic()
		k, err := p.conn.ReadBatchRole(p.rxMsgs, &p.rmu, &p.missed)
		if err != nil {
			if p.closed.Load() || errClosed(err) {
				close(p.done)
				return
			}
			// A transient error: back off, and give up on a death spiral.
			if errs++; errs > 10 {
				if p.log != nil {
					p.log.Error("udp receive failing, port stops receiving", "port", p.addr, "err", err)
				}
				close(p.done)
				return
			}
			time.Sleep(time.Second / 3)
			continue
		}
		errs = 0
		p.handle(k)
		p.rmu.Unlock()
	}
}

func (p *Port) now() int64 { return int64(time.Since(p.start)) }

// spinAfterTraffic keeps receiving without parking for Spin after the last
// packet, so that a peer's reply costs no wake-up, unless a goroutine is
// polling the port itself, in which case a spinning reader would only take
// processor time from it.
func (p *Port) spinAfterTraffic() {
	spinNs := int64(p.Spin)
	if spinNs <= 0 {
		return
	}
	last := p.now()
	p.polled.Store(false)
	for i := 0; ; i++ {
		now := p.now()
		if now-last > spinNs || p.polled.Load() || p.closed.Load() {
			return
		}
		if p.rmu.TryLock() {
			k, err := p.conn.TryReadBatch(p.rxMsgs)
			if k > 0 {
				p.handle(k)
				last = p.now()
			}
			p.rmu.Unlock()
			if err != nil {
				return
			}
		}
		spin.Pause(i)
	}
}

// Progress receives and handles, in the caller's goroutine, every datagram
// waiting at the socket, and returns how many packets it handled. It
// returns at once if another goroutine holds the reader role. Busy-polling
// callers use it to avoid a goroutine hand-off per packet.
func (p *Port) Progress() int {
	if !p.polled.Load() {
		p.polled.Store(true)
	}
	// A port without traffic lately (an auto device whose rank talks to
	// its own host over shared memory) is read only now and then: each
	// empty read is a system call, and the background reader still takes
	// what arrives meanwhile.
	if p.empty.Load() >= idleAfter && p.calls.Add(1)%idleEvery != 0 {
		return 0
	}
	total := 0
	for {
		if !p.rmu.TryLock() {
			return total
		}
		for !p.closed.Load() {
			k, err := p.conn.TryReadBatch(p.rxMsgs)
			if k == 0 || err != nil {
				break
			}
			total += p.handle(k)
		}
		p.rmu.Unlock()
		// The background reader may have found the role taken while we
		// held it; it then waits for the next arrival, so drain again.
		if !p.missed.Swap(false) {
			if total == 0 {
				p.empty.Add(1)
			}
			return total
		}
	}
}

// Progress's back-off on an idle port.
const (
	idleAfter = 64
	idleEvery = 16
)

// handle decodes k received messages and runs the handler; the caller
// holds the reader role.
func (p *Port) handle(k int) int {
	kernelOrder.Load()
	if p.empty.Load() != 0 {
		p.empty.Store(0)
	}
	pkts := p.rxPkts[:0]
	for i := 0; i < k; i++ {
		src := p.rxMsgs[i].Addr
		Split(&p.rxMsgs[i], func(d []byte) {
			pk := wire.Get()
			if wire.Parse(d, pk) != nil {
				p.malformed.Add(1)
				pk.Release()
				return
			}
			pk.Src, pk.Dst = src, p.addr
			pkts = append(pkts, pk)
		})
	}
	n := len(pkts)
	p.received.Add(uint64(n))
	p.hmu.Lock()
	h := p.handler
	p.hmu.Unlock()
	if h != nil && n > 0 {
		h.HandlePackets(pkts)
	}
	for j, pk := range pkts {
		pk.Release()
		pkts[j] = nil
	}
	p.rxPkts = pkts[:0]
	return n
}

// Close closes the socket and waits for the receiving goroutine to stop.
func (p *Port) Close() error {
	if p.closed.Swap(true) {
		return net.ErrClosed
	}
	err := p.conn.Close()
	<-p.done
	// A Progress call may be running the handler: wait for it. Later
	// ones see the port closed and return.
	p.rmu.Lock()
	//lint:ignore SA2001 an empty critical section: waiting for the holder is the point
	p.rmu.Unlock()
	return err
}

// DefaultMTUFor picks the path MTU for a port bound to addr: RoCE's 4096,
// or the largest RoCE MTU (256..4096) whose datagram fits the interface
// that owns addr, since don't-fragment is set.
func DefaultMTUFor(addr netip.Addr) int {
	room, ok := roomFor(addr)
	if !ok {
		return DefaultMTU
	}
	for mtu := DefaultMTU; mtu >= 256; mtu /= 2 {
		if mtu <= room {
			return mtu
		}
	}
	return 256
}

// LargestMTUFor is the largest payload a port bound to addr carries in one
// datagram on the interface that owns addr: a multiple of 4096 up to
// MaxMTU where more than 4096 fits (61440 on loopback, 8192 with 9000-byte
// jumbo frames), else DefaultMTUFor's.
// Fewer, larger packets cost less per byte on both sides, as TCP's 64 KB
// segments do on loopback; RoCE's 4096 is a limit of NICs, not of UDP.
func LargestMTUFor(addr netip.Addr) int {
	room, ok := roomFor(addr)
	if !ok {
		return DefaultMTU
	}
	if m := min(room, MaxMTU) &^ (DefaultMTU - 1); m > DefaultMTU {
		return m
	}
	return DefaultMTUFor(addr)
}

// roomFor returns the payload room of one unfragmented datagram on the
// interface that owns addr, less the largest header stack.
func roomFor(addr netip.Addr) (int, bool) {
	ifaces, err := net.Interfaces()
	if err != nil || addr.IsUnspecified() {
		return 0, false
	}
	overhead := 8 + 20 + wire.MaxHeaderLen
	if addr.Is6() && !addr.Is4In6() {
		overhead += 20
	}
	for _, ifc := range ifaces {
		as, _ := ifc.Addrs()
		for _, a := range as {
			pfx, err := netip.ParsePrefix(a.String())
			if err != nil || pfx.Addr().Unmap() != addr.Unmap() {
				continue
			}
			return ifc.MTU - overhead, true
		}
	}
	return 0, false
}
