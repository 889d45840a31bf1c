// Package testbed builds a real multipath network for tests: two network
// namespaces joined by N veth pairs, each pair its own subnet, each link
// optionally shaped with tc's token bucket filter (this kernel has no
// netem), and source-address routing rules so that the local address a
// socket is bound to selects the path, as Virtuoso's IP aliases do. Code
// runs inside a namespace through In; sockets opened there stay there.
//
// It needs root and iproute2; New skips the test with a message otherwise.
// Everything it creates is removed when the test ends. Addresses are in
// 10.77.0.0/16, which the namespaces keep to themselves.
package testbed

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Config describes a testbed. The zero value means one unshaped path.
type Config struct {
	// Paths is the number of veth pairs; default 1, range 1..16.
	Paths int
	// Rates shapes path i's links, both directions, to Rates[i] (a tc rate
	// such as "200mbit"); missing or empty: unshaped.
	Rates []string
}

// Path is one veth pair.
type Path struct {
	Index      int
	A, B       netip.Addr // the path's addresses in namespaces A and B
	DevA, DevB string
}

// Bed is a built testbed.
type Bed struct {
	NameA, NameB string // namespace names
	Paths        []Path
	tag          string
}

// New builds the testbed, or skips t when it cannot (not root, no ip or
// tc). It is removed when t ends.
func New(t testing.TB, cfg Config) *Bed {
	t.Helper()
	var b *Bed
	build(t, func() (func(), error) {
		var err error
		b, err = Build(cfg)
		if b == nil {
			return nil, err
		}
		return b.Close, err
	})
	return b
}

// build builds a testbed for t with make, or skips t when it cannot be
// built here; what make built (its Close, if not nil) is removed when t
// ends.
func build(t testing.TB, make func() (closer func(), err error)) {
	t.Helper()
	if err := Available(); err != nil {
		t.Skip(err.Error())
	}
	closer, err := make()
	if closer != nil {
		t.Cleanup(closer)
	}
	if err != nil {
		if strings.Contains(err.Error(), "Operation not permitted") {
			t.Skipf("testbed: not permitted here: %v", err)
		}
		t.Fatalf("testbed: %v", err)
	}
}

// Available reports why a testbed cannot be built here, or nil.
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("testbed: needs root to create network namespaces (CI runs as root)")
	}
	for _, tool := range []string{"ip", "tc"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("testbed: %s not installed (iproute2)", tool)
		}
	}
	return nil
}

// Build builds a testbed; Close removes it (also after a failed Build,
// whose partial testbed it returns).
func Build(cfg Config) (*Bed, error) {
	if cfg.Paths == 0 {
		cfg.Paths = 1
	}
	if cfg.Paths < 1 || cfg.Paths > 16 {
		return nil, fmt.Errorf("testbed: %d paths, want 1..16", cfg.Paths)
	}
	var r [3]byte
	rand.Read(r[:])
	tag := hex.EncodeToString(r[:])
	b := &Bed{NameA: "rvmaA" + tag, NameB: "rvmaB" + tag, tag: tag}
	return b, b.build(cfg)
}

