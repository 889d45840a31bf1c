package rma

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/rvma/rvma/verbs"
)

// A dynamic window (MPI_Win_create_dynamic) has no memory when it is
// created; each rank attaches regions later, alone, and origins address
// them by their address in the target's process (MPI_Get_address). Its
// synchronisation, and the tracking of its operations, is an ordinary
// window of no memory (Win), so fences, PSCW, locks and flushes are
// Win's. Puts and gets are WRITEs and READs into the attached region's
// registration: the origin keeps, per target, the regions it learnt, and
// asks the target for the region holding an address it does not know (a
// dynamic active message, answered by the target's progress engine).
// Accumulates and atomics are active messages the target applies to the
// region holding their address, but for 8-byte fetch-and-add and
// compare-and-swap, which are verbs atomics as Win's are. A detach tells the origins that learnt
// the region to forget it before it is deregistered, so an address
// attached again later is asked for again, and an access to a region
// that is gone fails (the registration is gone too) rather than reach
// other memory.

// ErrAttach: a region attached to a dynamic window overlaps one attached
// already, or a detached address was not attached.
var ErrAttach = errors.New("rma: attach or detach refused")

// Kinds of dynamic active messages (kindDynAM); accumulates and
// compare-and-swap use amAcc and amCAS.
const (
	dynLookup = 16 // which region holds [off, off+len)? (len in layout.Count)
	dynForget = 17 // forget the region at off (the target detached it)

	dynRegionLen = 28 // a lookup's answer: base, size, addr, rkey
)

// dynRegion is a region attached to a dynamic window: base and size in the
// owner's address space, and the registration's address and key. mem,
// mr and told are the owner's only.
type dynRegion struct {
	base, size uint64
	addr       uint64
	rkey       uint32
	mem        []byte
	mr         *verbs.MR
	told       []bool // per rank: a lookup answered with this region
}

func (r *dynRegion) holds(addr, n uint64) bool {
	return addr >= r.base && n <= r.size && addr-r.base <= r.size-n
}

// DynWin is a dynamic window. Its synchronisation calls are its Win's;
// the data movement is its own, with target displacements that are
// addresses in the target's process (Address).
type DynWin struct {
	w *Win

	mu       sync.Mutex    // guards regions; held while an active message updates one
	regions  []dynRegion   // attached here
	cacheMu  sync.Mutex    // guards cache; taken by the poller (a forget) too
	cache    [][]dynRegion // per target: regions learnt from it
	freeOnce sync.Once
}

// Address is the address of b's first byte, as a dynamic window's target
// displacement for memory attached with b (0 for an empty b).
func Address(b []byte) int {
	if len(b) == 0 {
		return 0
	}
	return int(uintptr(unsafe.Pointer(&b[0])))
}

// CreateDynamic creates a dynamic window. It is collective.
func (c *Comm) CreateDynamic(ctx context.Context) (*DynWin, error) {
	w, err := c.Create(ctx, nil, nil)
	if err != nil {
		return nil, err
	}
	d := &DynWin{w: w, cache: make([][]dynRegion, c.size)}
	c.winMu.Lock()
	c.dyns[w.id] = d
	c.winMu.Unlock()
	return d, nil
}

// Win is the window whose calls synchronise d (Fence, Lock, Flush, ...).
func (d *DynWin) Win() *Win { return d.w }

// Attach makes mem reachable by the other ranks at the addresses of its
// bytes, until Detach or Free; mem must not overlap memory attached
// already. Attaching is local: an origin may access mem once it learnt
// its address (after a synchronisation with this rank, as MPI says).
func (d *DynWin) Attach(mem []byte) error {
	if len(mem) == 0 {
		return nil
	}
	b := uint64(Address(mem))
	n := uint64(len(mem))
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range d.regions {
		if b < r.base+r.size && r.base < b+n {
			return opErr("attach", -1, fmt.Errorf("%w: [%#x, +%d) overlaps [%#x, +%d)", ErrAttach, b, n, r.base, r.size))
		}
	}
	mr, err := d.w.c.pd.RegisterMR(mem, verbs.AccessAll)
	if err != nil {
		return opErr("attach", -1, err)
	}
	d.regions = append(d.regions, dynRegion{base: b, size: n, addr: mr.Addr(), rkey: mr.RKey(), mem: mem, mr: mr,
		told: make([]bool, d.w.c.size)})
	return nil
}

