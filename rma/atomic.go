package rma

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/rvma/rvma/internal/progress"
	"github.com/rvma/rvma/verbs"
)

func atomicAdd(p *uint64, v uint64) uint64 { return atomic.AddUint64(p, v) }

// Active messages carry what the target must compute: accumulates,
// fetch-and-op and compare-and-swap other than the NIC's (see
// nicAtomicOK), packed strided puts, and the credit requests of notified
// windows (see notifytx.go). The target's progress engine applies them in
// arrival order, each element atomically, and replies; the reply is the
// operation's completion.
const (
	amAcc    = 1 // accumulate, optionally fetching the old values
	amCAS    = 2 // compare-and-swap of one element
	amPacked = 3 // a packed strided put, unpacked at the target
	amCredit = 4 // when is the buffer of epoch off posted (per-origin notified windows)?
	amGather = 5 // a strided get of small blocks: the target packs them into its reply

	amHdrLen = 40

	amOK      = 0
	amBounds  = 1
	amNoWin   = 2
	amBadType = 3
)

type amHdr struct {
	id     uint64
	win    uint32
	kind   byte
	op     Op
	dt     Datatype
	fetch  bool
	off    uint64
	layout Layout
}

// put writes the header into b (amHdrLen bytes).
func (h *amHdr) put(b []byte) {
	binary.LittleEndian.PutUint64(b[0:], h.id)
	binary.LittleEndian.PutUint32(b[8:], h.win)
	b[12], b[13], b[14] = h.kind, byte(h.op), byte(h.dt)
	if h.fetch {
		b[15] = 1
	}
	binary.LittleEndian.PutUint64(b[16:], h.off)
	binary.LittleEndian.PutUint32(b[24:], uint32(h.layout.Count))
	binary.LittleEndian.PutUint32(b[28:], uint32(h.layout.Block))
	binary.LittleEndian.PutUint32(b[32:], uint32(h.layout.Stride))
}

func decodeAM(b []byte) (amHdr, []byte, bool) {
	if len(b) < amHdrLen {
		return amHdr{}, nil, false
	}
	h := amHdr{id: binary.LittleEndian.Uint64(b[0:]), win: binary.LittleEndian.Uint32(b[8:]),
		kind: b[12], op: Op(b[13]), dt: Datatype(b[14]), fetch: b[15] == 1, off: binary.LittleEndian.Uint64(b[16:]),
		layout: Layout{Count: int(binary.LittleEndian.Uint32(b[24:])), Block: int(binary.LittleEndian.Uint32(b[28:])),
			Stride: int(binary.LittleEndian.Uint32(b[32:]))}}
	return h, b[amHdrLen:], true
}

type amCall struct {
	id     uint64
	req    *Request
	result []byte
	after  func(error) // if set, runs once the call finished, outside the engine's lock
	free   bool        // not an operation of the window: flushes do not wait for it
	kind   byte        // the message's kind: kindAM, or kindDynAM for a dynamic window's (0: kindAM)
}

// amMax bounds the window operations' active messages to one target that
// wait for their replies.
const amMax = 4096

// addAM records call, numbered, as waiting for its reply (engine's lock).
func (m *msgState) addAM(call *amCall) {
	m.nextAM++
	call.id = m.nextAM
	m.am[call.id] = call
	if !call.free {
		m.amOut[call.req.rank]++
	}
}

// dropAM forgets call, answered or failed (engine's lock).
func (m *msgState) dropAM(call *amCall) {
	delete(m.am, call.id)
	if !call.free {
		m.amOut[call.req.rank]--
	}
}

// am sends an active message to target and returns the request its reply
// completes.
func (w *Win) am(ctx context.Context, name string, target int, h amHdr, result []byte, data ...[]byte) (*Request, error) {
	return w.amCall(ctx, name, target, h, &amCall{result: result}, data...)
}

