// Package pmixtest is a PMIx server for tests: one node's server for one
// job, on a loopback TCP port, serving what package pmix asks of a real
// one (the connection handshake, commit, fence, get, finalize) the way
// PMIx 4's server answers a v3 client. A fence completes once every rank
// of the job has entered it and makes what each committed before it
// visible to Get, as a fence that collects data does; a get of a rank
// whose data is not visible yet waits for it, as the real server does,
// until GetTimeout; a get of a key the rank did not put answers
// PMIX_ERR_NOT_FOUND.
//
// It decodes and encodes with package wire, whose tests pin the bytes to
// the C library's layout; tests against Open MPI's own server check the
// rest. Hooks make it refuse a client's version, hang up mid-request, or
// never complete a fence.
package pmixtest

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/rvma/rvma/internal/pmix/wire"
)

// Server serves one job's ranks.
type Server struct {
	// Nspace is the job's namespace (default "4242").
	Nspace string
	// Bfrops are the encodings it serves (default v3, v4, v41, as
	// PMIx 4 does); a client announcing another is hung up on.
	Bfrops []string
	// GetTimeout bounds how long a get waits for a rank's data (default
	// 10s, then PMIX_ERR_TIMEOUT).
	GetTimeout time.Duration
	// Hangup, if set, sees each request after the handshake; true closes
	// the rank's connection instead of answering it.
	Hangup func(rank uint32, cmd uint8) bool
	// HoldFences keeps every fence open: a test of a client's timeout.
	HoldFences bool

	size    int
	ln      net.Listener
	mu      sync.Mutex
	commits map[uint32][]wire.KV // committed, not yet fenced
	visible map[uint32][]wire.KV // made visible by a fence
	fenceIn int
	fenceCh chan struct{} // closed when the current fence completes
	seen    chan struct{} // closed and replaced whenever visible changes
	log     []string
	final   int
	conns   map[net.Conn]struct{}
	closed  bool
	done    chan struct{} // closed by Close: ends waiting fences and gets
	wg      sync.WaitGroup
}

// New starts a server for a job of size ranks.
func New(size int) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{Nspace: "4242", Bfrops: []string{"v3", "v4", "v41"}, GetTimeout: 10 * time.Second, size: size, ln: ln,
		commits: map[uint32][]wire.KV{}, visible: map[uint32][]wire.KV{}, fenceCh: make(chan struct{}),
		seen: make(chan struct{}), conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// URI is the server's address as PMIX_SERVER_URI* give it.
func (s *Server) URI() string { return s.Nspace + "-srv.0;tcp4://" + s.ln.Addr().String() }

// Env is what a rank's environment holds under this server: its address
// for every client version, the rank's namespace and rank, the security
// module.
func (s *Server) Env(rank int) []string {
	return []string{"PMIX_SERVER_URI3=" + s.URI(), "PMIX_SERVER_URI2=" + s.URI(), "PMIX_SERVER_URI21=" + s.URI(),
		"PMIX_SERVER_URI4=" + s.URI(), "PMIX_NAMESPACE=" + s.Nspace, "PMIX_RANK=" + strconv.Itoa(rank),
		"PMIX_SECURITY_MODE=native"}
}

// Requests lists the requests served so far, "RANK: CMD [details]".
func (s *Server) Requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.log)
}

// Visible returns what rank committed before the last completed fence.
func (s *Server) Visible(rank int) []wire.KV {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.visible[uint32(rank)])
}

// Finalized is how many clients finalized.
func (s *Server) Finalized() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.final
}

// Close stops the server and drops every connection.
func (s *Server) Close() {
	s.mu.Lock()
	if !s.closed {
		close(s.done)
	}
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.ln.Close()
	s.wg.Wait()
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				c.Close()
			}()
			s.serve(c)
		}()
	}
}

// serve answers one client: the handshake, then its requests, each in a
// goroutine of its own (a fence or a get may wait), until it finalizes
// or hangs up.
func (s *Server) serve(c net.Conn) {
	rank, ok := s.handshake(c)
	if !ok {
		return
	}
	var wmu sync.Mutex
	reply := func(tag uint32, body []byte) {
		wmu.Lock()
		defer wmu.Unlock()
		c.Write(append(wire.AppendHeader(nil, wire.Header{Tag: tag, Len: uint32(len(body))}), body...))
	}
	var reqs sync.WaitGroup
	defer reqs.Wait()
	hdr := make([]byte, wire.HeaderLen)
	for {
		if _, err := io.ReadFull(c, hdr); err != nil {
			return
		}
		h, err := wire.ParseHeader(hdr, 1<<20)
		if err != nil {
			return
		}
		body := make([]byte, h.Len)
		if _, err := io.ReadFull(c, body); err != nil {
			return
		}
		q, err := wire.ParseRequest(body)
		if err != nil {
			s.record(rank, "malformed: %v", err)
			return
		}
		if s.Hangup != nil && s.Hangup(rank, q.Cmd) {
			return
		}
		if q.Cmd == wire.CmdFinalize {
			s.mu.Lock()
			s.final++
			s.mu.Unlock()
			s.record(rank, "finalize")
			reply(h.Tag, wire.AppendStatus(nil, wire.Success))
			return
		}
		reqs.Add(1)
		go func() {
			defer reqs.Done()
			reply(h.Tag, s.handle(rank, q))
		}()
	}
}

