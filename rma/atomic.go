package rma

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/rvma/rvma/verbs"
)

func atomicAdd(p *uint64, v uint64) uint64 { return atomic.AddUint64(p, v) }

// Active messages carry what the target must compute: accumulates,
// fetch-and-op and compare-and-swap on other than 8-byte integers, and
// packed strided puts. The target's progress engine applies them in
// arrival order, each element atomically, and replies; the reply is the
// operation's completion.
const (
	amAcc    = 1 // accumulate, optionally fetching the old values
	amCAS    = 2 // compare-and-swap of one element
	amPacked = 3 // a packed strided put, unpacked at the target

	amHdrLen = 40

	amOK         = 0
	amBounds     = 1
	amNoWin      = 2
	amBadType    = 3
	amMisaligned = 4
	amRefused    = 5
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

func (h *amHdr) encode(data ...[]byte) []byte {
	n := amHdrLen
	for _, d := range data {
		n += len(d)
	}
	b := make([]byte, amHdrLen, n)
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
	for _, d := range data {
		b = append(b, d...)
	}
	return b
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
	req    *Request
	result []byte
}

// am sends an active message to target and returns the request its reply
// completes.
func (w *Win) am(ctx context.Context, name string, target int, h amHdr, result []byte, data ...[]byte) (*Request, error) {
	c := w.c
	op, _ := w.track(0, target)
	req := &Request{op: op, name: name, rank: target}
	c.eng.Locked(func() {
		c.msg.nextAM++
		h.id = c.msg.nextAM
		c.msg.am[h.id] = &amCall{req: req, result: result}
	})
	h.win = w.id
	id := h.id
	fail := func(err error) {
		if call := c.msg.am[id]; call != nil {
			delete(c.msg.am, id)
			c.eng.FinishLocked(op, err)
		}
	}
	_, err := c.sendMsg(ctx, target, kindAM, 0, h.encode(data...), func(err error) {
		if err != nil {
			fail(err)
		}
	})
	if err != nil {
		c.eng.Locked(func() { fail(err) })
		return nil, opErr(name, target, err)
	}
	return req, nil
}

// handleAM runs an active message at the target (in the poller).
func (c *Comm) handleAM(src int, b []byte) {
	h, data, ok := decodeAM(b)
	if !ok {
		c.cfg.Logger.Warn("rma: short active message", "rank", c.rank, "src", src)
		return
	}
	c.winMu.Lock()
	w := c.wins[h.win]
	c.winMu.Unlock()
	status, result := byte(amOK), []byte(nil)
	switch {
	case w == nil:
		status = amNoWin
	default:
		status, result = w.apply(src, &h, data)
	}
	reply := make([]byte, 16, 16+len(result))
	binary.LittleEndian.PutUint64(reply, h.id)
	reply[8] = status
	reply = append(reply, result...)
	c.sendMsg(context.Background(), src, kindAMReply, 0, reply, nil)
}

// apply executes an active message from rank src on the local window
// memory.
func (w *Win) apply(src int, h *amHdr, data []byte) (byte, []byte) {
	mem := w.mem
	switch h.kind {
	case amPacked:
		l := h.layout
		if l.Count < 0 || l.Block < 0 || l.Size() != len(data) || !fits(h.off, l.Extent(), len(mem)) {
			return amBounds, nil
		}
		if n := w.notify; n != nil {
			// A notified window places and counts through its mailboxes,
			// block by block, exactly as if each block were a put.
			box := mailboxOf(w.id, src)
			if n.mode == notifyAggregate {
				box = mailboxOf(w.id, -1)
			}
			for i := range l.Count {
				m := verbs.MailboxWrite{Mailbox: box, Offset: h.off + uint64(i*l.Stride), MsgLen: uint32(l.Block),
					First: true, Last: true, Payload: data[i*l.Block : (i+1)*l.Block], Transport: verbs.RC}
				if w.c.target.HandleMailboxWrite(&m) != verbs.MailboxAccepted {
					return amRefused, nil
				}
			}
			return amOK, nil
		}
		for i := range l.Count {
			o := int(h.off) + i*l.Stride
			copy(mem[o:o+l.Block], data[i*l.Block:])
		}
		return amOK, nil
	case amAcc, amCAS:
		if check(h.op, h.dt, len(data)) != nil && h.kind == amAcc {
			return amBadType, nil
		}
		sz := h.dt.Size()
		if sz == 0 {
			return amBadType, nil
		}
		n := len(data)
		if h.kind == amCAS {
			n = sz
			if len(data) != 2*sz {
				return amBadType, nil
			}
		}
		if n == 0 {
			return amOK, nil
		}
		if !fits(h.off, n, len(mem)) {
			return amBounds, nil
		}
		region := mem[h.off : int(h.off)+n]
		if uintptr(unsafe.Pointer(&region[0]))%uintptr(sz) != 0 {
			return amMisaligned, nil
		}
		if h.kind == amCAS {
			cmp, swp := loadElem(data[:sz]), loadElem(data[sz:])
			old := compareSwap(h.dt, region, cmp, swp)
			out := make([]byte, sz)
			storeElem(out, old)
			return amOK, out
		}
		var old []byte
		if h.fetch {
			old = make([]byte, n)
		}
		applyAtomic(h.op, h.dt, region, data, old)
		return amOK, old
	}
	return amBadType, nil
}

// fits reports whether [off, off+n) lies within size bytes, without
// overflowing on hostile offsets.
func fits(off uint64, n, size int) bool {
	return n >= 0 && off <= uint64(size) && uint64(n) <= uint64(size)-off
}

func loadElem(b []byte) uint64 {
	if len(b) == 4 {
		return uint64(binary.LittleEndian.Uint32(b))
	}
	return binary.LittleEndian.Uint64(b)
}

func storeElem(b []byte, v uint64) {
	if len(b) == 4 {
		binary.LittleEndian.PutUint32(b, uint32(v))
		return
	}
	binary.LittleEndian.PutUint64(b, v)
}

// handleAMReply completes the origin's request (in the poller).
func (c *Comm) handleAMReply(b []byte) {
	if len(b) < 16 {
		return
	}
	id, status, result := binary.LittleEndian.Uint64(b), b[8], b[16:]
	c.eng.Locked(func() {
		call := c.msg.am[id]
		if call == nil {
			return
		}
		delete(c.msg.am, id)
		var err error
		switch status {
		case amOK:
			copy(call.result, result)
		case amBounds:
			err = fmt.Errorf("%w (checked at the target)", ErrOutOfBounds)
		case amNoWin:
			err = fmt.Errorf("%w: the target has no such window", ErrClosed)
		case amRefused:
			err = fmt.Errorf("%w: the target's mailbox refused a block (no buffer posted, or past its end)", ErrSync)
		case amMisaligned:
			err = fmt.Errorf("%w: target memory not aligned to the element size", ErrDatatype)
		default:
			err = ErrDatatype
		}
		c.eng.FinishLocked(call.req.op, err)
	})
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

// Raccumulate starts an accumulate: target[disp...] = op(target, origin),
// element by element, each element atomically. Accumulates from one
// origin to one target are applied in the order they were issued (MPI's
// default accumulate ordering).
func (w *Win) Raccumulate(ctx context.Context, origin []byte, dt Datatype, op Op, target, disp int) (*Request, error) {
	return w.accumulate(ctx, "accumulate", origin, nil, dt, op, target, disp)
}

// Accumulate is Raccumulate completing at the next synchronisation.
func (w *Win) Accumulate(ctx context.Context, origin []byte, dt Datatype, op Op, target, disp int) error {
	_, err := w.Raccumulate(ctx, origin, dt, op, target, disp)
	return err
}

// RgetAccumulate is Raccumulate that also returns the previous target
// values in result (same length as origin; with NoOp, origin's values are
// ignored and only its length counts).
func (w *Win) RgetAccumulate(ctx context.Context, origin, result []byte, dt Datatype, op Op, target, disp int) (*Request, error) {
	if len(result) != len(origin) {
		return nil, opErr("get_accumulate", target, fmt.Errorf("%w: result of %d bytes for %d", ErrDatatype, len(result), len(origin)))
	}
	return w.accumulate(ctx, "get_accumulate", origin, result, dt, op, target, disp)
}

// GetAccumulate is RgetAccumulate; result is valid after the next
// synchronisation.
func (w *Win) GetAccumulate(ctx context.Context, origin, result []byte, dt Datatype, op Op, target, disp int) error {
	_, err := w.RgetAccumulate(ctx, origin, result, dt, op, target, disp)
	return err
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
	return w.am(ctx, name, target, amHdr{kind: amAcc, op: op, dt: dt, fetch: result != nil, off: uint64(off)}, result, origin)
}

// FetchAndOp applies op to one element at target and returns the previous
// value in result; result is valid after the next synchronisation (or use
// RfetchAndOp). Sum and NoOp on 8-byte integers at 8-byte-aligned
// displacements are the NIC's fetch-and-add; the rest are active messages.
// Both are atomic with respect to each other.
func (w *Win) FetchAndOp(ctx context.Context, origin, result []byte, dt Datatype, op Op, target, disp int) error {
	_, err := w.RfetchAndOp(ctx, origin, result, dt, op, target, disp)
	return err
}

// RfetchAndOp is FetchAndOp returning a request.
func (w *Win) RfetchAndOp(ctx context.Context, origin, result []byte, dt Datatype, op Op, target, disp int) (*Request, error) {
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
		if off%8 == 0 {
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
	_, err := w.RcompareAndSwap(ctx, origin, compare, result, dt, target, disp)
	return err
}

// RcompareAndSwap is CompareAndSwap returning a request.
func (w *Win) RcompareAndSwap(ctx context.Context, origin, compare, result []byte, dt Datatype, target, disp int) (*Request, error) {
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
	if sz == 8 && off%8 == 0 {
		return w.nicAtomic(ctx, name, target, verbs.OpCompareSwap, w.remote[target].addr+uint64(off), w.remote[target].rkey,
			binary.LittleEndian.Uint64(compare), binary.LittleEndian.Uint64(origin), result)
	}
	return w.am(ctx, name, target, amHdr{kind: amCAS, dt: dt, off: uint64(off)}, result, compare, origin)
}

// nicAtomic posts a verbs atomic whose previous value lands in result.
func (w *Win) nicAtomic(ctx context.Context, name string, target int, opc verbs.Opcode, raddr uint64, rkey uint32, cmpAdd, swap uint64, result []byte) (*Request, error) {
	qp, err := w.c.conn(ctx, target)
	if err != nil {
		return nil, err
	}
	sge, err := w.c.reg.sge(result)
	if err != nil {
		return nil, opErr(name, target, err)
	}
	return w.postOps(name, qp, target, []verbs.SendWR{{Opcode: opc, Flags: verbs.FlagSignaled, SGL: []verbs.SGE{sge},
		RemoteAddr: raddr, RKey: rkey, CompareAdd: cmpAdd, Swap: swap}})
}
