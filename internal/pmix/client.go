// Package pmix is a client of the PMIx server that a launcher (Open MPI's
// mpirun and its daemons, PRRTE, Slurm) runs on each node for the job's
// processes: enough of it to publish a value, wait at a fence that
// collects what every process put, and read another process's value,
// which is how the ranks of a job spread over several nodes learn where
// rank 0 serves the rendezvous.
//
// It speaks the protocol as PMIx 3 and later servers serve it to a PMIx 3
// client over their TCP socket (package wire has the messages): it
// announces itself as a v3 client with the "native" security module,
// undescribed buffers and the "hash" data store, so that the server
// sends every value in its replies instead of in shared memory. It does
// not ask for the job's data (rank and size come from the launcher's
// other variables) and registers for no events.
//
// Calls that wait for the server take a context and return when it ends;
// a request abandoned so has its reply dropped when it comes. A Client is
// safe for concurrent use.
package pmix

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rvma/rvma/internal/pmix/wire"
)

// Environment variables a PMIx server gives the processes it serves.
const (
	EnvNamespace = "PMIX_NAMESPACE"
	EnvRank      = "PMIX_RANK"
	EnvSecurity  = "PMIX_SECURITY_MODE" // the security modules the server accepts, comma-separated
)

// envURIs are the variables that hold the server's address, the one for
// PMIx 3 clients first. A server sets those of every version it serves.
var envURIs = []string{"PMIX_SERVER_URI3", "PMIX_SERVER_URI4", "PMIX_SERVER_URI41", "PMIX_SERVER_URI21", "PMIX_SERVER_URI2"}

// What the client announces.
const (
	clientVersion = "3.2.3"
	bfrops        = "v3"
	gds           = "hash"
	secNative     = "native"
)

// ErrServerGone reports that the server closed the connection, or that it
// broke.
var ErrServerGone = errors.New("pmix: the PMIx server is gone")

// ErrProtocol reports what this client does not understand: a server
// address of another kind than TCP, a server that hangs up during the
// handshake (as PMIx servers do with clients whose version or encoding
// they do not serve), a reply it cannot read.
var ErrProtocol = errors.New("pmix: protocol not understood")

// ErrNotFound reports a key the process did not put.
var ErrNotFound = errors.New("pmix: not found")

// StatusError is a request the server answered with an error status.
type StatusError struct {
	Op     string // "connect", "commit", "fence", "get", "finalize"
	Status int32  // PMIx's status code
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("pmix: %s: the server answered %s", e.Op, statusString(e.Status))
}

// Is makes a get the server answered "not found" match ErrNotFound.
func (e *StatusError) Is(target error) bool {
	return target == ErrNotFound && e.Status == wire.ErrNotFound
}

func statusString(st int32) string {
	name := map[int32]string{
		wire.ErrGeneric: "PMIX_ERROR", wire.ErrInvalidCred: "PMIX_ERR_INVALID_CRED", wire.ErrTimeout: "PMIX_ERR_TIMEOUT",
		wire.ErrUnreach: "PMIX_ERR_UNREACH", wire.ErrBadParam: "PMIX_ERR_BAD_PARAM", wire.ErrNotFound: "PMIX_ERR_NOT_FOUND",
		wire.ErrNotSupported: "PMIX_ERR_NOT_SUPPORTED", wire.ErrLostConn: "PMIX_ERR_LOST_CONNECTION",
		wire.ReadyForHandshake: "PMIX_ERR_READY_FOR_HANDSHAKE",
	}[st]
	if name == "" {
		return "status " + strconv.Itoa(int(st))
	}
	return fmt.Sprintf("%s (%d)", name, st)
}

// Env is what the server told a process in its environment.
type Env struct {
	URI  string    // the server's address, "NSPACE.RANK;tcp4://IP:PORT"
	Proc wire.Proc // who the process is
}