// amCall is am for a prepared call. Accumulates (and fetch-and-op and
// compare-and-swap sent this way) count in w.amOut until their reply.
func (w *Win) amCall(ctx context.Context, name string, target int, h amHdr, call *amCall, data ...[]byte) (*Request, error) {
	c := w.c
	if !call.free {
		// Each active message waiting for its reply holds its request,
		// its record here and, at the target, its answer: a program
		// may issue millions in one epoch (an accumulate per graph edge),
		// so past amMax to one target the caller makes progress until
		// replies come back. Free ones (credit requests, lookups) may be
		// sent from the poller, which must not wait; they are few.
		if err := c.eng.Wait(ctx, func() bool { return c.msg.amOut[target] < amMax }); err != nil {
			return nil, opErr(name, target, err)
		}
	}
	var kind []atomic.Int32
	if h.kind == amAcc || h.kind == amCAS {
		kind = w.amOut
	}
	var op *progress.Op
	if call.free {
		op, _ = c.eng.Start(0, nil)
		call.req = &Request{op: op, name: name, rank: target}
	} else {
		o, _ := w.trackAs(0, target, kind)
		op, call.req = &o.op, o.request(name)
	}
	c.eng.Locked(func() { c.msg.addAM(call) })
	h.id, h.win = call.id, w.id
	// fail runs under the engine's lock; call.after must not.
	fail := func(err error) {
		c.eng.AssertLocked("rma: an active message fails")
		if c.msg.am[call.id] == call {
			c.msg.dropAM(call)
			c.eng.FinishLocked(op, err)
			if call.after != nil {
				go call.after(err)
			}
		}
	}
	msg := call.kind
	if msg == 0 {
		msg = kindAM
	}
	onSent := func(err error) {
		if err != nil {
			fail(err)
		}
	}
	// The header and the caller's data go into the send buffers as they
	// are (a 2 MiB accumulate was joined into a new slice first).
	var hdr [amHdrLen]byte
	h.put(hdr[:])
	var pieces [4][]byte
	g := append(append(gather(pieces[:0]), hdr[:]), data...)
	if call.free {
		ctx = context.Background() // a credit request, which may be sent from the poller (txDrain)
	}
	_, err := c.sendMsgMode(ctx, target, msg, 0, g, onSent, call.free)
	if err != nil {
		c.eng.Locked(func() { fail(err) })
		return nil, opErr(name, target, err)
	}
	return call.req, nil
}

// handleAM runs an active message at the target (in the poller) and
// replies, except to a credit request that must wait for a buffer.
func (c *Comm) handleAM(src int, b []byte) {
	h, data, ok := decodeAM(b)
	if !ok {
		c.cfg.Logger.Warn("rma: short active message", "rank", c.rank, "src", src)
		return
	}
	c.winMu.Lock()
	w := c.wins[h.win]
	c.winMu.Unlock()
	status, result := byte(amNoWin), []byte(nil)
	switch {
	case w == nil:
	case h.kind == amCredit && w.notify == nil:
		status = amBadType
	case h.kind == amCredit:
		var now bool
		if now, result = w.notify.creditRequest(src, h.id, h.off); !now {
			return // grant answers it
		}
		status = amOK
	default:
		status, result = w.apply(src, &h, data)
	}
	c.replyAM(src, h.id, status, result)
}

// replyAM answers active message id of rank dst.
func (c *Comm) replyAM(dst int, id uint64, status byte, result []byte) {
	reply := make([]byte, 16, 16+len(result))
	binary.LittleEndian.PutUint64(reply, id)
	reply[8] = status
	reply = append(reply, result...)
	c.sendMsgNoWait(dst, kindAMReply, 0, reply, nil)
}

// apply executes an active message from rank src on the local window
// memory.
func (w *Win) apply(src int, h *amHdr, data []byte) (byte, []byte) {
	mem := w.mem
	switch h.kind {
	case amPacked:
		// Puts into notified windows never travel packed: the mailbox
		// counts them in order with the others (see putWRs).
		l := h.layout
		ext, ok := l.checkedExtent()
		if w.notify != nil || !ok || l.Size() != len(data) || !fits(h.off, ext, len(mem)) {
			return amBounds, nil
		}
		for i := range l.Count {
			o := int(h.off) + i*l.Stride
			copy(mem[o:o+l.Block], data[i*l.Block:])
		}
		return amOK, nil
	case amGather:
		l := h.layout
		ext, ok := l.checkedExtent()
		if !ok || len(data) != 0 || !fits(h.off, ext, len(mem)) {
			return amBounds, nil
		}
		out := make([]byte, 0, l.Size())
		for i := range l.Count {
			o := int(h.off) + i*l.Stride
			out = append(out, mem[o:o+l.Block]...)
		}
		return amOK, out
	case amAcc, amCAS:
		n, refused := elemSpan(h, data)
		if refused != amOK || n == 0 {
			return refused, nil
		}
		if !fits(h.off, n, len(mem)) {
			return amBounds, nil
		}
		region := mem[h.off : int(h.off)+n]
		if uintptr(unsafe.Pointer(&region[0]))%uintptr(h.dt.Size()) != 0 {
			// Elements not aligned to their size cannot take the CPU's
			// atomics; every atomic on them comes here (origins send no
			// NIC atomic to them), so a lock makes them atomic.
			w.unalignedMu.Lock()
			defer w.unalignedMu.Unlock()
		}
		return applyElems(h, region, data)
	}
	return amBadType, nil
}

