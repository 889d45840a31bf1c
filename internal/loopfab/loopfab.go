// Package loopfab is the in-process fabric behind verbs' loop provider.
// Devices that open the same fabric name reach each other; each device gets
// one Port per GID, addressed by a synthetic IPv6 unique-local address.
//
// Delivery is asynchronous with respect to the engine (packets land in the
// destination port's queue and its handler processes them), but it is
// drained by whoever delivers when the destination is idle, as the kernel's
// loopback device processes a packet in the sender's context. A port's
// worker goroutine takes over once a sender has drained a budget, so no
// caller is captured by a busy destination. Only one goroutine runs a port's
// handler at a time, so arrival order is kept.
//
// Packets are passed by pointer and never encoded; a payload may reference
// the sender's registered memory, and the receiver copies it once into
// place, which is the one copy a NIC's DMA engine makes.
package loopfab

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/rvma/rvma/internal/fabric"
	"github.com/rvma/rvma/internal/wire"
)

// DefaultMTU is the payload size of a loop packet unless the URI says
// otherwise: large, because an in-process packet costs the same whatever its
// size, and per-packet work is what limits bandwidth here.
const DefaultMTU = 64 << 10

// MaxMTU bounds the configurable payload size.
const MaxMTU = 1 << 20

// inlineBudget is how many packets a sender drains at a destination before
// handing the rest to the destination's worker.
const inlineBudget = 256

// ErrClosed is returned for operations on a closed port.
var ErrClosed = errors.New("loopfab: port closed")

type fabricT struct {
	name  string
	id    [5]byte
	mu    sync.Mutex
	ports map[netip.AddrPort]*Port
	// lookup is a copy-on-write snapshot of ports, read on every packet.
	lookup  atomic.Pointer[map[netip.AddrPort]*Port]
	nextDev uint32
}

var registry = struct {
	sync.Mutex
	m map[string]*fabricT
}{m: map[string]*fabricT{}}

// Open creates a device on the named fabric with n ports of the given MTU.
func Open(name string, n, mtu int) ([]*Port, error) {
	if n < 1 || n > 256 {
		return nil, fmt.Errorf("loopfab: %d GIDs: want 1..256", n)
	}
	if mtu < 256 || mtu > MaxMTU {
		return nil, fmt.Errorf("loopfab: MTU %d: want 256..%d", mtu, MaxMTU)
	}
	registry.Lock()
	f := registry.m[name]
	if f == nil {
		f = &fabricT{name: name, ports: map[netip.AddrPort]*Port{}}
		h := fnv.New64a()
		h.Write([]byte(name))
		s := h.Sum64()
		for i := range f.id {
			f.id[i] = byte(s >> (8 * i))
		}
		registry.m[name] = f
	}
	// Lock order registry -> f.mu, as in Close; holding the registry keeps
	// a concurrent Close from retiring f while ports are added.
	defer registry.Unlock()

	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextDev++
	dev := f.nextDev
	ports := make([]*Port, n)
	for i := range ports {
		var a [16]byte
		a[0] = 0xfd
		copy(a[1:6], f.id[:])
		a[8], a[9], a[10], a[11] = byte(dev>>24), byte(dev>>16), byte(dev>>8), byte(dev)
		a[14], a[15] = byte((i+1)>>8), byte(i+1)
		p := &Port{
			fab:    f,
			addr:   netip.AddrPortFrom(netip.AddrFrom16(a), 4791),
			mtu:    mtu,
			kick:   make(chan struct{}, 1),
			done:   make(chan struct{}),
			exited: make(chan struct{}),
		}
		p.idle.L = &p.mu
		f.ports[p.addr] = p
		ports[i] = p
		go p.worker()
	}
	f.publish()
	return ports, nil
}

// publish snapshots the port map; callers hold f.mu.
func (f *fabricT) publish() {
	m := make(map[netip.AddrPort]*Port, len(f.ports))
	for k, v := range f.ports {
		m[k] = v
	}
	f.lookup.Store(&m)
}

// Port is one address on a loop fabric. It implements fabric.Port.
type Port struct {
	fab     *fabricT
	addr    netip.AddrPort
	mtu     int
	handler fabric.Handler

	mu       sync.Mutex // guards queue, spare, draining, handedOff, closed
	queue    []*wire.Packet
	spare    []*wire.Packet
	draining bool // a goroutine runs (or the worker is asked to run) the handler
	// handedOff: the draining role was passed to the worker, which has
	// not taken it yet.
	handedOff bool
	closed    bool
	idle      sync.Cond // on mu: the draining role was given up after Close

	kick   chan struct{}
	done   chan struct{} // closed by Close: the worker stops
	exited chan struct{} // closed by the worker when it stopped

	sent, received, undeliverable atomic.Uint64
}

