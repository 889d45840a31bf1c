// Package wire encodes and decodes the messages a PMIx client and its
// node's PMIx server exchange over the server's socket, as PMIx 3 and
// later servers read and write them for a client that announces the "v3"
// data encoding, undescribed buffers and the "hash" data store: the
// connection request and the server's answer, the frame header of every
// later message, and the requests rvma sends (commit, fence, get,
// finalize) with their replies.
//
// Numbers in a buffer are big-endian. A packed item is preceded by an
// int32 count; a string is an int32 length that counts its terminating
// NUL, then its bytes and the NUL; a size is tagged with its width (a
// uint16 type, then a uint64); a value is its uint16 type, then its
// payload. The connection request is the exception: its header is in the
// host's byte order (little-endian on every machine rvma supports), and
// its fields are raw (NUL-terminated strings, network-order uint32s).
//
// Decoders never panic and never read beyond their input; they bound
// every count and length by what remains of it.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrShort reports a message that ends before its last field.
var ErrShort = errors.New("pmix/wire: message too short")

// ErrMalformed reports a field whose value the protocol does not allow
// (a negative length, a string without its NUL, an unknown command).
var ErrMalformed = errors.New("pmix/wire: malformed message")

// UnsupportedTypeError reports a value of a data type this package cannot
// decode (nor skip, as its length depends on its type).
type UnsupportedTypeError struct{ Type uint16 }

func (e *UnsupportedTypeError) Error() string {
	return fmt.Sprintf("pmix/wire: data type %d not understood", e.Type)
}

// Data types, as numbered in PMIx's pmix_common.h (stable since PMIx 2).
const (
	TypeUndef         uint16 = 0
	TypeBool          uint16 = 1
	TypeByte          uint16 = 2
	TypeString        uint16 = 3
	TypeSize          uint16 = 4
	TypePID           uint16 = 5
	TypeInt           uint16 = 6
	TypeInt8          uint16 = 7
	TypeInt16         uint16 = 8
	TypeInt32         uint16 = 9
	TypeInt64         uint16 = 10
	TypeUint          uint16 = 11
	TypeUint8         uint16 = 12
	TypeUint16        uint16 = 13
	TypeUint32        uint16 = 14
	TypeUint64        uint16 = 15
	TypeFloat         uint16 = 16
	TypeDouble        uint16 = 17
	TypeTimeval       uint16 = 18
	TypeTime          uint16 = 19
	TypeStatus        uint16 = 20
	TypeValue         uint16 = 21
	TypeProc          uint16 = 22
	TypeInfo          uint16 = 24
	TypeByteObject    uint16 = 27
	TypeKVal          uint16 = 28
	TypePersist       uint16 = 30
	TypePointer       uint16 = 31
	TypeScope         uint16 = 32
	TypeDataRange     uint16 = 33
	TypeCommand       uint16 = 34
	TypeInfoDirs      uint16 = 35
	TypeDataType      uint16 = 36
	TypeProcState     uint16 = 37
	TypeProcInfo      uint16 = 38
	TypeDataArray     uint16 = 39
	TypeProcRank      uint16 = 40
	TypeCompressedStr uint16 = 42
	TypeIOFChannel    uint16 = 45
	TypeEnvar         uint16 = 46
)

// Ranks with a meaning of their own.
const (
	RankUndef    uint32 = math.MaxUint32
	RankWildcard uint32 = math.MaxUint32 - 1
)

// Data scopes of a put.
const (
	ScopeLocal  uint8 = 1 // processes of this node
	ScopeRemote uint8 = 2 // processes of other nodes
	ScopeGlobal uint8 = 3 // both
)

// Status codes the server answers with (pmix_common.h).
const (
	Success         int32 = 0
	ErrGeneric      int32 = -1
	ErrInvalidCred  int32 = -12
	ErrTimeout      int32 = -24
	ErrUnreach      int32 = -25
	ErrBadParam     int32 = -27
	ErrNotFound     int32 = -46
	ErrNotSupported int32 = -47
	ErrReadPastEnd  int32 = -50
	ErrLostConn     int32 = -61
	// ReadyForHandshake asks the client for a security handshake of its
	// security module's own, which "native" never does.
	ReadyForHandshake int32 = -11
)

// Scratch writes big-endian values onto a growing slice; the zero value
// is an empty buffer. Methods with a Pack prefix write a whole packed item
// (its int32 count of one first), the others the bare payload.
type Scratch struct{ B []byte }

func (s *Scratch) U8(v uint8)   { s.B = append(s.B, v) }
func (s *Scratch) U16(v uint16) { s.B = binary.BigEndian.AppendUint16(s.B, v) }
func (s *Scratch) U32(v uint32) { s.B = binary.BigEndian.AppendUint32(s.B, v) }
func (s *Scratch) U64(v uint64) { s.B = binary.BigEndian.AppendUint64(s.B, v) }
func (s *Scratch) I32(v int32)  { s.U32(uint32(v)) }

