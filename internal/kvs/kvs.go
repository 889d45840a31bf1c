// Package kvs is the key-value rendezvous that ranks of one job use to find
// each other: a small line protocol over TCP, served by the launcher
// (rvmarun) or by rank 0 (Slurm), and an in-memory store for in-process
// worlds.
//
// Protocol, one request and one reply per line, tokens without whitespace:
//
//	put KEY VALUE   ->  ok
//	get KEY         ->  val VALUE    (blocks until KEY is put)
//	barrier         ->  ok           (once Size clients have entered)
//	join ...        ->  view ...     (recovery: see recover.go's Recoverer)
//	faults SINCE    ->  faults ...
//	died RANK       ->  ok           (a launcher's, with a key only)
//	respawned RANK INC  ->  ok
//
// A malformed request is answered "err REASON" and the connection closed;
// so is a line over the server's bound (ServerConfig.MaxLine), and a
// connection over its bound (ServerConfig.MaxConns) is answered "err too
// many connections" before any request.
//
// A server with a key (ServerConfig.Key, the job's key) first makes each
// client prove it holds the key, and proves it too, within a handshake
// timeout, before any request:
//
//	auth NC              ->  challenge NS MAC_S
//	proof MAC_C          ->  ok
//
// NC and NS are fresh random nonces, MAC_S and MAC_C HMAC-SHA256 under
// the key over both. After that every request and every reply ends with a
// tag, an HMAC under a session key drawn from the key and both nonces,
// over the line and its sequence number, so that nothing can be injected
// into, replayed on or reordered in an authenticated connection.
// Connections still authenticating are bounded apart from MaxConns
// (ServerConfig.MaxPending), the oldest dropped when more arrive, so a
// flood of silent ones cannot keep the job's ranks out.
//
// Servers, clients and stores are safe for concurrent use.
package kvs

import (
	"bufio"
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ErrClosed reports a closed store.
var ErrClosed = errors.New("kvs: closed")

// Store is what a rank sees of the rendezvous.
type Store interface {
	// Put publishes a key; keys and values must not contain whitespace.
	Put(ctx context.Context, key, value string) error
	// Get returns a key's value, waiting until it is put.
	Get(ctx context.Context, key string) (string, error)
	// Barrier returns once every rank of the job has entered it.
	Barrier(ctx context.Context) error
	// Close releases the store.
	Close() error
}

// Mem is an in-memory store for Size ranks of one process.
type Mem struct {
	mu      sync.Mutex
	cond    chan struct{} // closed and replaced on every change
	m       map[string]string
	size    int
	entered int
	gen     int
	recov   *recovery // nil until a recovery call (recover.go)
}

// NewMem returns an in-memory store for size ranks.
func NewMem(size int) *Mem {
	return &Mem{m: map[string]string{}, size: size, cond: make(chan struct{})}
}

func (s *Mem) changed() {
	close(s.cond)
	s.cond = make(chan struct{})
}

// Put implements Store.
func (s *Mem) Put(_ context.Context, key, value string) error {
	if err := checkToken(key); err != nil {
		return err
	}
	if err := checkToken(value); err != nil {
		return err
	}
	s.mu.Lock()
	s.m[key] = value
	s.changed()
	s.mu.Unlock()
	return nil
}

// Get implements Store.
func (s *Mem) Get(ctx context.Context, key string) (string, error) {
	for {
		s.mu.Lock()
		v, ok := s.m[key]
		c := s.cond
		s.mu.Unlock()
		if ok {
			return v, nil
		}
		select {
		case <-c:
		case <-ctx.Done():
			return "", ctx.Err()
		}
	}
}

// Barrier implements Store.
func (s *Mem) Barrier(ctx context.Context) error {
	s.mu.Lock()
	gen := s.gen
	s.entered++
	if s.entered == s.size {
		s.entered = 0
		s.gen++
		s.changed()
	}
	s.mu.Unlock()
	for {
		s.mu.Lock()
		done, c := s.gen != gen, s.cond
		s.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-c:
		case <-ctx.Done():
			return s.leave(ctx, gen)
		}
	}
}

