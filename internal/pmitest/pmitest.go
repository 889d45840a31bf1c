// Package pmitest is a PMI server for tests that speaks as Slurm's pmi2
// plugin (srun --mpi=pmi2) does: the PMI-1 init line, then PMI-2's
// length-framed commands (fullinit, kvs-put, kvs-fence, kvs-get,
// finalize), or PMI-1's line commands for a client that asked for version
// 1. Each rank is served over one end of a socketpair whose other end the
// test hands to the rank (as a child's PMI_FD, or to pmi.Open).
//
// Like Slurm, it answers with the length left-aligned ("%-6d"), puts rc
// first, requires pmirank, pmijobid and threaded in fullinit
// (PMI2_ERR_INVALID_ARG otherwise), keeps a rank's puts until the fence
// that every rank enters, answers kvs-get from what fences committed
// (found=FALSE otherwise), and closes a rank's connection after
// finalize-response. Unlike Slurm, it undoes the doubling of ';' in
// values (as PMI-2 defines it) and answers an unknown command with an
// error instead of silence. Hooks make it fail requests, hang up in the
// middle of one, or speak PMI-1 only. It shares no code with package pmi:
// it is a second reading of the protocol.
package pmitest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// PMI2_ERR_INVALID_ARG, what Slurm answers a fullinit without its fields.
const errInvalidArg = 3

// Server serves one job's ranks.
type Server struct {
	size int
	// JobID is the job's PMI_JOBID (default "4242.0", Slurm's
	// jobid.stepid).
	JobID string
	// MaxVersion 1 makes a server of PMI-1 only: it answers a PMI-2 init
	// with pmi_version=1 pmi_subversion=1 and rc DowngradeRC (0, as
	// Flux's server does; Slurm's, for a task that asks for another
	// version than the node's first, says 1).
	MaxVersion  int
	DowngradeRC int
	// RightAlign writes lengths right-aligned, as Hydra does.
	RightAlign bool
	// Fail, if set, sees each PMI-2 request after fullinit (the rank,
	// the command, its fields) and may refuse it: a nonzero rc is
	// answered, with errmsg, instead of serving it.
	Fail func(rank int, cmd string, fields map[string]string) (rc int, errmsg string)
	// Hangup, if set, sees each request (PMI-1 or PMI-2, init included);
	// true closes the rank's connection instead of answering it.
	Hangup func(rank int, cmd string) bool

	mu        sync.Mutex
	kvs       map[string]string // committed by fences
	pending   map[string]string // put since the last fence
	fenceIn   int
	fenceGen  chan struct{} // closed when the current fence opens
	versions  map[int]int   // rank -> protocol version chosen at init
	requests  []string
	finalized int
	conns     []net.Conn
	done      chan struct{} // closed by Close
	closeOnce sync.Once
	wg        sync.WaitGroup
}

// New returns a server for a job of size ranks.
func New(size int) *Server {
	return &Server{size: size, JobID: "4242.0", kvs: map[string]string{}, pending: map[string]string{},
		fenceGen: make(chan struct{}), versions: map[int]int{}, done: make(chan struct{})}
}

// Conn returns the rank's end of a new socketpair, whose other end the
// server serves until the rank finalizes, either end closes, or Close.
func (s *Server) Conn(rank int) (*os.File, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	mine := os.NewFile(uintptr(fds[0]), "pmi-server")
	c, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		syscall.Close(fds[1])
		return nil, err
	}
	s.mu.Lock()
	s.conns = append(s.conns, c)
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer c.Close()
		s.serve(c, rank)
	}()
	return os.NewFile(uintptr(fds[1]), "pmi-client"), nil
}

// Env is the environment Slurm gives the rank whose PMI descriptor is fd.
func (s *Server) Env(rank, fd int) []string {
	return []string{"PMI_FD=" + strconv.Itoa(fd), "PMI_RANK=" + strconv.Itoa(rank),
		"PMI_SIZE=" + strconv.Itoa(s.size), "PMI_JOBID=" + s.JobID}
}

// Setenv gives this test process rank's environment, as Slurm would give
// the rank: a new connection whose descriptor PMI_FD names (the code under
// test owns it, and closes it).
func (s *Server) Setenv(t testing.TB, rank int) {
	t.Helper()
	f, err := s.Conn(rank)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Dup(int(f.Fd()))
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range s.Env(rank, fd) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
}

// Close closes every connection and waits for their goroutines.
func (s *Server) Close() {
	s.closeOnce.Do(func() { close(s.done) })
	s.mu.Lock()
	for _, c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// Requests returns the requests seen so far, each as "rank: message".
func (s *Server) Requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.requests...)
}

