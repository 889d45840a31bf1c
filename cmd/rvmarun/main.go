// Command rvmarun starts the ranks of an rvma job on this host, the mpirun
// role:
//
//	rvmarun -n N [--provider auto|udp|shm] [--addr IP] prog [args...]
//
// It serves the job's rendezvous, starts N processes of prog with
// RVMA_RANK, RVMA_SIZE and RVMA_KVS set (rma.Init reads them), shares the
// cores among them (GOMAXPROCS; with more ranks than cores also
// RVMA_SPIN=0s, so that waits block instead of spinning), prefixes every
// line they print with their rank, forwards SIGINT, SIGTERM, SIGQUIT and
// SIGHUP, and, when a rank fails, stops the others and exits with the
// first failure's status.
//
// The ranks die with rvmarun, even by kill -9: each gets SIGKILL as its
// parent-death signal, and RVMA_LAUNCHER_PID for rma.Init's watch
// (launch.Watch), which covers ranks started through a wrapper. They
// start with the default action for SIGINT, SIGTERM, SIGQUIT and SIGHUP
// whatever rvmarun was started with. Before starting any, rvmarun checks
// that the host can hold -n ranks (open files, memory).
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/rvma/rvma/internal/kvs"
	"github.com/rvma/rvma/internal/launch"
	"github.com/rvma/rvma/internal/spin"
	"github.com/rvma/rvma/rma"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
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
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: rvmarun -n N [flags] prog [args...]\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
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
	if err := checkHost(*n, *memPerRank); err != nil {
		fmt.Fprintf(stderr, "rvmarun: %v\n", err)
		return 2
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
	srv, err := kvs.ListenConfig("127.0.0.1:0", *n, &kvs.ServerConfig{Logger: logger, Key: key})
	if err != nil {
		fmt.Fprintf(stderr, "rvmarun: %v\n", err)
		return 1
	}
	defer srv.Close()

	done := make(chan struct{}) // closed when run returns: no more signals to the ranks' groups
	defer close(done)
	cmds := make([]*exec.Cmd, *n)
	var copiers sync.WaitGroup
	for r := range *n {
		cmd := exec.Command(fs.Arg(0), fs.Args()[1:]...)
		cmd.Env = append(os.Environ(),
			rma.EnvRank+"="+strconv.Itoa(r), rma.EnvSize+"="+strconv.Itoa(*n), rma.EnvKVS+"="+srv.Addr(),
			rma.EnvProvider+"="+*provider, rma.EnvAddr+"="+*addr,
			rma.EnvPaths+"="+strconv.Itoa(*paths),
			launch.EnvPID+"="+strconv.Itoa(os.Getpid()), launch.EnvKey+"="+launch.EncodeKey(key))
		if *rcTimeout > 0 {
			cmd.Env = append(cmd.Env, rma.EnvRCTimeout+"="+rcTimeout.String())
		}
		if _, set := os.LookupEnv(spin.EnvSpin); !set && *n > runtime.NumCPU() {
			// More ranks than cores: a spinning rank holds the core its
			// peer needs, so waits block at once (measured on halo3d, 4
			// ranks on 2 cores: fence 1.2-1.4 ms instead of 1.6-1.7, notify
			// slightly faster; with a core per rank spinning wins).
			cmd.Env = append(cmd.Env, spin.EnvSpin+"=0s")
		}
		if _, set := os.LookupEnv("GOMAXPROCS"); !set {
			// Share the cores among the ranks, as MPI launchers bind
			// ranks to cores: a rank's spinning goroutines then take
			// turns on its own processor instead of taking the others'.
			cmd.Env = append(cmd.Env, "GOMAXPROCS="+strconv.Itoa(max(1, runtime.NumCPU() / *n)))
		}
		// Our own pipes rather than exec's: exec's Wait closes them when
		// the process exits, which can cut its last lines.
		po, wo, err := os.Pipe()
		if err != nil {
			fmt.Fprintf(stderr, "rvmarun: %v\n", err)
			kill(cmds[:r], 0, done)
			return 1
		}
		pe, we, err := os.Pipe()
		if err != nil {
			fmt.Fprintf(stderr, "rvmarun: %v\n", err)
			po.Close()
			wo.Close()
			kill(cmds[:r], 0, done)
			return 1
		}
		cmd.Stdout, cmd.Stderr = wo, we
		cmd.SysProcAttr = rankAttr()
		err = cmd.Start()
		wo.Close()
		we.Close()
		if err != nil {
			fmt.Fprintf(stderr, "rvmarun: rank %d: %v\n", r, err)
			po.Close()
			pe.Close()
			kill(cmds[:r], 0, done)
			return 1
		}
		cmds[r] = cmd
		prefix := ""
		if *tag {
			prefix = fmt.Sprintf("[%d] ", r)
		}
		for _, p := range []struct {
			in  io.Reader
			out io.Writer
		}{{po, stdout}, {pe, stderr}} {
			copiers.Add(1)
			go func() {
				defer copiers.Done()
				defer p.in.(io.Closer).Close()
				sc := bufio.NewScanner(p.in)
				sc.Buffer(make([]byte, 64<<10), 1<<20)
				for sc.Scan() {
					outMu.Lock()
					fmt.Fprintf(p.out, "%s%s\n", prefix, sc.Text())
					outMu.Unlock()
				}
			}()
		}
	}

	type exit struct {
		rank int
		err  error
	}
	exits := make(chan exit, *n)
	for r, cmd := range cmds {
		go func() { exits <- exit{r, cmd.Wait()} }()
	}
	status, left, failed := 0, *n, false
	for left > 0 {
		select {
		case s := <-sigs:
			if !forward(s) {
				continue
			}
			for _, c := range cmds {
				signalGroup(c, s.(syscall.Signal))
			}
		case e := <-exits:
			left--
			if e.err != nil && !failed {
				failed = true
				status = exitStatus(e.err)
				outMu.Lock()
				fmt.Fprintf(stderr, "rvmarun: rank %d failed (%v); stopping the others\n", e.rank, e.err)
				outMu.Unlock()
				go kill(cmds, *grace, done)
			}
		}
	}
	copiers.Wait()
	return status
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

func exitStatus(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		if c := ee.ExitCode(); c > 0 {
			return c
		}
	}
	return 1
}

// kill sends SIGTERM to the ranks' process groups, then SIGKILL after
// grace, unless run has returned by then (the groups' IDs may be reused).
func kill(cmds []*exec.Cmd, grace time.Duration, done <-chan struct{}) {
	for _, c := range cmds {
		signalGroup(c, syscall.SIGTERM)
	}
	select {
	case <-time.After(grace):
	case <-done:
		return
	}
	for _, c := range cmds {
		signalGroup(c, syscall.SIGKILL)
	}
}

// signalGroup signals a rank's process group; it fails harmlessly for
// ranks already gone.
func signalGroup(c *exec.Cmd, s syscall.Signal) {
	if c != nil && c.Process != nil {
		syscall.Kill(-c.Process.Pid, s)
	}
}
