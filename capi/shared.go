package main

/*
#define RVMA_TYPES_ONLY
#include "rvma.h"
*/
import "C"

import (
	"encoding/binary"
	"math"
	"unsafe"

	"github.com/rvma/rvma/rma"
)

// A shared window is MPI_Win_allocate_shared's: the ranks' parts are one
// block, contiguous in rank order as MPI's default asks (programs index
// past their own part), which each rank loads and stores directly. Rank
// 0 allocates the block as an ordinary rma window (the holder; the
// others' parts of it are empty) in shared device memory, every other
// rank maps it (rma.Win.Shared), and each creates the window proper over
// its own part of the block, as caller memory: puts, gets and atomics
// reach the same bytes the stores do. Only ranks of one host over shm
// can do this; elsewhere the call fails on every rank with
// RVMA_ERR_UNSUPPORTED, never with memory that is not shared.

//export rvma_win_allocate_shared
func rvma_win_allocate_shared(h C.rvma_comm, size C.size_t, unit C.int, base *unsafe.Pointer, out *C.rvma_win) C.int {
	const fn = "rvma_win_allocate_shared"
	c, err := commOf(h)
	if err != nil {
		return fail(err)
	}
	err = outArg(fn, "win", unsafe.Pointer(out))
	if err == nil {
		err = outArg(fn, "base", unsafe.Pointer(base))
	}
	if err == nil && (uint64(size) > maxLen || unit < 0) {
		err = errorf(codeArg, "%s: size %d, disp_unit %d", fn, uint64(size), int(unit))
	}
	// Every rank learns every size and whether every rank allocates
	// shared memory, in one step, before anything is allocated; a rank
	// whose arguments are bad says so (size -1), so all fail together.
	mine := make([]byte, 16)
	binary.LittleEndian.PutUint64(mine, uint64(size))
	if err != nil {
		binary.LittleEndian.PutUint64(mine, math.MaxUint64)
	}
	if sharedAlloc(c) {
		mine[8] = 1
	}
	all, gerr := c.Allgather(bg, mine)
	if err != nil {
		return fail(err)
	}
	if gerr != nil {
		return fail(gerr)
	}
	offs := make([]int, c.Size()+1)
	for r, b := range all {
		n := binary.LittleEndian.Uint64(b)
		switch {
		case n == math.MaxUint64:
			return fail(errorf(codeRemote, "%s: rank %d's arguments were refused", fn, r))
		case b[8] == 0:
			return fail(errorf(codeUnsupported, "%s: rank %d has no shared memory (its provider is not shm): "+
				"the ranks must be on one host, over shm; rvma_win_allocate shares memory where it can", fn, r))
		case n > maxLen-uint64(offs[r]):
			return fail(errorf(codeArg, "%s: the parts of %d ranks add up to more than the address space", fn, r+1))
		}
		offs[r+1] = offs[r] + int(n)
	}
	cfg := &rma.WinConfig{DispUnit: int(unit)}
	win := &window{unit: max(int(unit), 1), offs: offs}
	total, me := offs[c.Size()], c.Rank()
	if total > 0 {
		n := 0 // the others' parts of the holder are empty
		if me == 0 {
			n = total
		}
		if win.holder, err = c.Allocate(bg, n, nil); err != nil {
			return fail(err)
		}
		win.all, err = win.holder.Shared(bg, 0)
		// Every rank must have mapped the block before any uses it.
		ok := []int64{1}
		if err != nil {
			ok[0] = 0
		}
		if aerr := c.AllreduceInt64(bg, rma.ReduceMin, ok); aerr != nil || ok[0] == 0 {
			win.holder.Free(bg)
			switch {
			case err != nil:
				return fail(errorf(codeUnsupported, "%s: rank 0's memory: %v", fn, err))
			case aerr != nil:
				return fail(aerr)
			}
			return fail(errorf(codeUnsupported, "%s: another rank cannot map rank 0's memory: "+
				"the ranks must be on one host, over shm", fn))
		}
	}
	part := win.all[offs[me]:offs[me+1]:offs[me+1]]
	if win.w, err = c.Create(bg, part, cfg); err != nil {
		if win.holder != nil {
			win.holder.Free(bg)
		}
		return fail(err)
	}
	win.mem = part
	wh, ok := wins.add(win)
	if !ok {
		win.w.Free(bg)
		if win.holder != nil {
			win.holder.Free(bg)
		}
		return fail(errorf(codeResource, "%s: no window handle left", fn))
	}
	*base = win.at(me)
	*out = C.rvma_win(wh)
	return codeOK
}

// at is where rank r's part of shared window w starts (also when it is
// empty: MPI's base of an empty part), NULL if every part is; computed
// rather than sliced, since a slice at the block's end may point
// anywhere.
func (w *window) at(r int) unsafe.Pointer {
	if len(w.all) == 0 {
		return nil
	}
	return unsafe.Add(unsafe.Pointer(unsafe.SliceData(w.all)), w.offs[r])
}

//export rvma_win_shared_query
func rvma_win_shared_query(h C.rvma_win, rank C.int, size *C.size_t, base *unsafe.Pointer) C.int {
	const fn = "rvma_win_shared_query"
	w, err := winOf(h)
	if err == nil {
		err = outArg(fn, "size", unsafe.Pointer(size))
	}
	if err == nil {
		err = outArg(fn, "base", unsafe.Pointer(base))
	}
	if err != nil {
		return fail(err)
	}
	if w.offs != nil {
		if rank < 0 || int(rank) >= len(w.offs)-1 {
			return fail(errorf(codeRank, "%s: rank %d of %d", fn, int(rank), len(w.offs)-1))
		}
		*size, *base = C.size_t(w.offs[rank+1]-w.offs[rank]), w.at(int(rank))
		return codeOK
	}
	// Any other window: a rank's part where the provider maps it here
	// (this rank's own is what rvma_win_get_info gives).
	b, err := w.w.Shared(bg, int(rank))
	if err != nil {
		return fail(err)
	}
	*size, *base = C.size_t(len(b)), nil
	if len(b) > 0 {
		*base = unsafe.Pointer(unsafe.SliceData(b))
	}
	return codeOK
}
