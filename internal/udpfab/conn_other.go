//go:build !linux

package udpfab

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Conn is a UDP socket with the batch interface, one datagram per call on
// systems without sendmmsg, GSO and GRO.
type Conn struct {
	uc    *net.UDPConn
	local netip.AddrPort
	Spin  time.Duration // unused here
}

// canGather: this platform sends one buffer a datagram (no Message.Iov).
const canGather = false

// Listen opens a UDP socket bound to addr.
func Listen(addr netip.AddrPort, _ *Config) (*Conn, error) {
	uc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return nil, err
	}
	uc.SetReadBuffer(socketBuffer)
	uc.SetWriteBuffer(socketBuffer)
	return &Conn{uc: uc, local: uc.LocalAddr().(*net.UDPAddr).AddrPort()}, nil
}

func (c *Conn) LocalAddr() netip.AddrPort { return c.local }
func (c *Conn) Features() Features        { return Features{} }
func (c *Conn) Close() error              { return c.uc.Close() }

func (c *Conn) WriteBatch(msgs []Message) (dropped int, err error) {
	for i := range msgs {
		m := &msgs[i]
		seg := m.Seg
		if seg <= 0 {
			seg = len(m.Buf)
		}
		for b := m.Buf; len(b) > 0; b = b[min(seg, len(b)):] {
			if _, err := c.uc.WriteToUDPAddrPort(b[:min(seg, len(b))], m.Addr); err != nil {
				if errClosed(err) {
					return dropped, err
				}
				dropped++
			}
		}
	}
	return dropped, nil
}

func (c *Conn) ReadBatch(msgs []Message) (int, error) {
	m := &msgs[0]
	n, a, err := c.uc.ReadFromUDPAddrPort(m.Buf[:cap(m.Buf)])
	if err != nil {
		return 0, err
	}
	m.Buf, m.N, m.Addr, m.Seg = m.Buf[:cap(m.Buf)], n, a, 0
	return 1, nil
}

// ReadBatchRole reads one datagram, then takes role.
func (c *Conn) ReadBatchRole(msgs []Message, role *sync.Mutex, _ *atomic.Bool) (int, error) {
	n, err := c.ReadBatch(msgs)
	if err == nil {
		role.Lock()
	}
	return n, err
}

// TryReadBatch never finds anything here: the background reader progresses.
func (c *Conn) TryReadBatch([]Message) (int, error) { return 0, nil }

func errClosed(err error) bool { return errors.Is(err, net.ErrClosed) }
