//go:build linux

package udpfab

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rvma/rvma/internal/spin"
)

// Conn is a UDP socket with batch I/O. Reads must come from one goroutine
// at a time, and so must writes.
type Conn struct {
	uc    *net.UDPConn
	rc    syscall.RawConn
	v6    bool
	local netip.AddrPort
	feat  Features    // as probed at Listen; read-only after
	noGSO atomic.Bool // GSO found broken (EIO) after Listen

	r ioState
	w ioState

	// Spin is how long ReadBatch keeps trying a non-blocking receive
	// (yielding the processor between tries) before it parks on the
	// network poller. Parking costs a wake-up; spinning keeps the reader
	// runnable, which matters when other goroutines busy-poll memory.
	Spin time.Duration
}

// canGather: sendmmsg gathers a datagram from pieces (Message.Iov).
const canGather = true

// ioState holds the preallocated headers of one direction and the closure
// passed to RawConn, so a batch call allocates nothing.
type ioState struct {
	hdrs  []unix.Mmsghdr
	iovs  []unix.Iovec
	giovs []unix.Iovec // maxPieces a message, for gathered sends (made at the first)
	names []unix.RawSockaddrInet6
	cmsg  []byte // cmsgSpace bytes per message
	n     int    // messages to handle
	done  int    // messages handled (result)
	errno syscall.Errno
	fn    func(fd uintptr) bool
	ctl   func(fd uintptr) // one non-blocking attempt, for RawConn.Control

	roleFn func(fd uintptr) bool // ReadBatchRole's attempt
	role   *sync.Mutex
	missed *atomic.Bool
	msgs   []Message

	preparedFor *Message // the messages the headers point at
	preparedN   int
	dirty       int // headers the last receive filled
}

var cmsgSpace = unix.CmsgSpace(4)

func newIOState() ioState {
	return ioState{
		hdrs:  make([]unix.Mmsghdr, BatchSize),
		iovs:  make([]unix.Iovec, BatchSize),
		names: make([]unix.RawSockaddrInet6, BatchSize),
		cmsg:  make([]byte, BatchSize*cmsgSpace),
	}
}

var warnOnce sync.Once

// Listen opens a UDP socket bound to addr (port 0 picks a free port).
func Listen(addr netip.AddrPort, cfg *Config) (*Conn, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	log := cfg.Logger
	network := "udp4"
	if addr.Addr().Is6() && !addr.Addr().Is4In6() {
		network = "udp6"
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			// Sizes: try the privileged variants first (root ignores the
			// sysctl cap), then the ordinary ones. Best effort: a small
			// buffer costs speed, not correctness.
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, socketBuffer) != nil {
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, socketBuffer)
			}
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, socketBuffer) != nil {
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, socketBuffer)
			}
			// Don't fragment: an oversized datagram must fail loudly.
			if network == "udp4" {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_PROBE)
			} else {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_PROBE)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
	pc, err := lc.ListenPacket(context.Background(), network, addr.String())
	if err != nil {
		return nil, err
	}
	uc := pc.(*net.UDPConn)
	rc, err := uc.SyscallConn()
	if err != nil {
		uc.Close()
		return nil, err
	}
	c := &Conn{uc: uc, rc: rc, v6: network == "udp6", r: newIOState(), w: newIOState()}
	c.local = uc.LocalAddr().(*net.UDPAddr).AddrPort()
	rc.Control(func(fd uintptr) {
		if !cfg.NoGSO {
			_, err := unix.GetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_SEGMENT)
			c.feat.GSO = err == nil
		}
		if !cfg.NoGRO {
			c.feat.GRO = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_GRO, 1) == nil
		}
		c.feat.RecvBuffer, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
		c.feat.SendBuffer, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
	})
	// The kernel reports double what was granted (its bookkeeping share).
	if c.feat.RecvBuffer < socketBuffer && log != nil {
		warnOnce.Do(func() {
			log.Warn("udp socket receive buffer smaller than requested; raise net.core.rmem_max",
				"got", c.feat.RecvBuffer, "want", socketBuffer)
		})
	}
	c.r.fn = c.readFn
	c.r.ctl = func(fd uintptr) { c.readFn(fd) }
	c.r.roleFn = c.roleReadFn
	c.w.fn = c.writeFn
	c.Spin = defaultSpin()
	return c, nil
}