// FromEnv reads the server's address and the process's name from the
// environment; ok is false when no server is named.
func FromEnv() (env Env, ok bool, err error) {
	for _, name := range envURIs {
		if env.URI = os.Getenv(name); env.URI != "" {
			break
		}
	}
	if env.URI == "" {
		return Env{}, false, nil
	}
	env.Proc.Nspace = os.Getenv(EnvNamespace)
	if env.Proc.Nspace == "" {
		return env, true, fmt.Errorf("pmix: %s is set but %s is not", envURIs[0], EnvNamespace)
	}
	r, err := strconv.ParseUint(os.Getenv(EnvRank), 10, 32)
	if err != nil {
		return env, true, fmt.Errorf("pmix: %s=%q: %w", EnvRank, os.Getenv(EnvRank), err)
	}
	env.Proc.Rank = uint32(r)
	if sec := os.Getenv(EnvSecurity); sec != "" && !contains(strings.Split(sec, ","), secNative) {
		return env, true, fmt.Errorf("%w: the server accepts the security modules %q, not %q", ErrProtocol, sec, secNative)
	}
	return env, true, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if strings.TrimSpace(x) == s {
			return true
		}
	}
	return false
}

// ParseURI returns the TCP address in a server URI ("NSPACE.RANK;tcp4://
// IP:PORT", or the address alone).
func ParseURI(uri string) (string, error) {
	if _, rest, ok := strings.Cut(uri, ";"); ok {
		uri = rest
	}
	for _, scheme := range []string{"tcp4://", "tcp6://", "tcp://"} {
		if a, ok := strings.CutPrefix(uri, scheme); ok {
			if _, _, err := net.SplitHostPort(a); err != nil {
				return "", fmt.Errorf("%w: server address %q: %v", ErrProtocol, uri, err)
			}
			return a, nil
		}
	}
	return "", fmt.Errorf("%w: server address %q is not TCP (tcp4:// or tcp6://)", ErrProtocol, uri)
}

// Config configures Dial. The zero value means defaults.
type Config struct {
	// Logger receives diagnostics. Default slog.Default().
	Logger *slog.Logger
	// FinalizeTimeout bounds how long Close waits for the server to
	// acknowledge the finalize, as the C client does. Default 2s.
	FinalizeTimeout time.Duration
	// MaxReply bounds a reply's length. Default 64 MiB.
	MaxReply int
}

func (c *Config) withDefaults() Config {
	var d Config
	if c != nil {
		d = *c
	}
	if d.Logger == nil {
		d.Logger = slog.Default()
	}
	if d.FinalizeTimeout <= 0 {
		d.FinalizeTimeout = 2 * time.Second
	}
	if d.MaxReply <= 0 {
		d.MaxReply = 64 << 20
	}
	return d
}

// Client is a process's session with its node's PMIx server.
type Client struct {
	cfg    Config
	proc   wire.Proc
	conn   net.Conn
	pindex int32

	wmu sync.Mutex // serialises writes

	mu      sync.Mutex
	tag     uint32
	pending map[uint32]chan []byte
	err     error     // why the connection ended; set once
	puts    []wire.KV // put since the last commit
	closed  bool

	done chan struct{} // closed when the reader ends
}

// Dial connects to the server at uri as proc and does the handshake.
func Dial(ctx context.Context, uri string, proc wire.Proc, cfg *Config) (*Client, error) {
	conf := cfg.withDefaults()
	addr, err := ParseURI(uri)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrServerGone, err)
	}
	c := &Client{cfg: conf, proc: proc, conn: conn, tag: wire.TagDynamic, pending: map[uint32]chan []byte{}, done: make(chan struct{})}
	if err := c.handshake(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	go c.read()
	return c, nil
}

