// Command rvmarun starts the ranks of an rvma job, the mpirun role:
//
//	rvmarun -n N [--provider auto|udp|shm] [--addr IP] prog [args...]
//	rvmarun [-n N] -H HOST[:SLOTS],... | --hostfile FILE [--launch-agent CMD] prog [args...]
//
// With hosts it starts "rvmarun --daemon" on each through the launch agent
// (daemon.go), which starts that host's ranks as below.
//
// It serves the job's rendezvous, starts N processes of prog with
// RVMA_RANK, RVMA_SIZE and RVMA_KVS set (rma.Init reads them), shares the
// cores among them (GOMAXPROCS; with more ranks than cores also
// RVMA_SPIN: see spinFor), prefixes every
// line they print with their rank, forwards SIGINT, SIGTERM, SIGQUIT and
// SIGHUP, and, when a rank fails, stops the others and exits with the
// first failure's status.
//
// With --restart K a rank whose process dies (a non-zero status or a
// signal) is started again instead, with the same rank, arguments and
// environment and the next incarnation number in RVMA_INCARNATION (0 at
// the first start, set only with --restart), up to K times per rank;
// the rendezvous records the death as soon as rvmarun sees it, and the
// new incarnation before it starts (kvs.Server.Died and Respawned), for
// the survivors' Comm.Recover. A rank's K+1st death, or a death once the
// job is ending (a signal was forwarded), fails the job as above; so
// does a restart that cannot start. A rank that exits 0 is done.
//
// --kill RANK@DURATION, random@SEED or random@SEED:MIN-MAX has rvmarun
// kill a rank's current incarnation (its process group) with SIGKILL
// once, at a time after the ranks started: a demo and test of restarts.
//
// The ranks die with rvmarun, even by kill -9: each gets SIGKILL as its
// parent-death signal, and RVMA_LAUNCHER_PID for rma.Init's watch
// (launch.Watch), which covers ranks started through a wrapper. They
// start with the default action for SIGINT, SIGTERM, SIGQUIT and SIGHUP
// whatever rvmarun was started with. Before starting any, rvmarun checks
// that the host can hold -n ranks (open files, memory).
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rvma/rvma/internal/kvs"
	"github.com/rvma/rvma/internal/launch"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && args[0] == daemonFlag {
		return daemon(os.Stdin, stdout, stderr)
	}
	fs := flag.NewFlagSet("rvmarun", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n := fs.Int("n", 1, "number of ranks")
	provider := fs.String("provider", "auto", "verbs provider between ranks: auto (ranks of one host over shared memory, the rest over UDP; here every rank is on this host), udp, or shm")
	addr := fs.String("addr", "127.0.0.1", "local IP address the ranks bind, or a comma-separated list, one per path")
	paths := fs.Int("paths", 1, "paths per connection between two ranks (1..64): large puts and gets are split over them")
	grace := fs.Duration("grace", 3*time.Second, "how long ranks get to exit after SIGTERM before SIGKILL")
	tag := fs.Bool("tag-output", true, "prefix every output line with the rank")
	rcTimeout := fs.Duration("rc-timeout", 0, "the ranks' RC retransmission timeout floor (rma.Config.Connect.Timeout; 0: the library's default, 20ms, adapted to measured round trips)")
	makeKey := fs.String("make-key", "", "write a new job key to `FILE` (mode 0600) and exit: for launchers that pass no secret (Slurm: RVMA_KEY_FILE=FILE)")
	memPerRank := fs.Int("mem-per-rank", 0, "MiB of memory a rank needs, checked against what the host has before any rank starts (0: an estimate, 16 MiB and 64 KiB per rank of the job)")
	hostList := fs.String("H", "", "run on these hosts, Open MPI's syntax: `HOST[:SLOTS],...` (a host without a count has one slot)")
	hostfile := fs.String("hostfile", "", "run on the hosts of `FILE`: a line per host, \"HOST [slots=N]\", # for comments")
	agent := fs.String("launch-agent", "ssh -x", "the command that runs a program on another host, given the host and the program: ssh, or any prefix such as \"ip netns exec\"")
	mapBy := fs.String("map-by", "slot", "how ranks are placed on the hosts: slot (fill each host's slots in turn) or node (one rank per host in turn)")
	npernode := fs.Int("npernode", 0, "ranks per host (0: as --map-by places them)")
	oversubscribe := fs.Bool("oversubscribe", false, "allow more ranks on a host than its slots")
	rendezvous := fs.String("rendezvous-addr", "", "with hosts: the `IP` of this host on which the job's rendezvous listens, which every host reaches (default: any address, and each host uses the address its ssh connection came from)")
	restart := fs.Int("restart", 0, "start a rank whose process dies (fails or is killed) again, as its next incarnation (RVMA_INCARNATION), up to `K` times per rank; 0: the first failure ends the job")
	var killSpecs []string
	fs.Func("kill", "kill a rank with SIGKILL at a time after the job's start, for demos and tests: `RANK@DURATION` (1@2.5s), random@SEED, or random@SEED:MIN-MAX (a rank and a time in [MIN,MAX], default 0.5s-3s, drawn from SEED); repeatable", func(v string) error {
		killSpecs = append(killSpecs, v)
		return nil
	})
	var exports []string
	fs.Func("x", "pass the environment variable `NAME` (or NAME=VALUE) to every rank on every host; repeatable", func(v string) error {
		if v == "" || strings.HasPrefix(v, "=") {
			return fmt.Errorf("want NAME or NAME=VALUE")
		}
		if !strings.Contains(v, "=") {
			v += "=" + os.Getenv(v)
		}
		exports = append(exports, v)
		return nil
	})
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: rvmarun -n N [-H HOST[:SLOTS],... | --hostfile FILE] [flags] prog [args...]\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	nSet := false
	fs.Visit(func(f *flag.Flag) { nSet = nSet || f.Name == "n" })
	if *makeKey != "" {
		if err := launch.WriteKeyFile(*makeKey); err != nil {
			fmt.Fprintf(stderr, "rvmarun: %v\n", err)
			return 1
		}
		return 0
	}
	if *n < 1 {
		fmt.Fprintf(stderr, "rvmarun: -n %d: want 1 rank or more\n", *n)
		return 2
	}
	if fs.NArg() < 1 {
		fs.Usage()
		return 2
	}
	switch *provider {
	case "auto", "udp", "shm":
	case "loop":
		fmt.Fprintln(stderr, "rvmarun: the loop provider connects ranks of one process only; use rma.NewWorld, or --provider udp")
		return 2
	default:
		fmt.Fprintf(stderr, "rvmarun: unknown provider %q\n", *provider)
		return 2
	}
	if *paths < 1 || *paths > 64 {
		fmt.Fprintf(stderr, "rvmarun: --paths %d: want 1..64\n", *paths)
		return 2
	}
	if *memPerRank < 0 {
		fmt.Fprintf(stderr, "rvmarun: --mem-per-rank %d: want 0 (the estimate) or more MiB\n", *memPerRank)
		return 2
	}
	if *restart < 0 {
		fmt.Fprintf(stderr, "rvmarun: --restart %d: want 0 (no restarts) or more\n", *restart)
		return 2
	}
	var hc *hostsConfig
	if *hostList != "" || *hostfile != "" || *npernode != 0 {
		var err error
		if hc, err = planHosts(*hostList, *hostfile, *agent, *mapBy, *npernode, *oversubscribe, n, nSet); err != nil {
			fmt.Fprintf(stderr, "rvmarun: %v\n", err)
			return 2
		}
		hc.rendezvous = *rendezvous
	}
	var kills []killSpec
	for _, spec := range killSpecs {
		k, err := parseKill(spec, *n)
		if err != nil {
			fmt.Fprintf(stderr, "rvmarun: %v\n", err)
			return 2
		}
		kills = append(kills, k)
	}
	if hc == nil {
		if err := checkHost(*n, *n, *memPerRank); err != nil {
			fmt.Fprintf(stderr, "rvmarun: %v\n", err)
			return 2
		}
	}

	sigs, forward := catchSignals()
	defer signal.Stop(sigs)

	// The kernel sends a parent-death signal when the thread that forked
	// the child ends, not the process: this goroutine keeps its thread
	// until the ranks are done (Go ends a thread only under a goroutine
	// that exits locked to it).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	var outMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(lockedWriter{&outMu, stderr}, nil))
	// The job's key: the rendezvous admits, and the ranks' connection
	// managers accept, only holders. It reaches the ranks in their
	// environment, which other users cannot read, never on a command line.
	key, err := launch.KeyFromEnv()
	if errors.Is(err, launch.ErrNoKey) {
		key, err = launch.NewKey(), nil
	}
	if err != nil {
		fmt.Fprintf(stderr, "rvmarun: %v\n", err)
		return 1
	}
	job := &hostJob{Size: *n, Key: key, Provider: *provider, Addr: *addr, Paths: *paths, RCTimeout: *rcTimeout,
		Tag: *tag, Grace: *grace, MemPerRank: *memPerRank, Prog: fs.Arg(0), Args: fs.Args()[1:], Env: exports,
		Restart: *restart}
	if hc != nil {
		signal.Stop(sigs)
		if !addrSet(fs) {
			job.Addr = "" // each host binds its own route to the rendezvous
		}
		return runHosts(hc, job, kills, func(addr string) (string, func(), error) {
			srv, err := kvs.ListenConfig(addr, *n, &kvs.ServerConfig{Logger: logger, Key: key})
			if err != nil {
				return "", nil, err
			}
			return srv.Addr(), func() { srv.Close() }, nil
		}, stdout, stderr)
	}
	srv, err := kvs.ListenConfig("127.0.0.1:0", *n, &kvs.ServerConfig{Logger: logger, Key: key})
	if err != nil {
		fmt.Fprintf(stderr, "rvmarun: %v\n", err)
		return 1
	}
	defer srv.Close()

	job.KVS, job.Ranks = srv.Addr(), make([]int, *n)
	for r := range job.Ranks {
		job.Ranks[r] = r
	}
	g, err := startGroup(job, serverRecorder{srv}, stdout, stderr, &outMu)
	if err != nil {
		fmt.Fprintf(stderr, "rvmarun: %v\n", err)
		return 1
	}
	var orders chan order
	if len(kills) > 0 {
		orders = make(chan order)
		go scheduleKills(kills, func(k killSpec) {
			select {
			case orders <- order{kill: true, rank: k.rank, at: k.at}:
			case <-g.done:
			}
		}, g.done)
	}
	return g.supervise(sigs, forward, orders)
}

// catchSignals handles the signals rvmarun forwards to the ranks. A
// handled signal gets its default action back in the ranks (exec keeps
// only ignored ones ignored), so this comes before any rank starts, and
// covers signals rvmarun was started with ignored: "rvmarun &" in a
// script ignores SIGINT, and then so would every rank. forward says
// whether a signal received is for the ranks: a SIGHUP ignored at start
// (nohup) is not, the job keeps ignoring hangups.
func catchSignals() (sigs chan os.Signal, forward func(os.Signal) bool) {
	hupIgnored := signal.Ignored(syscall.SIGHUP)
	sigs = make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT, syscall.SIGHUP)
	return sigs, func(s os.Signal) bool { return s != syscall.SIGHUP || !hupIgnored }
}

// lockedWriter serializes writes with the output copiers'.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// addrSet reports whether --addr was given.
func addrSet(fs *flag.FlagSet) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == "addr" })
	return set
}
