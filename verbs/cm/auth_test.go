package cm

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/rvma/rvma/verbs"
)

var (
	jobKey   = []byte("the job's key, 32 bytes long....")
	otherKey = []byte("another job's key, not this one.")
)

// serveOne accepts one request on l with a fresh QP of typ and reports the
// outcome.
func serveOne(ctx context.Context, t *testing.T, l *Listener, d *verbs.Device, typ verbs.QPType) (*verbs.QP, chan error) {
	qp := newQP(t, d, typ)
	done := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err == nil {
			err = req.Accept(ctx, qp, nil)
		}
		done <- err
	}()
	return qp, done
}

func TestAuthenticatedHandshake(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	da, db := openPair(t)
	l, err := Listen(ctx, "127.0.0.1:0", &ListenerConfig{Key: jobKey})
	require.NoError(t, err)
	defer l.Close()
	server, done := serveOne(ctx, t, l, db, verbs.RC)
	client := newQP(t, da, verbs.RC)
	res, err := Dial(ctx, l.Addr().String(), client, &Config{Key: jobKey})
	require.NoError(t, err)
	require.NoError(t, <-done)
	// The masked secrets arrive unmasked: each side has the other's
	// endpoint exactly.
	require.Equal(t, server.Endpoint(), res.Remote)
	require.Equal(t, client.Endpoint(), server.Remote())
	require.Equal(t, verbs.StateReadyToSend, server.State())
}

// Each way a dialer without the job's key, or with a forged or replayed
// message, is refused; the listener's application never sees the request.
func TestAuthenticationRefusals(t *testing.T) {
	for _, tc := range []struct {
		name            string
		listen, dial    []byte
		reason          string
		listenerRejects bool
	}{
		{"no key", jobKey, nil, "carries no MAC", true},
		{"wrong key", jobKey, otherKey, "authentication failed", true},
		{"listener without a key", nil, jobKey, "this listener has no key", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			da, _ := openPair(t)
			l, err := Listen(ctx, "127.0.0.1:0", &ListenerConfig{Key: tc.listen})
			require.NoError(t, err)
			defer l.Close()
			_, err = Dial(ctx, l.Addr().String(), newQP(t, da, verbs.RC), &Config{Key: tc.dial})
			require.ErrorIs(t, err, ErrRejected)
			require.ErrorContains(t, err, tc.reason)
			actx, acancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer acancel()
			_, err = l.Accept(actx)
			require.ErrorIs(t, err, context.DeadlineExceeded, "the refused request never reaches Accept")
		})
	}
}

// A keyed dialer refuses a reply that is not authenticated with its key,
// from a listener impersonating the real one.
func TestDialerRefusesForgedReply(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	da, db := openPair(t)
	for _, key := range [][]byte{nil, otherKey} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			req, err := readMessage(c)
			if err != nil {
				return
			}
			rep := &message{typ: msgREP, ep: newQP(t, db, verbs.RC).Endpoint(), qpType: verbs.RC}
			if key != nil {
				c.Write(seal(key, labelREP, rep, req.raw))
			} else {
				c.Write(appendMessage(nil, rep))
			}
			io.Copy(io.Discard, c)
		}()
		client := newQP(t, da, verbs.RC)
		_, err = Dial(ctx, ln.Addr().String(), client, &Config{Key: jobKey})
		require.ErrorIs(t, err, ErrAuth)
		require.NotEqual(t, verbs.StateReadyToSend, client.State())
		ln.Close()
	}
}

