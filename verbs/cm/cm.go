package cm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/rvma/rvma/verbs"
)

// Config configures Dial and Request.Accept. The zero value (or nil) means
// defaults.
type Config struct {
	// Connect holds the QP attributes applied when the QP is connected.
	// Default: verbs' defaults.
	Connect *verbs.ConnectConfig
	// PrivateData travels to the peer with the request or the reply (at
	// most 1024 bytes), as rdma_cm's private data does.
	PrivateData []byte
	// Via, when set, is where the QP's packets go and come from instead of
	// the peer's GID: a relay on the data path, such as the link emulator
	// (cmd/linkem). The exchange itself still goes to the peer directly.
	Via verbs.GID
}

// ErrRejected is wrapped by the error Dial returns when the listener
// rejects the request; a *RejectError carries the reason.
var ErrRejected = errors.New("cm: connection rejected")

// RejectError is a rejection with the listener's reason.
type RejectError struct{ Reason string }

func (e *RejectError) Error() string { return "cm: connection rejected: " + e.Reason }
func (e *RejectError) Unwrap() error { return ErrRejected }

// Result describes the peer of an established connection.
type Result struct {
	Remote      verbs.Endpoint
	PrivateData []byte
}

// Dial connects qp (in Reset or Init) to a QP that a listener at address
// accepts. On success qp is in ReadyToSend.
func Dial(ctx context.Context, address string, qp *verbs.QP, cfg *Config) (*Result, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	if len(cfg.PrivateData) > maxPrivate {
		return nil, fmt.Errorf("cm: dial: private data of %d bytes, max %d", len(cfg.PrivateData), maxPrivate)
	}
	if err := toInit(qp); err != nil {
		return nil, fmt.Errorf("cm: dial: %w", err)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, fmt.Errorf("cm: dial %s: %w", address, err)
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	res, err := dialer(c, qp, cfg)
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("cm: dial %s: %w", address, ctx.Err())
	} else if err != nil {
		err = fmt.Errorf("cm: dial %s: %w", address, err)
	}
	return res, err
}

func dialer(c net.Conn, qp *verbs.QP, cfg *Config) (*Result, error) {
	req := &message{typ: msgREQ, ep: capped(qp, cfg), qpType: qp.Type(), private: cfg.PrivateData}
	if _, err := c.Write(appendMessage(nil, req)); err != nil {
		return nil, err
	}
	rep, err := readMessage(c)
	if err != nil {
		return nil, err
	}
	switch rep.typ {
	case msgREJ:
		return nil, &RejectError{Reason: rep.reason}
	case msgREP:
	default:
		return nil, fmt.Errorf("%w: expected a reply, got type %d", ErrMalformed, rep.typ)
	}
	if err := connect(qp, rep.ep, cfg); err != nil {
		c.Write(appendMessage(nil, &message{typ: msgREJ, reason: err.Error()}))
		return nil, err
	}
	if _, err := c.Write(appendMessage(nil, &message{typ: msgRTU})); err != nil {
		return nil, err
	}
	return &Result{Remote: rep.ep, PrivateData: append([]byte(nil), rep.private...)}, nil
}

func toInit(qp *verbs.QP) error {
	switch qp.State() {
	case verbs.StateReset:
		return qp.Init()
	case verbs.StateInit:
		return nil
	default:
		return fmt.Errorf("QP %d is %v: %w", qp.Num(), qp.State(), verbs.ErrQPState)
	}
}

func connect(qp *verbs.QP, remote verbs.Endpoint, cfg *Config) error {
	if cfg.Via.IsValid() {
		remote.GID = cfg.Via
	}
	if err := qp.ReadyToReceive(remote, cfg.Connect); err != nil {
		return err
	}
	return qp.ReadyToSend(nil)
}

func readMessage(r io.Reader) (*message, error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return nil, err
	}
	typ, n, err := parseHeader(h[:])
	if err != nil {
		return nil, err
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	return parseBody(typ, body)
}

// Listener accepts connection requests on a TCP address.
type Listener struct {
	ln net.Listener
}

// Listen listens on a TCP address such as "127.0.0.1:0".
func Listen(ctx context.Context, address string) (*Listener, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", address)
	if err != nil {
		return nil, fmt.Errorf("cm: listen %s: %w", address, err)
	}
	return &Listener{ln: ln}, nil
}

