package main

/*
#define RVMA_TYPES_ONLY
#include "rvma.h"
#include "helpers.h"
*/
import "C"

import (
	"errors"
	"sync"
	"unsafe"

	"github.com/rvma/rvma/rma"
)

var (
	comms    = table[*rma.Comm]{kind: kindComm}
	stateMu  sync.Mutex // serialises init and finalize
	world    *rma.Comm
	self     *rma.Comm // rvma_comm_self's, once made
	selfH    C.rvma_comm
	finished bool
)

func commOf(h C.rvma_comm) (*rma.Comm, error) {
	c, ok := comms.get(uint64(h))
	if !ok {
		return nil, errorf(codeHandle, "invalid communicator handle %#x", uint64(h))
	}
	return c, nil
}

//export rvma_init
func rvma_init(out *C.rvma_comm) C.int {
	if out == nil {
		return fail(errorf(codeArg, "rvma_init: world is NULL"))
	}
	stateMu.Lock()
	defer stateMu.Unlock()
	if world != nil || finished {
		return fail(errorf(codeState, "rvma_init: called already"))
	}
	c, err := rma.Init(bg, nil)
	if err != nil {
		return fail(err)
	}
	h, ok := comms.add(c)
	if !ok {
		c.Close(bg)
		return fail(errorf(codeResource, "rvma_init: no communicator handle left"))
	}
	world = c
	*out = C.rvma_comm(h)
	return codeOK
}

//export rvma_finalize
func rvma_finalize() C.int {
	stateMu.Lock()
	defer stateMu.Unlock()
	if world == nil {
		return fail(errorf(codeState, "rvma_finalize: not initialized"))
	}
	// Handles go first, so that a call racing with finalize fails cleanly.
	reqs.drain()
	ws := wins.drain()
	comms.drain()
	err := world.Close(bg)
	if self != nil {
		err = errors.Join(err, self.Close(bg))
		self, selfH = nil, 0
	}
	// Memory this library allocated for windows outlives the device's
	// accesses to it: Close has torn the device down.
	for _, w := range ws {
		w.freeMem()
	}
	world, finished = nil, true
	return result(err)
}

//export rvma_comm_self
func rvma_comm_self(out *C.rvma_comm) C.int {
	if out == nil {
		return fail(errorf(codeArg, "rvma_comm_self: self is NULL"))
	}
	stateMu.Lock()
	defer stateMu.Unlock()
	if world == nil {
		return fail(errorf(codeState, "rvma_comm_self: not initialized"))
	}
	if self == nil {
		// A world of one in this process: nothing to bootstrap, and every
		// window call works on it as on the world. Over shm where there
		// is one, so that its windows' memory may be C's (sharedAlloc)
		// and shared windows can be made.
		cs, err := rma.NewWorld(bg, 1, &rma.Config{Provider: "shm"})
		if err != nil {
			cs, err = rma.NewWorld(bg, 1, nil)
		}
		if err != nil {
			return fail(err)
		}
		h, ok := comms.add(cs[0])
		if !ok {
			cs[0].Close(bg)
			return fail(errorf(codeResource, "rvma_comm_self: no communicator handle left"))
		}
		self, selfH = cs[0], C.rvma_comm(h)
	}
	*out = selfH
	return codeOK
}

//export rvma_initialized
func rvma_initialized(flag *C.int) C.int {
	if flag == nil {
		return fail(errorf(codeArg, "rvma_initialized: flag is NULL"))
	}
	stateMu.Lock()
	defer stateMu.Unlock()
	*flag = boolInt(world != nil || finished)
	return codeOK
}

//export rvma_finalized
func rvma_finalized(flag *C.int) C.int {
	if flag == nil {
		return fail(errorf(codeArg, "rvma_finalized: flag is NULL"))
	}
	stateMu.Lock()
	defer stateMu.Unlock()
	*flag = boolInt(finished)
	return codeOK
}

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

//export rvma_comm_rank
func rvma_comm_rank(h C.rvma_comm, rank *C.int) C.int {
	c, err := commOf(h)
	if err == nil {
		err = outArg("rvma_comm_rank", "rank", unsafe.Pointer(rank))
	}
	if err != nil {
		return fail(err)
	}
	*rank = C.int(c.Rank())
	return codeOK
}

//export rvma_comm_size
func rvma_comm_size(h C.rvma_comm, size *C.int) C.int {
	c, err := commOf(h)
	if err == nil {
		err = outArg("rvma_comm_size", "size", unsafe.Pointer(size))
	}
	if err != nil {
		return fail(err)
	}
	*size = C.int(c.Size())
	return codeOK
}

//export rvma_comm_transport
func rvma_comm_transport(h C.rvma_comm, rank C.int, name **C.char) C.int {
	c, err := commOf(h)
	if err == nil {
		err = outArg("rvma_comm_transport", "name", unsafe.Pointer(name))
	}
	if err == nil && (rank < 0 || int(rank) >= c.Size()) {
		err = errorf(codeRank, "rvma_comm_transport: rank %d of %d", int(rank), c.Size())
	}
	if err != nil {
		return fail(err)
	}
	// C's static strings: a Go string's bytes may not be kept by C.
	i := 0
	switch c.Transport(int(rank)) {
	case "shm":
		i = 1
	case "udp":
		i = 2
	case "loop":
		i = 3
	}
	*name = C.rvma__transport_name(C.int(i))
	return codeOK
}