// A request captured on the wire and sent again is refused at once; one
// replayed after the listener forgot it would still fail, at the
// confirmation its sender cannot compute.
func TestReplayedRequest(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// UDP devices: their QPs have MAC keys to hide too.
	ud, err := verbs.Open(ctx, "udp://127.0.0.1:0", nil)
	require.NoError(t, err)
	defer ud.Close()
	db := ud
	l, err := Listen(ctx, "127.0.0.1:0", &ListenerConfig{Key: jobKey})
	require.NoError(t, err)
	defer l.Close()
	// Capture a real request through a relay.
	relay, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer relay.Close()
	captured := make(chan []byte, 1)
	go func() {
		c, err := relay.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		s, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			return
		}
		defer s.Close()
		req, err := readMessage(c)
		if err != nil {
			return
		}
		captured <- req.raw
		s.Write(req.raw)
		go io.Copy(s, c)
		io.Copy(c, s)
	}()
	_, done := serveOne(ctx, t, l, db, verbs.RC)
	dialer := newQP(t, ud, verbs.RC)
	dialerEP := dialer.Endpoint()
	require.NotZero(t, dialerEP.MACKey)
	_, err = Dial(ctx, relay.Addr().String(), dialer, &Config{Key: jobKey})
	require.NoError(t, err)
	require.NoError(t, <-done)
	raw := <-captured
	// The secrets do not travel in the clear. The captured request is
	// the relay's: compare with the dialer's real endpoint.
	var secret [8]byte
	binary.BigEndian.PutUint64(secret[:], dialerEP.Secret)
	require.False(t, bytes.Contains(raw, secret[:]))
	require.False(t, bytes.Contains(raw, dialerEP.MACKey[:8]))

	c, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	c.Write(raw)
	m, err := readMessage(c)
	require.NoError(t, err)
	require.Equal(t, msgREJ, m.typ)
	require.Contains(t, m.reason, "replayed")

	// Forgotten nonces: the listener answers, the replayer cannot confirm.
	l.mu.Lock()
	clear(l.seen)
	l.mu.Unlock()
	_, done = serveOne(ctx, t, l, db, verbs.RC)
	c2, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	defer c2.Close()
	c2.Write(raw)
	rep, err := readMessage(c2)
	require.NoError(t, err)
	require.Equal(t, msgREP, rep.typ)
	c2.Write(appendMessage(nil, &message{typ: msgRTU, flags: flagAuth, mac: make([]byte, macLen)}))
	require.ErrorIs(t, <-done, ErrAuth)
}

// Silent connections, more than the bounds allow, neither stall a real
// dial nor stay open past the handshake timeout: over the bound, the
// oldest is dropped.
func TestSilentConnectionsAreBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	da, db := openPair(t)
	l, err := Listen(ctx, "127.0.0.1:0", &ListenerConfig{Key: jobKey, HandshakeTimeout: 300 * time.Millisecond, MaxPending: 8, MaxPendingPerHost: 4})
	require.NoError(t, err)
	defer l.Close()
	var silent []net.Conn
	for range 6 {
		c, err := net.Dial("tcp", l.Addr().String())
		require.NoError(t, err)
		defer c.Close()
		silent = append(silent, c)
		time.Sleep(5 * time.Millisecond) // accepted in this order
	}
	// The fifth and sixth pushed the first two out.
	require.NotErrorIs(t, &RejectError{Reason: "no"}, ErrBusy)
	for _, c := range silent[:2] {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		m, err := readMessage(c)
		require.NoError(t, err)
		require.Contains(t, m.reason, "too many pending")
		rej := &RejectError{Reason: m.reason}
		require.ErrorIs(t, rej, ErrBusy, "a dialer can tell it may try again")
		require.ErrorIs(t, rej, ErrRejected)
	}
	// A real dial gets in at once, though the bound is reached.
	_, done := serveOne(ctx, t, l, db, verbs.RC)
	start := time.Now()
	_, err = Dial(ctx, l.Addr().String(), newQP(t, da, verbs.RC), &Config{Key: jobKey})
	require.NoError(t, err)
	require.NoError(t, <-done)
	require.Less(t, time.Since(start), 5*time.Second)
	// The rest are dropped too, by then or at the handshake timeout.
	for _, c := range silent[2:] {
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := io.ReadAll(c)
		require.NoError(t, err, "closed by the listener, not by the test's deadline")
	}
	require.Eventually(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.npend == 0 && len(l.conns) == 0 && len(l.pending) == 0
	}, 2*time.Second, 5*time.Millisecond, "nothing left counted as pending")
}

// A silent connection from one host never delays a dial from another:
// requests are read concurrently.
func TestSilentConnectionDoesNotStall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	da, db := openPair(t)
	l, err := Listen(ctx, "127.0.0.1:0", &ListenerConfig{Key: jobKey})
	require.NoError(t, err)
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	_, done := serveOne(ctx, t, l, db, verbs.RC)
	dctx, dcancel := context.WithTimeout(ctx, 3*time.Second) // well under the 10 s handshake timeout
	defer dcancel()
	_, err = Dial(dctx, l.Addr().String(), newQP(t, da, verbs.RC), &Config{Key: jobKey})
	require.NoError(t, err)
	require.NoError(t, <-done)
}

func TestShortKeyRefused(t *testing.T) {
	_, err := Listen(context.Background(), "127.0.0.1:0", &ListenerConfig{Key: []byte("short")})
	require.ErrorContains(t, err, "at least 16")
	da, _ := openPair(t)
	_, err = Dial(context.Background(), "127.0.0.1:1", newQP(t, da, verbs.RC), &Config{Key: []byte("short")})
	require.ErrorContains(t, err, "at least 16")
}
