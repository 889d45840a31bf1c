package rma

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync/atomic"
	"unsafe"
)

// Datatype is the element type of an accumulate or atomic operation.
type Datatype uint8

// Element types (little-endian in memory, as on every platform rvma runs
// on).
const (
	Int32 Datatype = iota + 1
	Int64
	Uint32
	Uint64
	Float32
	Float64
	Int8
	Uint8
	Int16
	Uint16
)

// Size returns the element size in bytes.
func (d Datatype) Size() int {
	switch d {
	case Int8, Uint8:
		return 1
	case Int16, Uint16:
		return 2
	case Int32, Uint32, Float32:
		return 4
	case Int64, Uint64, Float64:
		return 8
	}
	return 0
}

func (d Datatype) String() string {
	names := [...]string{"", "int32", "int64", "uint32", "uint64", "float32", "float64", "int8", "uint8", "int16", "uint16"}
	if int(d) < len(names) && d != 0 {
		return names[d]
	}
	return fmt.Sprintf("Datatype(%d)", uint8(d))
}

func (d Datatype) isFloat() bool { return d == Float32 || d == Float64 }

// Op is an accumulate operation, as MPI's predefined reduction operations.
type Op uint8

// Accumulate operations. Band, Bor and Bxor apply to integer types only.
const (
	Sum Op = iota + 1
	Prod
	Min
	Max
	Band
	Bor
	Bxor
	Replace
	NoOp
)