// leave takes a waiter whose ctx ended out of the barrier it entered, so
// that it is not counted for the others; if the barrier has just opened,
// the waiter passed it after all.
func (s *Mem) leave(ctx context.Context, gen int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gen != gen {
		return nil
	}
	s.entered--
	return ctx.Err()
}

// Close implements Store.
func (s *Mem) Close() error { return nil }

// maxToken bounds keys and values.
const maxToken = 4096

func checkToken(s string) error {
	if s == "" || strings.ContainsAny(s, " \t\r\n") || len(s) > maxToken {
		return fmt.Errorf("kvs: bad token %q: empty, too long or with whitespace", s)
	}
	return nil
}

// DefaultMaxLine bounds a protocol line unless ServerConfig.MaxLine says
// otherwise: the longest valid line, a put of two tokens of maxToken
// bytes, is about 8 KiB.
const DefaultMaxLine = 64 << 10

// ServerConfig holds a Server's limits; the zero value means defaults.
type ServerConfig struct {
	// MaxLine bounds a request line in bytes (default DefaultMaxLine). A
	// client sending a longer one is disconnected, so what one connection
	// makes the server buffer is bounded.
	MaxLine int
	// MaxConns bounds the connections open at once (default 4 per rank
	// and 16 more: a rank holds its client and its launcher watch, and
	// may dial again). Connections over it are answered "err too many
	// connections" and closed.
	MaxConns int
	// Logger receives why connections were dropped (default
	// slog.Default()).
	Logger *slog.Logger
	// Key, when set, admits only clients that prove they hold it (see the
	// package documentation); at least 16 bytes. Default none.
	Key []byte
	// HandshakeTimeout bounds how long a client may take to authenticate
	// (default 10s).
	HandshakeTimeout time.Duration
	// MaxPending bounds the connections still authenticating (default
	// 64, or two per rank and 16 more when that is more: every rank of a
	// job dials its client and its launcher watch at once, and a job of
	// 256 ranks over four hosts overflowed 64 while the ranks started);
	// one more drops the oldest.
	MaxPending int
}

func (c *ServerConfig) withDefaults(size int) ServerConfig {
	var d ServerConfig
	if c != nil {
		d = *c
	}
	if d.MaxLine <= 0 {
		d.MaxLine = DefaultMaxLine
	}
	if d.MaxConns <= 0 {
		d.MaxConns = 4*size + 16
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.HandshakeTimeout <= 0 {
		d.HandshakeTimeout = 10 * time.Second
	}
	if d.MaxPending <= 0 {
		d.MaxPending = max(64, 2*size+16)
	}
	return d
}

// Server serves the protocol for Size ranks.
type Server struct {
	ln         net.Listener
	store      *Mem
	cfg        ServerConfig
	ctx        context.Context // ends with Close
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	mu         sync.Mutex
	closed     bool                   // under mu: accept must not add connections after Close
	conns      map[net.Conn]struct{}  // authenticated (or, without a key, all), under mu
	pending    map[net.Conn]time.Time // authenticating since, under mu
	refused    int                    // under mu: connections refused since lastRefuse was logged
	lastRefuse time.Time              // under mu
}

// Listen starts a server on address (such as "127.0.0.1:0") for size
// ranks, with the default limits.
func Listen(address string, size int) (*Server, error) {
	return ListenConfig(address, size, nil)
}

// ListenConfig is Listen with limits; a nil cfg means defaults.
func ListenConfig(address string, size int, cfg *ServerConfig) (*Server, error) {
	d := cfg.withDefaults(size)
	if d.Key != nil && len(d.Key) < minKey {
		return nil, fmt.Errorf("kvs: a key of %d bytes; at least %d", len(d.Key), minKey)
	}
	ln, err := net.Listen("tcp", address)
	if err != nil {
		return nil, fmt.Errorf("kvs: %w", err)
	}
	s := &Server{ln: ln, store: NewMem(size), cfg: d, conns: map[net.Conn]struct{}{}, pending: map[net.Conn]time.Time{}}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr returns the address clients dial.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server and drops its connections; it may be called more
// than once.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.cancel()
	for c := range s.conns {
		c.Close()
	}
	for c := range s.pending {
		c.Close()
	}
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	var delay time.Duration
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			// Out of file descriptors and the like pass: giving up would
			// leave the ranks still to come unable to join.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.cfg.Logger.Warn("kvs: accept", "err", err, "retry_in", delay)
			select {
			case <-time.After(delay):
			case <-s.ctx.Done():
				return
			}
			continue
		}
		delay = 0
		s.admit(c)
	}
}

