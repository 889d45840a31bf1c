package cm

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

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
	// Key authenticates a dial: the request, the listener's reply and the
	// confirmation each carry an HMAC-SHA256 under it, and the secrets of
	// the data path travel masked. A dialer with a key refuses a reply
	// without a valid MAC. Default none (unauthenticated); at least 16
	// bytes otherwise. Request.Accept uses its listener's key.
	Key []byte
}

// ListenerConfig configures Listen. The zero value (or nil) means
// defaults.
type ListenerConfig struct {
	// Key, when set, admits only requests that carry a valid MAC under it
	// (see Config.Key); others are rejected before the application sees
	// them. Default none: every well-formed request is admitted. At least
	// 16 bytes.
	Key []byte
	// HandshakeTimeout bounds how long a connection may take to send its
	// request, and a dialer to confirm a reply. Default 10s.
	HandshakeTimeout time.Duration
	// MaxPending bounds the connections whose request has not arrived
	// yet, in total (default 256) and from one IP address (default
	// MaxPending/4). A connection over either bound drops the oldest one
	// (as a SYN cache does), so a flood of silent connections delays a
	// real request only while it outpaces it.
	MaxPending, MaxPendingPerHost int
}

func (c *ListenerConfig) withDefaults() ListenerConfig {
	var d ListenerConfig
	if c != nil {
		d = *c
	}
	if d.HandshakeTimeout <= 0 {
		d.HandshakeTimeout = 10 * time.Second
	}
	if d.MaxPending <= 0 {
		d.MaxPending = 256
	}
	if d.MaxPendingPerHost <= 0 {
		d.MaxPendingPerHost = max(1, d.MaxPending/4)
	}
	return d
}

// minKey is the shortest key accepted.
const minKey = 16

func checkKey(k []byte) error {
	if k != nil && len(k) < minKey {
		return fmt.Errorf("key of %d bytes, at least %d", len(k), minKey)
	}
	return nil
}

// ErrRejected is wrapped by the error Dial returns when the listener
// rejects the request; a *RejectError carries the reason.
var ErrRejected = errors.New("cm: connection rejected")

// ErrBusy is wrapped by the error Dial returns when the listener dropped
// the request because too many were pending: the dialer may try again.
var ErrBusy = errors.New("cm: listener busy")

// reasonBusy is the reason a listener gives a request it drops for room.
const reasonBusy = "dropped: too many pending connections"

// ErrAuth reports a message whose MAC is missing or wrong: a peer without
// the key, or a reply that does not answer this request.
var ErrAuth = errors.New("cm: authentication failed")

// RejectError is a rejection with the listener's reason.
type RejectError struct{ Reason string }

func (e *RejectError) Error() string { return "cm: connection rejected: " + e.Reason }
func (e *RejectError) Unwrap() error { return ErrRejected }

