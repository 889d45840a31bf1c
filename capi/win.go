package main

/*
#define RVMA_TYPES_ONLY
#include "rvma.h"
#include "helpers.h"
*/
import "C"

import (
	"cmp"
	"math"
	"unsafe"

	"github.com/rvma/rvma/mailbox"
	"github.com/rvma/rvma/rma"
	"github.com/rvma/rvma/verbs"
)

// window is what a window handle stands for.
type window struct {
	w    *rma.Win
	mem  []byte         // this rank's part: the caller's, shared or C memory
	cmem unsafe.Pointer // memory rvma__alloc gave for it, freed after the window
	unit int
	// A shared window (shared.go): every rank's part in one block that
	// rank 0's window holds (freed after this one), mapped here as all;
	// rank r's part is all[offs[r]:offs[r+1]].
	holder *rma.Win
	all    []byte
	offs   []int
	// A dynamic window (dynamic.go): its data movement; w synchronises.
	dyn *rma.DynWin
}

func (w *window) freeMem() {
	if w.cmem != nil {
		C.rvma__free(w.cmem)
		w.cmem = nil
	}
}

var wins = table[*window]{kind: kindWin}

func winOf(h C.rvma_win) (*window, error) {
	w, ok := wins.get(uint64(h))
	if !ok {
		return nil, errorf(codeHandle, "invalid window handle %#x", uint64(h))
	}
	return w, nil
}

// sharedAlloc reports whether rma.Allocate gives c's windows shared memory
// (mapped from the host's shm allocator, not Go's heap): the device has an
// shm port, whose allocator verbs.PD.AllocMR uses. Only such memory may
// be handed to C; elsewhere Allocate's memory is Go's.
func sharedAlloc(c *rma.Comm) bool {
	dev := c.Device()
	for i := range dev.GIDs() {
		if dev.Provider(i) == verbs.ProviderSHM {
			return true
		}
	}
	return false
}

// failCollective makes a window creation that failed this layer's checks
// fail on every rank, as one that rma refuses does, rather than leave the
// other ranks waiting: a negative size is refused by rma in the collective
// step.
func failCollective(c *rma.Comm, err error) C.int {
	c.Allocate(bg, -1, nil)
	return fail(err)
}

// notifyConfig converts a C notify configuration (read during the call
// only: its arrays are the caller's).
func notifyConfig(nc *C.rvma_notify_config) (*rma.NotifyConfig, error) {
	if nc == nil {
		return nil, errorf(codeArg, "notify configuration is NULL")
	}
	cfg := &rma.NotifyConfig{Depth: int(nc.depth), History: int(nc.history)}
	switch nc.count {
	case C.RVMA_COUNT_BYTES:
		cfg.Count = mailbox.CountBytes
	case C.RVMA_COUNT_OPS:
		cfg.Count = mailbox.CountOps
	default:
		return nil, errorf(codeArg, "notify configuration: count %d is neither RVMA_COUNT_BYTES nor RVMA_COUNT_OPS", int(nc.count))
	}
	n := int(nc.nexpect_from)
	switch {
	case n < 0:
		return nil, errorf(codeArg, "notify configuration: nexpect_from %d", n)
	case n == 0:
		if nc.expect < 1 || nc.expect > math.MaxInt32 {
			return nil, errorf(codeArg, "notify configuration: expect %d, want 1..2^31-1", int64(nc.expect))
		}
		cfg.Expect = int(nc.expect)
		return cfg, nil
	case nc.expect_from_ranks == nil || nc.expect_from_counts == nil:
		return nil, errorf(codeArg, "notify configuration: expect_from arrays are NULL with nexpect_from %d", n)
	}
	ranks := unsafe.Slice(nc.expect_from_ranks, n)
	counts := unsafe.Slice(nc.expect_from_counts, n)
	cfg.ExpectFrom = make(map[int]int, n)
	for i := range n {
		r, k := int(ranks[i]), int64(counts[i])
		if _, dup := cfg.ExpectFrom[r]; dup {
			return nil, errorf(codeArg, "notify configuration: rank %d listed twice", r)
		}
		if k < 1 || k > math.MaxInt32 {
			return nil, errorf(codeArg, "notify configuration: expectation %d from rank %d, want 1..2^31-1", k, r)
		}
		cfg.ExpectFrom[r] = int(k)
	}
	return cfg, nil
}

