package main

/*
#define RVMA_TYPES_ONLY
#include "rvma.h"
*/
import "C"

import (
	"context"
	"sync"
	"unsafe"

	"github.com/rvma/rvma/rma"
)

// probeOut fills a probe's out arguments (each may be NULL).
func probeOut(e rma.Envelope, source, mtag *C.int, n *C.size_t) {
	if source != nil {
		*source = C.int(e.Source)
	}
	if mtag != nil {
		*mtag = C.int(e.Tag)
	}
	if n != nil {
		*n = C.size_t(e.Len)
	}
}

// probeArgs checks a probe's arguments: matchArgs' without a buffer.
func probeArgs(fn string, h C.rvma_comm, src, tag, mask C.int) (*rma.Comm, rma.Match, error) {
	var n C.size_t // the length is an out argument here, and optional
	c, x, _, err := matchArgs(fn, h, src, tag, mask, nil, 0, &n)
	return c, x, err
}

//export rvma_probe_match
func rvma_probe_match(h C.rvma_comm, src, tag, mask C.int, source, mtag *C.int, n *C.size_t) C.int {
	c, x, err := probeArgs("rvma_probe_match", h, src, tag, mask)
	if err != nil {
		return fail(err)
	}
	e, err := c.ProbeMatch(bg, x)
	if err != nil {
		return fail(err)
	}
	probeOut(e, source, mtag, n)
	return codeOK
}

//export rvma_try_probe_match
func rvma_try_probe_match(h C.rvma_comm, src, tag, mask C.int, before C.uint64_t, source, mtag *C.int, n *C.size_t, flag *C.int) C.int {
	const fn = "rvma_try_probe_match"
	c, x, err := probeArgs(fn, h, src, tag, mask)
	if err == nil {
		err = outArg(fn, "flag", unsafe.Pointer(flag))
	}
	if err != nil {
		return fail(err)
	}
	x.Before = uint64(before)
	e, ok, err := c.TryProbeMatch(x)
	if err != nil {
		return fail(err)
	}
	*flag = boolInt(ok)
	if ok {
		probeOut(e, source, mtag, n)
	}
	return codeOK
}

// keyed holds the cancellable waits: those in progress by key, and the
// keys cancelled before their wait began (the caller, libmpi, decides
// under its own lock that a wait will start, then calls in without it,
// so a cancel may come first).
var keyed struct {
	mu      sync.Mutex
	waiting map[uint64]context.CancelFunc
	early   map[uint64]bool
}

// keyCtx returns the context of the wait named key, and the function that
// ends it; ok is false if key was cancelled already.
func keyCtx(key C.uint64_t) (ctx context.Context, end func(), ok bool) {
	keyed.mu.Lock()
	defer keyed.mu.Unlock()
	k := uint64(key)
	if keyed.early[k] {
		delete(keyed.early, k)
		return nil, nil, false
	}
	if keyed.waiting == nil {
		keyed.waiting, keyed.early = map[uint64]context.CancelFunc{}, map[uint64]bool{}
	}
	ctx, cancel := context.WithCancel(bg)
	keyed.waiting[k] = cancel
	return ctx, func() {
		keyed.mu.Lock()
		delete(keyed.waiting, k)
		keyed.mu.Unlock()
		cancel()
	}, true
}

func cancelled(fn string) C.int { return fail(errorf(codeCancelled, "%s: cancelled", fn)) }

//export rvma_recv_match_key
func rvma_recv_match_key(h C.rvma_comm, src, tag, mask C.int, buf unsafe.Pointer, capacity C.size_t, n *C.size_t, source, mtag *C.int, key C.uint64_t) C.int {
	const fn = "rvma_recv_match_key"
	c, x, b, err := matchArgs(fn, h, src, tag, mask, buf, capacity, n)
	if err == nil && key == 0 {
		err = errorf(codeArg, "%s: key 0", fn)
	}
	if err != nil {
		return fail(err)
	}
	ctx, end, ok := keyCtx(key)
	if !ok {
		return cancelled(fn)
	}
	defer end()
	m, err := c.RecvMatch(ctx, x)
	if err != nil {
		return fail(err)
	}
	return recvOut(fn, m, b, n, source, mtag)
}

//export rvma_msg_wait_key
func rvma_msg_wait_key(h C.rvma_comm, n, key C.uint64_t) C.int {
	const fn = "rvma_msg_wait_key"
	c, err := commOf(h)
	if err == nil && key == 0 {
		err = errorf(codeArg, "%s: key 0", fn)
	}
	if err != nil {
		return fail(err)
	}
	ctx, end, ok := keyCtx(key)
	if !ok {
		return cancelled(fn)
	}
	defer end()
	return result(c.WaitArrival(ctx, uint64(n)))
}

//export rvma_msg_cancel
func rvma_msg_cancel(h C.rvma_comm, key C.uint64_t) C.int {
	if _, err := commOf(h); err != nil {
		return fail(err)
	}
	if key == 0 {
		return fail(errorf(codeArg, "rvma_msg_cancel: key 0"))
	}
	keyed.mu.Lock()
	defer keyed.mu.Unlock()
	if cancel, ok := keyed.waiting[uint64(key)]; ok {
		cancel()
	} else {
		if keyed.early == nil {
			keyed.waiting, keyed.early = map[uint64]context.CancelFunc{}, map[uint64]bool{}
		}
		keyed.early[uint64(key)] = true
	}
	return codeOK
}