// Detach withdraws the region attached at address base: the ranks that
// learnt it forget it first (Detach waits until they have, which their
// progress engines answer whenever they are in any call of this package),
// then it is deregistered, which waits for accesses in progress.
func (d *DynWin) Detach(ctx context.Context, base int) error {
	d.mu.Lock()
	i := slices.IndexFunc(d.regions, func(r dynRegion) bool { return r.base == uint64(base) })
	if i < 0 {
		d.mu.Unlock()
		return opErr("detach", -1, fmt.Errorf("%w: nothing attached at %#x", ErrAttach, base))
	}
	r := d.regions[i]
	d.regions = slices.Delete(d.regions, i, i+1)
	d.mu.Unlock()
	var first error
	for o, told := range r.told {
		if !told {
			continue
		}
		if o == d.w.c.rank {
			d.forget(o, r.base)
			continue
		}
		req, err := d.call(ctx, "detach", o, amHdr{kind: dynForget, off: r.base}, nil, true)
		if err == nil {
			err = req.Wait(ctx)
		}
		if err != nil && first == nil {
			first = err
		}
	}
	if err := r.mr.Deregister(); err != nil && first == nil {
		first = opErr("detach", -1, err)
	}
	return first
}

// Free frees the window (collectively, as Win.Free), then withdraws what
// is still attached.
func (d *DynWin) Free(ctx context.Context) error {
	err := d.w.Free(ctx)
	d.freeOnce.Do(func() {
		d.w.c.winMu.Lock()
		delete(d.w.c.dyns, d.w.id)
		d.w.c.winMu.Unlock()
		d.mu.Lock()
		rs := d.regions
		d.regions = nil
		d.mu.Unlock()
		for _, r := range rs {
			r.mr.Deregister()
		}
	})
	return err
}

// forget drops what this rank learnt of target's region at base (in
// the poller, on a dynForget, or in Detach for this rank itself).
func (d *DynWin) forget(target int, base uint64) {
	d.cacheMu.Lock()
	defer d.cacheMu.Unlock()
	d.cache[target] = slices.DeleteFunc(d.cache[target], func(r dynRegion) bool { return r.base == base })
}

// resolve returns target's region holding [addr, addr+n), asking target
// if this rank has not learnt it yet.
func (d *DynWin) resolve(ctx context.Context, name string, target int, addr, n uint64) (dynRegion, error) {
	d.cacheMu.Lock()
	for _, r := range d.cache[target] {
		if r.holds(addr, n) {
			d.cacheMu.Unlock()
			return r, nil
		}
	}
	d.cacheMu.Unlock()
	var ans [dynRegionLen]byte
	req, err := d.call(ctx, name, target, amHdr{kind: dynLookup, off: addr, layout: Layout{Count: int(n)}}, ans[:], true)
	if err == nil {
		err = req.Wait(ctx)
	}
	if err != nil {
		return dynRegion{}, err
	}
	r := dynRegion{base: binary.LittleEndian.Uint64(ans[0:]), size: binary.LittleEndian.Uint64(ans[8:]),
		addr: binary.LittleEndian.Uint64(ans[16:]), rkey: binary.LittleEndian.Uint32(ans[24:])}
	d.cacheMu.Lock()
	// An entry overlapping the answer is stale: its region was detached
	// and the address attached again.
	d.cache[target] = append(slices.DeleteFunc(d.cache[target], func(c dynRegion) bool {
		return c.base < r.base+r.size && r.base < c.base+c.size
	}), r)
	d.cacheMu.Unlock()
	return r, nil
}

// call sends a dynamic active message to target and returns the request
// its reply completes (Win.amCall's, as kindDynAM). An internal one (a
// lookup, a forget) is no operation of the window: flushes do not wait
// for it. Accumulates count in w.amOut, as Win's do.
func (d *DynWin) call(ctx context.Context, name string, target int, h amHdr, result []byte, internal bool, data ...[]byte) (*Request, error) {
	return d.w.amCall(ctx, name, target, h, &amCall{result: result, free: internal, kind: kindDynAM}, data...)
}