// handshake reads a connection request and answers it; a request the
// real server would refuse is hung up on, as it does.
func (s *Server) handshake(c net.Conn) (uint32, bool) {
	hdr := make([]byte, wire.HeaderLen)
	if _, err := io.ReadFull(c, hdr); err != nil {
		return 0, false
	}
	n, err := wire.ParseConnectHeader(hdr)
	if err != nil {
		return 0, false
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c, body); err != nil {
		return 0, false
	}
	req, err := wire.ParseConnect(body)
	if err != nil {
		return 0, false
	}
	uid, gid, err := wire.ParseNativeCred(req.Cred)
	switch {
	case req.Proc.Nspace != s.Nspace || req.Proc.Rank >= uint32(s.size):
		s.record(req.Proc.Rank, "refused: unknown %s", req.Proc)
		return 0, false
	case !slices.Contains(s.Bfrops, req.Bfrops) || req.BufType != wire.BufferNonDesc:
		s.record(req.Proc.Rank, "refused: encoding %s, buffer type %d", req.Bfrops, req.BufType)
		return 0, false
	case req.Sec != "native" || err != nil || uid != uint32(os.Geteuid()) || gid != uint32(os.Getegid()):
		s.record(req.Proc.Rank, "refused: credential")
		return 0, false
	}
	s.record(req.Proc.Rank, "connect %s %s %s", req.Version, req.Bfrops, req.GDS)
	var b []byte
	b = binary.BigEndian.AppendUint32(b, uint32(wire.Success))
	b = binary.BigEndian.AppendUint32(b, req.Proc.Rank) // the client's index
	if _, err := c.Write(b); err != nil {
		return 0, false
	}
	return req.Proc.Rank, true
}

func (s *Server) record(rank uint32, format string, args ...any) {
	s.mu.Lock()
	s.log = append(s.log, fmt.Sprintf("%d: ", rank)+fmt.Sprintf(format, args...))
	s.mu.Unlock()
}

// handle serves a commit, fence or get, and returns the reply.
func (s *Server) handle(rank uint32, q wire.Request) []byte {
	switch q.Cmd {
	case wire.CmdCommit:
		// A global put comes once per scope; keep one copy.
		var kvs []wire.KV
		for _, scope := range []uint8{wire.ScopeLocal, wire.ScopeRemote, wire.ScopeGlobal} {
			for _, kv := range q.Scopes[scope] {
				if !slices.ContainsFunc(kvs, func(x wire.KV) bool { return x.Key == kv.Key }) {
					kvs = append(kvs, kv)
				}
			}
		}
		s.mu.Lock()
		s.commits[rank] = append(s.commits[rank], kvs...)
		s.mu.Unlock()
		s.record(rank, "commit %d", len(kvs))
		return wire.AppendStatus(nil, wire.Success)
	case wire.CmdFence:
		collect := slices.ContainsFunc(q.Infos, func(in wire.Info) bool { return in.Key == "pmix.collect" && in.Value == true })
		s.record(rank, "fence %v collect=%v", q.Procs, collect)
		s.mu.Lock()
		ch := s.fenceCh
		s.fenceIn++
		if s.fenceIn == s.size && !s.HoldFences {
			for r, kvs := range s.commits {
				s.visible[r] = append(s.visible[r], kvs...)
			}
			clear(s.commits)
			s.fenceIn = 0
			close(s.fenceCh)
			s.fenceCh = make(chan struct{})
			close(s.seen)
			s.seen = make(chan struct{})
		}
		s.mu.Unlock()
		select {
		case <-ch:
		case <-s.done:
		}
		return wire.AppendStatus(nil, wire.Success)
	case wire.CmdGet:
		s.record(rank, "get %s %s", q.Proc, q.Key)
		deadline := time.NewTimer(s.GetTimeout)
		defer deadline.Stop()
		for {
			s.mu.Lock()
			kvs, ok := s.visible[q.Proc.Rank]
			seen := s.seen
			s.mu.Unlock()
			if ok && q.Proc.Nspace == s.Nspace {
				if !slices.ContainsFunc(kvs, func(kv wire.KV) bool { return kv.Key == q.Key }) {
					return wire.AppendStatus(nil, wire.ErrNotFound)
				}
				b, err := wire.AppendGetReply(nil, []wire.ProcData{{Proc: q.Proc, KVs: kvs}})
				if err != nil {
					return wire.AppendStatus(nil, wire.ErrGeneric)
				}
				return b
			}
			select {
			case <-seen:
			case <-s.done:
				return wire.AppendStatus(nil, wire.ErrLostConn)
			case <-deadline.C:
				return wire.AppendStatus(nil, wire.ErrTimeout)
			}
		}
	}
	return wire.AppendStatus(nil, wire.ErrNotSupported)
}
