package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// host is a host of a job and the ranks it may run.
type host struct {
	name  string
	slots int
}

// parseHostList reads -H's list, Open MPI's syntax: "a,b:2,c" (a host
// without a count has one slot; a host named twice adds its slots).
func parseHostList(s string) ([]host, error) {
	var hs []host
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			return nil, fmt.Errorf("-H %q: an empty host name", s)
		}
		name, slots := f, 1
		if i := strings.LastIndexByte(f, ':'); i >= 0 && !strings.Contains(f[:i], ":") {
			n, err := strconv.Atoi(f[i+1:])
			if err != nil || n < 1 {
				return nil, fmt.Errorf("-H %q: %q: want HOST or HOST:SLOTS with SLOTS 1 or more", s, f)
			}
			name, slots = f[:i], n
		}
		if name == "" {
			return nil, fmt.Errorf("-H %q: %q has no host name", s, f)
		}
		hs = addHost(hs, host{name, slots})
	}
	return hs, nil
}

// parseHostfile reads a hostfile in Open MPI's syntax: a host per line,
// optionally "slots=N" (or "HOST:N"); max_slots is accepted and ignored;
// "#" starts a comment.
func parseHostfile(r io.Reader, file string) ([]host, error) {
	var hs []host
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		text, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(text)
		if len(fields) == 0 {
			continue
		}
		bad := func(why string) error { return fmt.Errorf("%s:%d: %q: %s", file, line, sc.Text(), why) }
		hl, err := parseHostList(fields[0])
		if err != nil || len(hl) != 1 {
			return nil, bad("want HOST [slots=N]")
		}
		h := hl[0]
		for _, f := range fields[1:] {
			k, v, ok := strings.Cut(f, "=")
			n, err := strconv.Atoi(v)
			switch {
			case !ok || err != nil || n < 1:
				return nil, bad(fmt.Sprintf("%q: want slots=N or max_slots=N with N 1 or more", f))
			case k == "slots":
				h.slots = n
			case k == "max_slots":
			default:
				return nil, bad(fmt.Sprintf("unknown attribute %q (slots, max_slots)", k))
			}
		}
		hs = addHost(hs, h)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if len(hs) == 0 {
		return nil, fmt.Errorf("%s: no hosts", file)
	}
	return hs, nil
}

func addHost(hs []host, h host) []host {
	for i := range hs {
		if hs[i].name == h.name {
			hs[i].slots += h.slots
			return hs
		}
	}
	return append(hs, h)
}

// mapRanks places n ranks on hosts: by slot (fill each host's slots in
// turn, the default), by node (one rank per host in turn), or npernode
// per host in turn. More ranks than slots is refused unless oversubscribe
// (then the placement goes round again). It returns each host's ranks.
func mapRanks(hs []host, n int, mapBy string, npernode int, oversubscribe bool) ([][]int, error) {
	total := 0
	for _, h := range hs {
		total += h.slots
	}
	place := make([][]int, len(hs))
	switch {
	case npernode > 0:
		if n > npernode*len(hs) {
			return nil, fmt.Errorf("-n %d: --npernode %d on %d hosts places %d ranks", n, npernode, len(hs), npernode*len(hs))
		}
		if npernode > minSlots(hs) && !oversubscribe {
			return nil, fmt.Errorf("--npernode %d: a host has %d slots (--oversubscribe to run more ranks than slots)", npernode, minSlots(hs))
		}
		for r := range n {
			place[r/npernode] = append(place[r/npernode], r)
		}
		return place, nil
	case n > total && !oversubscribe:
		return nil, fmt.Errorf("-n %d: the hosts have %d slots (--oversubscribe to run more ranks than slots)", n, total)
	}
	switch mapBy {
	case "", "slot":
		r := 0
		for r < n {
			for i, h := range hs {
				for k := 0; k < h.slots && r < n; k++ {
					place[i] = append(place[i], r)
					r++
				}
			}
		}
	case "node":
		// One rank per host with a free slot, round after round; with
		// --oversubscribe, once every slot is taken, every host in turn.
		r := 0
		for round := 0; r < n; round++ {
			for i, h := range hs {
				if r < n && (round < h.slots || r >= total) {
					place[i] = append(place[i], r)
					r++
				}
			}
		}
	default:
		return nil, fmt.Errorf("--map-by %q: want slot or node", mapBy)
	}
	return place, nil
}

func minSlots(hs []host) int {
	m := hs[0].slots
	for _, h := range hs[1:] {
		m = min(m, h.slots)
	}
	return m
}

// isLocal reports whether name is this host, which rvmarun reaches
// without the launch agent.
func isLocal(name string) bool {
	switch name {
	case "localhost", "127.0.0.1", "::1":
		return true
	}
	hn, err := os.Hostname()
	if err != nil {
		return false
	}
	short, _, _ := strings.Cut(hn, ".")
	return name == hn || name == short
}

// planHosts reads the hosts of a job (-H or --hostfile) and places its
// ranks; without -n the job has as many ranks as slots (or --npernode per
// host).
func planHosts(list, file, agent, mapBy string, npernode int, oversubscribe bool, n *int, nSet bool) (*hostsConfig, error) {
	var hs []host
	var err error
	switch {
	case list != "" && file != "":
		return nil, fmt.Errorf("-H and --hostfile: give one")
	case list != "":
		hs, err = parseHostList(list)
	case file != "":
		f, ferr := os.Open(file)
		if ferr != nil {
			return nil, fmt.Errorf("--hostfile: %w", ferr)
		}
		defer f.Close()
		hs, err = parseHostfile(f, file)
	default:
		hs = []host{{name: "localhost", slots: 1 << 20}} // --npernode alone: this host
	}
	if err != nil {
		return nil, err
	}
	if npernode < 0 {
		return nil, fmt.Errorf("--npernode %d: want 1 or more", npernode)
	}
	if !nSet {
		*n = 0
		for _, h := range hs {
			*n += h.slots
		}
		if npernode > 0 {
			*n = npernode * len(hs)
		}
	}
	place, err := mapRanks(hs, *n, mapBy, npernode, oversubscribe)
	if err != nil {
		return nil, err
	}
	words := strings.Fields(agent)
	if len(words) == 0 {
		return nil, fmt.Errorf("--launch-agent: empty")
	}
	return &hostsConfig{hosts: hs, place: place, agent: words}, nil
}
