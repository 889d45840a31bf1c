// Package pmi is a client of the PMI-1 wire protocol that MPICH's Hydra
// launcher (mpiexec) speaks to its processes over the file descriptor named
// by PMI_FD: init, the job's key-value space (put, get, barrier) and
// finalize. It implements kvs.Store, so a job started by mpiexec finds its
// ranks' addresses through Hydra.
//
// PMI-1 has no blocking get: a value put by another rank is visible after
// a barrier that both have entered, which is how rma uses it. A Client is
// safe for concurrent use (requests are serialised).
package pmi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrProtocol reports a reply that does not follow PMI-1.
var ErrProtocol = errors.New("pmi: protocol error")

// Client talks PMI-1 over one connection.
type Client struct {
	mu      sync.Mutex
	rw      io.ReadWriteCloser
	r       *bufio.Reader
	kvsname string
	rank    int
	size    int
}

// FromEnv connects through PMI_FD and reads PMI_RANK and PMI_SIZE. It
// returns ok=false when PMI_FD is not set.
func FromEnv() (c *Client, ok bool, err error) {
	fdStr := os.Getenv("PMI_FD")
	if fdStr == "" {
		return nil, false, nil
	}
	fd, err := strconv.Atoi(fdStr)
	if err != nil || fd < 0 {
		return nil, true, fmt.Errorf("pmi: PMI_FD=%q is not a descriptor", fdStr)
	}
	rank, err1 := strconv.Atoi(os.Getenv("PMI_RANK"))
	size, err2 := strconv.Atoi(os.Getenv("PMI_SIZE"))
	if err1 != nil || err2 != nil || size < 1 || rank < 0 || rank >= size {
		return nil, true, fmt.Errorf("pmi: PMI_RANK=%q PMI_SIZE=%q are not a rank of a job",
			os.Getenv("PMI_RANK"), os.Getenv("PMI_SIZE"))
	}
	f := os.NewFile(uintptr(fd), "pmi")
	c, err = New(f, rank, size)
	return c, true, err
}

// New runs the PMI-1 handshake over rw for the given rank of size.
func New(rw io.ReadWriteCloser, rank, size int) (*Client, error) {
	c := &Client{rw: rw, r: bufio.NewReader(rw), rank: rank, size: size}
	m, err := c.do("cmd=init pmi_version=1 pmi_subversion=1", "response_to_init")
	if err != nil {
		return nil, err
	}
	if m["pmi_version"] != "1" {
		return nil, fmt.Errorf("%w: server speaks PMI version %q", ErrProtocol, m["pmi_version"])
	}
	if _, err := c.do("cmd=get_maxes", "maxes"); err != nil {
		return nil, err
	}
	m, err = c.do("cmd=get_my_kvsname", "my_kvsname")
	if err != nil {
		return nil, err
	}
	c.kvsname = m["kvsname"]
	if c.kvsname == "" {
		return nil, fmt.Errorf("%w: empty kvsname", ErrProtocol)
	}
	return c, nil
}

// Rank returns the process's rank.
func (c *Client) Rank() int { return c.rank }

// Size returns the job's size.
func (c *Client) Size() int { return c.size }

// do sends one command and reads the reply, which must be cmd=want; a
// nonzero rc is an error.
func (c *Client) do(req, want string) (map[string]string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rw == nil {
		return nil, fmt.Errorf("pmi: closed")
	}
	if _, err := io.WriteString(c.rw, req+"\n"); err != nil {
		return nil, fmt.Errorf("pmi: %w", err)
	}
	line, err := c.r.ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("pmi: reading reply to %q: %w", req, err)
	}
	m := Parse(line)
	if m["cmd"] != want {
		return nil, fmt.Errorf("%w: sent %q, got %q", ErrProtocol, req, strings.TrimSpace(line))
	}
	if rc, ok := m["rc"]; ok && rc != "0" {
		return m, fmt.Errorf("pmi: %s failed: rc=%s %s", want, rc, m["msg"])
	}
	return m, nil
}

// Parse splits a PMI-1 line into its key=value fields.
func Parse(line string) map[string]string {
	m := map[string]string{}
	for _, f := range strings.Fields(line) {
		k, v, _ := strings.Cut(f, "=")
		m[k] = v
	}
	return m
}

// Put implements kvs.Store.
func (c *Client) Put(_ context.Context, key, value string) error {
	if strings.ContainsAny(key+value, " \t\n=") || key == "" || value == "" {
		return fmt.Errorf("pmi: key %q or value %q is empty or holds whitespace or '='", key, value)
	}
	_, err := c.do("cmd=put kvsname="+c.kvsname+" key="+key+" value="+value, "put_result")
	return err
}

// Get implements kvs.Store. PMI-1 does not wait for a key: Get retries
// until it appears or ctx ends, so that it also works without a barrier.
func (c *Client) Get(ctx context.Context, key string) (string, error) {
	for {
		m, err := c.do("cmd=get kvsname="+c.kvsname+" key="+key, "get_result")
		if err == nil {
			return m["value"], nil
		}
		if m == nil { // transport or protocol failure, not "not found"
			return "", err
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("pmi: get %s: %w", key, ctx.Err())
		case <-time.After(time.Millisecond):
		}
	}
}

// Barrier implements kvs.Store. PMI-1's barrier cannot be cancelled; it
// returns when Hydra releases it or the connection fails.
func (c *Client) Barrier(context.Context) error {
	_, err := c.do("cmd=barrier_in", "barrier_out")
	return err
}

// Close finalizes the PMI session.
func (c *Client) Close() error {
	if _, err := c.do("cmd=finalize", "finalize_ack"); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	err := c.rw.Close()
	c.rw = nil
	return err
}