// elemSpan checks an accumulate or compare-and-swap message and returns
// how many bytes of the target's memory it updates, or why it is refused.
func elemSpan(h *amHdr, data []byte) (int, byte) {
	sz := h.dt.Size()
	switch {
	case sz == 0, h.kind == amAcc && check(h.op, h.dt, len(data)) != nil, h.kind == amCAS && len(data) != 2*sz:
		return 0, amBadType
	case h.kind == amCAS:
		return sz, amOK
	}
	return len(data), amOK
}

// applyElems applies an accumulate or compare-and-swap message (checked
// by elemSpan) to mem, its bytes of the target's memory, and returns the
// status and the old values asked for. Unaligned elements are the
// caller's to make atomic.
func applyElems(h *amHdr, mem, data []byte) (byte, []byte) {
	if h.kind == amCAS {
		sz := h.dt.Size()
		out := make([]byte, sz)
		storeElem(out, compareSwap(h.dt, mem, loadElem(data[:sz]), loadElem(data[sz:])))
		return amOK, out
	}
	var old []byte
	if h.fetch {
		old = make([]byte, len(mem))
	}
	applyAtomic(h.op, h.dt, mem, data, old)
	return amOK, old
}

// fits reports whether [off, off+n) lies within size bytes, without
// overflowing on hostile offsets.
func fits(off uint64, n, size int) bool {
	return n >= 0 && off <= uint64(size) && uint64(n) <= uint64(size)-off
}

func loadElem(b []byte) uint64 {
	switch len(b) {
	case 1:
		return uint64(b[0])
	case 2:
		return uint64(binary.LittleEndian.Uint16(b))
	case 4:
		return uint64(binary.LittleEndian.Uint32(b))
	}
	return binary.LittleEndian.Uint64(b)
}

func storeElem(b []byte, v uint64) {
	switch len(b) {
	case 1:
		b[0] = byte(v)
	case 2:
		binary.LittleEndian.PutUint16(b, uint16(v))
	case 4:
		binary.LittleEndian.PutUint32(b, uint32(v))
	default:
		binary.LittleEndian.PutUint64(b, v)
	}
}

// handleAMReply completes the origin's request (in the poller).
func (c *Comm) handleAMReply(b []byte) {
	if len(b) < 16 {
		return
	}
	id, status, result := binary.LittleEndian.Uint64(b), b[8], b[16:]
	var call *amCall
	var err error
	c.eng.Locked(func() {
		if call = c.msg.am[id]; call == nil {
			return
		}
		c.msg.dropAM(call)
		switch status {
		case amOK:
			copy(call.result, result)
		case amBounds:
			err = fmt.Errorf("%w (checked at the target)", ErrOutOfBounds)
		case amNoWin:
			err = fmt.Errorf("%w: the target has no such window", ErrClosed)
		default:
			err = fmt.Errorf("%w: refused by the target", ErrDatatype)
		}
		c.eng.FinishLocked(call.req.op, err)
	})
	if call != nil && call.after != nil {
		call.after(err)
	}
}

// putPacked sends a strided put with small target blocks as one message
// that the target unpacks.
func (w *Win) putPacked(ctx context.Context, origin []byte, ol Layout, target, off int, tl Layout) (*Request, error) {
	packed := make([]byte, 0, tl.Size())
	for i := range ol.Count {
		packed = append(packed, origin[i*ol.Stride:i*ol.Stride+ol.Block]...)
	}
	return w.am(ctx, "put", target, amHdr{kind: amPacked, off: uint64(off), layout: tl}, nil, packed)
}

// gatherMax is the largest get that travels gathered (see getGathered):
// its reply is one message, held whole at both ends.
const gatherMax = 1 << 20

// getGathered gets a strided target layout of small blocks into a
// contiguous origin as one message the target answers with the blocks
// packed, rather than a READ per block (a column of a matrix is a
// thousand READs of 4 bytes). The reply lands in origin directly.
func (w *Win) getGathered(ctx context.Context, origin []byte, target, off int, tl Layout) (*Request, error) {
	return w.am(ctx, "get", target, amHdr{kind: amGather, off: uint64(off), layout: tl}, origin[:tl.Size()])
}