// admit registers a connection and serves it, unless the server is closed
// (Close has already closed the registered ones, and would wait forever
// for this one) or full. With a key it is pending until it authenticates;
// past MaxPending the oldest pending connection is dropped.
func (s *Server) admit(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		c.Close()
	case s.cfg.Key != nil:
		for len(s.pending) >= s.cfg.MaxPending {
			var oldest net.Conn
			var at time.Time
			for o, since := range s.pending {
				if oldest == nil || since.Before(at) {
					oldest, at = o, since
				}
			}
			delete(s.pending, oldest)
			oldest.Close()
			s.refusedLocked(oldest, "dropping unauthenticated connections over the limit", s.cfg.MaxPending)
		}
		s.pending[c] = time.Now()
		s.wg.Add(1)
		go s.serve(c)
	case len(s.conns) >= s.cfg.MaxConns:
		s.refusedLocked(c, "refusing connections over the limit", s.cfg.MaxConns)
		io.WriteString(c, "err too many connections\n")
		c.Close()
	default:
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		go s.serve(c)
	}
}

// refusedLocked counts a refused connection, logging at most one line a
// second however fast they come.
func (s *Server) refusedLocked(c net.Conn, msg string, limit int) {
	s.refused++
	if now := time.Now(); now.Sub(s.lastRefuse) >= time.Second {
		s.cfg.Logger.Warn("kvs: "+msg, "limit", limit, "refused", s.refused, "last_from", c.RemoteAddr().String())
		s.lastRefuse, s.refused = now, 0
	}
}

// authenticated moves c from pending to the served connections; false if
// it was dropped meanwhile or the server is full.
func (s *Server) authenticated(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.pending[c]; !ok || s.closed {
		return false
	}
	delete(s.pending, c)
	if len(s.conns) >= s.cfg.MaxConns {
		s.refusedLocked(c, "refusing connections over the limit", s.cfg.MaxConns)
		io.WriteString(c, "err too many connections\n")
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

func (s *Server) drop(c net.Conn) {
	s.mu.Lock()
	delete(s.conns, c)
	delete(s.pending, c)
	s.mu.Unlock()
	c.Close()
}

// request is a line read from a client, or why reading stopped short of
// the end of the stream.
type request struct {
	line string
	err  error
}

// serve answers a client's requests in turn. A reader goroutine reads
// them, so that a client that goes away ends a get or barrier it left
// waiting (and its slot under MaxConns) at once, not at Close.
func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer s.drop(c)
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	sc := bufio.NewScanner(c)
	var sess *session
	if s.cfg.Key != nil {
		var err error
		if sess, err = s.handshake(c); err != nil {
			s.cfg.Logger.Warn("kvs: dropping client", "remote", c.RemoteAddr().String(), "reason", err)
			fmt.Fprintf(c, "err %v\n", err)
			return
		}
		// Admitted before "ok": a client told ok is served, never
		// dropped (a rank's launcher watch takes the end of an
		// authenticated connection for the launcher's death).
		if !s.authenticated(c) {
			return
		}
		if _, err := io.WriteString(c, "ok\n"); err != nil {
			return
		}
	}
	reqs := make(chan request)
	s.wg.Add(1)
	go s.read(ctx, cancel, sc, reqs)
	for {
		var rq request
		select {
		case rq = <-reqs:
		case <-ctx.Done():
			return
		}
		line, err := rq.line, rq.err
		if err == nil && sess != nil {
			line, err = sess.open('c', line)
		}
		if err != nil {
			s.cfg.Logger.Warn("kvs: dropping client", "remote", c.RemoteAddr().String(), "reason", err)
			fmt.Fprintf(c, "err %v\n", err)
			return
		}
		reply, ok := s.handle(ctx, line)
		if !ok {
			return
		}
		out := reply
		if sess != nil && !strings.HasPrefix(reply, "err") {
			out = sess.seal('s', reply) // an error is the last word, and the client ends either way
		}
		if _, err := fmt.Fprintf(c, "%s\n", out); err != nil {
			return
		}
		if strings.HasPrefix(reply, "err") {
			return
		}
	}
}

// handshake authenticates a client (see the package documentation) within
// the handshake timeout; serve answers "ok" once it has admitted the
// client. The client sends nothing after its proof until it reads "ok", so the
// handshake's own scanner leaves nothing buffered behind.
func (s *Server) handshake(c net.Conn) (*session, error) {
	c.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	defer c.SetDeadline(time.Time{})
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 0, 256), 256)
	line := func() ([]string, error) {
		if !sc.Scan() {
			if sc.Err() != nil {
				return nil, sc.Err()
			}
			return nil, io.EOF
		}
		return strings.Fields(sc.Text()), nil
	}
	f, err := line()
	if err != nil {
		return nil, fmt.Errorf("authentication: %w", err)
	}
	var nc, ns [nonceLen]byte
	if len(f) != 2 || f[0] != "auth" || !decodeHex(nc[:], f[1]) {
		return nil, errors.New("authentication required")
	}
	rand.Read(ns[:])
	if _, err := fmt.Fprintf(c, "challenge %x %x\n", ns, mac(s.cfg.Key, labelServer, nc[:], ns[:])); err != nil {
		return nil, err
	}
	if f, err = line(); err != nil {
		return nil, fmt.Errorf("authentication: %w", err)
	}
	var proof [macLen]byte
	if len(f) != 2 || f[0] != "proof" || !decodeHex(proof[:], f[1]) ||
		!hmac.Equal(proof[:], mac(s.cfg.Key, labelClient, nc[:], ns[:])) {
		return nil, errors.New("authentication failed")
	}
	return newSession(s.cfg.Key, nc, ns), nil
}