// Count writes the int32 count that precedes a packed item.
func (s *Scratch) Count(n int) { s.I32(int32(n)) }

// String writes a string payload: its length with the NUL, its bytes, the
// NUL.
func (s *Scratch) String(v string) {
	s.Count(len(v) + 1)
	s.B = append(s.B, v...)
	s.B = append(s.B, 0)
}

// Size writes a size_t payload: tagged with its width, as the C library
// does for every type whose width depends on the machine.
func (s *Scratch) Size(v uint64) {
	s.U16(TypeUint64)
	s.U64(v)
}

// Proc writes a process name: namespace and rank.
func (s *Scratch) Proc(p Proc) {
	s.String(p.Nspace)
	s.U32(p.Rank)
}

// Value writes a value: its type, then its payload. Only the types rvma
// sends are written: string, bool, uint32.
func (s *Scratch) Value(v any) error {
	switch v := v.(type) {
	case string:
		s.U16(TypeString)
		s.String(v)
	case bool:
		s.U16(TypeBool)
		s.U8(boolByte(v))
	case uint32:
		s.U16(TypeUint32)
		s.U32(v)
	default:
		return fmt.Errorf("pmix/wire: cannot encode a %T value", v)
	}
	return nil
}

// Info writes an info: key, directives (none), value.
func (s *Scratch) Info(in Info) error {
	s.String(in.Key)
	s.U32(0)
	return s.Value(in.Value)
}