// handshake sends the connection request and reads the server's status
// and the client's index.
func (c *Client) handshake(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { c.conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	req := wire.AppendConnect(nil, wire.Connect{
		Sec: secNative, Cred: wire.NativeCred(uint32(os.Geteuid()), uint32(os.Getegid())),
		Proc: c.proc, Version: clientVersion, Bfrops: bfrops, BufType: wire.BufferNonDesc, GDS: gds,
	})
	fail := func(what string, err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("pmix: connecting to the server: %w", ctx.Err())
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			// The server hangs up on a request it cannot serve: an
			// unknown namespace or rank, a version or encoding it does
			// not speak.
			return fmt.Errorf("%w: the server closed the connection %s (it does not serve %s as a PMIx %s client with %s encoding)",
				ErrProtocol, what, c.proc, clientVersion, bfrops)
		}
		return fmt.Errorf("%w: %s: %w", ErrServerGone, what, err)
	}
	if _, err := c.conn.Write(req); err != nil {
		return fail("sending the connection request", err)
	}
	var b [4]byte
	if _, err := io.ReadFull(c.conn, b[:]); err != nil {
		return fail("instead of answering the connection request", err)
	}
	switch st := int32(binary.BigEndian.Uint32(b[:])); st {
	case wire.Success:
	case wire.ReadyForHandshake:
		return fmt.Errorf("%w: the server asks for a security handshake, which %q does not do", ErrProtocol, secNative)
	default:
		return &StatusError{Op: "connect", Status: st}
	}
	if _, err := io.ReadFull(c.conn, b[:]); err != nil {
		return fail("before sending the client's index", err)
	}
	c.pindex = int32(binary.BigEndian.Uint32(b[:]))
	return nil
}

// read delivers replies to their requests until the connection ends.
func (c *Client) read() {
	defer close(c.done)
	hdr := make([]byte, wire.HeaderLen)
	var err error
	for {
		if _, err = io.ReadFull(c.conn, hdr); err != nil {
			break
		}
		var h wire.Header
		if h, err = wire.ParseHeader(hdr, c.cfg.MaxReply); err != nil {
			err = fmt.Errorf("%w: %w", ErrProtocol, err)
			break
		}
		body := make([]byte, h.Len)
		if _, err = io.ReadFull(c.conn, body); err != nil {
			break
		}
		c.mu.Lock()
		ch := c.pending[h.Tag]
		delete(c.pending, h.Tag)
		c.mu.Unlock()
		if ch == nil {
			// An event notification or a reply to an abandoned request.
			c.cfg.Logger.Debug("pmix: message dropped", "tag", h.Tag, "bytes", h.Len)
			continue
		}
		ch <- body
	}
	c.mu.Lock()
	if c.closed {
		err = net.ErrClosed
	} else if !errors.Is(err, ErrProtocol) {
		err = fmt.Errorf("%w: %w", ErrServerGone, err)
	}
	c.err = err
	for t, ch := range c.pending {
		close(ch)
		delete(c.pending, t)
	}
	c.mu.Unlock()
}

// request sends body and waits for its reply.
func (c *Client) request(ctx context.Context, op string, body []byte) ([]byte, error) {
	ch := make(chan []byte, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, fmt.Errorf("pmix: %s: %w", op, err)
	}
	tag := c.tag
	c.tag++
	if c.tag < wire.TagDynamic {
		c.tag = wire.TagDynamic
	}
	c.pending[tag] = ch
	c.mu.Unlock()
	msg := wire.AppendHeader(make([]byte, 0, wire.HeaderLen+len(body)), wire.Header{PIndex: c.pindex, Tag: tag, Len: uint32(len(body))})
	msg = append(msg, body...)
	c.wmu.Lock()
	_, err := c.conn.Write(msg)
	c.wmu.Unlock()
	if err != nil {
		c.forget(tag)
		return nil, fmt.Errorf("pmix: %s: %w: %w", op, ErrServerGone, err)
	}
	select {
	case reply, ok := <-ch:
		if !ok {
			c.mu.Lock()
			err := c.err
			c.mu.Unlock()
			return nil, fmt.Errorf("pmix: %s: %w", op, err)
		}
		return reply, nil
	case <-ctx.Done():
		c.forget(tag)
		return nil, fmt.Errorf("pmix: %s: %w", op, ctx.Err())
	}
}