// read passes a client's lines to serve; at the end of the stream it ends
// ctx, which ends serve.
func (s *Server) read(ctx context.Context, cancel context.CancelFunc, sc *bufio.Scanner, reqs chan<- request) {
	defer s.wg.Done()
	sc.Buffer(make([]byte, 0, 512), s.cfg.MaxLine)
	for sc.Scan() {
		select {
		case reqs <- request{line: sc.Text()}:
		case <-ctx.Done():
			return
		}
	}
	if errors.Is(sc.Err(), bufio.ErrTooLong) {
		select {
		case reqs <- request{err: fmt.Errorf("line over %d bytes", s.cfg.MaxLine)}:
		case <-ctx.Done():
		}
		return
	}
	cancel()
}

// handle answers one request; !ok means the connection is to be dropped
// without a reply (its ctx ended).
func (s *Server) handle(ctx context.Context, line string) (reply string, ok bool) {
	f := strings.Fields(line)
	switch {
	case len(f) == 3 && f[0] == "put":
		if err := s.store.Put(ctx, f[1], f[2]); err != nil {
			return "err " + strings.ReplaceAll(err.Error(), "\n", " "), true
		}
		return "ok", true
	case len(f) == 2 && f[0] == "get":
		v, err := s.store.Get(ctx, f[1])
		if err != nil {
			return "", false
		}
		return "val " + v, true
	case len(f) == 1 && f[0] == "barrier":
		if err := s.store.Barrier(ctx); err != nil {
			return "", false
		}
		return "ok", true
	case len(f) > 0 && (f[0] == "join" || f[0] == "faults" || f[0] == "started" || f[0] == "died" || f[0] == "respawned"):
		return s.handleRecovery(ctx, f)
	default:
		return "err malformed request", true
	}
}

// Client is a rank's connection to a Server.
type Client struct {
	mu     sync.Mutex     // one request at a time
	conn   net.Conn       // never cleared, so callbacks may use it without mu
	sc     *bufio.Scanner // replies; used under mu
	sess   *session       // with a key; used under mu
	closed atomic.Bool    // by Close or a cut request: conn is closed
}