//export rvma_barrier
func rvma_barrier(h C.rvma_comm) C.int {
	c, err := commOf(h)
	if err != nil {
		return fail(err)
	}
	return result(c.Barrier(bg))
}

//export rvma_bcast
func rvma_bcast(h C.rvma_comm, root C.int, buf unsafe.Pointer, n C.size_t) C.int {
	c, err := commOf(h)
	if err != nil {
		return fail(err)
	}
	b, err := cbytes("rvma_bcast", "buf", buf, n)
	if err != nil {
		return fail(err)
	}
	return result(c.Bcast(bg, int(root), b))
}

//export rvma_allgather
func rvma_allgather(h C.rvma_comm, mine unsafe.Pointer, n C.size_t, out unsafe.Pointer) C.int {
	c, err := commOf(h)
	if err != nil {
		return fail(err)
	}
	in, err := cbytes("rvma_allgather", "mine", mine, n)
	if err != nil {
		return fail(err)
	}
	if uint64(n) > maxLen/uint64(c.Size()) {
		return fail(errorf(codeArg, "rvma_allgather: %d bytes from %d ranks do not fit the address space", uint64(n), c.Size()))
	}
	dst, err := cbytes("rvma_allgather", "out", out, n*C.size_t(c.Size()))
	if err != nil {
		return fail(err)
	}
	all, err := c.Allgather(bg, in)
	if err != nil {
		return fail(err)
	}
	for r, b := range all {
		if len(b) != len(in) {
			return fail(errorf(codeDatatype, "rvma_allgather: rank %d gave %d bytes, this rank %d", r, len(b), len(in)))
		}
	}
	for r, b := range all {
		copy(dst[r*len(in):], b)
	}
	return codeOK
}

func reduceOp(op C.rvma_op) (rma.ReduceOp, error) {
	switch op {
	case C.RVMA_SUM:
		return rma.ReduceSum, nil
	case C.RVMA_MIN:
		return rma.ReduceMin, nil
	case C.RVMA_MAX:
		return rma.ReduceMax, nil
	case C.RVMA_PROD, C.RVMA_BAND, C.RVMA_BOR, C.RVMA_BXOR, C.RVMA_REPLACE, C.RVMA_NO_OP:
		return 0, errorf(codeUnsupported, "allreduce: operation %d is not a reduction rvma implements (sum, min, max)", int(op))
	}
	return 0, errorf(codeArg, "allreduce: unknown operation %d", int(op))
}

//export rvma_allreduce_int64
func rvma_allreduce_int64(h C.rvma_comm, op C.rvma_op, vals *C.int64_t, count C.size_t) C.int {
	c, rop, v, err := allreduceArgs[int64]("rvma_allreduce_int64", h, op, unsafe.Pointer(vals), count)
	if err != nil {
		return fail(err)
	}
	return result(c.AllreduceInt64(bg, rop, v))
}

//export rvma_allreduce_double
func rvma_allreduce_double(h C.rvma_comm, op C.rvma_op, vals *C.double, count C.size_t) C.int {
	c, rop, v, err := allreduceArgs[float64]("rvma_allreduce_double", h, op, unsafe.Pointer(vals), count)
	if err != nil {
		return fail(err)
	}
	return result(c.AllreduceFloat64(bg, rop, v))
}

// allreduceArgs checks an allreduce's arguments and views the C array as
// count elements of T (8 bytes each).
func allreduceArgs[T int64 | float64](name string, h C.rvma_comm, op C.rvma_op, vals unsafe.Pointer, count C.size_t) (*rma.Comm, rma.ReduceOp, []T, error) {
	c, err := commOf(h)
	if err != nil {
		return nil, 0, nil, err
	}
	rop, err := reduceOp(op)
	if err != nil {
		return nil, 0, nil, err
	}
	b, err := elems(name, "vals", vals, count, 8)
	if err != nil || len(b) == 0 {
		return c, rop, nil, err
	}
	return c, rop, unsafe.Slice((*T)(vals), int(count)), nil
}

func checkTag(what string, tag C.int) error {
	if tag < 0 || tag > C.RVMA_TAG_UB {
		return errorf(codeArg, "%s: tag %d outside 0..%d", what, int(tag), C.RVMA_TAG_UB)
	}
	return nil
}

//export rvma_send
func rvma_send(h C.rvma_comm, dst, tag C.int, buf unsafe.Pointer, n C.size_t) C.int {
	c, err := commOf(h)
	if err == nil {
		err = checkTag("rvma_send", tag)
	}
	var b []byte
	if err == nil {
		b, err = cbytes("rvma_send", "buf", buf, n)
	}
	if err != nil {
		return fail(err)
	}
	return result(c.Send(bg, int(dst), int(tag), b))
}

