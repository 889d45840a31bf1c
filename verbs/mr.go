package verbs

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rvma/rvma/internal/fabric"
)

// PD is a protection domain: memory regions and queue pairs of one PD may
// be used together, and a remote key only opens memory to QPs of its PD.
// A PD is safe for concurrent use.
type PD struct {
	dev *Device // immutable
	id  uint64  // immutable; names the PD in shared tables (fabric.Exporter)

	// mu guards the counts and closed; Close takes the device's mu
	// under it.
	mu     sync.Mutex
	mrs    int
	qps    int
	closed bool
}

// AllocPD allocates a protection domain.
func (d *Device) AllocPD() (*PD, error) {
	if d.closed.Load() {
		return nil, ErrClosed
	}
	d.mu.Lock()
	d.nextPD++
	pd := &PD{dev: d, id: d.nextPD}
	d.pds[pd] = struct{}{}
	d.mu.Unlock()
	return pd, nil
}

// Device returns the PD's device.
func (pd *PD) Device() *Device { return pd.dev }

// Close frees the PD. It fails with ErrBusy while MRs or QPs remain.
func (pd *PD) Close() error {
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed || pd.dev.closed.Load() {
		return ErrClosed
	}
	if pd.mrs > 0 || pd.qps > 0 {
		return fmt.Errorf("verbs: close PD: %w: %d MRs, %d QPs", ErrBusy, pd.mrs, pd.qps)
	}
	pd.closed = true
	pd.dev.mu.Lock()
	delete(pd.dev.pds, pd)
	pd.dev.mu.Unlock()
	return nil
}

func (pd *PD) usable() error {
	if pd.dev.closed.Load() {
		return ErrClosed
	}
	pd.mu.Lock()
	defer pd.mu.Unlock()
	if pd.closed {
		return ErrClosed
	}
	return nil
}

// MR is a registered memory region over a caller-owned byte slice. Remote
// peers reach it by (IOVA, remote key); local work requests by (IOVA, local
// key). Keys are random, never sequential.
//
// The caller keeps ownership of the slice, and may read and write it at
// any time; bytes placed by remote writes are visible once the operation
// that carried them has completed at the initiator (or, for operations that
// notify the target, once the target's completion is seen). After
// Deregister returns, the device never touches the slice again.
type MR struct {
	pd     *PD
	buf    []byte
	iova   uint64
	lkey   uint32
	rkey   uint32
	access Access

	free     func([]byte) error // releases memory from AllocMR
	xmu      sync.Mutex         // guards exported
	exported bool               // published for peers' direct access (shm)

	inflight atomic.Int32 // placements in progress
	dead     atomic.Bool
	paused   atomic.Bool // Exclusive holds remote accesses back
	excl     sync.Mutex  // serialises Exclusive
}

// RegisterMR registers buf with the given access rights. As in ibverbs,
// remote write and remote atomic access require local write.
func (pd *PD) RegisterMR(buf []byte, access Access) (*MR, error) {
	if err := pd.usable(); err != nil {
		return nil, err
	}
	if access&^AccessAll != 0 {
		return nil, fmt.Errorf("verbs: register MR: %w: unknown bits in %#x", ErrInvalidAccess, uint32(access))
	}
	if access&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && access&AccessLocalWrite == 0 {
		return nil, fmt.Errorf("verbs: register MR: %w: %v without LOCAL_WRITE", ErrInvalidAccess, access)
	}
	if uint64(len(buf)) > 1<<40 {
		return nil, fmt.Errorf("verbs: register MR: %w: %d bytes", ErrInvalidArgument, len(buf))
	}
	d := pd.dev
	mr := &MR{pd: pd, buf: buf, access: access}
	d.mu.Lock()
	mr.iova = d.nextIO
	// Page-aligned, with a guard page between regions so that an
	// off-by-one remote address never lands in a neighbour.
	d.nextIO += (uint64(len(buf))+4095)&^4095 + 4096
	for mr.lkey == 0 || d.lkeys.get(mr.lkey) != nil {
		mr.lkey = rand.Uint32()
	}
	for mr.rkey == 0 || d.rkeys.get(mr.rkey) != nil || mr.rkey == mr.lkey {
		mr.rkey = rand.Uint32()
	}
	d.lkeys.set(d, mr.lkey, mr)
	d.rkeys.set(d, mr.rkey, mr)
	d.mu.Unlock()
	mr.export()
	pd.mu.Lock()
	pd.mrs++
	pd.mu.Unlock()
	return mr, nil
}

