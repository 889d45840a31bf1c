package main

/*
#define RVMA_TYPES_ONLY
#include "rvma.h"
*/
import "C"

import (
	"unsafe"

	"github.com/rvma/rvma/rma"
)

var reqs = table[*rma.Request]{kind: kindRequest}

// request hands r to C as a handle in *out. Should the table be full, the
// operation is waited for here and the handle is null, which rvma.h
// allows (a completed operation): nothing is lost or left behind.
func request(r *rma.Request, err error, out *C.rvma_request) C.int {
	if err != nil {
		return fail(err)
	}
	h, ok := reqs.add(r)
	if !ok {
		*out = 0
		return result(r.Wait(bg))
	}
	*out = C.rvma_request(h)
	return codeOK
}

//export rvma_request_wait
func rvma_request_wait(req *C.rvma_request) C.int {
	if req == nil {
		return fail(errorf(codeArg, "rvma_request_wait: req is NULL"))
	}
	if *req == 0 {
		return codeOK
	}
	r, ok := reqs.remove(uint64(*req))
	if !ok {
		return fail(errorf(codeHandle, "rvma_request_wait: invalid request handle %#x", uint64(*req)))
	}
	*req = 0
	return result(r.Wait(bg))
}

//export rvma_request_test
func rvma_request_test(req *C.rvma_request, flag *C.int) C.int {
	if req == nil || flag == nil {
		return fail(errorf(codeArg, "rvma_request_test: req or flag is NULL"))
	}
	if *req == 0 {
		*flag = 1
		return codeOK
	}
	r, ok := reqs.get(uint64(*req))
	if !ok {
		return fail(errorf(codeHandle, "rvma_request_test: invalid request handle %#x", uint64(*req)))
	}
	done, err := r.Test()
	if !done {
		*flag = 0
		return codeOK
	}
	// Of two threads testing one request, one frees it; the other's
	// handle is then invalid, as MPI has it.
	if _, ok := reqs.remove(uint64(*req)); !ok {
		return fail(errorf(codeHandle, "rvma_request_test: request %#x freed meanwhile", uint64(*req)))
	}
	*req, *flag = 0, 1
	return result(err)
}

//export rvma_request_waitall
func rvma_request_waitall(n C.size_t, rs *C.rvma_request) C.int {
	if n == 0 {
		return codeOK
	}
	if rs == nil || uint64(n) > maxLen/8 {
		return fail(errorf(codeArg, "rvma_request_waitall: %d requests at %p", uint64(n), rs))
	}
	var first C.int
	s := unsafe.Slice(rs, int(n))
	for i := range s {
		if code := rvma_request_wait(&s[i]); code != codeOK && first == codeOK {
			first = code
		}
	}
	return first
}

// ---- Synchronisation ----

// group copies a C group of ranks (rma checks them).
func group(name string, g *C.int, n C.int) ([]int, error) {
	if n < 0 || (n > 0 && g == nil) {
		return nil, errorf(codeArg, "%s: group of %d ranks at %p", name, int(n), g)
	}
	out := make([]int, n)
	for i, r := range unsafe.Slice(g, int(n)) {
		out[i] = int(r)
	}
	return out, nil
}

//export rvma_win_fence
func rvma_win_fence(h C.rvma_win, assert C.int) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	return result(w.w.Fence(bg, int(assert)))
}

//export rvma_win_post
func rvma_win_post(h C.rvma_win, g *C.int, n C.int, assert C.int) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	ranks, err := group("rvma_win_post", g, n)
	if err != nil {
		return fail(err)
	}
	return result(w.w.Post(bg, ranks, int(assert)))
}

//export rvma_win_start
func rvma_win_start(h C.rvma_win, g *C.int, n C.int, assert C.int) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	ranks, err := group("rvma_win_start", g, n)
	if err != nil {
		return fail(err)
	}
	return result(w.w.Start(bg, ranks, int(assert)))
}

//export rvma_win_complete
func rvma_win_complete(h C.rvma_win) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	return result(w.w.Complete(bg))
}

//export rvma_win_wait
func rvma_win_wait(h C.rvma_win) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	return result(w.w.Wait(bg))
}