// LocalAddr returns the bound address.
func (c *Conn) LocalAddr() netip.AddrPort { return c.local }

// Features reports the socket's capabilities.
func (c *Conn) Features() Features {
	f := c.feat
	f.GSO = f.GSO && !c.noGSO.Load()
	return f
}

// Close closes the socket; a blocked ReadBatch returns net.ErrClosed.
func (c *Conn) Close() error { return c.uc.Close() }

func (c *Conn) putName(n *unix.RawSockaddrInet6, a netip.AddrPort) uint32 {
	if !c.v6 {
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(n))
		s4.Family = unix.AF_INET
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&s4.Port))[:], a.Port())
		s4.Addr = [4]byte{}
		if a4 := a.Addr().Unmap(); a4.Is4() {
			s4.Addr = a4.As4()
		} else {
			s4.Port = 0 // an IPv6 (or no) address from an IPv4 socket: the kernel refuses port 0
		}
		return unix.SizeofSockaddrInet4
	}
	n.Family = unix.AF_INET6
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&n.Port))[:], a.Port())
	n.Addr = a.Addr().As16()
	n.Scope_id = 0
	return unix.SizeofSockaddrInet6
}

func getName(n *unix.RawSockaddrInet6) netip.AddrPort {
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&n.Port))[:])
	if n.Family == unix.AF_INET {
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(n))
		return netip.AddrPortFrom(netip.AddrFrom4(s4.Addr), port)
	}
	return netip.AddrPortFrom(netip.AddrFrom16(n.Addr).Unmap(), port)
}

// WriteBatch sends every message, blocking while the socket buffer is
// full. A message the kernel refuses (too big, unroutable) is skipped and
// counted in the returned dropped count; it returns an error only when the
// socket itself fails.
func (c *Conn) WriteBatch(msgs []Message) (dropped int, err error) {
	for len(msgs) > 0 {
		n := min(len(msgs), BatchSize)
		s := &c.w
		for i := 0; i < n; i++ {
			m := &msgs[i]
			h := &s.hdrs[i]
			if len(m.Iov) > 0 {
				if s.giovs == nil {
					s.giovs = make([]unix.Iovec, BatchSize*maxPieces)
				}
				v := s.giovs[i*maxPieces : i*maxPieces+len(m.Iov)]
				for j, b := range m.Iov {
					v[j] = unix.Iovec{Base: unsafe.SliceData(b), Len: uint64(len(b))}
				}
				h.Hdr.Iov, h.Hdr.Iovlen = &v[0], uint64(len(v))
			} else {
				s.iovs[i] = unix.Iovec{Base: unsafe.SliceData(m.Buf), Len: uint64(len(m.Buf))}
				h.Hdr.Iov, h.Hdr.Iovlen = &s.iovs[i], 1
			}
			h.Hdr.Name = (*byte)(unsafe.Pointer(&s.names[i]))
			h.Hdr.Namelen = c.putName(&s.names[i], m.Addr)
			h.Hdr.Control, h.Hdr.Controllen = nil, 0
			if m.Seg > 0 && m.Seg < m.size() {
				cm := s.cmsg[i*cmsgSpace : (i+1)*cmsgSpace]
				hdr := (*unix.Cmsghdr)(unsafe.Pointer(&cm[0]))
				hdr.Level, hdr.Type = unix.IPPROTO_UDP, unix.UDP_SEGMENT
				hdr.SetLen(unix.CmsgLen(2))
				binary.NativeEndian.PutUint16(cm[unix.CmsgLen(0):], uint16(m.Seg))
				h.Hdr.Control, h.Hdr.Controllen = &cm[0], uint64(unix.CmsgSpace(2))
			}
		}
		s.n = n
		if err := c.rc.Write(s.fn); err != nil {
			return dropped, err
		}
		switch {
		case s.errno == 0:
			msgs = msgs[s.done:]
		case s.errno == unix.EIO && c.Features().GSO:
			// No checksum offload for GSO on this device: turn it off and
			// resend the trains as single datagrams.
			c.noGSO.Store(true)
			return c.writeSplit(msgs, dropped)
		case s.errno == unix.EMSGSIZE || s.errno == unix.ENETUNREACH || s.errno == unix.EHOSTUNREACH ||
			s.errno == unix.ECONNREFUSED || s.errno == unix.EPERM || s.errno == unix.EINVAL || s.errno == unix.ENOBUFS ||
			s.errno == unix.EFAULT: // a gathered payload's memory gone: that message only
			dropped++
			msgs = msgs[s.done+1:]
		default:
			return dropped, fmt.Errorf("udpfab: sendmmsg: %w", s.errno)
		}
	}
	return dropped, nil
}

