//go:build linux

package shmfab

import (
	"encoding/binary"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"

	"github.com/rvma/rvma/internal/wire"
)

var netipZero = netip.AddrPort{}

// FuzzRing feeds arbitrary ring contents, as a broken or hostile sender
// could write them, to the receiver: it must never panic, and the ring
// must end drained.
func FuzzRing(f *testing.F) {
	ok := wire.Append(nil, packet(netipZero, 1, []byte("hello")))
	seed := binary.LittleEndian.AppendUint32(nil, uint32(len(ok)))
	seed = append(seed, ok...)
	f.Add(seed, uint64(len(seed)+7)&^7, uint64(0))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff}, uint64(8), uint64(0))
	f.Add([]byte{1, 0, 0, 0, 0}, uint64(1<<30), uint64(3))
	p, err := Open("fuzz", 4096)
	if err != nil {
		f.Fatal(err)
	}
	defer p.Close()
	f.Fuzz(func(t *testing.T, data []byte, head, tail uint64) {
		s := slot(0)
		if len(data) > RingBytes {
			data = data[:RingBytes]
		}
		copy(p.mem[ring(0):], data)
		atomic.StoreUint64(u64(p.mem, s+offTail), tail)
		atomic.StoreUint64(u64(p.mem, s+offHead), head)
		atomic.StoreUint64(u64(p.mem, s+offOwner), uint64(os.Getpid())<<32|1)
		atomic.StoreUint64(u64(p.mem, offActive), 1)
		for range 64 {
			if p.Progress() == 0 {
				break
			}
		}
		p.rmu.Lock()
		h, tl := atomic.LoadUint64(u64(p.mem, s+offHead)), atomic.LoadUint64(u64(p.mem, s+offTail))
		atomic.StoreUint64(u64(p.mem, s+offOwner), 0)
		atomic.StoreUint64(u64(p.mem, offActive), 0)
		p.rmu.Unlock()
		if h != tl {
			t.Fatalf("ring not drained: head %d tail %d", h, tl)
		}
	})
}
