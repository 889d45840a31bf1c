package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rvma/rvma/internal/launch"
)

// A job over several hosts: rvmarun starts, through the launch agent
// (ssh -x by default, or any command prefix such as "ip netns exec"), one
// daemon per host ("rvmarun --daemon"), which starts that host's ranks
// as rvmarun does on its own host. The daemon reads its hostJob as one
// JSON line on its standard input, then orders, a line each: "signal N"
// (pass signal N to the ranks), "kill RANK T" (--kill: SIGKILL to RANK's
// current incarnation, T after the job started) and "stop". The end of
// its input, which is how it learns that rvmarun or the agent died
// however they died, stops the ranks too: no rank outlives its job on
// any host. Its output is the ranks' lines, tagged with rank and host,
// and its status the first failed rank's. With --restart it starts its
// ranks again as rvmarun does, and records their deaths and incarnations
// in the job's rendezvous with the died and respawned requests
// (kvs.Client.Died and Respawned), which it makes with the job's key.

// daemonFlag is the hidden flag of the daemon mode.
const daemonFlag = "--daemon"

// daemon runs one host's ranks of a job that rvmarun started elsewhere.
func daemon(stdin io.Reader, stdout, stderr io.Writer) int {
	in := bufio.NewReader(stdin)
	line, err := in.ReadBytes('\n')
	var job hostJob
	if err == nil {
		err = json.Unmarshal(line, &job)
	}
	if err != nil {
		fmt.Fprintf(stderr, "rvmarun --daemon: reading the job: %v\n", err)
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "rvmarun: %s: %v\n", job.Host, err)
		return 1
	}
	if job.KVS, err = daemonKVS(job.KVS); err != nil {
		return fail(err)
	}
	if job.Addr == "" {
		h, _, _ := net.SplitHostPort(job.KVS)
		if job.Addr, err = launch.RouteTo(h); err != nil {
			return fail(fmt.Errorf("no route to the rendezvous at %s: %v", job.KVS, err))
		}
	}
	if job.Dir != "" {
		if _, err := os.Stat(job.Dir); err != nil {
			job.Dir = "" // not on this host: start where the agent left us
		}
	}
	if err := checkHost(len(job.Ranks), job.Size, job.MemPerRank); err != nil {
		return fail(err)
	}
	sigs, forward := catchSignals()
	defer signal.Stop(sigs)
	var outMu sync.Mutex
	rec := &clientRecorder{addr: job.KVS, key: job.Key}
	defer rec.Close()
	g, err := startGroup(&job, rec, stdout, stderr, &outMu)
	if err != nil {
		return fail(err)
	}
	orders := make(chan order)
	go readOrders(in, orders)
	return g.supervise(sigs, forward, orders)
}

// readOrders passes the launcher's orders on, and closes orders when its
// input ends.
func readOrders(in *bufio.Reader, orders chan<- order) {
	defer close(orders)
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 1 && f[0] == "stop":
			orders <- order{stop: true}
		case len(f) == 2 && f[0] == "signal":
			if n, err := strconv.Atoi(f[1]); err == nil && n > 0 && n < 65 {
				orders <- order{sig: syscall.Signal(n)}
			}
		case len(f) == 3 && f[0] == "kill":
			r, err1 := strconv.Atoi(f[1])
			at, err2 := time.ParseDuration(f[2])
			if err1 == nil && err2 == nil {
				orders <- order{kill: true, rank: r, at: at}
			}
		}
	}
}

// daemonKVS fills in the rendezvous host when rvmarun left it to the
// daemon (":PORT"): the address the launch agent's ssh connection came
// from, which reaches rvmarun's host.
func daemonKVS(kvs string) (string, error) {
	h, port, err := net.SplitHostPort(kvs)
	if err != nil || h != "" {
		return kvs, err
	}
	if c := strings.Fields(os.Getenv("SSH_CONNECTION")); len(c) == 4 {
		return net.JoinHostPort(c[0], port), nil
	}
	return "", errors.New("cannot tell which address reaches the launcher (no SSH_CONNECTION): start rvmarun with --rendezvous-addr")
}

// remote is one host's daemon, seen from rvmarun.
type remote struct {
	name string
	cmd  *exec.Cmd
	in   io.WriteCloser
	mu   sync.Mutex // guards in after the job was sent
}

func (d *remote) tell(s string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.in != nil {
		io.WriteString(d.in, s+"\n")
	}
}

func (d *remote) hangUp() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.in != nil {
		d.in.Close()
		d.in = nil
	}
}

// hostsConfig is what runHosts needs beyond the job.
type hostsConfig struct {
	hosts      []host
	place      [][]int
	agent      []string // the launch agent's words
	rendezvous string   // the rendezvous's listening IP ("": chosen)
}

