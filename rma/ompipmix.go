package rma

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/rvma/rvma/internal/kvs"
	"github.com/rvma/rvma/internal/launch"
	"github.com/rvma/rvma/internal/pmix"
)

// Across nodes, Open MPI's ranks meet through PMIx, which every node's
// daemon serves to the ranks it started: rank 0 serves the rendezvous on
// an address the other nodes reach and puts "address key" under
// rendezvousPMIx; every rank enters a fence that collects what was put,
// the others read rank 0's value, and each finalizes its PMIx session at
// once (Open MPI expects a process that connected to finalize before it
// exits; nothing else is asked of PMIx).
//
// What crosses PMIx: the rendezvous's address, and the job's key when
// rank 0 made it (RVMA_KEY and RVMA_KEY_FILE unset). PMIx's key-value
// space is the job's, and Open MPI's own connection data travels the same
// way, but it is not as closed as the session directory (mode 0700) that
// a job of one node publishes in: PMIx 4's server (Open MPI 4.1's, here)
// listens on loopback TCP, and the "native" credential it checks is the
// uid and gid the client claims. Another user of a node who learns the
// job's namespace (Open MPI derives it from mpirun's host name and pid)
// and the server's port can connect as one of its ranks and read the
// key. Where nodes are shared with users outside the job, give the job a
// key file (rvmarun --make-key FILE, then RVMA_KEY_FILE=FILE, on a shared
// file system): only the address then crosses PMIx.

// Open MPI's and rvma's variables the PMIx bootstrap reads.
const (
	// EnvOMPIPMIx chooses how ranks under Open MPI's mpirun meet: "1"
	// through PMIx even on one node (what tests use to exercise Open
	// MPI's server), "0" never through PMIx (across nodes
	// RVMA_RENDEZVOUS must then name where rank 0 serves); unset, through
	// PMIx when the job spans several nodes, else through a file of the
	// session directory.
	EnvOMPIPMIx     = "RVMA_OMPI_PMIX"
	envOMPIHNPURI   = "OMPI_MCA_orte_hnp_uri" // Open MPI 4: mpirun's own address, "JOB;tcp://IP[,IP...]:PORT;..."
	envPMIxHostname = "PMIX_HOSTNAME"         // the name of the node the rank runs on
	rendezvousPMIx  = "rvma-rendezvous"       // the key rank 0 puts
)