var _ fabric.Port = (*Port)(nil)

// Addr returns the port's address.
func (p *Port) Addr() netip.AddrPort { return p.addr }

// MaxPayload returns the port's MTU.
func (p *Port) MaxPayload() int { return p.mtu }

// SetHandler installs the packet handler. Packets that arrive before it
// are dropped as undeliverable.
func (p *Port) SetHandler(h fabric.Handler) {
	p.mu.Lock()
	p.handler = h
	p.mu.Unlock()
}

// Stats returns counters of the port's traffic.
func (p *Port) Stats() fabric.Stats {
	return fabric.Stats{Sent: p.sent.Load(), Received: p.received.Load(), Undeliverable: p.undeliverable.Load()}
}

// Send delivers packets to their destination ports.
func (p *Port) Send(pkts []*wire.Packet) {
	m := *p.fab.lookup.Load()
	for len(pkts) > 0 {
		dst := m[pkts[0].Dst]
		n := 1
		for n < len(pkts) && pkts[n].Dst == pkts[0].Dst {
			n++
		}
		batch := pkts[:n]
		pkts = pkts[n:]
		p.sent.Add(uint64(n))
		for _, q := range batch {
			q.Src = p.addr // as the other providers report it on arrival
		}
		if dst == nil {
			p.undeliverable.Add(uint64(n))
			release(batch)
			continue
		}
		dst.enqueue(batch)
	}
}

func release(pkts []*wire.Packet) {
	for _, q := range pkts {
		q.Release()
	}
}

func (p *Port) enqueue(batch []*wire.Packet) {
	p.mu.Lock()
	if p.closed || p.handler == nil {
		p.mu.Unlock()
		p.undeliverable.Add(uint64(len(batch)))
		release(batch)
		return
	}
	if p.draining {
		// Handled later by another goroutine, perhaps after the send
		// completed (UC completes once sent): payloads must not alias
		// the sender's memory any longer.
		for _, q := range batch {
			q.Own()
		}
		p.queue = append(p.queue, batch...)
		p.mu.Unlock()
		return
	}
	p.queue = append(p.queue, batch...)
	p.draining = true
	p.mu.Unlock()
	p.drain(inlineBudget)
}

// drain runs the handler over queued packets until the queue is empty or
// the budget is spent; the caller holds the draining role.
func (p *Port) drain(budget int) {
	for {
		p.mu.Lock()
		if len(p.queue) == 0 || p.closed {
			release(p.queue)
			p.queue = p.queue[:0]
			p.draining = false
			if p.closed {
				p.idle.Broadcast() // Close waits for the handler to return
			}
			p.mu.Unlock()
			return
		}
		if budget <= 0 {
			for _, q := range p.queue {
				q.Own()
			}
			p.handedOff = true
			p.mu.Unlock()
			// The worker inherits the draining role.
			select {
			case p.kick <- struct{}{}:
			default:
			}
			return
		}
		batch := p.queue
		p.queue = p.spare[:0]
		p.spare = nil
		p.mu.Unlock()

		p.received.Add(uint64(len(batch)))
		p.handler.HandlePackets(batch)
		release(batch)
		clear(batch)
		budget -= len(batch)

		p.mu.Lock()
		p.spare = batch[:0]
		p.mu.Unlock()
	}
}

func (p *Port) worker() {
	defer close(p.exited)
	for {
		select {
		case <-p.kick:
			p.mu.Lock()
			p.handedOff = false
			p.mu.Unlock()
			p.drain(int(^uint(0) >> 1))
		case <-p.done:
			return
		}
	}
}

// Close removes the port from its fabric and drops queued packets.
func (p *Port) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.closed = true
	p.mu.Unlock()
	close(p.done)
	// No handler call may be in progress when Close returns: the worker
	// is gone, a role handed to it that it never took is taken back, and
	// an inline drain stops after its batch.
	<-p.exited
	p.mu.Lock()
	if p.handedOff {
		p.handedOff, p.draining = false, false
		release(p.queue)
		p.queue = p.queue[:0]
	}
	for p.draining {
		p.idle.Wait()
	}
	p.mu.Unlock()

	f := p.fab
	f.mu.Lock()
	delete(f.ports, p.addr)
	f.publish()
	empty := len(f.ports) == 0
	f.mu.Unlock()
	if empty {
		registry.Lock()
		// Re-check under the registry lock: a device may have joined.
		f.mu.Lock()
		if len(f.ports) == 0 && registry.m[f.name] == f {
			delete(registry.m, f.name)
		}
		f.mu.Unlock()
		registry.Unlock()
	}
	return nil
}