// handleDynAM runs a dynamic active message at the target (in the poller)
// and replies.
func (c *Comm) handleDynAM(src int, b []byte) {
	h, data, ok := decodeAM(b)
	if !ok {
		c.cfg.Logger.Warn("rma: short active message", "rank", c.rank, "src", src)
		return
	}
	c.winMu.Lock()
	d := c.dyns[h.win]
	c.winMu.Unlock()
	status, result := byte(amNoWin), []byte(nil)
	if d != nil {
		status, result = d.apply(src, &h, data)
	}
	c.replyAM(src, h.id, status, result)
}

// apply executes a dynamic active message from rank src.
func (d *DynWin) apply(src int, h *amHdr, data []byte) (byte, []byte) {
	switch h.kind {
	case dynForget:
		if src >= 0 && src < len(d.cache) {
			d.forget(src, h.off)
		}
		return amOK, nil
	case dynLookup:
		d.mu.Lock()
		defer d.mu.Unlock()
		for i := range d.regions {
			r := &d.regions[i]
			if r.holds(h.off, uint64(h.layout.Count)) {
				r.told[src] = true
				ans := make([]byte, dynRegionLen)
				binary.LittleEndian.PutUint64(ans[0:], r.base)
				binary.LittleEndian.PutUint64(ans[8:], r.size)
				binary.LittleEndian.PutUint64(ans[16:], r.addr)
				binary.LittleEndian.PutUint32(ans[24:], r.rkey)
				return amOK, ans
			}
		}
		return amBounds, nil
	case amAcc, amCAS:
		n, refused := elemSpan(h, data)
		if refused != amOK || n == 0 {
			return refused, nil
		}
		// The region stays attached while d.mu is held: Detach takes it
		// out under d.mu before it deregisters. Held across the update,
		// it also makes updates of unaligned elements atomic (see
		// applyAtomic).
		d.mu.Lock()
		defer d.mu.Unlock()
		pieces := d.cover(h.off, uint64(n))
		switch {
		case pieces == nil:
			return amBounds, nil
		case len(pieces) == 1:
			return applyElems(h, pieces[0], data)
		}
		// The elements span regions attached next to each other, which
		// MPI allows: each piece holds whole elements, or nothing is
		// applied (an element split between two registrations could not
		// be updated atomically).
		sz := h.dt.Size()
		for _, p := range pieces {
			if h.kind == amCAS || len(p)%sz != 0 {
				return amBounds, nil
			}
		}
		var old []byte
		if h.fetch {
			old = make([]byte, n)
		}
		o := 0
		for _, p := range pieces {
			var po []byte
			if old != nil {
				po = old[o : o+len(p)]
			}
			applyAtomic(h.op, h.dt, p, data[o:o+len(p)], po)
			o += len(p)
		}
		return amOK, old
	}
	return amBadType, nil
}

// cover returns the attached memory of [addr, addr+n), a piece per region
// it spans in order, or nil if some byte of it is not attached (d.mu
// held).
func (d *DynWin) cover(addr, n uint64) [][]byte {
	var pieces [][]byte
	for n > 0 {
		i := slices.IndexFunc(d.regions, func(r dynRegion) bool { return r.holds(addr, 1) })
		if i < 0 {
			return nil
		}
		r := &d.regions[i]
		m := min(n, r.base+r.size-addr)
		pieces = append(pieces, r.mem[addr-r.base:addr-r.base+m])
		addr, n = addr+m, n-m
	}
	return pieces
}

// check validates a put or get as Win.check does, but for an address:
// the epoch, and the layouts against each other and the origin buffer.
func (d *DynWin) check(name string, origin []byte, ol Layout, target, addr int, tl Layout) (Layout, Layout, error) {
	if err := d.w.access(name, target, false); err != nil {
		return ol, tl, err
	}
	ol, err := ol.norm(len(origin))
	if err == nil {
		tl, err = tl.norm(ol.Size())
	}
	if err == nil && (ol.Extent() > len(origin) || ol.Size() != tl.Size()) {
		err = fmt.Errorf("%w: origin layout moves %d of %d bytes, target layout %d", ErrDatatype, ol.Size(), len(origin), tl.Size())
	}
	if err == nil && addr < 0 {
		err = fmt.Errorf("%w: address %#x", ErrOutOfBounds, addr)
	}
	if err != nil {
		return ol, tl, opErr(name, target, err)
	}
	return ol, tl, nil
}