func (c *Client) forget(tag uint32) {
	c.mu.Lock()
	delete(c.pending, tag)
	c.mu.Unlock()
}

// status sends body and reads a reply of a status alone.
func (c *Client) status(ctx context.Context, op string, body []byte) error {
	reply, err := c.request(ctx, op, body)
	if err != nil {
		return err
	}
	st, err := wire.ParseStatus(reply)
	if err != nil {
		return fmt.Errorf("pmix: %s: %w: %w", op, ErrProtocol, err)
	}
	if st != wire.Success {
		return &StatusError{Op: op, Status: st}
	}
	return nil
}

// Proc is this process's name.
func (c *Client) Proc() wire.Proc { return c.proc }

// Put stages a value for every process of the job, on this node and the
// others (PMIx's global scope); Commit sends what was staged.
func (c *Client) Put(key, value string) {
	c.mu.Lock()
	c.puts = append(c.puts, wire.KV{Key: key, Value: value})
	c.mu.Unlock()
}

// Commit sends the values put since the last commit to the server.
func (c *Client) Commit(ctx context.Context) error {
	c.mu.Lock()
	puts := c.puts
	c.puts = nil
	c.mu.Unlock()
	body, err := wire.AppendCommit(nil, puts)
	if err != nil {
		return err
	}
	return c.status(ctx, "commit", body)
}

// Fence returns once every process of the job has entered it; with
// collect, the values each committed before it are then available to
// Get on every node.
func (c *Client) Fence(ctx context.Context, collect bool) error {
	var infos []wire.Info
	if collect {
		infos = []wire.Info{{Key: "pmix.collect", Value: true}}
	}
	body, err := wire.AppendFence(nil, []wire.Proc{{Nspace: c.proc.Nspace, Rank: wire.RankWildcard}}, infos)
	if err != nil {
		return err
	}
	return c.status(ctx, "fence", body)
}

// Get returns the string that process rank of this job put under key.
func (c *Client) Get(ctx context.Context, rank uint32, key string) (string, error) {
	proc := wire.Proc{Nspace: c.proc.Nspace, Rank: rank}
	body, err := wire.AppendGet(nil, proc, nil, key)
	if err != nil {
		return "", err
	}
	reply, err := c.request(ctx, "get", body)
	if err != nil {
		return "", err
	}
	st, data, err := wire.ParseGetReply(reply)
	if err != nil {
		return "", fmt.Errorf("pmix: get %s of %s: %w: %w", key, proc, ErrProtocol, err)
	}
	if st != wire.Success {
		return "", fmt.Errorf("pmix: get %s of %s: %w", key, proc, &StatusError{Op: "get", Status: st})
	}
	var unread error
	for _, d := range data {
		if d.Proc != proc {
			continue
		}
		for _, kv := range d.KVs {
			if kv.Key != key {
				continue
			}
			s, ok := kv.Value.(string)
			if !ok {
				return "", fmt.Errorf("pmix: get %s of %s: a %T, not a string", key, proc, kv.Value)
			}
			return s, nil
		}
		unread = errors.Join(unread, d.Err)
	}
	if unread != nil {
		return "", fmt.Errorf("pmix: get %s of %s: %w (after the values read: %w)", key, proc, ErrNotFound, unread)
	}
	return "", fmt.Errorf("pmix: get %s of %s: %w", key, proc, ErrNotFound)
}

// Close tells the server that this process is done with it (PMIx's
// finalize, which Open MPI expects of every process that connected
// before it exits), waiting at most Config.FinalizeTimeout or until ctx
// ends, and closes the connection.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	gone := c.err != nil || c.closed
	c.mu.Unlock()
	var err error
	if !gone {
		fctx, cancel := context.WithTimeout(ctx, c.cfg.FinalizeTimeout)
		err = c.status(fctx, "finalize", wire.AppendFinalize(nil))
		cancel()
	}
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	if cerr := c.conn.Close(); err == nil && cerr != nil && !errors.Is(cerr, net.ErrClosed) {
		err = cerr
	}
	<-c.done
	return err
}
