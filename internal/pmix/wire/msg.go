package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Commands (pmix_cmd_t).
const (
	CmdReq      uint8 = 0 // the job's data, which rvma does not ask for
	CmdAbort    uint8 = 1
	CmdCommit   uint8 = 2
	CmdFence    uint8 = 3
	CmdGet      uint8 = 4
	CmdFinalize uint8 = 5
)

// HeaderLen is the length of a frame header: pindex, tag, length and
// padding, four 32-bit words.
const HeaderLen = 16

// TagDynamic is the first tag a client gives its requests; the server's
// reply carries the request's tag. Tags below it are the server's own
// (event notifications, I/O forwarding).
const TagDynamic = 100

// MaxCred bounds a connection request's body, as the server does
// (PMIX_MAX_CRED_SIZE).
const MaxCred = 128 * 1024

// BufferNonDesc is the buffer type rvma announces: no type before each
// packed item.
const BufferNonDesc uint8 = 1

// Header frames every message after the connection request.
type Header struct {
	PIndex int32  // the client's index at the server (its handshake's answer)
	Tag    uint32 // a request's tag, echoed by its reply
	Len    uint32 // the body's length
}

// AppendHeader appends h in network byte order.
func AppendHeader(b []byte, h Header) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(h.PIndex))
	b = binary.BigEndian.AppendUint32(b, h.Tag)
	b = binary.BigEndian.AppendUint32(b, h.Len)
	return binary.BigEndian.AppendUint32(b, 0)
}

// ParseHeader reads a frame header; max bounds the body's length.
func ParseHeader(b []byte, max int) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, ErrShort
	}
	h := Header{PIndex: int32(binary.BigEndian.Uint32(b)), Tag: binary.BigEndian.Uint32(b[4:]), Len: binary.BigEndian.Uint32(b[8:])}
	if int64(h.Len) > int64(max) {
		return Header{}, fmt.Errorf("%w: a body of %d bytes (at most %d)", ErrMalformed, h.Len, max)
	}
	return h, nil
}

// Connect is a client's connection request.
type Connect struct {
	Sec     string // security module: "native"
	Cred    []byte // its credential: for "native" over TCP, the uid and gid the client claims
	Flag    uint8  // 0: a client the server launched
	Proc    Proc   // who the client is
	Version string // the client's PMIx version ("3.2.3")
	Bfrops  string // its data encoding ("v3")
	BufType uint8  // BufferNonDesc
	GDS     string // the data stores it can read ("hash")
}

// AppendConnect appends a connection request: a header in the host's
// byte order (the server reads it so, as it was written by memcpy), then
// the fields, raw.
func AppendConnect(b []byte, c Connect) []byte {
	var body []byte
	body = append(append(body, c.Sec...), 0)
	body = binary.BigEndian.AppendUint32(body, uint32(len(c.Cred)))
	body = append(body, c.Cred...)
	body = append(body, c.Flag)
	body = append(append(body, c.Proc.Nspace...), 0)
	body = binary.BigEndian.AppendUint32(body, c.Proc.Rank)
	body = append(append(body, c.Version...), 0)
	body = append(append(body, c.Bfrops...), 0)
	body = append(body, c.BufType)
	body = append(append(body, c.GDS...), 0)
	var minus1 int32 = -1
	b = binary.LittleEndian.AppendUint32(b, uint32(minus1))
	b = binary.LittleEndian.AppendUint32(b, math.MaxUint32)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(body)))
	b = binary.LittleEndian.AppendUint32(b, 0)
	return append(b, body...)
}

// ParseConnectHeader returns the length of the connection request's body
// from its header.
func ParseConnectHeader(b []byte) (int, error) {
	if len(b) < HeaderLen {
		return 0, ErrShort
	}
	n := binary.LittleEndian.Uint32(b[8:])
	if n > MaxCred {
		return 0, fmt.Errorf("%w: a connection request of %d bytes", ErrMalformed, n)
	}
	return int(n), nil
}

// ParseConnect reads a connection request's body, for a client (flag 0).
func ParseConnect(b []byte) (Connect, error) {
	var c Connect
	var err error
	cstr := func() string {
		for i, x := range b {
			if x == 0 {
				s := string(b[:i])
				b = b[i+1:]
				return s
			}
		}
		if err == nil {
			err = fmt.Errorf("%w: string without its NUL", ErrMalformed)
		}
		b = nil
		return ""
	}
	u32 := func() uint32 {
		if len(b) < 4 {
			if err == nil {
				err = ErrShort
			}
			b = nil
			return 0
		}
		v := binary.BigEndian.Uint32(b)
		b = b[4:]
		return v
	}
	u8 := func() uint8 {
		if len(b) < 1 {
			if err == nil {
				err = ErrShort
			}
			return 0
		}
		v := b[0]
		b = b[1:]
		return v
	}
	c.Sec = cstr()
	n := u32()
	if err == nil && int64(n) > int64(len(b)) {
		return c, ErrShort
	}
	if err == nil {
		c.Cred = append([]byte(nil), b[:n]...)
		b = b[n:]
	}
	c.Flag = u8()
	if err == nil && c.Flag != 0 {
		return c, fmt.Errorf("%w: connection of type %d, not a client's", ErrMalformed, c.Flag)
	}
	c.Proc.Nspace = cstr()
	c.Proc.Rank = u32()
	c.Version = cstr()
	c.Bfrops = cstr()
	c.BufType = u8()
	c.GDS = cstr()
	return c, err
}