// newWin creates a window (collectively) and its handle. With mem nil and
// alloc set, the library allocates size bytes.
func newWin(name string, h C.rvma_comm, alloc bool, base unsafe.Pointer, size C.size_t, unit C.int,
	nc *C.rvma_notify_config, notified bool, baseOut *unsafe.Pointer, out *C.rvma_win) C.int {
	c, err := commOf(h)
	if err != nil {
		return fail(err) // no communicator to fail collectively on
	}
	var cfg rma.WinConfig
	cfg.DispUnit = int(unit)
	if err == nil && notified {
		cfg.Notify, err = notifyConfig(nc)
	}
	if err == nil {
		err = outArg(name, "win", unsafe.Pointer(out))
	}
	var mem []byte
	if err == nil && !alloc {
		mem, err = cbytes(name, "base", base, size)
	}
	if err == nil && (uint64(size) > maxLen || unit < 0) {
		err = errorf(codeArg, "%s: size %d, disp_unit %d", name, uint64(size), int(unit))
	}
	if err != nil {
		return failCollective(c, err)
	}
	win := &window{unit: max(int(unit), 1)}
	switch {
	case !alloc:
		win.w, err = c.Create(bg, mem, &cfg)
	case size == 0 || sharedAlloc(c):
		win.w, err = c.Allocate(bg, sizeArg(size), &cfg)
	default:
		// No shared memory (the udp provider): Allocate's memory would
		// be Go's, which C may not keep. C's, over Create, is the same
		// to the peers, who reach it through the NIC either way.
		win.cmem = C.rvma__alloc(size)
		if win.cmem == nil {
			return failCollective(c, errorf(codeResource, "%s: cannot allocate %d bytes", name, uint64(size)))
		}
		win.w, err = c.Create(bg, unsafe.Slice((*byte)(win.cmem), int(size)), &cfg)
	}
	if err != nil {
		win.freeMem()
		return fail(err)
	}
	win.mem = win.w.Bytes()
	wh, ok := wins.add(win)
	if !ok {
		win.w.Free(bg) // collective, as the caller's next rvma_win_free would be
		win.freeMem()
		return fail(errorf(codeResource, "%s: no window handle left", name))
	}
	if baseOut != nil {
		*baseOut = unsafe.Pointer(unsafe.SliceData(win.mem))
	}
	*out = C.rvma_win(wh)
	return codeOK
}

//export rvma_win_allocate
func rvma_win_allocate(h C.rvma_comm, size C.size_t, unit C.int, base *unsafe.Pointer, out *C.rvma_win) C.int {
	return newWin("rvma_win_allocate", h, true, nil, size, unit, nil, false, base, out)
}

//export rvma_win_create
func rvma_win_create(h C.rvma_comm, base unsafe.Pointer, size C.size_t, unit C.int, out *C.rvma_win) C.int {
	return newWin("rvma_win_create", h, false, base, size, unit, nil, false, nil, out)
}

//export rvma_win_allocate_notified
func rvma_win_allocate_notified(h C.rvma_comm, size C.size_t, unit C.int, nc *C.rvma_notify_config, base *unsafe.Pointer, out *C.rvma_win) C.int {
	return newWin("rvma_win_allocate_notified", h, true, nil, size, unit, nc, true, base, out)
}

//export rvma_win_create_notified
func rvma_win_create_notified(h C.rvma_comm, base unsafe.Pointer, size C.size_t, unit C.int, nc *C.rvma_notify_config, out *C.rvma_win) C.int {
	return newWin("rvma_win_create_notified", h, false, base, size, unit, nc, true, nil, out)
}

//export rvma_win_free
func rvma_win_free(h *C.rvma_win) C.int {
	if h == nil {
		return fail(errorf(codeArg, "rvma_win_free: win is NULL"))
	}
	w, ok := wins.remove(uint64(*h))
	if !ok {
		return fail(errorf(codeHandle, "rvma_win_free: invalid window handle %#x", uint64(*h)))
	}
	*h = 0
	var err error
	if w.dyn != nil {
		err = w.dyn.Free(bg)
	} else {
		err = w.w.Free(bg)
	}
	if w.holder != nil {
		// Collective too, and after the window over its memory.
		err = cmp.Or(err, w.holder.Free(bg))
	}
	w.freeMem()
	return result(err)
}

