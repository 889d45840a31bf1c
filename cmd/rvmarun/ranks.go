package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/rvma/rvma/internal/launch"
	"github.com/rvma/rvma/internal/spin"
	"github.com/rvma/rvma/rma"
)

// hostJob is what the ranks of one host need to start: rvmarun builds
// one for its own host, and sends one to the daemon of every other host
// (JSON on the daemon's standard input, never on a command line: it holds
// the job's key).
type hostJob struct {
	Host       string        // the host's name in the job: output tags and RVMA_HOST ("": a one-host job)
	Ranks      []int         // the ranks this host runs
	Size       int           // ranks in the job
	KVS        string        // the rendezvous; a daemon fills in an empty host (see daemonKVS)
	Key        []byte        // the job's key
	Provider   string        // RVMA_PROVIDER
	Addr       string        // the address the ranks bind ("": a daemon picks its host's route to the rendezvous)
	Paths      int           // RVMA_PATHS
	RCTimeout  time.Duration // RVMA_RC_TIMEOUT, when > 0
	Tag        bool          // prefix output lines with the rank (and host)
	MemPerRank int           // MiB, checked against the host's memory (0: an estimate)
	Grace      time.Duration // SIGTERM to SIGKILL when stopping
	Prog       string
	Args       []string
	Dir        string   // working directory ("": the current one)
	Env        []string // variables passed to every rank (NAME=VALUE)
}

// exit is how a rank ended.
type exit struct {
	rank int
	err  error
}

// group is the ranks of one host, started by rvmarun or by its daemon.
type group struct {
	job     *hostJob
	cmds    []*exec.Cmd
	exits   chan exit
	copiers sync.WaitGroup
	outMu   *sync.Mutex
	stderr  io.Writer
	done    chan struct{} // closed when the group is over: no more signals to the ranks' groups
}

// tag is the prefix of a rank's output lines.
func (j *hostJob) tag(r int) string {
	switch {
	case !j.Tag:
		return ""
	case j.Host == "":
		return fmt.Sprintf("[%d] ", r)
	default:
		return fmt.Sprintf("[%d@%s] ", r, j.Host)
	}
}

// where names a rank in messages.
func (j *hostJob) where(r int) string {
	if j.Host == "" {
		return fmt.Sprintf("rank %d", r)
	}
	return fmt.Sprintf("rank %d on %s", r, j.Host)
}

// env is rank r's environment.
func (j *hostJob) env(r int) []string {
	env := append(os.Environ(), j.Env...)
	env = append(env,
		rma.EnvRank+"="+strconv.Itoa(r), rma.EnvSize+"="+strconv.Itoa(j.Size), rma.EnvKVS+"="+j.KVS,
		rma.EnvProvider+"="+j.Provider, rma.EnvAddr+"="+j.Addr,
		rma.EnvPaths+"="+strconv.Itoa(j.Paths),
		launch.EnvPID+"="+strconv.Itoa(os.Getpid()), launch.EnvKey+"="+launch.EncodeKey(j.Key))
	if j.Host != "" {
		// Ranks of one host share memory, whatever their kernel says:
		// hosts of a testbed are network namespaces of one kernel.
		env = append(env, rma.EnvHost+"="+j.Host)
	}
	if j.RCTimeout > 0 {
		env = append(env, rma.EnvRCTimeout+"="+j.RCTimeout.String())
	}
	n := len(j.Ranks)
	if _, set := os.LookupEnv(spin.EnvSpin); !set && n > runtime.NumCPU() {
		// More ranks than cores: a spinning rank holds the core its
		// peer needs, so waits block at once (measured on halo3d, 4
		// ranks on 2 cores: fence 1.2-1.4 ms instead of 1.6-1.7, notify
		// slightly faster; with a core per rank spinning wins).
		env = append(env, spin.EnvSpin+"=0s")
	}
	if _, set := os.LookupEnv("GOMAXPROCS"); !set {
		// Share the cores among the ranks, as MPI launchers bind
		// ranks to cores: a rank's spinning goroutines then take
		// turns on its own processor instead of taking the others'.
		env = append(env, "GOMAXPROCS="+strconv.Itoa(max(1, runtime.NumCPU()/n)))
	}
	return env
}

// startGroup starts the ranks of j, copying their output, line by line
// and tagged, to stdout and stderr under outMu. On an error the ranks
// already started are stopped.
func startGroup(j *hostJob, stdout, stderr io.Writer, outMu *sync.Mutex) (*group, error) {
	g := &group{job: j, cmds: make([]*exec.Cmd, len(j.Ranks)), exits: make(chan exit, len(j.Ranks)),
		outMu: outMu, stderr: stderr, done: make(chan struct{})}
	fail := func(err error) (*group, error) {
		g.kill(0)
		close(g.done)
		g.copiers.Wait()
		return nil, err
	}
	for i, r := range j.Ranks {
		cmd := exec.Command(j.Prog, j.Args...)
		cmd.Env, cmd.Dir = j.env(r), j.Dir
		cmd.SysProcAttr = rankAttr()
		if err := startCopied(cmd, stdout, stderr, j.tag(r), outMu, &g.copiers); err != nil {
			return fail(fmt.Errorf("%s: %w", j.where(r), err))
		}
		g.cmds[i] = cmd
	}
	for i, cmd := range g.cmds {
		go func() { g.exits <- exit{j.Ranks[i], cmd.Wait()} }()
	}
	return g, nil
}

// copyLines copies in to out a line at a time, each with prefix, under mu.
func copyLines(in io.Reader, out io.Writer, prefix string, mu *sync.Mutex) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		mu.Lock()
		fmt.Fprintf(out, "%s%s\n", prefix, sc.Text())
		mu.Unlock()
	}
}

// supervise waits for every rank, forwarding signals (sigs, as forward
// says) and orders (stop: stop the ranks; sig: signal them). At the first
// rank that fails it stops the others; it returns the first failure's
// status, or 0.
func (g *group) supervise(sigs <-chan os.Signal, forward func(os.Signal) bool, orders <-chan order) int {
	defer close(g.done)
	status, left, failed := 0, len(g.cmds), false
	for left > 0 {
		select {
		case s := <-sigs:
			if forward(s) {
				g.signal(s.(syscall.Signal))
			}
		case o, ok := <-orders:
			switch {
			case !ok:
				orders = nil // the launcher is gone: stop, once
				fallthrough
			case o.stop:
				if !failed {
					failed = true
					go g.kill(g.job.Grace)
				}
			default:
				g.signal(o.sig)
			}
		case e := <-g.exits:
			left--
			if e.err != nil && !failed {
				failed = true
				status = exitStatus(e.err)
				g.outMu.Lock()
				fmt.Fprintf(g.stderr, "rvmarun: %s failed (%v); stopping the others\n", g.job.where(e.rank), e.err)
				g.outMu.Unlock()
				go g.kill(g.job.Grace)
			}
		}
	}
	g.copiers.Wait()
	return status
}

// order is what a daemon's launcher tells it: stop the ranks, or pass
// them a signal.
type order struct {
	stop bool
	sig  syscall.Signal
}

// kill sends SIGTERM to the ranks' process groups, then SIGKILL after
// grace, unless the group is over by then (the groups' IDs may be reused).
func (g *group) kill(grace time.Duration) {
	g.signal(syscall.SIGTERM)
	select {
	case <-time.After(grace):
	case <-g.done:
		return
	}
	g.signal(syscall.SIGKILL)
}

// signal signals every rank's process group; it fails harmlessly for
// ranks already gone.
func (g *group) signal(s syscall.Signal) {
	for _, c := range g.cmds {
		signalGroup(c, s)
	}
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