//export rvma_isend
func rvma_isend(h C.rvma_comm, dst, tag C.int, buf unsafe.Pointer, n C.size_t, req *C.rvma_request) C.int {
	c, err := commOf(h)
	if err == nil {
		err = checkTag("rvma_isend", tag)
	}
	if err == nil {
		err = outArg("rvma_isend", "req", unsafe.Pointer(req))
	}
	var b []byte
	if err == nil {
		b, err = cbytes("rvma_isend", "buf", buf, n)
	}
	if err != nil {
		return fail(err)
	}
	r, err := c.Isend(bg, int(dst), int(tag), b)
	return request(r, err, req)
}

//export rvma_recv
func rvma_recv(h C.rvma_comm, src, tag C.int, buf unsafe.Pointer, capacity C.size_t, n *C.size_t) C.int {
	c, err := commOf(h)
	if err == nil {
		err = checkTag("rvma_recv", tag)
	}
	if err == nil {
		err = outArg("rvma_recv", "len", unsafe.Pointer(n))
	}
	var b []byte
	if err == nil {
		b, err = cbytes("rvma_recv", "buf", buf, capacity)
	}
	if err != nil {
		return fail(err)
	}
	m, err := c.Recv(bg, int(src), int(tag))
	if err != nil {
		return fail(err)
	}
	copy(b, m)
	*n = C.size_t(len(m))
	if len(m) > len(b) {
		return fail(errorf(codeTruncate, "rvma_recv: a message of %d bytes from rank %d into %d", len(m), int(src), len(b)))
	}
	return codeOK
}

// recvOut copies a matched message into buf and the out arguments, as
// rvma_recv does.
func recvOut(fn string, m rma.Message, b []byte, n *C.size_t, source, mtag *C.int) C.int {
	copy(b, m.Data)
	*n = C.size_t(len(m.Data))
	if source != nil {
		*source = C.int(m.Source)
	}
	if mtag != nil {
		*mtag = C.int(m.Tag)
	}
	if len(m.Data) > len(b) {
		return fail(errorf(codeTruncate, "%s: a message of %d bytes from rank %d into %d", fn, len(m.Data), m.Source, len(b)))
	}
	return codeOK
}

// matchArgs checks the arguments common to the matching receives.
func matchArgs(fn string, h C.rvma_comm, src, tag, mask C.int, buf unsafe.Pointer, capacity C.size_t, n *C.size_t) (*rma.Comm, rma.Match, []byte, error) {
	c, err := commOf(h)
	if err == nil {
		err = checkTag(fn, tag)
	}
	if err == nil && src != C.RVMA_ANY_SOURCE && (src < 0 || int(src) >= c.Size()) {
		err = errorf(codeRank, "%s: source %d of %d ranks", fn, int(src), c.Size())
	}
	if err == nil {
		err = outArg(fn, "len", unsafe.Pointer(n))
	}
	var b []byte
	if err == nil {
		b, err = cbytes(fn, "buf", buf, capacity)
	}
	x := rma.Match{Source: int(src), Tag: int(tag), Mask: uint32(mask)}
	if src == C.RVMA_ANY_SOURCE {
		x.Source = rma.AnySource
	}
	return c, x, b, err
}

//export rvma_recv_match
func rvma_recv_match(h C.rvma_comm, src, tag, mask C.int, buf unsafe.Pointer, capacity C.size_t, n *C.size_t, source, mtag *C.int) C.int {
	const fn = "rvma_recv_match"
	c, x, b, err := matchArgs(fn, h, src, tag, mask, buf, capacity, n)
	if err != nil {
		return fail(err)
	}
	m, err := c.RecvMatch(bg, x)
	if err != nil {
		return fail(err)
	}
	return recvOut(fn, m, b, n, source, mtag)
}

//export rvma_try_recv_match
func rvma_try_recv_match(h C.rvma_comm, src, tag, mask C.int, before C.uint64_t, buf unsafe.Pointer, capacity C.size_t, n *C.size_t, source, mtag, flag *C.int) C.int {
	const fn = "rvma_try_recv_match"
	c, x, b, err := matchArgs(fn, h, src, tag, mask, buf, capacity, n)
	if err == nil {
		err = outArg(fn, "flag", unsafe.Pointer(flag))
	}
	if err != nil {
		return fail(err)
	}
	x.Before = uint64(before)
	m, ok, err := c.TryRecvMatch(x)
	if err != nil {
		return fail(err)
	}
	*flag = 0
	if !ok {
		return codeOK
	}
	*flag = 1
	return recvOut(fn, m, b, n, source, mtag)
}

//export rvma_msg_arrived
func rvma_msg_arrived(h C.rvma_comm, next *C.uint64_t) C.int {
	c, err := commOf(h)
	if err == nil {
		err = outArg("rvma_msg_arrived", "next", unsafe.Pointer(next))
	}
	if err != nil {
		return fail(err)
	}
	*next = C.uint64_t(c.Arrived())
	return codeOK
}

//export rvma_msg_wait
func rvma_msg_wait(h C.rvma_comm, n C.uint64_t) C.int {
	c, err := commOf(h)
	if err != nil {
		return fail(err)
	}
	return result(c.WaitArrival(bg, uint64(n)))
}