//export rvma_win_get_info
func rvma_win_get_info(h C.rvma_win, base *unsafe.Pointer, size *C.size_t, unit *C.int) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	if base != nil {
		*base = unsafe.Pointer(unsafe.SliceData(w.mem))
	}
	if size != nil {
		*size = C.size_t(len(w.mem))
	}
	if unit != nil {
		*unit = C.int(w.unit)
	}
	return codeOK
}

// ---- Data movement ----

// layout converts a C layout and returns the bytes it spans.
func layout(fn, arg string, l *C.rvma_layout) (rma.Layout, C.size_t, error) {
	if l == nil {
		return rma.Layout{}, 0, errorf(codeArg, "%s: %s is NULL", fn, arg)
	}
	count, block, stride := int64(l.count), int64(l.block), int64(l.stride)
	if count < 0 || block < 0 || stride < 0 || (count > 1 && stride < block) {
		return rma.Layout{}, 0, errorf(codeDatatype, "%s: %s {count %d, block %d, stride %d}: negative, or overlapping itself",
			fn, arg, count, block, stride)
	}
	var extent uint64
	if count > 0 {
		if stride > 0 && uint64(count-1) > (maxLen-uint64(block))/uint64(stride) || uint64(block) > maxLen {
			return rma.Layout{}, 0, errorf(codeArg, "%s: %s {count %d, block %d, stride %d} spans more than the address space",
				fn, arg, count, block, stride)
		}
		extent = uint64(count-1)*uint64(stride) + uint64(block)
	}
	return rma.Layout{Count: int(count), Block: int(block), Stride: int(stride)}, C.size_t(extent), nil
}

// strided converts the arguments of a strided put or get: the origin
// slice spans the origin layout.
func strided(name string, origin unsafe.Pointer, ol, tl *C.rvma_layout) ([]byte, rma.Layout, rma.Layout, error) {
	o, ext, err := layout(name, "origin layout", ol)
	if err != nil {
		return nil, o, o, err
	}
	t, _, err := layout(name, "target layout", tl)
	if err != nil {
		return nil, o, t, err
	}
	b, err := cbytes(name, "origin", origin, ext)
	return b, o, t, err
}

//export rvma_put
func rvma_put(h C.rvma_win, origin unsafe.Pointer, n C.size_t, target C.int, d C.int64_t) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	b, err := cbytes("rvma_put", "origin", origin, n)
	if err != nil {
		return fail(err)
	}
	if err := w.data().Put(bg, b, rankArg(target), disp(d)); err != nil {
		return fail(err)
	}
	return codeOK
}

//export rvma_get
func rvma_get(h C.rvma_win, origin unsafe.Pointer, n C.size_t, target C.int, d C.int64_t) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	b, err := cbytes("rvma_get", "origin", origin, n)
	if err != nil {
		return fail(err)
	}
	return result(w.data().Get(bg, b, rankArg(target), disp(d)))
}

//export rvma_put_strided
func rvma_put_strided(h C.rvma_win, origin unsafe.Pointer, ol *C.rvma_layout, target C.int, d C.int64_t, tl *C.rvma_layout) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	b, o, t, err := strided("rvma_put_strided", origin, ol, tl)
	if err != nil {
		return fail(err)
	}
	return result(w.data().PutLayout(bg, b, o, rankArg(target), disp(d), t))
}

//export rvma_get_strided
func rvma_get_strided(h C.rvma_win, origin unsafe.Pointer, ol *C.rvma_layout, target C.int, d C.int64_t, tl *C.rvma_layout) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	b, o, t, err := strided("rvma_get_strided", origin, ol, tl)
	if err != nil {
		return fail(err)
	}
	_, err = w.data().RgetLayout(bg, b, o, rankArg(target), disp(d), t)
	return result(err)
}