// wrs makes the WRITEs (or READs) of a transfer between origin and the
// region r at addr: one per contiguous piece. Puts of up to inlineMax
// bytes travel inline.
func (d *DynWin) wrs(opc verbs.Opcode, origin []byte, ol Layout, r dynRegion, addr int, tl Layout) ([]verbs.SendWR, error) {
	var wrs []verbs.SendWR
	var perr error
	inline := opc == verbs.OpWrite && ol.Size() <= inlineMax
	at := r.addr + (uint64(addr) - r.base)
	segments(ol, tl, func(s seg) {
		if perr != nil {
			return
		}
		wr := verbs.SendWR{Opcode: opc, Flags: verbs.FlagSignaled, RemoteAddr: at + uint64(s.t), RKey: r.rkey}
		src := origin[s.o : s.o+s.n]
		if inline {
			wr.Flags |= verbs.FlagInline
			wr.Inline = src
		} else {
			sge, err := d.w.c.reg.sge(src)
			if err != nil {
				perr = err
				return
			}
			wr.SGL = []verbs.SGE{sge}
		}
		wrs = append(wrs, wr)
	})
	return wrs, perr
}

// spanningWRs is wrs for a transfer that no one region of target holds:
// each contiguous piece is split where target's regions meet, every byte
// must be attached.
func (d *DynWin) spanningWRs(ctx context.Context, name string, opc verbs.Opcode, origin []byte, ol Layout, target, addr int, tl Layout) ([]verbs.SendWR, error) {
	var wrs []verbs.SendWR
	var perr error
	segments(ol, tl, func(s seg) {
		at, o, left := uint64(addr+s.t), s.o, s.n
		for perr == nil && left > 0 {
			var r dynRegion
			if r, perr = d.resolve(ctx, name, target, at, 1); perr != nil {
				return
			}
			n := int(min(uint64(left), r.base+r.size-at))
			whole := Layout{Count: 1, Block: n, Stride: n}
			var piece []verbs.SendWR
			if piece, perr = d.wrs(opc, origin[o:o+n], whole, r, int(at), whole); perr != nil {
				return
			}
			wrs = append(wrs, piece...)
			at, o, left = at+uint64(n), o+n, left-n
		}
	})
	return wrs, perr
}

// transfer implements the puts and gets: without signal, a put posts
// unsignalled work requests and returns no request (a flush's marker
// completes it, as Win's puts).
func (d *DynWin) transfer(ctx context.Context, get bool, origin []byte, ol Layout, target, addr int, tl Layout, signal bool) (*Request, error) {
	name, opc, kind := "put", verbs.OpWrite, []atomic.Int32(nil)
	if get {
		name, opc = "get", verbs.OpRead
	}
	ol, tl, err := d.check(name, origin, ol, target, addr, tl)
	if err != nil || tl.Size() == 0 {
		return nil, err
	}
	var wrs []verbs.SendWR
	d.w.c.reg.hold()
	defer d.w.c.reg.release() // after the post
	r, err := d.resolve(ctx, name, target, uint64(addr), uint64(tl.Extent()))
	switch {
	case err == nil:
		wrs, err = d.wrs(opc, origin, ol, r, addr, tl)
	case errors.Is(err, ErrOutOfBounds):
		// No one region holds it all: regions attached next to each
		// other may (MPI allows an access across them).
		wrs, err = d.spanningWRs(ctx, name, opc, origin, ol, target, addr, tl)
	}
	if err != nil {
		return nil, opErr(name, target, err)
	}
	qp, err := d.w.c.conn(ctx, target)
	if err != nil {
		return nil, err
	}
	if get {
		kind = d.w.reads // a flush orders READs before a later message (see Complete)
	} else if !signal {
		return nil, d.w.postUnsignalled(qp, target, wrs)
	}
	return d.w.postOps(name, qp, target, wrs, kind)
}

// Put puts origin into target's memory at address addr, which must lie in
// a region target attached; it completes at the next synchronisation.
func (d *DynWin) Put(ctx context.Context, origin []byte, target, addr int) error {
	_, err := d.transfer(ctx, false, origin, Layout{}, target, addr, Layout{}, false)
	return err
}

// PutRuns is Win.PutRuns at addresses: each run goes to addr+r.Target.
func (d *DynWin) PutRuns(ctx context.Context, origin []byte, runs []Run, target, addr int) error {
	return d.w.c.reg.runs(ctx, "put", origin, runs, target, addr, d.Put)
}