// Dial connects to a server, retrying until ctx ends (the server may not
// be up yet when ranks start together). With a key (the job's, at least
// 16 bytes) it authenticates, and refuses a server that cannot prove it
// holds the key; nil means an unauthenticated server.
func Dial(ctx context.Context, address string, key []byte) (*Client, error) {
	if key != nil && len(key) < minKey {
		return nil, fmt.Errorf("kvs: a key of %d bytes; at least %d", len(key), minKey)
	}
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", address)
		if err == nil {
			return NewClient(ctx, c, key)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("kvs: dial %s: %w", address, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// NewClient makes a client of a connection to a server, authenticating
// with key (nil: none) before ctx ends. It owns c from then on, and
// closes it on failure.
func NewClient(ctx context.Context, c net.Conn, key []byte) (*Client, error) {
	sc := bufio.NewScanner(c)
	// Replies may be longer than requests: a recovery view holds every
	// rank's value.
	sc.Buffer(make([]byte, 0, 512), 64*DefaultMaxLine)
	cl := &Client{conn: c, sc: sc}
	if key == nil {
		return cl, nil
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	sess, err := clientHandshake(c, sc, key)
	if !stop() {
		err = cmp.Or(ctx.Err(), err)
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("kvs: %s: %w", c.RemoteAddr(), err)
	}
	cl.sess = sess
	return cl, nil
}

// Wait blocks until the server ends the connection (nil; an error if it
// refused it first) or ctx ends; the
// client must not be used meanwhile. A launcher's ranks hold such a
// connection to notice its end, however it ends.
func (c *Client) Wait(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { c.conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	last := ""
	for c.sc.Scan() {
		last = c.sc.Text() // only a refusal is expected here
	}
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case last != "":
		return fmt.Errorf("kvs: server: %s", strings.TrimPrefix(last, "err "))
	}
	return nil
}

func (c *Client) do(ctx context.Context, req string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return "", ErrClosed
	}
	// A cancelled ctx cuts the request through the connection's deadline.
	// The callback runs on a goroutine of its own and may still be
	// running when the request has ended; then we wait for it and clear
	// its deadline, which would otherwise cut the next request.
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		c.conn.SetDeadline(time.Unix(1, 0))
		close(fired)
	})
	defer func() {
		if !stop() {
			<-fired
			c.conn.SetDeadline(time.Time{})
		}
	}()
	line := req
	if c.sess != nil {
		line = c.sess.seal('c', req)
	}
	if _, err := fmt.Fprintf(c.conn, "%s\n", line); err != nil {
		return "", c.fail(ctx, err)
	}
	if !c.sc.Scan() {
		err := c.sc.Err()
		if err == nil {
			err = io.EOF
		}
		return "", c.fail(ctx, err)
	}
	line = c.sc.Text()
	if rest, ok := strings.CutPrefix(line, "err "); ok {
		// The server's last word before it closes: untagged.
		return "", fmt.Errorf("kvs: server: %s", rest)
	}
	if c.sess != nil {
		var err error
		if line, err = c.sess.open('s', line); err != nil {
			return "", c.fail(ctx, err)
		}
	}
	return line, nil
}

// fail closes a connection whose request was cut (its stream is no longer
// in step) and reports why.
func (c *Client) fail(ctx context.Context, err error) error {
	closedHere := c.closed.CompareAndSwap(false, true)
	c.conn.Close()
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case !closedHere:
		return ErrClosed // Close cut the request
	}
	return fmt.Errorf("kvs: %w", err)
}

// Put implements Store.
func (c *Client) Put(ctx context.Context, key, value string) error {
	if err := checkToken(key); err != nil {
		return err
	}
	if err := checkToken(value); err != nil {
		return err
	}
	_, err := c.do(ctx, "put "+key+" "+value)
	return err
}

// Get implements Store.
func (c *Client) Get(ctx context.Context, key string) (string, error) {
	if err := checkToken(key); err != nil {
		return "", err
	}
	line, err := c.do(ctx, "get "+key)
	if err != nil {
		return "", err
	}
	v, ok := strings.CutPrefix(line, "val ")
	if !ok {
		return "", fmt.Errorf("kvs: unexpected reply %q", line)
	}
	return v, nil
}

// Barrier implements Store.
func (c *Client) Barrier(ctx context.Context) error {
	_, err := c.do(ctx, "barrier")
	return err
}

// Close implements Store. It does not wait for a request in progress: it
// cuts it, and the request returns ErrClosed.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	return c.conn.Close()
}