func run(args ...string) error {
	var stderr bytes.Buffer
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

func (b *Bed) build(cfg Config) error {
	steps := [][]string{
		{"ip", "netns", "add", b.NameA},
		{"ip", "netns", "add", b.NameB},
		{"ip", "-n", b.NameA, "link", "set", "lo", "up"},
		{"ip", "-n", b.NameB, "link", "set", "lo", "up"},
	}
	// Packets may arrive on another path's device than the route back
	// would pick; strict reverse-path filtering would drop them.
	for _, ns := range []string{b.NameA, b.NameB} {
		for _, c := range []string{"all", "default"} {
			steps = append(steps, []string{"ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.conf." + c + ".rp_filter=0"})
		}
	}
	for i := range cfg.Paths {
		p := Path{Index: i, A: netip.AddrFrom4([4]byte{10, 77, byte(i), 1}), B: netip.AddrFrom4([4]byte{10, 77, byte(i), 2}),
			DevA: fmt.Sprintf("va%d%s", i, b.tag), DevB: fmt.Sprintf("vb%d%s", i, b.tag)}
		b.Paths = append(b.Paths, p)
		steps = append(steps,
			[]string{"ip", "link", "add", p.DevA, "netns", b.NameA, "type", "veth", "peer", "name", p.DevB, "netns", b.NameB},
			[]string{"ip", "-n", b.NameA, "addr", "add", p.A.String() + "/24", "dev", p.DevA},
			[]string{"ip", "-n", b.NameB, "addr", "add", p.B.String() + "/24", "dev", p.DevB},
			[]string{"ip", "-n", b.NameA, "link", "set", p.DevA, "up"},
			[]string{"ip", "-n", b.NameB, "link", "set", p.DevB, "up"},
			// Source-address routing: traffic from a path's address to
			// any address of the other side leaves by that path.
			[]string{"ip", "-n", b.NameA, "rule", "add", "from", p.A.String(), "table", fmt.Sprint(100 + i)},
			[]string{"ip", "-n", b.NameA, "route", "add", "10.77.0.0/16", "dev", p.DevA, "table", fmt.Sprint(100 + i)},
			[]string{"ip", "-n", b.NameB, "rule", "add", "from", p.B.String(), "table", fmt.Sprint(100 + i)},
			[]string{"ip", "-n", b.NameB, "route", "add", "10.77.0.0/16", "dev", p.DevB, "table", fmt.Sprint(100 + i)},
		)
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			return err
		}
	}
	for i, rate := range cfg.Rates {
		if i < cfg.Paths && rate != "" {
			if err := b.SetRate(i, rate); err != nil {
				return err
			}
		}
	}
	return nil
}

// SetRate shapes path i to rate in both directions (tc tbf); "" removes
// the shaping.
func (b *Bed) SetRate(i int, rate string) error {
	p := b.Paths[i]
	for _, side := range [][2]string{{b.NameA, p.DevA}, {b.NameB, p.DevB}} {
		if rate == "" {
			run("ip", "netns", "exec", side[0], "tc", "qdisc", "del", "dev", side[1], "root")
			continue
		}
		if err := run("ip", "netns", "exec", side[0], "tc", "qdisc", "replace", "dev", side[1], "root",
			"tbf", "rate", rate, "burst", "64kb", "latency", "20ms"); err != nil {
			return err
		}
	}
	return nil
}

// SetDown takes path i down (or up again), as a failed link.
func (b *Bed) SetDown(i int, down bool) error {
	state := "up"
	if down {
		state = "down"
	}
	p := b.Paths[i]
	if err := run("ip", "-n", b.NameA, "link", "set", p.DevA, state); err != nil {
		return err
	}
	return run("ip", "-n", b.NameB, "link", "set", p.DevB, state)
}

// TxBytes returns the bytes namespace ns's device dev has sent.
func (b *Bed) TxBytes(ns, dev string) (uint64, error) {
	out, err := exec.Command("ip", "netns", "exec", ns, "cat", "/sys/class/net/"+dev+"/statistics/tx_bytes").Output()
	if err != nil {
		return 0, err
	}
	var n uint64
	_, err = fmt.Sscan(string(out), &n)
	return n, err
}

// In runs f with the calling goroutine's OS thread inside namespace ns;
// sockets f opens belong to ns and keep working from any goroutine after.
func (b *Bed) In(ns string, f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return err
	}
	defer self.Close()
	target, err := os.Open("/var/run/netns/" + ns)
	if err != nil {
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("testbed: setns %s: %w", ns, err)
	}
	defer func() {
		if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
			// A thread stuck in the wrong namespace must not be reused.
			panic(fmt.Sprintf("testbed: restoring the network namespace: %v", err))
		}
	}()
	return f()
}

// Close removes the testbed.
func (b *Bed) Close() {
	// Deleting a namespace deletes its veth ends, and with them the peers.
	run("ip", "netns", "del", b.NameA)
	run("ip", "netns", "del", b.NameB)
}
