package testbed

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"testing"
)

// HostsConfig describes a many-host testbed. The zero value means two
// unshaped hosts.
type HostsConfig struct {
	// Hosts is the number of hosts (network namespaces); default 2,
	// range 1..200.
	Hosts int
	// Rate shapes every host's port on the switch, both directions (a tc
	// rate such as "1gbit"); "": unshaped.
	Rate string
}

// Hosts is a built many-host testbed: each host a network namespace with
// one address, all joined by a bridge (the switch) in a namespace of its
// own, as hosts on one top-of-rack switch.
type Hosts struct {
	Names  []string     // the hosts' namespace names
	Addrs  []netip.Addr // host i's address (10.78.0.0/16)
	Switch string       // the switch's namespace
	tag    string
}

// NewHosts builds a many-host testbed, or skips t when it cannot (not
// root, no ip or tc). It is removed when t ends.
func NewHosts(t testing.TB, cfg HostsConfig) *Hosts {
	t.Helper()
	var h *Hosts
	build(t, func() (func(), error) {
		var err error
		h, err = BuildHosts(cfg)
		if h == nil {
			return nil, err
		}
		return h.Close, err
	})
	return h
}

// BuildHosts builds a many-host testbed; Close removes it (also after a
// failed BuildHosts, whose partial testbed it returns).
func BuildHosts(cfg HostsConfig) (*Hosts, error) {
	if cfg.Hosts == 0 {
		cfg.Hosts = 2
	}
	if cfg.Hosts < 1 || cfg.Hosts > 200 {
		return nil, fmt.Errorf("testbed: %d hosts, want 1..200", cfg.Hosts)
	}
	var r [3]byte
	rand.Read(r[:])
	tag := hex.EncodeToString(r[:])
	h := &Hosts{Switch: "rvmaS" + tag, tag: tag}
	steps := [][]string{
		{"ip", "netns", "add", h.Switch},
		{"ip", "-n", h.Switch, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", h.Switch, "link", "set", "br0", "up"},
	}
	for i := range cfg.Hosts {
		ns := fmt.Sprintf("rvmaH%d%s", i, tag)
		a := netip.AddrFrom4([4]byte{10, 78, byte((i + 1) >> 8), byte(i + 1)})
		port, nic := fmt.Sprintf("p%d", i), fmt.Sprintf("e%s", tag)
		h.Names = append(h.Names, ns)
		h.Addrs = append(h.Addrs, a)
		steps = append(steps,
			[]string{"ip", "netns", "add", ns},
			[]string{"ip", "-n", ns, "link", "set", "lo", "up"},
			[]string{"ip", "link", "add", nic, "netns", ns, "type", "veth", "peer", "name", port, "netns", h.Switch},
			[]string{"ip", "-n", h.Switch, "link", "set", port, "master", "br0"},
			[]string{"ip", "-n", h.Switch, "link", "set", port, "up"},
			[]string{"ip", "-n", ns, "addr", "add", a.String() + "/16", "dev", nic},
			[]string{"ip", "-n", ns, "link", "set", nic, "up"},
		)
		if cfg.Rate != "" {
			for _, side := range [][2]string{{ns, nic}, {h.Switch, port}} {
				steps = append(steps, []string{"ip", "netns", "exec", side[0], "tc", "qdisc", "replace", "dev", side[1], "root",
					"tbf", "rate", cfg.Rate, "burst", "64kb", "latency", "20ms"})
			}
		}
	}
	for _, s := range steps {
		if err := run(s...); err != nil {
			return h, err
		}
	}
	return h, nil
}

// Close removes the testbed.
func (h *Hosts) Close() {
	for _, ns := range h.Names {
		run("ip", "netns", "del", ns)
	}
	run("ip", "netns", "del", h.Switch)
}
