//go:build linux

package shmfab

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/internal/wire"
)

// The helper process: a port that prints its address and echoes every
// packet back to its sender until its stdin closes. It also sends one
// packet to RVMA_SHM_HELLO if set, to claim a ring there.
func TestMain(m *testing.M) {
	if name := os.Getenv("RVMA_SHM_CHILD"); name != "" {
		child(name)
		return
	}
	os.Exit(m.Run())
}

func child(name string) {
	p, err := Open(name, 4096)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	p.SetHandler(&echo{p: p})
	if h := os.Getenv("RVMA_SHM_HELLO"); h != "" {
		p.Send([]*wire.Packet{packet(netip.MustParseAddrPort(h), 0, []byte("hello"))})
	}
	fmt.Println(p.Addr())
	bufio.NewReader(os.Stdin).ReadString('\n')
	p.Close()
}

func startChild(t *testing.T, name, hello string) (*exec.Cmd, netip.AddrPort) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "RVMA_SHM_CHILD="+name, "RVMA_SHM_HELLO="+hello)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	addr, err := netip.ParseAddrPort(strings.TrimSpace(line))
	require.NoError(t, err, line)
	return cmd, addr
}

// Packets cross between two processes and come back intact, in order.
func TestTwoProcesses(t *testing.T) {
	p, r := open(t, t.Name())
	_, addr := startChild(t, t.Name(), "")
	const n = 3000
	for i := range n {
		p.Send([]*wire.Packet{packet(addr, uint32(i), []byte(fmt.Sprint(i)))})
		if i%200 == 0 {
			// let the rings drain now and then: a full ring drops, as a
			// datagram socket would
			require.Eventually(t, func() bool { return r.Count() == i+1 }, 10*time.Second, 10*time.Microsecond)
		}
	}
	require.Eventually(t, func() bool { return r.Count() == n }, 10*time.Second, time.Millisecond)
	for i, psn := range r.PSNs() {
		require.Equal(t, uint32(i), psn)
	}
}

// A peer killed with SIGKILL: the ring it held in our segment is freed
// within a bounded time, and packets toward it are dropped once its ring
// is full instead of hanging the sender.
func TestPeerKilled(t *testing.T) {
	p, r := open(t, t.Name())
	cmd, addr := startChild(t, t.Name(), p.Addr().String())
	require.Eventually(t, func() bool { return r.Count() == 1 }, 10*time.Second, time.Millisecond, "the child's hello")
	held := func() int {
		n := 0
		for i := range Rings {
			if ownerOf(p, i) != 0 {
				n++
			}
		}
		return n
	}
	require.Equal(t, 1, held())
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	cmd.Wait()
	start := time.Now()
	require.Eventually(t, func() bool { return held() == 0 }, 5*time.Second, 5*time.Millisecond, "the dead child's ring is still claimed")
	t.Logf("ring freed %v after the kill", time.Since(start))
	// Sending to the dead child: its ring fills (4 MiB), then the sender
	// notices the pid is gone and drops.
	big := make([]byte, 4000)
	for i := 0; i < 2*RingBytes/len(big); i++ {
		p.Send([]*wire.Packet{packet(addr, uint32(i), big)})
	}
	require.Positive(t, p.Stats().Undeliverable)
	p.pmu.Lock()
	dead := p.peers[addr].dead
	p.pmu.Unlock()
	require.True(t, dead)
}

// A sender that closes right after sending: what it sent is still
// delivered, and its ring is freed once drained.
func TestRetiredRingDrains(t *testing.T) {
	a, ra := open(t, t.Name())
	b, err := Open(t.Name(), 4096)
	require.NoError(t, err)
	const n = 100
	// Nothing is drained until b has closed: a holds its own reader role.
	a.rmu.Lock()
	for i := range n {
		b.Send([]*wire.Packet{packet(a.Addr(), uint32(i), nil)})
	}
	require.NoError(t, b.Close())
	require.Zero(t, ra.Count())
	a.rmu.Unlock()
	require.Eventually(t, func() bool { return ra.Count() == n }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool {
		for i := range Rings {
			if ownerOf(a, i) != 0 {
				return false
			}
		}
		return true
	}, 5*time.Second, time.Millisecond)
}

func ownerOf(p *Port, i int) uint64 { return atomic.LoadUint64(u64(p.mem, slot(i)+offOwner)) }

// A peer whose memory was handed out (Map marks it watched) is marked gone
// within the receiver's watch period once its process dies.
func TestWatchMarksGonePeers(t *testing.T) {
	p, _ := open(t, t.Name())
	cmd, addr := startChild(t, t.Name(), "")
	p.pmu.Lock()
	pe := p.peerFor(addr)
	p.pmu.Unlock()
	require.NotNil(t, pe)
	require.False(t, pe.dead)
	pe.watched.Store(true)
	p.watch()
	require.False(t, pe.gone.Load(), "alive")
	require.NoError(t, cmd.Process.Kill())
	cmd.Wait()
	require.Eventually(t, pe.gone.Load, 5*time.Second, 10*time.Millisecond, "the receiver watches every 100 ms")
}