// GetRuns is Win.GetRuns at addresses.
func (d *DynWin) GetRuns(ctx context.Context, origin []byte, runs []Run, target, addr int) error {
	return d.w.c.reg.runs(ctx, "get", origin, runs, target, addr, d.Get)
}

// PutLayout is Put with layouts for both sides.
func (d *DynWin) PutLayout(ctx context.Context, origin []byte, ol Layout, target, addr int, tl Layout) error {
	_, err := d.transfer(ctx, false, origin, ol, target, addr, tl, false)
	return err
}

// Rput is Put returning a request.
func (d *DynWin) Rput(ctx context.Context, origin []byte, target, addr int) (*Request, error) {
	return d.w.orDone(d.transfer(ctx, false, origin, Layout{}, target, addr, Layout{}, true))
}

// RputLayout is Rput with layouts.
func (d *DynWin) RputLayout(ctx context.Context, origin []byte, ol Layout, target, addr int, tl Layout) (*Request, error) {
	return d.w.orDone(d.transfer(ctx, false, origin, ol, target, addr, tl, true))
}

// Get gets len(origin) bytes of target's memory at address addr; it
// completes at the next synchronisation.
func (d *DynWin) Get(ctx context.Context, origin []byte, target, addr int) error {
	_, err := d.transfer(ctx, true, origin, Layout{}, target, addr, Layout{}, true)
	return err
}

// Rget is Get returning a request.
func (d *DynWin) Rget(ctx context.Context, origin []byte, target, addr int) (*Request, error) {
	return d.w.orDone(d.transfer(ctx, true, origin, Layout{}, target, addr, Layout{}, true))
}

// RgetLayout is Rget with layouts.
func (d *DynWin) RgetLayout(ctx context.Context, origin []byte, ol Layout, target, addr int, tl Layout) (*Request, error) {
	return d.w.orDone(d.transfer(ctx, true, origin, ol, target, addr, tl, true))
}

// accumulate sends an accumulate (fetching into result if not nil) that
// the target applies to the region holding addr.
func (d *DynWin) accumulate(ctx context.Context, name string, origin, result []byte, dt Datatype, op Op, target, addr int) (*Request, error) {
	if err := d.w.access(name, target, false); err != nil {
		return nil, err
	}
	if err := check(op, dt, len(origin)); err != nil {
		return nil, opErr(name, target, err)
	}
	if result != nil && len(result) != len(origin) {
		return nil, opErr(name, target, fmt.Errorf("%w: result of %d bytes for %d", ErrDatatype, len(result), len(origin)))
	}
	if addr < 0 {
		return nil, opErr(name, target, fmt.Errorf("%w: address %#x", ErrOutOfBounds, addr))
	}
	if len(origin) == 0 {
		return nil, nil
	}
	return d.call(ctx, name, target, amHdr{kind: amAcc, op: op, dt: dt, fetch: result != nil, off: uint64(addr)}, result, false, origin)
}

// Accumulate combines origin into target's memory at address addr with
// op, element by element, atomically.
func (d *DynWin) Accumulate(ctx context.Context, origin []byte, dt Datatype, op Op, target, addr int) error {
	_, err := d.accumulate(ctx, "accumulate", origin, nil, dt, op, target, addr)
	return err
}

// Raccumulate is Accumulate returning a request.
func (d *DynWin) Raccumulate(ctx context.Context, origin []byte, dt Datatype, op Op, target, addr int) (*Request, error) {
	return d.w.orDone(d.accumulate(ctx, "accumulate", origin, nil, dt, op, target, addr))
}

// GetAccumulate is Accumulate that returns the previous values in result.
func (d *DynWin) GetAccumulate(ctx context.Context, origin, result []byte, dt Datatype, op Op, target, addr int) error {
	_, err := d.accumulate(ctx, "get_accumulate", origin, result, dt, op, target, addr)
	return err
}

// RgetAccumulate is GetAccumulate returning a request.
func (d *DynWin) RgetAccumulate(ctx context.Context, origin, result []byte, dt Datatype, op Op, target, addr int) (*Request, error) {
	return d.w.orDone(d.accumulate(ctx, "get_accumulate", origin, result, dt, op, target, addr))
}

