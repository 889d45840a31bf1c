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

	"golang.org/x/sys/unix"

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
	Restart    int      // times a rank that dies is started again (--restart; 0: the first failure ends the job)
}

// exit is how an incarnation of a rank ended.
type exit struct {
	i   int // the rank's index in job.Ranks
	err error
}

// group is the ranks of one host, started by rvmarun or by its daemon.
type group struct {
	job     *hostJob
	cmds    []*exec.Cmd // each rank's current incarnation
	inc     []uint32    // its number: the rank's restarts so far
	exits   chan exit
	copiers sync.WaitGroup
	stdout  io.Writer
	outMu   *sync.Mutex
	stderr  io.Writer
	rec     recorder      // with job.Restart > 0: where deaths and incarnations are recorded
	done    chan struct{} // closed when the group is over: no more signals to the ranks' groups
}

// recorder is the rendezvous's record of deaths and incarnations
// (kvs.Server's Died and Respawned, in rvmarun or through a client in a
// daemon): Died as soon as a rank's process is seen dead, Respawned
// before its next incarnation starts.
type recorder interface {
	Died(rank int) error
	Respawned(rank int, inc uint32) error
	// Finished records that a rank exited with success: a respawned rank
	// then has nothing to recover into (its Recover fails at once).
	Finished(rank int)
	// Joining reports whether the ranks are joining the job's rendezvous:
	// a rank that dies then cannot be respawned (the others wait there
	// for its first incarnation).
	Joining() bool
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

// env is rank r's environment at incarnation inc (which it is told only
// when the job restarts ranks).
func (j *hostJob) env(r int, inc uint32) []string {
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
	if j.Restart > 0 {
		env = append(env, rma.EnvIncarnation+"="+strconv.FormatUint(uint64(inc), 10))
	}
	n := len(j.Ranks)
	if _, set := os.LookupEnv(spin.EnvSpin); !set {
		if s := spinFor(n, runtime.NumCPU()); s != "" {
			env = append(env, spin.EnvSpin+"="+s)
		}
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
// already started are stopped. rec records deaths and incarnations when
// j restarts ranks.
func startGroup(j *hostJob, rec recorder, stdout, stderr io.Writer, outMu *sync.Mutex) (*group, error) {
	g := &group{job: j, cmds: make([]*exec.Cmd, len(j.Ranks)), inc: make([]uint32, len(j.Ranks)),
		exits: make(chan exit, len(j.Ranks)), stdout: stdout, outMu: outMu, stderr: stderr, rec: rec,
		done: make(chan struct{})}
	fail := func(err error) (*group, error) {
		g.kill(0)
		close(g.done)
		g.copiers.Wait()
		return nil, err
	}
	for i, r := range j.Ranks {
		if err := g.start(i); err != nil {
			return fail(fmt.Errorf("%s: %w", j.where(r), err))
		}
	}
	for i := range g.cmds {
		g.wait(i)
	}
	return g, nil
}

// start starts rank j.Ranks[i]'s incarnation g.inc[i].
func (g *group) start(i int) error {
	j, r := g.job, g.job.Ranks[i]
	cmd := exec.Command(j.Prog, j.Args...)
	cmd.Env, cmd.Dir = j.env(r, g.inc[i]), j.Dir
	cmd.SysProcAttr = rankAttr()
	if err := startCopied(cmd, g.stdout, g.stderr, j.tag(r), g.outMu, &g.copiers); err != nil {
		return err
	}
	g.cmds[i] = cmd
	return nil
}

// wait reports the end of rank j.Ranks[i]'s current incarnation on
// g.exits. An incarnation starts only once its predecessor's end has been
// taken from g.exits, so its room of one per rank is enough.
func (g *group) wait(i int) {
	cmd := g.cmds[i]
	go func() { g.exits <- exit{i, cmd.Wait()} }()
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
// says) and orders (stop: stop the ranks; sig: signal them; kill: kill
// one). A rank that fails is started again while it has restarts left
// (job.Restart) and the job is not ending: it was not stopped, and no
// signal was forwarded. At the first rank that fails otherwise it stops
// the others; it returns that failure's status, or 0. With restarts, the
// rendezvous records every failure before the job goes on or ends.
func (g *group) supervise(sigs <-chan os.Signal, forward func(os.Signal) bool, orders <-chan order) int {
	defer close(g.done)
	status, left, failed, ending := 0, len(g.cmds), false, false
	done := -1 // a rank that finished (exit 0)
	ended := make([]bool, len(g.cmds))
	stop := func(st int, format string, a ...any) {
		failed, status = true, st
		g.say(format, a...)
		go g.kill(g.job.Grace)
	}
	for left > 0 {
		select {
		case s := <-sigs:
			if forward(s) {
				ending = true
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
			case o.kill:
				g.killOrdered(o, ended, failed)
			default:
				ending = true
				g.signal(o.sig)
			}
		case e := <-g.exits:
			r := g.job.Ranks[e.i]
			switch {
			case e.err == nil || failed:
				if e.err == nil && done < 0 {
					done = r
					if g.rec != nil {
						g.rec.Finished(r)
					}
				}
			case g.job.Restart == 0:
				stop(exitStatus(e.err), "rvmarun: %s failed (%v); stopping the others\n", g.job.where(r), e.err)
			case ending:
				g.rec.Died(r) // the job ends: a record that fails changes nothing
				stop(exitStatus(e.err), "rvmarun: %s failed (%v); stopping the others\n", g.job.where(r), e.err)
			case g.rec.Joining() || done >= 0:
				// Before the job started, the others wait for this rank's
				// first incarnation; after a rank finished, there is no
				// job left to recover into.
				g.rec.Died(r)
				why := "while the ranks joined the job"
				if done >= 0 {
					why = fmt.Sprintf("after %s had finished", g.job.where(done))
				}
				stop(exitStatus(e.err), "rvmarun: %s (incarnation %d) %s %s: not restarting it; stopping the others\n",
					g.job.where(r), g.inc[e.i], death(e.err), why)
			case int(g.inc[e.i]) >= g.job.Restart:
				g.rec.Died(r)
				stop(exitStatus(e.err), "rvmarun: %s (incarnation %d) %s; it died %d times, more than --restart %d allows; stopping the others\n",
					g.job.where(r), g.inc[e.i], death(e.err), g.inc[e.i]+1, g.job.Restart)
			default:
				if err := g.respawn(e); err != nil {
					stop(1, "rvmarun: %s; stopping the others\n", err)
					break
				}
				continue
			}
			left--
			ended[e.i] = true
		}
	}
	g.copiers.Wait()
	return status
}

// respawn starts the next incarnation of the rank whose end is e, after
// recording its death and then its new incarnation.
func (g *group) respawn(e exit) error {
	r, inc := g.job.Ranks[e.i], g.inc[e.i]
	// What the dead incarnation started dies with it: a wrapper's child
	// must not go on as a second incarnation.
	signalGroup(g.cmds[e.i], syscall.SIGKILL)
	if err := g.rec.Died(r); err != nil {
		return fmt.Errorf("%s (incarnation %d) %s, and recording its death failed: %w", g.job.where(r), inc, death(e.err), err)
	}
	g.say("rvmarun: %s (incarnation %d) %s; restarting it as incarnation %d (restart %d of %d)\n",
		g.job.where(r), inc, death(e.err), inc+1, inc+1, g.job.Restart)
	if err := g.rec.Respawned(r, inc+1); err != nil {
		return fmt.Errorf("%s: recording incarnation %d failed: %w", g.job.where(r), inc+1, err)
	}
	g.inc[e.i] = inc + 1
	if err := g.start(e.i); err != nil {
		return fmt.Errorf("%s: restarting it as incarnation %d: %w", g.job.where(r), inc+1, err)
	}
	g.wait(e.i)
	return nil
}

// killOrdered kills the current incarnation of the rank o names, if it
// runs here and the job is not ending.
func (g *group) killOrdered(o order, ended []bool, failed bool) {
	for i, r := range g.job.Ranks {
		switch {
		case r != o.rank || failed:
		case ended[i]:
			g.say("rvmarun: not killing %s at %v as --kill asked: it has ended\n", g.job.where(r), o.at)
		default:
			g.say("rvmarun: killing %s (incarnation %d) with SIGKILL at %v as --kill asked\n", g.job.where(r), g.inc[i], o.at)
			signalGroup(g.cmds[i], syscall.SIGKILL)
		}
	}
}

// say writes a message of rvmarun's to stderr, between the ranks' lines.
func (g *group) say(format string, a ...any) {
	g.outMu.Lock()
	defer g.outMu.Unlock()
	fmt.Fprintf(g.stderr, format, a...)
}

// order is what a daemon's launcher tells it: stop the ranks, pass them
// a signal, or kill one (--kill). rvmarun orders its own ranks' kills
// the same way.
type order struct {
	stop bool
	sig  syscall.Signal
	kill bool
	rank int           // to kill
	at   time.Duration // when, since the job started: for the message
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

// death says how a rank's process ended: "killed by signal 9 (SIGKILL)",
// "exited with status 3".
func death(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return fmt.Sprintf("killed by signal %d (%s)", int(ws.Signal()), unix.SignalName(ws.Signal()))
		}
		if c := ee.ExitCode(); c > 0 {
			return fmt.Sprintf("exited with status %d", c)
		}
	}
	return fmt.Sprintf("failed (%v)", err)
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

// spinFor is how long the ranks' waits spin (RVMA_SPIN) when n of them
// share cores processors, or "" for the library's default (a core each).
// A few ranks per core spin long, yielding the processor every few rounds
// as MPI libraries do when idle under oversubscription: a wait that blocks
// costs a wake-up of tens of microseconds, and a halo exchange has several
// per iteration (halo3d --exchange-only, 4 ranks on 2 cores: fence 1.4 ms
// per iteration blocking, 76-98 us spinning with yields; lock 0.76 ms
// against 14-35 us). Many ranks per core block at once: each spinner's
// turn on the processor is one the rank it waits for does not get (64
// ranks on 2 cores ran 10x faster than Open MPI's spinning ranks).
func spinFor(n, cores int) string {
	switch {
	case n <= cores:
		return ""
	case n <= 4*cores:
		return "50ms"
	default:
		return "0s"
	}
}