func (o Op) String() string {
	names := [...]string{"", "sum", "prod", "min", "max", "band", "bor", "bxor", "replace", "no_op"}
	if int(o) < len(names) && o != 0 {
		return names[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// check validates an (op, datatype) pair and a buffer length.
func check(op Op, dt Datatype, n int) error {
	sz := dt.Size()
	if sz == 0 {
		return fmt.Errorf("%w: unknown datatype %v", ErrDatatype, dt)
	}
	if op < Sum || op > NoOp {
		return fmt.Errorf("%w: unknown operation %v", ErrDatatype, op)
	}
	if dt.isFloat() && (op == Band || op == Bor || op == Bxor) {
		return fmt.Errorf("%w: %v does not apply to %v", ErrDatatype, op, dt)
	}
	if n%sz != 0 {
		return fmt.Errorf("%w: %d bytes is not a whole number of %v", ErrDatatype, n, dt)
	}
	return nil
}

// combine returns op(old, x) for one element held in the low bits.
func combine(op Op, dt Datatype, old, x uint64) uint64 {
	switch op {
	case Replace:
		return x
	case NoOp:
		return old
	case Band:
		return old & x
	case Bor:
		return old | x
	case Bxor:
		return old ^ x
	}
	switch dt {
	case Int8:
		return uint64(uint8(arith(op, int8(old), int8(x))))
	case Uint8:
		return uint64(arith(op, uint8(old), uint8(x)))
	case Int16:
		return uint64(uint16(arith(op, int16(old), int16(x))))
	case Uint16:
		return uint64(arith(op, uint16(old), uint16(x)))
	case Int32:
		a, b := int32(old), int32(x)
		return uint64(uint32(arith(op, a, b)))
	case Int64:
		return uint64(arith(op, int64(old), int64(x)))
	case Uint32:
		return uint64(arith(op, uint32(old), uint32(x)))
	case Uint64:
		return arith(op, old, x)
	case Float32:
		a, b := math.Float32frombits(uint32(old)), math.Float32frombits(uint32(x))
		return uint64(math.Float32bits(arith(op, a, b)))
	case Float64:
		return math.Float64bits(arith(op, math.Float64frombits(old), math.Float64frombits(x)))
	}
	return old
}

type number interface {
	~int8 | ~uint8 | ~int16 | ~uint16 | ~int32 | ~int64 | ~uint32 | ~uint64 | ~float32 | ~float64
}

func arith[T number](op Op, a, b T) T {
	switch op {
	case Sum:
		return a + b
	case Prod:
		return a * b
	case Min:
		return min(a, b)
	case Max:
		return max(a, b)
	}
	return a
}

// applyAtomic applies op element-wise to mem with origin's elements, each
// element atomically (a compare-and-swap loop), so that accumulates from
// several origins, and the verbs engine's own atomics on 8-byte elements,
// never interleave within an element. If old is not nil it receives the
// previous values. Memory not aligned to the element size is updated with
// plain loads and stores: the caller makes that atomic (a lock).
func applyAtomic(op Op, dt Datatype, mem, origin, old []byte) {
	sz := dt.Size()
	if wideAtomics && sz < 8 && len(origin) >= 32 && aligned(mem, sz) {
		// The 8-byte words inside mem take one compare-and-swap for all
		// their elements; the elements before and after them, one each.
		head := int(-uintptr(unsafe.Pointer(&mem[0])) & 7)
		end := head + (len(origin)-head)&^7
		applyEach(op, dt, mem[:head], origin[:head], sub(old, 0, head))
		applyWords(op, dt, mem[head:end], origin[head:end], sub(old, head, end))
		applyEach(op, dt, mem[end:], origin[end:], sub(old, end, len(origin)))
		return
	}
	applyEach(op, dt, mem, origin, old)
}

// wideAtomics: the CPU keeps an 8-byte atomic and narrower atomics on
// the bytes inside it coherent with each other (x86 does; the Arm
// architecture promises it only for accesses of one size), so elements
// narrower than 8 bytes may be updated 8 bytes at a time.
const wideAtomics = runtime.GOARCH == "amd64"

// sub is old[i:j], or nil if old is.
func sub(old []byte, i, j int) []byte {
	if old == nil {
		return nil
	}
	return old[i:j]
}

// applyWords is applyAtomic on whole 8-byte words (mem 8-aligned, its
// length a multiple of 8) of elements narrower than 8 bytes: each word's
// elements are combined together and the word swapped at once, so each
// element still changes atomically.
func applyWords(op Op, dt Datatype, mem, origin, old []byte) {
	sz := dt.Size()
	for i := 0; i < len(mem); i += 8 {
		w := (*uint64)(unsafe.Pointer(&mem[i]))
		x := binary.LittleEndian.Uint64(origin[i:])
		var o uint64
		switch op {
		case NoOp:
			o = atomic.LoadUint64(w)
		case Replace:
			o = atomic.SwapUint64(w, x)
		case Band:
			o = atomic.AndUint64(w, x)
		case Bor:
			o = atomic.OrUint64(w, x)
		default:
			for {
				o = atomic.LoadUint64(w)
				if atomic.CompareAndSwapUint64(w, o, combineLanes(op, dt, sz, o, x)) {
					break
				}
			}
		}
		if old != nil {
			binary.LittleEndian.PutUint64(old[i:], o)
		}
	}
}

// laneHigh is the top bit of each sz-byte lane of a word.
var laneHigh = [5]uint64{1: 0x8080808080808080, 2: 0x8000800080008000, 4: 0x8000000080000000}

// combineLanes combines the sz-byte elements packed in the words o and x.
func combineLanes(op Op, dt Datatype, sz int, o, x uint64) uint64 {
	switch {
	case op == Bxor:
		return o ^ x
	case op == Sum && dt != Float32:
		// Lanes added without a carry crossing into the next (two's
		// complement: signed and unsigned alike).
		h := laneHigh[sz]
		return ((o &^ h) + (x &^ h)) ^ ((o ^ x) & h)
	}
	bits := uint(8 * sz)
	mask := uint64(1)<<bits - 1
	var n uint64
	for s := uint(0); s < 64; s += bits {
		n |= combine(op, dt, o>>s&mask, x>>s&mask) & mask << s
	}
	return n
}

// applyEach is applyAtomic element by element.
func applyEach(op Op, dt Datatype, mem, origin, old []byte) {
	if len(origin) == 0 {
		return
	}
	sz := dt.Size()
	if !aligned(mem, sz) {
		for i := 0; i+sz <= len(origin); i += sz {
			o := loadElem(mem[i : i+sz])
			if old != nil {
				storeElem(old[i:i+sz], o)
			}
			storeElem(mem[i:i+sz], combine(op, dt, o, loadElem(origin[i:i+sz])))
		}
		return
	}
	for i := 0; i+sz <= len(origin); i += sz {
		p := unsafe.Pointer(&mem[i])
		if sz < 4 {
			x := loadElem(origin[i : i+sz])
			o := casNarrow(p, sz, func(o uint64) (uint64, bool) { return combine(op, dt, o, x), op != NoOp })
			if old != nil {
				storeElem(old[i:i+sz], o)
			}
			continue
		}
		if sz == 4 {
			x := uint64(binary.LittleEndian.Uint32(origin[i:]))
			w := (*uint32)(p)
			for {
				o := atomic.LoadUint32(w)
				if op == NoOp || atomic.CompareAndSwapUint32(w, o, uint32(combine(op, dt, uint64(o), x))) {
					if old != nil {
						binary.LittleEndian.PutUint32(old[i:], o)
					}
					break
				}
			}
			continue
		}
		x := binary.LittleEndian.Uint64(origin[i:])
		w := (*uint64)(p)
		for {
			o := atomic.LoadUint64(w)
			if op == NoOp || atomic.CompareAndSwapUint64(w, o, combine(op, dt, o, x)) {
				if old != nil {
					binary.LittleEndian.PutUint64(old[i:], o)
				}
				break
			}
		}
	}
}

// casNarrow updates the 1- or 2-byte element at p (aligned to its size)
// atomically: Go has no atomics that narrow, so it compare-and-swaps the
// aligned 4-byte word holding it, keeping the word's other bytes (a
// concurrent store to them fails the swap, which then retries). f gets the
// element's value and returns the new one and whether to store it; the
// old value is returned. The word never leaves the element's allocation:
// memory is allocated in multiples of 8 bytes at least (Go, malloc,
// pages).
func casNarrow(p unsafe.Pointer, sz int, f func(uint64) (uint64, bool)) uint64 {
	shift := 8 * (uintptr(p) & 3) // little-endian
	w := (*uint32)(unsafe.Pointer(uintptr(p) &^ 3))
	mask := uint32(1)<<(8*sz) - 1
	for {
		word := atomic.LoadUint32(w)
		o := uint64(word >> shift & mask)
		n, store := f(o)
		if !store || atomic.CompareAndSwapUint32(w, word, word&^(mask<<shift)|(uint32(n)&mask)<<shift) {
			return o
		}
	}
}

func aligned(mem []byte, sz int) bool { return uintptr(unsafe.Pointer(&mem[0]))%uintptr(sz) == 0 }

// compareSwap atomically replaces the element at mem with swap if it
// equals cmp, and returns the previous value (with plain loads and stores
// if mem is not aligned, as applyAtomic).
func compareSwap(dt Datatype, mem []byte, cmp, swap uint64) uint64 {
	if sz := dt.Size(); !aligned(mem, sz) {
		o := loadElem(mem[:sz])
		if o == cmp&(1<<(8*sz)-1) {
			storeElem(mem[:sz], swap)
		}
		return o
	}
	p := unsafe.Pointer(&mem[0])
	if sz := dt.Size(); sz < 4 {
		return casNarrow(p, sz, func(o uint64) (uint64, bool) { return swap, o == cmp&(1<<(8*sz)-1) })
	}
	if dt.Size() == 4 {
		w := (*uint32)(p)
		for {
			o := atomic.LoadUint32(w)
			if uint64(o) != cmp&0xffffffff {
				return uint64(o)
			}
			if atomic.CompareAndSwapUint32(w, o, uint32(swap)) {
				return uint64(o)
			}
		}
	}
	w := (*uint64)(p)
	for {
		o := atomic.LoadUint64(w)
		if o != cmp {
			return o
		}
		if atomic.CompareAndSwapUint64(w, o, swap) {
			return o
		}
	}
}