func (d *DynWin) fetchAndOp(ctx context.Context, origin, result []byte, dt Datatype, op Op, target, addr int) (*Request, error) {
	const name = "fetch_and_op"
	if sz := dt.Size(); len(origin) != sz || len(result) != sz {
		return nil, opErr(name, target, fmt.Errorf("%w: one %v element expected", ErrDatatype, dt))
	}
	if (dt == Int64 || dt == Uint64) && (op == Sum || op == NoOp) {
		add := binary.LittleEndian.Uint64(origin)
		if op == NoOp {
			add = 0
		}
		if req, ok, err := d.nicAtomic(ctx, name, target, addr, verbs.OpFetchAdd, add, 0, result); ok {
			return req, err
		}
	}
	return d.accumulate(ctx, name, origin, result, dt, op, target, addr)
}

// nicAtomic posts an 8-byte fetch-and-add or compare-and-swap at target's
// address addr as a verbs atomic, which the target's NIC applies on
// arrival (its progress engine need not run, as an active message's
// must), if it may be one: the word is aligned, and no accumulate to
// target is in flight that it would overtake (see Win.nicAtomicOK). ok
// is false if it may not.
func (d *DynWin) nicAtomic(ctx context.Context, name string, target, addr int, opc verbs.Opcode, cmpAdd, swap uint64, result []byte) (*Request, bool, error) {
	if addr%8 != 0 || d.w.amOut[target].Load() != 0 {
		return nil, false, nil
	}
	if err := d.w.access(name, target, false); err != nil {
		return nil, true, err
	}
	r, err := d.resolve(ctx, name, target, uint64(addr), 8)
	if err != nil {
		return nil, true, err
	}
	req, err := d.w.nicAtomic(ctx, name, target, opc, r.addr+(uint64(addr)-r.base), r.rkey, cmpAdd, swap, result)
	return req, true, err
}

// FetchAndOp applies op to one element at target's address addr and
// returns the previous value in result.
func (d *DynWin) FetchAndOp(ctx context.Context, origin, result []byte, dt Datatype, op Op, target, addr int) error {
	_, err := d.fetchAndOp(ctx, origin, result, dt, op, target, addr)
	return err
}

// RfetchAndOp is FetchAndOp returning a request.
func (d *DynWin) RfetchAndOp(ctx context.Context, origin, result []byte, dt Datatype, op Op, target, addr int) (*Request, error) {
	return d.w.orDone(d.fetchAndOp(ctx, origin, result, dt, op, target, addr))
}

func (d *DynWin) compareAndSwap(ctx context.Context, origin, compare, result []byte, dt Datatype, target, addr int) (*Request, error) {
	const name = "compare_and_swap"
	sz := dt.Size()
	if sz == 0 || len(origin) != sz || len(compare) != sz || len(result) != sz {
		return nil, opErr(name, target, fmt.Errorf("%w: one %v element expected", ErrDatatype, dt))
	}
	if err := d.w.access(name, target, false); err != nil {
		return nil, err
	}
	if addr < 0 {
		return nil, opErr(name, target, fmt.Errorf("%w: address %#x", ErrOutOfBounds, addr))
	}
	if sz == 8 {
		cmp, swp := binary.LittleEndian.Uint64(compare), binary.LittleEndian.Uint64(origin)
		if req, ok, err := d.nicAtomic(ctx, name, target, addr, verbs.OpCompareSwap, cmp, swp, result); ok {
			return req, err
		}
	}
	return d.call(ctx, name, target, amHdr{kind: amCAS, dt: dt, off: uint64(addr)}, result, false, compare, origin)
}

// CompareAndSwap replaces the element at target's address addr with
// origin if it equals compare, and returns the previous value in result.
func (d *DynWin) CompareAndSwap(ctx context.Context, origin, compare, result []byte, dt Datatype, target, addr int) error {
	_, err := d.compareAndSwap(ctx, origin, compare, result, dt, target, addr)
	return err
}

// RcompareAndSwap is CompareAndSwap returning a request.
func (d *DynWin) RcompareAndSwap(ctx context.Context, origin, compare, result []byte, dt Datatype, target, addr int) (*Request, error) {
	return d.w.orDone(d.compareAndSwap(ctx, origin, compare, result, dt, target, addr))
}
