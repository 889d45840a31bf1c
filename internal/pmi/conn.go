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

// ErrBroken reports a session that can no longer be used: a request's
// reply did not come within Grace of its context's end (the stream is out
// of step), the server closed the connection, or Close did.
var ErrBroken = errors.New("pmi: session unusable")

// Grace is how long a request whose context has ended may still wait for
// its reply, in the background, before the connection is cut. The caller
// has its error at once; the reply, when it comes, keeps the stream in
// step for the next request (a get of a key not there yet is answered at
// once, so giving up on one costs nothing). A fence waits for the other
// ranks, which may never come: cut after Grace, the session is unusable.
var Grace = 10 * time.Second

// closeTimeout bounds the finalize exchange of Close.
const closeTimeout = 10 * time.Second

// deadliner is a connection whose reads and writes a deadline can cut
// (net.Conn, or a pollable *os.File).
type deadliner interface {
	SetDeadline(time.Time) error
}

// conn carries one request and its reply at a time over a launcher's
// connection.
type conn struct {
	rw  io.ReadWriteCloser
	r   *bufio.Reader
	sem chan struct{} // held by the exchange in progress, until its reply or cut
	dl  deadliner     // nil: cutting a request closes rw

	mu       sync.Mutex
	broken   error  // why the session is unusable, or nil
	inFlight string // the command of the exchange in progress, or ""
}

// waits names the commands whose reply waits for the other ranks, which
// Close does not wait for.
var waits = map[string]bool{"kvs-fence": true, "barrier_in": true}

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

type result struct {
	reply string
	err   error
}

// exchange sends req and reads its reply with read. Requests are
// serialised; the caller waits for its turn and for the reply until ctx
// ends, while the request itself goes on for Grace more (see Grace). A
// failed read or write leaves the session unusable; what (the command)
// names the request in errors.
func (c *conn) exchange(ctx context.Context, what string, req []byte, read func(*bufio.Reader) (string, error)) (string, error) {
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return "", fmt.Errorf("pmi: %s: %w", what, ctx.Err())
	}
	if err := c.err(); err != nil {
		<-c.sem
		return "", fmt.Errorf("%w (%w)", ErrBroken, err)
	}
	c.mu.Lock()
	c.inFlight = what
	c.mu.Unlock()
	res := make(chan result, 1)
	go func() {
		reply, err := c.roundTrip(ctx, what, req, read)
		c.mu.Lock()
		c.inFlight = ""
		c.mu.Unlock()
		<-c.sem // before the caller has the result: its next request may go
		res <- result{reply, err}
	}()
	select {
	case r := <-res:
		return r.reply, r.err
	case <-ctx.Done():
		select {
		case r := <-res: // both at once: the reply counts
			return r.reply, r.err
		default:
			return "", fmt.Errorf("pmi: %s: %w", what, ctx.Err())
		}
	}
}

// roundTrip writes req and reads the reply; Grace after ctx ends, a
// deadline (or closing the connection) cuts it.
func (c *conn) roundTrip(ctx context.Context, what string, req []byte, read func(*bufio.Reader) (string, error)) (string, error) {
	var (
		mu    sync.Mutex
		ended bool        // the round trip is over: arm no timer
		timer *time.Timer // the cut, armed when ctx ends
	)
	cut := make(chan struct{}) // closed once the cut has been made
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if ended {
			return
		}
		timer = time.AfterFunc(Grace, func() {
			defer close(cut)
			if c.dl != nil {
				c.dl.SetDeadline(time.Unix(1, 0))
			} else {
				c.breakWith(fmt.Errorf("no reply to %s within %v of its cancellation", what, Grace))
			}
		})
	})
	_, err := c.rw.Write(req)
	var reply string
	if err == nil {
		reply, err = read(c.r)
	}
	stop()
	mu.Lock()
	ended = true
	t := timer
	mu.Unlock()
	if t != nil && !t.Stop() {
		<-cut
		if err == nil && c.dl != nil {
			// The reply came before the cut: the stream is in step.
			c.dl.SetDeadline(time.Time{})
			return reply, nil
		}
		err = fmt.Errorf("no reply to %s within %v of its cancellation: %w", what, Grace, ctx.Err())
		c.breakWith(err)
		return "", fmt.Errorf("pmi: %w", err)
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

// close finalizes the session when it is usable, then closes the
// connection. A request still in progress (one whose caller gave up) is
// waited for, unless it waits for the other ranks (a fence): that one is
// cut.
func (c *conn) close(finalize func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	c.mu.Lock()
	idle := !waits[c.inFlight]
	c.mu.Unlock()
	var err error
	if idle && c.err() == nil && finalize != nil {
		err = finalize(ctx)
	}
	c.breakWith(errors.New("closed"))
	return err
}
