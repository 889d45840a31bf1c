//go:build linux

package shmfab

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rvma/rvma/internal/fabric"
	"github.com/rvma/rvma/internal/futex"
	"github.com/rvma/rvma/internal/shmbox"
)

// Direct access to peers' memory. A port's segment holds a table of the
// regions its device exported (Regions entries of regionBytes). An entry
// names the region's remote key, rights, address and length, and where
// its bytes are: in an allocation made by Alloc (a memfd that peers map,
// so an access is a plain copy or a CPU atomic), or in the owner's
// ordinary memory (reached with process_vm_writev/readv).
//
// Withdrawal is made safe by the busy word of each sender's ring slot: an
// initiator stores the entry index there before it checks the entry and
// clears it after the access; Unexport clears the entry, then waits until
// no live sender's busy word names it. Both sides use sequentially
// consistent atomics, so either the initiator sees the entry gone or the
// owner sees the initiator busy.

// Entry offsets.
const (
	entKey   = 0  // valid<<63 | rights<<32 | rkey; 0 when free
	entIOVA  = 8  // the region's first address, as keys name it
	entLen   = 16 // its length
	entVAddr = 24 // the owner's virtual address of the first byte
	entAlloc = 32 // id of the allocation holding the bytes, 0 for plain memory
	entFD    = 40 // the allocation's descriptor in the owner
	entOff   = 48 // the first byte's offset in the allocation's data
	entPD    = 56 // the protection domain: only its QPs reach the region
	entValid = uint64(1) << 63

	allocHdr   = 4096 // an allocation's header page: magic, id
	allocMagic = 0x52564d41414c4f43
)

// ErrIndirect reports that an access cannot be made directly (the region
// is not exported or not reachable, the peer is gone, or ordering forbids
// it now); the caller sends it as packets instead.
var ErrIndirect = errors.New("shmfab: no direct access")

// What a port offers beyond packets (package fabric names each).
var (
	_ fabric.Exporter      = (*Port)(nil)
	_ fabric.Accessor      = (*Port)(nil)
	_ fabric.BoxSharer     = (*Port)(nil)
	_ fabric.Puller        = (*Port)(nil)
	_ fabric.Allocator     = (*Port)(nil)
	_ fabric.Mapper        = (*Port)(nil)
	_ fabric.Impairable    = (*Port)(nil)
	_ fabric.Progresser    = (*Port)(nil)
	_ fabric.StatsReporter = (*Port)(nil)
)

// Alloc, Free and Locate make the package's allocator a port's
// (fabric.Allocator): allocations belong to the process, whichever port
// asks.
func (p *Port) Alloc(n int) ([]byte, error)                         { return Alloc(n) }
func (p *Port) Free(b []byte) error                                 { return Free(b) }
func (p *Port) Locate(buf []byte) (id uint64, fd, off int, ok bool) { return Locate(buf) }

// allocation is memory made by Alloc: a memfd peers can map.
type allocation struct {
	id   uint64
	fd   int
	mem  []byte // the whole mapping, header page included
	data []byte
}

var allocs struct {
	sync.Mutex
	s []*allocation // by the data's first address, ascending
}

// Alloc returns n bytes of shared memory (zeroed, page-aligned): regions
// registered over it are reached by peers with a plain copy, the fastest
// path. Free releases it.
func Alloc(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("shmfab: alloc %d bytes", n)
	}
	fd, err := unix.MemfdCreate("rvma-mem", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("shmfab: memfd: %w", err)
	}
	size := allocHdr + (n+4095)&^4095
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shmfab: size allocation: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("shmfab: map allocation: %w", err)
	}
	// A random id: a peer's cached mapping can never be confused with a
	// later allocation that reuses the descriptor (or a later process the
	// pid).
	a := &allocation{id: rand.Uint64() | 1, fd: fd, mem: mem, data: mem[allocHdr : allocHdr+n : allocHdr+n]}
	binary.LittleEndian.PutUint64(mem[8:], a.id)
	atomic.StoreUint64(u64(mem, 0), allocMagic)
	allocs.Lock()
	i := allocIndex(a.start())
	allocs.s = slices.Insert(allocs.s, i, a)
	allocs.Unlock()
	return a.data, nil
}

