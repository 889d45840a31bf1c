// Package linkem emulates a long-haul link for UDP in user space (the
// kernel here has no netem): two sockets, A and B; what arrives at A is
// forwarded out of B to B's peer and vice versa, after a rate limiter with
// a drop-tail queue and fabric.Faults' impairments (delay, jitter, loss,
// Gilbert-Elliott bursts, reordering, duplication), drawn from a seeded
// source per direction.
//
// Each side's peer is the latest address that sent to it, unless
// configured (then it is that address, whoever sends): an endpoint
// restarted on a new port, as a resuming transfer's is, takes its side
// over with its first packet. Packets toward a side whose peer is not
// known yet wait (up to 4096 of them). A Link is safe for concurrent use.
package linkem

import (
	"container/heap"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rvma/rvma/internal/fabric"
)

// Config configures Start. The zero value forwards unimpaired.
type Config struct {
	A, B         string         // listen addresses; default "127.0.0.1:0"
	PeerA, PeerB netip.AddrPort // the endpoints behind A and B; default: the latest sender to each
	// Faults apply to each direction; B→A uses Seed+1.
	Faults fabric.Faults
	// Rate is each direction's rate in bytes per second; 0: unlimited.
	Rate float64
	// Queue is the bytes each direction's queue holds before it drops
	// arrivals (drop tail). Default 4 MiB, or Rate·50ms if larger.
	Queue  int
	Logger *slog.Logger
}

// DirStats counts one direction's packets.
type DirStats struct {
	Packets    uint64 // arrived
	Bytes      uint64 // arrived payload bytes
	Lost       uint64 // dropped by the loss model
	Overflow   uint64 // dropped by the full queue
	Down       uint64 // dropped while the link was down (SetDown)
	Duplicated uint64
	Delivered  uint64
	Failed     uint64 // could not be sent on
	NewPeers   uint64 // times the sending side's peer was learned or changed
}

func (s DirStats) String() string {
	return fmt.Sprintf("%d packets (%d bytes) in, %d delivered, %d lost, %d queue drops, %d dropped while down, %d duplicated, sender learned %d times",
		s.Packets, s.Bytes, s.Delivered, s.Lost, s.Overflow, s.Down, s.Duplicated, s.NewPeers)
}

// Link is a running emulator.
type Link struct {
	cfg   Config
	log   *slog.Logger
	sock  [2]*net.UDPConn
	peer  [2]atomic.Pointer[netip.AddrPort]
	fixed [2]bool // configured peers: never learned
	dir   [2]*direction
	rate  atomic.Uint64 // bytes/s as float64 bits: Config.Rate, then SetRate's
	down  atomic.Bool
	wg    sync.WaitGroup
	done  chan struct{}
}

// direction is one way: packets arriving at sock[from], leaving sock[1-from].
type direction struct {
	l     *Link
	from  int
	im    *fabric.Impairer
	mu    sync.Mutex
	free  time.Time // when the rate limiter's line is next free
	queue int       // bytes waiting for the line
	held  pktHeap
	wait  [][]byte      // toward an unknown peer
	kick  chan struct{} // wakes the sender: a new earliest packet
	st    struct {
		packets, bytes, lost, overflow, down, dup, delivered, failed, peers atomic.Uint64
	}
}

type pkt struct {
	at   time.Time
	seq  uint64
	b    []byte
	line int // bytes to release from the queue when it leaves the line
}

type pktHeap []pkt

