//go:build !linux

package shmfab

import (
	"errors"
	"net/netip"

	"github.com/rvma/rvma/internal/fabric"
	"github.com/rvma/rvma/internal/wire"
)

// DefaultMTU is a port's payload size unless the URI says otherwise.
const DefaultMTU = 64 << 10

// ErrUnsupported: the shm fabric needs Linux (memfd, futex, /proc).
var ErrUnsupported = errors.New("shmfab: shared-memory ports need Linux")

// Port is not available on this system.
type Port struct{}

// Open fails: the shm fabric needs Linux.
func Open(name string, mtu int) (*Port, error) { return nil, ErrUnsupported }

func (p *Port) Addr() netip.AddrPort        { return netip.AddrPort{} }
func (p *Port) MaxPayload() int             { return 0 }
func (p *Port) Send(pkts []*wire.Packet)    {}
func (p *Port) SetHandler(h fabric.Handler) {}
func (p *Port) Close() error                { return nil }
func (p *Port) NoCMA()                      {}
func (p *Port) Stats() fabric.Stats         { return fabric.Stats{} }

// ErrIndirect: no direct access on this system.
var ErrIndirect = errors.New("shmfab: no direct access")

// Alloc fails: the shm fabric needs Linux.
func Alloc(n int) ([]byte, error) { return nil, ErrUnsupported }

// Free fails: the shm fabric needs Linux.
func Free(b []byte) error { return ErrUnsupported }

// CMA reports that cross-memory attach is unavailable.
func CMA() (bool, string) { return false, "needs Linux" }

// ForceCMA does nothing here.
func ForceCMA(ok bool) bool { return false }

// Locate finds nothing here.
func Locate(buf []byte) (id uint64, fd, off int, ok bool) { return 0, 0, 0, false }