// Free releases memory from Alloc. Regions over it must have been
// unexported (deregistered) first.
func Free(b []byte) error {
	if len(b) == 0 {
		return errors.New("shmfab: free: empty slice")
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	allocs.Lock()
	i := allocIndex(p)
	var a *allocation
	if i < len(allocs.s) && allocs.s[i].start() == p {
		a = allocs.s[i]
		allocs.s = slices.Delete(allocs.s, i, i+1)
	}
	allocs.Unlock()
	if a == nil {
		return errors.New("shmfab: free: not from Alloc")
	}
	unix.Munmap(a.mem)
	return unix.Close(a.fd)
}

// allocOf returns the allocation that holds buf, and buf's offset in it.
func allocOf(buf []byte) (*allocation, int) {
	if len(buf) == 0 {
		return nil, 0
	}
	p := uintptr(unsafe.Pointer(&buf[0]))
	allocs.Lock()
	defer allocs.Unlock()
	// The last allocation starting at or before p is the only candidate.
	i := allocIndex(p + 1)
	if i == 0 {
		return nil, 0
	}
	a := allocs.s[i-1]
	if start := a.start(); p+uintptr(len(buf)) <= start+uintptr(len(a.data)) {
		return a, int(p - start)
	}
	return nil, 0
}

func (a *allocation) start() uintptr { return uintptr(unsafe.Pointer(&a.data[0])) }

// allocIndex is the index of the first allocation starting at or after p;
// allocs is locked.
func allocIndex(p uintptr) int {
	i, _ := slices.BinarySearchFunc(allocs.s, p, func(a *allocation, p uintptr) int { return cmp.Compare(a.start(), p) })
	return i
}

// Locate says where buf lies if it is memory from Alloc: the allocation's
// id and descriptor, and buf's offset in its data.
func Locate(buf []byte) (id uint64, fd, off int, ok bool) {
	a, off := allocOf(buf)
	if a == nil {
		return 0, 0, 0, false
	}
	return a.id, a.fd, off, true
}

// cross-memory attach (process_vm_readv/writev), detected once.
var cma struct {
	once sync.Once
	ok   atomic.Bool // ForceCMA may change it while devices run
	why  string
}

// ForceCMA overrides the detection for tests: with ok false, caller
// memory is reached through the rings. It returns the previous setting.
func ForceCMA(ok bool) bool {
	prev, _ := CMA()
	cma.ok.Store(ok)
	return prev
}

// CMA reports whether processes can reach each other's ordinary memory
// with process_vm_readv/writev, and if not, why; it is decided once, at
// the first shm port. Where Yama restricts ptrace to descendants, the
// process allows any process of its user (as MPI libraries do), since
// ranks are not each other's children. A port opened with NoCMA does not
// use it: registered caller memory is then reached through the rings.
func CMA() (bool, string) {
	cma.once.Do(func() {
		if b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil {
			switch scope, _ := strconv.Atoi(strings.TrimSpace(string(b))); {
			case scope == 1:
				if err := unix.Prctl(unix.PR_SET_PTRACER, unix.PR_SET_PTRACER_ANY, 0, 0, 0); err != nil {
					cma.why = "yama ptrace_scope 1 and PR_SET_PTRACER failed: " + err.Error()
					return
				}
			case scope >= 2 && os.Geteuid() != 0:
				cma.why = fmt.Sprintf("yama ptrace_scope %d forbids it", scope)
				return
			}
		}
		x, y := uint64(0x5a5a), uint64(0)
		v := unix.Iovec{Base: (*byte)(unsafe.Pointer(&y))}
		v.SetLen(8)
		_, err := unix.ProcessVMReadv(os.Getpid(), []unix.Iovec{v},
			[]unix.RemoteIovec{{Base: uintptr(unsafe.Pointer(&x)), Len: 8}}, 0)
		runtime.KeepAlive(&x)
		if err != nil || y != x {
			cma.why = fmt.Sprintf("process_vm_readv: %v", err)
			return
		}
		cma.ok.Store(true)
		cma.why = "process_vm_readv/writev"
	})
	return cma.ok.Load(), cma.why
}

func entry(i int) int { return tableOff + i*regionBytes }

// table hands out the entries of one of a segment's tables (regions, QPs,
// mailbox windows) by key; the port's emu is held.
type table[K comparable] struct {
	idx  map[K]int
	used []bool
}

func newTable[K comparable](n int) table[K] { return table[K]{idx: map[K]int{}, used: make([]bool, n)} }

// take gives k the first free entry.
func (t *table[K]) take(k K) (int, error) {
	if _, ok := t.idx[k]; ok {
		return 0, errors.New("listed twice")
	}
	for i, u := range t.used {
		if !u {
			t.used[i], t.idx[k] = true, i
			return i, nil
		}
	}
	return 0, fmt.Errorf("%w: table full", ErrIndirect)
}

// drop frees k's entry and returns it.
func (t *table[K]) drop(k K) (int, bool) {
	i, ok := t.idx[k]
	if ok {
		t.used[i] = false
		delete(t.idx, k)
	}
	return i, ok
}

// Export publishes buf as remote key rkey at iova in the port's table, so
// peers reach it directly. It fails when the table is full, or when buf
// is ordinary memory and cross-memory attach is unavailable.
func (p *Port) Export(rkey uint32, iova uint64, buf []byte, rights fabric.Rights, pd uint64) error {
	if len(buf) == 0 {
		return ErrIndirect
	}
	a, off := allocOf(buf)
	if a == nil && !p.CanPull() {
		return ErrIndirect
	}
	p.emu.Lock()
	defer p.emu.Unlock()
	if p.closed.Load() {
		return ErrClosed
	}
	i, err := p.regions.take(rkey)
	if err != nil {
		return fmt.Errorf("shmfab: export key %#x: %w", rkey, err)
	}
	e := p.mem[entry(i):]
	binary.LittleEndian.PutUint64(e[entIOVA:], iova)
	binary.LittleEndian.PutUint64(e[entLen:], uint64(len(buf)))
	binary.LittleEndian.PutUint64(e[entVAddr:], uint64(uintptr(unsafe.Pointer(&buf[0]))))
	var id, fd uint64
	if a != nil {
		id, fd = a.id, uint64(a.fd)
	}
	binary.LittleEndian.PutUint64(e[entAlloc:], id)
	binary.LittleEndian.PutUint64(e[entFD:], fd)
	binary.LittleEndian.PutUint64(e[entOff:], uint64(off))
	binary.LittleEndian.PutUint64(e[entPD:], pd)
	atomic.StoreUint64(u64(p.mem, entry(i)+entKey), entValid|uint64(rights)<<32|uint64(rkey)) // last: published
	return nil
}

// Unexport withdraws rkey and waits until no peer accesses it.
func (p *Port) Unexport(rkey uint32) {
	p.emu.Lock()
	defer p.emu.Unlock()
	if i, ok := p.regions.idx[rkey]; ok {
		p.withdraw(i)
		p.regions.drop(rkey)
	}
}

func (p *Port) unexportAll() {
	p.emu.Lock()
	defer p.emu.Unlock()
	for k, i := range p.regions.idx {
		p.withdraw(i)
		p.regions.drop(k)
	}
}

// withdraw clears entry i, then waits out the senders accessing it (a
// dead one no longer does); p.emu is held.
func (p *Port) withdraw(i int) {
	atomic.StoreUint64(u64(p.mem, entry(i)+entKey), 0)
	for r := range Rings {
		s := slot(r)
		for n := 0; atomic.LoadUint64(u64(p.mem, s+offBusy)) == uint64(i)+1; n++ {
			owner := atomic.LoadUint64(u64(p.mem, s+offOwner))
			if owner == 0 || n%1024 == 1023 && !futex.Alive(int((owner&^flags)>>32)) {
				break
			}
			runtime.Gosched()
		}
	}
}

func qpEntry(i int) int { return qpsOff + i*qpBytes }

// Attach lists queue pair qpn (whose packets carry secret) in the port's
// table: peers' direct accesses on its behalf are allowed.
func (p *Port) Attach(qpn uint32, secret uint64, pd uint64) error {
	p.emu.Lock()
	defer p.emu.Unlock()
	i, ok := p.qps.idx[qpn]
	if ok {
		atomic.StoreUint64(u64(p.mem, qpEntry(i)), 0) // re-listed: hidden while it changes
	} else {
		var err error
		if i, err = p.qps.take(qpn); err != nil {
			return fmt.Errorf("shmfab: attach QP %d: %w", qpn, err)
		}
	}
	atomic.StoreUint64(u64(p.mem, qpEntry(i)+8), secret)
	atomic.StoreUint64(u64(p.mem, qpEntry(i)+16), pd)
	atomic.StoreUint64(u64(p.mem, qpEntry(i)), entValid|uint64(qpn))
	return nil
}

// Detach removes qpn from the table.
func (p *Port) Detach(qpn uint32) {
	p.emu.Lock()
	defer p.emu.Unlock()
	if i, ok := p.qps.drop(qpn); ok {
		atomic.StoreUint64(u64(p.mem, qpEntry(i)), 0)
	}
}

// Impair sets whether peers must use packets only.
func (p *Port) Impair(on bool) {
	v := uint32(0)
	if on {
		v = 1
	}
	atomic.StoreUint32(u32(p.mem, offImpaired), v)
}

// listed returns the protection domain of QP q if pe lists it; p.dmu is
// held.
func (p *Port) listed(pe *peer, q fabric.QP) (uint64, bool) {
	if pe.qps == nil {
		pe.qps = map[uint32]int{}
	}
	check := func(i int) (uint64, bool) {
		o := qpEntry(i)
		if atomic.LoadUint64(u64(pe.mem, o)) != entValid|uint64(q.Num) || atomic.LoadUint64(u64(pe.mem, o+8)) != q.Secret {
			return 0, false
		}
		pd := atomic.LoadUint64(u64(pe.mem, o+16))
		// Read again: the entry may have been reused meanwhile.
		return pd, atomic.LoadUint64(u64(pe.mem, o)) == entValid|uint64(q.Num)
	}
	if i, ok := pe.qps[q.Num]; ok {
		if pd, ok := check(i); ok {
			return pd, true
		}
	}
	for i := range QPs {
		if pd, ok := check(i); ok {
			pe.qps[q.Num] = i
			return pd, true
		}
	}
	delete(pe.qps, q.Num)
	return 0, false
}

// reach finds the peer at dst for a direct access on behalf of its QP q:
// mapped, alive, not impaired, listing q (whose protection domain it
// returns), with our ring slot in its segment (whose busy word accesses
// use); with ordered, only once the peer has handled every packet we
// sent it. p.dmu is held.
func (p *Port) reach(dst netip.AddrPort, q fabric.QP, ordered bool) (pe *peer, s int, pd uint64, err error) {
	p.pmu.Lock()
	if p.peers == nil { // closed
		p.pmu.Unlock()
		return nil, 0, 0, ErrIndirect
	}
	if pe = p.lastPeer; pe == nil || p.lastDst != dst {
		pe = p.peerFor(dst)
		p.lastDst, p.lastPeer = dst, pe
	}
	ok := pe != nil && !pe.dead && (pe.ring >= 0 || p.claim(pe))
	if ok {
		s = slot(pe.ring)
		ok = !ordered || atomic.LoadUint64(u64(pe.mem, s+offHead)) == atomic.LoadUint64(u64(pe.mem, s+offTail))
		// A peer that died leaves its memory mapped here: look for its
		// process as often as the receiver looks for dead senders, so
		// that its QPs fail by timeout as over packets instead of taking
		// writes nobody reads.
		if r := p.reaps.Load(); ok && pe.checked != r {
			pe.checked = r
			if !futex.Alive(pe.pid) {
				pe.dead, ok = true, false
			}
		}
	}
	p.pmu.Unlock()
	if !ok || atomic.LoadUint32(u32(pe.mem, offImpaired)) != 0 {
		return nil, 0, 0, ErrIndirect
	}
	if pd, ok = p.listed(pe, q); !ok {
		return nil, 0, 0, ErrIndirect
	}
	if pe.rkeys == nil {
		pe.rkeys, pe.maps, pe.boxes = map[uint32]int{}, map[uint64][]byte{}, map[uint64]*shmbox.Box{}
	}
	return pe, s, pd, nil
}

// target is an exported region of a peer, checked and held for one access.
type target struct {
	pe     *peer
	busy   *uint64
	rights fabric.Rights
	off    uint64 // the access's offset in the region
	vaddr  uint64 // the owner's address of the access's first byte
	mapped []byte // the access's bytes, if the region is in a mapped allocation
}

// hold finds rkey's entry in dst's table, marks this port busy on it and
// checks the access [va, va+n) against it; p.dmu is held. The caller
// calls done.
func (p *Port) hold(dst netip.AddrPort, q fabric.QP, rkey uint32, va, n uint64, need fabric.Rights, ordered bool) (target, error) {
	pe, s, pd, err := p.reach(dst, q, ordered)
	if err != nil {
		return target{}, err
	}
	i, ok := pe.rkeys[rkey]
	if ok && i < 0 {
		return target{}, ErrIndirect // not exported: packets
	}
	if !ok {
		// Not seen yet (or moved): look the key up in the table.
		i = -1
		for j := range Regions {
			k := atomic.LoadUint64(u64(pe.mem, entry(j)+entKey))
			if k&entValid != 0 && uint32(k) == rkey {
				i = j
				break
			}
		}
		// Regions are exported when registered, before their keys are
		// known, so a key not found now never will be (-1 remembers it).
		pe.rkeys[rkey] = i
		if i < 0 {
			return target{}, ErrIndirect
		}
	}
	t := target{pe: pe, busy: u64(pe.mem, s+offBusy)}
	var k uint64
	atomic.StoreUint64(t.busy, uint64(i)+1)
	k = atomic.LoadUint64(u64(pe.mem, entry(i)+entKey))
	if k&entValid == 0 || uint32(k) != rkey {
		t.done()
		delete(pe.rkeys, rkey)
		return target{}, ErrIndirect
	}
	e := pe.mem[entry(i):]
	t.rights = fabric.Rights(k>>32) & (fabric.RemoteRead | fabric.RemoteWrite | fabric.RemoteAtomic)
	iova, length := binary.LittleEndian.Uint64(e[entIOVA:]), binary.LittleEndian.Uint64(e[entLen:])
	if t.rights&need != need || va < iova || n > length || va-iova > length-n || binary.LittleEndian.Uint64(e[entPD:]) != pd {
		t.done() // the packet path reports the error
		return target{}, ErrIndirect
	}
	t.off = va - iova
	t.vaddr = binary.LittleEndian.Uint64(e[entVAddr:]) + t.off
	if id := binary.LittleEndian.Uint64(e[entAlloc:]); id != 0 {
		m, err := p.mapAlloc(pe, id, int(binary.LittleEndian.Uint64(e[entFD:])))
		if err != nil {
			t.done()
			return target{}, ErrIndirect
		}
		o := binary.LittleEndian.Uint64(e[entOff:]) + t.off
		if o > uint64(len(m)) || n > uint64(len(m))-o {
			t.done()
			return target{}, ErrIndirect
		}
		t.mapped = m[o : o+n : o+n]
	} else if pe.noCMA {
		t.done()
		return target{}, ErrIndirect
	}
	return t, nil
}

func (t target) done() { atomic.StoreUint64(t.busy, 0) }

// Map hands out the peer's region bytes [va, va+n) mapped here
// (fabric.Mapper): allocation memory only, checked as a direct access is.
func (p *Port) Map(dst netip.AddrPort, q fabric.QP, rkey uint32, va uint64, n int, need fabric.Rights) ([]byte, *atomic.Bool, error) {
	if n <= 0 {
		return nil, nil, ErrIndirect
	}
	p.dmu.Lock()
	defer p.dmu.Unlock()
	t, err := p.hold(dst, q, rkey, va, uint64(n), need, false)
	if err != nil {
		return nil, nil, err
	}
	defer t.done()
	if t.mapped == nil {
		return nil, nil, ErrIndirect // caller memory: reached by system calls only
	}
	t.pe.watched.Store(true)
	return t.mapped, &t.pe.gone, nil
}

// mapAlloc maps a peer's allocation (once; cached by id); p.dmu is held.
func (p *Port) mapAlloc(pe *peer, id uint64, fd int) ([]byte, error) {
	if m, ok := pe.maps[id]; ok {
		return m, nil
	}
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/%d", pe.pid, fd), os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil || st.Size() <= allocHdr {
		return nil, ErrIndirect
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(st.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	if atomic.LoadUint64(u64(mem, 0)) != allocMagic || binary.LittleEndian.Uint64(mem[8:]) != id {
		unix.Munmap(mem) // the descriptor now names something else
		return nil, ErrIndirect
	}
	pe.maps[id] = mem[allocHdr:]
	return pe.maps[id], nil
}

// Write copies src to the peer's region rkey at va.
func (p *Port) Write(dst netip.AddrPort, q fabric.QP, rkey uint32, va uint64, src [][]byte, ordered bool) error {
	return p.move(dst, q, rkey, va, src, true, ordered)
}

// Read copies the peer's region rkey at va into into.
func (p *Port) Read(dst netip.AddrPort, q fabric.QP, rkey uint32, va uint64, into [][]byte) error {
	return p.move(dst, q, rkey, va, into, false, false)
}

// move copies between the local list and the peer's region rkey at va:
// into the peer's memory if write, out of it otherwise.
func (p *Port) move(dst netip.AddrPort, q fabric.QP, rkey uint32, va uint64, local [][]byte, write, ordered bool) error {
	n := total(local)
	need := fabric.RemoteRead
	if write {
		need = fabric.RemoteWrite
	}
	p.dmu.Lock()
	defer p.dmu.Unlock()
	t, err := p.hold(dst, q, rkey, va, uint64(n), need, ordered)
	if err != nil {
		return err
	}
	defer t.done()
	if t.mapped == nil {
		return p.cma(t, local, n, write)
	}
	k := 0
	for _, s := range local {
		if write {
			k += copy(t.mapped[k:], s)
		} else {
			k += copy(s, t.mapped[k:])
		}
	}
	p.direct.Add(1)
	return nil
}

func total(segs [][]byte) int {
	n := 0
	for _, s := range segs {
		n += len(s)
	}
	return n
}

// cma moves n bytes between the local list and the peer's memory at
// t.vaddr with one system call (more if the kernel stops short); p.dmu
// is held.
func (p *Port) cma(t target, local [][]byte, n int, write bool) error {
	p.iov = p.iov[:0]
	for _, s := range local {
		if len(s) > 0 {
			v := unix.Iovec{Base: &s[0]}
			v.SetLen(len(s))
			p.iov = append(p.iov, v)
		}
	}
	for done := 0; done < n; {
		remote := []unix.RemoteIovec{{Base: uintptr(t.vaddr) + uintptr(done), Len: n - done}}
		var k int
		var err error
		if write {
			k, err = unix.ProcessVMWritev(t.pe.pid, p.iov, remote, 0)
		} else {
			k, err = unix.ProcessVMReadv(t.pe.pid, p.iov, remote, 0)
		}
		if err != nil || k <= 0 {
			if done == 0 && (err == unix.EPERM || err == unix.ENOSYS) {
				t.pe.noCMA = true // nothing moved: the packets can still do it
				return ErrIndirect
			}
			return fmt.Errorf("shmfab: cross-memory attach after %d of %d bytes: %w", done, n, err)
		}
		done += k
		p.skip(k)
	}
	p.direct.Add(1)
	return nil
}

// skip advances p.iov past k bytes.
func (p *Port) skip(k int) {
	for k > 0 && len(p.iov) > 0 {
		if l := int(p.iov[0].Len); k < l {
			p.iov[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(p.iov[0].Base), k))
			p.iov[0].SetLen(l - k)
			return
		}
		k -= int(p.iov[0].Len)
		p.iov = p.iov[1:]
	}
}

// Atomic runs a fetch-and-add or compare-and-swap on the peer's word at
// va, which must lie in a mapped allocation (plain memory is left to the
// owner's engine, which uses the same instructions).
func (p *Port) Atomic(dst netip.AddrPort, q fabric.QP, rkey uint32, va uint64, cas bool, swapAdd, compare uint64) (uint64, error) {
	p.dmu.Lock()
	defer p.dmu.Unlock()
	t, err := p.hold(dst, q, rkey, va, 8, fabric.RemoteAtomic, false)
	if err != nil {
		return 0, err
	}
	defer t.done()
	if t.mapped == nil || uintptr(unsafe.Pointer(&t.mapped[0]))%8 != 0 {
		return 0, ErrIndirect
	}
	w := (*uint64)(unsafe.Pointer(&t.mapped[0]))
	p.direct.Add(1)
	if !cas {
		return atomic.AddUint64(w, swapAdd) - swapAdd, nil
	}
	for {
		old := atomic.LoadUint64(w)
		if old != compare || atomic.CompareAndSwapUint64(w, old, swapAdd) {
			return old, nil
		}
	}
}

// CanPull reports whether peers can read this process's memory.
func (p *Port) CanPull() bool {
	ok, _ := CMA()
	return ok && !p.noCMA.Load()
}

// NoCMA makes the port reach no process's ordinary memory directly
// (process_vm_readv/writev): registered caller memory then goes through
// the rings. For a kernel or container where CMA misbehaves.
func (p *Port) NoCMA() { p.noCMA.Store(true) }

// Pull copies len(into) bytes at addr in the memory of the process whose
// port is src.
func (p *Port) Pull(src netip.AddrPort, addr uint64, into []byte) error {
	a := src.Addr().As16()
	if !src.Addr().Is6() || [8]byte(a[:8]) != prefix {
		return ErrIndirect
	}
	pid := int(binary.BigEndian.Uint32(a[8:]))
	for done := 0; done < len(into); {
		v := unix.Iovec{Base: &into[done]}
		v.SetLen(len(into) - done)
		k, err := unix.ProcessVMReadv(pid, []unix.Iovec{v},
			[]unix.RemoteIovec{{Base: uintptr(addr) + uintptr(done), Len: len(into) - done}}, 0)
		if err != nil || k <= 0 {
			return fmt.Errorf("shmfab: pull %d bytes from pid %d: %w", len(into), pid, err)
		}
		done += k
	}
	p.direct.Add(1)
	return nil
}

// Shared mailbox windows. A port lists the windows whose counting state
// (package shmbox) its owner keeps in shared memory: initiators then place
// and count their puts into them themselves, under the box's lock, and
// the owner's engine never sees those puts.

// Box table entry offsets.
const (
	boxAddr  = 0 // valid<<63 is not usable (addresses take 64 bits): see boxLive
	boxLive  = 8 // 1 while listed
	boxAlloc = 16
	boxFD    = 24
	boxOff   = 32
	boxLen   = 40
)

func boxEntry(i int) int { return boxesOff + i*boxBytes }

// ShareBox lists the mailbox window at addr, whose box lies in mem (from
// Alloc).
func (p *Port) ShareBox(addr uint64, mem []byte) error {
	a, off := allocOf(mem)
	if a == nil {
		return fmt.Errorf("%w: box not in shared memory", ErrIndirect)
	}
	p.emu.Lock()
	defer p.emu.Unlock()
	i, err := p.boxes.take(addr)
	if err != nil {
		return fmt.Errorf("shmfab: share mailbox %#x: %w", addr, err)
	}
	e := boxEntry(i)
	atomic.StoreUint64(u64(p.mem, e+boxAddr), addr)
	atomic.StoreUint64(u64(p.mem, e+boxAlloc), a.id)
	atomic.StoreUint64(u64(p.mem, e+boxFD), uint64(a.fd))
	atomic.StoreUint64(u64(p.mem, e+boxOff), uint64(off))
	atomic.StoreUint64(u64(p.mem, e+boxLen), uint64(len(mem)))
	atomic.StoreUint64(u64(p.mem, e+boxLive), 1) // last: listed
	return nil
}

// UnshareBox removes addr's window from the table. Initiators that
// mapped its box before keep placing into it until they see it closed
// (the owner closes the box first).
func (p *Port) UnshareBox(addr uint64) {
	p.emu.Lock()
	defer p.emu.Unlock()
	if i, ok := p.boxes.drop(addr); ok {
		atomic.StoreUint64(u64(p.mem, boxEntry(i)+boxLive), 0)
	}
}

// boxOf maps the box of the window at addr in pe's table (cached); nil if
// there is none. p.dmu is held.
func (p *Port) boxOf(pe *peer, addr uint64) *shmbox.Box {
	if b, ok := pe.boxes[addr]; ok {
		return b // nil: not shared when first looked up
	}
	var b *shmbox.Box
	for i := range Boxes {
		e := boxEntry(i)
		if atomic.LoadUint64(u64(pe.mem, e+boxLive)) != 1 || atomic.LoadUint64(u64(pe.mem, e+boxAddr)) != addr {
			continue
		}
		m, err := p.mapAlloc(pe, atomic.LoadUint64(u64(pe.mem, e+boxAlloc)), int(atomic.LoadUint64(u64(pe.mem, e+boxFD))))
		off, n := atomic.LoadUint64(u64(pe.mem, e+boxOff)), atomic.LoadUint64(u64(pe.mem, e+boxLen))
		if err == nil && off <= uint64(len(m)) && n <= uint64(len(m))-off {
			b, _ = shmbox.Open(m[off : off+n])
		}
		break
	}
	pe.boxes[addr] = b
	return b
}

// MailboxPuts places the puts, in order, at their offsets into the peer's
// window at mailbox and counts each, as the peer's engine would: into the
// first buffer that is not full, exactly once. It returns how many it
// placed; it declines the first put it cannot place (and so the rest: they
// then go as packets, and the target decides) when the window is not
// shared, is closed, has no buffer that is not full, or the put does not
// fit or lands in a buffer outside shared memory. Puts are copied under
// the box's lock, so one batch copies at most MaxMailboxPut bytes (the
// caller passes the rest again) and larger puts are left to the packets
// (which pull them).
func (p *Port) MailboxPuts(dst netip.AddrPort, q fabric.QP, mailbox uint64, puts []fabric.BoxPut, ordered bool) (int, error) {
	if len(puts) == 0 {
		return 0, nil
	}
	if total(puts[0].Src) > MaxMailboxPut {
		return 0, ErrIndirect
	}
	p.dmu.Lock()
	defer p.dmu.Unlock()
	pe, _, _, err := p.reach(dst, q, ordered)
	if err != nil {
		return 0, err
	}
	b := p.boxOf(pe, mailbox)
	if b == nil {
		return 0, ErrIndirect
	}
	k, bytes := 0, 0
	slot, data := -1, []byte(nil)
	// The placed puts not yet counted in slot: counted once per buffer,
	// since the target polls the counters.
	pendB, pendOps := 0, 0
	b.Lock()
	for _, put := range puts {
		n := total(put.Src)
		if bytes+n > MaxMailboxPut {
			break
		}
		if slot >= 0 && b.Fills(slot, pendB, pendOps) {
			// The puts so far fill the buffer: the next lands in the
			// one after, as if each had been counted on its own.
			b.Add(slot, pendB, pendOps)
			slot, pendB, pendOps = -1, 0, 0
		}
		if slot < 0 {
			// The batch's first put, or the buffer filled: find where it
			// lands. Otherwise it lands in the same buffer (the ones
			// before it are full, under the lock).
			if slot, data, err = p.boxSlot(pe, b); err != nil {
				slot = -1
				break
			}
		}
		base, r := b.BeginIn(slot, put.Offset, n)
		if r != shmbox.OK {
			err = ErrIndirect // the packets report the refusal
			break
		}
		at := base
		for _, s := range put.Src {
			at += copy(data[at:], s)
		}
		b.Note(slot, base, n)
		pendB, pendOps = pendB+n, pendOps+1
		k, bytes = k+1, bytes+n
	}
	if slot >= 0 && pendOps > 0 {
		b.Add(slot, pendB, pendOps)
	}
	wake := k > 0 && b.Completable() && b.Wake()
	b.Unlock()
	if wake {
		futex.WakeAll(b.WakeWord())
	}
	p.direct.Add(uint64(k))
	if k == 0 {
		return 0, err
	}
	return k, nil
}

// boxSlot returns the slot the next put into box b lands in and its
// buffer, mapped here; b's lock and p.dmu are held. It declines
// (ErrIndirect) when the window is closed or has no buffer that is not
// full, or the buffer is not in shared memory.
func (p *Port) boxSlot(pe *peer, b *shmbox.Box) (int, []byte, error) {
	i, ok := b.Find()
	if !ok || b.Closed() {
		return 0, nil, ErrIndirect
	}
	loc := b.Location(i)
	if !loc.Direct {
		return 0, nil, ErrIndirect
	}
	m, err := p.mapAlloc(pe, loc.AllocID, loc.AllocFD)
	if err != nil || loc.Off < 0 || loc.Len < 0 || uint64(loc.Off)+uint64(loc.Len) > uint64(len(m)) {
		return 0, nil, ErrIndirect
	}
	return i, m[loc.Off : loc.Off+loc.Len], nil
}

// MaxMailboxPut is the most MailboxPuts places in one call (it copies under
// the window's lock).
const MaxMailboxPut = 64 << 10