// Is reports a rejection for lack of room as ErrBusy too.
func (e *RejectError) Is(target error) bool { return target == ErrBusy && e.Reason == reasonBusy }

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
	if err := checkKey(cfg.Key); err != nil {
		return nil, fmt.Errorf("cm: dial: %w", err)
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
	key := cfg.Key
	req := &message{typ: msgREQ, ep: capped(qp, cfg), qpType: qp.Type(), private: cfg.PrivateData}
	var b []byte
	if key != nil {
		rand.Read(req.nonce[:])
		mask(&req.ep, key, msgREQ, &req.nonce, nil)
		b = seal(key, labelREQ, req)
	} else {
		b = appendMessage(nil, req)
		req.raw = b
	}
	if _, err := c.Write(b); err != nil {
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
	switch {
	case key != nil && !verify(key, labelREP, rep, req.raw):
		return nil, fmt.Errorf("%w: the reply's MAC", ErrAuth)
	case key != nil:
		mask(&rep.ep, key, msgREP, &req.nonce, &rep.nonce)
	case rep.auth():
		return nil, fmt.Errorf("%w: the listener authenticates its replies, and no key was given", ErrAuth)
	}
	if err := connect(qp, rep.ep, cfg); err != nil {
		c.Write(appendMessage(nil, &message{typ: msgREJ, reason: err.Error()}))
		return nil, err
	}
	rtu := &message{typ: msgRTU}
	if key != nil {
		b = seal(key, labelRTU, rtu, req.raw, rep.raw)
	} else {
		b = appendMessage(nil, rtu)
	}
	if _, err := c.Write(b); err != nil {
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

// Listener accepts connection requests on a TCP address. Connections are
// read concurrently, each within the handshake timeout, so a silent or
// slow one delays no other.
type Listener struct {
	ln      net.Listener
	cfg     ListenerConfig
	reqs    chan *Request
	done    chan struct{}
	close   sync.Once
	wg      sync.WaitGroup
	mu      sync.Mutex
	pending map[netip.Addr]int       // per IP address, under mu
	npend   int                      // under mu
	conns   map[net.Conn]pendingConn // requests still being read, under mu; Close closes them
	closed  bool                     // under mu
	seen    map[[nonceLen]byte]time.Time
}

// Listen listens on a TCP address such as "127.0.0.1:0".
func Listen(ctx context.Context, address string, cfg *ListenerConfig) (*Listener, error) {
	d := cfg.withDefaults()
	if err := checkKey(d.Key); err != nil {
		return nil, fmt.Errorf("cm: listen: %w", err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", address)
	if err != nil {
		return nil, fmt.Errorf("cm: listen %s: %w", address, err)
	}
	l := &Listener{ln: ln, cfg: d, reqs: make(chan *Request), done: make(chan struct{}),
		pending: map[netip.Addr]int{}, conns: map[net.Conn]pendingConn{}, seen: map[[nonceLen]byte]time.Time{}}
	l.wg.Add(1)
	go l.acceptLoop()
	return l, nil
}

// Addr returns the listening address.
func (l *Listener) Addr() net.Addr { return l.ln.Addr() }

// Close stops listening and drops the requests not yet accepted; a
// blocked Accept returns an error wrapping net.ErrClosed.
func (l *Listener) Close() error {
	err := l.ln.Close()
	l.close.Do(func() { close(l.done) })
	l.mu.Lock()
	l.closed = true
	for c := range l.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	return err
}

func (l *Listener) acceptLoop() {
	defer l.wg.Done()
	var delay time.Duration
	for {
		c, err := l.ln.Accept()
		if err != nil {
			select {
			case <-l.done:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of descriptors and the like pass.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			select {
			case <-time.After(delay):
			case <-l.done:
				return
			}
			continue
		}
		delay = 0
		ip := remoteIP(c)
		if !l.admit(c, ip) {
			c.Close()
			continue
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.handshake(c)
		}()
	}
}

func remoteIP(c net.Conn) netip.Addr {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.AddrPort().Addr().Unmap()
	}
	return netip.Addr{}
}

type pendingConn struct {
	ip    netip.Addr
	since time.Time
}

// admit counts c as pending, making room by dropping the oldest pending
// connection (from c's address, if that bound is the one reached).
func (l *Listener) admit(c net.Conn, ip netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	for l.npend >= l.cfg.MaxPending || l.pending[ip] >= l.cfg.MaxPendingPerHost {
		host := l.pending[ip] >= l.cfg.MaxPendingPerHost
		var oldest net.Conn
		var at time.Time
		for o, p := range l.conns {
			if (!host || p.ip == ip) && (oldest == nil || p.since.Before(at)) {
				oldest, at = o, p.since
			}
		}
		l.releaseLocked(oldest)
		oldest.Write(appendMessage(nil, &message{typ: msgREJ, reason: reasonBusy}))
		oldest.Close()
	}
	l.npend++
	l.pending[ip]++
	l.conns[c] = pendingConn{ip, time.Now()}
	return true
}

// release stops counting c as pending; it may be called again.
func (l *Listener) release(c net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(c)
}

func (l *Listener) releaseLocked(c net.Conn) {
	p, ok := l.conns[c]
	if !ok {
		return
	}
	delete(l.conns, c)
	l.npend--
	if l.pending[p.ip]--; l.pending[p.ip] == 0 {
		delete(l.pending, p.ip)
	}
}

// handshake reads one connection's request, checks it, and hands it to
// Accept; the connection counts as pending until then.
func (l *Listener) handshake(c net.Conn) {
	defer l.release(c)
	deadline := time.Now().Add(l.cfg.HandshakeTimeout)
	c.SetDeadline(deadline)
	reject := func(reason string) {
		c.Write(appendMessage(nil, &message{typ: msgREJ, reason: reason}))
		c.Close()
	}
	m, err := readMessage(c)
	if err == nil && m.typ != msgREQ {
		err = fmt.Errorf("%w: expected a request, got type %d", ErrMalformed, m.typ)
	}
	if err != nil {
		reject(err.Error())
		return
	}
	switch key := l.cfg.Key; {
	case key == nil && m.auth():
		reject("the request is authenticated, and this listener has no key")
		return
	case key == nil:
	case !m.auth():
		reject(ErrAuth.Error() + ": the request carries no MAC")
		return
	case !verify(key, labelREQ, m):
		reject(ErrAuth.Error())
		return
	default:
		if !l.fresh(m.nonce, deadline) {
			reject(ErrAuth.Error() + ": a replayed request")
			return
		}
		mask(&m.ep, key, msgREQ, &m.nonce, nil)
	}
	// Read and authentic: no longer a candidate for dropping.
	l.release(c)
	c.SetDeadline(time.Time{})
	r := &Request{c: c, req: m, key: l.cfg.Key, timeout: l.cfg.HandshakeTimeout}
	t := time.NewTimer(l.cfg.HandshakeTimeout)
	defer t.Stop()
	select {
	case l.reqs <- r:
	case <-t.C:
		reject("the listener is not accepting")
	case <-l.done:
		c.Close()
	}
}

// fresh records a request's nonce and reports whether it was new. Nonces
// are kept while a replay could still be confirmed (two handshake
// timeouts); past that the RTU check alone refuses one.
func (l *Listener) fresh(n [nonceLen]byte, deadline time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if len(l.seen) >= 4096 {
		for k, until := range l.seen {
			if now.After(until) {
				delete(l.seen, k)
			}
		}
	}
	if _, ok := l.seen[n]; ok {
		return false
	}
	if len(l.seen) < 1<<16 {
		l.seen[n] = deadline.Add(l.cfg.HandshakeTimeout)
	}
	return true
}

// Request is a connection request waiting for Accept or Reject.
type Request struct {
	c       net.Conn
	req     *message
	key     []byte
	timeout time.Duration
	done    bool
}

// Accept waits for the next connection request. Requests that do not
// decode, or (with a key) do not authenticate, are answered with a
// rejection and never returned.
func (l *Listener) Accept(ctx context.Context) (*Request, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-l.done:
		return nil, fmt.Errorf("cm: accept: %w", net.ErrClosed)
	case <-ctx.Done():
		return nil, fmt.Errorf("cm: accept: %w", ctx.Err())
	}
}

// Remote returns the dialer's endpoint.
func (r *Request) Remote() verbs.Endpoint { return r.req.ep }

// Type returns the dialer's QP type; the accepting QP must match it.
func (r *Request) Type() verbs.QPType { return r.req.qpType }

// PrivateData returns the dialer's private data (authenticated when the
// listener has a key).
func (r *Request) PrivateData() []byte { return r.req.private }

// Accept connects qp (in Reset or Init, of the dialer's type) to the
// dialer and waits for the dialer's confirmation (at most the listener's
// handshake timeout). cfg.Key is ignored: the listener's key applies.
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
	var b []byte
	if r.key != nil {
		rand.Read(rep.nonce[:])
		mask(&rep.ep, r.key, msgREP, &r.req.nonce, &rep.nonce)
		b = seal(r.key, labelREP, rep, r.req.raw)
	} else {
		b = appendMessage(nil, rep)
	}
	r.c.SetDeadline(time.Now().Add(r.timeout))
	if _, err := r.c.Write(b); err != nil {
		qp.SetError()
		return fmt.Errorf("cm: accept: %w", err)
	}
	m, err := readMessage(r.c)
	switch {
	case err != nil:
	case m.typ == msgREJ:
		err = &RejectError{Reason: m.reason}
	case m.typ != msgRTU:
		err = fmt.Errorf("%w: expected RTU, got type %d", ErrMalformed, m.typ)
	case r.key != nil && !verify(r.key, labelRTU, m, r.req.raw, rep.raw):
		err = fmt.Errorf("%w: the confirmation's MAC", ErrAuth)
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