// Addr returns the IOVA of the region's first byte.
func (mr *MR) Addr() uint64 { return mr.iova }

// Len returns the region's length in bytes.
func (mr *MR) Len() int { return len(mr.buf) }

// LKey returns the local key.
func (mr *MR) LKey() uint32 { return mr.lkey }

// RKey returns the remote key.
func (mr *MR) RKey() uint32 { return mr.rkey }

// Access returns the region's access rights.
func (mr *MR) Access() Access { return mr.access }

// Bytes returns the registered slice.
func (mr *MR) Bytes() []byte { return mr.buf }

// SGE returns the scatter/gather element for n bytes at offset off.
func (mr *MR) SGE(off, n int) SGE {
	return SGE{Addr: mr.iova + uint64(off), Length: uint32(n), LKey: mr.lkey}
}

// Deregister invalidates both keys. Remote accesses that arrive afterwards
// fail with a remote access error; placements in progress, and the sends
// of READ responses that read the region, finish before it returns, so
// the caller may reuse the slice at once (it must therefore not be called
// from a MailboxHandler).
func (mr *MR) Deregister() error {
	if mr.pd.dev.closed.Load() {
		mr.dead.Store(true)
		return ErrClosed
	}
	if mr.dead.Swap(true) {
		return ErrClosed
	}
	d := mr.pd.dev
	d.mu.Lock()
	d.lkeys.set(d, mr.lkey, nil)
	d.rkeys.set(d, mr.rkey, nil)
	d.mu.Unlock()
	mr.unexport()
	for mr.inflight.Load() != 0 {
		runtime.Gosched()
	}
	mr.pd.mu.Lock()
	mr.pd.mrs--
	mr.pd.mu.Unlock()
	if mr.free != nil {
		return mr.free(mr.buf)
	}
	return nil
}

// AllocMR allocates n bytes and registers them with the given access
// rights; Deregister frees them. On an shm device the memory is shared
// with the processes of the host, so a peer's WRITE, READ or atomic on it
// is one copy (or one CPU atomic) by the peer itself, with no work by
// this process: this is the memory to use for windows and buffers that
// peers on the host access (MPI_Win_allocate's, as against
// MPI_Win_create's). Elsewhere it is ordinary memory. The bytes are
// zeroed and page-aligned; they must not be used after Deregister.
func (pd *PD) AllocMR(n int, access Access) (*MR, error) {
	if n <= 0 || n > 1<<40 {
		return nil, fmt.Errorf("verbs: alloc MR: %w: %d bytes", ErrInvalidArgument, n)
	}
	if err := pd.usable(); err != nil {
		return nil, err
	}
	var buf []byte
	var free func([]byte) error
	if a := pd.dev.alloc; a != nil {
		b, err := a.Alloc(n)
		if err != nil {
			return nil, fmt.Errorf("verbs: alloc MR: %w", err)
		}
		buf, free = b, a.Free
	} else {
		w := make([]uint64, (n+4095)/8+512)
		off := (4096 - int(uintptr(unsafe.Pointer(&w[0]))%4096)) % 4096
		buf = unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), len(w)*8)[off : off+n : off+n]
	}
	mr, err := pd.RegisterMR(buf, access)
	if err != nil {
		if free != nil {
			free(buf)
		}
		return nil, err
	}
	mr.free = free
	return mr, nil
}