// Addr returns the listening address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Close stops listening; a blocked Accept returns an error wrapping
// net.ErrClosed.
func (l *Listener) Close() error { return l.ln.Close() }

// Request is a connection request waiting for Accept or Reject.
type Request struct {
	c    net.Conn
	req  *message
	done bool
}

// Accept waits for the next connection request. Requests that do not
// decode are answered with a rejection and skipped.
func (l *Listener) Accept(ctx context.Context) (*Request, error) {
	stop := context.AfterFunc(ctx, func() { l.ln.Close() })
	defer stop()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("cm: accept: %w", ctx.Err())
			}
			return nil, fmt.Errorf("cm: accept: %w", err)
		}
		m, err := readMessage(c)
		if err == nil && m.typ != msgREQ {
			err = fmt.Errorf("%w: expected a request, got type %d", ErrMalformed, m.typ)
		}
		if err != nil {
			c.Write(appendMessage(nil, &message{typ: msgREJ, reason: err.Error()}))
			c.Close()
			continue
		}
		return &Request{c: c, req: m}, nil
	}
}

// Remote returns the dialer's endpoint.
func (r *Request) Remote() verbs.Endpoint { return r.req.ep }

// Type returns the dialer's QP type; the accepting QP must match it.
func (r *Request) Type() verbs.QPType { return r.req.qpType }

// PrivateData returns the dialer's private data.
func (r *Request) PrivateData() []byte { return r.req.private }

// Accept connects qp (in Reset or Init, of the dialer's type) to the
// dialer and waits for the dialer's confirmation.
func (r *Request) Accept(ctx context.Context, qp *verbs.QP, cfg *Config) error {
	if r.done {
		return fmt.Errorf("cm: accept: request already answered")
	}
	r.done = true
	defer r.c.Close()
	stop := context.AfterFunc(ctx, func() { r.c.Close() })
	defer stop()
	if cfg == nil {
		cfg = &Config{}
	}
	fail := func(err error) error {
		r.c.Write(appendMessage(nil, &message{typ: msgREJ, reason: err.Error()}))
		return fmt.Errorf("cm: accept: %w", err)
	}
	if len(cfg.PrivateData) > maxPrivate {
		return fail(fmt.Errorf("private data of %d bytes, max %d", len(cfg.PrivateData), maxPrivate))
	}
	if qp.Type() != r.req.qpType {
		return fail(fmt.Errorf("QP type %v, dialer has %v", qp.Type(), r.req.qpType))
	}
	if err := toInit(qp); err != nil {
		return fail(err)
	}
	if err := connect(qp, r.req.ep, cfg); err != nil {
		return fail(err)
	}
	rep := &message{typ: msgREP, ep: capped(qp, cfg), qpType: qp.Type(), private: cfg.PrivateData}
	if _, err := r.c.Write(appendMessage(nil, rep)); err != nil {
		qp.SetError()
		return fmt.Errorf("cm: accept: %w", err)
	}
	m, err := readMessage(r.c)
	if err == nil && m.typ == msgREJ {
		err = &RejectError{Reason: m.reason}
	} else if err == nil && m.typ != msgRTU {
		err = fmt.Errorf("%w: expected RTU, got type %d", ErrMalformed, m.typ)
	}
	if err != nil {
		qp.SetError()
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return fmt.Errorf("cm: accept: %w", err)
	}
	return nil
}

// Reject refuses the request; the dialer's Dial fails with a *RejectError
// carrying reason.
func (r *Request) Reject(reason string) error {
	if r.done {
		return fmt.Errorf("cm: reject: request already answered")
	}
	r.done = true
	defer r.c.Close()
	_, err := r.c.Write(appendMessage(nil, &message{typ: msgREJ, reason: reason}))
	return err
}

// capped is qp's endpoint with the MTU it offers lowered to the caller's
// cap, so that both sides agree on the path MTU when only one of them
// caps it (each side connects with the minimum of its own and the
// offered MTU).
func capped(qp *verbs.QP, cfg *Config) verbs.Endpoint {
	ep := qp.Endpoint()
	if cfg.Connect != nil && cfg.Connect.MTU > 0 && cfg.Connect.MTU < ep.MTU {
		ep.MTU = cfg.Connect.MTU
	}
	return ep
}
