package main

/*
#define RVMA_TYPES_ONLY
#include "rvma.h"
*/
import "C"

import (
	"context"
	"unsafe"

	"github.com/rvma/rvma/rma"
)

// mover is a window's data movement: rma.Win's, or a dynamic window's,
// whose displacements are addresses in the target's process.
type mover interface {
	Put(ctx context.Context, origin []byte, target, disp int) error
	PutLayout(ctx context.Context, origin []byte, ol rma.Layout, target, disp int, tl rma.Layout) error
	Rput(ctx context.Context, origin []byte, target, disp int) (*rma.Request, error)
	RputLayout(ctx context.Context, origin []byte, ol rma.Layout, target, disp int, tl rma.Layout) (*rma.Request, error)
	Get(ctx context.Context, origin []byte, target, disp int) error
	PutRuns(ctx context.Context, origin []byte, runs []rma.Run, target, disp int) error
	GetRuns(ctx context.Context, origin []byte, runs []rma.Run, target, disp int) error
	Rget(ctx context.Context, origin []byte, target, disp int) (*rma.Request, error)
	RgetLayout(ctx context.Context, origin []byte, ol rma.Layout, target, disp int, tl rma.Layout) (*rma.Request, error)
	Accumulate(ctx context.Context, origin []byte, dt rma.Datatype, op rma.Op, target, disp int) error
	Raccumulate(ctx context.Context, origin []byte, dt rma.Datatype, op rma.Op, target, disp int) (*rma.Request, error)
	GetAccumulate(ctx context.Context, origin, result []byte, dt rma.Datatype, op rma.Op, target, disp int) error
	RgetAccumulate(ctx context.Context, origin, result []byte, dt rma.Datatype, op rma.Op, target, disp int) (*rma.Request, error)
	FetchAndOp(ctx context.Context, origin, result []byte, dt rma.Datatype, op rma.Op, target, disp int) error
	RfetchAndOp(ctx context.Context, origin, result []byte, dt rma.Datatype, op rma.Op, target, disp int) (*rma.Request, error)
	CompareAndSwap(ctx context.Context, origin, compare, result []byte, dt rma.Datatype, target, disp int) error
	RcompareAndSwap(ctx context.Context, origin, compare, result []byte, dt rma.Datatype, target, disp int) (*rma.Request, error)
}

var (
	_ mover = (*rma.Win)(nil)
	_ mover = (*rma.DynWin)(nil)
)

// data is w's data movement.
func (w *window) data() mover {
	if w.dyn != nil {
		return w.dyn
	}
	return w.w
}

//export rvma_win_create_dynamic
func rvma_win_create_dynamic(h C.rvma_comm, out *C.rvma_win) C.int {
	c, err := commOf(h)
	if err != nil {
		return fail(err)
	}
	if err := outArg("rvma_win_create_dynamic", "win", unsafe.Pointer(out)); err != nil {
		return failCollective(c, err)
	}
	d, err := c.CreateDynamic(bg)
	if err != nil {
		return fail(err)
	}
	wh, ok := wins.add(&window{w: d.Win(), dyn: d, unit: 1})
	if !ok {
		d.Free(bg)
		return fail(errorf(codeResource, "rvma_win_create_dynamic: no window handle left"))
	}
	*out = C.rvma_win(wh)
	return codeOK
}

// dynOf is the dynamic window behind h.
func dynOf(fn string, h C.rvma_win) (*rma.DynWin, error) {
	w, err := winOf(h)
	if err != nil {
		return nil, err
	}
	if w.dyn == nil {
		return nil, errorf(codeArg, "%s: window %#x is not dynamic", fn, uint64(h))
	}
	return w.dyn, nil
}

//export rvma_win_attach
func rvma_win_attach(h C.rvma_win, base unsafe.Pointer, size C.size_t) C.int {
	const fn = "rvma_win_attach"
	d, err := dynOf(fn, h)
	if err != nil {
		return fail(err)
	}
	b, err := cbytes(fn, "base", base, size)
	if err != nil {
		return fail(err)
	}
	return result(d.Attach(b))
}

//export rvma_win_detach
func rvma_win_detach(h C.rvma_win, base unsafe.Pointer) C.int {
	d, err := dynOf("rvma_win_detach", h)
	if err != nil {
		return fail(err)
	}
	return result(d.Detach(bg, int(uintptr(base))))
}