func (h pktHeap) Len() int { return len(h) }
func (h pktHeap) Less(i, j int) bool {
	return h[i].at.Before(h[j].at) || (h[i].at.Equal(h[j].at) && h[i].seq < h[j].seq)
}
func (h pktHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *pktHeap) Push(x any)   { *h = append(*h, x.(pkt)) }
func (h *pktHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Start opens the two sockets and forwards until Close.
func Start(cfg Config) (*Link, error) {
	if cfg.A == "" {
		cfg.A = "127.0.0.1:0"
	}
	if cfg.B == "" {
		cfg.B = "127.0.0.1:0"
	}
	if cfg.Queue == 0 {
		cfg.Queue = max(4<<20, int(cfg.Rate*0.05))
	}
	if cfg.Rate < 0 || cfg.Queue < 0 {
		return nil, errors.New("linkem: negative rate or queue")
	}
	l := &Link{cfg: cfg, log: cfg.Logger, done: make(chan struct{})}
	l.rate.Store(math.Float64bits(cfg.Rate))
	if l.log == nil {
		l.log = slog.Default()
	}
	for i, a := range []string{cfg.A, cfg.B} {
		ua, err := net.ResolveUDPAddr("udp", a)
		if err != nil {
			l.closeSockets()
			return nil, fmt.Errorf("linkem: %w", err)
		}
		if l.sock[i], err = net.ListenUDP("udp", ua); err != nil {
			l.closeSockets()
			return nil, fmt.Errorf("linkem: %w", err)
		}
		_ = l.sock[i].SetReadBuffer(8 << 20)
		_ = l.sock[i].SetWriteBuffer(8 << 20)
	}
	for i, p := range []netip.AddrPort{cfg.PeerA, cfg.PeerB} {
		if p.IsValid() {
			l.peer[i].Store(&p)
			l.fixed[i] = true
		}
	}
	for i := range l.dir {
		f := cfg.Faults
		f.Seed += uint64(i)
		l.dir[i] = &direction{l: l, from: i, im: fabric.NewImpairer(f), kick: make(chan struct{}, 1)}
	}
	l.wg.Add(4)
	go l.read(0)
	go l.read(1)
	go l.dir[0].run()
	go l.dir[1].run()
	return l, nil
}

// AddrA is side A's address.
func (l *Link) AddrA() netip.AddrPort { return l.sock[0].LocalAddr().(*net.UDPAddr).AddrPort() }

// AddrB is side B's address.
func (l *Link) AddrB() netip.AddrPort { return l.sock[1].LocalAddr().(*net.UDPAddr).AddrPort() }

// SetRate changes each direction's rate (bytes/s; 0: unlimited) for the
// packets that arrive from now on, as a path whose capacity changes; the
// queue's size stays as Start set it.
func (l *Link) SetRate(rate float64) {
	l.rate.Store(math.Float64bits(max(rate, 0)))
}

// SetDown makes the link drop every packet that arrives, both ways
// (down), as a path that fails, or forward again (up).
func (l *Link) SetDown(down bool) { l.down.Store(down) }

// Stats returns the counters of A→B and B→A.
func (l *Link) Stats() (ab, ba DirStats) { return l.dir[0].stats(), l.dir[1].stats() }

func (d *direction) stats() DirStats {
	return DirStats{Packets: d.st.packets.Load(), Bytes: d.st.bytes.Load(), Lost: d.st.lost.Load(),
		Overflow: d.st.overflow.Load(), Down: d.st.down.Load(), Duplicated: d.st.dup.Load(), Delivered: d.st.delivered.Load(), Failed: d.st.failed.Load(),
		NewPeers: d.st.peers.Load()}
}

// Close stops forwarding; packets in flight are dropped.
func (l *Link) Close() error {
	select {
	case <-l.done:
		return nil
	default:
	}
	close(l.done)
	l.closeSockets()
	l.wg.Wait()
	for _, d := range l.dir {
		d.mu.Lock()
		d.held = nil
		d.mu.Unlock()
	}
	return nil
}

func (l *Link) closeSockets() {
	for _, s := range l.sock {
		if s != nil {
			s.Close()
		}
	}
}

func (l *Link) read(side int) {
	defer l.wg.Done()
	d := l.dir[side]
	var seq uint64
	buf := make([]byte, 65536)
	for {
		n, from, err := l.sock[side].ReadFromUDPAddrPort(buf)
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			l.log.Warn("linkem: read", "err", err)
			continue
		}
		l.learn(side, from)
		seq++
		d.arrive(append([]byte(nil), buf[:n]...), seq, time.Now()) // held until due: a copy of its own
	}
}

