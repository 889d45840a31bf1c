//go:build linux

package shmfab

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/fabric"
	"github.com/rvma/rvma/internal/fabric/fabrictest"
	"github.com/rvma/rvma/internal/spin"
	"github.com/rvma/rvma/internal/wire"
)

func open(t *testing.T, name string) (*Port, *fabrictest.Recorder) {
	t.Helper()
	p, err := Open(name, 4096)
	require.NoError(t, err)
	r := &fabrictest.Recorder{}
	p.SetHandler(r)
	t.Cleanup(func() { p.Close() })
	return p, r
}

func packet(dst netip.AddrPort, psn uint32, payload []byte) *wire.Packet {
	p := wire.Get()
	p.Dst, p.Opcode, p.DestQP, p.PSN, p.Payload = dst, wire.SendOnly, 7, psn, payload
	return p
}

// Packets cross in order, both ways, with their payloads, from several
// sending ports into one; the handler never runs twice at once.
func TestExchange(t *testing.T) {
	name := t.Name()
	a, ra := open(t, name)
	b, rb := open(t, name)
	c, _ := open(t, name)
	const n = 5000 // several times around a ring
	var wg sync.WaitGroup
	for _, src := range []*Port{b, c} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				src.Send([]*wire.Packet{packet(a.Addr(), uint32(i), []byte(fmt.Sprintf("%s-%d", src.Addr(), i)))})
			}
		}()
	}
	a.Send([]*wire.Packet{packet(b.Addr(), 1, []byte("back"))})
	wg.Wait()
	require.Eventually(t, func() bool { return ra.Count() == 2*n && rb.Count() == 1 }, 10*time.Second, time.Millisecond,
		"a got %d of %d, b %d of 1 (dropped a %d, b %d, c %d)", ra.Count(), 2*n, rb.Count(), a.Stats().Undeliverable, b.Stats().Undeliverable, c.Stats().Undeliverable)
	require.False(t, ra.Overlapped())
	// Per sender, order is kept.
	next := map[string]int{}
	for _, pl := range ra.Payloads() {
		var src string
		var i int
		k := len(pl) - 1
		for pl[k] != '-' {
			k--
		}
		src = pl[:k]
		fmt.Sscan(pl[k+1:], &i)
		require.Equal(t, next[src], i, "from %s", src)
		next[src]++
	}
	require.Equal(t, uint64(2*n), a.Stats().Received)
}

// Ports of another fabric name, addresses that are not shm ports, and
// closed ports are unreachable: the packets are dropped and counted.
func TestUnreachable(t *testing.T) {
	a, _ := open(t, "one")
	b, rb := open(t, "two")
	a.Send([]*wire.Packet{packet(b.Addr(), 1, []byte("x"))})
	a.Send([]*wire.Packet{packet(netip.MustParseAddrPort("127.0.0.1:5"), 1, nil)})
	c, err := Open("one", 4096)
	require.NoError(t, err)
	dead := c.Addr()
	require.NoError(t, c.Close())
	a.Send([]*wire.Packet{packet(dead, 1, nil)})
	time.Sleep(20 * time.Millisecond)
	require.Zero(t, rb.Count())
	require.Equal(t, uint64(3), a.Stats().Undeliverable)
}

// A ring holding garbage is discarded and counted; the port goes on.
func TestCorruptRing(t *testing.T) {
	a, ra := open(t, t.Name())
	b, _ := open(t, t.Name())
	b.Send([]*wire.Packet{packet(a.Addr(), 1, []byte("ok"))})
	require.Eventually(t, func() bool { return ra.Count() == 1 }, 5*time.Second, time.Millisecond)
	// Write nonsense into b's ring in a's segment, as a hostile or broken
	// sender could: a length that runs past the head, then a bad packet.
	b.pmu.Lock()
	pe := b.peers[a.Addr()]
	data := pe.mem[ring(pe.ring):]
	pos := pe.head % RingBytes
	binary.LittleEndian.PutUint32(data[pos:], 1<<20)
	pe.head += 64
	storeHead(pe)
	b.pmu.Unlock()
	require.Eventually(t, func() bool { return a.Stats().Dropped == 1 }, 5*time.Second, time.Millisecond)
	b.pmu.Lock()
	pos = pe.head % RingBytes
	binary.LittleEndian.PutUint32(data[pos:], 16)
	copy(data[pos+4:], "not a packet....")
	pe.head += 24
	storeHead(pe)
	b.pmu.Unlock()
	require.Eventually(t, func() bool { return a.Stats().Dropped == 2 }, 5*time.Second, time.Millisecond)
	b.Send([]*wire.Packet{packet(a.Addr(), 2, []byte("still ok"))})
	require.Eventually(t, func() bool { return ra.Count() == 2 }, 5*time.Second, time.Millisecond)
}