// KVal writes a key and its value.
func (s *Scratch) KVal(kv KV) error {
	s.String(kv.Key)
	return s.Value(kv.Value)
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// Proc names a process: its job's namespace and its rank in it.
type Proc struct {
	Nspace string
	Rank   uint32
}

// Info is a key and a value qualifying a request (PMIX_COLLECT_DATA, ...).
type Info struct {
	Key   string
	Value any
}

// KV is a key and its value as a process put it.
type KV struct {
	Key   string
	Value any
}

// Envar is an environment variable a value names (PMIX_ENVAR).
type Envar struct {
	Name, Value string
	Separator   byte
}

// ProcInfo describes a process (PMIX_PROC_INFO).
type ProcInfo struct {
	Proc       Proc
	Host, Exec string
	PID        int64
	State      uint8
}

// Reader reads a message's fields; a failed read leaves Err set and every
// later read returns zero values, so a decoder checks Err once at the end
// (or where it must branch on what it read).
type Reader struct {
	B   []byte
	Err error
}

func (r *Reader) fail(err error) {
	if r.Err == nil {
		r.Err = err
	}
	r.B = nil
}

func (r *Reader) take(n int) []byte {
	if r.Err != nil {
		return nil
	}
	if n < 0 || n > len(r.B) {
		r.fail(ErrShort)
		return nil
	}
	b := r.B[:n:n]
	r.B = r.B[n:]
	return b
}

// Len is what remains to read.
func (r *Reader) Len() int { return len(r.B) }

func (r *Reader) U8() uint8 {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *Reader) U16() uint16 {
	if b := r.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *Reader) U32() uint32 {
	if b := r.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

func (r *Reader) U64() uint64 {
	if b := r.take(8); b != nil {
		return binary.BigEndian.Uint64(b)
	}
	return 0
}

func (r *Reader) I32() int32 { return int32(r.U32()) }

// Count reads the count of a packed item and checks that it is one, the
// only count rvma's messages carry (n is how many it may hold).
func (r *Reader) Count(n int) int {
	c := r.I32()
	if r.Err == nil && (c < 0 || int(c) > n || int(c) > len(r.B)) {
		r.fail(fmt.Errorf("%w: count %d", ErrMalformed, c))
		return 0
	}
	return int(c)
}

// String reads a string payload.
func (r *Reader) String() string {
	n := r.I32()
	if r.Err != nil {
		return ""
	}
	if n == 0 {
		return "" // the C library's NULL string
	}
	b := r.take(int(n))
	if r.Err != nil {
		return ""
	}
	if b[len(b)-1] != 0 {
		r.fail(fmt.Errorf("%w: string without its NUL", ErrMalformed))
		return ""
	}
	return string(b[:len(b)-1])
}

// tagged reads a value whose width is tagged before it (size_t, pid_t,
// int): its tag, then an integer of that width.
func (r *Reader) tagged() int64 {
	switch t := r.U16(); t {
	case TypeInt8:
		return int64(int8(r.U8()))
	case TypeUint8:
		return int64(r.U8())
	case TypeInt16:
		return int64(int16(r.U16()))
	case TypeUint16:
		return int64(r.U16())
	case TypeInt32:
		return int64(r.I32())
	case TypeUint32:
		return int64(r.U32())
	case TypeInt64, TypeUint64:
		return int64(r.U64())
	default:
		if r.Err == nil {
			r.fail(fmt.Errorf("%w: integer tagged with type %d", ErrMalformed, t))
		}
		return 0
	}
}

// Size reads a size_t payload.
func (r *Reader) Size() uint64 {
	v := r.tagged()
	if r.Err == nil && v < 0 {
		r.fail(fmt.Errorf("%w: size %d", ErrMalformed, v))
	}
	return uint64(v)
}

// length reads a size that counts things still to come, each at least
// min bytes long, and checks that they can be there.
func (r *Reader) length(min int) int {
	n := r.Size()
	if r.Err == nil && n > uint64(len(r.B)/min) {
		r.fail(fmt.Errorf("%w: %d items in %d bytes", ErrShort, n, len(r.B)))
		return 0
	}
	return int(n)
}

// Proc reads a process name.
func (r *Reader) Proc() Proc {
	return Proc{Nspace: r.String(), Rank: r.U32()}
}

// maxDepth bounds how deeply data arrays and values may nest.
const maxDepth = 8

// Value reads a value: its type, then its payload.
func (r *Reader) Value() any { return r.value(r.U16(), 0) }

// Info reads an info: key, directives, value.
func (r *Reader) Info() Info { return r.info(0) }

func (r *Reader) info(depth int) Info {
	k := r.String()
	r.U32() // directives: nothing rvma acts on
	return Info{Key: k, Value: r.value(r.U16(), depth)}
}

// KVal reads a key and its value.
func (r *Reader) KVal() KV {
	k := r.String()
	return KV{Key: k, Value: r.value(r.U16(), 0)}
}

// value reads the payload of a value of type t: strings and integers as
// Go's, a byte object as []byte, a data array as []any of its elements,
// floats as the strings the C library sends them as.
func (r *Reader) value(t uint16, depth int) any {
	if r.Err != nil {
		return nil
	}
	if depth > maxDepth {
		r.fail(fmt.Errorf("%w: values nested more than %d deep", ErrMalformed, maxDepth))
		return nil
	}
	switch t {
	case TypeUndef:
		return nil
	case TypeBool:
		return r.U8() != 0
	case TypeByte, TypeUint8, TypePersist, TypePointer, TypeScope, TypeDataRange, TypeCommand, TypeProcState:
		return r.U8()
	case TypeInt8:
		return int8(r.U8())
	case TypeInt16:
		return int16(r.U16())
	case TypeUint16, TypeDataType, TypeIOFChannel:
		return r.U16()
	case TypeInt32, TypeStatus:
		return r.I32()
	case TypeUint32, TypeInfoDirs, TypeProcRank:
		return r.U32()
	case TypeInt64:
		return int64(r.U64())
	case TypeUint64, TypeTime:
		return r.U64()
	case TypeSize:
		return r.Size()
	case TypePID, TypeInt, TypeUint:
		return r.tagged()
	case TypeString, TypeFloat, TypeDouble:
		return r.String()
	case TypeTimeval:
		return [2]int64{int64(r.U64()), int64(r.U64())}
	case TypeProc:
		return r.Proc()
	case TypeByteObject, TypeCompressedStr:
		n := r.length(1)
		return append([]byte(nil), r.take(n)...)
	case TypeValue:
		return r.value(r.U16(), depth+1)
	case TypeInfo:
		return r.info(depth + 1)
	case TypeKVal:
		k := r.String()
		return KV{Key: k, Value: r.value(r.U16(), depth+1)}
	case TypeEnvar:
		return Envar{Name: r.String(), Value: r.String(), Separator: r.U8()}
	case TypeProcInfo:
		return ProcInfo{Proc: r.Proc(), Host: r.String(), Exec: r.String(), PID: r.tagged(), State: r.U8()}
	case TypeDataArray:
		et := r.U16()
		n := r.length(1)
		if r.Err != nil || n == 0 || et == TypeUndef {
			return []any(nil)
		}
		a := make([]any, 0, min(n, 64))
		for range n {
			a = append(a, r.value(et, depth+1))
			if r.Err != nil {
				return nil
			}
		}
		return a
	default:
		r.fail(&UnsupportedTypeError{Type: t})
		return nil
	}
}

// String formats p as PMIx does, NSPACE.RANK.
func (p Proc) String() string {
	switch p.Rank {
	case RankWildcard:
		return p.Nspace + ".*"
	case RankUndef:
		return p.Nspace + ".undef"
	}
	return fmt.Sprintf("%s.%d", p.Nspace, p.Rank)
}