// NativeCred is the credential of the "native" security module over TCP:
// the uid and gid the client claims, each as the C library's 32-bit
// uid_t and gid_t in the host's byte order. The server compares them with
// the job's; nothing proves them (see the rma package's note on what
// crosses PMIx).
func NativeCred(uid, gid uint32) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uid)
	return binary.LittleEndian.AppendUint32(b, gid)
}

// ParseNativeCred reads what NativeCred wrote.
func ParseNativeCred(b []byte) (uid, gid uint32, err error) {
	if len(b) != 8 {
		return 0, 0, fmt.Errorf("%w: a native credential of %d bytes", ErrMalformed, len(b))
	}
	return binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:]), nil
}

// AppendCommit appends a commit of kvs, put with scope global: once for
// the processes of this node, once for the others, as the C client sends
// a global put.
func AppendCommit(b []byte, kvs []KV) ([]byte, error) {
	s := Scratch{B: b}
	s.Count(1)
	s.U8(CmdCommit)
	if len(kvs) == 0 {
		return s.B, nil
	}
	var inner Scratch
	for _, kv := range kvs {
		inner.Count(1)
		if err := inner.KVal(kv); err != nil {
			return nil, err
		}
	}
	for _, scope := range []uint8{ScopeLocal, ScopeRemote} {
		s.Count(1)
		s.U8(scope)
		s.Count(1)
		s.U8(BufferNonDesc)
		s.Size(uint64(len(inner.B)))
		s.B = append(s.B, inner.B...)
	}
	return s.B, nil
}

// AppendFence appends a fence among procs with the qualifiers infos
// (PMIX_COLLECT_DATA, ...).
func AppendFence(b []byte, procs []Proc, infos []Info) ([]byte, error) {
	s := Scratch{B: b}
	s.Count(1)
	s.U8(CmdFence)
	s.Count(1)
	s.Size(uint64(len(procs)))
	if len(procs) > 0 {
		s.Count(len(procs))
		for _, p := range procs {
			s.Proc(p)
		}
	}
	if err := appendInfos(&s, infos); err != nil {
		return nil, err
	}
	return s.B, nil
}

// AppendGet appends a request for proc's value of key.
func AppendGet(b []byte, proc Proc, infos []Info, key string) ([]byte, error) {
	s := Scratch{B: b}
	s.Count(1)
	s.U8(CmdGet)
	s.Count(1)
	s.String(proc.Nspace)
	s.Count(1)
	s.U32(proc.Rank)
	if err := appendInfos(&s, infos); err != nil {
		return nil, err
	}
	s.Count(1)
	s.String(key)
	return s.B, nil
}

// AppendFinalize appends the request that ends a client's session.
func AppendFinalize(b []byte) []byte {
	s := Scratch{B: b}
	s.Count(1)
	s.U8(CmdFinalize)
	return s.B
}

func appendInfos(s *Scratch, infos []Info) error {
	s.Count(1)
	s.Size(uint64(len(infos)))
	if len(infos) == 0 {
		return nil
	}
	s.Count(len(infos))
	for _, in := range infos {
		if err := s.Info(in); err != nil {
			return err
		}
	}
	return nil
}

// Request is a client's request as a server reads it.
type Request struct {
	Cmd    uint8
	Scopes map[uint8][]KV // commit: what was put, by scope
	Procs  []Proc         // fence: its participants
	Infos  []Info         // fence, get: their qualifiers
	Proc   Proc           // get: whose value
	Key    string         // get: which ("": all of them)
}

// maxItems bounds the items of one request a server reads (processes of
// a fence, qualifiers).
const maxItems = 1 << 20