// A receiver asleep on its futex is woken by the next packet, not by its
// sleep's bound (made a minute here).
func TestWakeFromSleep(t *testing.T) {
	old := sleepMax
	sleepMax = time.Minute
	t.Cleanup(func() { sleepMax = old })
	a, ra := open(t, t.Name())
	b, _ := open(t, t.Name())
	asleep(t, a)
	b.Send([]*wire.Packet{packet(a.Addr(), 1, nil)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, ra.WaitCount(ctx, 1))
}

// asleep waits until p's receiver has stopped spinning and sleeps on its
// doorbell (or is about to: a sender that sees the flag rings either way).
func asleep(t *testing.T, p *Port) {
	t.Helper()
	require.Eventually(t, func() bool { return atomic.LoadUint32(u32(p.mem, offSleeping)) == 1 },
		10*time.Second, 10*time.Microsecond, "%v's receiver never slept", p.Addr())
}

func storeHead(pe *peer) {
	atomic.StoreUint64(u64(pe.mem, slot(pe.ring)+offHead), pe.head)
}

func TestBadMTU(t *testing.T) {
	_, err := Open("x", 100)
	require.Error(t, err)
	_, err = Open("x", MaxMTU+1)
	require.Error(t, err)
}

// A receiver that stops draining (its handler is stuck) fills the ring;
// a sender then drops what does not fit after a short wait, counting it,
// rather than waiting on that receiver (which may be waiting on it in
// turn), and delivers again once the receiver drains.
func TestFullRingDrops(t *testing.T) {
	name := t.Name()
	a, _ := open(t, name)
	b, rb := open(t, name)
	release := make(chan struct{})
	var once sync.Once
	rb.Delay = func() { <-release }
	defer once.Do(func() { close(release) })
	payload := make([]byte, 4000)
	const n = 400 // 1.6 MB: more than a ring holds
	for i := range n {
		a.Send([]*wire.Packet{packet(b.Addr(), uint32(i), payload)})
	}
	dropped := a.Stats().Undeliverable
	require.Positive(t, dropped, "a full ring dropped nothing")
	require.Less(t, dropped, uint64(n))
	once.Do(func() { close(release) }) // the handler runs freely from now on
	require.Eventually(t, func() bool { return uint64(rb.Count())+dropped == n }, 10*time.Second, time.Millisecond,
		"delivered %d, dropped %d of %d", rb.Count(), dropped, n)
	a.Send([]*wire.Packet{packet(b.Addr(), n, []byte("after"))})
	require.Eventually(t, func() bool { return uint64(rb.Count())+dropped == n+1 }, 10*time.Second, time.Millisecond)
}

func TestPortContract(t *testing.T) {
	fabrictest.TestPort(t, func(t *testing.T) fabric.Port {
		p, err := Open(t.Name(), 4096)
		require.NoError(t, err)
		return p
	})
}

// With one Go processor, a receiver that finds the application waiting
// (spinning through spin.Pause, even without polling the port) does not
// sleep on its doorbell: the system call would hold the processor that
// the waiter needs once its data has come, until the runtime took it
// back, up to milliseconds later (halo3d's notify variant stalled so).
func TestOneProcessorReceiverYieldsToSpinner(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	a, _ := open(t, t.Name())
	asleep(t, a) // idle and nobody waits: it sleeps
	b, _ := open(t, t.Name())
	b.Send([]*wire.Packet{packet(a.Addr(), 1, nil)}) // wakes it
	woke := false
	deadline := time.Now().Add(300 * time.Millisecond)
	for i := 0; time.Now().Before(deadline); i++ {
		spin.Pause(i)
		sleeping := atomic.LoadUint32(u32(a.mem, offSleeping)) == 1
		require.False(t, woke && sleeping, "the receiver slept again while the application spun")
		woke = woke || !sleeping
	}
	require.True(t, woke, "the packet did not wake the receiver")
	asleep(t, a) // the application still: it sleeps again
}