// runsArgs converts the runs of an indexed transfer: the origin slice
// spans them all (from the lowest origin offset, which may be negative,
// to the highest end), and the runs are rebased onto it.
func runsArgs(name string, origin unsafe.Pointer, runs *C.rvma_run, count C.size_t) ([]byte, []rma.Run, error) {
	if count == 0 {
		return nil, nil, nil
	}
	if runs == nil {
		return nil, nil, errorf(codeArg, "%s: runs is NULL with count %d", name, uint64(count))
	}
	if uint64(count) > maxLen/uint64(unsafe.Sizeof(C.rvma_run{})) {
		return nil, nil, errorf(codeArg, "%s: count %d does not fit the address space", name, uint64(count))
	}
	cr := unsafe.Slice(runs, int(count))
	lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
	for i, r := range cr {
		o, n := int64(r.origin_off), int64(r.len)
		if n < 0 || uint64(n) > maxLen || o < -maxLen || o > maxLen {
			return nil, nil, errorf(codeArg, "%s: run %d {origin_off %d, len %d} out of range", name, i, o, n)
		}
		if n > 0 {
			lo, hi = min(lo, o), max(hi, o+n)
		}
	}
	rs := make([]rma.Run, 0, len(cr))
	if lo > hi { // no bytes
		return nil, rs, nil
	}
	if origin == nil {
		return nil, nil, errorf(codeArg, "%s: origin is NULL", name)
	}
	if lo < 0 && uint64(-lo) > uint64(uintptr(origin)) { // cbytes checks the top end
		return nil, nil, errorf(codeArg, "%s: runs from origin%+d to origin%+d do not fit the address space", name, lo, hi)
	}
	b, err := cbytes(name, "origin", unsafe.Add(origin, lo), C.size_t(hi-lo))
	if err != nil {
		return nil, nil, err
	}
	for _, r := range cr {
		if r.len > 0 {
			rs = append(rs, rma.Run{Origin: int(int64(r.origin_off) - lo), Target: int(r.target_off), Len: int(r.len)})
		}
	}
	return b, rs, nil
}

//export rvma_register_origin
func rvma_register_origin(h C.rvma_win, origin unsafe.Pointer, n C.size_t) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	b, err := cbytes("rvma_register_origin", "origin", origin, n)
	if err != nil {
		return fail(err)
	}
	return result(w.w.Register(b))
}

//export rvma_put_runs
func rvma_put_runs(h C.rvma_win, origin unsafe.Pointer, runs *C.rvma_run, count C.size_t, target C.int, d C.int64_t) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	b, rs, err := runsArgs("rvma_put_runs", origin, runs, count)
	if err != nil {
		return fail(err)
	}
	return result(w.data().PutRuns(bg, b, rs, rankArg(target), disp(d)))
}

//export rvma_get_runs
func rvma_get_runs(h C.rvma_win, origin unsafe.Pointer, runs *C.rvma_run, count C.size_t, target C.int, d C.int64_t) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	b, rs, err := runsArgs("rvma_get_runs", origin, runs, count)
	if err != nil {
		return fail(err)
	}
	return result(w.data().GetRuns(bg, b, rs, rankArg(target), disp(d)))
}

// dtype converts a datatype and returns its size.
func dtype(name string, dt C.rvma_datatype) (rma.Datatype, int, error) {
	d := rma.Datatype(dt)
	if dt < C.RVMA_INT32 || dt > C.RVMA_UINT16 || d.Size() == 0 {
		return 0, 0, errorf(codeArg, "%s: unknown datatype %d", name, int(dt))
	}
	return d, d.Size(), nil
}

// opArg converts an accumulate operation (rma's numbering is rvma.h's).
func opArg(name string, op C.rvma_op) (rma.Op, error) {
	if op < C.RVMA_SUM || op > C.RVMA_NO_OP {
		return 0, errorf(codeArg, "%s: unknown operation %d", name, int(op))
	}
	return rma.Op(op), nil
}

// accArgs converts the arguments common to the accumulates: origin may be
// NULL with NO_OP when it is not read (noOpOrigin), and then stands for
// zeros; result is NULL for accumulates that return nothing.
func accArgs(name string, origin, res unsafe.Pointer, count C.size_t, dt C.rvma_datatype, op C.rvma_op,
	fetch bool) (o, r []byte, d rma.Datatype, p rma.Op, err error) {
	if d, _, err = dtype(name, dt); err != nil {
		return
	}
	if p, err = opArg(name, op); err != nil {
		return
	}
	if origin == nil && fetch && p == rma.NoOp && count > 0 {
		if uint64(count) > maxLen/uint64(d.Size()) {
			err = errorf(codeArg, "%s: count %d does not fit the address space", name, uint64(count))
			return
		}
		// Zeros: rma sends the origin's bytes even when NO_OP ignores them.
		o = make([]byte, int(count)*d.Size())
	} else if o, err = elems(name, "origin", origin, count, d.Size()); err != nil {
		return
	}
	if fetch {
		r, err = elems(name, "result", res, count, d.Size())
	}
	return
}