// Finalized returns how many ranks have finalized.
func (s *Server) Finalized() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.finalized
}

// Version returns the protocol version the rank chose at init (0 before).
func (s *Server) Version(rank int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.versions[rank]
}

func (s *Server) logf(rank int, msg string) {
	s.mu.Lock()
	s.requests = append(s.requests, fmt.Sprintf("%d: %s", rank, msg))
	s.mu.Unlock()
}

func (s *Server) hangup(rank int, cmd string) bool {
	return s.Hangup != nil && s.Hangup(rank, cmd)
}

func (s *Server) serve(c net.Conn, rank int) {
	r := bufio.NewReader(c)
	// The init line, PMI-1's syntax whatever the version.
	line, err := r.ReadString('\n')
	if err != nil {
		return
	}
	s.logf(rank, strings.TrimSpace(line))
	if s.hangup(rank, "init") {
		return
	}
	var version, sub int
	if n, _ := fmt.Sscanf(line, "cmd=init pmi_version=%d pmi_subversion=%d\n", &version, &sub); n != 2 {
		fmt.Fprintf(c, "cmd=response_to_init rc=1 pmi_version=2 pmi_subversion=0\n")
		return
	}
	switch {
	case version == 2 && sub == 0 && s.MaxVersion != 1:
		fmt.Fprintf(c, "cmd=response_to_init rc=0 pmi_version=2 pmi_subversion=0\n")
	case version == 1 && sub == 1:
		fmt.Fprintf(c, "cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1\n")
	case version == 2:
		fmt.Fprintf(c, "cmd=response_to_init rc=%d pmi_version=1 pmi_subversion=1\n", s.DowngradeRC)
		if s.DowngradeRC != 0 {
			s.serve1(c, r, rank, true)
			return
		}
		version = 1
	default:
		fmt.Fprintf(c, "cmd=response_to_init rc=1 pmi_version=2 pmi_subversion=0\n")
		return
	}
	s.mu.Lock()
	s.versions[rank] = version
	s.mu.Unlock()
	if version == 2 {
		s.serve2(c, r, rank)
	} else {
		s.serve1(c, r, rank, false)
	}
}

// serve2 serves PMI-2 requests.
func (s *Server) serve2(c net.Conn, r *bufio.Reader, rank int) {
	inited := false
	for {
		var hdr [6]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(hdr[:])))
		if err != nil || n <= 0 || n > 1<<20 {
			return // Slurm drops such a request, and the client waits: we hang up
		}
		buf := make([]byte, n)
		if _, err := io.ReadFull(r, buf); err != nil {
			return
		}
		msg := string(buf)
		s.logf(rank, msg)
		cmd, fields, ok := parse(msg)
		if !ok {
			s.send2(c, "cmd="+cmd+"-response;rc=14;errmsg=malformed request;")
			continue
		}
		if s.hangup(rank, cmd) {
			return
		}
		if cmd != "fullinit" && s.Fail != nil && inited {
			if rc, msg := s.Fail(rank, cmd, fields); rc != 0 {
				s.send2(c, fmt.Sprintf("cmd=%s-response;rc=%d;errmsg=%s;", cmd, rc, escape(msg)))
				continue
			}
		}
		switch cmd {
		case "fullinit":
			rc := 0
			for _, k := range []string{"pmijobid", "pmirank", "threaded"} {
				if _, ok := fields[k]; !ok {
					rc = errInvalidArg
				}
			}
			inited = rc == 0
			s.send2(c, fmt.Sprintf("cmd=fullinit-response;rc=%d;pmi-version=2;pmi-subversion=0;rank=%d;size=%d;appnum=-1;debugged=FALSE;pmiverbose=FALSE;",
				rc, rank, s.size))
		case "kvs-put":
			s.mu.Lock()
			s.pending[fields["key"]] = fields["value"]
			s.mu.Unlock()
			s.send2(c, "cmd=kvs-put-response;rc=0;")
		case "kvs-fence":
			rc := s.fence()
			if rc != 0 {
				s.send2(c, fmt.Sprintf("cmd=kvs-fence-response;rc=%d;errmsg=fence failed;", rc))
			} else {
				s.send2(c, "cmd=kvs-fence-response;rc=0;")
			}
		case "kvs-get":
			s.mu.Lock()
			v, found := s.kvs[fields["key"]]
			s.mu.Unlock()
			if found {
				s.send2(c, "cmd=kvs-get-response;rc=0;found=TRUE;value="+escape(v)+";")
			} else {
				s.send2(c, "cmd=kvs-get-response;rc=0;found=FALSE;")
			}
		case "finalize":
			s.mu.Lock()
			s.finalized++
			s.mu.Unlock()
			s.send2(c, "cmd=finalize-response;rc=0;")
			return
		default:
			s.send2(c, "cmd="+cmd+"-response;rc=14;errmsg=unknown command "+escape(cmd)+";")
		}
	}
}