// runHosts runs a job over several hosts. job is the template every
// host's part copies (Host and Ranks filled in per host); listen opens
// the rendezvous on an address; kills are --kill's, which the daemons of
// the ranks' hosts carry out.
func runHosts(hc *hostsConfig, job *hostJob, kills []killSpec, listen func(addr string) (string, func(), error), stdout, stderr io.Writer) int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "rvmarun: %v\n", err)
		return 1
	}
	allLocal := true
	for i, h := range hc.hosts {
		if len(hc.place[i]) > 0 && !isLocal(h.name) {
			allLocal = false
		}
	}
	laddr := hc.rendezvous
	if laddr == "" {
		laddr = "0.0.0.0" // authenticated: only the job's key holders get in
		if allLocal {
			laddr = "127.0.0.1"
		}
	}
	kvsAddr, closeKVS, err := listen(net.JoinHostPort(laddr, "0"))
	if err != nil {
		fmt.Fprintf(stderr, "rvmarun: %v\n", err)
		return 1
	}
	defer closeKVS()
	_, port, _ := net.SplitHostPort(kvsAddr)
	if job.Dir == "" {
		job.Dir, _ = os.Getwd()
	}
	if !strings.ContainsRune(job.Prog, '/') {
		if p, err := exec.LookPath(job.Prog); err == nil {
			job.Prog = p
		}
	} else if p, err := filepath.Abs(job.Prog); err == nil {
		job.Prog = p
	}

	sigs, forward := catchSignals()
	defer signal.Stop(sigs)
	var outMu sync.Mutex
	type ended struct {
		d   *remote
		err error
	}
	ends := make(chan ended, len(hc.hosts))
	var ds []*remote
	daemonOf := map[int]*remote{} // by rank
	var copiers sync.WaitGroup
	stopAll := func() {
		for _, d := range ds {
			d.tell("stop")
		}
	}
	for i, h := range hc.hosts {
		if len(hc.place[i]) == 0 {
			continue
		}
		hj := *job
		hj.Host, hj.Ranks = h.name, hc.place[i]
		switch {
		case hc.rendezvous != "":
			hj.KVS = net.JoinHostPort(hc.rendezvous, port)
		case isLocal(h.name) || allLocal:
			hj.KVS = net.JoinHostPort("127.0.0.1", port)
		default:
			hj.KVS = ":" + port // the daemon knows where its ssh came from
		}
		var argv []string
		if !isLocal(h.name) {
			argv = append(append(argv, hc.agent...), h.name)
		}
		argv = append(argv, self, daemonFlag)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.SysProcAttr = rankAttr()
		in, err := cmd.StdinPipe()
		if err == nil {
			err = startCopied(cmd, stdout, stderr, "", &outMu, &copiers)
		}
		if err != nil {
			fmt.Fprintf(stderr, "rvmarun: %s: starting %q: %v\n", h.name, strings.Join(argv, " "), err)
			stopAll()
			waitDaemons(ds, job.Grace)
			copiers.Wait()
			return 1
		}
		d := &remote{name: h.name, cmd: cmd, in: in}
		ds = append(ds, d)
		b, _ := json.Marshal(&hj)
		d.tell(string(b))
		go func() { ends <- ended{d, cmd.Wait()} }()
		for _, r := range hj.Ranks {
			daemonOf[r] = d
		}
	}
	over := make(chan struct{})
	defer close(over)
	go scheduleKills(kills, func(k killSpec) { daemonOf[k.rank].tell(fmt.Sprintf("kill %d %v", k.rank, k.at)) }, over)
	status, left, failed := 0, len(ds), false
	for left > 0 {
		select {
		case s := <-sigs:
			if forward(s) {
				for _, d := range ds {
					d.tell(fmt.Sprintf("signal %d", s.(syscall.Signal)))
				}
			}
		case e := <-ends:
			left--
			e.d.hangUp()
			if e.err != nil && !failed {
				failed = true
				status = exitStatus(e.err)
				outMu.Lock()
				fmt.Fprintf(stderr, "rvmarun: host %s failed (%v); stopping the other hosts\n", e.d.name, e.err)
				outMu.Unlock()
				stopAll()
				go func() {
					// A daemon that does not stop in time (a host gone
					// silent): cut its agent, which ends its input.
					time.Sleep(job.Grace + 5*time.Second)
					for _, d := range ds {
						d.hangUp()
						signalGroup(d.cmd, syscall.SIGKILL)
					}
				}()
			}
		}
	}
	copiers.Wait()
	return status
}

// startCopied starts cmd with its output copied line by line, each with
// prefix, to stdout and stderr under mu; copiers counts the copies.
// Our own pipes rather than exec's: exec's Wait closes them when the
// process exits, which can cut its last lines.
func startCopied(cmd *exec.Cmd, stdout, stderr io.Writer, prefix string, mu *sync.Mutex, copiers *sync.WaitGroup) error {
	po, wo, err := os.Pipe()
	if err != nil {
		return err
	}
	pe, we, err := os.Pipe()
	if err != nil {
		po.Close()
		wo.Close()
		return err
	}
	cmd.Stdout, cmd.Stderr = wo, we
	err = cmd.Start()
	wo.Close()
	we.Close()
	if err != nil {
		po.Close()
		pe.Close()
		return err
	}
	for _, p := range []struct {
		in  *os.File
		out io.Writer
	}{{po, stdout}, {pe, stderr}} {
		copiers.Add(1)
		go func() {
			defer copiers.Done()
			defer p.in.Close()
			copyLines(p.in, p.out, prefix, mu)
		}()
	}
	return nil
}

// waitDaemons gives started daemons grace to stop, then kills their agents.
func waitDaemons(ds []*remote, grace time.Duration) {
	for _, d := range ds {
		d.hangUp()
	}
	time.Sleep(grace)
	for _, d := range ds {
		signalGroup(d.cmd, syscall.SIGKILL)
	}
}

// signalGroup signals the process group c leads (a rank, or a daemon's
// agent); it fails harmlessly for a process already gone.
func signalGroup(c *exec.Cmd, s syscall.Signal) {
	if c != nil && c.Process != nil {
		syscall.Kill(-c.Process.Pid, s)
	}
}