//export rvma_accumulate
func rvma_accumulate(h C.rvma_win, origin unsafe.Pointer, count C.size_t, dt C.rvma_datatype, op C.rvma_op, target C.int, d C.int64_t) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	o, _, t, p, err := accArgs("rvma_accumulate", origin, nil, count, dt, op, false)
	if err != nil {
		return fail(err)
	}
	return result(w.data().Accumulate(bg, o, t, p, rankArg(target), disp(d)))
}

//export rvma_get_accumulate
func rvma_get_accumulate(h C.rvma_win, origin, res unsafe.Pointer, count C.size_t, dt C.rvma_datatype, op C.rvma_op, target C.int, d C.int64_t) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	o, r, t, p, err := accArgs("rvma_get_accumulate", origin, res, count, dt, op, true)
	if err != nil {
		return fail(err)
	}
	return result(w.data().GetAccumulate(bg, o, r, t, p, rankArg(target), disp(d)))
}

//export rvma_fetch_and_op
func rvma_fetch_and_op(h C.rvma_win, origin, res unsafe.Pointer, dt C.rvma_datatype, op C.rvma_op, target C.int, d C.int64_t) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	o, r, t, p, err := accArgs("rvma_fetch_and_op", origin, res, 1, dt, op, true)
	if err != nil {
		return fail(err)
	}
	if err := w.data().FetchAndOp(bg, o, r, t, p, rankArg(target), disp(d)); err != nil {
		return fail(err)
	}
	return codeOK
}

// casArgs converts compare-and-swap's buffers: one element each.
func casArgs(name string, origin, compare, res unsafe.Pointer, dt C.rvma_datatype) (o, c, r []byte, d rma.Datatype, err error) {
	if d, _, err = dtype(name, dt); err != nil {
		return
	}
	if o, err = elems(name, "origin", origin, 1, d.Size()); err != nil {
		return
	}
	if c, err = elems(name, "compare", compare, 1, d.Size()); err != nil {
		return
	}
	r, err = elems(name, "result", res, 1, d.Size())
	return
}

//export rvma_compare_and_swap
func rvma_compare_and_swap(h C.rvma_win, origin, compare, res unsafe.Pointer, dt C.rvma_datatype, target C.int, d C.int64_t) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	o, c, r, t, err := casArgs("rvma_compare_and_swap", origin, compare, res, dt)
	if err != nil {
		return fail(err)
	}
	return result(w.data().CompareAndSwap(bg, o, c, r, t, rankArg(target), disp(d)))
}

// ---- Request variants ----

//export rvma_rput
func rvma_rput(h C.rvma_win, origin unsafe.Pointer, n C.size_t, target C.int, d C.int64_t, req *C.rvma_request) C.int {
	w, err := winOf(h)
	if err == nil {
		err = outArg("rvma_rput", "req", unsafe.Pointer(req))
	}
	var b []byte
	if err == nil {
		b, err = cbytes("rvma_rput", "origin", origin, n)
	}
	if err != nil {
		return fail(err)
	}
	r, err := w.data().Rput(bg, b, rankArg(target), disp(d))
	return request(r, err, req)
}

//export rvma_rget
func rvma_rget(h C.rvma_win, origin unsafe.Pointer, n C.size_t, target C.int, d C.int64_t, req *C.rvma_request) C.int {
	w, err := winOf(h)
	if err == nil {
		err = outArg("rvma_rget", "req", unsafe.Pointer(req))
	}
	var b []byte
	if err == nil {
		b, err = cbytes("rvma_rget", "origin", origin, n)
	}
	if err != nil {
		return fail(err)
	}
	r, err := w.data().Rget(bg, b, rankArg(target), disp(d))
	return request(r, err, req)
}