// Raccumulate starts an accumulate: target[disp...] = op(target, origin),
// element by element, each element atomically. Accumulates from one
// origin to one target are applied in the order they were issued (MPI's
// default accumulate ordering).
func (w *Win) Raccumulate(ctx context.Context, origin []byte, dt Datatype, op Op, target, disp int) (*Request, error) {
	return w.orDone(w.accumulate(ctx, "accumulate", origin, nil, dt, op, target, disp))
}

// Accumulate is Raccumulate completing at the next synchronisation.
func (w *Win) Accumulate(ctx context.Context, origin []byte, dt Datatype, op Op, target, disp int) error {
	_, err := w.accumulate(ctx, "accumulate", origin, nil, dt, op, target, disp)
	return err
}

// RgetAccumulate is Raccumulate that also returns the previous target
// values in result (same length as origin; with NoOp, origin's values are
// ignored and only its length counts).
func (w *Win) RgetAccumulate(ctx context.Context, origin, result []byte, dt Datatype, op Op, target, disp int) (*Request, error) {
	return w.orDone(w.getAccumulate(ctx, origin, result, dt, op, target, disp))
}

// GetAccumulate is RgetAccumulate; result is valid after the next
// synchronisation.
func (w *Win) GetAccumulate(ctx context.Context, origin, result []byte, dt Datatype, op Op, target, disp int) error {
	_, err := w.getAccumulate(ctx, origin, result, dt, op, target, disp)
	return err
}

func (w *Win) getAccumulate(ctx context.Context, origin, result []byte, dt Datatype, op Op, target, disp int) (*Request, error) {
	if len(result) != len(origin) {
		return nil, opErr("get_accumulate", target, fmt.Errorf("%w: result of %d bytes for %d", ErrDatatype, len(result), len(origin)))
	}
	return w.accumulate(ctx, "get_accumulate", origin, result, dt, op, target, disp)
}

func (w *Win) accumulate(ctx context.Context, name string, origin, result []byte, dt Datatype, op Op, target, disp int) (*Request, error) {
	if err := w.access(name, target, false); err != nil {
		return nil, err
	}
	if err := check(op, dt, len(origin)); err != nil {
		return nil, opErr(name, target, err)
	}
	off, err := w.span(name, target, disp, len(origin))
	if err != nil {
		return nil, err
	}
	if len(origin) == 0 {
		return nil, nil
	}
	if mem := w.directAtomic(ctx, target, off, len(origin), dt.Size()); mem != nil {
		// A window of this host: the CPU's atomics, element by element,
		// as the target's engine would apply them (see direct.go).
		applyAtomic(op, dt, mem, origin, result)
		return nil, nil
	}
	if result == nil && op == Sum && (dt == Int64 || dt == Uint64) && len(origin) == 8 && w.nicAtomicOK(target, off) {
		// One 8-byte sum, the counter update PGAS codes make: the NIC's
		// fetch-and-add with no result wanted (a CPU atomic on shared
		// memory), ordered with the active messages as FetchAndOp is.
		qp, err := w.c.conn(ctx, target)
		if err != nil {
			return nil, err
		}
		return w.postOps(name, qp, target, []verbs.SendWR{{Opcode: verbs.OpFetchAdd, Flags: verbs.FlagSignaled,
			RemoteAddr: w.remote[target].addr + uint64(off), RKey: w.remote[target].rkey,
			CompareAdd: binary.LittleEndian.Uint64(origin)}}, w.nicOut)
	}
	return w.am(ctx, name, target, amHdr{kind: amAcc, op: op, dt: dt, fetch: result != nil, off: uint64(off)}, result, origin)
}

// FetchAndOp applies op to one element at target and returns the previous
// value in result; result is valid after the next synchronisation (or use
// RfetchAndOp). Into a window of this host from Allocate (shm) it is a
// CPU atomic made by this rank; elsewhere Sum and NoOp on 8-byte integers
// at 8-byte-aligned displacements are the NIC's fetch-and-add, and the
// rest are active messages. All are atomic with respect to each other.
func (w *Win) FetchAndOp(ctx context.Context, origin, result []byte, dt Datatype, op Op, target, disp int) error {
	_, err := w.fetchAndOp(ctx, origin, result, dt, op, target, disp)
	return err
}

// RfetchAndOp is FetchAndOp returning a request.
func (w *Win) RfetchAndOp(ctx context.Context, origin, result []byte, dt Datatype, op Op, target, disp int) (*Request, error) {
	return w.orDone(w.fetchAndOp(ctx, origin, result, dt, op, target, disp))
}

