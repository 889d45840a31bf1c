package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// socketDrops returns what counts the datagrams the kernel dropped on
// the UDP sockets bound to gids (their receive buffers overflowed): the
// receiver's flow control shrinks its window when they grow. It reads
// /proc/net/udp and udp6 (Linux; elsewhere it counts nothing).
func socketDrops(gids []netip.AddrPort) func() uint64 {
	ports := map[string]bool{}
	for _, g := range gids {
		ports[fmt.Sprintf(":%04X", g.Port())] = true
	}
	return func() uint64 {
		var n uint64
		for _, f := range []string{"/proc/net/udp", "/proc/net/udp6"} {
			b, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			n += parseDrops(b, ports)
		}
		return n
	}
}

// parseDrops sums the drops column of /proc/net/udp's lines whose local
// address ends in one of ports (":HHHH").
func parseDrops(b []byte, ports map[string]bool) uint64 {
	var n uint64
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 13 || f[0] == "sl" {
			continue
		}
		local := f[1]
		if i := strings.LastIndexByte(local, ':'); i < 0 || !ports[local[i:]] {
			continue
		}
		if d, err := strconv.ParseUint(f[len(f)-1], 10, 64); err == nil {
			n += d
		}
	}
	return n
}
