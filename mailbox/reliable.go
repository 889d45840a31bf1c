package mailbox

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rvma/rvma/reliability"
)

// Mailbox puts toward a long-haul peer, over reliability connections
// (SDR's unreliable-connected writes with a chunk bitmap, repaired by
// selective repeat or erasure coding). A put is two messages: a 24-byte
// header (mailbox, offset, length) on the header connection, then the
// payload on the data connection. The target keeps header buffers posted
// ahead; when a header arrives it reserves the put's place in the window's
// buffer and posts exactly that slice as the next payload buffer, so
// chunks land straight in the mailbox buffer, and the put counts once,
// when every chunk is in place: chunks that arrive twice (repeats,
// duplicated packets) are only bits already set in the bitmap and never
// count again. Two connections, because the reliability layer matches the
// n-th message to the n-th posted buffer: with one, the next header's
// buffer could only be posted after this payload's, and puts would go one
// round trip at a time.

const relHdrLen = 24

// ErrRefused reports a put that the target refused (no window at the
// address, window closed, out of range, or no buffer posted within the
// target's wait); the target logs which.
var ErrRefused = errors.New("mailbox: the target refused the put")

// Reliable is the pair of reliability connections puts travel on: one
// for headers, one for payloads, both to the same peer.
type Reliable struct {
	Header, Data *reliability.Conn
}

// ReliableInitiator puts into a peer's mailboxes over a Reliable pair
// whose other ends run Target.ServeReliable. It is safe for concurrent
// use; puts are placed in the order they are started.
type ReliableInitiator struct {
	conns Reliable
	mu    sync.Mutex // a put's header and payload take the same place in both orders
}

// NewReliableInitiator returns an initiator over conns.
func NewReliableInitiator(conns Reliable) *ReliableInitiator {
	return &ReliableInitiator{conns: conns}
}

// Put puts data at offset into the peer's mailbox mbox and waits until
// every byte is in place at the target and counted (or the put failed).
// opt chooses the repair scheme of the payload (nil: the connection's
// policy). data must not change until Put returns.
func (in *ReliableInitiator) Put(ctx context.Context, mbox, offset uint64, data []byte, opt *reliability.SendOptions) (reliability.SendResult, error) {
	p, err := in.Start(ctx, mbox, offset, data, opt)
	if err != nil {
		return reliability.SendResult{}, err
	}
	return p.Wait(ctx)
}

// ReliablePut is a put in flight.
type ReliablePut struct {
	hdr, payload *reliability.Send
}

// Start starts a put and returns at once. Puts are placed in the order
// they were started: the target assigns each to an epoch when its header
// arrives, so puts of the next epoch may be started before this one's
// have completed. data must not change until the put completes.
func (in *ReliableInitiator) Start(ctx context.Context, mbox, offset uint64, data []byte, opt *reliability.SendOptions) (*ReliablePut, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("%w: empty put", ErrOutOfRange)
	}
	hdr := make([]byte, relHdrLen)
	binary.BigEndian.PutUint64(hdr, mbox)
	binary.BigEndian.PutUint64(hdr[8:], offset)
	binary.BigEndian.PutUint64(hdr[16:], uint64(len(data)))
	in.mu.Lock()
	defer in.mu.Unlock()
	hs, err := in.conns.Header.Send(ctx, hdr, nil)
	if err != nil {
		return nil, err
	}
	ps, err := in.conns.Data.Send(ctx, data, opt)
	if err != nil {
		return nil, err
	}
	return &ReliablePut{hdr: hs, payload: ps}, nil
}

// Done is closed when the put completes or fails.
func (p *ReliablePut) Done() <-chan struct{} { return p.payload.Done() }

// Wait blocks until the put is in place and counted at the target, or
// failed: ErrRefused if the target refused it, the connection's error if
// it failed.
func (p *ReliablePut) Wait(ctx context.Context) (reliability.SendResult, error) {
	if _, err := p.hdr.Wait(ctx); err != nil {
		return reliability.SendResult{}, err
	}
	res, err := p.payload.Wait(ctx)
	switch {
	case errors.Is(err, reliability.ErrTooLarge):
		return res, ErrRefused // the target posted a token buffer for a refused put
	case err != nil:
		return res, err
	case res.Partial:
		return res, ErrRefused
	}
	return res, nil
}

