// Package pmi is a client of the two wire protocols through which
// launchers give a job's processes a key-value space: PMI-1, which MPICH's
// Hydra (mpiexec) and Slurm's pmi2 plugin speak, and PMI-2, which both
// speak too (an MPICH built for Slurm, --with-pmi=pmi2, speaks only it
// under srun --mpi=pmi2). Either is spoken over the socket whose
// descriptor PMI_FD names. A Session
// implements kvs.Store (put, get, barrier, close) and tells the process
// its rank and the job's size, so a job started by such a launcher finds
// its ranks' addresses through it.
//
// Neither protocol has a blocking get: a value put by another rank is
// visible after a barrier (PMI-2's fence) that both have entered, which
// is how rma uses it; Get polls until the key appears or its context
// ends. Sessions are safe for concurrent use (requests are serialised),
// and every call returns when its context ends; the request itself may
// wait Grace longer for its reply, in the background, so that the stream
// stays in step, and is then cut, leaving the session unusable
// (ErrBroken).
//
// FromEnv chooses the protocol: PMI-2 is asked for first, and PMI-1
// spoken if the launcher answers with version 1; a caller may force
// either. See Open.
package pmi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// ErrProtocol reports a reply that does not follow the protocol.
var ErrProtocol = errors.New("pmi: protocol error")

// Session is a process's PMI session with its launcher: the job's
// key-value space (kvs.Store) and the process's place in the job.
type Session interface {
	// Put publishes a key, visible to the other ranks after the next
	// Barrier.
	Put(ctx context.Context, key, value string) error
	// Get returns a key's value, polling until it is there or ctx ends.
	Get(ctx context.Context, key string) (string, error)
	// Barrier returns once every rank of the job has entered it, and
	// makes the keys put before it visible (PMI-2's kvs-fence, PMI-1's
	// barrier).
	Barrier(ctx context.Context) error
	// Close finalizes the session and closes the connection.
	Close() error
	// Rank is this process's rank, Size the job's number of ranks.
	Rank() int
	Size() int
	// Version is the protocol spoken: 1 or 2.
	Version() int
}

// Client talks PMI-1 over one connection.
type Client struct {
	c       *conn
	kvsname string
	rank    int
	size    int
}

// New runs the PMI-1 handshake over rw for the given rank of size. It
// owns rw from then on, and closes it on failure.
func New(ctx context.Context, rw io.ReadWriteCloser, rank, size int) (*Client, error) {
	return newV1(ctx, newConn(rw), rank, size, false)
}

// newV1 starts a PMI-1 session over c, after the init exchange when
// inited (the launcher answered a PMI-2 init with version 1).
func newV1(ctx context.Context, c *conn, rank, size int, inited bool) (*Client, error) {
	cl := &Client{c: c, rank: rank, size: size}
	fail := func(err error) (*Client, error) {
		c.breakWith(err)
		return nil, err
	}
	if !inited {
		m, err := cl.do(ctx, "cmd=init pmi_version=1 pmi_subversion=1", "response_to_init")
		if err != nil {
			return fail(err)
		}
		if m["pmi_version"] != "1" {
			return fail(fmt.Errorf("%w: asked for PMI version 1, the server answered version %q", ErrProtocol, m["pmi_version"]))
		}
	}
	if _, err := cl.do(ctx, "cmd=get_maxes", "maxes"); err != nil {
		return fail(err)
	}
	m, err := cl.do(ctx, "cmd=get_my_kvsname", "my_kvsname")
	if err != nil {
		return fail(err)
	}
	cl.kvsname = m["kvsname"]
	if cl.kvsname == "" {
		return fail(fmt.Errorf("%w: empty kvsname", ErrProtocol))
	}
	return cl, nil
}

// Rank returns the process's rank.
func (c *Client) Rank() int { return c.rank }

// Size returns the job's size.
func (c *Client) Size() int { return c.size }

// Version returns 1.
func (c *Client) Version() int { return 1 }

// readLine reads one PMI-1 reply.
func readLine(r *bufio.Reader) (string, error) {
	return r.ReadString('\n')
}

// do sends one command and reads the reply, which must be cmd=want; a
// nonzero rc is an error, returned with the reply's fields.
func (c *Client) do(ctx context.Context, req, want string) (map[string]string, error) {
	cmd := req
	if _, rest, ok := strings.Cut(req, "cmd="); ok {
		cmd, _, _ = strings.Cut(rest, " ")
	}
	line, err := c.c.exchange(ctx, cmd, []byte(req+"\n"), readLine)
	if err != nil {
		return nil, err
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
func (c *Client) Put(ctx context.Context, key, value string) error {
	if strings.ContainsAny(key+value, " \t\n=") || key == "" || value == "" {
		return fmt.Errorf("pmi: key %q or value %q is empty or holds whitespace or '='", key, value)
	}
	_, err := c.do(ctx, "cmd=put kvsname="+c.kvsname+" key="+key+" value="+value, "put_result")
	return err
}

// Get implements kvs.Store. PMI-1 does not wait for a key: Get retries
// until it appears or ctx ends, so that it also works without a barrier.
func (c *Client) Get(ctx context.Context, key string) (string, error) {
	for delay := time.Millisecond; ; delay = min(2*delay, maxPoll) {
		m, err := c.do(ctx, "cmd=get kvsname="+c.kvsname+" key="+key, "get_result")
		if err == nil {
			return m["value"], nil
		}
		if m == nil { // transport or protocol failure, not "not found"
			return "", err
		}
		if err := sleep(ctx, delay); err != nil {
			return "", fmt.Errorf("pmi: get %s: %w", key, err)
		}
	}
}

// maxPoll bounds the pause between two gets of a key not there yet.
const maxPoll = 50 * time.Millisecond

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Barrier implements kvs.Store. If ctx ends first, the barrier stays
// entered: it goes on in the background for Grace, then is cut.
func (c *Client) Barrier(ctx context.Context) error {
	_, err := c.do(ctx, "cmd=barrier_in", "barrier_out")
	return err
}

// Close finalizes the PMI session and closes the connection.
func (c *Client) Close() error {
	return c.c.close(func(ctx context.Context) error {
		_, err := c.do(ctx, "cmd=finalize", "finalize_ack")
		return err
	})
}

// parseInt parses a decimal field of a reply.
func parseInt(cmd, key, v string) (int, error) {
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("%w: %s's %s=%q is not a number", ErrProtocol, cmd, key, v)
	}
	return n, nil
}