// writeSplit resends GSO trains datagram by datagram (rare: a device
// without checksum offload, found at the first train).
func (c *Conn) writeSplit(msgs []Message, dropped int) (int, error) {
	var one [1]Message
	for i := range msgs {
		m := msgs[i]
		buf := m.Buf
		if len(m.Iov) > 0 {
			buf = make([]byte, 0, m.size())
			for _, b := range m.Iov {
				buf = append(buf, b...)
			}
		}
		seg := m.Seg
		if seg <= 0 {
			seg = len(buf)
		}
		for b := buf; len(b) > 0; {
			k := min(seg, len(b))
			one[0] = Message{Buf: b[:k], Addr: m.Addr}
			d, err := c.WriteBatch(one[:])
			dropped += d
			if err != nil {
				return dropped, err
			}
			b = b[k:]
		}
	}
	return dropped, nil
}

func (c *Conn) writeFn(fd uintptr) bool {
	s := &c.w
	r, _, e := unix.Syscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&s.hdrs[0])), uintptr(s.n), unix.MSG_DONTWAIT, 0, 0)
	if e == unix.EAGAIN {
		return false
	}
	s.errno = e
	if e == 0 {
		s.done = int(r)
	} else {
		s.done = 0
	}
	return true
}

// ReadBatch fills messages with received datagrams (or GRO trains) and
// returns how many; it blocks until at least one arrives.
func (c *Conn) ReadBatch(msgs []Message) (int, error) {
	s := &c.r
	c.prepareRead(msgs)
	var deadline time.Time
	s.errno = unix.EAGAIN
	for spins := 0; c.Spin > 0; spins++ {
		if err := c.rc.Control(s.ctl); err != nil {
			return 0, err
		}
		if s.errno == unix.EINTR {
			s.errno = unix.EAGAIN
		}
		if s.errno != unix.EAGAIN {
			break
		}
		if spins == 0 {
			deadline = time.Now().Add(c.Spin)
		} else if spins&15 == 0 && time.Now().After(deadline) {
			break
		}
		spin.Pause(spins)
	}
	for s.errno == unix.EAGAIN {
		if err := c.rc.Read(s.fn); err != nil {
			return 0, err
		}
		if s.errno == unix.EINTR {
			s.errno = unix.EAGAIN
			continue
		}
		break
	}
	if s.errno != 0 {
		return 0, fmt.Errorf("udpfab: recvmmsg: %w", s.errno)
	}
	c.finishRead(msgs)
	return s.done, nil
}

// prepareRead points the receive headers at msgs' buffers. Headers already
// pointing at the same messages only get the fields the kernel changed
// reset, so an empty poll costs little. A caller that gives a message a
// different buffer must pass a different slice of messages (only the first
// buffer is checked).
func (c *Conn) prepareRead(msgs []Message) {
	n := min(len(msgs), BatchSize)
	s := &c.r
	same := len(msgs) > 0 && s.preparedFor == &msgs[0] && s.preparedN == n &&
		s.iovs[0].Base == unsafe.SliceData(msgs[0].Buf[:cap(msgs[0].Buf)])
	if same {
		for i := 0; i < s.dirty; i++ {
			h := &s.hdrs[i]
			h.Hdr.Namelen = unix.SizeofSockaddrInet6
			h.Hdr.Controllen = uint64(cmsgSpace)
			h.Hdr.Flags = 0
		}
		s.dirty, s.n = 0, n
		return
	}
	for i := 0; i < n; i++ {
		m := &msgs[i]
		h := &s.hdrs[i]
		s.iovs[i] = unix.Iovec{Base: unsafe.SliceData(m.Buf[:cap(m.Buf)]), Len: uint64(cap(m.Buf))}
		h.Hdr.Iov, h.Hdr.Iovlen = &s.iovs[i], 1
		h.Hdr.Name = (*byte)(unsafe.Pointer(&s.names[i]))
		h.Hdr.Namelen = unix.SizeofSockaddrInet6
		h.Hdr.Control = &s.cmsg[i*cmsgSpace]
		h.Hdr.Controllen = uint64(cmsgSpace)
		h.Hdr.Flags = 0
	}
	s.n, s.dirty = n, 0
	if n > 0 {
		s.preparedFor, s.preparedN = &msgs[0], n
	}
}