// ServeConfig configures ServeReliable. The zero value means defaults.
type ServeConfig struct {
	// NotReady is how long a put waits for a buffer to be posted (or for
	// the full ones to complete) before it is refused. Default 1s.
	NotReady time.Duration
	// OnError, if set, is told about every refused or failed put.
	OnError func(mbox, offset uint64, n int, err error)
}

// ServeReliable receives the puts a ReliableInitiator sends over conns
// and places them into this target's windows, until ctx ends or a
// connection fails (its error is returned; ctx's end returns nil). It
// owns the connections' receive sides: nothing else may Post on them.
func (t *Target) ServeReliable(ctx context.Context, conns Reliable, cfg *ServeConfig) error {
	var conf ServeConfig
	if cfg != nil {
		conf = *cfg
	}
	if conf.NotReady <= 0 {
		conf.NotReady = time.Second
	}
	refuse := func(mbox, offset uint64, n int, err error) {
		if conf.OnError != nil {
			conf.OnError(mbox, offset, n, err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	// Header buffers are posted ahead, as many as the connection's slots
	// allow (Post waits for a free one), and handled in order.
	type posted struct {
		buf []byte
		r   *reliability.Recv
	}
	headers := make(chan posted, 64)
	postErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(headers)
		for {
			buf := make([]byte, relHdrLen)
			r, err := conns.Header.Post(ctx, buf)
			if err != nil {
				postErr <- err
				return
			}
			select {
			case headers <- posted{buf, r}:
			case <-ctx.Done():
				return
			}
		}
	}()
	stop := func(err error) error {
		if ctx.Err() != nil {
			return nil // asked to stop
		}
		return err
	}
	token := make([]byte, 1)
	for h := range headers {
		if err := h.r.Wait(ctx); err != nil {
			return stop(err)
		}
		mbox, offset, n := binary.BigEndian.Uint64(h.buf), binary.BigEndian.Uint64(h.buf[8:]), binary.BigEndian.Uint64(h.buf[16:])
		res, rerr := t.reserve(ctx, mbox, offset, n, conf.NotReady)
		if rerr != nil {
			// The payload still comes next on the data connection: a
			// token buffer, taken at once, tells the sender to stop.
			refuse(mbox, offset, int(min(n, 1<<62)), rerr)
			tr, err := conns.Data.Post(ctx, token)
			if err != nil {
				return stop(err)
			}
			tr.Take()
			continue
		}
		pr, err := conns.Data.Post(ctx, res.Data)
		if err != nil {
			res.Abort()
			return stop(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pr.Wait(ctx); err != nil {
				res.Abort() // the connection failed or we stop: whatever arrived stays, uncounted
				refuse(mbox, offset, len(res.Data), err)
				return
			}
			if err := res.Commit(len(res.Data)); err != nil {
				refuse(mbox, offset, len(res.Data), err)
			}
		}()
	}
	select {
	case err := <-postErr:
		return stop(err)
	default:
		return nil
	}
}

// reserve finds the window of a put and reserves its place, waiting up to
// wait for a buffer.
func (t *Target) reserve(ctx context.Context, mbox, offset, n uint64, wait time.Duration) (*Reservation, error) {
	w := t.lookup(mbox)
	if w == nil {
		return nil, fmt.Errorf("%w: %#x", ErrNoMailbox, mbox)
	}
	if n == 0 || n > 1<<40 {
		return nil, fmt.Errorf("%w: %d bytes", ErrOutOfRange, n)
	}
	deadline := time.Now().Add(wait)
	for {
		r, err := w.Reserve(offset, int(n))
		if !errors.Is(err, ErrNoBuffer) || time.Now().After(deadline) {
			return r, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}
