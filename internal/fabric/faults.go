package fabric

import (
	"container/heap"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rvma/rvma/internal/wire"
)

// Faults describes seeded, per-packet fault injection on a port's send side.
// Probabilities are in [0, 1]; the zero value injects nothing.
type Faults struct {
	Drop      float64       // probability a packet is lost
	Duplicate float64       // probability a packet is delivered twice
	Reorder   float64       // probability a packet is held back behind later ones
	Delay     time.Duration // fixed extra delay for every packet
	Jitter    time.Duration // uniform random extra delay in [0, Jitter)
	// BurstEnter and BurstExit make losses bursty (Gilbert-Elliott): each
	// packet, the link moves from the good to the bad state with
	// probability BurstEnter and back with BurstExit; in the bad state
	// every packet is lost. Drop still applies in the good state. Zero
	// BurstEnter disables bursts.
	BurstEnter, BurstExit float64
	Seed                  uint64 // seed of the random source; 0 picks 1
}

// Active reports whether f injects anything.
func (f Faults) Active() bool {
	return f.Drop > 0 || f.Duplicate > 0 || f.Reorder > 0 || f.Delay > 0 || f.Jitter > 0 || f.BurstEnter > 0
}

// Impairer draws the fate of each packet under Faults from its seeded
// source: the same seed gives the same fates. The FaultPort and the link
// emulator (cmd/linkem) share it. It is not safe for concurrent use.
type Impairer struct {
	f   Faults
	rng *rand.Rand
	bad bool // Gilbert-Elliott state
}

// NewImpairer returns an Impairer for f.
func NewImpairer(f Faults) *Impairer {
	seed := f.Seed
	if seed == 0 {
		seed = 1
	}
	return &Impairer{f: f, rng: rand.New(rand.NewPCG(seed, seed^0x9E3779B97F4A7C15))}
}

// Faults returns the settings.
func (im *Impairer) Faults() Faults { return im.f }

// Fate decides one packet: how many copies arrive (0 when lost, 2 when
// duplicated) and the extra delay of each copy.
func (im *Impairer) Fate() (copies int, delay [2]time.Duration) {
	f := &im.f
	if f.BurstEnter > 0 {
		if im.bad {
			im.bad = im.rng.Float64() >= f.BurstExit
		} else {
			im.bad = im.rng.Float64() < f.BurstEnter
		}
		if im.bad {
			return 0, delay
		}
	}
	if f.Drop > 0 && im.rng.Float64() < f.Drop {
		return 0, delay
	}
	copies = 1
	if f.Duplicate > 0 && im.rng.Float64() < f.Duplicate {
		copies = 2
	}
	for i := 0; i < copies; i++ {
		d := f.Delay
		if f.Jitter > 0 {
			d += time.Duration(im.rng.Int64N(int64(f.Jitter)))
		}
		if f.Reorder > 0 && im.rng.Float64() < f.Reorder {
			// Held back long enough for packets sent just after it to
			// overtake it: at least 50µs, and past the jitter.
			d += 50*time.Microsecond + f.Jitter + time.Duration(im.rng.Int64N(int64(200*time.Microsecond)))
		}
		delay[i] = d
	}
	return copies, delay
}

// FaultPort wraps a Port with fault injection. Faults can be changed while
// traffic flows (SetFaults), so a test can kill a path and revive it.
type FaultPort struct {
	Port
	deliver func([]*wire.Packet) // the wrapped port's Send

	// The wrapped port's abilities, found once (nil: it has none).
	prog   Progresser
	stats  StatsReporter
	exp    Exporter
	acc    Accessor
	boxes  BoxSharer
	pull   Puller
	alloc  Allocator
	mapper Mapper
	impair Impairable

	faults atomic.Pointer[faultState]

	mu     sync.Mutex // guards held, timer, seq
	held   delayHeap
	seq    uint64
	timer  *time.Timer
	closed bool
	// A fixed delay must not reorder: packets due at the same time leave
	// in the order they were held, and one release delivers at a time.
	releaseMu sync.Mutex
}

type faultState struct {
	mu sync.Mutex
	im *Impairer
}

// NewFaultPort wraps p.
func NewFaultPort(p Port) *FaultPort {
	fp := &FaultPort{Port: p, deliver: p.Send}
	fp.prog, _ = p.(Progresser)
	fp.stats, _ = p.(StatsReporter)
	fp.exp, _ = p.(Exporter)
	fp.acc, _ = p.(Accessor)
	fp.boxes, _ = p.(BoxSharer)
	fp.pull, _ = p.(Puller)
	fp.alloc, _ = p.(Allocator)
	fp.mapper, _ = p.(Mapper)
	fp.impair, _ = p.(Impairable)
	fp.timer = time.AfterFunc(time.Hour, fp.release)
	fp.timer.Stop()
	return fp
}