// ShareMailbox allocates n bytes of memory shared with the host's
// processes for the counting state of the mailbox window at addr (package
// mailbox lays it out) and lists it on the device's shm ports, so that
// initiators on the host place and count their puts into that window
// themselves, with no packet and no work by this process. It fails with
// ErrUnsupported on a device without shm ports, or when the ports cannot
// list more windows. The memory is never freed: peers may still map it,
// and windows last as long as their target.
func (d *Device) ShareMailbox(addr uint64, n int) ([]byte, error) {
	if d.alloc == nil {
		return nil, fmt.Errorf("verbs: share mailbox: %w: no shm port", ErrUnsupported)
	}
	mem, err := d.alloc.Alloc(n)
	if err != nil {
		return nil, fmt.Errorf("verbs: share mailbox: %w", err)
	}
	for i, p := range d.ports {
		if b := p.BoxSharer(); b != nil {
			if err := b.ShareBox(addr, mem); err != nil {
				d.unshare(addr, d.ports[:i])
				d.alloc.Free(mem)
				return nil, fmt.Errorf("verbs: share mailbox: %w: %v", ErrUnsupported, err)
			}
		}
	}
	return mem, nil
}

// UnshareMailbox removes the window at addr from the shm ports' lists.
func (d *Device) UnshareMailbox(addr uint64) { d.unshare(addr, d.ports) }

func (d *Device) unshare(addr uint64, ports []*fabric.FaultPort) {
	for _, p := range ports {
		if b := p.BoxSharer(); b != nil {
			b.UnshareBox(addr)
		}
	}
}

// SharedLocation says where buf lies when it is memory from AllocMR on an
// shm device: the allocation's id and descriptor and buf's offset in it,
// which a shared mailbox window records for each posted buffer so that
// initiators can map it. ok is false for any other memory.
func (d *Device) SharedLocation(buf []byte) (id uint64, fd, off int, ok bool) {
	if d.alloc == nil {
		return 0, 0, 0, false
	}
	return d.alloc.Locate(buf)
}

// export publishes a region that peers may access remotely on the ports
// that let them reach it directly (shm). Where that fails it stays
// reachable through packets.
func (mr *MR) export() {
	var r fabric.Rights
	if mr.access&AccessRemoteRead != 0 {
		r |= fabric.RemoteRead
	}
	if mr.access&AccessRemoteWrite != 0 {
		r |= fabric.RemoteWrite
	}
	if mr.access&AccessRemoteAtomic != 0 {
		r |= fabric.RemoteAtomic
	}
	if r == 0 || len(mr.buf) == 0 {
		return
	}
	for _, p := range mr.pd.dev.ports {
		if x := p.Exporter(); x != nil && x.Export(mr.rkey, mr.iova, mr.buf, r, mr.pd.id) == nil {
			mr.exported = true
		}
	}
}

// unexport withdraws the region from direct access and waits for the
// peers' accesses in progress.
func (mr *MR) unexport() {
	mr.xmu.Lock()
	defer mr.xmu.Unlock()
	if !mr.exported {
		return
	}
	for _, p := range mr.pd.dev.ports {
		if x := p.Exporter(); x != nil {
			x.Unexport(mr.rkey)
		}
	}
	mr.exported = false
}

// span returns the bytes [addr, addr+n) of the region, or false if they are
// not all inside it.
func (mr *MR) span(addr uint64, n uint64) ([]byte, bool) {
	if addr < mr.iova || n > uint64(len(mr.buf)) || addr-mr.iova > uint64(len(mr.buf))-n {
		return nil, false
	}
	off := addr - mr.iova
	return mr.buf[off : off+n], true
}

// enter marks a placement in progress; false if the MR is gone. It waits
// while Exclusive runs.
func (mr *MR) enter() bool {
	for {
		mr.inflight.Add(1)
		if mr.dead.Load() {
			mr.inflight.Add(-1)
			return false
		}
		if !mr.paused.Load() {
			return true
		}
		mr.inflight.Add(-1)
		for mr.paused.Load() {
			runtime.Gosched()
		}
	}
}

// Exclusive runs f on the region's bytes while no remote access to them is
// in progress: remote accesses that arrive meanwhile wait until f returns.
// Use it where local code must read or rewrite bytes that the peer may be
// writing again (a duplicate), so that the two are ordered. f must be
// short: it holds up the device's receive path.
func (mr *MR) Exclusive(f func(buf []byte)) {
	mr.excl.Lock()
	defer mr.excl.Unlock()
	// Peers' direct accesses cannot be held back: from now on the
	// region is reached through the engine, which honours the pause.
	mr.unexport()
	mr.paused.Store(true)
	for mr.inflight.Load() != 0 {
		runtime.Gosched()
	}
	f(mr.buf)
	mr.paused.Store(false)
}