//export rvma_win_test
func rvma_win_test(h C.rvma_win, flag *C.int) C.int {
	w, err := winOf(h)
	if err == nil {
		err = outArg("rvma_win_test", "flag", unsafe.Pointer(flag))
	}
	if err != nil {
		return fail(err)
	}
	done, err := w.w.Test()
	if err != nil {
		return fail(err)
	}
	*flag = boolInt(done)
	return codeOK
}

//export rvma_win_lock
func rvma_win_lock(h C.rvma_win, lockType, target C.int) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	var lt rma.LockType
	switch lockType {
	case C.RVMA_LOCK_EXCLUSIVE:
		lt = rma.LockExclusive
	case C.RVMA_LOCK_SHARED:
		lt = rma.LockShared
	default:
		return fail(errorf(codeArg, "rvma_win_lock: lock type %d is neither RVMA_LOCK_SHARED nor RVMA_LOCK_EXCLUSIVE", int(lockType)))
	}
	return result(w.w.Lock(bg, lt, rankArg(target)))
}

//export rvma_win_unlock
func rvma_win_unlock(h C.rvma_win, target C.int) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	return result(w.w.Unlock(bg, rankArg(target)))
}

//export rvma_win_lock_all
func rvma_win_lock_all(h C.rvma_win) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	return result(w.w.LockAll(bg))
}

//export rvma_win_unlock_all
func rvma_win_unlock_all(h C.rvma_win) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	return result(w.w.UnlockAll(bg))
}

//export rvma_win_flush
func rvma_win_flush(h C.rvma_win, target C.int) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	if err := w.w.Flush(bg, rankArg(target)); err != nil {
		return fail(err)
	}
	return codeOK
}

//export rvma_win_flush_all
func rvma_win_flush_all(h C.rvma_win) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	return result(w.w.FlushAll(bg))
}

//export rvma_win_flush_local
func rvma_win_flush_local(h C.rvma_win, target C.int) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	return result(w.w.FlushLocal(bg, rankArg(target)))
}

//export rvma_win_flush_local_all
func rvma_win_flush_local_all(h C.rvma_win) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	return result(w.w.FlushLocalAll(bg))
}

//export rvma_win_sync
func rvma_win_sync(h C.rvma_win) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	w.w.Sync()
	return codeOK
}

// ---- Notified windows ----

//export rvma_win_wait_epoch
func rvma_win_wait_epoch(h C.rvma_win, epoch *C.uint64_t) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	e, err := w.w.WaitEpoch(bg)
	if err != nil {
		return fail(err)
	}
	if epoch != nil {
		*epoch = C.uint64_t(e)
	}
	return codeOK
}

//export rvma_win_test_epoch
func rvma_win_test_epoch(h C.rvma_win, flag *C.int, epoch *C.uint64_t) C.int {
	w, err := winOf(h)
	if err == nil {
		err = outArg("rvma_win_test_epoch", "flag", unsafe.Pointer(flag))
	}
	if err != nil {
		return fail(err)
	}
	e, done, err := w.w.TestEpoch()
	if err != nil {
		return fail(err)
	}
	*flag = boolInt(done)
	if done && epoch != nil {
		*epoch = C.uint64_t(e)
	}
	return codeOK
}

//export rvma_win_epoch
func rvma_win_epoch(h C.rvma_win, epoch *C.uint64_t) C.int {
	w, err := winOf(h)
	if err == nil {
		err = outArg("rvma_win_epoch", "epoch", unsafe.Pointer(epoch))
	}
	if err != nil {
		return fail(err)
	}
	*epoch = C.uint64_t(w.w.Epoch())
	return codeOK
}

//export rvma_win_abandon_epoch
func rvma_win_abandon_epoch(h C.rvma_win) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	return result(w.w.AbandonEpoch())
}

//export rvma_win_rewind
func rvma_win_rewind(h C.rvma_win, k C.int, epoch *C.uint64_t) C.int {
	w, err := winOf(h)
	if err != nil {
		return fail(err)
	}
	e, err := w.w.Rewind(int(k))
	if err != nil {
		return fail(err)
	}
	if epoch != nil {
		*epoch = C.uint64_t(e)
	}
	return codeOK
}