// SetFaults replaces the fault settings; the random source restarts from
// the new seed.
func (fp *FaultPort) SetFaults(f Faults) {
	if fp.impair != nil {
		fp.impair.Impair(f.Active())
	}
	if !f.Active() {
		fp.faults.Store(nil)
		return
	}
	fp.faults.Store(&faultState{im: NewImpairer(f)})
}

// Send applies the faults, then passes what survives to the wrapped port.
func (fp *FaultPort) Send(pkts []*wire.Packet) {
	fs := fp.faults.Load()
	if fs == nil {
		fp.deliver(pkts)
		return
	}
	now := time.Now()
	// A fresh slice: duplicates can make the output longer than the input.
	out := make([]*wire.Packet, 0, len(pkts)+1)
	var later []heldPacket
	fs.mu.Lock()
	for _, p := range pkts {
		copies, delay := fs.im.Fate()
		if copies == 0 {
			p.Release()
			continue
		}
		for i := 0; i < copies; i++ {
			q := p
			if i == 1 {
				q = p.Clone()
			}
			if delay[i] > 0 {
				q.Own()
				later = append(later, heldPacket{at: now.Add(delay[i]), p: q})
				continue
			}
			out = append(out, q)
		}
	}
	fs.mu.Unlock()
	if len(later) > 0 {
		fp.hold(later)
	}
	if len(out) > 0 {
		fp.deliver(out)
	}
}

func (fp *FaultPort) hold(hs []heldPacket) {
	fp.mu.Lock()
	defer fp.mu.Unlock()
	if fp.closed {
		for _, h := range hs {
			h.p.Release()
		}
		return
	}
	for _, h := range hs {
		fp.seq++
		h.seq = fp.seq
		heap.Push(&fp.held, h)
	}
	fp.timer.Reset(time.Until(fp.held[0].at))
}

func (fp *FaultPort) release() {
	fp.releaseMu.Lock()
	defer fp.releaseMu.Unlock()
	fp.mu.Lock()
	now := time.Now()
	var due []*wire.Packet
	for len(fp.held) > 0 && !fp.held[0].at.After(now) {
		due = append(due, heap.Pop(&fp.held).(heldPacket).p)
	}
	if len(fp.held) > 0 {
		fp.timer.Reset(time.Until(fp.held[0].at))
	}
	fp.mu.Unlock()
	if len(due) > 0 {
		fp.deliver(due)
	}
}

// Close drops held packets and closes the wrapped port.
func (fp *FaultPort) Close() error {
	fp.mu.Lock()
	fp.closed = true
	fp.timer.Stop()
	for _, h := range fp.held {
		h.p.Release()
	}
	fp.held = nil
	fp.mu.Unlock()
	return fp.Port.Close()
}

// Progress forwards to the wrapped port if it can progress.
func (fp *FaultPort) Progress() int {
	if fp.prog == nil {
		return 0
	}
	return fp.prog.Progress()
}

// Addr forwards to the wrapped port (spelled out so FaultPort is a Port
// even where embedding would be ambiguous).
func (fp *FaultPort) Addr() netip.AddrPort { return fp.Port.Addr() }

type heldPacket struct {
	at  time.Time
	seq uint64 // hold order: packets due at the same time leave in it
	p   *wire.Packet
}

type delayHeap []heldPacket

func (h delayHeap) Len() int { return len(h) }
func (h delayHeap) Less(i, j int) bool {
	if h[i].at.Equal(h[j].at) {
		return h[i].seq < h[j].seq
	}
	return h[i].at.Before(h[j].at)
}
func (h delayHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *delayHeap) Push(x any)   { *h = append(*h, x.(heldPacket)) }
func (h *delayHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Accessor returns the wrapped port's direct access to peers' memory, or
// nil when it has none or faults are being injected (direct accesses
// would bypass them).
func (fp *FaultPort) Accessor() Accessor {
	if fp.faults.Load() != nil {
		return nil
	}
	return fp.acc
}

// Exporter, BoxSharer, Puller, Allocator and Mapper return the wrapped port's
// abilities, or nil when it has none; faults do not change them (a port
// under faults is reached through packets, see Impairable).
func (fp *FaultPort) Exporter() Exporter   { return fp.exp }
func (fp *FaultPort) BoxSharer() BoxSharer { return fp.boxes }
func (fp *FaultPort) Puller() Puller       { return fp.pull }
func (fp *FaultPort) Allocator() Allocator { return fp.alloc }
func (fp *FaultPort) Mapper() Mapper       { return fp.mapper }

// Stats returns the wrapped port's counters (zero if it keeps none).
func (fp *FaultPort) Stats() Stats {
	if fp.stats == nil {
		return Stats{}
	}
	return fp.stats.Stats()
}