// ParseRequest reads a request's body (commit, fence, get, finalize).
func ParseRequest(b []byte) (Request, error) {
	r := Reader{B: b}
	var q Request
	r.Count(1)
	q.Cmd = r.U8()
	if r.Err != nil {
		return q, r.Err
	}
	switch q.Cmd {
	case CmdCommit:
		q.Scopes = map[uint8][]KV{}
		for r.Err == nil && r.Len() > 0 {
			r.Count(1)
			scope := r.U8()
			r.Count(1)
			r.U8() // the inner buffer's type
			n := r.length(1)
			inner := Reader{B: r.take(n)}
			for r.Err == nil && inner.Err == nil && inner.Len() > 0 {
				inner.Count(1)
				kv := inner.KVal()
				if inner.Err == nil {
					q.Scopes[scope] = append(q.Scopes[scope], kv)
				}
			}
			if r.Err == nil && inner.Err != nil {
				r.fail(inner.Err)
			}
		}
	case CmdFence:
		r.Count(1)
		n := r.Size()
		if r.Err == nil && n > maxItems {
			return q, fmt.Errorf("%w: a fence of %d processes", ErrMalformed, n)
		}
		if n > 0 {
			if c := r.Count(int(n)); r.Err == nil && c != int(n) {
				return q, fmt.Errorf("%w: %d processes packed, %d announced", ErrMalformed, c, n)
			}
			for range n {
				if q.Procs = append(q.Procs, r.Proc()); r.Err != nil {
					break
				}
			}
		}
		q.Infos = parseInfos(&r)
	case CmdGet:
		r.Count(1)
		q.Proc.Nspace = r.String()
		r.Count(1)
		q.Proc.Rank = r.U32()
		q.Infos = parseInfos(&r)
		if r.Err == nil && r.Len() > 0 {
			r.Count(1)
			q.Key = r.String()
		}
	case CmdFinalize:
	default:
		return q, fmt.Errorf("%w: command %d", ErrMalformed, q.Cmd)
	}
	if r.Err == nil && r.Len() > 0 {
		return q, fmt.Errorf("%w: %d bytes after the request", ErrMalformed, r.Len())
	}
	return q, r.Err
}

func parseInfos(r *Reader) []Info {
	r.Count(1)
	n := r.Size()
	if r.Err != nil || n == 0 {
		return nil
	}
	if n > maxItems {
		r.fail(fmt.Errorf("%w: %d qualifiers", ErrMalformed, n))
		return nil
	}
	if c := r.Count(int(n)); r.Err == nil && c != int(n) {
		r.fail(fmt.Errorf("%w: %d qualifiers packed, %d announced", ErrMalformed, c, n))
		return nil
	}
	var infos []Info
	for range n {
		in := r.Info()
		if r.Err != nil {
			return nil
		}
		infos = append(infos, in)
	}
	return infos
}

// AppendStatus appends a reply of a status only (commit, fence,
// finalize; a get that failed).
func AppendStatus(b []byte, status int32) []byte {
	s := Scratch{B: b}
	s.Count(1)
	s.I32(status)
	return s.B
}

// ProcData is what a process put, as a get's reply carries it.
type ProcData struct {
	Proc Proc
	KVs  []KV
	// Err, if set, is why the values after KVs could not be read (a
	// value of a type this package does not know): each process's data
	// is framed on its own, so the others' are still read.
	Err error
}

// AppendGetReply appends a successful get's reply: each process's data
// as a byte object holding its name and its values.
func AppendGetReply(b []byte, data []ProcData) ([]byte, error) {
	s := Scratch{B: AppendStatus(b, Success)}
	for _, d := range data {
		var inner Scratch
		inner.Count(1)
		inner.Proc(d.Proc)
		for _, kv := range d.KVs {
			inner.Count(1)
			if err := inner.KVal(kv); err != nil {
				return nil, err
			}
		}
		s.Count(1)
		s.Size(uint64(len(inner.B)))
		s.B = append(s.B, inner.B...)
	}
	return s.B, nil
}

// ParseStatus reads a reply's status.
func ParseStatus(b []byte) (int32, error) {
	r := Reader{B: b}
	r.Count(1)
	st := r.I32()
	return st, r.Err
}

// ParseGetReply reads a get's reply: its status, and when it succeeded
// the data of each process it carries.
func ParseGetReply(b []byte) (int32, []ProcData, error) {
	r := Reader{B: b}
	r.Count(1)
	st := r.I32()
	if r.Err != nil || st != Success {
		return st, nil, r.Err
	}
	var data []ProcData
	for r.Err == nil && r.Len() > 0 {
		r.Count(1)
		n := r.length(1)
		inner := Reader{B: r.take(n)}
		if r.Err != nil {
			break
		}
		var d ProcData
		inner.Count(1)
		d.Proc = inner.Proc()
		for inner.Err == nil && inner.Len() > 0 {
			inner.Count(1)
			kv := inner.KVal()
			if inner.Err == nil {
				d.KVs = append(d.KVs, kv)
			}
		}
		if inner.Err != nil {
			var ut *UnsupportedTypeError
			if !errors.As(inner.Err, &ut) {
				return st, nil, inner.Err
			}
			d.Err = inner.Err
		}
		data = append(data, d)
	}
	return st, data, r.Err
}