func (w *Win) fetchAndOp(ctx context.Context, origin, result []byte, dt Datatype, op Op, target, disp int) (*Request, error) {
	const name = "fetch_and_op"
	sz := dt.Size()
	if len(origin) != sz || len(result) != sz {
		return nil, opErr(name, target, fmt.Errorf("%w: one %v element expected", ErrDatatype, dt))
	}
	if (dt == Int64 || dt == Uint64) && (op == Sum || op == NoOp) {
		if err := w.access(name, target, false); err != nil {
			return nil, err
		}
		off, err := w.span(name, target, disp, 8)
		if err != nil {
			return nil, err
		}
		if mem := w.directAtomic(ctx, target, off, 8, 8); mem != nil {
			applyAtomic(op, dt, mem, origin, result)
			return nil, nil
		}
		if w.nicAtomicOK(target, off) {
			add := binary.LittleEndian.Uint64(origin)
			if op == NoOp {
				add = 0
			}
			return w.nicAtomic(ctx, name, target, verbs.OpFetchAdd, w.remote[target].addr+uint64(off), w.remote[target].rkey, add, 0, result)
		}
	}
	return w.accumulate(ctx, name, origin, result, dt, op, target, disp)
}

// CompareAndSwap replaces the element at target with origin if it equals
// compare, and returns the previous value in result.
func (w *Win) CompareAndSwap(ctx context.Context, origin, compare, result []byte, dt Datatype, target, disp int) error {
	_, err := w.compareAndSwap(ctx, origin, compare, result, dt, target, disp)
	return err
}

// RcompareAndSwap is CompareAndSwap returning a request.
func (w *Win) RcompareAndSwap(ctx context.Context, origin, compare, result []byte, dt Datatype, target, disp int) (*Request, error) {
	return w.orDone(w.compareAndSwap(ctx, origin, compare, result, dt, target, disp))
}

func (w *Win) compareAndSwap(ctx context.Context, origin, compare, result []byte, dt Datatype, target, disp int) (*Request, error) {
	const name = "compare_and_swap"
	sz := dt.Size()
	if sz == 0 || len(origin) != sz || len(compare) != sz || len(result) != sz {
		return nil, opErr(name, target, fmt.Errorf("%w: one %v element expected", ErrDatatype, dt))
	}
	if err := w.access(name, target, false); err != nil {
		return nil, err
	}
	off, err := w.span(name, target, disp, sz)
	if err != nil {
		return nil, err
	}
	if mem := w.directAtomic(ctx, target, off, sz, sz); mem != nil {
		storeElem(result, compareSwap(dt, mem, loadElem(compare), loadElem(origin)))
		return nil, nil
	}
	if sz == 8 && w.nicAtomicOK(target, off) {
		return w.nicAtomic(ctx, name, target, verbs.OpCompareSwap, w.remote[target].addr+uint64(off), w.remote[target].rkey,
			binary.LittleEndian.Uint64(compare), binary.LittleEndian.Uint64(origin), result)
	}
	return w.am(ctx, name, target, amHdr{kind: amCAS, dt: dt, off: uint64(off)}, result, compare, origin)
}

// nicAtomicOK reports whether an 8-byte atomic at byte offset off of
// target's window may be the NIC's: the word is aligned in the target's
// memory (else only the target's progress engine can apply it atomically),
// and no accumulate active message to target is in flight, which the NIC
// atomic would overtake (MPI orders all accumulate functions from one
// origin to one target; the active messages apply in order, later).
func (w *Win) nicAtomicOK(target, off int) bool {
	rw := &w.remote[target]
	if (rw.addr+uint64(off))%8 != 0 || (uint64(rw.misalign)+uint64(off))%8 != 0 {
		return false
	}
	return w.amOut[target].Load() == 0
}

// nicAtomic posts a verbs atomic whose previous value lands in result.
func (w *Win) nicAtomic(ctx context.Context, name string, target int, opc verbs.Opcode, raddr uint64, rkey uint32, cmpAdd, swap uint64, result []byte) (*Request, error) {
	qp, err := w.c.conn(ctx, target)
	if err != nil {
		return nil, err
	}
	w.c.reg.hold()
	defer w.c.reg.release() // after the post
	sge, err := w.c.reg.sge(result)
	if err != nil {
		return nil, opErr(name, target, err)
	}
	// On the stack: verbs copies a request at post.
	sgl := [1]verbs.SGE{sge}
	wr := [1]verbs.SendWR{{Opcode: opc, Flags: verbs.FlagSignaled, SGL: sgl[:], RemoteAddr: raddr, RKey: rkey, CompareAdd: cmpAdd, Swap: swap}}
	return w.postOps(name, qp, target, wr[:], w.nicOut)
}