// fence waits for every rank, then commits the puts; it returns rc.
func (s *Server) fence() int {
	s.mu.Lock()
	gen := s.fenceGen
	s.fenceIn++
	if s.fenceIn == s.size {
		for k, v := range s.pending {
			s.kvs[k] = v
		}
		s.pending = map[string]string{}
		s.fenceIn = 0
		close(s.fenceGen)
		s.fenceGen = make(chan struct{})
	}
	s.mu.Unlock()
	select {
	case <-gen:
		return 0
	case <-s.done:
		return 14 // PMI2_ERR_OTHER
	}
}

func (s *Server) send2(c net.Conn, body string) {
	f := "%-6d%s"
	if s.RightAlign {
		f = "%6d%s"
	}
	fmt.Fprintf(c, f, len(body), body)
}

// serve1 serves PMI-1 requests (after an init answered with version 1).
// With reinit, the client is expected to send the init line again first.
func (s *Server) serve1(c net.Conn, r *bufio.Reader, rank int, reinit bool) {
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		s.logf(rank, strings.TrimSpace(line))
		m := map[string]string{}
		for _, f := range strings.Fields(line) {
			k, v, _ := strings.Cut(f, "=")
			m[k] = v
		}
		if s.hangup(rank, m["cmd"]) {
			return
		}
		reply := ""
		switch m["cmd"] {
		case "init":
			if !reinit || m["pmi_version"] != "1" {
				reply = "cmd=response_to_init rc=1 pmi_version=1 pmi_subversion=1"
				break
			}
			reinit = false
			s.mu.Lock()
			s.versions[rank] = 1
			s.mu.Unlock()
			reply = "cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=1"
		case "get_maxes":
			reply = "cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=1024"
		case "get_my_kvsname":
			reply = "cmd=my_kvsname rc=0 kvsname=" + s.JobID
		case "put":
			s.mu.Lock()
			s.pending[m["key"]] = m["value"]
			s.mu.Unlock()
			reply = "cmd=put_result rc=0"
		case "get":
			s.mu.Lock()
			v, ok := s.kvs[m["key"]]
			s.mu.Unlock()
			if ok {
				reply = "cmd=get_result rc=0 value=" + v
			} else {
				reply = "cmd=get_result rc=1"
			}
		case "barrier_in":
			reply = fmt.Sprintf("cmd=barrier_out rc=%d", s.fence())
		case "finalize":
			s.mu.Lock()
			s.finalized++
			s.mu.Unlock()
			fmt.Fprintf(c, "cmd=finalize_ack rc=0\n")
			return
		default:
			reply = "cmd=" + m["cmd"] + "_result rc=1 msg=unknown_command"
		}
		fmt.Fprintf(c, "%s\n", reply)
	}
}

// parse splits a PMI-2 request as PMI-2 defines it: cmd=NAME; then
// key=value; pairs, ";;" a ';' inside a value.
func parse(msg string) (cmd string, fields map[string]string, ok bool) {
	fields = map[string]string{}
	var keys, vals []string
	i := 0
	for i < len(msg) {
		eq := strings.IndexByte(msg[i:], '=')
		if eq <= 0 {
			return cmd, nil, false
		}
		key := msg[i : i+eq]
		i += eq + 1
		var v []byte
		for {
			if i >= len(msg) {
				return cmd, nil, false
			}
			if msg[i] == ';' {
				if i+1 < len(msg) && msg[i+1] == ';' {
					v = append(v, ';')
					i += 2
					continue
				}
				i++
				break
			}
			v = append(v, msg[i])
			i++
		}
		keys, vals = append(keys, key), append(vals, string(v))
		if len(keys) == 1 && key == "cmd" {
			cmd = string(v)
		}
	}
	if len(keys) == 0 || keys[0] != "cmd" {
		return cmd, nil, false
	}
	for j := 1; j < len(keys); j++ {
		if _, dup := fields[keys[j]]; !dup {
			fields[keys[j]] = vals[j]
		}
	}
	return cmd, fields, true
}

func escape(v string) string { return strings.ReplaceAll(v, ";", ";;") }