// learn makes from side's peer unless one is configured: the latest
// sender is the endpoint that is there now (a restarted one has a new
// port, and the old one is gone).
func (l *Link) learn(side int, from netip.AddrPort) {
	old := l.peer[side].Load()
	if old != nil && (*old == from || l.fixed[side]) {
		return
	}
	l.peer[side].Store(&from)
	l.dir[side].st.peers.Add(1)
	if old != nil {
		l.log.Info("linkem: new peer", "side", string(rune('A'+side)), "peer", from, "was", *old)
	}
	l.dir[1-side].flushWaiting()
}

// arrive runs one packet through the line and the impairments.
func (d *direction) arrive(b []byte, seq uint64, now time.Time) {
	d.st.packets.Add(1)
	d.st.bytes.Add(uint64(len(b)))
	if d.l.down.Load() {
		d.st.down.Add(1)
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	out := now
	if rate := math.Float64frombits(d.l.rate.Load()); rate > 0 {
		if d.queue+len(b) > d.l.cfg.Queue {
			d.st.overflow.Add(1)
			return
		}
		start := now
		if d.free.After(now) {
			start = d.free
		}
		d.free = start.Add(time.Duration(float64(len(b)) / rate * float64(time.Second)))
		d.queue += len(b)
		out = d.free
		// The queue frees when the packet leaves the line, before the
		// propagation delay and whether or not it is lost after it: a
		// marker without payload accounts for that.
		heap.Push(&d.held, pkt{at: out, seq: seq, line: len(b)})
	}
	copies, delay := d.im.Fate()
	switch copies {
	case 0:
		d.st.lost.Add(1)
	case 2:
		d.st.dup.Add(1)
	}
	for i := 0; i < copies; i++ {
		heap.Push(&d.held, pkt{at: out.Add(delay[i]), seq: seq, b: b})
	}
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// run is the direction's one sender, so that what leaves leaves in order:
// it sleeps until the earliest held packet is due and sends what is.
func (d *direction) run() {
	defer d.l.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var due [][]byte
	for {
		d.mu.Lock()
		now := time.Now()
		due = due[:0]
		for len(d.held) > 0 && !d.held[0].at.After(now) {
			p := heap.Pop(&d.held).(pkt)
			if p.b == nil {
				d.queue -= p.line // only a rate-limited arrival has a marker
				continue
			}
			due = append(due, p.b)
		}
		wait := time.Hour
		if len(d.held) > 0 {
			wait = d.held[0].at.Sub(now)
		}
		d.mu.Unlock()
		d.send(due)
		if len(due) > 0 {
			continue // sending took time: look again before sleeping
		}
		timer.Reset(wait)
		select {
		case <-timer.C:
		case <-d.kick:
			timer.Stop() // Go 1.23 timers: no stale tick to drain
		case <-d.l.done:
			return
		}
	}
}

func (d *direction) send(pkts [][]byte) {
	if len(pkts) == 0 {
		return
	}
	to := 1 - d.from
	peer := d.l.peer[to].Load()
	if peer == nil {
		d.mu.Lock()
		if room := 4096 - len(d.wait); room > 0 {
			d.wait = append(d.wait, pkts[:min(room, len(pkts))]...)
		}
		d.mu.Unlock()
		// The peer may have been learned meanwhile.
		if d.l.peer[to].Load() != nil {
			d.flushWaiting()
		}
		return
	}
	for _, b := range pkts {
		if _, err := d.l.sock[to].WriteToUDPAddrPort(b, *peer); err != nil {
			d.st.failed.Add(1)
			continue
		}
		d.st.delivered.Add(1)
	}
}

func (d *direction) flushWaiting() {
	d.mu.Lock()
	w := d.wait
	d.wait = nil
	d.mu.Unlock()
	d.send(w)
}