//export rvma_rput_strided
func rvma_rput_strided(h C.rvma_win, origin unsafe.Pointer, ol *C.rvma_layout, target C.int, d C.int64_t, tl *C.rvma_layout, req *C.rvma_request) C.int {
	w, err := winOf(h)
	if err == nil {
		err = outArg("rvma_rput_strided", "req", unsafe.Pointer(req))
	}
	if err != nil {
		return fail(err)
	}
	b, o, t, err := strided("rvma_rput_strided", origin, ol, tl)
	if err != nil {
		return fail(err)
	}
	r, err := w.data().RputLayout(bg, b, o, rankArg(target), disp(d), t)
	return request(r, err, req)
}

//export rvma_rget_strided
func rvma_rget_strided(h C.rvma_win, origin unsafe.Pointer, ol *C.rvma_layout, target C.int, d C.int64_t, tl *C.rvma_layout, req *C.rvma_request) C.int {
	w, err := winOf(h)
	if err == nil {
		err = outArg("rvma_rget_strided", "req", unsafe.Pointer(req))
	}
	if err != nil {
		return fail(err)
	}
	b, o, t, err := strided("rvma_rget_strided", origin, ol, tl)
	if err != nil {
		return fail(err)
	}
	r, err := w.data().RgetLayout(bg, b, o, rankArg(target), disp(d), t)
	return request(r, err, req)
}

//export rvma_raccumulate
func rvma_raccumulate(h C.rvma_win, origin unsafe.Pointer, count C.size_t, dt C.rvma_datatype, op C.rvma_op, target C.int, d C.int64_t, req *C.rvma_request) C.int {
	w, err := winOf(h)
	if err == nil {
		err = outArg("rvma_raccumulate", "req", unsafe.Pointer(req))
	}
	if err != nil {
		return fail(err)
	}
	o, _, t, p, err := accArgs("rvma_raccumulate", origin, nil, count, dt, op, false)
	if err != nil {
		return fail(err)
	}
	r, err := w.data().Raccumulate(bg, o, t, p, rankArg(target), disp(d))
	return request(r, err, req)
}

//export rvma_rget_accumulate
func rvma_rget_accumulate(h C.rvma_win, origin, res unsafe.Pointer, count C.size_t, dt C.rvma_datatype, op C.rvma_op, target C.int, d C.int64_t, req *C.rvma_request) C.int {
	w, err := winOf(h)
	if err == nil {
		err = outArg("rvma_rget_accumulate", "req", unsafe.Pointer(req))
	}
	if err != nil {
		return fail(err)
	}
	o, r, t, p, err := accArgs("rvma_rget_accumulate", origin, res, count, dt, op, true)
	if err != nil {
		return fail(err)
	}
	rq, err := w.data().RgetAccumulate(bg, o, r, t, p, rankArg(target), disp(d))
	return request(rq, err, req)
}

//export rvma_rfetch_and_op
func rvma_rfetch_and_op(h C.rvma_win, origin, res unsafe.Pointer, dt C.rvma_datatype, op C.rvma_op, target C.int, d C.int64_t, req *C.rvma_request) C.int {
	w, err := winOf(h)
	if err == nil {
		err = outArg("rvma_rfetch_and_op", "req", unsafe.Pointer(req))
	}
	if err != nil {
		return fail(err)
	}
	o, r, t, p, err := accArgs("rvma_rfetch_and_op", origin, res, 1, dt, op, true)
	if err != nil {
		return fail(err)
	}
	rq, err := w.data().RfetchAndOp(bg, o, r, t, p, rankArg(target), disp(d))
	return request(rq, err, req)
}

//export rvma_rcompare_and_swap
func rvma_rcompare_and_swap(h C.rvma_win, origin, compare, res unsafe.Pointer, dt C.rvma_datatype, target C.int, d C.int64_t, req *C.rvma_request) C.int {
	w, err := winOf(h)
	if err == nil {
		err = outArg("rvma_rcompare_and_swap", "req", unsafe.Pointer(req))
	}
	if err != nil {
		return fail(err)
	}
	o, c, r, t, err := casArgs("rvma_rcompare_and_swap", origin, compare, res, dt)
	if err != nil {
		return fail(err)
	}
	rq, err := w.data().RcompareAndSwap(bg, o, c, r, t, rankArg(target), disp(d))
	return request(rq, err, req)
}
