// Command capi is librvma, the C API of package rma (include/rvma.h),
// built with
//
//	go build -buildmode=c-shared -o librvma.so ./capi
//	go build -buildmode=c-archive -o librvma.a ./capi
//
// (make lib builds both, with a pkg-config file). Each exported function
// checks its C arguments, turns handles into the rma values they stand
// for, and calls rma: the semantics are rma's (see its package
// documentation), this layer only translates.
//
// cgo's pointer rules hold throughout: C never holds a Go pointer (handles
// index tables here; window memory handed to C is shared memory or C's
// own), and Go keeps C pointers only where rvma.h says the caller keeps
// the memory alive (windows over caller memory, buffers of operations in
// flight).
package main

/*
#cgo CFLAGS: -I${SRCDIR}/include
#define RVMA_TYPES_ONLY
#include "rvma.h"
*/
import "C"

import (
	"context"
	"math"
	"unsafe"
)

func main() {}

// bg is the context of every call: rvma.h's calls block until done, as
// MPI's do (rma bounds what can hang: peers that die fail the wait).
var bg = context.Background()

// maxLen bounds a length from C: more than any address space holds, so a
// negative count cast to size_t is refused rather than made into a slice.
const maxLen = 1 << 47

// cbytes is the C buffer [p, p+n) as a slice (nil for n == 0), checked as
// far as it can be: not NULL with a length, not past the address space.
// fn and arg name the function and the argument in the message: they are
// passed apart so that a call that succeeds builds no string.
func cbytes(fn, arg string, p unsafe.Pointer, n C.size_t) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	if p == nil {
		return nil, errorf(codeArg, "%s: %s is NULL with length %d", fn, arg, uint64(n))
	}
	if uint64(n) > maxLen || uint64(uintptr(p))+uint64(n) < uint64(uintptr(p)) {
		return nil, errorf(codeArg, "%s: %s: length %d does not fit the address space", fn, arg, uint64(n))
	}
	return unsafe.Slice((*byte)(p), int(n)), nil
}

// elems is cbytes for count elements of size sz.
func elems(fn, arg string, p unsafe.Pointer, count C.size_t, sz int) ([]byte, error) {
	if uint64(count) > maxLen/uint64(sz) {
		return nil, errorf(codeArg, "%s: %s: count %d does not fit the address space", fn, arg, uint64(count))
	}
	return cbytes(fn, arg, p, count*C.size_t(sz))
}

// disp converts a displacement: rma refuses negative ones as out of
// bounds, so only the int conversion needs care (int is 64 bits on every
// platform cgo builds this for).
func disp(d C.int64_t) int { return int(d) }

// rankArg converts a rank; rma checks the range.
func rankArg(r C.int) int { return int(r) }

// outArg checks that an output pointer is usable.
func outArg(fn, arg string, p unsafe.Pointer) error {
	if p == nil {
		return errorf(codeArg, "%s: %s is NULL", fn, arg)
	}
	return nil
}

// sizeArg converts a byte size for rma, which refuses negative sizes:
// sizes too large for int become -1, refused the same way.
func sizeArg(n C.size_t) int {
	if uint64(n) > math.MaxInt64 {
		return -1
	}
	return int(n)
}