// finishRead fills msgs from the headers of a completed receive.
func (c *Conn) finishRead(msgs []Message) {
	s := &c.r
	s.dirty = s.done
	for i := 0; i < s.done; i++ {
		m := &msgs[i]
		h := &s.hdrs[i]
		m.N = int(h.Len)
		m.Buf = m.Buf[:cap(m.Buf)]
		m.Addr = getName(&s.names[i])
		m.Seg = groSize(s.cmsg[i*cmsgSpace : i*cmsgSpace+int(h.Hdr.Controllen)])
	}
}

func (c *Conn) readFn(fd uintptr) bool {
	s := &c.r
	r, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&s.hdrs[0])), uintptr(s.n), unix.MSG_DONTWAIT, 0, 0)
	s.errno = e
	if e == unix.EAGAIN {
		return false
	}
	s.done = int(r)
	if e != 0 {
		s.done = 0
	}
	return true
}

// ReadBatchRole is ReadBatch for a socket shared with TryReadBatch callers:
// it parks until the socket is readable, then takes role (without
// blocking) for the read and returns with it held when it returned
// messages. If another goroutine holds role it sets missed first and waits
// for the next arrival; that holder re-drains when it sees missed, so no
// datagram is left unread while everyone sleeps.
func (c *Conn) ReadBatchRole(msgs []Message, role *sync.Mutex, missed *atomic.Bool) (int, error) {
	s := &c.r
	s.role, s.missed, s.msgs = role, missed, msgs
	for {
		if err := c.rc.Read(s.roleFn); err != nil {
			return 0, err
		}
		if s.errno == unix.EINTR {
			role.Unlock()
			continue
		}
		break
	}
	if s.errno != 0 {
		role.Unlock()
		return 0, fmt.Errorf("udpfab: recvmmsg: %w", s.errno)
	}
	c.finishRead(msgs)
	return s.done, nil
}

func (c *Conn) roleReadFn(fd uintptr) bool {
	s := &c.r
	s.missed.Store(true)
	if !s.role.TryLock() {
		return false // the holder drains; wait for the next arrival
	}
	s.missed.Store(false)
	c.prepareRead(s.msgs)
	c.readFn(fd)
	if s.errno == unix.EAGAIN {
		s.role.Unlock()
		return false
	}
	return true
}

// TryReadBatch makes one non-blocking receive attempt and returns 0 if
// nothing was waiting. The caller must hold the reader role.
func (c *Conn) TryReadBatch(msgs []Message) (int, error) {
	c.prepareRead(msgs)
	// Control, not Read: Read holds the descriptor's read lock while it
	// waits, so it would block behind the parked background reader.
	if err := c.rc.Control(c.r.ctl); err != nil {
		return 0, err
	}
	switch c.r.errno {
	case 0:
	case unix.EAGAIN, unix.EINTR:
		return 0, nil
	default:
		return 0, fmt.Errorf("udpfab: recvmmsg: %w", c.r.errno)
	}
	c.finishRead(msgs)
	return c.r.done, nil
}

// groSize returns the segment size of a UDP_GRO control message, or 0.
func groSize(cm []byte) int {
	for len(cm) >= unix.CmsgLen(0) {
		hdr := (*unix.Cmsghdr)(unsafe.Pointer(&cm[0]))
		l := int(hdr.Len)
		if l < unix.CmsgLen(0) || l > len(cm) {
			return 0
		}
		if hdr.Level == unix.IPPROTO_UDP && hdr.Type == unix.UDP_GRO && l >= unix.CmsgLen(2) {
			return int(binary.NativeEndian.Uint16(cm[unix.CmsgLen(0):]))
		}
		cm = cm[min(unix.CmsgSpace(l-unix.CmsgLen(0)), len(cm)):]
	}
	return 0
}

// errClosed reports whether err means the socket was closed.
func errClosed(err error) bool { return errors.Is(err, net.ErrClosed) }