// pmixRendezvous bootstraps rank r of s through the node's PMIx server:
// rank 0 serves the rendezvous and publishes it, the others read it after
// the fence. It returns the address this rank's devices should bind (one
// the other nodes reach) in boot.addr.
func pmixRendezvous(ctx context.Context, r, s int, env pmix.Env) (b boot, err error) {
	key, err := launch.KeyFromEnv()
	ownKey := errors.Is(err, launch.ErrNoKey)
	if ownKey {
		key, err = nil, nil
	}
	if err != nil {
		return boot{}, err
	}
	cl, err := pmix.Dial(ctx, env.URI, env.Proc, nil)
	if err != nil {
		return boot{}, err
	}
	defer func() {
		if err != nil {
			cl.Close(ctx) // the bootstrap's error says more than the finalize's
		}
		if err != nil && b.srv != nil {
			b.srv.Close()
			b = boot{}
		}
	}()
	var srv *kvs.Server
	var addr, bind string
	if r == 0 {
		if bind, err = ompiAddr(); err != nil {
			return boot{}, err
		}
		if ownKey {
			key = launch.NewKey()
		}
		if srv, err = kvs.ListenConfig(net.JoinHostPort(bind, "0"), s, &kvs.ServerConfig{Key: key}); err != nil {
			return boot{}, err
		}
		b.srv = srv // closed by the deferred function if a later step fails
		addr = srv.Addr()
		v := addr
		if ownKey {
			v += " " + launch.EncodeKey(key)
		}
		cl.Put(rendezvousPMIx, v)
	}
	if err := cl.Commit(ctx); err != nil {
		return b, err
	}
	if err := cl.Fence(ctx, true); err != nil {
		return b, err
	}
	if r != 0 {
		v, err := cl.Get(ctx, 0, rendezvousPMIx)
		if err != nil {
			return b, err
		}
		a, k, hasKey := strings.Cut(v, " ")
		if _, _, err := net.SplitHostPort(a); err != nil {
			return b, fmt.Errorf("rank 0's %s %q: %w", rendezvousPMIx, v, err)
		}
		if hasKey != ownKey {
			return b, fmt.Errorf("rank 0 published the rendezvous %s the job's key, but this rank has %s: give every rank RVMA_KEY_FILE, or none",
				map[bool]string{true: "with", false: "without"}[hasKey], map[bool]string{true: "none", false: "one"}[ownKey])
		}
		if hasKey {
			if key, err = launch.DecodeKey(k); err != nil {
				return b, fmt.Errorf("rank 0's %s: %w", rendezvousPMIx, err)
			}
		}
		addr = a
		h, _, _ := net.SplitHostPort(a)
		if bind, err = launch.RouteTo(h); err != nil {
			return b, fmt.Errorf("no route to the rendezvous at %s: %w", a, err)
		}
	}
	// Finalize before the rendezvous's barrier, so that no rank holds its
	// session while it waits for the slowest; a second Close (deferred) is
	// a no-op. What PMIx had to give is given: a finalize that fails (its
	// acknowledgement lost or late) costs at most a complaint from Open
	// MPI at exit, not the job, as with the C client, which does not wait
	// longer either.
	if err := cl.Close(ctx); err != nil {
		slog.Warn("rma: finalizing PMIx", "err", err)
	}
	cl2, err := kvs.Dial(ctx, addr, key)
	if err != nil {
		return b, fmt.Errorf("the rendezvous %s that rank 0 published through PMIx: %w", addr, err)
	}
	return boot{rank: r, size: s, store: cl2, own: true, srv: srv, key: key, addr: bind, host: ompiHost()}, nil
}

// ompiHost is the host identity of a rank of a job across nodes: the
// kernel's, and the name of the node Open MPI placed it on, so that ranks
// of two nodes never take each other for neighbours, even where the
// nodes share a kernel (containers, network namespaces), as rvmarun -H
// does with the names of its hosts.
func ompiHost() string {
	node := os.Getenv(envPMIxHostname)
	if node == "" {
		node, _ = os.Hostname()
	}
	return hostIdentity() + "/" + node
}

// ompiAddr is the address rank 0 serves the rendezvous on and its
// devices bind: RVMA_ADDR's first if set; else the one this node uses to
// reach mpirun's node, which Open MPI's daemons reached it through (on
// mpirun's node, mpirun's own first address); else this node's first
// non-loopback IPv4 address.
func ompiAddr() (string, error) {
	if a := os.Getenv(EnvAddr); a != "" {
		first, _, _ := strings.Cut(a, ",")
		return strings.TrimSpace(first), nil
	}
	for _, ip := range hnpAddrs(os.Getenv(envOMPIHNPURI)) {
		if a, err := launch.RouteTo(ip); err == nil && !net.ParseIP(a).IsLoopback() {
			return a, nil
		}
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String(), nil
		}
	}
	return "", errors.New("this node has no address other nodes could reach (no IPv4 address but loopback); set RVMA_ADDR")
}

// hnpAddrs lists the IPv4 addresses of an Open MPI 4 contact URI
// ("JOB.VPID;tcp://IP1,IP2:PORT;tcp6://[IP6]:PORT").
func hnpAddrs(uri string) []string {
	var ips []string
	for _, part := range strings.Split(uri, ";") {
		rest, ok := strings.CutPrefix(part, "tcp://")
		if !ok {
			continue
		}
		if i := strings.LastIndexByte(rest, ':'); i >= 0 {
			rest = rest[:i]
		}
		for _, ip := range strings.Split(rest, ",") {
			if p := net.ParseIP(ip); p != nil && p.To4() != nil {
				ips = append(ips, ip)
			}
		}
	}
	return ips
}