func (mr *MR) exit() { mr.inflight.Add(-1) }

// resolveLocal maps an SGE to bytes, checking key, PD, rights and bounds.
func (pd *PD) resolveLocal(s SGE, need Access) ([]byte, Status) {
	mr := pd.dev.lkeys.get(s.LKey)
	if mr == nil || mr.pd != pd || mr.dead.Load() {
		return nil, StatusLocalProtectionError
	}
	if mr.access&need != need {
		return nil, StatusLocalProtectionError
	}
	b, ok := mr.span(s.Addr, uint64(s.Length))
	if !ok {
		return nil, StatusLocalProtectionError
	}
	return b, StatusSuccess
}

// resolveRemote finds the MR a remote request addresses and checks it.
func (pd *PD) resolveRemote(rkey uint32, va, n uint64, need Access) (*MR, []byte, bool) {
	mr := pd.dev.rkeys.get(rkey)
	if mr == nil || mr.pd != pd || mr.access&need != need || mr.dead.Load() {
		return nil, nil, false
	}
	b, ok := mr.span(va, n)
	if !ok {
		return nil, nil, false
	}
	return mr, b, true
}

// Mapping is a peer's registered memory mapped into this process
// (QP.Map): loads and stores on Bytes reach the peer's region with no
// work request, no packet and no completion.
type Mapping struct {
	b    []byte
	gone *atomic.Bool
	port *fabric.FaultPort
}

// Bytes is the mapped region.
func (m *Mapping) Bytes() []byte { return m.b }

// PeerGone reports that the peer's process was found gone (it is looked
// for every 100 ms): what was stored since may be lost.
func (m *Mapping) PeerGone() bool { return m.gone.Load() }

// Usable reports whether accesses through the mapping are right now: the
// peer lives and no faults are being injected on the port (the mapping
// would bypass them).
func (m *Mapping) Usable() bool { return !m.gone.Load() && m.port.Accessor() != nil }

// Map returns the peer's registered memory [addr, addr+n) under rkey
// mapped into this process, when the QP's port reaches it without packets
// (shm, memory the peer took from PD.AllocMR) and the region grants
// access (AccessRemoteWrite, AccessRemoteRead, or both); ErrUnsupported
// otherwise. The rkey, range and rights are checked once, here.
// Accesses through the mapping bypass the QP: they are not ordered with
// its requests and complete at once; the caller orders them itself, and
// stops using the mapping when the peer deregisters the region (the bytes
// stay mapped, but are no longer the peer's) and before this device
// closes (then they are unmapped).
func (qp *QP) Map(rkey uint32, addr uint64, n int, access Access) (*Mapping, error) {
	var need fabric.Rights
	if access&AccessRemoteRead != 0 {
		need |= fabric.RemoteRead
	}
	if access&AccessRemoteWrite != 0 {
		need |= fabric.RemoteWrite
	}
	qp.mu.Lock()
	if err := qp.usableLocked(); err != nil {
		qp.mu.Unlock()
		return nil, err
	}
	ready := qp.state == StateReadyToSend
	dst, q := qp.remote.GID, fabric.QP{Num: qp.remote.QPN, Secret: qp.remote.Secret}
	qp.mu.Unlock()
	mp := qp.port.Mapper()
	if !ready || mp == nil || need == 0 || qp.port.Accessor() == nil {
		return nil, fmt.Errorf("verbs: QP %d: map: %w", qp.num, ErrUnsupported)
	}
	b, gone, err := mp.Map(dst, q, rkey, addr, n, need)
	if err != nil {
		return nil, fmt.Errorf("verbs: QP %d: map: %w: %v", qp.num, ErrUnsupported, err)
	}
	return &Mapping{b: b, gone: gone, port: qp.port}, nil
}
