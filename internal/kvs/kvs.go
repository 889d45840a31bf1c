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
//
// A malformed request is answered "err REASON" and the connection closed.
//
// Servers, clients and stores are safe for concurrent use.
package kvs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
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
			return ctx.Err()
		}
	}
}

// Close implements Store.
func (s *Mem) Close() error { return nil }

func checkToken(s string) error {
	if s == "" || strings.ContainsAny(s, " \t\r\n") || len(s) > 4096 {
		return fmt.Errorf("kvs: bad token %q: empty, too long or with whitespace", s)
	}
	return nil
}

// Server serves the protocol for Size ranks.
type Server struct {
	ln    net.Listener
	store *Mem
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
	done  chan struct{}
}

// Listen starts a server on address (such as "127.0.0.1:0") for size
// ranks.
func Listen(address string, size int) (*Server, error) {
	ln, err := net.Listen("tcp", address)
	if err != nil {
		return nil, fmt.Errorf("kvs: %w", err)
	}
	s := &Server{ln: ln, store: NewMem(size), conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr returns the address clients dial.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server and drops its connections.
func (s *Server) Close() error {
	close(s.done)
	err := s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(c)
	}
}

func (s *Server) serve(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		f := strings.Fields(line)
		var reply string
		switch {
		case len(f) == 3 && f[0] == "put":
			if err := s.store.Put(ctx, f[1], f[2]); err != nil {
				reply = "err " + strings.ReplaceAll(err.Error(), "\n", " ")
			} else {
				reply = "ok"
			}
		case len(f) == 2 && f[0] == "get":
			v, err := s.store.Get(ctx, f[1])
			if err != nil {
				return
			}
			reply = "val " + v
		case len(f) == 1 && f[0] == "barrier":
			if err := s.store.Barrier(ctx); err != nil {
				return
			}
			reply = "ok"
		default:
			fmt.Fprintf(c, "err malformed request\n")
			return
		}
		if _, err := fmt.Fprintf(c, "%s\n", reply); err != nil {
			return
		}
		if strings.HasPrefix(reply, "err") {
			return
		}
	}
}

// Client is a rank's connection to a Server.
type Client struct {
	mu   sync.Mutex // one request at a time
	conn net.Conn
	r    *bufio.Reader
}

// Dial connects to a server, retrying until ctx ends (the server may not
// be up yet when ranks start together).
func Dial(ctx context.Context, address string) (*Client, error) {
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", address)
		if err == nil {
			return &Client{conn: c, r: bufio.NewReader(c)}, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("kvs: dial %s: %w", address, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (c *Client) do(ctx context.Context, req string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return "", ErrClosed
	}
	stop := context.AfterFunc(ctx, func() { c.conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := fmt.Fprintf(c.conn, "%s\n", req); err != nil {
		return "", c.fail(ctx, err)
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		return "", c.fail(ctx, err)
	}
	line = strings.TrimSuffix(line, "\n")
	if rest, ok := strings.CutPrefix(line, "err "); ok {
		return "", fmt.Errorf("kvs: server: %s", rest)
	}
	return line, nil
}

// fail closes a connection whose request was cut (its stream is no longer
// in step) and reports why.
func (c *Client) fail(ctx context.Context, err error) error {
	c.conn.Close()
	c.conn = nil
	if ctx.Err() != nil {
		return ctx.Err()
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

// Close implements Store.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}
