package pmi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// ErrBroken reports a session that can no longer be used: a request was
// cut short (its reply may still be on its way, so the stream is out of
// step), the server closed the connection, or it was closed.
var ErrBroken = errors.New("pmi: session unusable")

// closeTimeout bounds the finalize exchange of Close.
const closeTimeout = 10 * time.Second

// deadliner is a connection whose reads and writes a deadline can cut
// (net.Conn, or a pollable *os.File).
type deadliner interface {
	SetDeadline(time.Time) error
}

// conn carries one request and its reply at a time over a launcher's
// connection, cutting it when the request's ctx ends.
type conn struct {
	rw  io.ReadWriteCloser
	r   *bufio.Reader
	sem chan struct{} // held by the exchange in progress
	dl  deadliner     // nil: cutting a request closes rw

	mu     sync.Mutex
	broken error // why the session is unusable, or nil
}

// newConn makes a conn of rw. A socket given as an *os.File (as an
// inherited descriptor is) becomes a net.Conn on a close-on-exec
// duplicate, so that deadlines can cut its requests (a blocking file's
// read outlives its Close) and processes this one starts do not inherit
// it; the file itself is closed.
func newConn(rw io.ReadWriteCloser) *conn {
	if f, ok := rw.(*os.File); ok {
		if nc, err := net.FileConn(f); err == nil {
			f.Close()
			rw = nc
		}
	}
	c := &conn{rw: rw, r: bufio.NewReader(rw), sem: make(chan struct{}, 1)}
	// A non-pollable *os.File has SetDeadline but refuses it.
	if d, ok := rw.(deadliner); ok && d.SetDeadline(time.Time{}) == nil {
		c.dl = d
	}
	return c
}

// err is why the session is unusable, or nil.
func (c *conn) err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.broken
}

// breakWith makes the session unusable and closes the connection.
func (c *conn) breakWith(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken == nil {
		c.broken = err
		c.rw.Close()
	}
}

// exchange sends req and reads its reply with read. Requests are
// serialised; waiting for the turn and the exchange itself end with ctx.
// A request cut short leaves the session unusable, and so does a failed
// read or write: what (the command) names it in errors.
func (c *conn) exchange(ctx context.Context, what string, req []byte, read func(*bufio.Reader) (string, error)) (string, error) {
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return "", fmt.Errorf("pmi: %s: %w", what, ctx.Err())
	}
	defer func() { <-c.sem }()
	if err := c.err(); err != nil {
		return "", fmt.Errorf("%w (%w)", ErrBroken, err)
	}
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(fired)
		if c.dl != nil {
			c.dl.SetDeadline(time.Unix(1, 0))
		} else {
			c.breakWith(fmt.Errorf("%s cut short: %w", what, ctx.Err()))
		}
	})
	_, err := c.rw.Write(req)
	var reply string
	if err == nil {
		reply, err = read(c.r)
	}
	if !stop() {
		<-fired
		if err == nil && c.dl != nil {
			// The reply arrived before the cut: the stream is in step.
			c.dl.SetDeadline(time.Time{})
			return reply, nil
		}
		cause := fmt.Errorf("%s cut short: %w", what, ctx.Err())
		c.breakWith(cause)
		return "", fmt.Errorf("pmi: %s: %w", what, ctx.Err())
	}
	if err != nil {
		if prior := c.err(); prior != nil { // Close cut it
			return "", fmt.Errorf("%w (%w)", ErrBroken, prior)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			err = fmt.Errorf("the launcher closed the PMI connection during %s", what)
		} else {
			err = fmt.Errorf("%s: %w", what, err)
		}
		c.breakWith(err)
		return "", fmt.Errorf("pmi: %w", err)
	}
	return reply, nil
}

// close closes the connection once the exchange in progress, if any, has
// ended; finalize runs before it when the session is usable.
func (c *conn) close(finalize func(ctx context.Context) error) error {
	var err error
	if c.err() == nil && finalize != nil {
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		err = finalize(ctx)
		cancel()
	}
	c.breakWith(errors.New("closed"))
	return err
}
